"""What a task scan's ``scores.json`` holds beyond its figures' summary, so that the file rebuilds the scan.

Why: :meth:`TaskScan.load <circuitkit.tasks.TaskScan.load>` must give back a scan equal in every figure to the one
saved, so the file holds every tensor the scan holds, exactly: the per-pair metric (``pairs.clean`` /
``pairs.corrupted``, ``[pair]``), every pair and its marks (the :class:`~circuitkit.tasks.Task`), the attention of
every head on the first clean prompt (``patterns``, ``[layer, head, q, k]``) and the node circuit's own clean and
corrupted means. Numbers are written exactly: a float32 value with 9 significant digits (which read back as float32
give the same bits), anything else with Python's shortest round-trip repr; ``dtype`` names the tensors' dtype, and
the loader builds them in it. ``units`` says the unit of every figure (:func:`task_units`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

TASK_FORMAT = 2
"""Version of a task scan's ``scores.json`` (2: every figure exact, the pairs, the per-pair metric, the attention on
the first clean prompt, ``units``)."""
FLOAT32_DIGITS = 9
"""Significant digits that give back every float32 exactly (IEEE 754: 9 for binary32)."""
DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}
"""The tensor dtypes a task scan's file may name (``dtype``)."""


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"`` (one of :data:`DTYPES`; anything else is written as float64)."""
    return next((name for name, d in DTYPES.items() if d == dtype), "float64")


def exact(value: Any, dtype: torch.dtype = torch.float64) -> float | None:
    """``value`` as a JSON number that reads back to the same ``dtype`` value (None for NaN and infinities, as every
    ``scores.json`` writes them)."""
    value = float(value)
    if not math.isfinite(value):
        return None
    if dtype in (torch.float32, torch.float16, torch.bfloat16):
        return float(f"{value:.{FLOAT32_DIGITS}g}")
    return value


def nested(tensor: Tensor | None) -> Any:
    """A tensor of any rank as nested lists of :func:`exact` numbers (None stays None)."""
    if tensor is None:
        return None
    dtype = tensor.dtype
    flat = [exact(v, dtype) for v in tensor.detach().cpu().reshape(-1).tolist()]
    for size in reversed(tensor.shape[1:]):
        flat = [flat[i:i + size] for i in range(0, len(flat), size)]
    return flat if tensor.dim() else flat[0]


def pairs_json(scan: Any) -> dict[str, Any]:
    """Every pair of the task (:meth:`Pair.to_json`), its marks (or None), its scored positions (where it has
    them) and the metric of each pair on its clean and corrupted prompt, in the task's order."""
    task = scan.task
    out = {"prompts": [p.to_json() for p in task.pairs],
           "marks": [dict(m) for m in task.marks] if task.marks else None,
           "clean": nested(scan.clean), "corrupted": nested(scan.corrupted)}
    if task.scored:  # written only where the task has them (a scored metric's positions)
        out["scored"] = [list(row) for row in task.scored]
    return out


def circuit_extra(circuit: Any) -> dict[str, Any]:
    """The node circuit's fields its own JSON leaves out: the mean metric on the pairs the search ran on, clean and
    with every node patched (``metric_all_nodes_patched`` is written by the circuit)."""
    return {"metric_clean": circuit.clean, "metric_corrupted": circuit.corrupted}


def task_units(scan: Any) -> dict[str, str]:
    """The unit of every figure of a task scan's ``scores.json`` (``field -> unit``; ``heads.NAME`` for each of the
    task's own head scores and each pattern score)."""
    from circuitkit.graph.metrics import dla_meaning, metric_label, metric_units

    metric = f"{metric_units(scan.task.metric)} (the task's metric, {metric_label(scan.task.metric)})"
    out = {
        "task.clean": f"{metric}: the mean over pairs on the clean prompts",
        "task.corrupted": f"{metric}: the mean over pairs on the corrupted prompts",
        "pairs.clean": f"{metric}, per pair",
        "pairs.corrupted": f"{metric}, per pair",
        "heads.dla": f"logits: DLA, {dla_meaning(scan.task.metric)}; mean over pairs",
        "heads.score": f"{metric}: EAP-IG estimate of the metric lost when the head is patched",
        "mlps.dla": "logits, as heads.dla",
        "mlps.score": f"{metric}, as heads.score",
        "patterns": "attention weights in [0, 1], [layer][head][query][key] on the first clean prompt",
        "circuit.faithfulness": "fraction (m_C - m_corr) / (m_clean - m_corr): 1 = the circuit alone recovers the "
                                "clean behaviour",
        "circuit.necessity": f"{metric}: lost when only the circuit is patched",
        "circuit.curve.metric": metric,
        "circuit.edge_faithfulness": "fraction, as circuit.faithfulness",
        "circuit.cpr": "MIB's CPR: area under the edge faithfulness curve (edges ranked by signed score) over the "
                       "fraction of edges, 0.001 to 1 (higher is better)",
        "circuit.cmd": "MIB's CMD: area between 1 and the curve of edges ranked by absolute score (lower is better)",
        "circuit.cpr_cmd": "MIB's curves under both rankings (faithfulness at int(fraction * edges_total) edges) and "
                           "both areas of each",
        "circuit.edge_effects.score": f"{metric}: EAP-IG estimate",
        "circuit.edge_effects.effect": f"{metric}: exact, path patching",
        "stages.passes": "forward passes, each of the pairs of the set the stage ran on (the discovery or the "
                         "evaluation pairs where they are split, else every pair); a backward pass counts two",
        "stages.seconds": "seconds of wall-clock time",
        "ci": "[lo, hi]: the percentile bootstrap interval over the pairs (settings.ci_level), in the unit of the "
              "figure beside it",
    }
    if getattr(scan, "ranking", None) is not None:  # the joint path's shares ordered the nodes
        out["heads.joint"] = (f"{metric}: the head's share of the metric's change along the joint path from every "
                              "node patched to none (what ordered the nodes)")
        out["mlps.joint"] = f"{metric}, as heads.joint"
    for name, to, minus in scan.task.attention_scores:
        out[f"heads.{name}"] = (f"attention fraction from the last token to {to} minus to {minus}, in [-1, 1], mean "
                                "over pairs")
    for name in scan.pattern_scores:
        out.setdefault(f"heads.{name}", "attention fraction in [0, 1] (a registered pattern score)")
    return out


__all__ = ["DTYPES", "TASK_FORMAT", "circuit_extra", "dtype_name", "exact", "nested", "pairs_json", "task_units"]
