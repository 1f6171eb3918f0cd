"""What removing a head does to the repeated-copies loss: :class:`HeadEffects` (estimated or exact, per head) and
:class:`Agreement` (how well the estimate predicted the exact rise).

Why a module of its own: ``detect.ablation`` and ``detect.attribution`` build these records and
``detect.agreement`` compares them; the scan's result (:mod:`circuitkit.scan_types`, which re-exports both) and the
report only read them, so they live here, below everything that reads them.

All tensors are float32 on the CPU. Shapes: ``L`` layers, ``H`` query heads.
"""

from __future__ import annotations

from dataclasses import dataclass

from jaxtyping import Bool, Float
from torch import Tensor

from circuitkit.ranking import Head


@dataclass(frozen=True)
class HeadEffects:
    """Effect of removing each head on the repeated-copies loss (nats; positive = the loss rises).

    ``effect[layer, head]``: for ``kind="attribution"`` the first-order estimate for every head; for
    ``kind="ablation"`` the exact rise where ``exact[layer, head]`` is True and NaN elsewhere (not ablated).
    ``per_sequence`` ``[batch, layer, head]`` (where kept): each sequence's value, whose batch mean is ``effect``
    (the exact rise of that sequence's loss; for attribution, the sequence's term of the estimate times the batch
    size), what :mod:`circuitkit.uncertainty` resamples for the intervals; no extra pass.
    """

    kind: str  # "attribution" | "ablation"
    method: str  # "mean" | "zero"
    clean_loss: float
    effect: Float[Tensor, "layer head"]
    exact: Bool[Tensor, "layer head"] | None = None
    per_sequence: Float[Tensor, "batch layer head"] | None = None

    @property
    def delta(self) -> Float[Tensor, "layer head"]:
        """Same as ``effect``: the loss rise."""
        return self.effect

    @property
    def loss(self) -> Float[Tensor, "layer head"]:
        """The repeated-copies loss with each head removed: ``clean_loss + effect``."""
        return self.clean_loss + self.effect

    def top(self, k: int = 5, *, absolute: bool = False) -> list[tuple[Head, float]]:
        """The ``k`` heads with the largest effect (``absolute``: largest ``|effect|``), NaN last."""
        from circuitkit.ranking import top_heads
        from circuitkit.validate import boolean

        return top_heads(self.effect, k, absolute=boolean("HeadEffects.top: absolute", absolute))


@dataclass(frozen=True)
class Agreement:
    """How well attribution predicted exact ablation on the heads ablated exactly.

    ``spearman``: rank correlation of estimate vs exact over those heads (None with fewer than 3);
    ``largest_miss``: the head with the largest ``|estimate - exact|`` and both values.
    """

    n_exact: int
    spearman: float | None
    largest_miss: tuple[Head, float, float] | None  # (head, exact, estimate)


__all__ = ["Agreement", "HeadEffects"]
