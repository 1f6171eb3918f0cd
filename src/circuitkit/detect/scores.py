"""Head scores: every registered score for every head, from one forward pass over repeated random tokens.

Why: "which heads of this model are induction heads?" has a cheap, tokenizer-free answer. Run one batch of
random blocks repeated ``n_repeats`` times (:mod:`circuitkit.detect.tokens`), reduce each layer's attention
pattern inside its hook (no activation cache is kept), and measure how much attention each head puts where
each head type should attend. The scores themselves are definitions in :mod:`circuitkit.detect.registry`;
this module only runs them. The formula is in the registry's docstring; a perfect head scores 1.0.

If the model itself produces NaN attention (e.g. overflowing weights), the affected heads' pattern scores are
NaN, a warning names them, and every ranking puts them last.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from circuitkit import validate
from circuitkit.detect import registry
from circuitkit.detect.registry import ScoreDefinition
from circuitkit.detect.tokens import RepeatedTokens, TokenBatch
from circuitkit.errors import CircuitkitError
from circuitkit.models.adapters import HOOKS, ModelAdapter
from circuitkit.models.state import keeps_model_state
from circuitkit.ranking import Head, head_name, top_heads

ACAUSAL_TOLERANCE = 1e-6
"""Attention above the diagonal beyond this (summed over a row) marks a bidirectional model; float noise is below it."""


class HeadScores(Mapping):
    """``score name -> [layer, head]`` float32 tensor (CPU), in registry order, plus what they were measured on.

    - ``definitions[name]``: the :class:`~circuitkit.detect.registry.ScoreDefinition`, with ``neutral`` set to
      what a uniformly attending head scores on this batch (pattern scores) or the definition's fixed value;
    - ``tokens``: the ``[batch, pos]`` batch; ``patterns``: every head's attention on the first sequence,
      ``[layer, head, pos, pos]``; ``block_len``, ``n_repeats``, ``bos``: how the batch was built;
    - ``bidirectional``: the model attended to later positions (an encoder);
    - ``per_sequence[name]`` (pattern scores): ``(attention [batch, layer, head], rows [batch])``, each sequence's
      attention on the score's targets summed over its query rows, and the rows counted; the score is
      ``attention.sum(0) / rows.sum()`` (a ratio of batch means, what :mod:`circuitkit.uncertainty` resamples).
    """

    def __init__(
        self,
        scores: dict[str, Tensor],
        definitions: dict[str, ScoreDefinition],
        *,
        tokens: Tensor,
        patterns: Tensor,
        block_len: int,
        n_repeats: int,
        bos: int | None,
        bidirectional: bool = False,
        per_sequence: dict[str, tuple[Tensor, Tensor]] | None = None,
    ) -> None:
        self._scores = scores
        self.per_sequence = per_sequence or {}
        self.definitions = definitions
        self.tokens = tokens
        self.patterns = patterns
        self.block_len = block_len
        self.n_repeats = n_repeats
        self.bos = bos
        self.bidirectional = bidirectional

    def __getitem__(self, name: str) -> Float[Tensor, "layer head"]:
        if name not in self._scores:
            raise KeyError(f"{name!r}: expected one of {list(self._scores)}")
        return self._scores[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._scores)

    def __len__(self) -> int:
        return len(self._scores)

    @property
    def n_layers(self) -> int:
        return self.patterns.shape[0]

    @property
    def n_heads(self) -> int:
        return self.patterns.shape[1]

    def _check_name(self, where: str, name: Any) -> str:
        if not isinstance(name, str) or name not in self._scores:
            raise validate.fail(f"HeadScores.{where}: score", name, f"one of {', '.join(map(repr, self._scores))}")
        return name

    def top(self, name: str, k: int = 5) -> list[tuple[Head, float]]:
        """The ``k`` highest-scoring heads for ``name`` as ``((layer, head), score)``, best first, NaN last."""
        return top_heads(self._scores[self._check_name("top", name)], validate.positive_int("HeadScores.top: k", k))

    def to_dataframe(self, sort_by: str = "induction"):
        """A pandas DataFrame, one row per head (``layer``, ``head``, ``name`` "L.H", one column per score),
        sorted by ``sort_by`` descending (NaN last)."""
        import pandas as pd

        self._check_name("to_dataframe", sort_by)
        grid = [(layer, head) for layer in range(self.n_layers) for head in range(self.n_heads)]
        frame = pd.DataFrame(
            {
                "layer": [layer for layer, _ in grid],
                "head": [head for _, head in grid],
                "name": [head_name(h) for h in grid],
                **{name: value.flatten().tolist() for name, value in self._scores.items()},
            }
        )
        return frame.sort_values(sort_by, ascending=False, kind="stable", na_position="last").reset_index(drop=True)

    def patterns_for(self, layer: int, head: int) -> Float[Tensor, "pos pos"]:
        """The attention pattern ``[q_pos, k_pos]`` of head ``(layer, head)`` on the first sequence of ``tokens``."""
        layer = validate.integer("HeadScores.patterns_for: layer", layer, minimum=0, maximum=self.n_layers - 1)
        head = validate.integer("HeadScores.patterns_for: head", head, minimum=0, maximum=self.n_heads - 1)
        return self.patterns[layer, head]

    def __repr__(self) -> str:
        best = ", ".join(f"{name}: {head_name(self.top(name, 1)[0][0])}" for name in self._scores)
        return (
            f"HeadScores({self.n_layers} layers x {self.n_heads} heads on {tuple(self.tokens.shape)} tokens"
            f"{', bidirectional' if self.bidirectional else ''}; best {best})"
        )


class PatternReducer:
    """Turns one layer's patterns ``[batch, head, q, k]`` into ``{score: [head]}`` for the registered pattern
    scores, with the masks built once per batch."""

    def __init__(self, tokens: Int[Tensor, "batch pos"], definitions: tuple[ScoreDefinition, ...],
                 windows: tuple[int | None, ...] | None = None) -> None:
        batch, pos = tokens.shape
        if not definitions:
            raise CircuitkitError(
                "head_scores: given an empty score registry (every pattern score unregistered); expected at least "
                "one registered pattern score. Register one with circuitkit.detect.register(...) (a new Python "
                "process starts with the built-in scores registered)."
            )
        self.definitions = definitions
        self.masked = [d for d in definitions if d.reader is None]
        self.readers = [d for d in definitions if d.reader is not None]
        masks = [self._mask(d, tokens) for d in definitions]
        counts = torch.stack([m.any(dim=2).sum() for m in masks]).float()  # rows with at least one target
        empty = [d.name for d, c in zip(definitions, counts.tolist(), strict=True) if c == 0]
        if empty:
            raise CircuitkitError(
                f"head_scores: no query row has a target for {empty}; expected repeated tokens (block_len >= 2)."
            )
        # neutral: what a head attending uniformly to the keys it sees scores (positions 0..q, or the last w of them
        # in a sliding-window layer): mean over target rows of #visible targets / #visible keys, averaged over layers
        self.neutral = {
            d.name: sum(_neutral(m, c, w) for w in windows or (None,)) / len(windows or (None,))
            for d, m, c in zip(definitions, masks, counts.tolist(), strict=True)
        }
        by_name = dict(zip([d.name for d in definitions], range(len(definitions)), strict=True))
        if self.masked:
            stacked = torch.stack([masks[by_name[d.name]] for d in self.masked], dim=-1)  # [b, q, k, s]
            self.mask_matrix = stacked.float().reshape(batch, pos * pos, len(self.masked))
            self.mask_counts = torch.stack([counts[by_name[d.name]] for d in self.masked])
        self.rows = batch * (pos - 1)
        # per sequence, the rows a score averages over: a score is sum_b num_b / sum_b rows_b (the bootstrap's ratio)
        self.sequence_rows = {d.name: m.any(dim=2).sum(dim=1).float() for d, m in zip(definitions, masks, strict=True)
                              if d.reader is None}
        self.sequence_rows.update({d.name: torch.full((batch,), float(pos - 1), device="cpu") for d in self.readers})
        self.last_per_sequence: dict[str, Tensor] = {}

    @staticmethod
    def _mask(definition: ScoreDefinition, tokens: Tensor) -> Tensor:
        return registry.targets_of(definition, tokens)

    def __call__(self, patterns: Float[Tensor, "batch head q k"]) -> dict[str, Tensor]:
        batch, n_heads, pos, _ = patterns.shape
        out: dict[str, Tensor] = {}
        if self.masked:
            flat = patterns.reshape(batch, n_heads, pos * pos)
            mask = self.mask_matrix.to(device=patterns.device, dtype=patterns.dtype)
            per_sequence = torch.bmm(flat, mask)  # [b, h, s]
            sums = per_sequence.sum(dim=0) / self.mask_counts.to(patterns.device)  # [h, s]
            out.update({d.name: sums[:, i] for i, d in enumerate(self.masked)})
            self.last_per_sequence.update({d.name: per_sequence[:, :, i] for i, d in enumerate(self.masked)})
        for d in self.readers:
            read = registry.read_rows(d, patterns)
            out[d.name] = read.sum(dim=(0, 2)) / self.rows
            self.last_per_sequence[d.name] = read.sum(dim=2)
        return {d.name: out[d.name] for d in self.definitions}


def _neutral(mask: Tensor, count: float, window: int | None) -> float:
    """Mean over rows with a target of (targets among the keys a query sees) / (keys it sees)."""
    pos = mask.shape[-1]
    q = torch.arange(pos, device=mask.device)
    if window is None:
        visible, seen = mask, (q + 1).float()
    else:
        visible = mask & (q[None, :, None] - q[None, None, :] < window)  # key k seen from q when q - k < window
        seen = (q + 1).clamp(max=window).float()
    return float(((visible.sum(dim=2) / seen[None, :]) * mask.any(dim=2)).sum() / count)


class PatternCollector:
    """Hooks that score every layer's pattern as the forward pass goes; :meth:`result` assembles
    :class:`HeadScores`. Shared with other single-pass runners (the scan's clean run)."""

    def __init__(self, adapter: ModelAdapter, batch: TokenBatch) -> None:
        self.adapter = adapter
        self.batch = batch
        self.definitions = registry.registered("pattern")
        self.reduce = PatternReducer(batch.tokens, self.definitions, adapter.spec.windows)
        n_layers = adapter.spec.n_layers
        self.per_layer: dict[int, dict[str, Tensor]] = {}
        self.per_sequence: dict[int, dict[str, Tensor]] = {}  # layer -> score -> [batch, head] attention on targets
        self.first: dict[int, Tensor] = {}
        self.acausal = False
        self.names = {HOOKS.pattern(layer): layer for layer in range(n_layers)}

    def hooks(self) -> list[tuple[str, Any]]:
        return [(name, self._on_pattern) for name in self.names]

    def _on_pattern(self, pattern: Tensor, hook: Any) -> None:
        layer = self.names[hook.name]
        tokens = self.batch.tokens
        spec = self.adapter.spec
        if pattern.ndim != 4 or pattern.shape[0] != tokens.shape[0] or pattern.shape[-2:] != (tokens.shape[1],) * 2:
            raise CircuitkitError(
                f"{hook.name} has shape {tuple(pattern.shape)}; expected [batch, head, q_pos, k_pos] = "
                f"[{tokens.shape[0]}, {spec.n_heads}, {tokens.shape[1]}, {tokens.shape[1]}]."
            )
        pattern = pattern.detach().float()
        first = pattern[0].cpu()
        self.first[layer] = first
        if float(first.nan_to_num(0.0).triu(1).sum(dim=-1).amax()) > ACAUSAL_TOLERANCE:
            self.acausal = True
        self.per_layer[layer] = {name: value.cpu() for name, value in self.reduce(pattern).items()}
        self.per_sequence[layer] = {name: value.float().cpu() for name, value in self.reduce.last_per_sequence.items()}

    def result(self, weights: Any = None) -> HeadScores:
        spec = self.adapter.spec
        missing = sorted(set(range(spec.n_layers)) - set(self.per_layer))
        if missing:
            raise CircuitkitError(
                f"given a {type(self.adapter.model).__name__} that produced no attention patterns in layers "
                f"{missing}; expected the hook blocks.{{layer}}.attn.hook_pattern [batch, head, q_pos, k_pos] in "
                "every layer. Models without attention (or that hide their patterns, e.g. fused SDPA kernels) cannot "
                "be scored this way."
            )
        scores = {
            d.name: torch.stack([self.per_layer[layer][d.name] for layer in range(spec.n_layers)])
            for d in self.definitions
        }
        definitions = {d.name: d.with_neutral(self.reduce.neutral[d.name]) for d in self.definitions}
        bad = [head_name(h) for h in _nan_heads(scores)]
        if bad:
            warnings.warn(
                f"head_scores: the model produced NaN attention in heads {bad[:10]}{' ...' if len(bad) > 10 else ''}"
                "; their scores are NaN and rank last. Check the weights for overflow.",
                stacklevel=3,
            )
        for d in registry.registered("weight"):
            value = registry.compute_scores(d, weights if weights is not None else self.adapter.model,
                                            spec.n_layers, spec.n_heads)
            if value is None:
                continue
            scores[d.name] = value
            definitions[d.name] = d
        bidirectional = spec.bidirectional or self.acausal
        if bidirectional:
            warnings.warn(
                "head_scores: this model attends to later positions (bidirectional attention); scores count only "
                "the attention on each target and are not comparable with causal models'.",
                stacklevel=3,
            )
        return HeadScores(
            scores,
            definitions,
            tokens=self.batch.tokens,
            patterns=torch.stack([self.first[layer] for layer in range(spec.n_layers)]),
            block_len=self.batch.block_len,
            n_repeats=self.batch.n_repeats,
            bos=self.batch.bos,
            bidirectional=bidirectional,
            per_sequence={
                d.name: (torch.stack([self.per_sequence[layer][d.name] for layer in range(spec.n_layers)], dim=1),
                         self.reduce.sequence_rows[d.name])
                for d in self.definitions
            },
        )


def _nan_heads(scores: dict[str, Tensor]) -> list[Head]:
    nan = torch.zeros_like(next(iter(scores.values())), dtype=torch.bool)
    for value in scores.values():
        nan |= value.isnan()
    return [(int(a), int(b)) for a, b in nan.nonzero().tolist()]


PATTERN_SLACK = 1e-3
"""How far above 1 an attention weight may be (a half-precision softmax rounds up to about 1 + 5e-4)."""


def pattern_scores(
    patterns: Float[Tensor, "batch head q k"], tokens: Int[Tensor, "batch pos"]
) -> dict[str, Tensor]:
    """Scores of one layer's heads from their patterns: the attention on each registered pattern score's
    targets, averaged over the query rows that have a target: ``name -> [head]``. Usable on patterns from
    elsewhere."""
    tokens = validate.tensor("pattern_scores: tokens", tokens, ndim=2, integral=True)
    if tokens.numel() == 0 or int(tokens.min()) < 0:
        raise validate.fail("pattern_scores: tokens", tokens, "a non-empty [batch, pos] tensor of token ids >= 0")
    pos = tokens.shape[1]
    patterns = validate.tensor(
        "pattern_scores: patterns", patterns, shape=(tokens.shape[0], None, pos, pos), floating=True, finite=True
    )
    if patterns.numel() and not (float(patterns.min()) >= 0.0 and float(patterns.max()) <= 1.0 + PATTERN_SLACK):
        raise validate.fail("pattern_scores: patterns", validate.given(
            f"values from {float(patterns.min()):.3g} to {float(patterns.max()):.3g}"),
            "attention weights in [0, 1] (each query row a softmax over the keys)")
    return PatternReducer(tokens, registry.registered("pattern"))(patterns.float())


@keeps_model_state
def head_scores(
    model: Any, tokens: RepeatedTokens | TokenBatch | None = None, *, device: str | torch.device | None = None
) -> HeadScores:
    """Score every head with every registered score, from one forward pass over repeated random tokens.

    Args:
        model: a TransformerLens ``TransformerBridge``, a circuitkit ``AttentionOnlyModel``, or any model under
            the contract of :mod:`circuitkit.models.adapters`.
        tokens: a :class:`RepeatedTokens` spec (default ``RepeatedTokens()``) or a built :class:`TokenBatch`;
            pass the same one to :func:`induction_loss` and :func:`ablation_effects` to measure on the same batch.
        device: where the tokens go (default: the model's embedding device).

    Returns:
        :class:`HeadScores`: ``name -> [layer, head]`` for every registered score.
    """
    from circuitkit.detect.session import open_session

    session = open_session(model, tokens, device)
    collector = PatternCollector(session.adapter, session.batch)
    with torch.no_grad():
        session.adapter.run(session.batch.tokens, collector.hooks())
    return collector.result()


__all__ = ["ACAUSAL_TOLERANCE", "HeadScores", "PatternCollector", "PatternReducer", "head_scores", "pattern_scores"]
