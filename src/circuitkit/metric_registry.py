"""The one registry of the metrics a circuit is measured by: every engine (the induction scan's edge measurements,
the task scan's node and edge circuits) reads its metric from :data:`REGISTRY`.

Every metric is **per example** (one value per prompt or sequence, never their mean: the bootstrap intervals
resample examples) and reads the logits in one of two ways (:attr:`MetricDef.reads`):

- ``"last"``: at each prompt's last real token, ``fn(logits [..., example, vocab], batch, clean_logprobs)`` ->
  ``[..., example]``, with the answers of a :class:`~circuitkit.tasks.TaskBatch` (``answers``, ``wrongs`` and
  their masks). With ``a`` the answer tokens, ``w`` the wrong ones, ``z`` the logits and ``p = softmax(z)``::

      logit_diff       mean_{t in a} z_t - mean_{t in w} z_t
      prob_diff        sum_{t in a} p_t - sum_{t in w} p_t
      answer_logprob   log sum_{t in a} p_t
      neg_kl           -KL(p_clean || p)                      (0 on the clean run itself)

- ``"scored"``: the next-token prediction at each scored position, ``fn(logits [..., example, n, vocab],
  targets [example, n], scored [example, n] bool)`` -> ``[..., example]``, ``targets`` the token each of the ``n``
  predictions should give (the token after it) and ``scored`` which of them count::

      next_token_logprob   mean_{j scored} log softmax(z_j)[target_j]

  On repeated random blocks with the repeated copies scored (each copy's first token skipped), this is minus the
  induction scan's ``"loss"`` on the copies, per sequence: :func:`repeated_copies_loss` is that loss, read from
  this entry (its mean over sequences is the induction engine's figure).

Every metric is oriented so that more of the behaviour scores higher (the clean run above the corrupted one), and
carries its units.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from circuitkit import validate

READS = ("last", "scored")
"""Where a metric reads the logits: each prompt's last token, or the next-token predictions at scored positions."""
IGNORED = -100
"""The target :func:`torch.nn.functional.cross_entropy` skips (an unscored position)."""


@dataclass(frozen=True)
class MetricDef:
    """One metric: its ``name``, where it ``reads`` (:data:`READS`), its ``units``, a one-line ``description``
    and its per-example ``fn`` (module docstring)."""

    name: str
    reads: str
    units: str
    description: str
    fn: Callable[..., Tensor]


def _masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    mask = mask.to(values.dtype)
    return (values * mask).sum(-1) / mask.sum(-1)


def _gather(logits: Tensor, ids: Tensor) -> Tensor:
    """``logits`` ``[..., pair, vocab]``, ``ids`` ``[pair, A]`` -> ``[..., pair, A]``."""
    return logits.gather(-1, ids.expand(*logits.shape[:-1], ids.shape[-1]))


def logit_diff(logits: Tensor, batch: object, clean_logprobs: Tensor | None = None) -> Tensor:
    return (_masked_mean(_gather(logits, batch.answers), batch.answer_mask)
            - _masked_mean(_gather(logits, batch.wrongs), batch.wrong_mask))


def prob_diff(logits: Tensor, batch: object, clean_logprobs: Tensor | None = None) -> Tensor:
    probs = logits.float().softmax(-1)
    return ((_gather(probs, batch.answers) * batch.answer_mask).sum(-1)
            - (_gather(probs, batch.wrongs) * batch.wrong_mask).sum(-1))


def answer_logprob(logits: Tensor, batch: object, clean_logprobs: Tensor | None = None) -> Tensor:
    logprobs = logits.float().log_softmax(-1)
    picked = _gather(logprobs, batch.answers).masked_fill(~batch.answer_mask, float("-inf"))
    return picked.logsumexp(-1)


def neg_kl(logits: Tensor, batch: object, clean_logprobs: Tensor | None = None) -> Tensor:
    logprobs = logits.float().log_softmax(-1)
    if clean_logprobs is None:  # the clean run itself
        return torch.zeros(logprobs.shape[:-1], device=logits.device)
    return -(clean_logprobs.exp() * (clean_logprobs - logprobs)).sum(-1)


