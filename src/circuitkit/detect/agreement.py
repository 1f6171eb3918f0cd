"""How far to trust attribution: its agreement with exact ablation on the heads ablated exactly.

Why: attribution is a linear estimate. Where the loss responds nonlinearly to a head (a saturated softmax, a
head whose removal changes the prediction outright) the estimate can be far off, and a reader must be told.
Two numbers say it: the Spearman rank correlation of estimate against exact over the exactly ablated heads
(does attribution rank heads as ablation does?) and the largest miss ``|estimate - exact|`` with its head.

Spearman's rho is the Pearson correlation of the two rank vectors, ties given their average rank. It is
undefined (None) with fewer than :data:`MIN_HEADS_FOR_RANK_CORRELATION` heads, or when either side is constant.

How far to trust the figure itself: it is taken over the heads ablated exactly (a scan's top few by |estimate| and a
called head per role, or every head), and over a handful of heads a rank correlation swings widely with the batch:
eight heads ranked well by a good estimate can give 0.0. :func:`agreement_interval` is its percentile bootstrap
interval over the batch's sequences (:mod:`circuitkit.uncertainty`: each resample's estimate and exact effects are
the means of the drawn sequences' values, ranked again), and below :data:`MIN_HEADS_TO_JUDGE` heads the answer says
"too few heads to judge" instead of reading the figure as the estimate's quality (:func:`judged`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from circuitkit import validate
from circuitkit.detect.effects import Agreement, HeadEffects
from circuitkit.uncertainty import DEFAULT_LEVEL, DEFAULT_RESAMPLES, DEFAULT_SEED, percentile_interval, resample_counts

DEFAULT_ABLATE_TOP = 8
"""Heads ablated (the induction scan) or patched (a task scan, ``ablate="top"``) exactly one at a time, the top by
|estimate|: the induction scan adds at most one called head per kind (:func:`circuitkit.pipeline.exact_set`), each
about one resumed pass of the batch; a task's heads about half a pass of its pairs each. The exact set feeds the
agreement figure and the table (the circuit searches rank heads on their own joint path); 8 keeps the induction scan
near 24 counted passes on GPT-2-small / SmolLM shapes, Spearman over the set measured in benchmarks/README.md
("Scan"). Over 8 heads the answer calls the figure too few heads to judge (:data:`MIN_HEADS_TO_JUDGE`): ask for
more (``ablate_top``) or every head (``"all"``) to judge it."""

def check_ablate_top(where: str, ablate: str, ablate_top: object) -> int:
    """``ablate_top`` checked (a count of at least 1; None: :data:`DEFAULT_ABLATE_TOP`), given only beside
    ``ablate="top"``, the selection it counts: elsewhere it would do nothing, and is refused."""
    if ablate_top is None:
        return DEFAULT_ABLATE_TOP
    if ablate != "top":
        raise validate.fail(f"{where}: ablate_top", ablate_top, f"None beside ablate={ablate!r} (it counts the heads "
                            "chosen under ablate='top')")
    return validate.positive_int(f"{where}: ablate_top", ablate_top)


MIN_HEADS_FOR_RANK_CORRELATION = 3
"""With two heads a rank correlation is always +1 or -1: it says nothing."""

MIN_HEADS_TO_JUDGE = 10
"""Fewer heads than this and the answer calls the agreement "too few heads to judge": over 8 heads a Spearman of
0.9 has a 95% interval of roughly [0.5, 1] under a normal approximation (Fisher's z, standard error
``1.03 / sqrt(n - 3)``), wide enough to hold both a good and a poor estimate."""

_RANK_ROWS = 64
"""Resamples ranked together (``[rows, n, n]`` comparisons held at once)."""


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


def spearman_rows(a: Tensor, b: Tensor) -> Tensor:
    """Spearman of each row pair of ``a``, ``b`` ``[R, n]`` (average ranks for ties), NaN where a row is constant."""
    out = []
    for first in range(0, a.shape[0], _RANK_ROWS):
        ranks = []
        for x in (a[first : first + _RANK_ROWS], b[first : first + _RANK_ROWS]):
            below = (x[:, :, None] > x[:, None, :]).sum(dim=2).double()
            tied = (x[:, :, None] == x[:, None, :]).sum(dim=2).double()
            r = below + (tied - 1) / 2  # 0-based average rank
            ranks.append(r - r.mean(dim=1, keepdim=True))
        ra, rb = ranks
        norm = ra.norm(dim=1) * rb.norm(dim=1)
        out.append(torch.where(norm > 0, (ra * rb).sum(dim=1) / norm, torch.full_like(norm, float("nan"))))
    return torch.cat(out)


def judged(n_exact: int) -> bool:
    """Whether an agreement over ``n_exact`` heads is read as the estimate's quality (:data:`MIN_HEADS_TO_JUDGE`)."""
    return n_exact >= MIN_HEADS_TO_JUDGE


def agreement_interval(attribution: HeadEffects, ablation: HeadEffects, n_resamples: int = DEFAULT_RESAMPLES,
                       level: float = DEFAULT_LEVEL, seed: int = DEFAULT_SEED) -> tuple[float, float] | None:
    """Percentile bootstrap interval of :func:`agreement`'s Spearman over the batch's sequences: resample ``r``
    draws sequences with the counts of :func:`~circuitkit.uncertainty.resample_counts` (the draw every figure of the
    batch shares), averages both sides' per-sequence values over them and ranks the ``n`` exact heads again.
    None where it cannot be judged or made: fewer than :data:`MIN_HEADS_TO_JUDGE` heads, a batch of one, either side
    without per-sequence values, or resamples whose ranking is undefined (a constant side)."""
    if ablation.exact is None or attribution.per_sequence is None or ablation.per_sequence is None:
        return None
    mask = ablation.exact
    n = int(mask.sum())
    batch = ablation.per_sequence.shape[0]
    if not judged(n) or batch < 2 or attribution.per_sequence.shape[0] != batch:
        return None
    estimate = attribution.per_sequence[:, mask].double()  # [batch, n]
    exact = ablation.per_sequence[:, mask].double()
    counts = resample_counts(batch, n_resamples, seed)  # [R, batch]
    rho = spearman_rows(counts @ estimate / batch, counts @ exact / batch)
    if not bool(torch.isfinite(rho).all()):
        return None
    lo, hi = percentile_interval(rho, level)
    return float(lo), float(hi)


def selection_text(ablate: str, ablate_top: int) -> str:
    """Which heads a scan ablated exactly, in words (its ``ablate`` and ``ablate_top`` settings)."""
    if ablate == "all":
        return "every head"
    return f"the top {ablate_top} by |estimate| plus a called head per role"


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


__all__ = ["MIN_HEADS_FOR_RANK_CORRELATION", "MIN_HEADS_TO_JUDGE", "agreement", "agreement_interval", "average_ranks",
           "judged", "selection_text", "spearman", "spearman_rows"]
