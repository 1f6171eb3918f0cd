"""Target masks of the built-in pattern scores: ``tokens [batch, pos] -> [batch, q, k]`` bool, ``True`` where a
head of that type attends. A module of their own so that the score registry and the token batches can both use
them without importing each other."""

from __future__ import annotations

import torch
from jaxtyping import Bool, Int
from torch import Tensor


def _causal(tokens: Tensor) -> Tensor:
    pos = tokens.shape[-1]
    return torch.ones(pos, pos, dtype=torch.bool, device=tokens.device).tril()


def induction_targets(tokens: Int[Tensor, "batch pos"]) -> Bool[Tensor, "batch q k"]:
    """Key ``j`` is a target of query ``i`` when ``tokens[j-1] == tokens[i]`` for an earlier ``j-1 < i``."""
    same = tokens[:, :, None] == tokens[:, None, :]  # [b, i, j']: token j' equals token i
    same = same & _causal(tokens).tril(-1)  # j' < i
    shifted = torch.zeros_like(same)
    shifted[:, :, 1:] = same[:, :, :-1]  # target is j = j' + 1
    return shifted


def duplicate_targets(tokens: Int[Tensor, "batch pos"]) -> Bool[Tensor, "batch q k"]:
    """Key ``j < i`` is a target of query ``i`` when it holds the same token."""
    return (tokens[:, :, None] == tokens[:, None, :]) & _causal(tokens).tril(-1)


def _diagonal(tokens: Tensor, offset: int) -> Tensor:
    pos = tokens.shape[-1]
    mask = torch.ones(pos, pos, dtype=torch.bool, device=tokens.device).diagonal(offset)
    out = torch.diag_embed(mask, offset=offset)[:pos, :pos]
    out[0] = False  # row 0 attends to itself by force: never informative
    return out.expand(tokens.shape[0], pos, pos)


def previous_targets(tokens: Int[Tensor, "batch pos"]) -> Bool[Tensor, "batch q k"]:
    """Key ``i - 1`` for query ``i >= 1``."""
    return _diagonal(tokens, -1)


def current_targets(tokens: Int[Tensor, "batch pos"]) -> Bool[Tensor, "batch q k"]:
    """Key ``i`` for query ``i >= 1`` (row 0 has no choice)."""
    return _diagonal(tokens, 0)


def first_targets(tokens: Int[Tensor, "batch pos"]) -> Bool[Tensor, "batch q k"]:
    """Key ``0`` for query ``i >= 1``."""
    pos = tokens.shape[-1]
    out = torch.zeros(pos, pos, dtype=torch.bool, device=tokens.device)
    out[1:, 0] = True
    return out.expand(tokens.shape[0], pos, pos)


__all__ = ["current_targets", "duplicate_targets", "first_targets", "induction_targets", "previous_targets"]
