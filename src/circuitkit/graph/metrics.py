"""Task metrics, read at each prompt's last token (or at its scored positions): one value per pair, higher = more
of the clean behaviour. The functions and their units live in the one registry both engines read,
:mod:`circuitkit.metric_registry`; this module is the task engine's view of it.

With ``a`` the pair's answer tokens, ``w`` its wrong-answer tokens, ``z`` the logits ``[vocab]`` at the prompt's
last real token and ``p = softmax(z)``::

    logit_diff   mean_{t in a} z_t - mean_{t in w} z_t       (one answer each: logit(answer) - logit(wrong))
    prob_diff    sum_{t in a} p_t - sum_{t in w} p_t         (probabilities summed over the listed tokens)
    answer_logprob   log sum_{t in a} p_t                   (minus the answer's loss; higher is better)
    neg_kl       -KL(p_clean || p)                           (0 on the clean run itself)

    next_token_logprob   mean over the scored positions of log p(next token)   (the task's ``scored`` positions)

Several answers per pair: logits are **averaged** (``logit_diff``), probabilities **summed** (``prob_diff``,
``answer_logprob``). Every metric is oriented so that the clean run scores above the corrupted one on a task the
model does; faithfulness ``(m_C - m_corr) / (m_clean - m_corr)`` uses the mean over pairs.

**Your own metric** (:class:`UserMetric`): a function ``metric(logits, batch) -> values`` with ``logits`` the
``[pair, vocab]`` logits at each prompt's last token (the patched run's, one call per stacked copy) and ``batch`` the
:class:`~circuitkit.tasks.TaskBatch` (``answers``, ``wrongs`` and their masks, ``clean``, ``last``...); it returns a
floating tensor ``[pair]``, finite, higher for more of the clean behaviour, and differentiable in ``logits``
(EAP-IG's scores are its gradient). ``UserMetric(fn, reads="all")`` hands ``fn`` the ``[pair, pos, vocab]`` logits
at every position instead (padding after ``batch.last``; ``batch.real`` marks the real positions), for a behaviour
spread over a span; every pass then unembeds every position. Each call is checked; a function that breaks a rule is
one :class:`~circuitkit.CircuitkitError` naming it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from circuitkit.graph.task import TaskBatch, UserMetric, metric_label
from circuitkit.metric_registry import (
    REGISTRY,
    answer_logprob,
    logit_diff,
    neg_kl,
    next_token_logprob,
    prob_diff,
)

MetricFn = Callable[[Tensor, TaskBatch, "Tensor | None"], Tensor]

METRICS: dict[str, Callable[..., Tensor]] = {name: m.fn for name, m in REGISTRY.items()}
"""The metrics by name, read from the one registry (:data:`circuitkit.metric_registry.REGISTRY`). ``"loss"`` and
``"kl"`` are accepted as aliases when a task is built."""

UNITS = {name: m.units for name, m in REGISTRY.items()}
CUSTOM_UNITS = "the metric's own units"
"""The units of a :class:`~circuitkit.graph.task.UserMetric` (defined beside :class:`Task`, which holds one)."""


def metric_units(metric: str | UserMetric) -> str:
    return CUSTOM_UNITS if isinstance(metric, UserMetric) else UNITS[metric]


def dla_meaning(metric: str | UserMetric) -> str:
    """What a task's DLA figure (logits) is, in words (the answer's legend, the table, ``scores.json``'s units): a
    linear read of the logits, so that a head's share is exact with the final norm's scale frozen (a metric's own
    gradient saturates where the clean run is confident: a log-probability of -0.03 moves 0.03 nats a logit)."""
    frozen = "through the final norm at its clean-run scale"
    if reads_scored(metric):
        return (f"the head's output read straight into logit(next token) minus the mean logit, at the scored "
                f"positions, {frozen}")
    return f"the head's output read straight into logit(answer) - logit(wrong) {frozen}"


def next_token_logit(logits: Tensor, targets: Tensor, scored: Tensor) -> Tensor:
    """``logits`` ``[..., example, n, vocab]``, ``targets`` and ``scored`` ``[example, n]`` -> ``[..., example]``:
    the mean over the scored positions of the target's logit minus the mean logit (what a scored metric's DLA
    reads: linear in the logits, blind to a shift of every logit as the log-probability is)."""
    picked = logits.gather(-1, targets.to(logits.device)[..., None].expand(*logits.shape[:-1], 1))[..., 0]
    centred = (picked - logits.mean(-1)).float()
    weight = scored.to(logits.device, torch.float32)
    return (centred * weight).sum(-1) / weight.sum(-1)


def reads_scored(metric: str | UserMetric) -> bool:
    """Whether ``metric`` reads the next-token predictions at the task's scored positions (else the last token, or
    with :func:`reads_every_position` every position)."""
    return not isinstance(metric, UserMetric) and REGISTRY[metric].reads == "scored"


def reads_every_position(metric: str | UserMetric) -> bool:
    """Whether ``metric`` is a researcher's function of the logits at every position (``UserMetric(fn,
    reads="all")``)."""
    return isinstance(metric, UserMetric) and metric.reads == "all"


def read_mask(metric: str | UserMetric, batch: TaskBatch) -> Tensor | None:
    """``[pair, pos]`` bool, the positions besides each prompt's last token whose logits ``metric`` reads: the
    task's scored positions for a scored metric, every real position for a function of every position; None for a
    metric of the last token alone."""
    if reads_scored(metric):
        return batch.scored
    if reads_every_position(metric):
        return batch.real
    return None


def last_logits(logits: Tensor, last: Tensor) -> Tensor:
    """``logits`` ``[copies * pair, pos, vocab]`` -> ``[copies, pair, vocab]`` at each row's position ``last``
    ``[pair]`` (each row's last real position, as an index into ``logits``' positions)."""
    n = last.shape[0]
    copies = logits.shape[0] // n
    view = logits.view(copies, n, *logits.shape[1:])
    index = last.to(logits.device)[None, :, None, None].expand(copies, n, 1, logits.shape[-1])
    return view.gather(2, index)[:, :, 0]


__all__ = ["METRICS", "UNITS", "UserMetric", "answer_logprob", "dla_meaning", "last_logits", "logit_diff",
           "metric_label", "metric_units", "neg_kl", "next_token_logit", "next_token_logprob", "prob_diff",
           "read_mask", "reads_every_position", "reads_scored"]
