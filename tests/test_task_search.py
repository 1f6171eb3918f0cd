"""The task circuit search against brute force over every size.

The node circuit is the smallest top-``n`` node set whose faithfulness on the pairs reaches the target: measured
here at every ``n`` in one stacked pass (brute force) and compared with :func:`node_circuit`'s answer, with and
without the coarse search (32 pairs or more, past ``COARSE_AFTER`` nodes: sizes stacked on a quarter of the pairs,
a pass of the pairs for four sizes; forced from the first size here, the models being small). The edge circuit's
size is the smallest top-``k`` to within 1/64 of ``k``.
"""

from __future__ import annotations

import pytest
import torch

from circuitkit.circuits.curve import faithfulness_of
from circuitkit.graph.runner import TaskRunner
from circuitkit.models.adapters import adapt
from circuitkit.tasks import Task
from circuitkit.tasks.circuit import _order, edge_circuit, node_circuit, node_order
from tests.conftest import boot_bridge
from tests.test_tasks import toy_pairs


@pytest.fixture(scope="module")
def model():
    return boot_bridge(n_layers=3, n_heads=8, attn_only=False, d_vocab=50, seed=5)


def _runner(model, n_pairs: int, ablation: str = "corrupted") -> TaskRunner:
    adapter = adapt(model)
    task = Task.from_pairs(toy_pairs(n_pairs, seed=2), name="toy")
    return TaskRunner(adapter, task.tokenize(adapter), "logit_diff", mlps=True, ablation=ablation)


def _node_curve(runner: TaskRunner, node_scores, rank: str, mlp_nodes: bool) -> list[float]:
    """Faithfulness of the top-n nodes for every n (brute force, one stacked pass)."""
    spec = runner.spec
    L, H = spec.n_layers, spec.n_heads
    order = node_order(runner.graph, L, H, node_scores, rank, mlp_nodes)
    heads = torch.ones(len(order) + 1, L, H, dtype=torch.bool)
    mlps = torch.ones(len(order) + 1, L, dtype=torch.bool) if mlp_nodes else None
    for n in range(len(order) + 1):
        for layer, h in order[:n]:
            if h is None:
                mlps[n, layer] = False
            else:
                heads[n, layer, h] = False
    values = runner.node_metric(heads, mlps).tolist()
    clean = float(runner.clean["metric"].mean())
    return [faithfulness_of(v, clean, values[0]) for v in values[:-1]] + [1.0]


def _single_crossings(curve: list[float]) -> list[float]:
    """Targets the curve crosses once (every size from the first one reaching it on stays at or above it): there
    the smallest size reaching the target is the one a search over sizes finds, whatever sizes it looks at first."""
    out = []
    for t in sorted({round(f - 1e-5, 9) for f in curve if 0.01 < f <= 1}):  # below f by more than float noise
        if sum(abs(f - t) < 1e-4 for f in curve) > 1:  # a plateau: which size reaches it first is float noise
            continue
        first = next(n for n, f in enumerate(curve) if f >= t)
        if all(f >= t for f in curve[first:]):
            out.append(t)
    return out


def _check_against_brute_force(runner: TaskRunner, mlp_nodes: bool, targets: tuple[float, ...]) -> list[float]:
    """Every answer reaches its target with the size below it measured short of it; where the curve crosses the
    target once, it is brute force's smallest size reaching it. The single-crossing targets checked."""
    _, node_scores = runner.edge_gradients(2)
    curve = _node_curve(runner, node_scores, "abs", mlp_nodes)
    once = _single_crossings(curve)
    for target in (*once, *targets):
        heads, mlps, faith, _, points, *_ = node_circuit(runner, node_scores, target, "abs", mlp_nodes=mlp_nodes)
        n = len(heads) + len(mlps)
        assert faith == pytest.approx(curve[n], abs=1e-5) and faith >= target
        assert curve[n - 1] < target + 1e-5 and {p.size: p.faithfulness for p in points}[n - 1] < target
        if target in once:
            assert n == next(m for m, f in enumerate(curve) if f >= target), (target, curve)
    return once


