"""The induction loss: per-position loss on repeated random tokens, first copy against repeated copies.

Why: a high induction score says where a head looks, not that the model uses it. On repeated random tokens the
first copy is unpredictable and the later copies are predictable only in context; the gap between the two
losses is the in-context-learning signature (Olsson et al. 2022). Positions are defined in
:mod:`circuitkit.detect.tokens`: the token at ``t`` is predicted from ``t - 1`` with cross-entropy
``-log softmax(logits[t-1])[tokens[t]]``, reported at index ``t - 1``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from circuitkit import validate
from circuitkit.detect.tokens import RepeatedTokens, TokenBatch, as_batch
from circuitkit.models.adapters import adapt
from circuitkit.models.state import keeps_model_state


@dataclass(frozen=True)
class InductionLoss:
    """Per-position loss (nats, batch mean, index ``t - 1``) and its first-copy / repeated-copies means."""

    per_position: Float[Tensor, " pos_minus_1"]
    first_copy: float
    repeated_copies: float


def loss_positions(batch: TokenBatch) -> Int[Tensor, " n"]:
    """The sequence positions (int64, CPU) whose logits the repeated-copies loss reads: the prediction indices
    ``t - 1`` of :attr:`TokenBatch.repeated_copies`. A pass that needs only that loss asks the model for logits
    there only (``adapter.run(..., positions=loss_positions(batch))``): 19 of 41 positions in the default batch,
    and the unembedding is a fifth of a 135M model's pass, two thirds of one with a 262k vocabulary."""
    return batch.repeated_copies.nonzero().squeeze(1)


def token_losses(
    logits: Tensor, tokens: Int[Tensor, "batch pos"], positions: Tensor | None = None
) -> Float[Tensor, "batch n"]:
    """Cross-entropy of each next token: ``[batch, pos - 1]`` (float32, on ``logits``' device), or only at the
    prediction indices ``positions`` (a bool mask over ``pos - 1``): the log-softmax over the vocabulary is
    then taken only where it is needed (at vocabulary 50k it is the largest tensor of an ablation pass).

    ``logits`` are ``[batch, pos, d_vocab]``, or, with ``positions``, the logits at those indices only
    (``[batch, positions.sum(), d_vocab]``, as a run asked for ``positions=`` returns them)."""
    if positions is None:
        # every position, the last one's target ignored: the logits are read in place (a view of all but the last
        # position is not contiguous, and flattening it would copy [batch, pos - 1, d_vocab])
        targets = torch.cat([tokens[:, 1:], torch.full_like(tokens[:, :1], IGNORED)], dim=1).to(logits.device)
        return _cross_entropy(logits, targets)[:, :-1]
    targets = tokens[:, 1:].to(logits.device)
    index = positions.nonzero().squeeze(1)
    if logits.shape[1] == tokens.shape[1] and logits.requires_grad:
        # one copy of the selected positions: slices read in place would each pull back into a zero tensor of the
        # full logits' size in a backward pass
        index = index.to(logits.device)
        return _cross_entropy(logits.index_select(1, index), targets.index_select(1, index))
    if logits.shape[1] == tokens.shape[1]:
        # read in place: each sequence's runs of consecutive positions are contiguous rows of the logits (a copy
        # of the selected positions is [batch, n, d_vocab], 320 MB a pass at vocabulary 262k)
        runs = _contiguous_runs(index.tolist())
        if not runs:
            return logits.new_zeros(logits.shape[0], 0, dtype=torch.float32)
        return torch.stack([torch.cat([_cross_entropy(logits[row, a:b], targets[row, a:b]) for a, b in runs])
                            for row in range(logits.shape[0])])
    if logits.shape[1] == len(index):
        return _cross_entropy(logits, targets.index_select(1, index.to(logits.device)))
    raise validate.fail("token_losses: logits", validate.given(f"shape {list(logits.shape)}"),
                        f"[batch, {tokens.shape[1]} or {len(index)} positions, d_vocab]")


