"""How much a task's node circuit means: random node sets of its size, and the search rerun on resampled pairs.

Both are the induction scan's (:mod:`circuitkit.circuits.baseline`, :mod:`circuitkit.circuits.stability`) on a
task's pairs, with the task's faithfulness ``(m_C - m_all) / (m_clean - m_all)`` (``m_all``: every node patched):

- **random sets** (:func:`random_node_sets`): ``n_sets`` random head sets of the circuit's head count per kind,
  ``uniform`` over every head and ``layered`` (as many heads in each layer as the circuit has there), each
  measured exactly as the circuit is (every head outside the set patched; MLP nodes, where MLPs are nodes, as in
  the circuit). One stacked copy of the pairs per set, ``2 * n_sets`` passes. Reported per kind: each set's
  faithfulness, their mean, the central ``level`` range over the sets and the bootstrap interval of the mean over
  the pairs.
- **stability** (:func:`node_stability`): the pairs the search ran on resampled with replacement ``n`` times
  (seeded), and on each resample the whole node search rerun (its own clean and corrupted runs, EAP-IG ranking and
  search); reported: each head's inclusion frequency and the circuits' mean pairwise Jaccard (Méloux et al. 2025
  call >= 0.8 stable).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from circuitkit.circuits.baseline import BASELINE_KINDS, RandomBaseline, random_sets, set_baseline
from circuitkit.circuits.curve import NoBehaviour, faithfulness_of
from circuitkit.circuits.stability import Stability, mean_pairwise_jaccard
from circuitkit.graph.runner import TaskRunner
from circuitkit.graph.task import UserMetric
from circuitkit.tasks.circuit import node_circuit
from circuitkit.uncertainty import resample_counts


def random_node_sets(runner: TaskRunner, heads: tuple, mlps: tuple, mlp_nodes: bool, all_patched: Tensor,
                     n_sets: int, seed: int, level: float, n_resamples: int, progress: Any = None) -> RandomBaseline:
    """:class:`~circuitkit.circuits.baseline.RandomBaseline` of the circuit ``heads`` (and its ``mlps``, kept in
    every set where MLPs are nodes: ``mlp_nodes``) on ``runner``'s pairs; ``all_patched``: each pair's metric with
    every node patched ``[pair]`` (measured by the search, which checked the gap)."""
    spec = runner.spec
    L, H = spec.n_layers, spec.n_heads
    clean_each = runner.clean["metric"].double()
    clean, everything = float(clean_each.mean()), float(all_patched.mean())
    mlp_mask = None
    if mlp_nodes:
        mlp_mask = torch.ones(L, dtype=torch.bool, device="cpu")
        mlp_mask[list(mlps)] = False
    before = runner.passes
    found = {}
    for offset, kind in enumerate(BASELINE_KINDS):
        kept = random_sets(heads, L, H, n_sets, seed + offset, kind)
        patched_mlps = None if mlp_mask is None else mlp_mask[None].expand(n_sets, L)
        each = runner.node_metric(~kept, patched_mlps, per_pair=True).double()  # [sets, pair]
        values = tuple(float(faithfulness_of(m, clean, everything)) for m in each.mean(dim=1).tolist())
        # (a - k_s) / (a - c) with a = m_all, c = m_clean, k_s = m_s: the task's faithfulness of each set
        stacked = (torch.cat([all_patched.double()[:, None], clean_each[:, None], each.T], dim=1)
                   if clean_each.numel() >= 2 else None)
        found[kind] = set_baseline(kind, values, level, n_resamples, stacked)
        if progress is not None:
            progress()
    return RandomBaseline(len(heads), n_sets, seed, found["uniform"], found["layered"], int(runner.passes - before))


def node_stability(runner: TaskRunner, n_resamples: int, steps: int, target: float, rank: str, mlp_nodes: bool,
                   seed: int = 0, progress: Any = None, points: str = "left", ranking: str = "joint") -> Stability:
    """:class:`~circuitkit.circuits.stability.Stability` of the node search on ``runner``'s pairs: rerun on
    ``n_resamples`` bootstrap resamples of them (module docstring); a resample whose corrupted prompts change
    nothing has no circuit (None). ``progress(passes)`` after each rerun; ``points``: the scan's EAP-IG points;
    ``ranking``: what orders each rerun's nodes, as in the scan (:data:`~circuitkit.tasks.circuit.NODE_RANKINGS`)."""
    spec, batch = runner.spec, runner.batch
    counts = resample_counts(batch.n_pairs, n_resamples, seed)
    circuits: list[tuple | None] = []
    faithfulness: list[float | None] = []
    spent = 0.0
    for row in counts:
        index = torch.repeat_interleave(torch.arange(batch.n_pairs, device="cpu"), row.long())
        metric = runner.metric_fn if isinstance(runner.metric_fn, UserMetric) else runner.metric_name
        rerun = TaskRunner(runner.session, batch.subset(index), metric, mlps=runner.graph.mlps,
                           ablation=runner.ablation, budget=runner.budget)
        rerun.direct = False
        try:
            if ranking == "joint":
                node_scores, _ = rerun.joint_shares(mlp_nodes)
            elif not rerun.node_scores_from_outputs:
                _, node_scores = rerun.edge_gradients(steps, points)
            else:
                node_scores = rerun.node_gradients(steps, points)
            heads, _, faith, *_ = node_circuit(rerun, node_scores, target, rank, mlp_nodes=mlp_nodes)
        except NoBehaviour:
            circuits.append(None)
            faithfulness.append(None)
        else:
            circuits.append(tuple(heads))
            faithfulness.append(float(faith))
        spent += rerun.passes
        if progress is not None:
            progress(rerun.passes)
    inclusion = torch.zeros(spec.n_layers, spec.n_heads, device="cpu")
    for heads in circuits:
        for layer, head in heads or ():
            inclusion[layer, head] += 1.0
    inclusion /= n_resamples
    return Stability(n_resamples, seed, tuple(circuits), inclusion,
                     mean_pairwise_jaccard([c for c in circuits if c is not None]), tuple(faithfulness), spent)


__all__ = ["node_stability", "random_node_sets"]
