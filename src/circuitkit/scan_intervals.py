"""The bootstrap intervals of a scan's figures, from the per-sequence values its stages kept (no extra pass).

Why apart from the pipeline: the stages measure; this module resamples what they measured
(:func:`circuitkit.uncertainty.bootstrap_ci`, one seeded draw of the batch's sequences shared by every figure).
Every figure below is a function of batch means of values each stage already had per sequence:

==========================  ==================================================================================
figure                      per-sequence value (``[batch, ...]``), kept by
==========================  ==================================================================================
pattern head scores         attention on the targets summed over the sequence's rows, and the rows counted
                            (a ratio of means; :attr:`HeadScores.per_sequence`, the scores pass)
induction loss              the sequence's mean loss on the first copy / the repeated copies (the clean pass)
attribution                 the sequence's term of the estimate times the batch size (the backward pass)
exact ablation              the rise of the sequence's loss (the ablation passes)
agreement                   both of the above: Spearman of the resampled means over the exact heads
                              (:func:`circuitkit.detect.agreement.agreement_interval`; 10 heads or more)
circuit ablation            the rise of the sequence's loss with the group ablated (its pass)
faithfulness, necessity,    the sequence's loss with each measured head set ablated
  the curve, losses           (:mod:`circuitkit.circuits.intervals`: the search's stacked passes)
patched edges               the sequence's loss with the edge patched, minus its clean loss (path patching)
==========================  ==================================================================================

None of them needed an extra forward pass. Weight-only figures (composition, spectra, copying) have no sample of
sequences to resample and get no interval.

An interval of ``(lo, hi)`` floats for a scalar figure, ``(lo [L, H], hi [L, H])`` tensors for a per-head one
(NaN where the figure was not measured). A batch of one sequence gets none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from circuitkit.detect.agreement import agreement_interval
from circuitkit.errors import CircuitkitError
from circuitkit.uncertainty import bootstrap_ci, ratio_of_means

Interval = tuple[Any, Any]


def _cpu(values: Tensor) -> Tensor:
    """Per-sequence values as CPU float64, where every interval is computed (the passes that kept them may have run
    on a GPU)."""
    return values.detach().to("cpu", torch.float64)


def _pair(lo: Tensor, hi: Tensor) -> tuple[float, float]:
    return float(lo), float(hi)


def head_score_intervals(per_sequence: Mapping[str, tuple[Tensor, Tensor]], n_resamples: int, level: float,
                         seed: int) -> dict[str, Interval]:
    """Pattern score -> ``(lo [L, H], hi [L, H])``: the ratio of resampled means of attention on targets and rows."""
    out = {}
    for name, (attention, rows) in per_sequence.items():
        attention = _cpu(attention)
        values = torch.stack([attention, _cpu(rows)[:, None, None].expand_as(attention)], dim=1)
        if not bool(torch.isfinite(values).all()):  # NaN attention (reported with a warning): no interval
            continue
        try:
            out[name] = bootstrap_ci(values, n_resamples, level, seed, statistic=ratio_of_means)
        except CircuitkitError:  # some resample holds only sequences without a target row: no interval
            continue
    return out


def effect_intervals(per_sequence: Tensor | None, n_resamples: int, level: float, seed: int) -> Interval | None:
    """``(lo [L, H], hi [L, H])`` of a per-head effect from ``[batch, L, H]`` per-sequence values; NaN where a
    head was not measured (NaN per-sequence values)."""
    if per_sequence is None:
        return None
    per_sequence = _cpu(per_sequence)
    measured = torch.isfinite(per_sequence).all(dim=0)  # [L, H]
    lo = torch.full(measured.shape, float("nan"), dtype=torch.float64, device="cpu")
    hi = lo.clone()
    if bool(measured.any()):
        lo[measured], hi[measured] = bootstrap_ci(per_sequence[:, measured], n_resamples, level, seed)
    return lo, hi


def scan_intervals(*, head_scores: Any, run: Any, attribution: Any, ablation: Any,
                   circuit_ablation: Mapping[str, Tensor], edges: Any, n_resamples: int, level: float,
                   seed: int) -> dict[str, Any]:
    """Every interval of a scan's figures (module docstring), keyed like :class:`~circuitkit.scan_types.Scan`:
    ``head_scores`` (score -> per-head interval), ``induction_loss`` (``first_copy``, ``repeated_copies``),
    ``attribution`` and ``ablation`` (per head), ``agreement`` (its Spearman, where judged), ``circuit_ablation``
    (group label -> interval) and ``edges`` (``(src, dst, channel)`` -> interval of the patched effect: the edge
    record's own, which path patching bootstrapped with the scan's settings and the default seed). Empty for
    a batch of one sequence."""
    batch = run.batch
    if batch.tokens.shape[0] < 2:
        return {}
    clean = _cpu(run.repeated_per_sequence)
    out: dict[str, Any] = {
        "head_scores": head_score_intervals(getattr(head_scores, "per_sequence", {}), n_resamples, level, seed),
        "induction_loss": {
            "first_copy": _pair(*bootstrap_ci(_cpu(run.losses)[:, batch.first_copy].mean(dim=1), n_resamples,
                                              level, seed)),
            "repeated_copies": _pair(*bootstrap_ci(clean, n_resamples, level, seed)),
        },
        "circuit_ablation": {label: _pair(*bootstrap_ci(_cpu(each), n_resamples, level, seed))
                             for label, each in circuit_ablation.items()},
    }
    for kind, effects in (("attribution", attribution), ("ablation", ablation)):
        found = effect_intervals(getattr(effects, "per_sequence", None), n_resamples, level, seed)
        if found is not None:
            out[kind] = found
    found = agreement_interval(attribution, ablation, n_resamples, level, seed) if attribution and ablation else None
    if found is not None:
        out["agreement"] = found
    # each patched edge's interval is its record's: path patching bootstrapped each sequence's effect already, with
    # the scan's settings and seed (circuit_evidence is given them)
    out["edges"] = {(edge.src, edge.dst, edge.channel): edge.interval
                    for edge in getattr(edges, "edges", ()) or () if edge.interval is not None}
    return out


__all__ = ["effect_intervals", "head_score_intervals", "scan_intervals"]
