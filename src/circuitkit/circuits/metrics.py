"""What path patching and edge attribution measure: the receiver's induction score, the repeated-copies loss,
or a user metric of the logits.

- ``"induction"`` (local): the receiver head's prefix-matching score on the clean tokens, the attention its
  pattern ``A`` ``[batch, q, k]`` puts on the induction targets ``M`` (:func:`circuitkit.detect.tokens.
  induction_targets`), averaged over the query rows that have a target::

      score = sum_{b,q,k} A[b,q,k] M[b,q,k] / #{(b, q): row q of M[b] has a target}

  (as :mod:`circuitkit.detect` defines it). It reads only the receiver's own pattern, so a V edge never changes
  it, and path patching stops the forward pass at the receiver's layer.
- ``"loss"`` (global): the mean cross-entropy of the next token on the repeated copies, skipping each copy's
  first token (:attr:`circuitkit.detect.TokenBatch.repeated_copies`), averaged over batch and positions: minus the
  registered metric ``next_token_logprob`` (:data:`circuitkit.metric_registry.REGISTRY`, the one registry the
  task engine reads too) with those positions scored, averaged over the sequences.
- a callable ``metric(logits, batch) -> scalar tensor`` (global): ``logits`` ``[batch, pos, d_vocab]`` of the
  (patched) run and the clean :class:`~circuitkit.detect.TokenBatch`. For edge attribution it must be
  differentiable in the logits. It is the user's code, so it runs guarded: it receives a copy of the batch's
  tokens (writing into them changes nothing else), and an exception it raises becomes one
  :class:`~circuitkit.CircuitkitError` line naming the metric and the original error.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from circuitkit import validate
from circuitkit.detect.tokens import TokenBatch, induction_targets
from circuitkit.errors import CircuitkitError
from circuitkit.metric_registry import repeated_copies_loss

METRICS: tuple[str, ...] = ("induction", "loss")
"""Named metrics; a callable ``metric(logits, batch) -> scalar`` is accepted too."""


@dataclass(frozen=True)
class Metric:
    """A resolved metric: ``name`` (``"induction"``, ``"loss"`` or the callable's name) and whether it is
    ``local`` (read from the receiver's pattern) or computed from the logits by ``fn``."""

    name: str
    local: bool
    fn: Callable[[Tensor, TokenBatch], Tensor] | None = None


def resolve_metric(metric: Any, where: str) -> Metric:
    if callable(metric) and not isinstance(metric, type):
        name = getattr(metric, "__name__", type(metric).__name__)
        return Metric(name, local=False, fn=_guarded(metric, name))
    name = validate.option(f"{where}: metric", metric, METRICS)
    return Metric(name, local=name == "induction", fn=repeated_loss if name == "loss" else None)


def _guarded(metric: Callable[[Tensor, TokenBatch], Any], name: str) -> Callable[[Tensor, TokenBatch], Any]:
    """``metric`` called on a copy of the batch's tokens, its exceptions labelled with its name."""

    @functools.wraps(metric)
    def guarded(logits: Tensor, batch: TokenBatch) -> Any:
        try:
            return metric(logits, replace(batch, tokens=batch.tokens.clone()))
        except CircuitkitError:
            raise
        except Exception as error:  # noqa: BLE001 - the user's code: every error it raises is reported, labelled
            text = " ".join(str(error).split())[:300]
            raise CircuitkitError(
                f"metric {name!r}: metric(logits, batch) raised {type(error).__name__}: {text}; expected a scalar "
                "float tensor from the logits [batch, pos, d_vocab] and the TokenBatch. Fix the metric function."
            ) from error

    return guarded


def repeated_loss(logits: Tensor, batch: TokenBatch) -> Tensor:
    """Mean next-token cross-entropy on ``batch``'s repeated copies (each copy's first token skipped)."""
    return repeated_losses(logits[None], batch)[0]


def repeated_losses(logits: Tensor, batch: TokenBatch) -> Tensor:
    """:func:`repeated_loss` of stacked runs: ``logits`` ``[copies, batch, pos, d_vocab]`` -> ``[copies]``."""
    return repeated_copies_loss(logits, batch.tokens, batch.repeated_copies).mean(-1)


def repeated_loss_each(logits: Tensor, batch: TokenBatch) -> Tensor:
    """Each sequence's :func:`repeated_loss` ``[batch]`` (float32, CPU, detached) of ``logits`` at every position
    or at the loss's positions (:func:`~circuitkit.detect.loss.loss_positions`): what path patching's intervals
    resample against each patched copy's."""
    from circuitkit.detect.loss import token_losses

    return token_losses(logits.detach(), batch.tokens, batch.repeated_copies).float().mean(dim=1).cpu()


class InductionReader:
    """The induction score of patterns on one batch: ``__call__(A [..., batch, q, k]) -> [...]``."""

    def __init__(self, batch: TokenBatch, dtype: torch.dtype) -> None:
        mask = induction_targets(batch.tokens)
        rows = int(mask.any(dim=-1).sum())
        if rows == 0:
            raise validate.fail("tokens", batch.tokens, "repeated tokens: no query row has an induction target")
        self.mask = mask.to(dtype)
        self.rows = rows

    def __call__(self, pattern: Tensor) -> Tensor:
        return (pattern * self.mask.to(pattern.dtype)).sum(dim=(-3, -2, -1)) / self.rows


def check_value(value: Any, where: str) -> Tensor:
    """A user metric's result: a finite scalar tensor."""
    if not isinstance(value, Tensor) or value.numel() != 1 or not value.is_floating_point():
        raise validate.fail(where, value, "a scalar float tensor from metric(logits, batch)")
    return validate.finite_result(where, value.reshape(()))


__all__ = ["METRICS", "InductionReader", "Metric", "repeated_loss", "repeated_loss_each", "repeated_losses",
           "resolve_metric"]
