"""Searches over a task's edge circuit (tasks/search.py): dangling edges pruned change no metric (checked against
the edge pass on random edge sets, grouped key/value heads and MLPs included); the refined edge circuit reaches the
target as an independent edge pass measures it, is never larger than the ranked one and is 1-minimal, checked
against a brute force over every edge set of a small graph; block rounds (past ``singles`` members) do the same
with measured sets only."""

from __future__ import annotations

import itertools

import pytest
import torch

from circuitkit import CircuitkitError
from circuitkit.graph.runner import TaskRunner
from circuitkit.models.adapters import adapt
from circuitkit.tasks import Task
from circuitkit.tasks.circuit import edge_circuit
from circuitkit.tasks.search import dangling, edge_problem, search_edge_circuit
from tests.conftest import boot_bridge
from tests.test_tasks import toy_pairs

EXACT = 1e-5
"""One edge set measured by two stacked edge passes (with other sets, or a pruned twin): float32 sums in another
order."""


def runner_of(seed: int, **shape) -> TaskRunner:
    model = boot_bridge(d_vocab=50, seed=seed, **shape)
    adapter = adapt(model)
    task = Task.from_pairs(toy_pairs(6), name="toy")
    return TaskRunner(adapter, task.tokenize(adapter), "logit_diff", mlps=not shape.get("attn_only", True),
                      ablation="corrupted")


def small_runner(seed: int) -> TaskRunner:
    """Two layers of one head, no MLP: 12 edges (4096 edge sets, all measurable), with paths through layer 0."""
    return runner_of(seed, n_layers=2, n_heads=1, attn_only=True)


def brute_force(runner: TaskRunner) -> dict[frozenset, float]:
    """Every edge set's faithfulness (edge indices in ``allowed``'s nonzero order), one stacked edge_metric call."""
    index = runner.graph.allowed.nonzero()
    E = index.shape[0]
    sets = [frozenset(c) for k in range(E + 1) for c in itertools.combinations(range(E), k)]
    masks = torch.zeros(len(sets), *runner.graph.allowed.shape, dtype=torch.bool)
    for i, s in enumerate(sets):
        for e in s:
            masks[i, index[e, 0], index[e, 1]] = True
    values = runner.edge_metric(masks).tolist()
    clean, corrupted = float(runner.clean["metric"].mean()), float(runner.corrupted["metric"].mean())
    return {s: (v - corrupted) / (clean - corrupted) for s, v in zip(sets, values, strict=True)}


@pytest.mark.parametrize("shape", [
    {"n_layers": 3, "n_heads": 4, "attn_only": False},
    {"n_layers": 3, "n_heads": 4, "attn_only": False, "n_key_value_heads": 2},
    {"n_layers": 2, "n_heads": 4, "attn_only": True},
], ids=["mha-mlp", "gqa-mlp", "attn-only"])
def test_pruning_dangling_edges_changes_no_metric(shape):
    runner = runner_of(0, **shape)
    allowed = runner.graph.allowed
    g = torch.Generator().manual_seed(1)
    kept = torch.stack([(torch.rand(allowed.shape, generator=g) < p) & allowed for p in (0.05, 0.1, 0.2, 0.4)])
    pruned = torch.stack([dangling(runner.graph, k) for k in kept])
    assert bool((pruned <= kept).all())  # only drops
    assert int(kept.sum() - pruned.sum()) > 0, "no edge was dangling: the check would prove nothing"
    values = runner.edge_metric(torch.cat([kept, pruned]))
    torch.testing.assert_close(values[4:], values[:4], atol=EXACT, rtol=0)
    # a pruned set has nothing left to prune, and an edge that is not dangling changes the metric when it goes
    for p in pruned:
        assert torch.equal(dangling(runner.graph, p), p)


def test_an_edge_into_a_node_that_sends_nothing_is_dangling():
    runner = small_runner(0)
    graph = runner.graph
    kept = torch.zeros_like(graph.allowed)
    r_q0 = graph.receivers.index("0.0:q")
    kept[graph.senders.index("input"), r_q0] = True  # 0.0 reads it, but sends no kept edge
    assert not bool(dangling(graph, kept).any())
    kept[graph.sender_index(0, 0), graph.logits_index] = True  # now 0.0 reaches the logits
    assert torch.equal(dangling(graph, kept), kept)
    only_out = torch.zeros_like(kept)
    only_out[graph.sender_index(1, 0), graph.logits_index] = True  # 1.0 reads no kept edge: its corrupted output
    assert not bool(dangling(graph, only_out).any())


@pytest.fixture(scope="module", params=[0, 2, 4])
def small(request):
    runner = small_runner(request.param)
    scores, _ = runner.edge_gradients(2)
    return runner, scores, brute_force(runner)


@pytest.mark.parametrize("target", (0.5, 0.8, 0.95))
def test_refined_edges_are_one_minimal_against_a_brute_force_over_every_edge_set(small, target):
    runner, scores, table = small
    edges, faith, *_ = edge_circuit(runner, scores, target, "abs")
    names, f, result = search_edge_circuit("refined", runner, scores, edges, target, "abs", faith)
    problem = edge_problem(runner, scores, "abs")
    position = {n: i for i, n in enumerate(problem.nodes)}
    chosen = frozenset(position[e] for e in names)
    assert len(names) <= len(edges) and result.start == len(edges) and result.size == len(names)
    assert f >= target and table[chosen] == pytest.approx(f, abs=EXACT)
    for member in chosen:
        assert table[chosen - {member}] < target, f"{problem.nodes[member]} could still be dropped"
    optimum = min(len(s) for s, v in table.items() if v >= target)
    assert optimum <= len(chosen)
    assert result.trace[0][0] == "start" and result.trace[1][0] == "pruned"


def test_block_rounds_keep_only_measured_sets_reaching_the_target(small):
    runner, scores, table = small
    target = 0.8
    edges, faith, *_ = edge_circuit(runner, scores, target, "abs")
    names, f, result = search_edge_circuit("refined", runner, scores, edges, target, "abs", faith,
                                           options={"singles": 0, "swaps": 0})
    problem = edge_problem(runner, scores, "abs")
    position = {n: i for i, n in enumerate(problem.nodes)}
    chosen = frozenset(position[e] for e in names)
    assert f >= target and table[chosen] == pytest.approx(f, abs=EXACT) and len(names) <= len(edges)
    assert result.settings["stopped"] in ("no block of one member can go", "one node left")
    assert {step for step, _, _ in result.trace} <= {"start", "pruned", "block"}
    # blocks of one member that cannot go: with one member a block, no member can go alone
    if result.settings["stopped"] == "no block of one member can go":
        for member in chosen:
            assert table[chosen - {member}] < target


def test_edge_search_refuses_edges_outside_the_graph(small):
    runner, scores, _ = small
    with pytest.raises(CircuitkitError, match="edges"):
        search_edge_circuit("refined", runner, scores, ("9.9->logits",), 0.8, "abs", 1.0)
    with pytest.raises(CircuitkitError, match="search"):
        search_edge_circuit("greedy", runner, scores, (), 0.8, "abs", 1.0)
