"""A task scan's ``ablate``: each chosen head patched alone, exactly, against its EAP-IG node score.

Checked against an independent computation (the head's ``z`` replaced by its corrupted-run value through the model's
own hooks, the logit difference read by hand), the agreement against a Spearman correlation computed here, the
record through ``scores.json`` (schema, reload, the checks that refuse a file no scan wrote), the option's checks
and its stage in the plan.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest
import torch

import circuitkit as ck
from circuitkit import CircuitkitError, cli, zoo
from circuitkit.models.adapters import HOOKS, adapt
from circuitkit.tasks import scan_task
from tests.test_tasks import copy_next_task, task_file

EXACT = 1e-4
"""The scan's patched pass against the hand-made one: the same float32 model, operations in another order."""


@pytest.fixture(scope="module")
def model():
    return zoo.load()


@pytest.fixture(scope="module")
def task():
    return copy_next_task(n=16, d_vocab=60, seed=0)


@pytest.fixture(scope="module")
def every_head(model, task):
    return scan_task(model, task, holdout=0, ablate="all", edges=False, n_resamples=200)


def _logit_diff(logits: torch.Tensor, batch) -> torch.Tensor:
    rows = torch.arange(batch.n_pairs)
    last = logits[rows, batch.last]
    return last[rows, batch.answers[:, 0]] - last[rows, batch.wrongs[:, 0]]


def _by_hand(model, task) -> torch.Tensor:
    """``[layer, head]``: the mean logit difference lost with that head's ``z`` taken from the corrupted run."""
    batch = task.tokenize(adapt(model))
    assert batch.answers.shape[1] == 1 and batch.wrongs.shape[1] == 1
    L, H = model.cfg.n_layers, model.cfg.n_heads
    with torch.no_grad():
        _, cache = model.run_with_cache(batch.corrupted)
        clean = _logit_diff(model(batch.clean), batch)
        out = torch.zeros(L, H)
        for layer in range(L):
            corrupted_z = cache[HOOKS.z(layer)]
            for head in range(H):
                def patch(z, hook, head=head, corrupted_z=corrupted_z):
                    z = z.clone()
                    z[:, :, head] = corrupted_z[:, :, head]
                    return z

                logits = model.run_with_hooks(batch.clean, fwd_hooks=[(HOOKS.z(layer), patch)])
                out[layer, head] = (clean - _logit_diff(logits, batch)).mean()
    return out


