"""Repeated random token batches and the attention targets each head type is scored against.

Why a module of its own: head detection, the induction loss and ablation all run on the same batch, and
must agree on where the repeats are, which positions have a target, and what to do with a BOS token.

A batch is ``[batch, pos]`` with ``pos = n_repeats * seq_len (+ 1 with a BOS)``: per sequence, one random
block of ``seq_len`` tokens repeated ``n_repeats`` times, optionally after a BOS token. Within a block the
tokens are drawn without replacement when the token range allows it (so every repeated token has exactly
one earlier occurrence per earlier repeat), with replacement otherwise. The BOS id is never drawn.

Targets (``[batch, q_pos, k_pos]`` boolean masks, lower triangular): query ``i`` and key ``j <= i``::

    induction        j >= 1 and tokens[j - 1] == tokens[i] and j - 1 < i   (the token after an earlier copy)
    duplicate_token  j < i and tokens[j] == tokens[i]                      (an earlier copy of this token)
    previous_token   j == i - 1                                            (i >= 1)
    current_token    j == i                                                (i >= 1: row 0 has no choice)
    first_token      j == 0                                                (i >= 1)

A head's score is the attention it puts on its targets, averaged over the query rows that have a target
(so a perfect head scores 1.0). This is TransformerLens's ``"mul"`` head-detector score restricted to rows
with a target; TransformerLens averages over every row and so scores a perfect induction head about
``1 - 1/n_repeats``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from circuitkit.errors import CircuitkitError, describe

DEFAULT_SEQ_LEN = 20
"""Default repeated-block length: long enough that chance matches are rare, short enough to be cheap."""


@dataclass(frozen=True)
class ModelInfo:
    """What detection needs to know about a model: sizes, device, its BOS token and attention direction."""

    n_layers: int
    n_heads: int
    d_vocab: int
    n_ctx: int | None
    device: torch.device
    default_bos: int | None
    bidirectional: bool


def model_info(model: Any, device: str | torch.device | None = None) -> ModelInfo:
    """Read ``model.cfg`` (TransformerLens names) and the model's device; raise if it is not model-shaped."""
    cfg = getattr(model, "cfg", None)
    missing = [name for name in ("n_layers", "n_heads", "d_vocab") if getattr(cfg, name, None) is None]
    if cfg is None or missing:
        raise CircuitkitError(
            f"given a {type(model).__name__} with {'no cfg' if cfg is None else 'cfg missing ' + ', '.join(missing)}; "
            "expected a model with cfg.n_layers, cfg.n_heads, cfg.d_vocab (a TransformerLens TransformerBridge, "
            "a circuitkit AttentionOnlyModel, or any model shaped like them)."
        )
    if not (callable(getattr(model, "run_with_hooks", None)) or callable(getattr(model, "run_with_cache", None))):
        raise CircuitkitError(
            f"given a {type(model).__name__} with neither run_with_hooks nor run_with_cache; expected a model "
            "that exposes attention patterns through TransformerLens hooks (blocks.{l}.attn.hook_pattern)."
        )
    if device is None:
        parameters = getattr(model, "parameters", None)
        first = next(iter(parameters()), None) if callable(parameters) else None
        device = first.device if first is not None else torch.device(getattr(cfg, "device", None) or "cpu")
    tokenizer = getattr(model, "tokenizer", None)
    bos = getattr(tokenizer, "bos_token_id", None) if tokenizer is not None else None
    if not getattr(cfg, "default_prepend_bos", True):
        bos = None
    direction = getattr(cfg, "attention_dir", "causal")
    return ModelInfo(
        n_layers=int(cfg.n_layers),
        n_heads=int(cfg.n_heads),
        d_vocab=int(cfg.d_vocab),
        n_ctx=getattr(cfg, "n_ctx", None),
        device=torch.device(device),
        default_bos=bos if isinstance(bos, int) else None,
        bidirectional=direction == "bidirectional",
    )


def resolve_bos(bos: int | bool | None, info: ModelInfo) -> int | None:
    """``None``: the model tokenizer's BOS (if it prepends one); ``False``: no BOS; an int: that token id."""
    if bos is None:
        return info.default_bos
    if bos is False:
        return None
    if isinstance(bos, bool) or not isinstance(bos, int):
        raise CircuitkitError(
            f"bos: given {describe(bos)}; expected a token id (int), None (the model's own BOS) or False (no BOS)."
        )
    if not 0 <= bos < info.d_vocab:
        raise CircuitkitError(
            f"bos: given token id {bos}; expected an id in the vocabulary [0, {info.d_vocab}). "
            "Pass bos=False for no BOS token."
        )
    return bos