def _contiguous_runs(positions: list[int]) -> list[tuple[int, int]]:
    """Sorted distinct ``positions`` as half-open runs of consecutive ones: ``[2, 3, 4, 7] -> [(2, 5), (7, 8)]``."""
    runs: list[tuple[int, int]] = []
    for p in positions:
        if runs and runs[-1][1] == p:
            runs[-1] = (runs[-1][0], p + 1)
        else:
            runs.append((p, p + 1))
    return runs


IGNORED = -100
"""The target id :func:`torch.nn.functional.cross_entropy` skips (loss 0)."""


def _cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """``-log softmax(logits)[target]`` per position, ``[batch, n]`` float32: torch's fused log-softmax and its fused
    backward (half the time of ``logsumexp - logit[target]`` forward and backward at vocabulary 262k)."""
    flat = logits.float().reshape(-1, logits.shape[-1])
    return torch.nn.functional.cross_entropy(flat, targets.reshape(-1).long(), reduction="none",
                                             ignore_index=IGNORED).view(targets.shape)


def stacked_losses(logits: Tensor, tokens: Int[Tensor, "copies_batch pos"], batch: TokenBatch,
                   copies: int) -> Float[Tensor, " copies"]:
    """The repeated-copies loss of each of ``copies`` runs of ``batch`` stacked along the batch axis: ``logits``
    ``[copies * batch, pos, d_vocab]`` of ``tokens`` ``[copies * batch, pos]`` -> ``[copies]`` (float32, on
    ``logits``' device); the mean of :func:`token_losses` at ``batch.repeated_copies`` per run."""
    return token_losses(logits, tokens, batch.repeated_copies).view(copies, -1).mean(dim=1)


def summarise(losses: Float[Tensor, "batch pos_minus_1"], batch: TokenBatch) -> InductionLoss:
    """:class:`InductionLoss` from per-token losses of ``batch``. Non-finite losses raise: they come from the
    model (overflowing logits), and a NaN mean would pass silently into every comparison."""
    losses = validate.finite_result(
        "induction_loss", losses.detach().float().cpu(), why="the model's logits overflowed or are NaN"
    )
    return InductionLoss(
        per_position=losses.mean(dim=0),
        first_copy=float(losses[:, batch.first_copy].mean()),
        repeated_copies=float(losses[:, batch.repeated_copies].mean()),
    )


@keeps_model_state
def induction_loss(
    model: Any, tokens: RepeatedTokens | TokenBatch | None = None, *, device: str | torch.device | None = None
) -> InductionLoss:
    """Loss per position on repeated random tokens and its first-copy / repeated-copies means (see the module
    docstring). Pass the same ``tokens`` as to :func:`circuitkit.head_scores` to measure on the same batch."""
    adapter = adapt(model, device)
    batch = as_batch(tokens, adapter)
    with torch.no_grad():
        logits = adapter.run(batch.tokens)
    return summarise(token_losses(logits, batch.tokens), batch)


def differentiated_losses(logits: Tensor, tokens: Int[Tensor, "batch pos"], repeated: Tensor) -> tuple[Tensor, Tensor]:
    """``(loss, losses)`` of a pass whose graph reads the repeated copies only: ``loss`` the mean loss over the
    repeated copies' predictions (differentiable), ``losses`` ``[batch, pos - 1]`` every position's loss, detached,
    on the CPU (the repeated copies' taken from the differentiated ones; the rest computed without a graph).
    ``repeated``: the bool mask over the ``pos - 1`` predictions (``TokenBatch.repeated_copies``)."""
    differentiated = token_losses(logits, tokens, repeated)
    with torch.no_grad():
        losses = torch.empty(tokens.shape[0], len(repeated), device=differentiated.device)
        losses[:, repeated.to(losses.device)] = differentiated.detach()
        if not bool(repeated.all()):
            losses[:, ~repeated.to(losses.device)] = token_losses(logits.detach(), tokens, ~repeated)
    return differentiated.mean(), losses.cpu()


__all__ = ["InductionLoss", "differentiated_losses", "induction_loss", "loss_positions", "stacked_losses",
           "summarise", "token_losses"]