def _spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Pearson correlation of the ranks (no ties here)."""
    ra, rb = (x.argsort().argsort().double() for x in (a, b))
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / (ra.norm() * rb.norm()))


def test_each_head_patched_alone_is_its_exact_effect(model, task, every_head):
    single = every_head.single_heads
    want = _by_hand(model, task)
    assert torch.allclose(single.exact, want, atol=EXACT)
    assert float(want.abs().max()) > 1.0  # the comparison is not 0 == 0
    assert len(single.heads) == want.numel() and single.selection == "every head"
    # the estimate it is compared with is the scan's EAP-IG node score, the table's "score" column
    assert torch.equal(single.estimate, every_head.scores.float())
    assert [row["exact"] for row in every_head.table("score")] == pytest.approx(
        [float(want[row["layer"], row["index"]]) for row in every_head.table("score")], abs=EXACT)


def test_the_agreement_is_the_rank_correlation_of_estimate_and_exact(every_head):
    single, agreed = every_head.single_heads, every_head.agreement
    assert agreed is single.agreement and agreed.n_exact == 8
    assert agreed.spearman == pytest.approx(_spearman(single.estimate.flatten(), single.exact.flatten()), abs=1e-12)
    miss = (single.estimate - single.exact).abs()
    layer, head = divmod(int(miss.flatten().argmax()), miss.shape[1])
    assert agreed.largest_miss[0] == (layer, head)
    assert agreed.largest_miss[1:] == pytest.approx((float(single.exact[layer, head]),
                                                    float(single.estimate[layer, head])))
    # each head's interval over the pairs holds its effect
    for name, (lo, hi) in single.intervals.items():
        layer, head = map(int, name.split("."))
        assert lo <= float(single.exact[layer, head]) <= hi
    assert "Estimates: EAP-IG node score vs each head patched alone (exact): Spearman" in every_head.answer()
    assert "too few heads to judge" in every_head.answer()  # 8 heads
    # every member of the circuit is explained with its own exact figure
    for name, text in every_head.to_json()["circuit"]["explanations"].items():
        layer, head = map(int, name.split("."))
        assert f"patching it alone loses {float(single.exact[layer, head]):+.2f} logits (exact)" in text


def test_top_patches_the_largest_scores_and_is_off_by_default(model, task, every_head):
    top = scan_task(model, task, holdout=0, ablate="top", ablate_top=3, edges=False)
    by_size = sorted(((abs(float(v)), (layer, head)) for layer, row in enumerate(top.scores) for head, v in
                      enumerate(row)), reverse=True)
    assert top.single_heads.heads == tuple(h for _, h in by_size[:3])
    assert int((~top.single_heads.exact.isnan()).sum()) == 3 and top.single_heads.agreement.n_exact == 3
    for layer, head in top.single_heads.heads:  # the same effect as patched among every head
        assert float(top.single_heads.exact[layer, head]) == pytest.approx(
            float(every_head.single_heads.exact[layer, head]), abs=1e-6)
    assert "ablate" in [s.name for s in top.stages] and top.settings["ablate_top"] == 3
    plain = scan_task(model, task, holdout=0, edges=False)
    assert plain.single_heads is None and plain.agreement is None and "ablate" not in plain.settings
    assert "ablate" not in [s.name for s in plain.stages] and "exact" not in plain.table()[0]
    assert "Estimates:" not in plain.answer()


def test_the_record_survives_saving_and_reloading(every_head, tmp_path):
    import jsonschema

    from circuitkit import tasks

    saved = every_head.save(tmp_path / "out")
    data = json.loads(saved.scores.read_text())
    schema = json.loads((Path(tasks.__file__).parent / "task_scores.schema.json").read_text())
    jsonschema.validate(data, schema)
    assert data["single_heads"]["agreement"]["n_exact"] == 8 and len(data["heads"]["exact"]) == 2
    back = ck.Scan.load(tmp_path / "out")
    assert back.to_json() == every_head.to_json()
    assert back.agreement.spearman == pytest.approx(every_head.agreement.spearman)
    assert torch.equal(back.single_heads.exact, every_head.single_heads.exact)
    page = saved.report.read_text()
    assert '"exact"' in page and "Estimates: EAP-IG node score" in page


@pytest.mark.parametrize("change, field", [
    (lambda d: d["settings"].__setitem__("ablate", "none"), "single_heads"),
    (lambda d: d.pop("single_heads"), "single_heads"),
    (lambda d: d["heads"].pop("exact"), "heads.exact"),
    (lambda d: d["heads"]["exact"][0].__setitem__(0, None), "heads.exact"),
    (lambda d: d["single_heads"]["agreement"].__setitem__("n_exact", 7), "single_heads.agreement.n_exact"),
    (lambda d: d["single_heads"]["agreement"].__setitem__("spearman", 1.5), "single_heads.agreement.spearman"),
    (lambda d: d["single_heads"]["agreement"]["largest_miss"].__setitem__("head", "9.0"),
     "single_heads.agreement.largest_miss.head"),
    (lambda d: d["single_heads"]["ci"].__setitem__("7.7", [0.0, 1.0]), "single_heads.ci"),
    (lambda d: d["single_heads"].__setitem__("heads", ["0.0", "0.0"]), "single_heads.heads"),
])
def test_a_file_no_scan_wrote_is_refused(every_head, tmp_path, change, field):
    every_head.save(tmp_path / "out")
    path = tmp_path / "out" / "scores.json"
    data = json.loads(path.read_text())
    bad = copy.deepcopy(data)
    change(bad)
    path.write_text(json.dumps(bad))
    with pytest.raises(CircuitkitError, match=field.replace(".", r"\.")):
        ck.Scan.load(tmp_path / "out")


@pytest.mark.parametrize("kwargs, match", [
    ({"ablate": "some"}, "scan_task: ablate"), ({"ablate": True}, "scan_task: ablate"),
    ({"ablate": "top", "ablate_top": 0}, "scan_task: ablate_top"),
    ({"ablate": "top", "ablate_top": 2.5}, "scan_task: ablate_top"),
    ({"ablate_top": 3}, "scan_task: ablate_top"), ({"ablate": "all", "ablate_top": 3}, "scan_task: ablate_top"),
])
def test_bad_options_are_refused_before_a_pass(model, task, kwargs, match):
    with pytest.raises(CircuitkitError, match=match):
        scan_task(model, task, **kwargs)


def test_the_scan_and_the_command_line_take_it(model, task, tmp_path, capsys):
    """``ck.scan(task=..., ablate=...)`` and ``--ablate`` with ``--task`` (off without them; the induction scan's
    default stays ``"top"``)."""
    result = ck.scan(model, task=task, ablate="top", ablate_top=2, edges=False)
    assert result.single_heads.agreement.n_exact == 2
    assert ck.scan(model, task=task, edges=False).single_heads is None
    assert ck.scan(model).settings.ablate == "top" and ck.scan(model, ablate_top=3).settings.ablate_top == 3
    # a count with nothing to count is refused, in either scan
    with pytest.raises(CircuitkitError, match="scan: ablate_top: given int 3; expected None beside ablate='none'"):
        ck.scan(model, ablate="none", ablate_top=3)
    with pytest.raises(CircuitkitError, match="scan_task: ablate_top"):
        ck.scan(model, task=task, ablate_top=3)
    path = task_file(task, tmp_path / "copy.jsonl")
    assert cli.main(["scan", "--task", str(path), "--out", str(tmp_path / "out"), "--no-edges", "--ablate", "top",
                     "--ablate-top", "3"]) == 0
    data = json.loads((tmp_path / "out" / "scores.json").read_text())
    assert data["settings"]["ablate"] == "top" and len(data["single_heads"]["heads"]) == 3
    assert "Estimates: EAP-IG node score" in capsys.readouterr().out
    assert cli.main(["scan", "--task", str(path), "--ablate-top", "3"]) == 2  # without --ablate top
    assert "--ablate-top: given with --ablate none" in capsys.readouterr().err


def test_each_pairs_term_of_the_node_scores_is_that_pair_alone():
    """``keep_node_pairs``: each pair's term of the EAP-IG node scores, times the pairs, is the node score EAP-IG
    gives that pair on its own (no pair reads another); their mean is the node score."""
    from circuitkit.graph.runner import TaskRunner
    from circuitkit.tasks import Task
    from tests.conftest import boot_bridge
    from tests.test_tasks import toy_pairs

    adapter = adapt(boot_bridge(attn_only=False, n_layers=3, d_vocab=50, seed=3))
    batch = Task.from_pairs(toy_pairs(6), name="toy").tokenize(adapter)
    runner = TaskRunner(adapter, batch, "logit_diff", mlps=True, ablation="corrupted")
    runner.keep_node_pairs = True
    _, node_scores, _ = runner.attribute(2)
    assert torch.allclose(runner.node_pairs.mean(1), node_scores, atol=1e-5, rtol=1e-4)
    for p in (0, 3):
        alone = TaskRunner(adapter, batch.subset(torch.tensor([p])), "logit_diff", mlps=True, ablation="corrupted")
        _, own, _ = alone.attribute(2)
        assert torch.allclose(runner.node_pairs[:, p], own, atol=1e-4, rtol=1e-3)
    assert float(node_scores.abs().max()) > 0.05  # the comparisons are not 0 == 0
    plain = TaskRunner(adapter, batch, "logit_diff", mlps=True, ablation="corrupted")
    plain.attribute(2)
    assert plain.node_pairs is None  # kept only where asked


def test_without_edges_the_node_scores_come_from_the_nodes_outputs(monkeypatch):
    """Where no edge score is read (``edges=False``) and nodes are patched to their corrupted values, the scan takes
    EAP-IG's node scores from the gradient at each node's output (:meth:`TaskRunner.node_attribution`): the sum of
    its edges' scores that :meth:`TaskRunner.attribute` adds up, for heads and MLPs, each pair's term too. With
    another ablation the node scores stay the edges' sums (the two differ there: the edges are patched from the
    corrupted prompt, the nodes to their ablation)."""
    from circuitkit.graph.runner import TaskRunner
    from circuitkit.tasks import Task
    from tests.conftest import boot_bridge
    from tests.test_tasks import toy_pairs

    model = boot_bridge(attn_only=False, n_layers=3, d_vocab=50, seed=3)
    adapter = adapt(model)
    task = Task.from_pairs(toy_pairs(8), name="toy")
    batch = task.tokenize(adapter)
    edges, nodes = (TaskRunner(adapter, batch, "logit_diff", mlps=True, ablation="corrupted") for _ in range(2))
    edges.keep_node_pairs = nodes.keep_node_pairs = True
    _, summed, _ = edges.attribute(3)
    own, _ = nodes.node_attribution(3)
    members = torch.cat([edges.graph.head_senders.flatten(),
                         torch.tensor([edges.graph.sender_index(layer, None) for layer in range(3)])])
    assert float(summed[members].abs().max()) > 0.05  # not 0 == 0
    assert torch.allclose(own[members], summed[members], atol=1e-5, rtol=1e-4)
    assert torch.allclose(nodes.node_pairs[members], edges.node_pairs[members], atol=1e-5, rtol=1e-4)
    assert torch.allclose(nodes.node_pairs.mean(1), own, atol=1e-5, rtol=1e-4)
    assert own[0] == 0  # the input is no node of a node circuit

    with_edges = scan_task(model, task, holdout=0, n_resamples=20)
    monkeypatch.setattr(TaskRunner, "attribute", lambda *a, **k: pytest.fail("edge scores taken without edges"))
    without = scan_task(model, task, holdout=0, n_resamples=20, edges=False)
    assert torch.allclose(without.scores, with_edges.scores, atol=1e-5, rtol=1e-4)
    assert torch.allclose(without.scores_mlp, with_edges.scores_mlp, atol=1e-5, rtol=1e-4)
    assert without.circuit.heads == with_edges.circuit.heads
    with pytest.raises(pytest.fail.Exception, match="edge scores taken without edges"):
        scan_task(model, dataclasses.replace(task, ablation="mean"), holdout=0, n_resamples=20, edges=False)


def test_the_agreement_has_an_interval_over_the_pairs_from_ten_heads():
    """Over 12 heads the agreement is judged, and its interval is the percentile bootstrap of the Spearman
    correlation with both sides' per-pair values resampled together (recomputed here resample by resample)."""
    from circuitkit.detect.agreement import spearman
    from circuitkit.tasks import Task
    from circuitkit.uncertainty import percentile_interval, resample_counts
    from tests.conftest import boot_bridge
    from tests.test_tasks import toy_pairs

    model = boot_bridge(attn_only=False, n_layers=3, d_vocab=50, seed=3)
    scan = scan_task(model, Task.from_pairs(toy_pairs(12), name="toy"), holdout=0, ablate="all", edges=False,
                     n_resamples=200)
    single = scan.single_heads
    assert single.agreement.n_exact == 12 and single.agreement_interval is not None
    lo, hi = single.agreement_interval
    assert -1.0 <= lo <= hi <= 1.0
    runner_pairs = single.each.shape[1]
    counts = resample_counts(runner_pairs, 200, 0).double()
    # the estimate's per-pair terms, recomputed: a runner on the same pairs keeping them
    from circuitkit.graph.runner import TaskRunner

    adapter = adapt(model)
    runner = TaskRunner(adapter, Task.from_pairs(toy_pairs(12), name="toy").tokenize(adapter), "logit_diff",
                        mlps=True, ablation="corrupted")
    runner.keep_node_pairs = True
    runner.attribute(3)
    H = 4
    index = torch.tensor([[runner.graph.sender_index(layer, h) for h in range(H)] for layer in range(3)])
    estimate = runner.node_pairs[index].reshape(12, -1).double()  # [head, pair], heads in layer order
    exact = torch.stack([single.each[single.heads.index((layer, h))] for layer in range(3) for h in range(H)]).double()
    rhos = torch.tensor([spearman(estimate @ c / runner_pairs, exact @ c / runner_pairs) for c in counts],
                        dtype=torch.float64)
    want = percentile_interval(rhos, 0.95)
    assert (lo, hi) == pytest.approx((float(want[0]), float(want[1])), abs=1e-9)
    assert f"[{lo:.2f}, {hi:.2f}] over 12 heads" in scan.answer()
    assert "too few heads" not in scan.answer()
