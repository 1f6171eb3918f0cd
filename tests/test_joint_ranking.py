"""The joint path from every node patched to none, one function for both engines (``detect/joint_path.py``), and a
task's node circuit ranked by it (``scan_task(node_ranking="joint")``).

Checked against what does not depend on the code under test: completeness (the shares along the path add up to
the metric's whole change, ``M(clean) - M(every node patched)``, each measured by a plain patched pass), the
induction engine's own ranking on the same tokens, and the induction scan's circuit on the bundled model.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

import circuitkit as ck
from circuitkit import zoo
from circuitkit.circuits.faithfulness import Ablator, ablation_values, radau_shares
from circuitkit.detect.joint_path import Gate, gate_gradients
from circuitkit.detect.tokens import RepeatedTokens
from circuitkit.graph.runner import TaskRunner
from circuitkit.models.adapters import HOOKS, adapt
from circuitkit.tasks import repeated_tokens, scan_task
from tests.conftest import gqa_bridge
from tests.test_tasks import copy_next_task

MIDPOINTS = 256
"""Points of the midpoint rule in the completeness check (on the random model's path the rule's error is 4e-3
relative at 16 points, 2e-3 at 64 and 6e-4 at 256, the same in float64: the path is not smooth enough for the rule
to converge faster; 256 keep it below the tolerance)."""


@pytest.fixture(scope="module")
def bundled():
    return zoo.load()


def _midpoints(n: int) -> torch.Tensor:
    return (torch.arange(n, dtype=torch.float64) + 0.5) / n


@pytest.mark.parametrize("groups", [False, True])
def test_the_shares_along_the_joint_path_add_up_to_the_whole_change(groups):
    """Heads, MLPs (each MLP's output one node, or with ``groups`` two nodes of half its units each) on a random
    grouped-query model with LayerNorm: integrated over many
    points, the gates' gradients add up to the metric with every gate open minus with every gate shut, both
    measured by plain runs of the runner's own patching pass."""
    adapter = adapt(gqa_bridge())  # LayerNorm, MLPs, grouped-query attention
    task = copy_next_task(n=6, d_vocab=50, seed=1)
    runner = TaskRunner(adapter, task.tokenize(adapter), task.metric, mlps=True, ablation="corrupted")
    L = adapter.spec.n_layers
    gates = [Gate(HOOKS.z(layer), runner.values_of("head")[layer]) for layer in range(L)]
    gates += [Gate(HOOKS.mlp_out(layer), runner.values_of("mlp")[layer], 2 if groups else 1) for layer in range(L)]
    grads = gate_gradients(adapter, runner.batch.clean, gates, _midpoints(MIDPOINTS),
                           lambda logits: runner.metric(logits).mean(-1), positions=runner.positions)
    assert all(g is not None for g in grads)
    assert grads[L].shape == (MIDPOINTS, 2 if groups else 1)
    total = sum(float(g.double().mean(0).sum()) for g in grads)
    everything = {"head": torch.ones(1, L, adapter.spec.n_heads, dtype=torch.bool),
                  "mlp": torch.ones(1, L, 1, dtype=torch.bool)}
    shut = float(runner.patched_metric(everything)[0].mean())
    whole = float(runner.clean["metric"].mean()) - shut
    assert abs(whole) > 1e-2  # the metric moves: the check is not 0 = 0
    assert total == pytest.approx(whole, rel=3e-3, abs=1e-4)


def test_the_task_runner_and_the_induction_engine_share_the_joint_path(bundled):
    """On the same repeated tokens, the clean mean ablation and the loss on the copies (minus the task's
    log-probability), the task runner's shares are the induction engine's with the sign of the metric."""
    adapter = adapt(bundled)
    task = repeated_tokens(bundled, 8, seed=3)
    runner = TaskRunner(adapter, task.tokenize(adapter), task.metric, mlps=False, ablation="clean_mean")
    batch = RepeatedTokens(batch=8, seed=3).build(bundled)
    assert torch.equal(batch.tokens, runner.batch.clean)
    before = runner.passes
    scores, typed = runner.joint_shares(mlp_nodes=False)
    assert runner.passes - before == 1 + 6 and typed == {}  # the clean run behind the means, then the two points
    values, _ = ablation_values(adapter, batch, "mean")
    induction = radau_shares(Ablator(adapter, batch, values))  # of the loss: restoring a head lowers it
    graph, spec = runner.graph, adapter.spec
    task_heads = torch.stack([scores[[graph.sender_index(layer, h) for h in range(spec.n_heads)]]
                              for layer in range(spec.n_layers)])
    torch.testing.assert_close(task_heads, -induction, atol=1e-5, rtol=1e-5)
    assert float(task_heads.abs().max()) > 0.1


def test_a_repeated_tokens_task_ranked_by_the_joint_path_finds_the_induction_scans_circuit(bundled, tmp_path):
    induction = ck.scan(bundled).verified
    assert induction.ranked_by == "joint"
    task = repeated_tokens(bundled, 16, seed=0)
    by_eap_ig = scan_task(bundled, task, holdout=0, edges=False, node_ranking="eap-ig")
    joint = scan_task(bundled, task, holdout=0, edges=False)  # the default
    c = joint.circuit
    assert sorted(c.heads) == sorted(induction.heads)
    assert c.faithfulness == pytest.approx(induction.faithfulness, abs=1e-6)
    assert len(by_eap_ig.circuit.heads) > len(c.heads)  # EAP-IG on the input path needs more heads here
    stages = {s.name: s.passes for s in joint.stages}
    assert stages["joint"] == 6 and "joint" not in {s.name for s in by_eap_ig.stages}
    assert joint.settings["plan"]["joint"] == 6
    assert c.ranked_by == "joint" and joint.settings["node_ranking"] == "joint"
    assert "nodes ranked by the joint path" in str(joint)
    joint.save(tmp_path / "joint")
    again = ck.Scan.load(tmp_path / "joint")
    assert again.circuit.ranked_by == "joint" and again.circuit.heads == c.heads
    assert torch.equal(again.ranking["heads"], joint.ranking["heads"]) and again.ranking["mlps"] is None
    assert "joint" in again.table()[0] and by_eap_ig.ranking is None and "joint" not in by_eap_ig.table()[0]
    # each scan's table, report and notebook view list the heads by what ranked its circuit first
    for scan, column, words in ((again, "joint", "|joint| (its share along the joint path"),
                                (by_eap_ig, "score", "|EAP-IG score| (which ranked the circuit)")):
        values = [abs(r[column]) for r in scan.table()]
        assert values == sorted(values, reverse=True) and values[0] > values[-1]
        scan.save(tmp_path / f"page-{column}")
        page = (tmp_path / f"page-{column}" / "report.html").read_text()
        data = json.loads(re.search(r'id="ck-data">(.*?)</script>', page).group(1))
        assert words in page and data["sort"] == column
        assert f"Heads by |{'joint' if column == 'joint' else 'EAP-IG score'}|" in scan._repr_html_()
    by_eap_ig.save(tmp_path / "eap")
    path = tmp_path / "eap" / "scores.json"
    data = json.loads(path.read_text())
    assert data["circuit"]["ranked_by"] == "eap-ig" == data["settings"]["node_ranking"]
    assert ck.Scan.load(tmp_path / "eap").circuit.ranked_by == "eap-ig"
    # a file written before the joint ranking names none (EAP-IG ranked it): it loads, and says it was not told
    del data["circuit"]["ranked_by"], data["settings"]["node_ranking"]
    path.write_text(json.dumps(data))
    old = ck.Scan.load(tmp_path / "eap")
    assert old.circuit.ranked_by is None and "joint path" not in str(old)


def test_a_saved_ranking_must_agree_with_its_settings(bundled, tmp_path):
    scan = scan_task(bundled, repeated_tokens(bundled, 8, seed=0), holdout=0, edges=False)
    scan.save(tmp_path / "s")
    path = tmp_path / "s" / "scores.json"
    data = json.loads(path.read_text())
    for change, message in ((lambda d: d["circuit"].update(ranked_by="eap-ig"), "circuit.ranked_by"),
                            (lambda d: d["circuit"].pop("ranked_by"), "ranked_by"),
                            (lambda d: d["settings"].update(node_ranking="effect"), "settings.node_ranking"),
                            (lambda d: d["circuit"].update(ranked_by="joint "), "circuit.ranked_by"),
                            (lambda d: d["heads"].pop("joint"), "heads.joint"),
                            (lambda d: d["mlps"].update(joint=[0.0]), "mlps.joint"),
                            (lambda d: d["heads"]["joint"][0].append(1.0), "heads.joint"),
                            (lambda d: (d["settings"].update(node_ranking="eap-ig"),
                                        d["circuit"].update(ranked_by="eap-ig")), "heads.joint")):
        broken = json.loads(json.dumps(data))
        change(broken)
        path.write_text(json.dumps(broken))
        with pytest.raises(ck.CircuitkitError, match=message):
            ck.Scan.load(tmp_path / "s")


def test_every_later_stage_ranks_by_the_joint_path(bundled, monkeypatch):
    """The node search, a search beyond ranking, the held-out curve and the stability reruns order the nodes as the
    scan did (each is handed the joint shares, not EAP-IG's scores); each rerun pays the joint path's 6 passes, and
    the plan says so before the first pass."""
    import circuitkit.tasks.circuit as circuit_module
    import circuitkit.tasks.other_set as other_set_module
    import circuitkit.tasks.robustness as robustness_module
    import circuitkit.tasks.search as search_module

    handed: dict[str, object] = {}

    def spy(module, name, position):
        real = getattr(module, name)

        def wrapped(*args, **kwargs):
            handed[name] = kwargs["ranking"] if position is None else args[position]
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapped)

    spy(circuit_module, "node_circuit", 1)
    spy(search_module, "search_node_circuit", 2)
    spy(other_set_module, "other_set_figures", 4)
    spy(robustness_module, "node_stability", None)
    task = repeated_tokens(bundled, 16, seed=0)
    told: list[tuple[str, float]] = []
    scan = scan_task(bundled, task, edges=False, node_ranking="joint", stability=2, search="refined",
                     progress=lambda stage, passes: told.append((stage, passes)))
    shares = handed["node_circuit"]
    assert handed["search_node_circuit"] is shares and handed["other_set_figures"] is shares
    assert handed["node_stability"] == "joint"
    graph = TaskRunner(adapt(bundled), task.tokenize(adapt(bundled)), task.metric, mlps=False,
                       ablation=task.ablation).graph
    heads = torch.stack([shares[[graph.sender_index(layer, h) for h in range(4)]] for layer in range(2)])
    assert not torch.allclose(heads, scan.scores.float())  # EAP-IG's node scores: another order of the heads
    c = scan.circuit
    assert c.ranked_by == "joint" and c.search is not None and c.other_set["faithfulness"] is not None
    assert scan.stability is not None
    stages = {s.name: s.passes for s in scan.stages}
    plan = scan.settings["plan"]
    assert stages["joint"] == plan["joint"] == 6
    # each rerun: its clean and corrupted runs (the joint path reads the corrupted values), 6, and its node search
    assert stages["stability"] >= 2 * (2 + 6)
    assert [name for name, _ in told][:3] == ["clean", "attribute", "joint"]


def test_the_ranking_is_checked_before_the_model_is_read():
    with pytest.raises(ck.CircuitkitError, match="node_ranking"):
        scan_task(object(), repeated_tokens(zoo.load(), 4), node_ranking="effect")
    with pytest.raises(ck.CircuitkitError, match="node_ranking"):
        ck.scan(zoo.load(), node_ranking="joint")  # the induction scan ranks by the joint path already
