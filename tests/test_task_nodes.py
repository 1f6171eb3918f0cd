"""Node types as data: MLP neuron groups as nodes of a task circuit, and a node type registered by a test.

Oracles: a neuron group's patch computed densely (the MLP's output rebuilt by hand from the corrupted group's
activations through the output matrix, every other unit clean), its EAP-IG score by hand (one backward of the
metric at the clean run), and the identity that a layer's group scores add up to the MLP's own node score (the
MLP's output is linear in its hidden units).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from circuitkit import CircuitkitError
from circuitkit.graph.nodes import NodeType, groups_of, neuron_groups
from circuitkit.graph.runner import TaskRunner
from circuitkit.models.adapters import HOOKS, adapt
from circuitkit.tasks import Task, scan_task
from tests.conftest import boot_bridge
from tests.test_tasks import toy_pairs

EXACT = 1e-5
"""Patching with hooks vs by hand: the same float32 operations in a different order."""
SUM_TOLERANCE = 1e-4
"""Group scores summed vs the MLP's score: float32 sums over 128 units against sums over 32 output dimensions."""
G = 8


@pytest.fixture(scope="module")
def model():
    return boot_bridge(attn_only=False, n_layers=3, d_vocab=50, seed=3)


@pytest.fixture(scope="module")
def runner(model):
    adapter = adapt(model)
    task = Task.from_pairs(toy_pairs(), name="toy")
    return TaskRunner(adapter, task.tokenize(adapter), "logit_diff", mlps=True, ablation="corrupted",
                      node_types=(neuron_groups(G),))


def _capture(model, tokens, name):
    seen = {}

    def hook(x, hook):
        seen["x"] = x.detach().clone()

    with torch.no_grad():
        model.run_with_hooks(tokens, fwd_hooks=[(name, hook)])
    return seen["x"]


def _logit_diff(logits, batch) -> torch.Tensor:
    rows = torch.arange(batch.n_pairs)
    last = logits[rows, batch.last]
    return (last[rows, batch.answers[:, 0]] - last[rows, batch.wrongs[:, 0]]).mean()


def test_groups_are_contiguous_and_within_one_of_equal():
    assert groups_of(10, 3).tolist() == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert groups_of(4, 4).tolist() == [0, 1, 2, 3] and groups_of(5, 1).tolist() == [0] * 5