def next_token_logprob(logits: Tensor, targets: Tensor, scored: Tensor) -> Tensor:
    """``logits`` ``[..., example, n, vocab]``, ``targets`` ``[example, n]`` token ids, ``scored`` ``[example, n]``
    bool (at least one per example) -> ``[..., example]`` float32: the mean log-probability of the targets over the
    scored positions (torch's fused cross-entropy; unscored positions cost nothing)."""
    if scored.dim() != 2 or targets.shape != scored.shape or tuple(logits.shape[-3:-1]) != tuple(scored.shape):
        raise validate.fail("next_token_logprob: shapes", validate.given(
            f"logits {list(logits.shape)}, targets {list(targets.shape)}, scored {list(scored.shape)}"),
            "logits [..., example, n, vocab] with targets and scored [example, n]")
    counts = scored.sum(-1)
    if bool((counts == 0).any()):
        raise validate.fail("next_token_logprob: scored", validate.given("an example with no scored position"),
                            "at least one scored position per example")
    lead = logits.shape[:-3]
    wanted = torch.where(scored, targets, torch.full_like(targets, IGNORED)).to(logits.device).long()
    flat = logits.float().reshape(-1, logits.shape[-1])
    losses = torch.nn.functional.cross_entropy(flat, wanted.expand(*lead, *wanted.shape).reshape(-1),
                                               reduction="none", ignore_index=IGNORED)
    return -losses.view(*lead, *scored.shape).sum(-1) / counts.to(losses.device, torch.float32)


REGISTRY: dict[str, MetricDef] = {m.name: m for m in (
    MetricDef("logit_diff", "last", "logits", "the answers' mean logit minus the wrong answers'", logit_diff),
    MetricDef("prob_diff", "last", "probability", "the answers' summed probability minus the wrong answers'",
              prob_diff),
    MetricDef("answer_logprob", "last", "nats", "the log-probability of the answers (minus their loss)",
              answer_logprob),
    MetricDef("neg_kl", "last", "nats", "minus the KL divergence of the clean run's distribution from this one's",
              neg_kl),
    MetricDef("next_token_logprob", "scored", "nats", "the mean log-probability of the next token at the scored "
              "positions (on repeated random blocks: minus the loss on the repeated copies)", next_token_logprob),
)}
"""Every metric by name (module docstring)."""


def get(name: str, where: str = "metric") -> MetricDef:
    """The registered metric ``name`` (a :class:`~circuitkit.CircuitkitError` naming the choices otherwise)."""
    return REGISTRY[validate.option(where, name, tuple(REGISTRY))]


def repeated_copies_loss(logits: Tensor, tokens: Tensor, prediction_mask: Tensor) -> Tensor:
    """The induction engine's loss on the repeated copies, per sequence, from :data:`REGISTRY`'s
    ``next_token_logprob``: ``logits`` ``[..., batch, n, vocab]`` at the ``n`` prediction indices where
    ``prediction_mask`` ``[pos - 1]`` (bool, CPU) is True (or ``[..., batch, pos, vocab]`` at every position),
    ``tokens`` ``[batch, pos]`` -> ``[..., batch]`` nats (lower: better predicted)."""
    index = prediction_mask.nonzero().squeeze(1)
    if logits.shape[-2] != len(index):
        logits = logits.index_select(-2, index.to(logits.device))
    targets = tokens[:, 1:].index_select(1, index.to(tokens.device))
    scored = torch.ones(targets.shape, dtype=torch.bool, device=targets.device)
    return -REGISTRY["next_token_logprob"].fn(logits, targets, scored)


__all__ = ["READS", "REGISTRY", "MetricDef", "answer_logprob", "get", "logit_diff", "neg_kl", "next_token_logprob",
           "prob_diff", "repeated_copies_loss"]
