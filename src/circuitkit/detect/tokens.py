"""Repeated random token batches: one spec (:class:`RepeatedTokens`), one built batch (:class:`TokenBatch`).

Why a module of its own: head scores, the induction loss, ablation, attribution and path patching all
measure on the same batch, and must agree on where the copies are, which positions have a target, and
what to do with a BOS token. Every entry point takes one :class:`RepeatedTokens` (or an already built
:class:`TokenBatch`), so "the same batch" is one object, not five argument lists kept in step.

A batch is ``[batch, pos]`` with ``pos = n_repeats * block_len (+ 1 with a BOS)``: per sequence, one random
block of ``block_len`` tokens repeated ``n_repeats`` times, optionally after a BOS token. Within a block the
tokens are drawn without replacement when the token range allows it (so every repeated token has exactly
one earlier occurrence per earlier copy), with replacement otherwise. The BOS id is never drawn.

Prediction positions. The token at position ``t`` is predicted from position ``t - 1``; index ``t - 1`` of
a ``[pos - 1]`` mask refers to it. With ``p0`` = 1 if there is a BOS else 0 and ``T = block_len``, the first
token of each copy cannot be predicted by any mechanism (what follows the block's last token is new), so::

    first_copy       t in p0 + 1 .. p0 + T - 1                     (the first copy)
    repeated_copies  t in p0 + r T + 1 .. p0 + (r + 1) T - 1       for r = 1 .. n_repeats - 1
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from circuitkit import validate
from circuitkit.detect.targets import (  # noqa: F401  (re-exported: the target masks used to live here)
    current_targets,
    duplicate_targets,
    first_targets,
    induction_targets,
    previous_targets,
)
from circuitkit.errors import CircuitkitError
from circuitkit.models.adapters import ModelAdapter, ModelSpec, adapt
from circuitkit.models.state import keeps_model_state

DEFAULT_BLOCK_LEN = 20
"""Default repeated-block length: long enough that chance matches are rare, short enough to be cheap."""


@dataclass(frozen=True)
class RepeatedTokens:
    """How to draw a batch of repeated random tokens (a spec; :meth:`build` makes the batch for a model).

    - ``block_len``: length of the random block (default :data:`DEFAULT_BLOCK_LEN`, or less to fit ``n_ctx``);
    - ``n_repeats``: copies of the block (>= 2); ``batch``: sequences; ``seed``: seeds the draw;
    - ``bos``: BOS token id; ``None`` uses the model tokenizer's BOS (none without a tokenizer); ``False``: none;
    - ``token_range``: ``(low, high)`` ids the block is drawn from (default the whole vocabulary).
    """

    block_len: int | None = None
    n_repeats: int = 2
    batch: int = 16
    seed: int = 0
    bos: int | bool | None = None
    token_range: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.block_len is not None:
            validate.integer(
                "RepeatedTokens: block_len",
                self.block_len,
                minimum=2,
                why="with a block of length 1 every position repeats its predecessor, so the induction target "
                "(the token after the earlier copy) is the current token and there is nothing to match",
            )
        validate.integer(
            "RepeatedTokens: n_repeats", self.n_repeats, minimum=2, why="a single copy has no repeat to find"
        )
        validate.positive_int("RepeatedTokens: batch", self.batch)
        validate.seed("RepeatedTokens: seed", self.seed)
        if not (self.bos is None or isinstance(self.bos, bool) and self.bos is False):
            validate.integer("RepeatedTokens: bos", self.bos, minimum=0, why="a token id, None or False")
        if self.token_range is not None:
            pair = self.token_range
            if not isinstance(pair, tuple) or len(pair) != 2:
                raise validate.fail("RepeatedTokens: token_range", pair, "a tuple (low, high) of token ids")
            validate.integer("RepeatedTokens: token_range low", pair[0], minimum=0)
            validate.integer("RepeatedTokens: token_range high", pair[1], minimum=1)

    @keeps_model_state
    def build(self, model: Any, device: str | torch.device | None = None) -> TokenBatch:
        """The ``[batch, pos]`` batch for ``model`` (or a :class:`ModelAdapter`), on the model's device (or
        ``device``). Deterministic for a given spec and vocabulary."""
        spec = adapt(model, device, place_model=False).spec
        bos = _resolve_bos(self.bos, spec)
        prefix = 0 if bos is None else 1
        block_len = self.block_len
        if block_len is None:
            block_len = DEFAULT_BLOCK_LEN
            if spec.n_ctx is not None:
                block_len = max(2, min(block_len, (spec.n_ctx - prefix) // self.n_repeats))
        total = self.n_repeats * block_len + prefix
        if spec.n_ctx is not None and total > spec.n_ctx:
            raise CircuitkitError(
                f"RepeatedTokens: block_len={block_len} x n_repeats={self.n_repeats}{' + BOS' if prefix else ''} "
                f"gives sequences of {total} tokens; expected at most the model's context n_ctx={spec.n_ctx}. "
                "Lower block_len."
            )
        low, high = self.token_range if self.token_range is not None else (0, spec.d_vocab)
        if not low < high <= spec.d_vocab:
            raise CircuitkitError(
                f"RepeatedTokens: token_range given {self.token_range!r}; expected (low, high) with 0 <= low < high "
                f"<= d_vocab = {spec.d_vocab} (token ids outside the vocabulary cannot be embedded)."
            )
        candidates = torch.arange(low, high, device="cpu")
        if bos is not None:
            candidates = candidates[candidates != bos]
        if candidates.numel() < 2:
            raise CircuitkitError(
                f"RepeatedTokens: token_range {self.token_range!r} leaves {candidates.numel()} token id(s) besides "
                "the BOS; expected at least 2."
            )
        block = random_blocks(candidates, self.batch, block_len, torch.Generator().manual_seed(self.seed))
        parts = [block] * self.n_repeats
        if bos is not None:
            parts.insert(0, torch.full((self.batch, 1), bos, dtype=torch.long, device="cpu"))
        tokens = torch.cat(parts, dim=1).to(spec.device)
        return TokenBatch(tokens=tokens, block_len=block_len, n_repeats=self.n_repeats, bos=bos)


@dataclass(frozen=True, eq=False)
class TokenBatch:
    """A built batch: ``tokens`` ``[batch, pos]`` and where its copies are (see the module docstring)."""

    tokens: Int[Tensor, "batch pos"]
    block_len: int
    n_repeats: int
    bos: int | None

    @property
    def prefix(self) -> int:
        """1 with a BOS token at position 0, else 0."""
        return 0 if self.bos is None else 1

    @property
    def batch(self) -> int:
        return self.tokens.shape[0]

    @property
    def pos(self) -> int:
        return self.tokens.shape[1]

    def _copy_masks(self) -> tuple[Tensor, Tensor]:
        t = torch.arange(1, self.pos, device="cpu")
        offset = t - self.prefix
        copy = offset.div(self.block_len, rounding_mode="floor")
        inside = (offset % self.block_len) != 0  # each copy's first token is unpredictable
        first = (copy == 0) & inside & (offset >= 0)
        repeated = (copy >= 1) & (copy < self.n_repeats) & inside
        return first, repeated

    @property
    def first_copy(self) -> Bool[Tensor, " pos_minus_1"]:
        """Prediction indices ``t - 1`` of the first copy (CPU)."""
        return self._copy_masks()[0]

    @property
    def repeated_copies(self) -> Bool[Tensor, " pos_minus_1"]:
        """Prediction indices ``t - 1`` of the second and later copies (CPU)."""
        return self._copy_masks()[1]

    def targets(self, name: str) -> Bool[Tensor, "batch q k"]:
        """The ``[batch, q, k]`` target mask of the registered pattern score ``name``."""
        from circuitkit.detect.registry import get  # the registry imports scores' definitions: at call time

        definition = get(name)
        if definition.targets is None:
            raise validate.fail("TokenBatch.targets: name", name, "a pattern score (weight scores have no targets)")
        return definition.targets(self.tokens)


def random_blocks(pool: Tensor, batch: int, length: int, generator: torch.Generator) -> Tensor:
    """``[batch, length]`` ids drawn from the 1-d ``pool``: distinct within each row (a random permutation's first
    ``length``) when the pool has ``length`` ids or more, with replacement otherwise. The one sampler of random
    blocks (token batches, resampled corruptions, the zoo's training data), so that equal seeds draw equal blocks."""
    if pool.numel() >= length:
        index = torch.rand(batch, pool.numel(), generator=generator, device="cpu").argsort(dim=-1)[:, :length]
    else:
        index = torch.randint(pool.numel(), (batch, length), generator=generator)
    return pool[index]


def as_batch(tokens: RepeatedTokens | TokenBatch | None, adapter: ModelAdapter) -> TokenBatch:
    """``tokens`` built for ``adapter``'s model (``None``: the default :class:`RepeatedTokens`)."""
    if tokens is None:
        tokens = RepeatedTokens()
    if isinstance(tokens, RepeatedTokens):
        return tokens.build(adapter)
    if isinstance(tokens, TokenBatch):
        spec = adapter.spec
        ids = validate.tensor("tokens: TokenBatch.tokens", tokens.tokens, ndim=2, integral=True)
        if ids.numel() == 0:
            raise validate.fail("tokens", ids, "a non-empty TokenBatch")
        if ids.ndim != 2 or ids.shape[1] != tokens.n_repeats * tokens.block_len + tokens.prefix:
            raise validate.fail("tokens", ids, "a TokenBatch whose tokens are [batch, n_repeats * block_len (+1)]")
        if int(ids.min()) < 0 or int(ids.max()) >= spec.d_vocab:
            raise CircuitkitError(
                f"tokens: given token ids in [{int(ids.min())}, {int(ids.max())}]; expected ids in "
                f"[0, {spec.d_vocab}) (the model's vocabulary)."
            )
        if ids.device != spec.device or ids.dtype != torch.long:  # int64 ids: a uint8 tensor indexes as a mask
            tokens = TokenBatch(ids.to(device=spec.device, dtype=torch.long), tokens.block_len, tokens.n_repeats,
                                tokens.bos)
        return tokens
    raise validate.fail("tokens", tokens, "a circuitkit.detect.RepeatedTokens spec, a TokenBatch, or None")


def _resolve_bos(bos: int | bool | None, spec: ModelSpec) -> int | None:
    """``None``: the model tokenizer's BOS (if it prepends one); ``False``: no BOS; an int: that token id."""
    if bos is None:
        return spec.default_bos
    if bos is False:
        return None
    if not 0 <= bos < spec.d_vocab:
        raise CircuitkitError(
            f"RepeatedTokens: bos given token id {bos}; expected an id in the vocabulary [0, {spec.d_vocab}). "
            "Pass bos=False for no BOS token."
        )
    return int(bos)


__all__ = [
    "DEFAULT_BLOCK_LEN",
    "RepeatedTokens",
    "TokenBatch",
    "as_batch",
    "current_targets",
    "duplicate_targets",
    "first_targets",
    "induction_targets",
    "previous_targets",
    "random_blocks",
]
