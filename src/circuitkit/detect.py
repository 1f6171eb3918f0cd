"""Find induction, previous-token, duplicate-token, current-token, first-token and copying heads.

Why: the question "which heads of this model are induction heads?" has a cheap, tokenizer-free answer.
Run one batch of random token blocks repeated ``n_repeats`` times through the model, look only at the
attention patterns (reduced layer by layer inside hooks, so no activation cache is kept), and measure
how much attention each head puts where each head type should attend. The target definitions and the
token batch are in :mod:`circuitkit.detect_tokens`; the causal checks (induction loss, ablation) are in
:mod:`circuitkit.detect_ablation` and re-exported here.

Score of head ``h`` for target mask ``M`` (``[batch, q, k]``, see :mod:`circuitkit.detect_tokens`)::

    score_h = sum_{b,q,k} A_h[b,q,k] M[b,q,k] / #{(b,q) : row q of M[b] has a target}

with ``A_h`` the head's attention pattern (rows sum to 1). A head that puts all its attention on its
targets scores exactly 1.0; rows without a target do not dilute the score.

The **copying** score is a weight-based score (no forward pass): with the full OV circuit
``W_E W_V W_O W_U`` (row convention, ``[d_vocab, d_vocab]``, rank <= ``d_head``) and ``lambda`` its non-zero
eigenvalues, computed from the ``d_head x d_head`` core ``W_O (W_U W_E) W_V`` (the same non-zero eigenvalues
as :func:`circuitkit.factored.full_ov_circuit`'s), ``copying = Re(sum lambda) / sum |lambda|`` in ``[-1, 1]``:
+1 for a head whose OV circuit only copies. LayerNorm and MLPs are ignored (the direct path).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from circuitkit.detect_ablation import AblationEffects, InductionLoss, ablation_effects, induction_loss
from circuitkit.detect_tokens import TARGETS, model_info, repeated_tokens, resolve_bos
from circuitkit.errors import CircuitkitError
from circuitkit.weights import HeadWeights

__all__ = [
    "SCORE_NAMES",
    "AblationEffects",
    "HeadScores",
    "InductionLoss",
    "ablation_effects",
    "copying_scores",
    "head_scores",
    "induction_loss",
    "pattern_scores",
]

SCORE_NAMES = ("induction", "previous_token", "duplicate_token", "current_token", "first_token", "copying")

ACAUSAL_TOLERANCE = 1e-6
"""Attention above the diagonal beyond this (summed over a row) marks a bidirectional model; float noise is below it."""


class HeadScores(Mapping):
    """``score name -> [layer, head]`` float32 tensor (CPU), plus the batch the scores were measured on.

    Keys are :data:`SCORE_NAMES` (``"copying"`` only when the model has ``W_E`` and ``W_U``). ``tokens`` is
    the ``[batch, pos]`` batch; :meth:`patterns_for` gives the first sequence's attention pattern of one head.
    ``bidirectional`` is True when the model attended to later positions (an encoder).
    """

    def __init__(
        self,
        scores: dict[str, Tensor],
        *,
        tokens: Tensor,
        first_patterns: Tensor,
        seq_len: int,
        n_repeats: int,
        bos: int | None,
        bidirectional: bool,
    ) -> None:
        self._scores = scores
        self.tokens = tokens
        self._first_patterns = first_patterns  # [layer, head, pos, pos], first sequence only
        self.seq_len = seq_len
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
        return self._first_patterns.shape[0]

    @property
    def n_heads(self) -> int:
        return self._first_patterns.shape[1]

    def top(self, name: str, k: int = 5) -> list[tuple[tuple[int, int], float]]:
        """The ``k`` highest-scoring heads for ``name`` as ``((layer, head), score)``, best first."""
        if name not in self._scores:
            raise CircuitkitError(f"HeadScores.top: given score {name!r}; expected one of {list(self._scores)}.")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise CircuitkitError(f"HeadScores.top: given k={k!r}; expected a positive int.")
        flat = self._scores[name].flatten()
        values, index = flat.topk(min(k, flat.numel()))
        n_heads = self.n_heads
        return [((int(i) // n_heads, int(i) % n_heads), float(v)) for v, i in zip(values, index, strict=True)]

    def to_dataframe(self, sort_by: str = "induction"):
        """A pandas DataFrame, one row per head (``layer``, ``head``, ``name`` "L.H", one column per score),
        sorted by ``sort_by`` descending."""
        import pandas as pd

        if sort_by not in self._scores:
            raise CircuitkitError(
                f"HeadScores.to_dataframe: given sort_by={sort_by!r}; expected one of {list(self._scores)}."
            )
        grid = [(layer, head) for layer in range(self.n_layers) for head in range(self.n_heads)]
        frame = pd.DataFrame(
            {
                "layer": [layer for layer, _ in grid],
                "head": [head for _, head in grid],
                "name": [f"{layer}.{head}" for layer, head in grid],
                **{name: value.flatten().tolist() for name, value in self._scores.items()},
            }
        )
        return frame.sort_values(sort_by, ascending=False, kind="stable").reset_index(drop=True)

    def patterns_for(self, layer: int, head: int) -> Float[Tensor, "pos pos"]:
        """The attention pattern ``[q_pos, k_pos]`` of head ``(layer, head)`` on the first sequence of ``tokens``."""
        if not (0 <= layer < self.n_layers and 0 <= head < self.n_heads):
            raise CircuitkitError(
                f"HeadScores.patterns_for: given head ({layer}, {head}); expected layer in [0, {self.n_layers}) "
                f"and head in [0, {self.n_heads})."
            )
        return self._first_patterns[layer, head]

    def __repr__(self) -> str:
        best = ", ".join(f"{name}: {self.top(name, 1)[0][0]}" for name in self._scores)
        return (
            f"HeadScores({self.n_layers} layers x {self.n_heads} heads on {tuple(self.tokens.shape)} tokens"
            f"{', bidirectional' if self.bidirectional else ''}; best {best})"
        )


# ---------------------------------------------------------------------- pattern scores
# Scores whose target is one fixed key per query row (rows 1 .. pos-1): read straight off the pattern as views.
_ONE_TARGET_PER_ROW: dict[str, Callable[[Tensor], Tensor]] = {
    "previous_token": lambda p: p.diagonal(offset=-1, dim1=-2, dim2=-1),  # [b, h, pos-1]: p[i, i-1]
    "current_token": lambda p: p.diagonal(dim1=-2, dim2=-1)[..., 1:],  # p[i, i], i >= 1
    "first_token": lambda p: p[..., 1:, 0],  # p[i, 0], i >= 1
}
# Scores whose targets depend on the tokens: a [batch, q, k] mask each, contracted with one batched matmul.
_TOKEN_TARGETS = tuple(name for name in TARGETS if name not in _ONE_TARGET_PER_ROW)


class _Reducer:
    """Precomputed masks for one token batch; ``__call__(patterns [b, h, q, k]) -> {name: [h]}``."""

    def __init__(self, tokens: Int[Tensor, "batch pos"], dtype: torch.dtype = torch.float32) -> None:
        batch, pos = tokens.shape
        masks = torch.stack([TARGETS[name](tokens) for name in _TOKEN_TARGETS], dim=-1)  # [b, q, k, s]
        counts = masks.any(dim=2).sum(dim=(0, 1))  # [s]: rows with at least one target
        if bool((counts == 0).any()):
            empty = [name for name, c in zip(_TOKEN_TARGETS, counts.tolist(), strict=True) if c == 0]
            raise CircuitkitError(f"no query row has a target for {empty}; expected repeated tokens.")
        self.masks = masks.to(dtype).reshape(batch, pos * pos, len(_TOKEN_TARGETS))
        self.counts = counts.to(dtype)
        self.rows = batch * (pos - 1)

    def __call__(self, patterns: Float[Tensor, "batch head q k"]) -> dict[str, Tensor]:
        batch, n_heads, pos, _ = patterns.shape
        flat = patterns.reshape(batch, n_heads, pos * pos)
        token_scores = torch.bmm(flat, self.masks.to(patterns.dtype)).sum(dim=0) / self.counts  # [h, s]
        out = {name: token_scores[:, i] for i, name in enumerate(_TOKEN_TARGETS)}
        for name, read in _ONE_TARGET_PER_ROW.items():
            out[name] = read(patterns).sum(dim=(0, 2)) / self.rows
        return {name: out[name] for name in TARGETS}


def pattern_scores(
    patterns: Float[Tensor, "batch head q k"], tokens: Int[Tensor, "batch pos"]
) -> dict[str, Tensor]:
    """Scores of one layer's heads from their patterns: the attention on each target set, averaged over the
    query rows that have a target: ``name -> [head]``. Pure function, usable on patterns from elsewhere."""
    if patterns.ndim != 4 or tokens.ndim != 2 or patterns.shape[-2:] != (tokens.shape[1],) * 2:
        raise CircuitkitError(
            f"pattern_scores: given patterns of shape {tuple(patterns.shape)} and tokens of shape "
            f"{tuple(tokens.shape)}; expected [batch, head, pos, pos] and [batch, pos]."
        )
    return _Reducer(tokens, patterns.dtype)(patterns)


def copying_scores(weights: Any) -> Float[Tensor, "layer head"] | None:
    """``Re(sum lambda) / sum |lambda|`` over the full OV circuit's eigenvalues per head (see module docstring).

    The non-zero eigenvalues of ``W_E W_V W_O W_U`` are those of the ``d_head x d_head`` core
    ``W_O (W_U W_E) W_V``; ``W_U W_E`` (``d_model x d_model``) is built once for all heads, so the cost is
    ``d_model^2 d_vocab`` once plus ``d_model^2 d_head`` per head, and nothing ``d_vocab``-sized per head.
    ``None`` when the model (or :class:`HeadWeights`) has no ``W_E``/``W_U``.
    """
    try:
        w = weights if isinstance(weights, HeadWeights) else HeadWeights.from_model(weights)
    except CircuitkitError:
        return None
    if w.W_E is None or w.W_U is None:
        return None
    with torch.no_grad():
        unembed_embed = w.W_U @ w.W_E  # [d_model, d_model]
        core = w.W_O @ unembed_embed @ w.per_query_head("W_V")  # [layer, head, d_head, d_head]
        eig = torch.linalg.eigvals(core)
        total = eig.abs().sum(dim=-1)
        score = eig.real.sum(dim=-1) / total.clamp_min(torch.finfo(total.dtype).tiny)
    return score.float().cpu()


def head_scores(
    model: Any,
    *,
    seq_len: int | None = None,
    n_repeats: int = 2,
    batch: int = 16,
    seed: int = 0,
    bos: int | bool | None = None,
    device: str | torch.device | None = None,
    token_range: tuple[int, int] | None = None,
) -> HeadScores:
    """Score every head on one batched forward pass over random repeated tokens.

    Args:
        model: a TransformerLens ``TransformerBridge``, a circuitkit ``AttentionOnlyModel``, or any model
            with ``cfg.n_layers/n_heads/d_vocab`` and ``run_with_hooks`` (or ``run_with_cache``) exposing
            ``blocks.{l}.attn.hook_pattern`` as ``[batch, head, q_pos, k_pos]``.
        seq_len: length of the random block (default 20, or less to fit ``n_ctx``); total sequence length
            is ``n_repeats * seq_len`` (+1 with a BOS).
        n_repeats: copies of the block (>= 2).
        batch: sequences in the batch. seed: seeds the tokens.
        bos: BOS token id; ``None`` uses the model tokenizer's BOS (none without a tokenizer); ``False``: none.
        device: where the tokens go (default: the model's device).
        token_range: ``(low, high)`` ids the random tokens are drawn from (default the whole vocabulary).

    Returns:
        :class:`HeadScores`: ``name -> [layer, head]`` for the names in :data:`SCORE_NAMES`.
    """
    info = model_info(model, device)
    bos_id = resolve_bos(bos, info)
    tokens = repeated_tokens(
        info,
        seq_len=seq_len,
        n_repeats=n_repeats,
        batch=batch,
        seed=seed,
        bos=False if bos_id is None else bos_id,
        token_range=token_range,
    )
    block = (tokens.shape[1] - (bos_id is not None)) // n_repeats
    reduce = _Reducer(tokens)

    per_layer: dict[int, dict[str, Tensor]] = {}
    first: dict[int, Tensor] = {}
    acausal = [False]

    def on_pattern(layer: int, pattern: Tensor) -> None:
        if pattern.ndim != 4 or pattern.shape[0] != tokens.shape[0] or pattern.shape[-2:] != (tokens.shape[1],) * 2:
            raise CircuitkitError(
                f"blocks.{layer}.attn.hook_pattern has shape {tuple(pattern.shape)}; expected [batch, head, "
                f"q_pos, k_pos] = [{tokens.shape[0]}, {info.n_heads}, {tokens.shape[1]}, {tokens.shape[1]}]."
            )
        pattern = pattern.float()
        first[layer] = pattern[0].detach().cpu()
        if float(first[layer].triu(1).sum(dim=-1).amax()) > ACAUSAL_TOLERANCE:  # first sequence suffices
            acausal[0] = True
        per_layer[layer] = reduce(pattern)

    _run_patterns(model, tokens, info.n_layers, on_pattern)

    scores = {name: torch.stack([per_layer[layer][name] for layer in range(info.n_layers)]).cpu() for name in TARGETS}
    copying = copying_scores(model)
    if copying is not None:
        scores["copying"] = copying
    bidirectional = info.bidirectional or acausal[0]
    if bidirectional:
        warnings.warn(
            "head_scores: this model attends to later positions (bidirectional attention); scores count only "
            "the attention on each target and are not comparable with causal models'.",
            stacklevel=2,
        )
    return HeadScores(
        scores,
        tokens=tokens,
        first_patterns=torch.stack([first[layer] for layer in range(info.n_layers)]),
        seq_len=block,
        n_repeats=n_repeats,
        bos=bos_id,
        bidirectional=bidirectional,
    )


def pattern_hook_name(layer: int) -> str:
    return f"blocks.{layer}.attn.hook_pattern"


def _run_patterns(model: Any, tokens: Tensor, n_layers: int, on_pattern) -> None:
    """Call ``on_pattern(layer, pattern)`` for every layer, through hooks if possible, else a filtered cache."""
    names = {pattern_hook_name(layer): layer for layer in range(n_layers)}
    seen: set[int] = set()
    with torch.no_grad():
        if callable(getattr(model, "run_with_hooks", None)):

            def hook(pattern: Tensor, hook: Any) -> None:
                seen.add(names[hook.name])
                on_pattern(names[hook.name], pattern)

            try:
                model.run_with_hooks(tokens, fwd_hooks=[(name, hook) for name in names])
            except KeyError as error:
                raise _no_patterns(model, error) from error
        else:
            try:
                _, cache = model.run_with_cache(tokens, names_filter=lambda name: name in names)
            except KeyError as error:
                raise _no_patterns(model, error) from error
            for name, layer in names.items():
                if name in cache:
                    seen.add(layer)
                    on_pattern(layer, cache[name])
    missing = sorted(set(names.values()) - seen)
    if missing:
        raise _no_patterns(model, f"no pattern from layers {missing}")


def _no_patterns(model: Any, detail: Any) -> CircuitkitError:
    return CircuitkitError(
        f"given a {type(model).__name__} that produced no attention patterns ({detail}); expected the hook "
        "blocks.{layer}.attn.hook_pattern [batch, head, q_pos, k_pos] in every layer. Models without "
        "attention (or that hide their patterns, e.g. fused SDPA kernels) cannot be scored this way."
    )
