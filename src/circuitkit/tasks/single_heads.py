"""Each head patched alone, exactly, against its EAP-IG node score: how far a task scan's estimate can be trusted.

The induction scan ablates its top heads one at a time and compares the exact rise of the loss with attribution's
estimate (:mod:`circuitkit.detect.agreement`). A task scan does the same with its own figures (``ablate="top"`` or
``"all"``; opt-in): head ``h`` alone patched as the node circuit patches a node (from the corrupted prompt, or the
task's ablation), every other node clean, and the metric lost::

    exact(h) = m_clean - m_{h patched}          mean over the pairs; each pair's value kept for the interval

against its EAP-IG node score (the sum of its outgoing edges' scores: the first-order estimate of the same figure,
integrated along the input path, oriented the same way: positive where the head carries the behaviour). Two
numbers say how well one predicts the other (:func:`~circuitkit.detect.agreement.agreement`): the Spearman rank
correlation over the heads patched, and the largest miss ``|estimate - exact|`` with its head. Below
:data:`~circuitkit.detect.agreement.MIN_HEADS_TO_JUDGE` heads the answer says the figure is too few heads to judge.

Which heads: ``"top"``, the ``ablate_top`` heads with the largest ``|score|``; ``"all"``, every head. Cost: one
stacked copy of the pairs per head, each resumed at its head's layer from the clean run (the share of a pass the
layers from there are: on average about half a pass a head).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from circuitkit import validate
from circuitkit.detect.agreement import DEFAULT_ABLATE_TOP
from circuitkit.detect.effects import Agreement
from circuitkit.ranking import Head, head_name, top_heads

ABLATE_CHOICES = ("none", "top", "all")
DEFAULT_ABLATE = "none"
"""Off by default: the default IOI scan's passes stay within its plan (each head patched costs about half a pass
of the pairs)."""


@dataclass(frozen=True)
class SingleHeads:
    """Heads patched one at a time (module docstring): ``heads`` in the order they were chosen (largest ``|score|``
    first); ``exact`` ``[layer, head]`` (float32, CPU): each one's metric lost, NaN for a head not patched;
    ``estimate`` ``[layer, head]``: the EAP-IG node scores it is compared with; ``intervals``: each patched head's
    percentile bootstrap interval over the pairs (``"layer.head"`` -> ``(lo, hi)``; empty with fewer than 2 pairs);
    ``agreement``: :class:`~circuitkit.detect.effects.Agreement` (``n_exact``, ``spearman``, ``largest_miss``);
    ``selection``: which heads, in words; ``agreement_interval``: the Spearman correlation's percentile bootstrap
    interval over the pairs (:func:`~circuitkit.detect.agreement.agreement_interval`: both sides' per-pair values
    resampled together; None below :data:`~circuitkit.detect.agreement.MIN_HEADS_TO_JUDGE` heads or without each
    pair's term of the scores); ``each`` ``[head, pair]``: each pair's metric lost (what the intervals resample;
    not written)."""

    heads: tuple[Head, ...]
    exact: Tensor
    estimate: Tensor
    intervals: dict[str, tuple[float, float]]
    agreement: Agreement
    selection: str
    agreement_interval: tuple[float, float] | None = None
    each: Tensor | None = field(default=None, compare=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        """``scores.json``'s ``single_heads`` record (the exact grid is ``heads.exact``, the estimate
        ``heads.score``)."""
        miss = self.agreement.largest_miss
        return {"heads": [head_name(h) for h in self.heads], "selection": self.selection,
                "ci": {name: [float(lo), float(hi)] for name, (lo, hi) in self.intervals.items()},
                "agreement": {"n_exact": self.agreement.n_exact, "spearman": self.agreement.spearman,
                              "ci": None if self.agreement_interval is None else [
                                  float(self.agreement_interval[0]), float(self.agreement_interval[1])],
                              "largest_miss": None if miss is None else {
                                  "head": head_name(miss[0]), "exact": float(miss[1]), "estimate": float(miss[2])}}}


def check_ablate(ablate: Any, ablate_top: Any, where: str) -> tuple[str, int]:
    """``(ablate, ablate_top)`` checked: one of :data:`ABLATE_CHOICES`, and a count of at least 1 given only beside
    ``"top"`` (None: :data:`~circuitkit.detect.agreement.DEFAULT_ABLATE_TOP`)."""
    from circuitkit.detect.agreement import check_ablate_top

    ablate = validate.option(f"{where}: ablate", ablate, ABLATE_CHOICES)
    return ablate, check_ablate_top(where, ablate, ablate_top)


def planned_heads(ablate: str, ablate_top: int, n_heads: int) -> int:
    """How many of a model's ``n_heads`` heads :func:`chosen_heads` patches (known before any score)."""
    return {"none": 0, "top": min(ablate_top, n_heads), "all": n_heads}[ablate]


