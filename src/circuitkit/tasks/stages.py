"""A task scan's stages, declared, and its progress plan in passes of the pairs, made before the first pass.

Each stage (:data:`TASK_STAGES`) has a short name that fits a progress bar, what it does, and its planned passes
(``estimate(plan)`` from :class:`PlanInputs`: what is known before any pass: the node and edge counts, the pairs
the search runs on, the EAP-IG points, the options). A pass is one run of a runner's pairs through the model (a
backward counts two); the coarse circuit search's stacked copies of a quarter of the pairs count as the share of a
pass they are. Where a stage's count differs from its plan, the plan is revised when it ends, saying so; a stage
that cannot run (no behaviour to explain) leaves the plan with its reason (:class:`circuitkit.progress.Progress`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from circuitkit.circuits.faithfulness import COARSE_SETS, geometric_sizes
from circuitkit.tasks.circuit import (
    COARSE_AFTER,
    COARSE_MIN_PAIRS,
    EDGE_RESOLUTION,
    N_EXACT_EDGES,
    RANKS,
    mib_sizes,
)


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
    """Copies of the pairs each edge pass and EAP-IG point runs (per-query-head key/value edges on a grouped-query
    model: the query heads per key/value head; :attr:`~circuitkit.graph.runner.Graph.kv_copies`)."""
    edge_search: str = "ranked"
    edge_search_passes: float = 0.0
    """The edge search's pass budget (``edge_search`` other than ``"ranked"``)."""


@dataclass(frozen=True)
class TaskStageSpec:
    """One declared stage: ``name``, ``what`` it does, ``estimate(plan) -> passes`` and ``runs(plan) -> bool``."""

    name: str
    what: str
    estimate: Callable[[PlanInputs], float]
    runs: Callable[[PlanInputs], bool]


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
``(L - l) / L`` of the model, half on average over the layers (on Qwen2.5-0.5B's IOI, the eight strongest edges
cost 1.83 passes: five into the logits)."""


def edge_estimate(edges_total: int, pairs: int) -> float:
    """Planned passes of the edge circuit: MIB's sizes under both rankings (one stacked copy each; a size whose two
    top sets are the same edges is measured once, so this is at most), the bisection between the two sizes around
    the target (2 to 2.5 apart) to :data:`EDGE_RESOLUTION` of the size, and the strongest edges' exact effects,
    each resumed at its receiver's layer (counted :data:`EFFECT_SHARE` of a pass each: the share is known only once
    the edges are)."""
    sizes = len([k for k in mib_sizes(edges_total) if 0 < k < edges_total])
    bisection = math.ceil(math.log2(2.5 / EDGE_RESOLUTION)) - 1
    return len(RANKS) * sizes + bisection + EFFECT_SHARE * min(N_EXACT_EDGES, edges_total)


def held_estimate(plan: PlanInputs, curve_sizes: int | None = None) -> float:
    """Planned passes on the other set of pairs: its clean and corrupted runs (forward only), the node curve's sizes
    (``curve_sizes``, known once the search ran; before it, the sizes :func:`node_estimate` plans for the search;
    quick: the circuit's size and every node patched) and the circuit alone patched, and the edge circuit (one)."""
    if curve_sizes is None:
        curve_sizes = int(node_estimate(plan.nodes, plan.pairs)) - 2  # less its all-patched run and necessity
    sizes = 2 if plan.quick else curve_sizes
    return 1 + 1 + sizes + 1 + (plan.kv_copies if plan.edges else 0)


def stability_estimate(plan: PlanInputs) -> float:
    """Each resample: its clean and corrupted runs (forward only), EAP-IG and the node search."""
    return plan.stability * (2 + 3 * plan.steps + node_estimate(plan.nodes, plan.pairs))


TASK_STAGES = (
    TaskStageSpec("clean", "one forward: every sender's output, the clean metric, direct logit attribution (its "
                  "backward through the final norm and unembedding only)", lambda p: 1, lambda p: True),
    TaskStageSpec("corrupted", "one forward: every sender's output on the corrupted prompts, the corrupted metric",
                  lambda p: 1, lambda p: True),
    TaskStageSpec("attribute", "EAP-IG: the interpolation points stacked in one forward + backward",
                  lambda p: 3 * p.steps * p.kv_copies, lambda p: True),
    TaskStageSpec("nodes", "the node circuit: every node patched, the exact sizes and bisection (past 16 nodes a "
                  "coarse search on a quarter of the pairs first), necessity",
                  lambda p: node_estimate(p.nodes, p.pairs), lambda p: True),
    TaskStageSpec("search", "a search beyond ranking from the ranked circuit (opt-in: refined drops and swaps, or "
                  "learned masks; planned roughly, revised as it runs)",
                  lambda p: p.search_passes, lambda p: p.search != "ranked"),
    TaskStageSpec("random-sets", "random node sets of the circuit's size, uniform and per layer (opt-in)",
                  lambda p: 2 * p.random_sets, lambda p: p.random_sets > 0),
    TaskStageSpec("stability", "the node search rerun on bootstrap resamples of the pairs (opt-in)",
                  stability_estimate, lambda p: p.stability > 0),
    TaskStageSpec("edges", "the edge circuit: MIB's sizes stacked, the bisection to 1/64 of its size, the "
                  "strongest edges' exact effects", lambda p: edge_estimate(p.edges_total, p.pairs) * p.kv_copies,
                  lambda p: p.edges),
    TaskStageSpec("edge-search", "a search beyond ranking from the ranked edge circuit (opt-in: dangling edges "
                  "pruned, then refined block rounds and drops within a pass budget; planned from the budget)",
                  lambda p: p.edge_search_passes + p.kv_copies, lambda p: p.edges and p.edge_search != "ranked"),
    TaskStageSpec("held-out", "the circuit measured on the pairs the search did not use", held_estimate,
                  lambda p: p.held > 0),
)
"""The task scan's stages in the order they run (:func:`task_plan` says which run, with their planned passes)."""
TASK_STAGE_NAMES = {stage.name: stage.what for stage in TASK_STAGES}


def task_plan(plan: PlanInputs) -> list[tuple[str, float]]:
    """``(stage, planned passes)`` for each stage a scan with these inputs runs, in order."""
    return [(stage.name, stage.estimate(plan)) for stage in TASK_STAGES if stage.runs(plan)]


def task_progress(task_name: str, mode: str, plan: list[tuple[str, float]], stream: Any = None) -> Any:
    """The :class:`~circuitkit.progress.Progress` of a task scan: its lines and bar labelled ``scan NAME`` (the
    task's name is data: escaped for the terminal)."""
    from circuitkit._terminal import visible
    from circuitkit.progress import Progress

    return Progress(mode, plan, stream=stream, label=visible(f"scan {task_name}"))


__all__ = ["PlanInputs", "TASK_STAGES", "TASK_STAGE_NAMES", "TaskStageSpec", "task_plan", "task_progress"]
