"""A task's node circuit by a registered search (:mod:`circuitkit.circuits.search`): refined, learned masks.

The node circuit of :func:`~circuitkit.tasks.circuit.node_circuit` is the smallest top-``n`` set by EAP-IG node
score. :func:`task_problem` makes the task's nodes (heads, and MLPs where ``mlp_nodes``) a
:class:`~circuitkit.circuits.search.SearchProblem`: a set's faithfulness ``(m_C - m_all) / (m_clean - m_all)`` by
:meth:`~circuitkit.graph.runner.TaskRunner.node_metric` (nodes outside the set patched from the corrupted prompt, many
sets per stacked pass within the runner's copies-per-pass budget), and the gated run for learned masks: each node's
output ``v + m (z - v)`` (``v``: its patched value, ``z``: what it computes in the gated run), the mean metric
differentiated in ``m``. :func:`search_node_circuit` runs a search from the ranked circuit and returns it in
``node_circuit``'s shape, so that ``scan_task(search=...)`` swaps one for the other.

**Edge circuits** (:func:`~circuitkit.tasks.circuit.edge_circuit`: the smallest top-``k`` edge set by EAP-IG
score): :func:`edge_problem` makes the graph's edges the nodes of a :class:`SearchProblem` (a set's faithfulness
``(m_C - m_corr) / (m_clean - m_corr)`` by :meth:`~circuitkit.graph.runner.TaskRunner.edge_metric`, every other edge
patched; importance: the edges' ranking scores). :func:`search_edge_circuit` first prunes the **dangling** edges of
the ranked circuit (:func:`dangling`), which changes no metric, then runs the search (``refined``: block rounds past
its ``singles`` members, then single drops and swaps). No gated run: the learned masks run over nodes only.

A kept edge ``s -> r`` is dangling where the node reading ``r`` sends no kept edge that is itself not dangling (every
reader of the node's output then sees its corrupted output, whatever its inputs), or where ``s`` is a head or MLP
none of whose inputs receives a kept edge that is not dangling (its inputs are then the corrupted run's: the sum of
every sender's patched difference is the corrupted residual stream, so it computes its corrupted output). The logits
and the input always count as connected. MIB prunes the same edges before it counts a circuit.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from circuitkit import validate
from circuitkit.circuits.curve import faithfulness_of, has_gap
from circuitkit.circuits.search import SearchProblem, SearchResult, run_search
from circuitkit.graph.runner import TaskRunner
from circuitkit.models.adapters import HOOKS
from circuitkit.tasks.circuit import MIN_TASK_GAP, node_order


def task_nodes(runner: TaskRunner, mlp_nodes: bool) -> list[tuple[int, int | None]]:
    """The node list of a task's node circuit: every head ``(layer, head)``, then (``mlp_nodes``) every MLP
    ``(layer, None)``."""
    L, H = runner.spec.n_layers, runner.spec.n_heads
    return [(layer, h) for layer in range(L) for h in range(H)] + (
        [(layer, None) for layer in range(L)] if mlp_nodes else [])


def patched_masks(runner: TaskRunner, nodes: list, kept: Tensor, mlp_nodes: bool) -> tuple[Tensor, Tensor | None]:
    """``kept`` ``[sets, node]`` (True: in the circuit) -> ``node_metric``'s patched masks ``heads [sets, L, H]``,
    ``mlps [sets, L]`` (or None)."""
    L, H = runner.spec.n_layers, runner.spec.n_heads
    heads = ~kept[:, : L * H].reshape(-1, L, H)
    mlps = ~kept[:, L * H :] if mlp_nodes else None
    return heads, mlps


def task_problem(runner: TaskRunner, node_scores: Tensor, all_patched: float, *, mlp_nodes: bool = False,
                 ) -> SearchProblem:
    """A task's node circuit as a search problem (module docstring). ``node_scores``: ``[sender]`` EAP-IG node
    scores (swap candidates by score); ``all_patched``: the mean metric with every node patched."""
    graph, spec = runner.graph, runner.spec
    L, H = spec.n_layers, spec.n_heads
    mlp_nodes = bool(mlp_nodes and graph.mlps)
    nodes = task_nodes(runner, mlp_nodes)
    clean = float(runner.clean["metric"].mean())

    def faithfulness(kept: Tensor) -> Tensor:
        heads, mlps = patched_masks(runner, nodes, kept, mlp_nodes)
        return faithfulness_of(runner.node_metric(heads, mlps).double(), clean, all_patched)

    def gated(m: Tensor) -> Tensor:
        from circuitkit.detect.attribution import frozen_parameters

        z_values, mlp_values = runner.node_values()
        head_m, mlp_m = m[: L * H].view(L, H), m[L * H :]

        def z_hook(z: Tensor, hook: Any) -> Tensor:
            layer = HOOKS.layer_of(hook.name)
            v = z_values[layer].to(z.dtype)
            g = head_m[layer].to(device=z.device, dtype=z.dtype)
            return v + g[None, None, :, None] * (z - v)

        def mlp_hook(x: Tensor, hook: Any) -> Tensor:
            layer = HOOKS.layer_of(hook.name)
            v = mlp_values[layer].to(x.dtype)
            return v + mlp_m[layer].to(device=x.device, dtype=x.dtype) * (x - v)

        hooks = [(HOOKS.z(layer), z_hook) for layer in range(L)]
        if mlp_nodes:
            hooks += [(HOOKS.mlp_out(layer), mlp_hook) for layer in range(L)]
        with frozen_parameters(runner.adapter.model):
            logits = runner.adapter.run(runner.batch.clean, hooks, positions=runner.positions)
            metric = runner.metric(logits).mean()
        runner.passes += 3.0
        return faithfulness_of(metric, clean, all_patched)

    names = tuple(f"{layer}.{h}" if h is not None else f"m{layer}" for layer, h in nodes)
    scores = torch.tensor([float(node_scores[graph.sender_index(layer, h)]) for layer, h in nodes], device="cpu")
    return SearchProblem(names, faithfulness, gated, lambda: float(runner.passes), scores)


def search_node_circuit(name: str, runner: TaskRunner, node_scores: Tensor, found: tuple, target: float, rank: str,
                        *, mlp_nodes: bool = False, options: dict[str, Any] | None = None,
                        ) -> tuple[tuple, SearchResult]:
    """Run the search ``name`` from the ranked node circuit ``found`` (what
    :func:`~circuitkit.tasks.circuit.node_circuit` returned) and give back the same tuple with the searched circuit's
    ``heads``, ``mlps``, ``faithfulness``, ``necessity`` and per-pair metrics (``curve`` stays the ranking's), and
    the :class:`SearchResult`. Two more stacked sets: the circuit's per-pair metric and its necessity."""
    heads, mlps, faith, necessity, curve, all_patched, n_nodes, pairs = tuple(found)[:8]  # a NodeCircuit or its first 8
    mlp_nodes = bool(mlp_nodes and runner.graph.mlps)
    problem = task_problem(runner, node_scores, all_patched, mlp_nodes=mlp_nodes)
    nodes = task_nodes(runner, mlp_nodes)
    index = {node: i for i, node in enumerate(nodes)}
    order = node_order(runner.graph, runner.spec.n_layers, runner.spec.n_heads, node_scores, rank, mlp_nodes)
    start = [index[node] for node in order if (node[1] is None and node[0] in mlps) or node in heads]
    result = run_search(name, problem, start, target, start_faithfulness=faith, **(options or {}))
    if name == "ranked":
        return found, result
    kept = problem.kept([result.kept])
    both = torch.cat([kept, ~kept])
    patched_heads, patched_mlps = patched_masks(runner, nodes, both, mlp_nodes)
    values = runner.node_metric(patched_heads, patched_mlps, per_pair=True)  # [2, pair]
    members = [nodes[i] for i in result.kept]
    new_heads = tuple(sorted((layer, h) for layer, h in members if h is not None))
    new_mlps = tuple(sorted(layer for layer, h in members if h is None))
    clean = float(runner.clean["metric"].mean())
    new_pairs = {**pairs, "circuit": values[0], "only_circuit": values[1]}
    return (new_heads, new_mlps, result.faithfulness, clean - float(values[1].mean()), curve, all_patched, n_nodes,
            new_pairs), result


def held_out(other: TaskRunner, heads: tuple, mlps: tuple, mlp_nodes: bool,
             pairs: dict[str, Tensor] | None = None) -> dict[str, float]:
    """The searched circuit's ``faithfulness`` and ``necessity`` on the pairs the search did not use (three stacked
    sets: the circuit kept, every node patched, only the circuit patched). ``pairs`` (a dict): filled with each
    set's metric per pair, ``circuit``, ``all_patched`` and ``only_circuit`` (``[pair]``, CPU: what the bootstrap
    intervals resample; the figures are their means)."""
    mlp_nodes = bool(mlp_nodes and other.graph.mlps)
    nodes = task_nodes(other, mlp_nodes)
    members = {(layer, h) for layer, h in heads} | {(layer, None) for layer in mlps}
    kept = torch.tensor([[node in members for node in nodes]], dtype=torch.bool, device="cpu")
    sets = torch.cat([kept, torch.zeros_like(kept), ~kept])
    patched_heads, patched_mlps = patched_masks(other, nodes, sets, mlp_nodes)
    per_pair = other.node_metric(patched_heads, patched_mlps, per_pair=True)  # [3, pair]
    if pairs is not None:
        pairs.update(zip(("circuit", "all_patched", "only_circuit"), per_pair.cpu(), strict=True))
    circuit, all_patched, only = per_pair.mean(-1).tolist()
    clean = float(other.clean["metric"].mean())
    out = {"necessity": clean - only}
    if has_gap(clean, all_patched, MIN_TASK_GAP):
        out["faithfulness"] = faithfulness_of(circuit, clean, all_patched)
    return out


def receiver_nodes(graph: Any) -> list[list[int] | None]:
    """Per receiver, the senders (heads, MLPs) whose computation reads it; ``[]`` for the logits; None for a receiver
    of another channel (never pruned). A key/value receiver shared by a group of query heads feeds each of them."""
    out: list[list[int] | None] = [None] * len(graph.receivers)
    H = graph.n_heads
    for (channel, layer), cols in graph.receiver_slices.items():
        n = cols.stop - cols.start
        for i in range(n):
            if channel == "logits":
                out[cols.start + i] = []
            elif channel in ("q", "k", "v"):
                heads = range(i * H // n, (i + 1) * H // n)
                out[cols.start + i] = [graph.sender_index(layer, h) for h in heads]
            elif channel == "mlp" and ("mlp", layer) in graph.sender_slices:
                out[cols.start + i] = [graph.sender_index(layer, None)]
    return out


def dangling(graph: Any, kept: Tensor) -> Tensor:
    """``kept`` ``[sender, receiver]`` bool -> the same mask without its dangling edges (module docstring), found by
    iterating both rules to a fixed point."""
    readers = receiver_nodes(graph)
    S, R = kept.shape
    feeds: list[list[int]] = [[] for _ in range(S)]  # sender -> the receivers it computes from
    for r, nodes in enumerate(readers):
        for node in nodes or []:
            feeds[node].append(r)
    computed = {i for nodes in readers if nodes for i in nodes}  # senders with inputs (not the input embedding)
    kept = kept.clone()
    while True:
        live_out = torch.zeros(S, dtype=torch.bool, device="cpu")  # senders with a kept edge reaching the logits
        useful = torch.tensor([nodes is None or nodes == [] for nodes in readers], dtype=torch.bool, device="cpu")
        for _ in range(S + 1):  # senders are in layer order: a pass per layer at most
            live_out = (kept & useful[None]).any(dim=1)
            new = torch.tensor([nodes is None or nodes == [] or bool(live_out[nodes].any()) for nodes in readers],
                               dtype=torch.bool, device="cpu")
            if torch.equal(new, useful):
                break
            useful = new
        live_in = torch.tensor([i not in computed for i in range(S)], dtype=torch.bool, device="cpu")
        for _ in range(S + 1):
            reached = (kept & live_in[:, None]).any(dim=0)  # [receiver]: a kept edge from a live sender
            new = torch.tensor([i not in computed or bool(reached[feeds[i]].any()) for i in range(S)],
                               dtype=torch.bool, device="cpu")
            if torch.equal(new, live_in):
                break
            live_in = new
        pruned = kept & useful[None] & live_in[:, None]
        if torch.equal(pruned, kept):
            return kept
        kept = pruned


def edge_problem(runner: TaskRunner, scores: Tensor, rank: str) -> SearchProblem:
    """A task's edge circuit as a search problem: nodes are the graph's edges (``graph.allowed``'s nonzero order),
    importance the ranking's (``|score|`` for ``rank="abs"``, the signed score for ``"signed"``)."""
    graph = runner.graph
    index = graph.allowed.nonzero()
    flat = scores[index[:, 0], index[:, 1]].detach().float().cpu()
    clean = float(runner.clean["metric"].mean())
    corrupted = float(runner.corrupted["metric"].mean())

    def faithfulness(kept: Tensor) -> Tensor:
        masks = torch.zeros(kept.shape[0], *graph.allowed.shape, dtype=torch.bool, device="cpu")
        masks[:, index[:, 0], index[:, 1]] = kept
        return faithfulness_of(runner.edge_metric(masks).double(), clean, corrupted)

    importance = flat.abs() if rank == "abs" else flat
    return SearchProblem(tuple(graph.edge_names(index)), faithfulness, None, lambda: float(runner.passes), importance)


EDGE_SEARCH_NAMES = ("ranked", "refined")
"""The searches a task scan runs over its edge circuit (``scan_task(edge_search=...)``; the learned masks run over
nodes only)."""

DEFAULT_EDGE_SEARCH_PASSES = 30.0
"""The edge search's pass budget in a task scan unless its options say otherwise (``max_passes``): the refined
search stops before a round that would pass it. IOI on a 0.5B model: 30 passes took 9,976 edges to 6,670."""


def search_edge_circuit(name: str, runner: TaskRunner, scores: Tensor, edges: tuple[str, ...], target: float,
                        rank: str, faithfulness: float | None = None, *, options: dict[str, Any] | None = None,
                        ) -> tuple[tuple[str, ...], float, SearchResult]:
    """The ranked edge circuit ``edges`` (names, as :func:`~circuitkit.tasks.circuit.edge_circuit` returns them, at
    ``faithfulness``) searched further by ``name``: its dangling edges pruned (one exact set measures the rest),
    then the search. Returns ``(edges, faithfulness, result)``; ``result.settings["pruned"]``: the dangling
    edges dropped; ``result.passes`` counts the pruned set's measure."""
    problem = edge_problem(runner, scores, rank)
    position = {n: i for i, n in enumerate(problem.nodes)}
    unknown = [e for e in edges if e not in position]
    if unknown:
        raise validate.fail("edge search: edges", validate.given(", ".join(unknown[:3])),
                            "edges of the runner's graph")
    start = [position[e] for e in edges]
    if name == "ranked":
        result = run_search("ranked", problem, start, target, start_faithfulness=faithfulness, **(options or {}))
        return tuple(edges), result.faithfulness, result
    before = runner.passes
    index = runner.graph.allowed.nonzero()
    mask = torch.zeros_like(runner.graph.allowed)
    mask[index[start, 0], index[start, 1]] = True
    kept_mask = dangling(runner.graph, mask)
    pruned = [i for i in start if bool(kept_mask[index[i, 0], index[i, 1]])]
    f = faithfulness
    if len(pruned) < len(start) or f is None:
        f = problem.measure([pruned])[0]
    if f < target:  # float rounding at the boundary: keep the ranked set as it is
        pruned, f = start, (faithfulness if faithfulness is not None else problem.measure([start])[0])
    result = run_search(name, problem, pruned, target, start_faithfulness=f, **(options or {}))
    from dataclasses import replace

    result = replace(result, start=len(start), passes=runner.passes - before,
                     trace=(("start", len(start), float(faithfulness if faithfulness is not None else f)),
                            ("pruned", len(pruned), float(f)), *result.trace[1:]),
                     settings={**result.settings, "pruned": len(start) - len(pruned)})
    order = {e: i for i, e in enumerate(edges)}
    names = sorted((problem.nodes[i] for i in result.kept), key=lambda e: order.get(e, len(order)))
    return tuple(names), result.faithfulness, result


__all__ = ["DEFAULT_EDGE_SEARCH_PASSES", "EDGE_SEARCH_NAMES", "dangling", "edge_problem", "held_out",
           "receiver_nodes", "search_edge_circuit", "search_node_circuit", "task_nodes", "task_problem"]