def repeated_tokens(
    info: ModelInfo,
    *,
    seq_len: int | None,
    n_repeats: int,
    batch: int,
    seed: int,
    bos: int | bool | None,
    token_range: tuple[int, int] | None = None,
) -> Int[Tensor, "batch pos"]:
    """``[batch, n_repeats * seq_len (+1 with BOS)]`` random blocks repeated, on ``info.device``. Seeded."""
    bos_id = resolve_bos(bos, info)
    n_prefix = 0 if bos_id is None else 1
    if seq_len is None:
        seq_len = DEFAULT_SEQ_LEN
        if info.n_ctx is not None:
            seq_len = max(2, min(seq_len, (info.n_ctx - n_prefix) // max(n_repeats, 1)))
    _check_int("batch", batch, 1)
    _check_int("n_repeats", n_repeats, 2, "a single copy has no repeat for a head to find")
    _check_int(
        "seq_len",
        seq_len,
        2,
        "with a repeated block of length 1 every position repeats its predecessor, so the induction target "
        "(the token after the earlier copy) is the current token and there is nothing to match",
    )
    total = n_repeats * seq_len + n_prefix
    if info.n_ctx is not None and total > info.n_ctx:
        raise CircuitkitError(
            f"seq_len={seq_len} x n_repeats={n_repeats}{' + BOS' if n_prefix else ''} gives sequences of "
            f"{total} tokens; expected at most the model's context n_ctx={info.n_ctx}. Lower seq_len."
        )
    low, high = token_range if token_range is not None else (0, info.d_vocab)
    if not (isinstance(low, int) and isinstance(high, int) and 0 <= low < high <= info.d_vocab):
        raise CircuitkitError(
            f"token_range: given {token_range!r}; expected (low, high) with 0 <= low < high <= d_vocab "
            f"= {info.d_vocab} (token ids outside the vocabulary cannot be embedded)."
        )
    candidates = torch.arange(low, high)
    if bos_id is not None:
        candidates = candidates[candidates != bos_id]
    if candidates.numel() < 2:
        raise CircuitkitError(
            f"token_range {token_range!r} leaves {candidates.numel()} token id(s) besides the BOS; expected at least 2."
        )
    generator = torch.Generator().manual_seed(seed)
    if candidates.numel() >= seq_len:
        keys = torch.rand(batch, candidates.numel(), generator=generator)
        index = keys.argsort(dim=-1)[:, :seq_len]  # a random permutation per row: no repeats within a block
    else:
        index = torch.randint(candidates.numel(), (batch, seq_len), generator=generator)
    block = candidates[index]
    parts = [block] * n_repeats
    if bos_id is not None:
        parts.insert(0, torch.full((batch, 1), bos_id, dtype=torch.long))
    return torch.cat(parts, dim=1).to(info.device)


def _check_int(name: str, value: Any, minimum: int, why: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        reason = f" ({why})" if why else ""
        raise CircuitkitError(f"{name}: given {describe(value)}; expected an int >= {minimum}{reason}.")


# ---------------------------------------------------------------------- target masks
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
    return (tokens[:, :, None] == tokens[:, None, :]) & _causal(tokens).tril(-1)


def _diagonal(tokens: Tensor, offset: int) -> Tensor:
    pos = tokens.shape[-1]
    mask = torch.ones(pos, pos, dtype=torch.bool, device=tokens.device).diagonal(offset)
    out = torch.diag_embed(mask, offset=offset)[:pos, :pos]
    out[0] = False  # row 0 attends to itself by force: never informative
    return out.expand(tokens.shape[0], pos, pos)


def previous_targets(tokens: Int[Tensor, "batch pos"]) -> Bool[Tensor, "batch q k"]:
    return _diagonal(tokens, -1)


def current_targets(tokens: Int[Tensor, "batch pos"]) -> Bool[Tensor, "batch q k"]:
    return _diagonal(tokens, 0)


def first_targets(tokens: Int[Tensor, "batch pos"]) -> Bool[Tensor, "batch q k"]:
    pos = tokens.shape[-1]
    out = torch.zeros(pos, pos, dtype=torch.bool, device=tokens.device)
    out[1:, 0] = True
    return out.expand(tokens.shape[0], pos, pos)


TARGETS: dict[str, Callable[[Tensor], Tensor]] = {
    "induction": induction_targets,
    "previous_token": previous_targets,
    "duplicate_token": duplicate_targets,
    "current_token": current_targets,
    "first_token": first_targets,
}
"""Pattern-based scores: name -> function of ``[batch, pos]`` tokens giving the ``[batch, q, k]`` target mask."""


def repeat_start(tokens: Int[Tensor, "batch pos"], seq_len: int, has_bos: bool) -> int:
    """Position of the first token of the second copy of the block."""
    return seq_len + int(has_bos)
