"""Task metrics, read at each prompt's last token: one value per pair, higher = more of the clean behaviour.

With ``a`` the pair's answer tokens, ``w`` its wrong-answer tokens, ``z`` the logits ``[vocab]`` at the prompt's
last real token and ``p = softmax(z)``::

    logit_diff   mean_{t in a} z_t - mean_{t in w} z_t       (one answer each: logit(answer) - logit(wrong))
    prob_diff    sum_{t in a} p_t - sum_{t in w} p_t         (probabilities summed over the listed tokens)
    answer_logprob   log sum_{t in a} p_t                   (minus the answer's loss; higher is better)
    neg_kl       -KL(p_clean || p)                           (0 on the clean run itself)

Several answers per pair: logits are **averaged** (``logit_diff``), probabilities **summed** (``prob_diff``,
``answer_logprob``). Every metric is oriented so that the clean run scores above the corrupted one on a task the
model does; faithfulness ``(m_C - m_corr) / (m_clean - m_corr)`` uses the mean over pairs.

**Your own metric** (:class:`UserMetric`): a function ``metric(logits, batch) -> values`` with ``logits`` the
``[pair, vocab]`` logits at each prompt's last token (the patched run's, one call per stacked copy) and ``batch`` the
:class:`~circuitkit.tasks.TaskBatch` (``answers``, ``wrongs`` and their masks, ``clean``, ``last``...); it returns a
floating tensor ``[pair]``, finite, higher for more of the clean behaviour, and differentiable in ``logits``
(EAP-IG's scores are its gradient). Each call is checked; a function that breaks a rule is one
:class:`~circuitkit.CircuitkitError` naming it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from circuitkit.tasks.task import TaskBatch, UserMetric, metric_label

MetricFn = Callable[[Tensor, TaskBatch, "Tensor | None"], Tensor]


def _masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    mask = mask.to(values.dtype)
    return (values * mask).sum(-1) / mask.sum(-1)


def _gather(logits: Tensor, ids: Tensor) -> Tensor:
    """``logits`` ``[..., pair, vocab]``, ``ids`` ``[pair, A]`` -> ``[..., pair, A]``."""
    return logits.gather(-1, ids.expand(*logits.shape[:-1], ids.shape[-1]))


def logit_diff(logits: Tensor, batch: TaskBatch, clean_logprobs: Tensor | None = None) -> Tensor:
    return (_masked_mean(_gather(logits, batch.answers), batch.answer_mask)
            - _masked_mean(_gather(logits, batch.wrongs), batch.wrong_mask))


def prob_diff(logits: Tensor, batch: TaskBatch, clean_logprobs: Tensor | None = None) -> Tensor:
    probs = logits.float().softmax(-1)
    return ((_gather(probs, batch.answers) * batch.answer_mask).sum(-1)
            - (_gather(probs, batch.wrongs) * batch.wrong_mask).sum(-1))


def answer_logprob(logits: Tensor, batch: TaskBatch, clean_logprobs: Tensor | None = None) -> Tensor:
    logprobs = logits.float().log_softmax(-1)
    picked = _gather(logprobs, batch.answers).masked_fill(~batch.answer_mask, float("-inf"))
    return picked.logsumexp(-1)


def neg_kl(logits: Tensor, batch: TaskBatch, clean_logprobs: Tensor | None = None) -> Tensor:
    logprobs = logits.float().log_softmax(-1)
    if clean_logprobs is None:  # the clean run itself
        return torch.zeros(logprobs.shape[:-1], device=logits.device)
    return -(clean_logprobs.exp() * (clean_logprobs - logprobs)).sum(-1)


METRICS: dict[str, MetricFn] = {
    "logit_diff": logit_diff,
    "prob_diff": prob_diff,
    "answer_logprob": answer_logprob,
    "neg_kl": neg_kl,
}
"""The metrics by name (module docstring). ``"loss"`` and ``"kl"`` are accepted as aliases when a task is built."""

UNITS = {"logit_diff": "logits", "prob_diff": "probability", "answer_logprob": "nats", "neg_kl": "nats"}
CUSTOM_UNITS = "the metric's own units"
"""The units of a :class:`~circuitkit.tasks.task.UserMetric` (defined beside :class:`Task`, which holds one)."""


def metric_units(metric: str | UserMetric) -> str:
    return CUSTOM_UNITS if isinstance(metric, UserMetric) else UNITS[metric]


def last_logits(logits: Tensor, last: Tensor) -> Tensor:
    """``logits`` ``[copies * pair, pos, vocab]`` -> ``[copies, pair, vocab]`` at each row's position ``last``
    ``[pair]`` (each row's last real position, as an index into ``logits``' positions)."""
    n = last.shape[0]
    copies = logits.shape[0] // n
    view = logits.view(copies, n, *logits.shape[1:])
    index = last.to(logits.device)[None, :, None, None].expand(copies, n, 1, logits.shape[-1])
    return view.gather(2, index)[:, :, 0]


__all__ = ["METRICS", "UNITS", "UserMetric", "answer_logprob", "last_logits", "logit_diff", "metric_label",
           "metric_units", "neg_kl", "prob_diff"]
