"""Assemble hand-built heads into :class:`HeadWeights` and a runnable :class:`AttentionOnlyModel`.

Each :class:`~circuitkit.handbuilt.heads.HeadSpec` of rank ``r <= d_head`` is padded with zero columns (rows for
``W_O``) to ``d_head``; padding changes no raw score ``q . k`` and no output, but the model divides scores by
``sqrt(d_head)`` (as TransformerLens), so under soft attention a larger ``d_head`` flattens the patterns unless
``attn_scale`` is pinned. Hard attention does not depend on the scale. Layers with fewer heads than the widest layer
get empty heads (zero weights: uniform attention, no output).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from circuitkit import validate
from circuitkit.errors import CircuitkitError, describe
from circuitkit.handbuilt import limits
from circuitkit.handbuilt.heads import HeadSpec
from circuitkit.models.toy import AttentionMode, AttentionOnlyModel
from circuitkit.weights import HeadWeights


def assemble_weights(
    layers: Sequence[Sequence[HeadSpec]],
    *,
    d_model: int | None = None,
    d_head: int | None = None,
    W_E: Tensor | None = None,
    W_U: Tensor | None = None,
    W_pos: Tensor | None = None,
) -> HeadWeights:
    """``layers[l][h]`` -> :class:`HeadWeights` (``d_head`` defaults to the largest head rank).

    ``W_Q/W_K/W_V [layer, head, d_model, d_head]``, ``W_O [layer, head, d_head, d_model]``; ``b_Q`` is set when
    any head has a query bias. ``d_model`` is read from the heads (or ``W_E``) unless given; ``d_model`` and
    ``d_head`` are ints in ``[1, MAX_WIDTH]`` (:data:`circuitkit.handbuilt.limits.MAX_WIDTH`).
    """
    d_model = limits.optional_width("assemble: d_model", d_model)
    d_head = limits.optional_width("assemble: d_head", d_head)
    if W_E is not None:
        W_E = validate.tensor("assemble: W_E", W_E, ndim=2, floating=True, finite=True)
    if isinstance(layers, (str, bytes)) or not isinstance(layers, Sequence) or len(layers) == 0:
        raise CircuitkitError(
            f"assemble: given {describe(layers)}; expected a non-empty list of layers, each a list of HeadSpec."
        )
    for l_idx, layer in enumerate(layers):
        if not isinstance(layer, Sequence) or not all(isinstance(h, HeadSpec) for h in layer):
            raise CircuitkitError(f"assemble: layer {l_idx} is {describe(layer)}; expected a list of HeadSpec.")
    widths = {h.d_model for layer in layers for h in layer if h.d_model is not None}
    if W_E is not None:
        widths.add(W_E.shape[-1])
    if d_model is not None:
        widths.add(d_model)
    if len(widths) != 1:
        raise CircuitkitError(
            f"assemble: given heads and embeddings on residual widths {sorted(widths) or 'none'}; expected exactly "
            "one d_model (pass d_model= when no head has weights)."
        )
    (d_model,) = widths
    ranks = {(li, h): spec.rank for li, layer in enumerate(layers) for h, spec in enumerate(layer)}
    needed = max(ranks.values(), default=1) or 1
    if d_head is None:
        d_head = needed
    if d_head < needed:
        worst = [f"{li}.{h} (rank {r})" for (li, h), r in ranks.items() if r > d_head]
        raise CircuitkitError(
            f"assemble: given d_head={d_head}; heads {', '.join(worst)} need more. Expected d_head >= {needed}: "
            "raise d_head or give those heads fewer dimensions."
        )
    n_layers, n_heads = len(layers), max(len(layer) for layer in layers)
    if n_heads == 0:
        raise CircuitkitError("assemble: given layers with no heads; expected at least one HeadSpec.")
    W_Q = torch.zeros(n_layers, n_heads, d_model, d_head)
    W_K = torch.zeros_like(W_Q)
    W_V = torch.zeros_like(W_Q)
    W_O = torch.zeros(n_layers, n_heads, d_head, d_model)
    b_Q = torch.zeros(n_layers, n_heads, d_head)
    any_bias = False
    for li, layer in enumerate(layers):
        for h, spec in enumerate(layer):
            if spec.qk is not None:
                r = spec.qk.rank
                W_Q[li, h, :, :r] = spec.qk.W_Q
                W_K[li, h, :, :r] = spec.qk.W_K
                if spec.qk.b_Q is not None:
                    b_Q[li, h, :r] = spec.qk.b_Q
                    any_bias = True
            if spec.ov is not None:
                r = spec.ov.rank
                W_V[li, h, :, :r] = spec.ov.W_V
                W_O[li, h, :r, :] = spec.ov.W_O
    return HeadWeights(
        W_Q=W_Q, W_K=W_K, W_V=W_V, W_O=W_O, b_Q=b_Q if any_bias else None, W_E=W_E, W_U=W_U, W_pos=W_pos
    )


def assemble(
    layers: Sequence[Sequence[HeadSpec]],
    *,
    d_model: int | None = None,
    d_head: int | None = None,
    W_E: Tensor | None = None,
    W_U: Tensor | None = None,
    W_pos: Tensor | None = None,
    attention: AttentionMode = "soft",
    n_ctx: int | None = None,
    attn_scale: float | None = None,
) -> AttentionOnlyModel:
    """:func:`assemble_weights`, run as an :class:`AttentionOnlyModel` with ``"soft"`` or ``"hard"`` attention.

    ``attn_scale`` divides the scores (``sqrt(d_head)`` when ``None``); ``n_ctx`` is ``None`` or an int in
    ``[1, MAX_POSITIONS]``.
    """
    if n_ctx is not None:
        n_ctx = limits.positions("assemble: n_ctx", n_ctx)
    weights = assemble_weights(layers, d_model=d_model, d_head=d_head, W_E=W_E, W_U=W_U, W_pos=W_pos)
    return AttentionOnlyModel(weights, attention=attention, n_ctx=n_ctx, attn_scale=attn_scale)
