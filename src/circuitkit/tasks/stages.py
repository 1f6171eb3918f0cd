"""A task scan's stages, declared, run over its state, and its progress plan in passes of the pairs.

Each stage (:data:`TASK_STAGES`, :class:`circuitkit.stage.Stage` records as the induction scan's) has a short name
that fits a progress bar, what it does, the :class:`TaskScanState` fields it reads and writes, whether it runs, its
planned passes (``estimate(plan)`` from :class:`PlanInputs`: what is known before any pass: the node and edge counts,
the pairs the search runs on, the EAP-IG points, the options) and its run, a function of the state
(:func:`circuitkit.stage.run_planned` runs them in order). A pass is one run of a runner's pairs through the model (a
backward counts two); the coarse circuit search's stacked copies of a quarter of the pairs count as the share of a
pass they are. Where a stage's count differs from its plan, the plan is revised when it ends, saying so; a stage that
leaves nothing for later ones (no behaviour to explain) takes them off the plan with its reason
(:class:`circuitkit.progress.Progress`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from circuitkit.circuits.faithfulness import COARSE_SETS, geometric_sizes
from circuitkit.stage import Stage, plan_of
from circuitkit.tasks.circuit import (
    COARSE_AFTER,
    COARSE_MIN_PAIRS,
    EDGE_BISECTION,
    N_EXACT_EDGES,
    RANKS,
    mib_sizes,
)
from circuitkit.tasks.single_heads import DEFAULT_ABLATE_TOP

if TYPE_CHECKING:
    from torch import Tensor

    from circuitkit.circuits.baseline import RandomBaseline
    from circuitkit.circuits.search import SearchResult
    from circuitkit.circuits.stability import Stability
    from circuitkit.graph.nodes import NodeType
    from circuitkit.graph.runner import TaskRunner
    from circuitkit.tasks.circuit import NodeCircuit
    from circuitkit.tasks.single_heads import SingleHeads


@dataclass(frozen=True)
class PlanInputs:
    """What a task scan knows before its first pass: ``nodes`` (the node circuit's candidates), ``edges_total`` (the
    edge graph's edges), ``pairs`` (the pairs the search runs on), ``held`` (pairs on the other set, 0: not split),
    ``direct`` (the clean run has a backward: direct logit attribution), ``steps`` (EAP-IG points) and the
    options: ``edges``, ``quick``, ``random_sets``, ``stability``, ``search`` (with its planned passes
    ``search_passes``), ``edge_search`` (with its pass budget ``edge_search_passes``)."""

    nodes: int
    edges_total: int
    pairs: int
    held: int
    direct: bool
    steps: int
    edges: bool
    quick: bool
    random_sets: int
    stability: int
    search: str = "ranked"
    search_passes: float = 0.0
    """The node search's planned passes (:func:`circuitkit.circuits.search.search_estimate` of it and its options)."""
    kv_copies: int = 1
    """Copies of the pairs each edge-patching pass runs (per-query-head key/value edges on a grouped-query model: the
    query heads per key/value head; :attr:`~circuitkit.graph.runner.Graph.kv_copies`). EAP-IG runs one a point: it
    splits a group's gradient by query head instead."""
    edge_search: str = "ranked"
    edge_search_passes: float = 0.0
    """The edge search's pass budget (``edge_search`` other than ``"ranked"``)."""
    folded: bool = False
    """EAP-IG's first point is the corrupted run (:meth:`~circuitkit.graph.runner.TaskRunner.folds_corrupted`):
    the corrupted stage does not run apart, and neither do the stability reruns' corrupted runs."""
    node_ranking: str = "joint"
    """What orders the nodes (:data:`~circuitkit.tasks.circuit.NODE_RANKINGS`): ``"joint"`` (the default) runs the
    joint stage."""
    single_heads: int = 0
    """Heads patched one at a time against their EAP-IG scores (``ablate``; :mod:`circuitkit.tasks.single_heads`)."""


def coarse_applies(pairs: int) -> bool:
    """The coarse search runs where a quarter of the pairs holds at least :data:`COARSE_MIN_PAIRS` of them."""
    return pairs // COARSE_SETS >= COARSE_MIN_PAIRS


def node_estimate(nodes: int, pairs: int) -> float:
    """Planned passes of the node search: every node patched (the gap), the geometric sizes and a bisection (a
    circuit of at most :data:`COARSE_AFTER` nodes), or past them the coarse rounds (five-ary: about
    ``log5(nodes)``) and two exact sizes; one for necessity."""
    small = min(nodes, COARSE_AFTER)
    exact = len([n for n in geometric_sizes(small) if n < nodes]) + math.ceil(math.log2(max(2, small)))
    if coarse_applies(pairs) and nodes > COARSE_AFTER:
        exact = len(geometric_sizes(COARSE_AFTER)) + math.ceil(
            math.log(max(2, nodes - COARSE_AFTER)) / math.log(COARSE_SETS + 1)) + 2
    return 1 + exact + 1


EFFECT_SHARE = 0.5
"""The share of a pass one exact edge effect is planned at: it resumes at its receiver's layer ``l`` and runs
``(L - l) / L`` of the model (an edge into the logits none), half on average over the layers (on Qwen2.5-0.5B's
IOI, the eight strongest edges cost 2 passes: four into the logits, one into layer 0)."""


def edge_estimate(edges_total: int, pairs: int) -> float:
    """Planned passes of the edge circuit: MIB's sizes under both rankings (one stacked copy each; a size whose two
    top sets are the same edges is measured once, so this is at most), the bisection between the two sizes around
    the target (:data:`EDGE_BISECTION` passes), and the strongest edges' exact effects, each resumed at its
    receiver's layer (planned at :data:`EFFECT_SHARE` of a pass each). Once the scores are known, the edges stage
    revises it to what they decide (:func:`~circuitkit.tasks.circuit.edge_plan`)."""
    sizes = len([k for k in mib_sizes(edges_total) if 0 < k < edges_total])
    return len(RANKS) * sizes + EDGE_BISECTION + EFFECT_SHARE * min(N_EXACT_EDGES, edges_total)


SEARCHED_SET_PASSES = 3
"""A searched node circuit measured on the other pairs itself: kept, every node patched, only it patched."""


def held_estimate(plan: PlanInputs, curve_sizes: int | None = None, share: float = 1.0) -> float:
    """Planned passes on the other set of pairs: its clean and corrupted runs (forward only), the node curve's sizes
    (``curve_sizes``, known once the search ran; before it, the sizes :func:`node_estimate` plans for the search;
    quick: the circuit's size and every node patched) and the circuit alone patched, the edge circuit (one), and a
    searched circuit itself (:data:`SEARCHED_SET_PASSES`). ``share``: the passes a node set costs there (1 before
    the search; after it, what a set cost the search: the same sets, resumed at the same layers)."""
    if curve_sizes is None:
        curve_sizes = int(node_estimate(plan.nodes, plan.pairs)) - 2  # less its all-patched run and necessity
    sizes = 2 if plan.quick else curve_sizes
    searched = SEARCHED_SET_PASSES if plan.search != "ranked" else 0
    return 1 + 1 + share * (sizes + 1 + searched) + (plan.kv_copies if plan.edges else 0)


JOINT_PASSES = 6
"""The joint path's passes (:meth:`~circuitkit.graph.runner.TaskRunner.joint_shares`): two points stacked, one
forward and one backward."""


def stability_estimate(plan: PlanInputs) -> float:
    """Each resample: its clean and corrupted runs (forward only; the corrupted run EAP-IG's first point where
    ``folded``), the ranking (EAP-IG, or the joint path) and the node search."""
    if plan.node_ranking == "joint":
        ranking, references = JOINT_PASSES, 2
    else:
        ranking, references = 3 * plan.steps, 1 if plan.folded else 2
    return plan.stability * (references + ranking + node_estimate(plan.nodes, plan.pairs))


@dataclass(frozen=True)
class TaskOptions:
    """The scan's options, checked by :func:`circuitkit.tasks.scan.scan_task` before the model is read. The stages
    read ``target``, ``rank``, the EAP-IG ``steps`` and ``ig_points``, ``quick``, ``random_sets``, ``stability``,
    the intervals' ``n_resamples`` and ``ci_level``, ``mlp_nodes``, the node search (``node_search``,
    ``search_options``) and the edge search (``edge_search``, ``edge_options`` with its pass budget); the scan's
    setup and record the rest: the split (``holdout``, ``split_seed``, ``target_on``), ``edges`` (asked for; with
    ``quick``, off), ``kv_edges``, the further ``node_types`` (the neuron groups first, where ``neuron_groups``),
    the model's ``name``, the progress ``mode`` and what orders the nodes, ``node_ranking``."""

    target: float
    rank: str
    steps: int
    ig_points: str
    quick: bool
    random_sets: int
    stability: int
    n_resamples: int
    ci_level: float
    mlp_nodes: bool
    node_search: str = "ranked"
    search_options: dict[str, Any] | None = None
    edge_search: str = "ranked"
    edge_options: dict[str, Any] = field(default_factory=dict)
    holdout: float = 0.0
    split_seed: int = 0
    target_on: str = "discovery"
    edges: bool = True
    kv_edges: str = "grouped"
    node_types: tuple[NodeType, ...] = ()
    neuron_groups: int | None = None
    name: str | None = None
    mode: str = "off"
    node_ranking: str = "joint"
    ablate: str = "none"
    ablate_top: int = DEFAULT_ABLATE_TOP


NO_EDGES = ((), None, (), None, None, ())
""":func:`~circuitkit.tasks.circuit.edge_circuit`'s tuple without an edge circuit, less its last two entries (the
graph's edge count and the areas)."""


@dataclass(eq=False)
class TaskScanState:
    """What a task scan's stages read and write (:attr:`~circuitkit.stage.Stage.reads` / ``writes`` name these
    fields): the ``options``; the ``runner`` of the discovery pairs and ``held``, the evaluation pairs' (None where
    not split), of which ``search`` is the set the target applies to and ``other`` the rest; ``told``, the user's
    ``progress(stage, passes)``; ``reruns``, the stability stage's passes (run by runners of its own); and each
    stage's results, empty until the stage that writes them ran: the reference runs (``clean``, ``corrupted``),
    EAP-IG's edge ``scores``, ``node_scores`` and further node types' scores (``typed``), the joint path's shares
    where they order the nodes (``ranking``, ``ranking_typed``; :meth:`ranked_by`), the node circuit
    (``node``, a :class:`~circuitkit.tasks.circuit.NodeCircuit`; ``node_result``, the search beyond ranking that
    chose it), ``error`` (why there is no node or edge circuit), the random sets (``baseline``), ``stable``, the edge
    circuit (``edge_part``: :func:`~circuitkit.tasks.circuit.edge_circuit`'s tuple; ``edge_pairs``, each pair's
    metric behind its figures; ``edge_result``, the edge search), ``other_set``, the circuit on the other pairs, and
    ``single``, the heads patched one at a time against their EAP-IG scores (``ablate``)."""

    options: TaskOptions
    runner: TaskRunner
    held: TaskRunner | None = None
    search: TaskRunner | None = None
    other: TaskRunner | None = None
    told: Callable[[str, float], None] | None = None
    reruns: float = 0.0
    clean: dict[str, Any] | None = None
    corrupted: dict[str, Any] | None = None
    scores: Tensor | None = None
    node_scores: Tensor | None = None
    typed: dict[str, Tensor] = field(default_factory=dict)
    ranking: Tensor | None = None
    ranking_typed: dict[str, Tensor] = field(default_factory=dict)
    node: NodeCircuit | None = None
    node_result: SearchResult | None = None
    error: str | None = None
    baseline: RandomBaseline | None = None
    stable: Stability | None = None
    edge_part: tuple = ()
    edge_pairs: dict[str, Tensor] = field(default_factory=dict)
    edge_result: SearchResult | None = None
    other_set: dict[str, Any] | None = None
    single: SingleHeads | None = None

    def __post_init__(self) -> None:
        if not self.edge_part:
            self.edge_part = (*NO_EDGES, self.runner.graph.n_edges, None)

    def ranked_by(self) -> tuple[Tensor | None, dict[str, Tensor]]:
        """The scores that order the nodes ``[sender]`` and the further node types' ``{type: [layer, nodes]}``: the
        joint path's shares where the joint stage ran, else EAP-IG's node scores."""
        if self.ranking is not None:
            return self.ranking, self.ranking_typed
        return self.node_scores, self.typed

    def passes(self) -> float:
        """Every pass counted so far, on both sets of pairs and in the stability reruns."""
        return self.runner.passes + (self.held.passes if self.held is not None else 0.0) + self.reruns

    def staged(self, bar: Any, name: str, fn: Callable[[Callable[..., None]], Any], why: Any = None) -> Any:
        """Run ``fn(advance)`` as stage ``name`` of ``bar``: ``advance()`` moves the bar by the passes counted since
        its last call; the stage ends with ``why`` (or ``why(result)``) as the reason of any revision, and the
        user's ``progress(stage, passes)`` is told."""
        begun = [self.passes()]

        def advance(*_: Any) -> None:
            now = self.passes()
            bar.advance(now - begun[-1])
            begun.append(now)

        bar.start(name)
        result = fn(advance)
        advance()
        bar.end(why(result) if callable(why) else why)
        if self.told is not None:
            self.told(name, bar.ran[-1].passes)
        return result


AFTER_NODES = ("search", "random-sets", "stability", "edges", "edge-search", "held-out")
"""The stages that need a node circuit: skipped where there is none."""


def _no_node_circuit(state: TaskScanState, bar: Any, error: Exception) -> None:
    """The corrupted prompts do not change the metric: no node circuit, and the stages after it leave the plan."""
    state.error = str(error)
    bar.end("no behaviour: the corrupted prompts do not change the metric")
    for later in AFTER_NODES:
        if later in bar.plan:
            bar.skip(later, "no node circuit (the corrupted prompts do not change the metric)")


def clean_stage(state: TaskScanState, plan: PlanInputs, bar: Any) -> None:
    state.clean = state.staged(bar, "clean", lambda advance: state.runner.clean)


def corrupted_stage(state: TaskScanState, plan: PlanInputs, bar: Any) -> None:
    state.corrupted = state.staged(bar, "corrupted", lambda advance: state.runner.corrupted)


def attribute_stage(state: TaskScanState, plan: PlanInputs, bar: Any) -> None:
    """EAP-IG; where its first point is the corrupted run (``plan.folded``), that run is read from it. Where no edge
    score is read (``edges=False``) and a node is patched to its corrupted value, only the node scores are taken:
    the gradient at each node's output, the sum of its edges' scores, without the pullback to every receiver
    (:meth:`~circuitkit.graph.runner.TaskRunner.node_attribution`; a family without edges has only these)."""
    o, runner = state.options, state.runner
    runner.keep_node_pairs = o.ablate != "none"  # each pair's term of the node scores: the agreement's interval
    if runner.edges_defined and (o.edges or not runner.node_scores_from_outputs):
        state.scores, state.node_scores, state.typed = state.staged(
            bar, "attribute", lambda advance: runner.attribute(o.steps, o.ig_points))
    else:  # node scores only: each node's own EAP-IG score at its output (graph.EDGES_UNDEFINED)
        state.node_scores, state.typed = state.staged(
            bar, "attribute", lambda advance: runner.node_attribution(o.steps, o.ig_points))
    state.corrupted = runner.corrupted  # run by now: apart (the corrupted stage) or as EAP-IG's first point


def joint_stage(state: TaskScanState, plan: PlanInputs, bar: Any) -> None:
    """The nodes' shares along the joint path, on the pairs EAP-IG ran on: they order the nodes from here on."""
    o = state.options
    state.ranking, state.ranking_typed = state.staged(
        bar, "joint", lambda advance: state.runner.joint_shares(o.mlp_nodes))


def ablate_stage(state: TaskScanState, plan: PlanInputs, bar: Any) -> None:
    """Each chosen head patched alone on the pairs EAP-IG ran on, against its EAP-IG node score."""
    from circuitkit.tasks.single_heads import single_heads

    o, runner = state.options, state.runner
    index = runner.graph.head_senders
    scores = state.node_scores.detach().cpu()[index]  # [layer, head]
    pairs = None if runner.node_pairs is None else runner.node_pairs[index].permute(2, 0, 1)  # [pair, layer, head]
    state.single = state.staged(bar, "ablate", lambda advance: single_heads(
        runner, scores, o.ablate, o.ablate_top, o.n_resamples, o.ci_level, estimate_pairs=pairs),
        why="each head's pass resumes at its own layer")


def nodes_stage(state: TaskScanState, plan: PlanInputs, bar: Any) -> None:
    from circuitkit.circuits.curve import NoBehaviour
    from circuitkit.tasks.circuit import node_circuit

    o = state.options
    scores, typed = state.ranked_by()
    try:
        state.node = state.staged(
            bar, "nodes", lambda advance: node_circuit(state.search, scores, o.target, o.rank,
                                                       mlp_nodes=o.mlp_nodes, progress=advance, types=typed),
            lambda found: f"the search measured {len(found.curve) - 2} sizes and stopped at "
                          f"{len(found.heads) + len(found.mlps)} nodes")
    except NoBehaviour as error:  # reported, not raised
        _no_node_circuit(state, bar, error)


def search_stage(state: TaskScanState, plan: PlanInputs, bar: Any) -> None:
    """The searched circuit replaces the ranked one (:mod:`circuitkit.tasks.search`)."""
    from circuitkit.circuits.curve import NoBehaviour
    from circuitkit.circuits.search import stop_words
    from circuitkit.tasks.circuit import NodeCircuit
    from circuitkit.tasks.search import search_node_circuit

    o = state.options
    scores, _ = state.ranked_by()
    try:
        searched, state.node_result = state.staged(bar, "search", lambda advance: search_node_circuit(
            o.node_search, state.search, scores, tuple(state.node[:8]), o.target, o.rank,
            mlp_nodes=o.mlp_nodes, options=o.search_options),
            lambda out: f"{out[1].start} -> {out[1].size} nodes at {out[1].faithfulness:.3f}, "
                        + stop_words(out[1].settings.get("stopped")))
    except NoBehaviour as error:
        _no_node_circuit(state, bar, error)
        state.node = None
        return
    state.node = NodeCircuit(*searched, state.node.nodes)


def random_sets_stage(state: TaskScanState, plan: PlanInputs, bar: Any) -> None:
    from circuitkit.tasks.robustness import random_node_sets

    o, node = state.options, state.node
    mlp_nodes_on = o.mlp_nodes and state.runner.graph.mlps
    state.baseline = state.staged(bar, "random-sets", lambda advance: random_node_sets(
        state.search, node.heads, node.mlps, mlp_nodes_on, node.pairs["all_patched"], o.random_sets, 0,
        o.ci_level, o.n_resamples, advance))


def stability_stage(state: TaskScanState, plan: PlanInputs, bar: Any) -> None:
    from circuitkit.tasks.robustness import node_stability

    o = state.options

    def rerun_counted(advance: Any) -> Any:
        def told_rerun(passes: float) -> None:
            state.reruns += passes
            advance()

        return node_stability(state.search, o.stability, o.steps, o.target, o.rank, o.mlp_nodes,
                              progress=told_rerun, points=o.ig_points, ranking=o.node_ranking)

    state.stable = state.staged(bar, "stability", rerun_counted)


def edges_stage(state: TaskScanState, plan: PlanInputs, bar: Any) -> None:
    """The edge circuit (:func:`~circuitkit.tasks.circuit.edge_circuit`), its plan first revised to what the
    scores decide (:func:`~circuitkit.tasks.circuit.edge_plan`)."""
    from circuitkit.circuits.curve import NoBehaviour
    from circuitkit.tasks.circuit import edge_circuit, edge_plan

    o = state.options
    bar.revise("edges", *edge_plan(state.search, state.scores, o.rank))
    try:
        state.edge_part = state.staged(bar, "edges", lambda advance: edge_circuit(
            state.search, state.scores, o.target, o.rank, progress=advance, pairs=state.edge_pairs))
    except NoBehaviour as error:  # the corrupted run itself (no edge kept) equals the clean one
        state.error = f"no edge circuit: {error}"
        bar.end("no behaviour: the corrupted run equals the clean one")
        if "edge-search" in bar.plan:
            bar.skip("edge-search", "no edge circuit (the corrupted run equals the clean one)")


def edge_search_stage(state: TaskScanState, plan: PlanInputs, bar: Any) -> None:
    """The searched edges replace the ranked ones (:mod:`circuitkit.tasks.search`)."""
    o = state.options
    state.edge_part, state.edge_result = state.staged(bar, "edge-search", lambda advance: edge_searched(
        o.edge_search, state.search, state.scores, state.edge_part, o.target, o.rank,
        {**o.edge_options, "progress": lambda *_: advance()}),
        lambda out: f"{count_of(out[1].settings['pruned'], 'dangling edge')} pruned, "
                    f"{out[1].start} -> {out[1].size} edges at {out[1].faithfulness:.3f} "
                    f"(stopped: {out[1].settings['stopped']})")


def held_out_stage(state: TaskScanState, plan: PlanInputs, bar: Any) -> None:
    """The circuit on the other set of pairs: the node curve's sizes, the circuit's own figures and the edge
    circuit (:func:`~circuitkit.tasks.other_set.other_set_figures`); a searched set measured there itself too."""
    from circuitkit.tasks.other_set import circuit_intervals, other_set_figures
    from circuitkit.tasks.search import held_out

    o, node, other = state.options, state.node, state.other
    names = state.edge_part[0]
    n_found = len(node.heads) + len(node.mlps) + sum(len(m) for m in node.nodes.values())
    sizes = len(({0, n_found} if o.quick else {p.size for p in node.curve} | {0, n_found}) - {node.n_nodes})
    # a node set costs there what it cost the search (the same sets, resumed at the same layers): the nodes stage's
    # passes over its sets (the curve's points, its two ends standing for the all-patched run and necessity)
    measured = next((r.passes for r in bar.ran if r.name == "nodes"), None)
    share = 1.0 if not measured or not node.curve else min(1.0, measured / len(node.curve))
    bar.revise("held-out", held_estimate(replace(plan, edges=bool(names)), sizes, share),
               f"the node curve has {sizes} sizes to measure there, at {share:.2f} of a pass a set as in the search")

    scores, typed = state.ranked_by()

    def measure(advance: Any) -> dict[str, Any]:
        out = other_set_figures(other, "discovery" if other is state.runner else "evaluation",
                                () if o.quick else node.curve, n_found, scores, o.rank, o.mlp_nodes, names,
                                node.n_nodes, typed, o.n_resamples, o.ci_level)
        if o.node_search != "ranked":  # the searched set itself on the other pairs, with its own intervals
            searched: dict[str, Any] = {}
            out.update(held_out(other, node.heads, node.mlps, o.mlp_nodes, searched))
            ci = {k: v for k, v in out.pop("ci", {}).items() if k == "edge_faithfulness"}
            if out.get("faithfulness") is not None:  # the set has a gap (as the ranked sets')
                own = circuit_intervals(searched, other.clean["metric"], o.n_resamples, o.ci_level)
                ci = {**{k: [lo, hi] for k, (lo, hi) in own.items()}, **ci}
            out.update({"ci": ci} if ci else {})
        return out

    state.other_set = state.staged(bar, "held-out", measure)


def edge_searched(name: str, runner: Any, scores: Any, edge_part: tuple, target: float, rank: str,
                  options: dict[str, Any]) -> tuple[tuple, Any]:
    """``edge_circuit``'s tuple with the searched edges and their faithfulness in place of the ranked ones (the
    curve, CPR/CMD and areas the ranking's; the effects those of the strongest ranked edges still kept), and the
    :class:`~circuitkit.circuits.search.SearchResult`."""
    from circuitkit.tasks.search import search_edge_circuit

    names, faith, curve, cpr, cmd, effects, n_edges, areas = edge_part
    found, found_faith, result = search_edge_circuit(name, runner, scores, names, target, rank, faith,
                                                     options=options)
    kept = set(found)
    return (found, found_faith, curve, cpr, cmd, tuple(e for e in effects if e.name in kept), n_edges,
            areas), result


def count_of(n: int, noun: str) -> str:
    """``"1 dangling edge"``, ``"3 dangling edges"``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


TASK_STAGES: tuple[Stage[TaskScanState, PlanInputs], ...] = (
    Stage("clean", "one forward: every sender's output, the clean metric, direct logit attribution (its backward "
          "through the final norm and unembedding only)", reads=("runner",), writes=("clean",),
          estimate=lambda p, state: 1, run=clean_stage),
    Stage("corrupted", "one forward: every sender's output on the corrupted prompts, the corrupted metric (where "
          "EAP-IG's first point is not the corrupted run)", reads=("runner",), writes=("corrupted",),
          estimate=lambda p, state: 1, run=corrupted_stage, runs=lambda p: not p.folded),
    Stage("attribute", "EAP-IG: the interpolation points stacked in one forward + backward; the first point, "
          "alpha = 0, is the corrupted run, read from its copy where it has not run apart",
          reads=("runner", "clean"), writes=("corrupted", "scores", "node_scores", "typed"),
          estimate=lambda p, state: 3 * p.steps, run=attribute_stage),
    Stage("joint", "the nodes' shares along the joint path from every node patched to none, which order them "
          "(two points stacked in one forward + backward; not with node_ranking='eap-ig')",
          reads=("runner", "corrupted"),
          writes=("ranking", "ranking_typed"), estimate=lambda p, state: JOINT_PASSES, run=joint_stage,
          runs=lambda p: p.node_ranking == "joint"),
    Stage("ablate", "each chosen head patched alone (opt-in: ablate='top' or 'all'), against its EAP-IG node "
          "score: the estimate's agreement with exact patching", reads=("runner", "clean", "node_scores"),
          writes=("single",), estimate=lambda p, state: EFFECT_SHARE * p.single_heads, run=ablate_stage,
          runs=lambda p: p.single_heads > 0),
    Stage("nodes", "the node circuit: every node patched, the exact sizes and bisection (past 16 nodes a coarse "
          "search on a quarter of the pairs first), necessity", reads=("search", "node_scores", "typed",
                                                                         "ranking", "ranking_typed"),
          writes=("node", "error"), estimate=lambda p, state: node_estimate(p.nodes, p.pairs), run=nodes_stage),
    Stage("search", "a search beyond ranking from the ranked circuit (opt-in: refined drops and swaps, or learned "
          "masks; planned roughly, revised as it runs)", reads=("search", "node_scores", "ranking", "node"),
          writes=("node", "node_result", "error"), estimate=lambda p, state: p.search_passes, run=search_stage,
          runs=lambda p: p.search != "ranked"),
    Stage("random-sets", "random node sets of the circuit's size, uniform and per layer (opt-in)",
          reads=("search", "node"), writes=("baseline",), estimate=lambda p, state: 2 * p.random_sets,
          run=random_sets_stage, runs=lambda p: p.random_sets > 0),
    Stage("stability", "the node search rerun on bootstrap resamples of the pairs (opt-in)",
          reads=("search",), writes=("stable", "reruns"), estimate=lambda p, state: stability_estimate(p),
          run=stability_stage, runs=lambda p: p.stability > 0),
    Stage("edges", "the edge circuit: MIB's sizes stacked, the bisection to 1/64 of its size, the strongest edges' "
          "exact effects", reads=("search", "scores"), writes=("edge_part", "edge_pairs", "error"),
          estimate=lambda p, state: edge_estimate(p.edges_total, p.pairs) * p.kv_copies, run=edges_stage,
          runs=lambda p: p.edges),
    Stage("edge-search", "a search beyond ranking from the ranked edge circuit (opt-in: dangling edges pruned, then "
          "refined block rounds and drops within a pass budget; planned from the budget)",
          reads=("search", "scores", "edge_part"), writes=("edge_part", "edge_result"),
          estimate=lambda p, state: p.edge_search_passes + p.kv_copies, run=edge_search_stage,
          runs=lambda p: p.edges and p.edge_search != "ranked"),
    Stage("held-out", "the circuit measured on the pairs the search did not use", reads=(
          "other", "runner", "node", "node_scores", "typed", "ranking", "ranking_typed", "edge_part"),
          writes=("other_set",),
          estimate=lambda p, state: held_estimate(p), run=held_out_stage, runs=lambda p: p.held > 0),
)
"""The task scan's stages in the order they run (:func:`task_plan` says which run, with their planned passes)."""
TASK_STAGE_NAMES = {stage.name: stage.what for stage in TASK_STAGES}

def task_plan(plan: PlanInputs) -> list[tuple[str, float]]:
    """``(stage, planned passes)`` for each stage a scan with these inputs runs, in order."""
    return plan_of(TASK_STAGES, plan, None)


def task_progress(task_name: str, mode: str, plan: list[tuple[str, float]], stream: Any = None) -> Any:
    """The :class:`~circuitkit.progress.Progress` of a task scan: its lines and bar labelled ``scan NAME`` (the
    task's name is data: escaped for the terminal)."""
    from circuitkit._terminal import visible
    from circuitkit.progress import Progress

    return Progress(mode, plan, stream=stream, label=visible(f"scan {task_name}"))


__all__ = ["AFTER_NODES", "PlanInputs", "TASK_STAGES", "TASK_STAGE_NAMES", "TaskOptions", "TaskScanState", "task_plan",
           "task_progress"]
