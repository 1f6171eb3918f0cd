"""Discovery and evaluation pairs: the circuit is searched on one set and measured on the other, checked against
independent computations: a scan of the discovery pairs alone (no split) finds the same circuit with the same
figures, and the held-out figures equal node patching of the evaluation pairs computed here, with a runner of
their own."""

from __future__ import annotations

import pytest
import torch

from circuitkit import CircuitkitError, zoo
from circuitkit.graph.runner import TaskRunner
from circuitkit.models.adapters import adapt
from circuitkit.tasks import Task, scan_task
from circuitkit.tasks.scan import MIN_SPLIT_PAIRS, split_pairs
from tests.test_tasks import copy_next_task, task_file

EXACT = 1e-5


@pytest.fixture(scope="module")
def model():
    return zoo.load()


@pytest.fixture(scope="module")
def task():
    return copy_next_task(n=16, d_vocab=60, seed=2)


def test_split_pairs_is_seeded_disjoint_and_complete():
    found, held = split_pairs(16, 0.5, 0)
    assert len(found) == 8 and len(held) == 8
    assert sorted(found.tolist() + held.tolist()) == list(range(16))
    again, _ = split_pairs(16, 0.5, 0)
    other, _ = split_pairs(16, 0.5, 1)
    assert torch.equal(found, again) and not torch.equal(found, other)
    assert len(split_pairs(10, 0.25, 0)[1]) == 2 and split_pairs(MIN_SPLIT_PAIRS - 1, 0.5, 0)[1] is None
    assert split_pairs(32, 0.0, 0)[1] is None


def _figures_by_hand(model, pairs, heads_kept) -> tuple[float, float]:
    """Faithfulness and necessity of a head set on ``pairs`` by node patching, with a runner of their own."""
    adapter = adapt(model)
    sub = Task.from_pairs(pairs)
    runner = TaskRunner(adapter, sub.tokenize(adapter), "logit_diff", mlps=not adapter.attn_only,
                        ablation="corrupted")
    L, H = adapter.spec.n_layers, adapter.spec.n_heads
    outside = torch.ones(L, H, dtype=torch.bool)
    for layer, head in heads_kept:
        outside[layer, head] = False
    m_c, m_all, m_only = runner.node_metric(torch.stack([outside, torch.ones_like(outside), ~outside]), None).tolist()
    clean = float(runner.clean["metric"].mean())
    return (m_c - m_all) / (clean - m_all), clean - m_only


def test_the_search_uses_the_discovery_pairs_and_the_evaluation_pairs_are_measured(model, task):
    result = scan_task(model, task, edges=False, n_resamples=20)
    found, held = split_pairs(task.n_pairs, 0.5, 0)
    alone = scan_task(model, Task.from_pairs([task.pairs[i] for i in found.tolist()], name="copy-next"),
                      edges=False, n_resamples=20, holdout=0)
    c = result.circuit
    assert c.heads == alone.circuit.heads
    assert c.faithfulness == pytest.approx(alone.circuit.faithfulness, abs=EXACT)
    assert [p.size for p in c.curve] == [p.size for p in alone.circuit.curve]
    other = c.other_set
    assert other["set"] == "evaluation" and other["pairs"] == len(held)
    faith, necessity = _figures_by_hand(model, [task.pairs[i] for i in held.tolist()], c.heads)
    assert other["faithfulness"] == pytest.approx(faith, abs=EXACT)
    assert other["necessity"] == pytest.approx(necessity, abs=EXACT)
    assert {p["size"] for p in other["curve"]} >= {p.size for p in c.curve}  # the curve on both sets
    # every pair's metric, in the task's order, whichever set it went to
    unsplit = scan_task(model, task, edges=False, n_resamples=20, holdout=0)
    torch.testing.assert_close(result.clean, unsplit.clean, atol=EXACT, rtol=0)
    assert "Held out: on the 8 evaluation pairs" in result.answer()
    data = result.to_json()
    assert data["settings"]["split"]["target_on"] == "discovery" and data["circuit"]["other_set"]["pairs"] == 8


