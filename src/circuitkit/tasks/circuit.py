"""Task circuits at two granularities, measured exactly: nodes (heads, and MLPs on request) and edges.

With ``m`` the mean task metric over pairs, ``m_clean`` the clean run, ``m_corr`` the fully corrupted one::

    faithfulness(C) = (m_C - m_corr) / (m_clean - m_corr)        1.0: C alone recovers the clean behaviour

**Node circuit**: every head (and MLP, when MLPs are nodes: ``mlp_nodes``) outside ``C`` takes its value from the
corrupted prompt of the same pair (:meth:`~circuitkit.graph.runner.TaskRunner.node_metric`); by default MLPs stay
clean (recomputed from their inputs), as in the induction scan. Nodes of further types (MLP neuron groups, a user's
:class:`~circuitkit.graph.nodes.NodeType`) join the same ranking and are patched the same way. ``m_corr`` patches
every node (where that is the corrupted run, its metric:
:meth:`~circuitkit.graph.runner.TaskRunner.every_node_patched_is_corrupted`).
Nodes join in the order of their share of the metric's change along the joint path from every node patched to none
(``node_ranking="joint"``, the default: :meth:`~circuitkit.graph.runner.TaskRunner.joint_shares`) or of their EAP-IG
node score (``"eap-ig"``: the sum of their outgoing edges' scores). The smallest top-``n``
set reaching ``target`` is found as the induction scan finds its circuit: the faithfulness at ``n = 1, 2, 4, ...``
up to the first size reaching the target, then bisection. Past :data:`COARSE_AFTER` nodes, where the search runs on
at least ``4 * COARSE_MIN_PAIRS`` pairs, a coarse search takes over (``COARSE_SETS`` sizes stacked in one pass on a
quarter of the pairs, evenly inside the bracket, until it is one node wide), then the exact search on every pair
from the coarse answer (the answer and the size below it where the coarse answer is right) and bisection. Every
reported point is measured on the pairs, none interpolated; where the curve crosses the target once the answer is
the smallest size reaching it, where it dips back below, a size reaching it whose predecessor was measured short of
it. **Necessity**: ``m_clean - m_{C patched}``, the metric lost when only ``C`` is patched.

**Edge circuit**: the top ``k`` edges by EAP-IG score kept, every other edge patched
(:meth:`~circuitkit.graph.runner.TaskRunner.edge_metric`; ``m_corr`` is the corrupted run: no edge kept). The
faithfulness curve is measured at MIB's sizes (:data:`EDGE_FRACTIONS` of all edges, in stacked copies), then the
smallest ``k`` reaching ``target`` is bisected between the last size below it and the first at or above it, to
within :data:`EDGE_RESOLUTION` of ``k``.

Ranking: by **absolute** score (default, as EAP-IG's ``apply_topn``) or by **signed** score (``rank="signed"``:
an edge estimated to work against the behaviour comes last). MIB reports both. On a real model absolute ranking is
the safer default: where the estimate has the wrong sign for a node that matters (measured: Qwen2.5-Coder-0.5B's
MLP 0 on IOI, estimated -1.46 logits, exactly +0.20), signed ranking puts it last and no circuit short of the
whole model reaches the target.

**CPR and CMD, as MIB computes them** (Mueller et al. 2025; ``evaluate_area_under_curve`` in
``MIB_circuit_track/evaluation.py`` of hannamw/MIB-circuit-track, and ``print_results.py``). With ``E`` the edges
of the graph, ``x_i`` :data:`EDGE_FRACTIONS` (``x_1 = 0.001 .. x_10 = 1``) and ``f_i`` the faithfulness of the top
``int(x_i E)`` edges (the size truncated; ``0`` edges: the corrupted run, ``f = 0``), by the trapezoid rule over
the nominal fractions themselves, no point added at ``0``::

    area_under(f)  = sum_{i<10} (x_{i+1} - x_i) (f_i + f_{i+1}) / 2
    area_from_1(f) = sum_{i<10} (x_{i+1} - x_i) (|1 - f_i| + |1 - f_{i+1}|) / 2
    CPR = area_under(f with edges ranked by signed score)      higher is better (above 1 where the top edges
                                                                overshoot the clean behaviour)
    CMD = area_from_1(f with edges ranked by absolute score)   lower is better

(MIB's leaderboard takes CPR from the signed ranking and CMD from the absolute one where both exist.) Both rankings'
curves are measured, whichever ``rank`` sizes the circuit: :func:`mib_areas`. MIB prunes each circuit of edges
with no path from the input or to the logits before measuring it; that changes its edge count, not its metric
(such an edge carries the corrupted value either way), so it is not repeated here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import Tensor

from circuitkit.circuits.curve import CurvePoint, NoBehaviour, check_gap, faithfulness_of, has_gap
from circuitkit.circuits.faithfulness import coarse_search, geometric_sizes, smallest
from circuitkit.circuits.record import CircuitRecord
from circuitkit.edge_effect import EdgeEffect
from circuitkit.errors import CircuitkitError
from circuitkit.graph.runner import TaskRunner
from circuitkit.ranking import head_name

EDGE_FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
"""Circuit sizes as fractions of all edges (MIB's ``percentages``, ``MIB_circuit_track/evaluation.py`` line 31)."""
RANKS = ("signed", "abs")
NODE_RANKINGS = ("joint", "eap-ig")
"""What orders the nodes of a node circuit: their shares along the joint path from every node patched to none
(``"joint"``, the default: :meth:`~circuitkit.graph.runner.TaskRunner.joint_shares`, the induction scan's ranking,
6 passes) or their EAP-IG node scores (``"eap-ig"``: the input path from the corrupted prompts to the clean ones;
the ranking of scans written before the joint one, whose files name none)."""
EDGE_RESOLUTION = 1 / 64
"""The edge circuit's size is bisected to within this share of itself (a circuit of 8,000 edges to within 125):
each halving is a patched pass, and the last few would move the size by less than the curve's own noise."""
EDGE_BISECTION = math.ceil(math.log2(2.5 / EDGE_RESOLUTION)) - 1
"""The bisection's planned passes: from the two MIB sizes around the target (2 to 2.5 apart) to
:data:`EDGE_RESOLUTION` of the size."""
MIN_TASK_GAP = 1e-3
"""Smallest ``|m_clean - m_corr|`` faithfulness divides by (in the metric's units): below it the corrupted prompts
do not change what the model does, and there is no behaviour to explain."""
N_EXACT_EDGES = 8
"""The circuit's strongest edges whose exact effect (the metric lost when only that edge is patched) is measured."""


@dataclass(frozen=True, eq=False, kw_only=True, repr=False)
class TaskCircuit(CircuitRecord):
    """A task's circuit: a :class:`~circuitkit.circuits.record.CircuitRecord` (the node circuit's ``heads``,
    ``faithfulness``, ``necessity`` in the metric's units, ``target``, ``curve``, ``intervals``, ``ranked_by``,
    ``search``, ``random_baseline``, ``stability``) with a task's own figures: the node circuit's ``mlps`` and further
    ``nodes``, and the edge circuit (``edges``, ``edge_faithfulness``, ``edge_curve`` over :data:`EDGE_FRACTIONS`,
    MIB's ``cpr`` and ``cmd`` (module docstring) with their curves ``edge_areas``, ``edge_effects``);
    ``clean`` / ``corrupted``: the mean metric; ``rank``: signed or abs; ``n_edges_total``: edges in the graph;
    ``intervals``: ``faithfulness`` and ``necessity``, and where the edge circuit was measured
    ``edge_faithfulness``, ``cpr`` and ``cmd`` (:func:`edge_intervals`), as ``(lo, hi)``: the percentile bootstrap
    over the pairs (:func:`circuitkit.bootstrap_ci`) from each pair's metric in the passes that measured them (no
    extra pass)."""

    heads: tuple[tuple[int, int], ...]
    mlps: tuple[int, ...]
    necessity: float
    n_nodes_total: int
    edges: tuple[str, ...]
    edge_faithfulness: float | None
    edge_curve: tuple[CurvePoint, ...]
    n_edges_total: int
    cpr: float | None
    cmd: float | None
    edge_effects: tuple[EdgeEffect, ...]
    rank: str
    clean: float
    corrupted: float
    node_corrupted: float
    other_set: dict[str, Any] | None = None
    """The circuit measured on the pairs the search did not use (``set``: ``"evaluation"`` or ``"discovery"``,
    ``pairs``, ``faithfulness``, ``necessity``, ``edge_faithfulness``, ``curve``); None where the pairs were not
    split."""
    nodes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """The members of further node types (``{type: labels}``, e.g. ``{"neurons": ("m3.n1", ...)}``); empty where
    the circuit's nodes are heads and MLPs only."""
    edge_areas: dict[str, Any] | None = None
    """MIB's curves and areas (:func:`mib_areas`: ``cpr``, ``cmd``, ``fractions``, ``sizes`` and per ranking its
    ``faithfulness``, ``area_under``, ``area_from_1``); None without an edge circuit."""
    ablation: str = "corrupted"
    """What a node outside the node circuit becomes (the task's ablation, :data:`~circuitkit.graph.task.ABLATIONS`);
    an edge outside the edge circuit is always patched from the corrupted prompt."""
    edge_search: Any = None
    """The edge search beyond ranking that chose ``edges`` (:class:`~circuitkit.circuits.search.SearchResult`,
    written as ``circuit.edge_search``; the node search's is ``search``); None for the ranked edge circuit."""

    @property
    def members(self) -> tuple[str, ...]:
        """Every member by name: heads ``"layer.head"``, MLPs ``"m{layer}"``, then each further node type's
        labels."""
        return (*super().members, *(f"m{layer}" for layer in self.mlps),
                *(label for labels in self.nodes.values() for label in labels))

    def _repr_extra(self) -> str:
        edges = "" if self.edge_faithfulness is None else (
            f", {len(self.edges)} of {self.n_edges_total} edges at faithfulness {self.edge_faithfulness:.3f}")
        return f", {self.ablation} ablation{edges}"

    def to_json(self) -> dict[str, Any]:
        return {
            "heads": [head_name(h) for h in self.heads],
            "mlps": list(self.mlps),
            "faithfulness": self.faithfulness,
            "necessity": self.necessity,
            "target": self.target,
            "ablation": self.ablation,
            "curve": [p.to_json() for p in self.curve],
            "nodes_total": self.n_nodes_total,
            "edges": list(self.edges),
            "edge_faithfulness": self.edge_faithfulness,
            "edge_curve": [dict(p.to_json(), fraction=p.size / self.n_edges_total) for p in self.edge_curve],
            "edges_total": self.n_edges_total,
            "cpr": self.cpr,
            "cmd": self.cmd,
            "cpr_cmd": None if self.edge_areas is None else {
                "definition": "MIB's: CPR = area_under of the faithfulness at int(x * edges_total) edges ranked by "
                              "signed score, over the fractions x; CMD = area_from_1 (of |1 - f|) with edges ranked "
                              "by absolute score; trapezoid rule over x, no point at 0",
                **self.edge_areas},
            "edge_effects": [e.to_json() for e in self.edge_effects],
            "rank": self.rank,
            "metric_all_nodes_patched": self.node_corrupted,
            **({"ci": {key: [lo, hi] for key, (lo, hi) in self.intervals.items()}} if self.intervals else {}),
            "other_set": self.other_set,
            **({"nodes": {name: list(labels) for name, labels in self.nodes.items()}} if self.nodes else {}),
            **({"search": self.search.to_json()} if self.search is not None else {}),
            **({"edge_search": self.edge_search.to_json()} if self.edge_search is not None else {}),
            **({"ranked_by": self.ranked_by} if self.ranked_by is not None else {}),
        }


def check_task_gap(clean: float, corrupted: float, metric: str) -> None:
    """A task's gap rule (:func:`~circuitkit.circuits.curve.check_gap`): the corrupted prompts must move the mean
    metric by at least :data:`MIN_TASK_GAP` (in its units), else :class:`~circuitkit.circuits.curve.NoBehaviour`."""
    check_gap(clean, corrupted, MIN_TASK_GAP, lambda gap: (
        f"task circuit: the mean {metric} is {clean:.6g} on the clean prompts and {corrupted:.6g} on the "
        f"corrupted ones (a difference of {gap:+.3g}); expected a difference of at least {MIN_TASK_GAP:g}. "
        "The corrupted prompts do not change what the model does here, so there is no behaviour for a circuit "
        "to explain: check the pairs and the answers, or use a model that does the task."))


def _order(scores: Tensor, rank: str) -> Tensor:
    """Indices by score, largest first (``abs``: by magnitude); ties broken by index (stable)."""
    key = scores.abs() if rank == "abs" else scores
    return torch.sort(-key, stable=True).indices


COARSE_AFTER = 16
"""The node search measures ``n = 1, 2, 4, ..., COARSE_AFTER`` exactly first (a small circuit is found there, as
cheaply as any search can: on Qwen2.5-Coder-0.5B's IOI, 3 heads in 6 passes); only a circuit larger than that is
searched for coarsely, where the exact sizes and bisection would cost about ``2 log2(n)`` passes. Measured
(benchmarks/README.md, "The task search's passes"): a coarse search from ``n = 1`` on IOI's 16 pairs (sets of 4)
put the circuit at 1 head where the pairs need 3, and cost 7 passes for the exact search's 6; its edge search, between
MIB's sizes on a curve that dips, 26 for 23."""


COARSE_MIN_PAIRS = 8
"""The coarse search runs where each of its sets gets at least this many pairs (32 pairs searched on). A pair's
metric is one logit difference where an induction sequence's loss averages about 20 tokens, and on
Qwen2.5-Coder-0.5B's IOI smaller sets sent the search astray twice (benchmarks/README.md, "The task search's
passes"): with 8 pairs searched on, sets of 2 put the node circuit at 1 head where the 8 pairs need 4; with 16 (the
default scan's discovery set), sets of 4 put it at 45 heads, and galloping up from there to the 16 pairs' crossing
at 61 cost 10 exact sizes, where the geometric sizes and bisection find a crossing at 55 heads in 7 (node stage
15.84 -> 9.96 passes, the whole scan 68.68 -> 60.08)."""


def _coarse_runner(runner: TaskRunner, clean_all: Tensor, patched_all: Tensor) -> tuple[Any, int, float, float]:
    """The coarse search's subset: the first ``n_pairs // COARSE_SETS`` pairs (so that ``COARSE_SETS`` sizes stacked
    on it cost one pass of the pairs), with their clean and fully patched means from each pair's values already
    measured; ``(None, 0, 0, 0)`` where the subset would have fewer than :data:`COARSE_MIN_PAIRS` pairs or its own
    difference is below :data:`MIN_TASK_GAP` (the search is then the exact one alone)."""
    from circuitkit.circuits.faithfulness import COARSE_SETS

    k = runner.batch.n_pairs // COARSE_SETS
    if k < COARSE_MIN_PAIRS:
        return None, 0, 0.0, 0.0
    clean, patched = float(clean_all[:k].mean()), float(patched_all[:k].mean())
    if not has_gap(clean, patched, MIN_TASK_GAP):
        return None, 0, 0.0, 0.0
    return runner.first_pairs(k), k, clean, patched


def _counted(runner: TaskRunner, sub: TaskRunner, k: int, run: Any) -> Any:
    """``run()`` on the subset runner ``sub`` of ``k`` pairs, its stacked copies counted on ``runner`` as the share
    of a pass of ``runner``'s pairs they are (four sizes on a quarter of the pairs: one pass)."""
    before = sub.passes
    out = run()
    runner.passes += (sub.passes - before) * k / runner.batch.n_pairs
    return out


def node_order(graph: Any, L: int, H: int, node_scores: Tensor, rank: str, mlp_nodes: bool) -> list:
    """The nodes ``(layer, head)`` (and ``(layer, None)`` for MLPs with ``mlp_nodes``) in the order they join a
    node circuit: by score, largest first (``rank``)."""
    typed = typed_order(sender_scores(graph, node_scores, mlp_nodes), rank)
    return [(layer, i if name == "head" else None) for name, layer, i in typed]


def sender_scores(graph: Any, node_scores: Tensor, mlp_nodes: bool) -> dict[str, Tensor]:
    """The heads' node scores ``[layer, head]`` (and with ``mlp_nodes`` the MLPs', ``[layer, 1]``) by node type,
    from ``node_scores`` ``[sender]``."""
    L = graph.n_layers
    out = {"head": torch.stack([node_scores[graph.sender_slices[("head", layer)]] for layer in range(L)])}
    if mlp_nodes:
        out["mlp"] = torch.stack([node_scores[graph.sender_slices[("mlp", layer)]] for layer in range(L)])
    return out


def typed_order(scores: dict[str, Tensor], rank: str) -> list[tuple[str, int, int]]:
    """The nodes ``(type, layer, index)`` of every type in ``scores`` (``{type: [layer, nodes]}``) in the order they
    join a node circuit: by score, largest first (``rank``); ties in the order of ``scores``, layer, index."""
    nodes = [(name, layer, i) for name, grid in scores.items() for layer in range(grid.shape[0])
             for i in range(grid.shape[1])]
    flat = torch.cat([grid.detach().float().cpu().flatten() for grid in scores.values()])
    return [nodes[i] for i in _order(flat, rank).tolist()]


def node_masks(kept: list[tuple[str, int, int]], shapes: dict[str, tuple[int, int]]) -> dict[str, Tensor]:
    """``{type: [layer, nodes]}`` bool, True where a node is **patched**: every node of ``shapes`` (``{type:
    (layers, nodes)}``) outside ``kept``."""
    masks = {name: torch.ones(shape, dtype=torch.bool, device="cpu") for name, shape in shapes.items()}
    for name, layer, i in kept:
        masks[name][layer, i] = False
    return masks


class NodeCircuit(NamedTuple):
    """A node circuit: its ``heads`` and ``mlps``, ``faithfulness``, ``necessity``, ``curve``, the mean metric with
    every node patched, the number of candidate nodes, each pair's metric (``pairs``: ``"circuit"``,
    ``"all_patched"``, ``"only_circuit"``) and the members of further node types (``nodes``: ``{type: labels}``)."""

    heads: tuple
    mlps: tuple
    faithfulness: float
    necessity: float
    curve: tuple
    all_patched: float
    n_nodes: int
    pairs: dict[str, Tensor]
    nodes: dict[str, tuple[str, ...]]


def node_circuit(runner: TaskRunner, node_scores: Tensor, target: float, rank: str, *, mlp_nodes: bool = False,
                 progress: Any = None, types: dict[str, Tensor] | None = None) -> NodeCircuit:
    """The smallest top-``n`` node set reaching ``target`` (module docstring). ``node_scores``: ``[sender]`` from
    :meth:`~circuitkit.graph.runner.TaskRunner.edge_gradients`; ``mlp_nodes``: MLPs are nodes that can be patched
    (default: heads only, every MLP recomputed from its input); ``types``: further node types' scores joining the
    ranking, ``{type: [layer, nodes]}`` (:meth:`~circuitkit.graph.runner.TaskRunner.attribute`). Returns a
    :class:`NodeCircuit`, ``pairs``: each pair's metric ``[pair]`` with the circuit kept (``"circuit"``), every node
    patched (``"all_patched"``) and only the circuit patched (``"only_circuit"``)."""
    graph = runner.graph
    mlp_nodes = mlp_nodes and graph.mlps
    scores = sender_scores(graph, node_scores, mlp_nodes) | dict(types or {})
    order = typed_order(scores, rank)
    shapes = {name: tuple(grid.shape) for name, grid in scores.items()}
    clean = float(runner.clean["metric"].mean())

    def masks(kept: list) -> dict[str, Tensor]:
        return node_masks(kept, shapes)

    per_pair: dict[int, Tensor] = {}  # circuit size -> each pair's metric (kept for the intervals)

    def metric_of(kept: list) -> float:
        patched = masks(kept)
        before = runner.passes
        values = runner.patched_metric({k: v[None] for k, v in patched.items()}, per_pair=True)[0]
        per_pair[len(kept)] = values
        if progress is not None:
            progress(runner.passes - before)
        return float(values.mean())

    # every node patched: the corrupted run where it is that (not run again), unless the passes of the first sizes
    # resuming from it save more than it costs; where it runs, the later passes resume from it
    first_sizes = [n for n in geometric_sizes(min(len(order), COARSE_AFTER)) if n < len(order)]
    probe = {name: torch.stack([masks(order[:n])[name] for n in first_sizes]) for name in shapes} if first_sizes \
        else None
    before = runner.passes
    per_pair[0] = runner.all_patched_metric(tuple(shapes), probe)
    all_patched = float(per_pair[0].mean())
    if progress is not None and runner.passes > before:
        progress(runner.passes - before)
    check_task_gap(clean, all_patched, runner.metric_name)
    metrics: dict[int, float] = {0: all_patched, len(order): clean}

    def evaluate(n: int) -> float:
        metrics[n] = metric_of(order[:n])
        return faithfulness_of(metrics[n], clean, all_patched)

    N = len(order)
    measured = {0: 0.0, N: 1.0}
    sizes = [n for n in geometric_sizes(N) if n < N]
    sub, k, sub_clean, sub_patched = _coarse_runner(runner, runner.clean["metric"], per_pair[0])
    coarse = None
    if sub is not None:
        def coarse(sizes: list[int]) -> list[float]:
            before = runner.passes
            stacked = [masks(order[:n]) for n in sizes]
            patched = {name: torch.stack([m[name] for m in stacked]) for name in shapes}
            values = _counted(runner, sub, k, lambda: sub.patched_metric(patched))
            if progress is not None:
                progress(runner.passes - before)
            return [faithfulness_of(float(v), sub_clean, sub_patched) for v in values]

    n = smallest(evaluate, sizes, N, target, measured, predict_after=COARSE_AFTER,
                 predict=None if coarse is None else (lambda low, high: coarse_search(coarse, low, high, target)))
    kept = order[:n]
    before = runner.passes
    only_pairs = runner.patched_metric({k: (~v)[None] for k, v in masks(kept).items()}, per_pair=True)[0]
    only = float(only_pairs.mean())
    if progress is not None:
        progress(runner.passes - before)
    pairs = {"circuit": per_pair.get(n, runner.clean["metric"]), "all_patched": per_pair[0],
             "only_circuit": only_pairs}
    curve = tuple(CurvePoint(k, measured[k], metrics[k]) for k in sorted(measured))
    circuit_heads = tuple(sorted((layer, h) for name, layer, h in kept if name == "head"))
    circuit_mlps = tuple(sorted(layer for name, layer, _ in kept if name == "mlp"))
    nodes = {name: tuple(runner.node_types[name].label(layer, i) for _, layer, i in sorted(
        (m for m in kept if m[0] == name), key=lambda m: m[1:])) for name in scores if name not in ("head", "mlp")}
    return NodeCircuit(circuit_heads, circuit_mlps, measured[n], clean - only, curve, all_patched, N, pairs, nodes)


OTHER_RANK = {"abs": "signed", "signed": "abs"}


def edge_sets(graph: Any, scores: Tensor, rank: str) -> tuple[Tensor, Tensor, Tensor, Tensor, list[int], list[int]]:
    """What :func:`edge_circuit` measures, decided by the scores alone: ``(index [E, 2], flat [E], order,
    other_order, todo, differ)``: the graph's edges as (sender, receiver) indices and their scores, their order
    under ``rank`` and under the other ranking, MIB's sizes strictly between none and every edge (``todo``, measured
    under ``rank``) and those of them where the other ranking's top set is other edges (``differ``, measured again
    under it; where both keep the same top ``k``, scores of one sign, that set is measured once)."""
    index = graph.allowed.nonzero()  # [E, 2]
    E = index.shape[0]
    flat = scores[index[:, 0], index[:, 1]]
    order, other_order = _order(flat, rank), _order(flat, OTHER_RANK[rank])
    todo = sorted({k for k in mib_sizes(E) if 0 < k < E})
    differ = [k for k in todo if not torch.equal(torch.sort(order[:k]).values, torch.sort(other_order[:k]).values)]
    return index, flat, order, other_order, todo, differ


def edge_plan(runner: TaskRunner, scores: Tensor, rank: str) -> tuple[float, str]:
    """The edge stage's passes as the scores decide them, and the words for them: MIB's sizes under ``rank`` and
    where the other ranking's sets differ (:func:`edge_sets`), the bisection (planned at
    :data:`EDGE_BISECTION` passes: its steps depend on the curve) and the exact effects of the
    :data:`N_EXACT_EDGES` strongest edges, each resumed as :meth:`~TaskRunner.single_edge_metric` will resume it
    (:meth:`~TaskRunner.single_edge_share`; the circuit is assumed to hold them all). Every pass counts the
    graph's key/value copies (at most)."""
    index, _, order, _, todo, differ = edge_sets(runner.graph, scores, rank)
    effects = runner.single_edge_share(index[order[:N_EXACT_EDGES]])
    copies = runner.graph.kv_copies
    other = OTHER_RANK[rank]
    again = (f"the {other} ranking keeps the same sets" if not differ else
             f"{len(differ)} of them again under the {other} ranking")
    words = (f"MIB's {len(todo)} sizes, {again}, about {EDGE_BISECTION} bisection steps, the "
             f"{min(N_EXACT_EDGES, len(order))} strongest edges' effects at {effects:.2f}")
    return copies * (len(todo) + len(differ) + EDGE_BISECTION + effects), words


def edge_circuit(runner: TaskRunner, scores: Tensor, target: float, rank: str, progress: Any = None,
                 pairs: dict[str, Tensor] | None = None,
                 ) -> tuple[tuple[str, ...], float | None, tuple, float | None, float | None, tuple, int, dict]:
    """The edge curve at MIB's sizes (:func:`mib_sizes`) under both rankings, the smallest top-``k`` edge set
    reaching ``target`` (ranked by ``rank``), MIB's CPR/CMD and the exact effects of the circuit's strongest edges.
    Returns ``(edges, faithfulness, curve, cpr, cmd, effects, n_edges, areas)``, ``curve``: every point measured
    under ``rank``; ``areas``: :func:`mib_areas`. With ``pairs`` (a dict), it is filled with each pair's metric
    behind those figures, from the same passes: ``"circuit"`` ``[pair]`` (the circuit's set), ``"signed"`` and
    ``"abs"`` ``[size, pair]`` (MIB's sizes under each ranking; the corrupted run at 0 edges, the clean one at all),
    for :func:`edge_intervals` (each exact effect keeps its own, :attr:`EdgeEffect.each`)."""
    graph = runner.graph
    allowed = graph.allowed
    index, flat, order, other_order, todo, differ = edge_sets(graph, scores, rank)
    E = index.shape[0]
    clean = float(runner.clean["metric"].mean())
    corrupted = float(runner.corrupted["metric"].mean())
    check_task_gap(clean, corrupted, runner.metric_name)

    def kept_mask(k: int, order: Tensor = order) -> Tensor:
        mask = torch.zeros_like(allowed)
        top = index[order[:k]]
        mask[top[:, 0], top[:, 1]] = True
        return mask

    metrics: dict[int, float] = {0: corrupted, E: clean}
    rows: dict[tuple[str, int], Tensor] = {}  # (ranking, k) -> [pair]: each measured set's metric per pair

    def run(masks: list[Tensor], ranking: str, ks: list[int]) -> list[float]:
        if not masks:
            return []
        before = runner.passes
        per_pair: list[Tensor] = []
        values = runner.edge_metric(torch.stack(masks), per_pair).tolist()
        rows.update(zip([(ranking, k) for k in ks], torch.cat(per_pair), strict=True))
        if progress is not None:
            progress(runner.passes - before)
        return values

    sizes = mib_sizes(E)
    other = OTHER_RANK[rank]  # MIB's areas need both rankings' curves
    for k, value in zip(todo, run([kept_mask(k) for k in todo], rank, todo), strict=True):  # the curve at once
        metrics[k] = value
    other_metrics = {0: corrupted, E: clean}
    other_metrics.update({k: metrics[k] for k in todo if k not in differ})  # the same top k: measured already
    other_metrics.update(zip(differ, run([kept_mask(k, order=other_order) for k in differ], other, differ),
                             strict=True))
    curve_sizes = sorted(set(todo) | {E})
    measured = {k: faithfulness_of(metrics[k], clean, corrupted) for k in metrics}
    areas = mib_areas({rank: [measured[k] for k in sizes],
                       other: [faithfulness_of(other_metrics[k], clean, corrupted) for k in sizes]}, sizes)

    def evaluate(k: int) -> float:
        metrics[k] = run([kept_mask(k)], rank, [k])[0]
        return faithfulness_of(metrics[k], clean, corrupted)

    # bisection between MIB's two sizes around the target (2 to 2.5 apart): about six passes; a coarse search there
    # measured more (COARSE_AFTER)
    k = smallest(evaluate, curve_sizes, E, target, measured, resolution=EDGE_RESOLUTION)
    names = graph.edge_names(index[order[:k]])
    strongest = order[:min(k, N_EXACT_EDGES)].tolist()
    effects: list[EdgeEffect] = []
    if strongest:  # that edge alone patched, every other kept: resumed at the receiver's layer where it can
        before = runner.passes
        effects = exact_effects(runner, index[strongest], flat[strongest])
        if progress is not None:
            progress(runner.passes - before)
    curve = tuple(CurvePoint(s, measured[s], metrics[s]) for s in sorted(measured))
    if pairs is not None:
        ends = {0: runner.corrupted["metric"], E: runner.clean["metric"]}

        def row(ranking: str, size: int) -> Tensor:  # a size both rankings share was measured once, under ``rank``
            return ends[size] if size in ends else rows.get((ranking, size), rows.get((rank, size)))

        pairs.update(circuit=row(rank, k), **{r: torch.stack([row(r, size) for size in sizes]) for r in RANKS})
    return tuple(names), measured[k], curve, areas["cpr"], areas["cmd"], tuple(effects), E, areas


def edge_intervals(pairs: dict[str, Tensor], clean: Tensor, corrupted: Tensor, n_resamples: int, level: float,
                   *, circuit: bool = True) -> dict[str, tuple[float, float]]:
    """The percentile bootstrap intervals over the pairs of the edge circuit's faithfulness (with ``circuit``),
    MIB's CPR and CMD, from each pair's metric in the passes that measured them (``pairs`` as :func:`edge_circuit`
    fills it; ``clean`` / ``corrupted`` ``[pair]``): one draw of the pairs for the three, and on each resample every
    figure as the scan computes it, from that resample's mean metrics: ``f(k) = (m_k - m_corr) / (m_clean -
    m_corr)`` at each size, CPR the trapezoid area under the signed ranking's ``f`` over MIB's fractions, CMD that of
    ``|1 - f|`` under the absolute ranking. None where there are fewer than 2 pairs, and no faithfulness-based
    interval where some resample has ``m_clean = m_corr`` (the ratio is undefined there)."""
    from circuitkit.uncertainty import bootstrap_ci

    if clean.shape[0] < 2:
        return {}
    n = len(EDGE_FRACTIONS)
    columns = [pairs["circuit"][None], pairs["signed"], pairs["abs"], corrupted[None], clean[None]]
    stacked = torch.cat([c.double() for c in columns]).T  # [pair, 1 + 2n + 2]
    x = torch.tensor(EDGE_FRACTIONS, dtype=torch.float64, device="cpu")

    def area(y: Tensor) -> Tensor:  # [R, n] -> [R]: the trapezoid rule over the fractions (_trapezoid)
        return ((x[1:] - x[:-1]) * (y[:, 1:] + y[:, :-1]) / 2).sum(1)

    def statistic(means: Tensor) -> Tensor:
        corr, whole = means[:, -2:-1], means[:, -1:]
        f = (means[:, :-2] - corr) / (whole - corr)  # [R, 1 + 2n]
        return torch.stack([f[:, 0], area(f[:, 1 : 1 + n]), area((1 - f[:, 1 + n :]).abs())], dim=1)

    try:
        lo, hi = bootstrap_ci(stacked, n_resamples, level, statistic=statistic)
    except CircuitkitError:  # some resample has m_clean = m_corr: every figure here divides by it
        return {}
    areas = {"cpr": (float(lo[1]), float(hi[1])), "cmd": (float(lo[2]), float(hi[2]))}
    return ({"edge_faithfulness": (float(lo[0]), float(hi[0]))} if circuit else {}) | areas


def exact_effects(runner: TaskRunner, index: Tensor, scores: Tensor | None = None,
                  progress: Any = None) -> list[EdgeEffect]:
    """Each edge of ``index`` ``[n, 2]`` (sender, receiver) patched alone (:meth:`TaskRunner.single_edge_metric`) as
    an :class:`~circuitkit.edge_effect.EdgeEffect` (path patching's record too): named as the graph names it, its
    ``score`` from ``scores`` ``[n]`` (None where no attribution ran), ``clean`` and ``patched`` the clean run's mean
    metric and the patched one, its ``effect`` the first less the second, ``each`` that per pair;
    ``progress`` is told each pass's edges."""
    per_pair: list[Tensor] = []
    values = runner.single_edge_metric(index, pairs=per_pair, progress=progress).tolist()
    clean = runner.clean["metric"].float().cpu()
    mean = float(clean.mean())
    lost = clean[None] - per_pair[0]  # [edge, pair]
    given = [None] * len(values) if scores is None else [float(v) for v in scores.tolist()]
    return [EdgeEffect(name, score, mean - v, each=each, clean=mean, patched=v)
            for name, score, v, each in zip(runner.graph.edge_names(index), given, values, lost, strict=True)]


def effect_intervals(effects: tuple[EdgeEffect, ...], n_resamples: int, level: float) -> tuple[EdgeEffect, ...]:
    """``effects`` with their intervals: the percentile bootstrap over the pairs of each edge's effect, the mean of
    its :attr:`EdgeEffect.each` (each pair's metric lost, from the passes that measured the effects: no extra
    pass), one draw of the pairs for every edge (the seed of every interval of the scan). Unchanged where there are
    fewer than 2 pairs, and an effect without its pairs' values keeps its interval."""
    from dataclasses import replace

    from circuitkit.uncertainty import mean_intervals

    found = mean_intervals([e.each for e in effects], n_resamples, level)
    return tuple(e if interval is None else replace(e, interval=interval)
                 for e, interval in zip(effects, found, strict=True))


def mib_sizes(n_edges: int) -> list[int]:
    """The circuit sizes of MIB's curve: ``int(x * n_edges)`` for ``x`` in :data:`EDGE_FRACTIONS` (truncated, as
    ``curr_num_items = int(pct * n_scored_items)``, ``MIB_circuit_track/evaluation.py`` line 37)."""
    return [int(x * n_edges) for x in EDGE_FRACTIONS]


def _trapezoid(xs: Any, ys: Any) -> float:
    return float(sum((xs[i + 1] - xs[i]) * (ys[i + 1] + ys[i]) / 2 for i in range(len(xs) - 1)))


def area_under(faithfulness: Any) -> float:
    """MIB's ``area_under``: the trapezoid rule over the fractions :data:`EDGE_FRACTIONS` (x) of the faithfulness
    at each (one value per fraction, in order), no point added at 0 (``MIB_circuit_track/evaluation.py`` lines
    58-73). CPR where the edges were ranked by signed score."""
    return _trapezoid(EDGE_FRACTIONS, _per_fraction(faithfulness))


def area_from_1(faithfulness: Any) -> float:
    """MIB's ``area_from_1``: as :func:`area_under` of ``|1 - f|`` (the same lines). CMD where the edges were
    ranked by absolute score."""
    return _trapezoid(EDGE_FRACTIONS, [abs(1.0 - f) for f in _per_fraction(faithfulness)])


def _per_fraction(faithfulness: Any) -> list[float]:
    values = [float(f) for f in faithfulness]
    if len(values) != len(EDGE_FRACTIONS) or not all(math.isfinite(f) for f in values):
        raise CircuitkitError(f"MIB's areas: given {len(values)} faithfulness values ({values[:3]}...); expected "
                              f"{len(EDGE_FRACTIONS)} finite ones, one at each of {EDGE_FRACTIONS}")
    return values


def mib_areas(curves: dict[str, list[float]], sizes: list[int]) -> dict[str, Any]:
    """``curves``: the faithfulness at :func:`mib_sizes` under each ranking (``"signed"``, ``"abs"``). Returns
    ``cpr`` (``area_under`` of the signed curve), ``cmd`` (``area_from_1`` of the absolute one) and, per ranking,
    its curve and both areas (module docstring)."""
    return {"cpr": area_under(curves["signed"]), "cmd": area_from_1(curves["abs"]),
            "fractions": list(EDGE_FRACTIONS), "sizes": list(sizes),
            **{rank: {"faithfulness": list(curves[rank]), "area_under": area_under(curves[rank]),
                      "area_from_1": area_from_1(curves[rank])} for rank in RANKS}}


__all__ = ["CurvePoint", "EDGE_FRACTIONS", "EdgeEffect", "NODE_RANKINGS", "NoBehaviour", "NodeCircuit", "RANKS",
           "TaskCircuit", "area_from_1", "area_under", "edge_circuit", "edge_intervals", "effect_intervals",
           "exact_effects", "mib_areas", "mib_sizes", "node_circuit", "node_masks", "node_order", "sender_scores",
           "typed_order"]
