"""What random head sets of a circuit's size recover: the baseline a circuit's faithfulness is read against.

Why: a faithfulness of 0.8 means little if any 4 heads of 8 reach it. The baseline draws ``n_sets`` random sets of
the circuit's size two ways and measures each set's faithfulness exactly, as the circuit's is measured
(:mod:`circuitkit.circuits.faithfulness`: every head outside the set ablated):

- ``uniform``: ``k`` heads drawn uniformly without replacement from all ``L * H`` heads;
- ``layered``: in each layer, as many heads as the circuit has there, drawn uniformly from that layer's heads
  (the same per-layer distribution: a random set that is as deep as the circuit).

Cost: one stacked copy of the batch per set, ``2 * n_sets`` forward passes in all (the all-ablated and clean
losses are the search's). Seeded (``torch.Generator().manual_seed(seed)``) and deterministic.

Reported per kind: each set's faithfulness, their ``mean``, ``spread`` (the central ``level`` range of the sets:
where a random set of this size lands) and ``interval`` (the bootstrap interval of the mean over the batch's
sequences, the same draw as every other figure's, :mod:`circuitkit.uncertainty`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from circuitkit import validate
from circuitkit.circuits.curve import faithfulness_of
from circuitkit.errors import CircuitkitError
from circuitkit.ranking import Head
from circuitkit.uncertainty import bootstrap_ci

BASELINE_KINDS = ("uniform", "layered")
DEFAULT_RANDOM_SETS = 20
"""Random sets per kind where a baseline is asked for (``random_sets=True``): 40 stacked copies of the batch."""


@dataclass(frozen=True)
class SetBaseline:
    """Faithfulness of random head sets of one kind (module docstring)."""

    kind: str  # "uniform" | "layered"
    faithfulness: tuple[float, ...]  # one per set
    mean: float
    spread: tuple[float, float]  # central `level` range over the sets
    interval: tuple[float, float] | None  # bootstrap interval of the mean over the batch's sequences

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "mean": self.mean, "spread": list(self.spread),
                "ci": None if self.interval is None else list(self.interval), "faithfulness": list(self.faithfulness)}


@dataclass(frozen=True)
class RandomBaseline:
    """Random sets of ``size`` heads (``n_sets`` per kind, ``seed``): ``uniform`` and ``layered``
    :class:`SetBaseline`; ``passes``: forward passes of the batch spent."""

    size: int
    n_sets: int
    seed: int
    uniform: SetBaseline
    layered: SetBaseline
    passes: int

    def to_json(self) -> dict[str, Any]:
        return {"size": self.size, "n_sets": self.n_sets, "seed": self.seed, "passes": self.passes,
                "uniform": self.uniform.to_json(), "layered": self.layered.to_json()}


def random_sets(heads: Any, n_layers: int, n_heads: int, n_sets: int, seed: int, kind: str) -> Tensor:
    """``[n_sets, layer, head]`` bool, True on each random set's heads (module docstring for ``kind``)."""
    generator = torch.Generator().manual_seed(seed)
    out = torch.zeros(n_sets, n_layers, n_heads, dtype=torch.bool, device="cpu")
    if kind == "uniform":
        for s in range(n_sets):
            chosen = torch.randperm(n_layers * n_heads, generator=generator, device="cpu")[: len(heads)]
            out[s].view(-1)[chosen] = True
        return out
    per_layer = torch.zeros(n_layers, dtype=torch.long, device="cpu")
    for layer, _ in heads:
        per_layer[layer] += 1
    for s in range(n_sets):
        for layer in range(n_layers):
            chosen = torch.randperm(n_heads, generator=generator, device="cpu")[: int(per_layer[layer])]
            out[s, layer, chosen] = True
    return out


def measure(ablator: Any, heads: tuple[Head, ...], clean_loss: float, all_ablated: float, clean_each: Tensor | None,
            n_sets: int, seed: int, level: float, n_resamples: int, progress: Any = None) -> RandomBaseline:
    """:class:`RandomBaseline` of ``heads``' size on the search's ``ablator`` (``L_clean``, ``L_all`` measured by
    the search, which checked their gap)."""
    n_sets = validate.integer("random baseline: n_sets", n_sets, minimum=2, maximum=10_000)
    spec = ablator.adapter.spec
    L, H = spec.n_layers, spec.n_heads
    before = ablator.passes
    everything = torch.ones(L, H, dtype=torch.bool, device="cpu")
    all_each = ablator.sequence_losses(everything)
    found = {}
    for offset, kind in enumerate(BASELINE_KINDS):
        kept = random_sets(heads, L, H, n_sets, seed + offset, kind)
        losses = ablator.losses(~kept)
        # the gap L_all - L_clean was checked by the search that measured both
        values = tuple(faithfulness_of(loss, clean_loss, all_ablated) for loss in losses)
        each = None
        if clean_each is not None and all_each is not None and clean_each.numel() >= 2:
            kept_each = torch.stack([ablator.sequence_losses(~mask) for mask in kept]).double()  # [sets, batch]
            each = torch.cat([all_each.double()[:, None], clean_each.double()[:, None], kept_each.T], dim=1)
        found[kind] = set_baseline(kind, values, level, n_resamples, each)
    if progress is not None:
        progress(ablator.passes - before)
    return RandomBaseline(len(heads), n_sets, seed, found["uniform"], found["layered"], ablator.passes - before)


def set_baseline(kind: str, values: tuple[float, ...], level: float, n_resamples: int,
                 each: Tensor | None) -> SetBaseline:
    """One kind's :class:`SetBaseline` from each set's faithfulness ``values``: their mean, their central ``level``
    range and, from ``each`` ``[sequence, 2 + sets]`` (per sequence: the metric with everything ablated or patched,
    the clean metric, each set's; None: no interval), the bootstrap interval of the mean faithfulness."""
    tail = (1 - level) / 2
    quantiles = torch.quantile(torch.tensor(values, dtype=torch.float64, device="cpu"),
                               torch.tensor([tail, 1 - tail], dtype=torch.float64, device="cpu"))
    interval = None
    if each is not None:
        try:  # the mean over sets of each set's faithfulness, every ratio of resampled means
            lo, hi = bootstrap_ci(each, n_resamples, level, 0, statistic=mean_faithfulness)
            interval = (float(lo), float(hi))
        except CircuitkitError:  # a resample where the heads move nothing: no interval
            interval = None
    return SetBaseline(kind, values, float(sum(values) / len(values)), (float(quantiles[0]), float(quantiles[1])),
                       interval)


def mean_faithfulness(means: Tensor) -> Tensor:
    """Statistic over resampled means ``[R, 2 + sets]`` (all ablated, clean, each set's kept loss): the mean over
    sets of each set's faithfulness ``(a - k_s) / (a - c)``."""
    return ((means[:, :1] - means[:, 2:]) / (means[:, :1] - means[:, 1:2])).mean(dim=1)


__all__ = ["BASELINE_KINDS", "DEFAULT_RANDOM_SETS", "RandomBaseline", "SetBaseline", "measure", "random_sets",
           "set_baseline"]