@pytest.mark.parametrize("layer, group", [(0, 3), (2, 7)])
def test_a_neuron_group_patch_equals_the_mlp_output_rebuilt_by_hand(model, runner, layer, group):
    """Patching group ``g`` of layer ``l`` = the MLP's clean output plus the corrupted-minus-clean activations of the
    group's units through the output matrix ``W_out`` (every other unit and every other layer clean)."""
    batch = runner.batch
    post_clean = _capture(model, batch.clean, HOOKS.mlp_post(layer))
    post_corrupt = _capture(model, batch.corrupted, HOOKS.mlp_post(layer))
    d_mlp = post_clean.shape[-1]
    units = torch.arange(d_mlp)[(torch.arange(d_mlp) * G // d_mlp) == group]
    W_out = model.blocks[layer].mlp.out.weight  # [d_model, d_mlp]: out = post @ W_out.T + b
    change = (post_corrupt[..., units] - post_clean[..., units]) @ W_out[:, units].T.detach()

    def rebuilt(x, hook):
        return x + change

    with torch.no_grad():
        by_hand = float(_logit_diff(model.run_with_hooks(batch.clean, fwd_hooks=[(HOOKS.mlp_out(layer), rebuilt)]),
                                    batch))
    patched = torch.zeros(1, 3, G, dtype=torch.bool)
    patched[0, layer, group] = True
    assert float(runner.patched_metric({"neurons": patched})[0]) == pytest.approx(by_hand, abs=EXACT)
    assert abs(by_hand - float(runner.clean["metric"].mean())) > 1e-4  # the patch changes something


def test_stacked_sets_of_every_type_equal_each_set_alone(runner):
    g = torch.Generator().manual_seed(0)
    sets = {"head": torch.rand(3, 3, 4, generator=g) < 0.4, "mlp": torch.rand(3, 3, 1, generator=g) < 0.3,
            "neurons": torch.rand(3, 3, G, generator=g) < 0.5}
    together = runner.patched_metric(sets)
    for s in range(3):
        alone = runner.patched_metric({k: v[s:s + 1] for k, v in sets.items()})
        assert float(alone[0]) == pytest.approx(float(together[s]), abs=EXACT)
    # node_metric is patched_metric of heads and MLPs
    assert runner.node_metric(sets["head"], sets["mlp"][..., 0]).tolist() == pytest.approx(
        runner.patched_metric({"head": sets["head"], "mlp": sets["mlp"]}).tolist(), abs=EXACT)


def test_group_scores_by_hand_at_one_point(model, runner):
    """``steps=1``: a group's score is ``sum (post - post') * dM/dpost`` at the clean run, by one backward here."""
    _, _, typed = runner.attribute(1, "right")  # the right point of one step: the clean run
    batch = runner.batch
    leaves = {}

    def add_leaf(x, hook):
        leaves[HOOKS.layer_of(hook.name)] = leaf = torch.zeros_like(x, requires_grad=True)
        return x + leaf

    with torch.enable_grad():
        logits = model.run_with_hooks(batch.clean, fwd_hooks=[(HOOKS.mlp_post(layer), add_leaf) for layer in range(3)])
        grads = torch.autograd.grad(_logit_diff(logits, batch), [leaves[layer] for layer in range(3)])
    for layer in range(3):
        delta = _capture(model, batch.clean, HOOKS.mlp_post(layer)) - _capture(model, batch.corrupted,
                                                                                HOOKS.mlp_post(layer))
        per_unit = (delta * grads[layer]).sum((0, 1))
        d_mlp = per_unit.shape[0]
        expected = torch.zeros(G).index_add_(0, torch.arange(d_mlp) * G // d_mlp, per_unit)
        assert torch.allclose(typed["neurons"][layer], expected, atol=1e-5, rtol=1e-4)


def test_a_layers_group_scores_add_up_to_its_mlp_score(runner):
    _, node_scores, typed = runner.attribute(3)
    for layer in range(3):
        mlp = float(node_scores[runner.graph.sender_index(layer, None)])
        assert float(typed["neurons"][layer].sum()) == pytest.approx(mlp, rel=SUM_TOLERANCE, abs=1e-6)


def test_a_neuron_circuit_is_found_saved_and_reported(model, tmp_path):
    """``neuron_groups``: groups join the node circuit beside the heads; its faithfulness is what patching exactly
    those nodes gives; scores.json (schema-valid) and the page list them."""
    import jsonschema

    from circuitkit import tasks

    task = Task.from_pairs(toy_pairs(12), name="toy")
    scan = scan_task(model, task, neuron_groups=4, target=0.8, n_resamples=100, edges=False)
    c = scan.circuit
    members = c.nodes["neurons"]
    assert members and all(m.startswith("m") and ".n" in m for m in members)
    assert c.n_nodes_total == 3 * 4 + 3 * 4
    # the circuit's faithfulness, measured again on the discovery pairs with the members kept
    adapter = adapt(model)
    runner = TaskRunner(adapter, task.tokenize(adapter).subset(_discovery(scan, task)), "logit_diff", mlps=True,
                        ablation="corrupted", node_types=(neuron_groups(4),))
    heads = torch.ones(1, 3, 4, dtype=torch.bool)
    for layer, h in c.heads:
        heads[0, layer, h] = False
    groups = torch.ones(1, 3, 4, dtype=torch.bool)
    for label in members:
        layer, g = label[1:].split(".n")
        groups[0, int(layer), int(g)] = False
    kept = float(runner.patched_metric({"head": heads, "neurons": groups})[0])
    none = float(runner.patched_metric({"head": torch.ones_like(heads), "neurons": torch.ones_like(groups)})[0])
    clean = float(runner.clean["metric"].mean())
    assert (kept - none) / (clean - none) == pytest.approx(c.faithfulness, abs=1e-5)
    data = json.loads(json.dumps(scan.to_json()))
    schema = json.loads((Path(tasks.__file__).parent / "task_scores.schema.json").read_text())
    jsonschema.validate(data, schema)
    assert data["circuit"]["nodes"]["neurons"] == list(members)
    assert data["nodes"]["neurons"]["hook"] == HOOKS.mlp_post(0) and len(data["nodes"]["neurons"]["score"]) == 3
    assert data["settings"]["neuron_groups"] == 4
    saved = scan.save(tmp_path / "out")
    page = saved.report.read_text()
    assert "The circuit's neurons nodes" in page and members[0] in page
    assert "neuron group G of the MLP" in scan.answer() and "neuron groups (m" in scan.answer()
    back = tasks.TaskScan.load(tmp_path / "out")  # the node type survives the reload, figure for figure
    assert back.to_json() == scan.to_json() and back.circuit.nodes == c.nodes
    assert torch.equal(back.nodes["neurons"]["score"], scan.nodes["neurons"]["score"])
    assert "mN = the MLP" not in scan.answer()


def _discovery(scan, task):
    from circuitkit.tasks.scan import split_pairs

    split = scan.settings["split"]
    return split_pairs(task.n_pairs, split["holdout"], split["seed"])[0]


RESID = NodeType("resid", lambda spec: 1, lambda layer, i: f"r{layer}", HOOKS.resid_pre,
                 "the residual stream entering the layer replaced", "rL = the residual stream entering layer L")


def test_a_node_type_registered_here_reaches_the_circuit_the_json_and_the_page(model, tmp_path):
    """A new kind of node in one record (``RESID`` above: the residual stream entering each layer) and one argument:
    it is scored, ranked, patched, listed in scores.json and on the page."""
    scan = scan_task(model, Task.from_pairs(toy_pairs(12), name="toy"), node_types=[RESID], target=0.8,
                     n_resamples=100, edges=False)
    members = scan.circuit.nodes["resid"]
    assert members and set(members) <= {"r0", "r1", "r2"}
    data = scan.to_json()
    assert data["circuit"]["nodes"]["resid"] == list(members) and data["nodes"]["resid"]["labels"] == [
        ["r0"], ["r1"], ["r2"]]
    page = scan.save(tmp_path / "out").report.read_text()
    assert "The circuit's resid nodes" in page and "residual stream entering layer L" in page


def test_the_residual_stream_at_layer_0_scores_the_whole_gap_at_one_point(model):
    """Patching the residual stream entering layer 0 is the corrupted run, and its first-order score at one IG
    point is the IG integral of the whole input: with one point, ``(x - x') . dM/dx`` at the clean input."""
    adapter = adapt(model)
    runner = TaskRunner(adapter, Task.from_pairs(toy_pairs(), name="toy").tokenize(adapter), "logit_diff",
                        mlps=True, ablation="corrupted", node_types=(RESID,))
    patched = torch.zeros(1, 3, 1, dtype=torch.bool)
    patched[0, 0, 0] = True
    assert float(runner.patched_metric({"resid": patched})[0]) == pytest.approx(
        float(runner.corrupted["metric"].mean()), abs=EXACT)
    _, node_scores, typed = runner.attribute(1)
    assert float(typed["resid"][0, 0]) == pytest.approx(float(node_scores[0]), rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("kwargs, needle", [
    (dict(neuron_groups=4, mlp_nodes=True), "beside mlp_nodes=True"),
    (dict(neuron_groups=0), "neuron_groups"),
    (dict(neuron_groups=True), "neuron_groups"),
    (dict(neuron_groups=4096), "at least 4096 units"),
    (dict(node_types=["resid"]), "NodeType records"),
    (dict(node_types=[RESID, RESID]), "each node type once"),
])
def test_bad_node_settings_are_one_clear_line(model, kwargs, needle):
    with pytest.raises(CircuitkitError, match=needle) as info:
        scan_task(model, Task.from_pairs(toy_pairs(4), name="toy"), edges=False, **kwargs)
    assert "\n" not in str(info.value)


def test_neurons_need_a_model_with_mlps():
    with pytest.raises(CircuitkitError, match="does not have"):
        scan_task(boot_bridge(attn_only=True, d_vocab=50), Task.from_pairs(toy_pairs(4)), neuron_groups=2)


def test_bad_patched_sets_are_refused(runner):
    with pytest.raises(CircuitkitError, match=r"\[sets, 3, 8\]"):
        runner.patched_metric({"neurons": torch.zeros(1, 3, 4, dtype=torch.bool)})
    with pytest.raises(CircuitkitError, match="one of"):
        runner.patched_metric({"resid": torch.zeros(1, 3, 1, dtype=torch.bool)})


def test_no_module_of_tasks_or_circuits_spells_a_hook_name():
    """Every hook name the task and circuit engines use comes from models/adapters.HOOKS (the hook vocabulary)."""
    import re

    import circuitkit

    root = Path(circuitkit.__file__).parent
    spelled = [f"{path.relative_to(root)}:{i + 1}" for folder in ("tasks", "circuits")
               for path in sorted((root / folder).glob("*.py"))
               for i, line in enumerate(path.read_text().splitlines())
               if re.search(r"[\"'](blocks\.|ln_final\.|hook_(?!dict\b)[a-z_]+[\"'])", line)]
    assert spelled == []
