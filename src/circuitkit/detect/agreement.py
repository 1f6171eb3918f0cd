"""How far to trust attribution: its agreement with exact ablation on the heads ablated exactly.

Why: attribution is a linear estimate. Where the loss responds nonlinearly to a head (a saturated softmax, a
head whose removal changes the prediction outright) the estimate can be far off, and a reader must be told.
Two numbers say it: the Spearman rank correlation of estimate against exact over the exactly ablated heads
(does attribution rank heads as ablation does?) and the largest miss ``|estimate - exact|`` with its head.

Spearman's rho is the Pearson correlation of the two rank vectors, ties given their average rank. It is
undefined (None) with fewer than :data:`MIN_HEADS_FOR_RANK_CORRELATION` heads, or when either side is constant.
"""

from __future__ import annotations

import torch
from torch import Tensor

from circuitkit import validate
from circuitkit.detect.effects import Agreement, HeadEffects

MIN_HEADS_FOR_RANK_CORRELATION = 3
"""With two heads a rank correlation is always +1 or -1: it says nothing."""


def average_ranks(values: Tensor) -> Tensor:
    """Ranks ``0 .. n-1`` of a 1-d tensor (float64), tied values sharing the mean of their ranks."""
    values = values.double()
    order = values.argsort(stable=True)
    ranks = torch.empty_like(values)
    ranks[order] = torch.arange(len(values), dtype=torch.float64, device=values.device)
    for value in values.unique():
        tied = values == value
        if int(tied.sum()) > 1:
            ranks[tied] = ranks[tied].mean()
    return ranks


def spearman(a: Tensor, b: Tensor) -> float | None:
    """Spearman rank correlation of two equal-length 1-d tensors (None if undefined, see the module docstring)."""
    if len(a) < MIN_HEADS_FOR_RANK_CORRELATION:
        return None
    ra, rb = average_ranks(a), average_ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    norm = float(ra.norm() * rb.norm())
    if norm == 0.0:
        return None
    return float((ra * rb).sum()) / norm


def agreement(attribution: HeadEffects, ablation: HeadEffects) -> Agreement:
    """Compare ``attribution`` (``kind="attribution"``) with ``ablation`` (``kind="ablation"``) on the heads
    ``ablation.exact`` marks. Returns :class:`~circuitkit.scan_types.Agreement`: ``n_exact``, ``spearman``
    (None with fewer than 3 heads or a constant side) and ``largest_miss = (head, exact, estimate)`` (None when
    no head was ablated)."""
    for name, effects, kind in (("attribution", attribution, "attribution"), ("ablation", ablation, "ablation")):
        if not isinstance(effects, HeadEffects) or effects.kind != kind:
            raise validate.fail(f"agreement: {name}", effects, f"HeadEffects with kind={kind!r}")
    if ablation.exact is None:
        raise validate.fail(
            "agreement: ablation", ablation, "HeadEffects whose exact mask says which heads were ablated"
        )
    if attribution.effect.shape != ablation.effect.shape:
        raise validate.fail(
            "agreement: attribution",
            validate.given(f"effects of shape {tuple(attribution.effect.shape)}"),
            f"the ablation's shape {tuple(ablation.effect.shape)} (the same model)",
        )
    if attribution.method != ablation.method:
        raise validate.fail(
            "agreement: attribution", validate.given(f"method {attribution.method!r}"),
            f"the ablation's method {ablation.method!r} (estimate and exact of the same ablation)",
        )
    heads = ablation.exact.nonzero().tolist()
    if not heads:
        return Agreement(n_exact=0, spearman=None, largest_miss=None)
    exact = ablation.effect[ablation.exact].double()
    estimate = attribution.effect[ablation.exact].double()
    miss = (estimate - exact).abs()
    worst = int(miss.argmax())
    layer, head = heads[worst]
    return Agreement(
        n_exact=len(heads),
        spearman=spearman(estimate, exact),
        largest_miss=((int(layer), int(head)), float(exact[worst]), float(estimate[worst])),
    )


__all__ = ["MIN_HEADS_FOR_RANK_CORRELATION", "agreement", "average_ranks", "spearman"]