@pytest.mark.parametrize("search", ["ranked", "refined"])
def test_the_held_out_figures_carry_intervals_over_the_held_out_pairs(model, task, search):
    """The held-out faithfulness and necessity intervals resample the evaluation pairs' own metrics: recomputed
    here from node patching of those pairs with a runner of their own, on the same resamples
    (:func:`circuitkit.uncertainty.resample_counts`), the ratio and the difference of the resampled means, numpy's
    quantiles; the circuit a search beyond ranking finds has its own. With an edge circuit the held-out edge
    faithfulness has one too, and the answer prints all three."""
    import numpy as np

    from circuitkit.uncertainty import resample_counts

    R, level = 200, 0.9
    result = scan_task(model, task, edges=False, n_resamples=R, ci_level=level, search=search)
    other = result.circuit.other_set
    _, held = split_pairs(task.n_pairs, 0.5, 0)
    adapter = adapt(model)
    runner = TaskRunner(adapter, Task.from_pairs([task.pairs[i] for i in held.tolist()]).tokenize(adapter),
                        "logit_diff", mlps=not adapter.attn_only, ablation="corrupted")
    outside = torch.ones(adapter.spec.n_layers, adapter.spec.n_heads, dtype=torch.bool)
    for layer, head in result.circuit.heads:
        outside[layer, head] = False
    kept, ablated, only = runner.node_metric(torch.stack([outside, torch.ones_like(outside), ~outside]), None,
                                             per_pair=True).double()
    clean = runner.clean["metric"].double()
    n = clean.shape[0]
    figures = []
    for w in resample_counts(n, R, 0).double():
        m = [float((w * v).sum() / n) for v in (kept, ablated, clean, only)]
        figures.append([(m[0] - m[1]) / (m[2] - m[1]), m[2] - m[3]])
    lo, hi = np.quantile(np.array(figures), [(1 - level) / 2, (1 + level) / 2], axis=0)
    assert other["ci"]["faithfulness"] == pytest.approx([lo[0], hi[0]], abs=EXACT)
    assert other["ci"]["necessity"] == pytest.approx([lo[1], hi[1]], abs=EXACT)
    assert "edge_faithfulness" not in other["ci"]
    with_edges = scan_task(model, task, n_resamples=R, ci_level=level, search=search)
    lo_e, hi_e = with_edges.circuit.other_set["ci"]["edge_faithfulness"]
    assert lo_e < hi_e
    line = next(x for x in with_edges.answer().splitlines() if x.startswith("Held out:"))
    assert line.count(" [") == 3, line
    import copy
    import json

    from circuitkit.tasks.scores_check import check_task_scores

    data = json.loads(json.dumps(with_edges.to_json()))
    check_task_scores(data, "scores.json")
    for key, bad_value in (("faithfulness", [1.0, 0.5]), ("necessity", [0.1]), ("cpr", [0.0, 1.0])):
        bad = copy.deepcopy(data)
        bad["circuit"]["other_set"]["ci"][key] = bad_value
        with pytest.raises(CircuitkitError, match=f"circuit.other_set.ci.{key}"):
            check_task_scores(bad, "scores.json")


def test_the_target_can_apply_to_the_evaluation_pairs(model, task):
    result = scan_task(model, task, edges=False, n_resamples=20, target=0.7, target_on="evaluation")
    _, held = split_pairs(task.n_pairs, 0.5, 0)
    c = result.circuit
    faith, _ = _figures_by_hand(model, [task.pairs[i] for i in held.tolist()], c.heads)
    assert c.faithfulness == pytest.approx(faith, abs=EXACT) and faith >= 0.7
    assert c.other_set["set"] == "discovery"
    assert result.settings["split"]["target_on"] == "evaluation"


def test_few_pairs_are_not_split_and_the_answer_says_so(model):
    result = scan_task(model, copy_next_task(n=6, d_vocab=60), edges=False, n_resamples=20)
    assert result.circuit.other_set is None and "not split" in result.answer()


@pytest.mark.parametrize("kwargs, needle", [
    ({"holdout": 1.0}, "holdout"), ({"holdout": -0.1}, "holdout"), ({"holdout": True}, "holdout"),
    ({"target_on": "test"}, "target_on"), ({"split_seed": -1}, "split_seed"),
])
def test_bad_split_settings_are_refused(model, kwargs, needle):
    with pytest.raises(CircuitkitError, match=needle):
        scan_task(model, copy_next_task(n=8, d_vocab=60), **kwargs)


def test_the_answer_explains_the_abbreviations_it_uses():
    from circuitkit.handbuilt.induction import induction_circuit

    result = scan_task(induction_circuit(10, 16).model, copy_next_task(n=12), target=0.9, n_resamples=20)
    lines = result.answer().splitlines()
    legend, body = lines[-1], "\n".join(lines[:-1])
    assert legend.startswith("Legend: ") and "CPR" in body and "CPR = area under" in legend
    assert "EAP-IG = edge attribution patching" in legend and "L.H = head H of layer L" in legend
    assert "mN = the MLP" not in legend  # no MLP named in this answer
    nodes_only = scan_task(induction_circuit(10, 16).model, copy_next_task(n=12), edges=False, n_resamples=20)
    assert "CPR" not in nodes_only.legend() and "A->B" not in nodes_only.legend()


def test_scan_and_the_cli_pass_the_split_through(tmp_path, capsys):
    import json

    import circuitkit as ck
    from circuitkit import cli
    from circuitkit.handbuilt.induction import induction_circuit

    result = ck.scan(induction_circuit(10, 16).model, task=copy_next_task(n=12), holdout=0.25,
                     target_on="evaluation")
    assert result.settings["split"]["evaluation_pairs"] == 3 and result.settings["split"]["target_on"] == "evaluation"
    with pytest.raises(CircuitkitError, match="holdout"):
        ck.scan(None, holdout=0.5)
    task = copy_next_task(n=8, d_vocab=60)
    path = task_file(task, tmp_path / "copy.jsonl")
    out = tmp_path / "out"
    assert cli.main(["scan", "--task", str(path), "--holdout", "0", "--resamples", "20", "--out", str(out)]) == 0
    data = json.loads((out / "scores.json").read_text())
    assert data["settings"]["split"]["evaluation_pairs"] == 0 and data["circuit"]["other_set"] is None
    capsys.readouterr()
    assert cli.main(["scan", "--holdout", "1", "--task", str(path), "--out", str(tmp_path / "b")]) == 2
    assert cli.main(["scan", "--target-on", "evaluation", "--out", str(tmp_path / "i")]) == 2
    assert "--target-on" in capsys.readouterr().err