@pytest.fixture
def coarse_from_one(monkeypatch):
    """The coarse search from the first size (its default waits past 16 nodes; these models have 8 to 24)."""
    import circuitkit.tasks.circuit as circuit

    monkeypatch.setattr(circuit, "COARSE_AFTER", 0)


@pytest.mark.parametrize("n_pairs", [6, 32])  # 6: the exact search alone; 32: coarse on 8 pairs, then exact
@pytest.mark.parametrize("coarse", [False, True])
def test_the_node_circuit_is_the_smallest_top_n_reaching_the_target(n_pairs, coarse, request):
    """The bundled model copies in context (a real behaviour, a curve that rises): every target it crosses once."""
    from circuitkit import zoo
    from tests.test_tasks import copy_next_task

    if coarse:
        request.getfixturevalue("coarse_from_one")

    adapter = adapt(zoo.load())
    task = copy_next_task(n=n_pairs, d_vocab=60, seed=3)
    runner = TaskRunner(adapter, task.tokenize(adapter), "logit_diff", mlps=False, ablation="corrupted")
    once = _check_against_brute_force(runner, False, (0.5, 0.8, 0.95, 1.0))
    assert len(once) >= 3


@pytest.mark.parametrize("n_pairs", [6, 32])
@pytest.mark.parametrize("ablation, mlp_nodes", [("corrupted", False), ("mean", True)])
def test_the_node_circuit_on_a_jagged_curve_is_a_measured_crossing(model, n_pairs, ablation, mlp_nodes,
                                                                  coarse_from_one):
    """A random model's curve dips below a target after first reaching it: the answer is a size reaching it with
    the one below it measured short of it (and brute force's wherever the target is crossed once)."""
    _check_against_brute_force(_runner(model, n_pairs, ablation), mlp_nodes, (0.3, 0.6, 0.8, 0.95))


@pytest.mark.parametrize("offset", [0, -7, 5])  # the subset's answer: the pairs' own, below it, above it
def test_the_search_finds_every_answer_exactly_and_the_coarse_search_saves_passes(offset):
    """A rising curve over 336 nodes (Qwen2.5-0.5B's heads) with its answer at every size: the search returns it
    whatever the subset says (``offset``: where the subset's curve crosses instead); up to 16 nodes it is the exact
    search's (the same passes), past them a good subset saves passes."""
    from circuitkit.circuits.faithfulness import coarse_search, smallest
    from circuitkit.tasks.circuit import COARSE_AFTER

    N = 336
    for answer in range(1, N + 1):
        spent = {}
        for use_coarse in (True, False):
            calls = {"exact": 0, "coarse": 0}

            def evaluate(n: int, calls: dict = calls, answer: int = answer) -> float:
                calls["exact"] += 1
                return 0.9 if n >= answer else 0.5

            def coarse(sizes: list[int], calls: dict = calls, answer: int = answer) -> list[float]:
                assert 1 <= len(sizes) <= 4 and min(sizes) > COARSE_AFTER
                calls["coarse"] += 1
                return [0.9 if n >= answer + offset else 0.5 for n in sizes]

            measured = {0: 0.0, N: 1.0}
            sizes = [1, 2, 4, 8, 16, 32, 64, 128, 256]
            predict = (lambda low, high, coarse=coarse: coarse_search(coarse, low, high, 0.8)) if use_coarse else None
            found = smallest(evaluate, sizes, N, 0.8, measured, predict=predict, predict_after=COARSE_AFTER)
            assert found == answer and measured[answer] >= 0.8 and measured.get(answer - 1, 0.0) < 0.8
            spent[use_coarse] = calls["exact"] + calls["coarse"]
            if use_coarse and answer > COARSE_AFTER + 1 and offset == 0:
                assert calls["exact"] <= len(sizes[:5]) + 2  # 1 .. 16, then the answer and the size below it
        if answer <= COARSE_AFTER:
            assert spent[True] == spent[False]
        elif offset == 0 and answer > 2 * COARSE_AFTER:
            assert spent[True] < spent[False], (answer, spent)