def chosen_heads(scores: Tensor, ablate: str, ablate_top: int) -> list[Head]:
    """The heads patched alone: every head (``"all"``) or the ``ablate_top`` with the largest ``|scores|``
    (``[layer, head]``), largest first."""
    L, H = scores.shape
    if ablate == "all":
        return [(layer, head) for layer in range(L) for head in range(H)]
    return [head for head, _ in top_heads(scores, min(ablate_top, L * H), absolute=True)]


def single_heads(runner: Any, scores: Tensor, ablate: str, ablate_top: int, n_resamples: int,
                 level: float, *, estimate_pairs: Tensor | None = None) -> SingleHeads:
    """Each chosen head (:func:`chosen_heads` of the EAP-IG node scores ``scores`` ``[layer, head]``) patched alone
    on ``runner``'s pairs (its clean run made), with the agreement of the scores with it (module docstring).
    ``estimate_pairs`` ``[pair, layer, head]``: each pair's term of the scores (their mean), from which the
    agreement's interval resamples the pairs (None: no interval)."""
    from circuitkit.detect.agreement import agreement, agreement_interval
    from circuitkit.detect.effects import HeadEffects
    from circuitkit.uncertainty import bootstrap_ci

    L, H = scores.shape
    heads = chosen_heads(scores, ablate, ablate_top)
    masks = torch.zeros(len(heads), L, H, dtype=torch.bool, device="cpu")
    for i, (layer, head) in enumerate(heads):
        masks[i, layer, head] = True
    clean = runner.clean["metric"].double()
    each = clean[None] - runner.node_metric(masks, None, per_pair=True).double()  # [head, pair]: metric lost
    exact = torch.full((L, H), float("nan"), dtype=torch.float32, device="cpu")
    for (layer, head), value in zip(heads, each.mean(-1).tolist(), strict=True):
        exact[layer, head] = value
    intervals: dict[str, tuple[float, float]] = {}
    if each.shape[1] >= 2:
        lo, hi = bootstrap_ci(each.T, n_resamples, level)
        intervals = {head_name(h): (a, b) for h, a, b in zip(heads, lo.tolist(), hi.tolist(), strict=True)}
    estimate = scores.detach().float().cpu()
    method, value = runner.ablation, float(clean.mean())
    exact_pairs = torch.full((each.shape[1], L, H), float("nan"), dtype=torch.float32, device="cpu")
    for i, (layer, head) in enumerate(heads):
        exact_pairs[:, layer, head] = each[i].float()
    attribution = HeadEffects("attribution", method, value, estimate,
                              per_sequence=None if estimate_pairs is None else estimate_pairs.float().cpu())
    ablation = HeadEffects("ablation", method, value, exact, exact=~exact.isnan(), per_sequence=exact_pairs)
    agreed = agreement(attribution, ablation)
    spread = agreement_interval(attribution, ablation, n_resamples, level)
    selection = "every head" if ablate == "all" else f"the top {len(heads)} by |EAP-IG score|"
    return SingleHeads(tuple(heads), exact, estimate, intervals, agreed, selection, spread, each.float())


__all__ = ["ABLATE_CHOICES", "DEFAULT_ABLATE", "DEFAULT_ABLATE_TOP", "SingleHeads", "check_ablate", "chosen_heads",
           "planned_heads", "single_heads"]
