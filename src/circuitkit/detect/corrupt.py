"""The corrupted run of path patching and edge attribution, and the two ways a sender's output is replaced.

Why a module: "corrupted" has to mean one thing in every method that uses it (path patching, edge attribution,
the faithfulness search, and head attribution's integrated gradients along the inputs path); it lives in
``detect`` beside the token batches it redraws, below all of them (``circuitkit.circuits.corrupt`` re-exports it).

circuitkit measures induction circuits on repeated random tokens, ``[BOS] block block ...``. The corrupted batch
is the same sequences (same length, same BOS, tokens from the same ids) with **every copy of the block replaced by
its own fresh random block** (independent per sequence and per copy), so nothing repeats:

- a sender's output differs on both sides of an induction circuit: at the *key* positions (the earlier copy,
  where a previous-token head writes "my previous token was A" for the induction head's keys) and at the *query*
  positions (the later copies). Resampling only the later copies would leave the earlier copy, and so every
  K-path into an induction head, exactly clean: K-composition could never show an effect.
- what a head writes in the corrupted run is what it writes when there is no induction to do.

``resampled_batch(batch, copies="first")`` or ``copies="later"`` resample only the first or only the later copies
(corrupting the key side or the query side alone); pass the result as ``corrupt=`` to path patching or edge
attribution.

Fresh tokens are drawn from the ids that occur in the batch's first copies (so a ``token_range`` the clean batch
was drawn from is respected, and the BOS, never in a block, is never drawn), without replacement within a block
when there are enough ids, as :class:`circuitkit.detect.RepeatedTokens` draws blocks.

``corrupt="mean"`` instead replaces a sender's output ``z`` at each position by its mean over the clean batch at
that position (no second batch).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from circuitkit import validate
from circuitkit.detect.tokens import TokenBatch, random_blocks

Corruption = Literal["resample", "mean"]
CORRUPTIONS: tuple[str, ...] = ("resample", "mean")
COPIES: tuple[str, ...] = ("all", "first", "later")

DEFAULT_CORRUPT_SEED = 1
"""Seed of the resampled copies; differs from the clean batch's default seed (0) so no block is drawn twice."""


def position_mean(x: Tensor, real: Tensor | None = None) -> Tensor:
    """The batch-mean corruption's value (``corrupt="mean"``): ``x`` ``[B, P, ...]`` (a sender's clean output, the
    input embeddings) averaged over the sequences at each position, ``[1, P, ...]``; with ``real`` ``[B, P]`` bool
    (a task's pairs, padded to one length), over the sequences real at that position (0 where none is)."""
    if real is None:
        return x.mean(dim=0, keepdim=True)
    w = real.to(x.dtype).view(*real.shape, *([1] * (x.dim() - 2)))
    return (x * w).sum(0, keepdim=True) / w.sum(0, keepdim=True).clamp(min=1)


def check_mean_over(where: str, n: int, container: str, unit: str, instead: str) -> None:
    """Refuse ``corrupt="mean"`` over ``n < 2`` ``unit`` s (sequences of a batch, pairs of a task): the mean of one is
    that one, so every edge patched to it would change nothing. ``instead``: the corruption to name in its place."""
    if n < 2:
        raise validate.fail(f"{where}: corrupt", validate.given(f"'mean' over a {container} of 1 {unit}"),
                            f"at least 2 {unit}s for corrupt='mean', or corrupt={instead!r}",
                            f"The mean of one {unit} is that {unit}: every edge would change nothing.")


def resampled_batch(batch: TokenBatch, seed: int = DEFAULT_CORRUPT_SEED, *, copies: str = "all") -> TokenBatch:
    """``batch`` with the prefix kept and the chosen ``copies`` (``"all"``, ``"first"``, ``"later"``) each replaced
    by a fresh random block (see the module docstring). Same shape, device, ``block_len``, ``n_repeats``, BOS."""
    if not isinstance(batch, TokenBatch):
        raise validate.fail("resampled_batch: batch", batch, "a circuitkit.detect.TokenBatch")
    seed = validate.seed("resampled_batch: seed", seed)
    copies = validate.option("resampled_batch: copies", copies, COPIES)
    tokens = batch.tokens
    n, T, p0 = tokens.shape[0], batch.block_len, batch.prefix
    pool = torch.unique(tokens[:, p0 : p0 + T].cpu())
    generator = torch.Generator().manual_seed(seed)
    parts = [tokens[:, :p0].cpu()]
    for r in range(batch.n_repeats):
        if copies == "all" or (copies == "first") == (r == 0):
            parts.append(random_blocks(pool, n, T, generator))
        else:
            parts.append(tokens[:, p0 + r * T : p0 + (r + 1) * T].cpu())
    corrupted = torch.cat(parts, dim=1).to(tokens.device, tokens.dtype)
    return TokenBatch(tokens=corrupted, block_len=T, n_repeats=batch.n_repeats, bos=batch.bos)


__all__ = ["COPIES", "CORRUPTIONS", "DEFAULT_CORRUPT_SEED", "Corruption", "check_mean_over", "position_mean",
           "resampled_batch"]
