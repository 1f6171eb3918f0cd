"""Turn circuitkit weights (a toy model, hand-built or read from anywhere) into a TransformerLens bridge.

Why: every TransformerLens tool (``run_with_cache``, hooks, ``FactoredMatrix`` via ``.QK``/``.OV``,
activation patching code written for TransformerLens) then runs on a circuit built by hand.

How: ``transformer_lens.model_bridge.sources.native.boot`` builds a random-init attention-only TL-native
model with no LayerNorm (``normalization_type=None``) and standard learned positions; its parameters are then
overwritten. The native model's linear layers store ``nn.Linear`` weights ``[out, in]``, so per layer::

    q.weight [head*d_head, d_model]     = W_Q[l] (head, d_model, d_head) -> permute to (head, d_head, d_model)
    k/v.weight [kv*d_head, d_model]     = W_K/W_V[l] likewise
    o.weight [d_model, head*d_head]     = W_O[l] (head, d_head, d_model) -> (head*d_head, d_model) -> transposed
    tok_embed.weight = W_E, pos.weight = W_pos, head.weight = W_U.T, biases = b_* (zeros when absent)

The native attention divides scores by ``sqrt(d_head)`` (or ``cfg.attn_scale``), applies the causal mask and a
softmax, exactly the toy model's soft mode, so logits and cached activations agree.
"""

from __future__ import annotations

from typing import Any

import torch

from circuitkit import validate
from circuitkit.errors import CircuitkitError
from circuitkit.models.toy import DEFAULT_N_CTX, AttentionOnlyModel, shape_fields
from circuitkit.weights import HeadWeights


def native_bridge(*, tokenizer: Any = None, model_name: str | None = None, dtype: torch.dtype | None = None,
                  **fields: Any) -> Any:
    """A TransformerLens-native ``TransformerBridge`` built offline (no download) from ``TransformerBridgeConfig``
    fields (``n_layers``, ``n_heads``, ``d_model``, ``d_head``, ``d_vocab``, ``n_ctx``, ``attn_only``, ``seed``,
    ...), random-initialised, in eval mode. The one place circuitkit, its tests and benchmarks build one."""
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge.sources.native import boot

    options = {"tokenizer": tokenizer, "model_name": model_name, "dtype": dtype}
    options = {key: value for key, value in options.items() if value is not None}
    bridge = boot(TransformerBridgeConfig(**fields), **options)
    bridge.eval()
    return bridge


def to_bridge(model_or_weights: Any, *, device: str | torch.device | None = None) -> Any:
    """A TransformerLens ``TransformerBridge`` computing the same function as the (soft) toy model.

    ``model_or_weights``: an :class:`~circuitkit.models.AttentionOnlyModel` (its ``attn_scale`` is carried
    over) or anything :meth:`HeadWeights.from_model` reads. The weights must include ``W_E`` and ``W_U``
    (a bridge takes token ids); a missing ``W_pos`` becomes zeros with the model's ``n_ctx``.
    Hard-attention models are refused: a bridge only does softmax attention.
    """
    device = validate.device("to_bridge: device", device)
    attn_scale = None
    n_ctx = None
    if isinstance(model_or_weights, AttentionOnlyModel):
        if model_or_weights.cfg.attention != "soft":
            raise CircuitkitError(
                "to_bridge: given a model with hard (argmax) attention; expected soft attention, the only kind "
                "a TransformerBridge computes. Use model.with_attention('soft')."
            )
        attn_scale = model_or_weights.cfg.attn_scale
        n_ctx = model_or_weights.cfg.n_ctx
    w = HeadWeights.from_model(model_or_weights)
    missing = [name for name in ("W_E", "W_U") if getattr(w, name) is None]
    if missing:
        raise CircuitkitError(
            f"to_bridge: given weights with no {' and '.join(missing)}; expected an embedding and an unembedding, "
            "since a TransformerBridge takes token ids. Models on residual inputs run only as AttentionOnlyModel."
        )
    if w.W_pos is not None:
        n_ctx = w.W_pos.shape[0]
    n_ctx = n_ctx or DEFAULT_N_CTX
    d_vocab = w.W_E.shape[0]
    if w.W_U.shape[1] != d_vocab:
        raise CircuitkitError(
            f"to_bridge: W_E has {d_vocab} tokens but W_U has {w.W_U.shape[1]}; expected the same vocabulary."
        )
    extra = {} if attn_scale is None else {"use_attn_scale": True, "attn_scale": float(attn_scale)}
    bridge = native_bridge(
        dtype=w.dtype,
        **shape_fields(w),
        d_vocab=d_vocab,
        n_ctx=n_ctx,
        attn_only=True,
        normalization_type=None,
        positional_embedding_type="standard",
        seed=0,
        **extra,
    )
    _load(bridge.original_model, w, n_ctx)
    if device is not None:
        bridge = bridge.to(device)
    return bridge


