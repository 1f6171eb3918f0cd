"""A task's node circuit by a registered search (:mod:`circuitkit.circuits.search`): refined, learned masks.

The node circuit of :func:`~circuitkit.tasks.circuit.node_circuit` is the smallest top-``n`` set by EAP-IG node
score. :func:`task_problem` makes the task's nodes (heads, and MLPs where ``mlp_nodes``) a
:class:`~circuitkit.circuits.search.SearchProblem`: a set's faithfulness ``(m_C - m_all) / (m_clean - m_all)`` by
:meth:`~circuitkit.tasks.graph.TaskRunner.node_metric` (nodes outside the set patched from the corrupted prompt, many
sets per stacked pass within the runner's copies-per-pass budget), and the gated run for learned masks: each node's
output ``v + m (z - v)`` (``v``: its patched value, ``z``: what it computes in the gated run), the mean metric
differentiated in ``m``. :func:`search_node_circuit` runs a search from the ranked circuit and returns it in
``node_circuit``'s shape, so that ``scan_task(search=...)`` swaps one for the other.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from circuitkit.circuits.search import SearchProblem, SearchResult, run_search
from circuitkit.models.adapters import HOOKS
from circuitkit.tasks.circuit import node_order
from circuitkit.tasks.graph import TaskRunner


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
    gap = clean - all_patched

    def faithfulness(kept: Tensor) -> Tensor:
        heads, mlps = patched_masks(runner, nodes, kept, mlp_nodes)
        return (runner.node_metric(heads, mlps).double() - all_patched) / gap

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
        return (metric - all_patched) / gap

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


def held_out(other: TaskRunner, heads: tuple, mlps: tuple, mlp_nodes: bool) -> dict[str, float]:
    """The searched circuit's ``faithfulness`` and ``necessity`` on the pairs the search did not use (three stacked
    sets: the circuit kept, every node patched, only the circuit patched)."""
    mlp_nodes = bool(mlp_nodes and other.graph.mlps)
    nodes = task_nodes(other, mlp_nodes)
    members = {(layer, h) for layer, h in heads} | {(layer, None) for layer in mlps}
    kept = torch.tensor([[node in members for node in nodes]], dtype=torch.bool, device="cpu")
    sets = torch.cat([kept, torch.zeros_like(kept), ~kept])
    patched_heads, patched_mlps = patched_masks(other, nodes, sets, mlp_nodes)
    circuit, all_patched, only = other.node_metric(patched_heads, patched_mlps).tolist()
    clean = float(other.clean["metric"].mean())
    out = {"necessity": clean - only}
    if abs(clean - all_patched) >= 1e-3:
        out["faithfulness"] = (circuit - all_patched) / (clean - all_patched)
    return out


__all__ = ["held_out", "search_node_circuit", "task_nodes", "task_problem"]
