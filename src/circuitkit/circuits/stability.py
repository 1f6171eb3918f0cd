"""Would another sample of prompts give the same circuit? The search rerun on bootstrap resamples of the batch.

Why: a circuit is found on one batch; a head that joins it on one sample and not on another is a weak claim.
Méloux et al. (2025) measure circuit stability as the mean pairwise Jaccard similarity of circuits found on
bootstrap resamples of the prompts (0.67 for GPT-2, 0.34-0.39 for Llama-3.2-1B) and propose >= 0.8 before calling
a circuit stable.

Here: draw ``n`` resamples of the batch's ``B`` sequences with replacement (:func:`circuitkit.uncertainty.
resample_counts`, seeded), rerun the whole search on each resampled batch as :func:`circuitkit.find_circuit` runs
it (its own ablation values, ranking and faithfulness; no necessity, no intervals), and report::

    inclusion[l, h] = #{resamples whose circuit holds (l, h)} / n
    jaccard         = mean over pairs i < j of |C_i & C_j| / |C_i | C_j|

Cost: ``n`` searches, each about what one :func:`find_circuit` costs (the attribution's forward and backward pass,
about ``2 log2(circuit size)`` search passes, one for the mean values, the joint ranking's ``3 * steps``):
:attr:`Stability.passes` counts them; opt-in everywhere.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from circuitkit.detect.tokens import TokenBatch
from circuitkit.errors import CircuitkitError
from circuitkit.ranking import Head, head_name
from circuitkit.uncertainty import resample_counts

STABLE_JACCARD = 0.8
"""Méloux et al. (2025): a method whose resampled circuits overlap at mean Jaccard >= 0.8 is called stable."""
ATTRIBUTION_PASSES = 3
"""The attribution ranking's forward and backward pass on each resample (a backward costs about two forwards)."""


@dataclass(frozen=True, eq=False)
class Stability:
    """The search rerun on ``n_resamples`` bootstrap resamples (module docstring): each resample's ``circuits``
    (``None`` where no head moved its loss), ``inclusion`` ``[layer, head]`` (the share of resamples whose circuit
    holds the head), the mean pairwise ``jaccard``, each rerun's ``faithfulness`` and the ``passes`` spent."""

    n_resamples: int
    seed: int
    circuits: tuple[tuple[Head, ...] | None, ...]
    inclusion: Tensor
    jaccard: float | None
    faithfulness: tuple[float | None, ...]
    passes: float

    @property
    def stable(self) -> bool:
        """Mean pairwise Jaccard at least :data:`STABLE_JACCARD`."""
        return self.jaccard is not None and self.jaccard >= STABLE_JACCARD

    def frequency(self, head: Head) -> float:
        return float(self.inclusion[head[0], head[1]])

    def ranked(self) -> list[tuple[Head, float]]:
        """Every head in some resampled circuit, most often first (ties in ``(layer, head)`` order)."""
        L, H = self.inclusion.shape
        heads = [((a, b), float(self.inclusion[a, b])) for a in range(L) for b in range(H) if self.inclusion[a, b] > 0]
        return sorted(heads, key=lambda item: -item[1])

    def to_json(self) -> dict[str, Any]:
        return {
            "n_resamples": self.n_resamples, "seed": self.seed, "jaccard": self.jaccard, "stable": self.stable,
            "inclusion": {head_name(h): f for h, f in self.ranked()},
            "sizes": [None if c is None else len(c) for c in self.circuits],
            "faithfulness": list(self.faithfulness), "passes": self.passes,
        }

    def __repr__(self) -> str:
        jaccard = "n/a" if self.jaccard is None else f"{self.jaccard:.2f}"
        top = ", ".join(f"{head_name(h)} {f:.0%}" for h, f in self.ranked()[:6])
        return f"Stability({self.n_resamples} resamples, mean pairwise Jaccard {jaccard}; inclusion {top})"


def jaccard(a: set[Head], b: set[Head]) -> float:
    """``|a & b| / |a | b|`` (1 for two empty sets)."""
    union = a | b
    return 1.0 if not union else len(a & b) / len(union)


def mean_pairwise_jaccard(circuits: list[tuple[Head, ...]]) -> float | None:
    """Mean Jaccard over every pair of ``circuits``; None with fewer than two."""
    pairs = [jaccard(set(a), set(b)) for a, b in itertools.combinations(circuits, 2)]
    return sum(pairs) / len(pairs) if pairs else None


def resampled_batch(batch: TokenBatch, counts: Tensor) -> TokenBatch:
    """``batch`` with sequence ``i`` taken ``counts[i]`` times (a bootstrap resample; order by sequence)."""
    rows = torch.arange(batch.tokens.shape[0], device="cpu")
    index = torch.repeat_interleave(rows, counts.long().cpu()).to(batch.tokens.device)
    return TokenBatch(batch.tokens[index], batch.block_len, batch.n_repeats, batch.bos)


def rerun(adapter: Any, batch: TokenBatch, n_resamples: int, search: Callable[[Any, TokenBatch], tuple[Any, float]],
          *, seed: int = 0, progress: Any = None) -> Stability:
    """:class:`Stability` of a search: ``search(adapter, batch) -> (Circuit, passes)`` (e.g.
    :func:`circuitkit.circuits.faithfulness.resampled_search`) rerun on ``n_resamples`` resamples of ``batch``.
    ``progress(passes)`` after each."""
    spec = adapter.spec
    counts = resample_counts(batch.tokens.shape[0], n_resamples, seed)
    circuits: list[tuple[Head, ...] | None] = []
    faithfulness: list[float | None] = []
    passes = 0.0
    for row in counts:
        try:
            found, spent = search(adapter, resampled_batch(batch, row))
        except CircuitkitError:  # no head moves this resample's loss: no circuit on it
            circuits.append(None)
            faithfulness.append(None)
            spent = 1 + ATTRIBUTION_PASSES
        else:
            circuits.append(tuple(found.heads))
            faithfulness.append(float(found.faithfulness))
        passes += spent
        if progress is not None:
            progress(spent)
    inclusion = torch.zeros(spec.n_layers, spec.n_heads, device="cpu")
    for heads in circuits:
        for layer, head in heads or ():
            inclusion[layer, head] += 1.0
    inclusion /= n_resamples
    found_circuits = [c for c in circuits if c is not None]
    return Stability(n_resamples, seed, tuple(circuits), inclusion, mean_pairwise_jaccard(found_circuits),
                     tuple(faithfulness), passes)


__all__ = ["STABLE_JACCARD", "Stability", "jaccard", "mean_pairwise_jaccard", "rerun"]
