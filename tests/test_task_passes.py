"""What a task scan's passes cost, counted: the clean run's backward reaches only the final norm and unembedding;
a pass that patches nothing below a layer resumes there (the strongest edges' exact effects, a node set patched
from a layer up) and equals the full pass; the pass counts of a known scan."""

from __future__ import annotations

import pytest
import torch

from circuitkit.models.adapters import adapt
from circuitkit.tasks import Task
from circuitkit.tasks.graph import TaskRunner
from tests.conftest import boot_bridge
from tests.test_tasks import toy_pairs

LAYERS = 3


def _runner(kind: str, kv_edges: str = "grouped", **extra) -> TaskRunner:
    model = {"mha-mlp": lambda: boot_bridge(attn_only=False, n_layers=LAYERS, d_vocab=50, seed=3),
             "gqa-ln-mlp": lambda: boot_bridge(attn_only=False, n_layers=LAYERS, n_key_value_heads=2, d_vocab=50,
                                               seed=8, normalization_type="LN"),
             "attn-only": lambda: boot_bridge(n_layers=LAYERS, d_vocab=50, seed=3)}[kind]()
    adapter = adapt(model)
    batch = Task.from_pairs(toy_pairs(), name="toy").tokenize(adapter)
    return TaskRunner(adapter, batch, "logit_diff", mlps=kind != "attn-only", ablation="corrupted",
                      kv_edges=kv_edges, **extra)


