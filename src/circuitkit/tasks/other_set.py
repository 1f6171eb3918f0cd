"""A task circuit's figures over its pairs: the bootstrap intervals of its faithfulness and necessity, and the
circuit measured on the set of pairs the search did not use (the held-out stage of :mod:`circuitkit.tasks.stages`).

Faithfulness is ``(m_C - m_all) / (m_clean - m_all)`` and necessity ``m_clean - m_{only C patched}``, each a mean
over the pairs (:mod:`circuitkit.circuits.curve`); an interval resamples the pairs and takes the ratio of the
resampled means, as the figure itself is (percentile bootstrap, :func:`circuitkit.uncertainty.bootstrap_ci`), from
each pair's metric in the passes that measured the figure: no extra pass.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from circuitkit.errors import CircuitkitError
from circuitkit.graph.runner import TaskRunner


def circuit_intervals(pairs: dict[str, Tensor], clean: Tensor, n_resamples: int, level: float) -> dict[str, tuple]:
    """Faithfulness ``(m_C - m_all) / (m_clean - m_all)`` and necessity ``m_clean - m_{only C patched}`` over the
    same resamples of the pairs (one draw: the ratio of resampled means, as the figure itself is)."""
    from circuitkit.uncertainty import bootstrap_ci

    if clean.shape[0] < 2:
        return {}
    nlo, nhi = bootstrap_ci(clean.double() - pairs["only_circuit"].double(), n_resamples, level)
    out = {"necessity": (float(nlo), float(nhi))}
    faithfulness = faithfulness_interval(pairs["circuit"], pairs["all_patched"], clean, n_resamples, level)
    return out if faithfulness is None else {"faithfulness": faithfulness, **out}


def faithfulness_interval(kept: Tensor, ablated: Tensor, clean: Tensor, n_resamples: int,
                           level: float) -> tuple[float, float] | None:
    """``(m_kept - m_ablated) / (m_clean - m_ablated)`` over resamples of the pairs (each ``[pair]``): the ratio of
    resampled means, as the figure itself is; None where some resample has ``m_clean = m_ablated`` (few pairs, a
    coarse dtype: the ratio is undefined there)."""
    from circuitkit.uncertainty import bootstrap_ci

    stacked = torch.stack([kept.double(), ablated.double(), clean.double()], dim=1)
    try:
        lo, hi = bootstrap_ci(stacked, n_resamples, level,
                              statistic=lambda m: ((m[:, 0] - m[:, 1]) / (m[:, 2] - m[:, 1]))[:, None])
    except CircuitkitError:
        return None
    return float(lo[0]), float(hi[0])


def other_set_figures(other: TaskRunner, which: str, curve: tuple, n: int, node_scores: Tensor, rank: str,
               mlp_nodes: bool, edges: tuple[str, ...], total: int | None = None,
               types: dict[str, Tensor] | None = None, n_resamples: int = 1000,
               ci_level: float = 0.95) -> dict[str, Any]:
    """The circuit's figures on the set the search did not use: faithfulness at every size of the node curve (the
    same top-``n`` node sets, one stacked pass; ``total``, every node kept, is the clean run, and every node patched
    often the corrupted run: neither run again), the chosen circuit's (``n`` nodes) faithfulness and necessity, and
    the edge circuit's faithfulness (one pass); ``ci``: the three's percentile bootstrap intervals over this set's
    pairs (each from its pairs' metric in the passes above, as the discovery figures' are).
    ``types``: the further node types' scores (``[layer, nodes]`` by type), ranked with the heads."""
    from circuitkit.circuits.curve import faithfulness_of, has_gap
    from circuitkit.tasks.circuit import MIN_TASK_GAP, node_masks, sender_scores, typed_order

    graph = other.graph
    scores = sender_scores(graph, node_scores, mlp_nodes and graph.mlps) | dict(types or {})
    order = typed_order(scores, rank)
    shapes = {name: tuple(grid.shape) for name, grid in scores.items()}
    sizes = sorted({p.size for p in curve} | {0, n})
    run = [k for k in sizes if 0 < k and (total is None or k < total)]
    built = [node_masks(order[:k], shapes) for k in run]
    stacked = {k: torch.stack([b[k] for b in built]) for k in shapes} if run else None
    # every node patched (size 0): the corrupted run where it is that and pays; where it runs, the sizes resume from it
    all_patched_pairs = other.all_patched_metric(tuple(shapes), stacked)  # [pair]
    known = {0: float(all_patched_pairs.mean())}
    measured_pairs = other.patched_metric(stacked, per_pair=True) if run else None  # [size, pair] (CPU)
    measured = measured_pairs.mean(-1).tolist() if run else []
    # only the circuit patched (necessity): a pass of its own, which resumes at the circuit's lowest layer
    only_pairs = other.patched_metric({k: (~v)[None] for k, v in node_masks(order[:n], shapes).items()},
                                      per_pair=True)[0]
    only = float(only_pairs.mean())
    clean = float(other.clean["metric"].mean())
    values = [measured[run.index(k)] if k in run else known.get(k, clean) for k in sizes]
    at_n = measured_pairs[run.index(n)] if n in run else all_patched_pairs if n == 0 else other.clean["metric"]
    all_patched = values[sizes.index(0)]
    out: dict[str, Any] = {"set": which, "pairs": other.batch.n_pairs, "clean": clean,
                           "corrupted": float(other.corrupted["metric"].mean()),
                           "metric_all_nodes_patched": all_patched, "necessity": clean - only}
    if not has_gap(clean, all_patched, MIN_TASK_GAP):
        out.update(curve=[], faithfulness=None, edge_faithfulness=None,
                   note="the corrupted prompts of this set do not change the metric")
        return out
    out["curve"] = [{"size": k, "faithfulness": faithfulness_of(v, clean, all_patched), "metric": v}
                    for k, v in zip(sizes, values, strict=True)]
    out["faithfulness"] = out["curve"][sizes.index(n)]["faithfulness"]
    out["edge_faithfulness"] = None
    intervals = circuit_intervals({"circuit": at_n, "all_patched": all_patched_pairs, "only_circuit": only_pairs},
                                   other.clean["metric"], n_resamples, ci_level)
    if edges:
        kept = torch.zeros_like(graph.allowed)
        for edge in edges:
            sender, receiver = edge.split("->")
            kept[graph.senders.index(sender), graph.receivers.index(receiver)] = True
        corrupted = float(other.corrupted["metric"].mean())
        if has_gap(clean, corrupted, MIN_TASK_GAP):
            edge_pairs: list[Tensor] = []
            out["edge_faithfulness"] = faithfulness_of(float(other.edge_metric(kept[None], edge_pairs)[0]), clean,
                                                       corrupted)
            edge = (None if other.batch.n_pairs < 2 else faithfulness_interval(
                edge_pairs[0][0], other.corrupted["metric"], other.clean["metric"], n_resamples, ci_level))
            if edge is not None:
                intervals["edge_faithfulness"] = edge
    if intervals:
        out["ci"] = {key: [lo, hi] for key, (lo, hi) in intervals.items()}
    return out


__all__ = ["circuit_intervals", "faithfulness_interval", "other_set_figures"]
