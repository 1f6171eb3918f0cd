"""Confidence intervals of a found circuit's figures, from the per-sequence losses its search already measured.

Why apart: :mod:`circuitkit.circuits.faithfulness` measures; this module only resamples what it measured
(:mod:`circuitkit.uncertainty`: one seeded draw of the batch's sequences for every figure, so the faithfulness,
its curve and the losses it divides move together). No forward pass is run here: every set of heads whose loss a
figure needs was run by the search (the stacked passes keep each sequence's loss, ``Ablator.sequence_losses``).

With ``a_b``, ``c_b``, ``k_b`` sequence ``b``'s loss with every head ablated, nothing ablated, and every head outside
``C`` ablated (means ``a, c, k``)::

    faithfulness(C) = (a - k) / (a - c)           resampled as the same ratio of resampled means
    necessity(C)    = mean_b (n_b - c_b)          n_b: the loss with only C ablated

The curve's end points are fixed by definition (``n = 0``: 0, every head: 1) and get zero-width intervals.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

from circuitkit.errors import CircuitkitError
from circuitkit.ranking import Head
from circuitkit.uncertainty import bootstrap_ci


def head_mask(heads: Iterable[Head], n_layers: int, n_heads: int, *, keep: bool) -> Tensor:
    """``[layer, head]`` bool: True where a head is ablated (``keep``: every head but ``heads``; else ``heads``)."""
    inside = torch.zeros(n_layers, n_heads, dtype=torch.bool, device="cpu")
    for layer, head in heads:
        inside[layer, head] = True
    return ~inside if keep else inside


def faithfulness_ratio(means: Tensor) -> Tensor:
    """Statistic: ``(a - k) / (a - c)`` from resampled means ``[R, 3]`` of (all ablated, kept, clean) losses."""
    return (means[:, 0] - means[:, 1]) / (means[:, 0] - means[:, 2])


def faithfulness_interval(all_each: Tensor, kept_each: Tensor, clean_each: Tensor, n_resamples: int, level: float,
                          seed: int) -> tuple[float, float] | None:
    """The interval of ``(a - k) / (a - c)`` over the batch's sequences; None where a resample's gap vanishes."""
    values = torch.stack([all_each, kept_each, clean_each], dim=1).double()
    try:
        lo, hi = bootstrap_ci(values, n_resamples, level, seed, statistic=faithfulness_ratio)
    except CircuitkitError:  # some resample moves the loss by nothing: no interval, the figure stands alone
        return None
    return float(lo), float(hi)


def mean_interval(values: Tensor, n_resamples: int, level: float, seed: int) -> tuple[float, float]:
    lo, hi = bootstrap_ci(values.double(), n_resamples, level, seed)
    return float(lo), float(hi)


def circuit_intervals(ablator: Any, ranking: Sequence[Head], curve_sizes: Sequence[int], heads: Sequence[Head],
                      clean_each: Tensor, necessity: bool, n_resamples: int, level: float, seed: int
                      ) -> dict[str, Any]:
    """The intervals of a search's figures: ``faithfulness``, ``necessity`` (where measured), ``losses``
    (``clean``, ``all_ablated``, ``circuit_only``) and ``curve`` (``n_heads -> interval``). Empty where the
    batch has one sequence or a set's per-sequence losses were not kept."""
    spec = ablator.adapter.spec
    L, H = spec.n_layers, spec.n_heads
    if clean_each is None or clean_each.numel() < 2:
        return {}
    clean_each = clean_each.float().cpu()
    all_each = ablator.sequence_losses(torch.ones(L, H, dtype=torch.bool, device="cpu"))
    kept_each = ablator.sequence_losses(head_mask(heads, L, H, keep=True))
    if all_each is None or kept_each is None:
        return {}
    out: dict[str, Any] = {
        "faithfulness": faithfulness_interval(all_each, kept_each, clean_each, n_resamples, level, seed),
        "losses": {name: mean_interval(each, n_resamples, level, seed)
                   for name, each in (("clean", clean_each), ("all_ablated", all_each), ("circuit_only", kept_each))},
        "curve": {},
    }
    N = len(ranking)
    for n in curve_sizes:
        if n == 0:
            out["curve"][n] = (0.0, 0.0)
        elif n == N:
            out["curve"][n] = (1.0, 1.0)
        else:
            each = ablator.sequence_losses(head_mask(ranking[:n], L, H, keep=True))
            if each is not None:
                out["curve"][n] = faithfulness_interval(all_each, each, clean_each, n_resamples, level, seed)
    if necessity:
        removed = ablator.sequence_losses(head_mask(heads, L, H, keep=False))
        if removed is not None:
            out["necessity"] = mean_interval(removed - clean_each, n_resamples, level, seed)
    return out


__all__ = ["circuit_intervals", "faithfulness_interval", "faithfulness_ratio", "head_mask", "mean_interval"]