def test_the_coarse_search_runs_on_a_quarter_of_the_pairs_and_counts_them_so(coarse_from_one):
    """On 32 pairs the node search stacks sizes on the first 8 (each copy a quarter of a pass, so the count is not
    whole); below 32 pairs it is the exact search alone (whole passes). The same circuit either way."""
    from circuitkit import zoo
    from tests.test_tasks import copy_next_task

    adapter = adapt(zoo.load())
    found = {}
    for n_pairs in (32, 28):
        task = copy_next_task(n=n_pairs, d_vocab=60, seed=3)
        runner = TaskRunner(adapter, task.tokenize(adapter), "logit_diff", mlps=False, ablation="corrupted")
        _, node_scores = runner.edge_gradients(2)
        before = runner.passes
        found[n_pairs] = node_circuit(runner, node_scores, 0.8, "abs")
        spent = runner.passes - before
        assert (spent != int(spent)) == (n_pairs == 32), spent


def test_first_pairs_is_the_runner_on_those_pairs(model):
    """The subset runner (no pass of its own) measures what a runner built on the first pairs measures."""
    runner = _runner(model, 16, "mean")
    sub = runner.first_pairs(4)
    assert sub.passes == 0
    own = TaskRunner(runner.adapter, runner.batch.subset(torch.arange(4)), "logit_diff", mlps=True, ablation="mean")
    heads = torch.rand(3, 3, 8, generator=torch.Generator().manual_seed(0)) < 0.5
    kept = torch.rand(2, *runner.graph.allowed.shape, generator=torch.Generator().manual_seed(1)) < 0.5
    assert torch.allclose(sub.edge_metric(kept & runner.graph.allowed), own.edge_metric(kept & own.graph.allowed),
                          atol=1e-5)
    # mean ablation: the subset keeps the mean over every pair (the search's values), so it is compared by hand
    z_values, _ = runner.node_values()
    assert torch.equal(sub.node_values()[0][0], z_values[0][:4, : sub.batch.clean.shape[1]])
    own._values = {name: sub.values_of(name) for name in ("head", "mlp")}
    assert torch.allclose(sub.node_metric(heads, None), own.node_metric(heads, None), atol=1e-5)
    assert sub.passes == 5 and runner.passes == 2  # its copies counted on it; the parent ran clean + corrupted only


@pytest.mark.parametrize("n_pairs", [6, 16])
def test_the_edge_circuit_is_the_smallest_top_k_reaching_the_target(n_pairs):
    """The bundled model's edges (fewer than 64 x 2: the resolution is one edge): where the curve crosses a target
    once, brute force's smallest top-k; elsewhere a measured crossing."""
    from circuitkit import zoo
    from tests.test_tasks import copy_next_task

    adapter = adapt(zoo.load())
    task = copy_next_task(n=n_pairs, d_vocab=60, seed=3)
    runner = TaskRunner(adapter, task.tokenize(adapter), "logit_diff", mlps=False, ablation="corrupted")
    scores, _ = runner.edge_gradients(2)
    allowed = runner.graph.allowed
    index = allowed.nonzero()
    E = index.shape[0]
    assert E < 128
    order = _order(scores[index[:, 0], index[:, 1]], "abs")
    masks = torch.zeros(E + 1, *allowed.shape, dtype=torch.bool)
    for k in range(E + 1):
        top = index[order[:k]]
        masks[k, top[:, 0], top[:, 1]] = True
    values = runner.edge_metric(masks).tolist()
    clean, corrupted = float(runner.clean["metric"].mean()), float(runner.corrupted["metric"].mean())
    curve = [faithfulness_of(v, clean, corrupted) for v in values]
    once = _single_crossings(curve)
    assert len(once) >= 3
    for target in (*once, 0.5, 0.8, 0.95):
        edges, faith, points, *_ = edge_circuit(runner, scores, target, "abs")
        k = len(edges)
        assert faith >= target and faith == pytest.approx(curve[k], abs=1e-5)
        assert curve[k - 1] < target + 1e-5
        if target in once:
            assert k == next(n for n, f in enumerate(curve) if f >= target), (target, curve)