def _edges_into_every_layer(runner: TaskRunner) -> torch.Tensor:
    """One edge into each receiver channel of every layer and into the logits, from the latest sender it can
    have and from the input: ``[n, 2]``."""
    graph = runner.graph
    picked = []
    for (_, layer), cols in graph.receiver_slices.items():
        for receiver in (cols.start, cols.stop - 1):
            senders = graph.allowed[:, receiver].nonzero().flatten()
            picked += [(int(senders[-1]), receiver), (0, receiver)]
            if layer > 0:
                picked.append((int(senders[len(senders) // 2]), receiver))
    return torch.tensor(sorted(set(picked)))


@pytest.mark.parametrize(("kind", "kv_edges"), [("mha-mlp", "grouped"), ("gqa-ln-mlp", "grouped"),
                                                ("gqa-ln-mlp", "per-query-head"), ("attn-only", "grouped")])
def test_a_single_edge_pass_resumed_at_its_receivers_layer_equals_the_full_pass(kind, kv_edges):
    runner = _runner(kind, kv_edges)
    assert runner.adapter.can_resume
    edges = _edges_into_every_layer(runner)
    kept = runner.graph.allowed[None].repeat(len(edges), 1, 1)
    kept[torch.arange(len(edges)), edges[:, 0], edges[:, 1]] = False
    _ = runner.corrupted
    before = runner.passes
    full = runner.edge_metric(kept)
    full_passes = runner.passes - before
    before = runner.passes
    resumed = runner.single_edge_metric(edges)
    resumed_passes = runner.passes - before
    torch.testing.assert_close(resumed, full, rtol=0, atol=1e-5)
    assert not torch.equal(full, torch.full_like(full, float(runner.clean["metric"].mean())))  # edges that matter
    # each edge counts its receiver layer's share (the logits' edges: the last layer), its copies as the full pass's
    graph = runner.graph
    layer_of = {r: layer for (_, layer), cols in graph.receiver_slices.items() for r in range(cols.start, cols.stop)}
    if kv_edges == "grouped":
        assert full_passes == len(edges)
        share = sum((LAYERS - min(layer_of[int(r)], LAYERS - 1)) / LAYERS for r in edges[:, 1])
        assert resumed_passes == pytest.approx(share)
    assert resumed_passes < full_passes


def test_a_model_that_cannot_resume_runs_the_full_single_edge_pass(monkeypatch):
    runner = _runner("mha-mlp")
    edges = _edges_into_every_layer(runner)[:5]
    monkeypatch.setattr(type(runner.adapter), "can_resume", property(lambda self: False))
    _ = runner.corrupted
    before = runner.passes
    values = runner.single_edge_metric(edges)
    assert runner.passes - before == len(edges)
    kept = runner.graph.allowed[None].repeat(len(edges), 1, 1)
    kept[torch.arange(len(edges)), edges[:, 0], edges[:, 1]] = False
    torch.testing.assert_close(values, runner.edge_metric(kept), rtol=0, atol=1e-6)


def test_single_edge_metric_refuses_what_is_not_an_edge():
    from circuitkit import CircuitkitError

    runner = _runner("attn-only")
    logits = runner.graph.logits_index
    with pytest.raises(CircuitkitError, match="indices of edges of the graph"):
        runner.single_edge_metric(torch.tensor([[len(runner.graph.senders) - 1, 0]]))  # a late head into layer 0
    with pytest.raises(CircuitkitError, match=r"\[n, 2\]"):
        runner.single_edge_metric(torch.tensor([0, logits]))


@pytest.mark.parametrize("kind", ["mha-mlp", "gqa-ln-mlp"])
def test_a_node_set_patched_from_a_layer_up_resumes_there(kind):
    runner = _runner(kind)
    L, H = LAYERS, runner.spec.n_heads
    heads = torch.zeros(3, L, H, dtype=torch.bool)
    heads[0, 1, 2] = True  # from layer 1
    heads[1, 2, :] = True  # from layer 2
    heads[2, 1:, 1] = True
    _ = runner.corrupted
    resumed_before = runner.passes
    resumed = runner.node_metric(heads, None, per_pair=True)
    resumed_passes = runner.passes - resumed_before
    assert resumed_passes == pytest.approx(3 * (L - 1) / L)  # stacked: from the lowest layer patched in any copy
    extra = torch.zeros(1, L, H, dtype=torch.bool)
    extra[0, 0, 3] = True  # a set from layer 0 in the same pass: the pass is full
    before = runner.passes
    full = runner.node_metric(torch.cat([heads, extra]), None, per_pair=True)
    assert runner.passes - before == 4
    torch.testing.assert_close(resumed, full[:3], rtol=0, atol=1e-5)


def _autograd_nodes(tensor: torch.Tensor) -> int:
    seen, todo = set(), [tensor.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        todo += [next_fn for next_fn, _ in node.next_functions]
    return len(seen)


def test_the_clean_runs_backward_reaches_only_the_tail_and_counts_one_pass(monkeypatch):
    """Direct logit attribution's backward starts at a detached leaf at the last block's output: its autograd graph
    is the same size on a 1-layer and a 4-layer model (the final norm and the unembedding), so the clean run is
    one pass."""
    sizes = {}
    for layers in (1, 4):
        adapter = adapt(boot_bridge(attn_only=False, n_layers=layers, d_vocab=50, seed=3, normalization_type="LN"))
        runner = TaskRunner(adapter, Task.from_pairs(toy_pairs(), name="toy").tokenize(adapter), "logit_diff",
                            mlps=True, ablation="corrupted")
        grads: list[int] = []
        real_grad = torch.autograd.grad

        def counting(outputs, inputs, *args, grads=grads, real_grad=real_grad, **kwargs):
            grads.append(_autograd_nodes(outputs))
            return real_grad(outputs, inputs, *args, **kwargs)

        monkeypatch.setattr(torch.autograd, "grad", counting)
        assert runner.clean["dla"] is not None and runner.passes == 1.0
        monkeypatch.setattr(torch.autograd, "grad", real_grad)
        assert len(grads) == 1
        sizes[layers] = grads[0]
        _ = runner.corrupted
        assert runner.passes == 2.0
    assert sizes[1] == sizes[4] < 40, sizes


@pytest.mark.parametrize("kind", ["mha-mlp", "gqa-ln-mlp", "attn-only"])
def test_every_node_patched_is_the_corrupted_run_where_the_read_tokens_agree(kind):
    """The oracle: the all-patched pass itself, pair by pair, against the corrupted run's metric."""
    runner = _runner(kind)
    assert runner.every_node_patched_is_corrupted()  # toy_pairs corrupt token 1, never the last one
    L, H = LAYERS, runner.spec.n_heads
    every = {"head": torch.ones(1, L, H, dtype=torch.bool)}
    if kind != "attn-only":
        every["mlp"] = torch.ones(1, L, 1, dtype=torch.bool)
    for patched in (every, {"head": every["head"]}):  # with the MLPs patched too, or recomputed
        values = runner.patched_metric(patched, per_pair=True)[0]
        torch.testing.assert_close(values, runner.corrupted["metric"], rtol=0, atol=1e-5)
    one_head_kept = {"head": every["head"].clone()}
    one_head_kept["head"][0, L - 1, 0] = False
    assert not torch.allclose(runner.patched_metric(one_head_kept, per_pair=True)[0], runner.corrupted["metric"],
                              atol=1e-4)


def test_the_all_patched_pass_runs_where_it_is_not_the_corrupted_run():
    pairs = toy_pairs()
    clean, corrupted, answer, wrong = pairs[2]
    corrupted = list(corrupted)
    corrupted[-1] = (clean[-1] + 3) % 50  # one pair's last token corrupted: its read position differs
    pairs[2] = (clean, corrupted, answer, wrong)
    adapter = adapt(boot_bridge(attn_only=False, n_layers=LAYERS, d_vocab=50, seed=3))
    batch = Task.from_pairs(pairs, name="toy").tokenize(adapter)
    runner = TaskRunner(adapter, batch, "logit_diff", mlps=True, ablation="corrupted")
    assert not runner.every_node_patched_is_corrupted()
    plain = Task.from_pairs(toy_pairs(), name="toy").tokenize(adapter)
    for ablation in ("mean", "zero", "clean_mean"):
        runner = TaskRunner(adapter, plain, "logit_diff", mlps=True, ablation=ablation)
        assert not runner.every_node_patched_is_corrupted()


def test_the_node_search_and_the_held_out_curve_do_not_run_the_corrupted_run_again(monkeypatch):
    """Counted in the runner's node passes: no pass patches every node where that is the corrupted run, and the
    figures are those of a search that runs it (the same values, to float rounding)."""
    from circuitkit.tasks.circuit import node_circuit
    from circuitkit.tasks.scan import _other_set

    runner = _runner("mha-mlp")
    held = _runner("mha-mlp")
    scores = runner.node_gradients(2)
    patched_sets = []
    real = TaskRunner._node_pass

    def spying(self, patched):
        for s in range(next(iter(patched.values())).shape[0]):
            patched_sets.append(all(bool(mask[s].all()) for mask in patched.values()))
        return real(self, patched)

    monkeypatch.setattr(TaskRunner, "_node_pass", spying)
    found = node_circuit(runner, scores, 0.8, "abs")
    other = _other_set(held, "evaluation", found.curve, len(found.heads), scores, "abs", False, ())
    assert patched_sets and not any(patched_sets)
    monkeypatch.setattr(TaskRunner, "every_node_patched_is_corrupted", lambda self: False)
    patched_sets.clear()
    again = node_circuit(_runner("mha-mlp"), scores, 0.8, "abs")
    other_again = _other_set(_runner("mha-mlp"), "evaluation", found.curve, len(found.heads), scores, "abs", False,
                             ())
    assert sum(patched_sets) == 2  # the old way: one pass on each set
    assert again.heads == found.heads
    assert [p.size for p in again.curve] == [p.size for p in found.curve]
    for a, b in zip(again.curve, found.curve, strict=True):
        assert a.faithfulness == pytest.approx(b.faithfulness, abs=1e-5)
    assert again.all_patched == pytest.approx(found.all_patched, abs=1e-5)
    for key in ("faithfulness", "necessity", "metric_all_nodes_patched"):
        assert other_again[key] == pytest.approx(other[key], abs=1e-5)