def _native_state(w: HeadWeights, n_ctx: int) -> dict[str, torch.Tensor]:
    """The native model's parameters, by their names with the bridge's wrappers removed."""
    L, H, d_model, d_head = w.W_Q.shape
    G = w.n_kv_heads

    def zeros(*shape: int) -> torch.Tensor:
        return torch.zeros(*shape, dtype=w.dtype, device=w.device)

    state = {
        "tok_embed.weight": w.W_E,
        "pos.weight": w.W_pos if w.W_pos is not None else zeros(n_ctx, d_model),
        "head.weight": w.W_U.T,
    }
    for layer in range(L):
        prefix = f"layers.{layer}.attn."
        state[prefix + "q.weight"] = w.W_Q[layer].permute(0, 2, 1).reshape(H * d_head, d_model)
        state[prefix + "k.weight"] = w.W_K[layer].permute(0, 2, 1).reshape(G * d_head, d_model)
        state[prefix + "v.weight"] = w.W_V[layer].permute(0, 2, 1).reshape(G * d_head, d_model)
        state[prefix + "o.weight"] = w.W_O[layer].reshape(H * d_head, d_model).T
        for name, bias, size in (("q", w.b_Q, H * d_head), ("k", w.b_K, G * d_head), ("v", w.b_V, G * d_head)):
            state[prefix + f"{name}.bias"] = zeros(size) if bias is None else bias[layer].reshape(size)
        state[prefix + "o.bias"] = zeros(d_model) if w.b_O is None else w.b_O[layer]
    return state


def native_weights(state: dict[str, torch.Tensor], *, n_layers: int, n_heads: int, n_kv_heads: int,
                   d_head: int, where: str) -> HeadWeights:
    """The inverse of :func:`_native_state`: :class:`HeadWeights` from a TL-native attention-only model's saved
    parameters (every name the layout above lists, each of its shape, nothing else), so the model runs as an
    :class:`AttentionOnlyModel` without TransformerLens::

        W_Q[l] = q.weight.reshape(head, d_head, d_model).permute(0, 2, 1)      (k, v likewise with kv_head)
        W_O[l] = o.weight.T.reshape(head, d_head, d_model)
        b_Q[l] = q.bias.reshape(head, d_head), b_O[l] = o.bias, W_E = tok_embed.weight, W_U = head.weight.T
    """
    d_model = state["tok_embed.weight"].shape[1] if "tok_embed.weight" in state else None
    expected = {"tok_embed.weight", "pos.weight", "head.weight"}
    for layer in range(n_layers):
        expected |= {f"layers.{layer}.attn.{n}.{p}" for n in "qkvo" for p in ("weight", "bias")}
    if d_model is None or set(state) != expected:
        raise CircuitkitError(
            f"{where}: the saved parameters {sorted(set(state) ^ expected)[:6]} differ from a TL-native "
            f"attention-only model of {n_layers} layers; expected exactly {len(expected)} named parameters.")

    def read(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        value = state[name]
        if tuple(value.shape) != shape:
            raise CircuitkitError(f"{where}: parameter {name} has shape {tuple(value.shape)}; expected {shape}.")
        return value

    def stacked(part: str, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
        weight = torch.stack([read(f"layers.{layer}.attn.{part}.weight", (heads * d_head, d_model))
                              .reshape(heads, d_head, d_model).permute(0, 2, 1) for layer in range(n_layers)])
        bias = torch.stack([read(f"layers.{layer}.attn.{part}.bias", (heads * d_head,)).reshape(heads, d_head)
                            for layer in range(n_layers)])
        return weight, bias

    (W_Q, b_Q), (W_K, b_K), (W_V, b_V) = stacked("q", n_heads), stacked("k", n_kv_heads), stacked("v", n_kv_heads)
    W_O = torch.stack([read(f"layers.{layer}.attn.o.weight", (d_model, n_heads * d_head)).T
                       .reshape(n_heads, d_head, d_model) for layer in range(n_layers)])
    b_O = torch.stack([read(f"layers.{layer}.attn.o.bias", (d_model,)) for layer in range(n_layers)])
    W_U = state["head.weight"].T
    return HeadWeights(W_Q=W_Q, W_K=W_K, W_V=W_V, W_O=W_O, b_Q=b_Q, b_K=b_K, b_V=b_V, b_O=b_O,
                       W_E=state["tok_embed.weight"], W_U=W_U, W_pos=state["pos.weight"])


def _load(native: torch.nn.Module, w: HeadWeights, n_ctx: int) -> None:
    load_native_state(native, _native_state(w, n_ctx), "to_bridge")


def load_native_state(native: torch.nn.Module, state: dict[str, torch.Tensor], where: str) -> None:
    """Copy ``state`` (the TL-native model's own parameter names) into ``native``, whose parameter names carry
    the bridge's ``._original_component`` wrappers; every name and shape must match."""
    params = {name.replace("._original_component", ""): p for name, p in native.named_parameters()}
    if set(params) != set(state):
        raise CircuitkitError(  # a TransformerLens version whose native model is laid out differently
            f"{where}: the TL-native model has parameters {sorted(set(params) ^ set(state))} that circuitkit "
            "does not map; expected the layout of transformer-lens 4.3. Pin transformer-lens or report this."
        )
    with torch.no_grad():
        for name, value in state.items():
            if params[name].shape != value.shape:
                raise CircuitkitError(
                    f"{where}: parameter {name} has shape {tuple(value.shape)}; expected "
                    f"{tuple(params[name].shape)} (the TL-native model's)."
                )
            params[name].copy_(value)


