"""Scaled dot-product attention written out, in numpy and torch, as the seed exercises ask for it.

Why this module exists: the exercises (seed 002 ex. 13.19-13.20, seed 004 part 2, seed 002 ex. 13.23) ask the
reader to write attention by hand and check it against ``torch.nn.functional.scaled_dot_product_attention``.
These are the readable reference versions; the rest of circuitkit analyses weights, not activations.

Conventions (row vectors, as TransformerLens): queries ``q`` are ``[..., n_q, d_k]``, keys ``k`` are
``[..., n_k, d_k]``, values ``v`` are ``[..., n_k, d_v]``, and

    scores  = q @ k^T * scale                   [..., n_q, n_k],  scale = 1/sqrt(d_k) by default
    pattern = softmax(scores + mask, axis=-1)   each row sums to 1 over the allowed keys
    output  = pattern @ v                       [..., n_q, d_v]

Masks:

- ``causal=True``: query ``i`` sees keys ``j <= i`` (top-left aligned, like ``is_causal=True`` in torch).
- ``key_padding_mask``: boolean, broadcastable to ``[..., n_k]``, **True marks a padding key that no query
  may attend to** (the ``torch.nn.MultiheadAttention`` convention; note that a boolean ``attn_mask`` in
  ``F.scaled_dot_product_attention`` means the opposite, True = may attend).

A query row with no allowed key has no defined softmax; it raises ``CircuitkitError`` instead of returning NaN.

Multi-head attention uses per-head weights in TransformerLens shapes: ``W_Q [head, d_model, d_head]``,
``W_K, W_V [kv_head, d_model, d_head]`` and ``W_O [head, d_head, d_model]``. ``kv_head = head`` is ordinary
multi-head attention, ``kv_head = 1`` is multi-query attention (MQA), anything dividing ``head`` is
grouped-query attention (GQA); query head ``h`` reads key/value group ``h // (head // kv_head)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from einops import einsum, rearrange, repeat
from jaxtyping import Bool, Float
from torch import Tensor

from circuitkit import validate
from circuitkit.errors import CircuitkitError, describe
from circuitkit.theory._validate import float_array, float_tensor, positive_int, same

__all__ = [
    "sdpa_numpy",
    "pattern_numpy",
    "sdpa_torch",
    "pattern_torch",
    "split_heads",
    "merge_heads",
    "multi_head_attention",
    "KVCacheRun",
    "decode_with_kv_cache",
    "FeatureMap",
    "linear_attention_quadratic",
    "linear_attention_linear",
]


# ----------------------------------------------------------------------------------------------- numpy
def _qkv_sizes(q_shape, k_shape, v_shape) -> None:
    same("q", q_shape[-1], "k", k_shape[-1], "last-axis size d_k")
    same("k", k_shape[-2], "v", v_shape[-2], "key count n_k (axis -2)")
    _same_batch(q=q_shape, k=k_shape, v=v_shape)


def _same_batch(**shapes) -> None:
    """The leading (batch) axes of q, k (and v) agree exactly: a silent broadcast would pair the wrong rows."""
    batches = {name: tuple(shape[:-2]) for name, shape in shapes.items()}
    if len(set(batches.values())) > 1:
        given = ", ".join(f"{name} {batch}" for name, batch in batches.items())
        raise CircuitkitError(f"batch axes differ ({given}); expected the same leading shape for q, k and v. "
                              "Expand the smaller one explicitly if you mean to share it.")


def _mask_shape(mask_shape, batch, n_k: int, description: str) -> None:
    """A key padding mask ``[..., n_k]`` whose leading axes broadcast to ``batch`` without enlarging it."""
    expected = (f"a boolean mask of shape [{', '.join(map(str, batch)) + ', ' if batch else ''}n_k={n_k}] "
                "(axes of size 1 broadcast; True = padding)")
    if tuple(mask_shape[-1:]) != (n_k,):
        raise CircuitkitError(f"key_padding_mask is {description}; expected {expected}.")
    lead = tuple(mask_shape[:-1])
    try:
        joined = tuple(np.broadcast_shapes(lead, tuple(batch)))
    except ValueError:
        joined = None
    if joined != tuple(batch):
        raise CircuitkitError(f"key_padding_mask is {description}; expected {expected}.")


def _check_rows(allowed_any_row: bool) -> None:
    if not allowed_any_row:
        raise CircuitkitError(
            "a query row has every key masked (causal mask and/or key_padding_mask); expected at least one "
            "allowed key per query. Check the padding mask (True marks padding) or drop fully padded rows."
        )


def pattern_numpy(
    q: Float[np.ndarray, "*batch n_q d_k"],
    k: Float[np.ndarray, "*batch n_k d_k"],
    *,
    causal: bool = False,
    key_padding_mask: Bool[np.ndarray, "*batch n_k"] | None = None,
    scale: float | None = None,
) -> Float[np.ndarray, "*batch n_q n_k"]:
    """The attention pattern ``softmax(q k^T * scale + mask)`` in numpy (see the module docstring)."""
    float_array("q", q, ndim_min=2)
    float_array("k", k, ndim_min=2)
    causal = validate.boolean("causal", causal)
    same("q", q.shape[-1], "k", k.shape[-1], "last-axis size d_k")
    _same_batch(q=q.shape, k=k.shape)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else validate.real("scale", scale, minimum=0.0,
                                                                                  strict_minimum=True)
    scores = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
    n_q, n_k = scores.shape[-2:]
    allowed = np.ones((n_q, n_k), dtype=bool)
    if causal:
        allowed = np.tril(allowed)
    if key_padding_mask is not None:
        mask = np.asarray(key_padding_mask)
        if mask.dtype != np.bool_:
            raise CircuitkitError(
                f"key_padding_mask has shape {mask.shape} and dtype {mask.dtype}; expected a boolean array "
                f"broadcastable to [..., n_k={n_k}] (True = padding)."
            )
        _mask_shape(mask.shape, q.shape[:-2], n_k, f"an array of shape {mask.shape}")
        allowed = allowed & ~mask[..., None, :]
    _check_rows(bool(allowed.any(axis=-1).all()))
    scores = np.where(allowed, scores, -np.inf)
    scores = scores - scores.max(axis=-1, keepdims=True)  # stable: exp of values <= 0
    weights = np.exp(scores)
    return weights / weights.sum(axis=-1, keepdims=True)


def sdpa_numpy(
    q: Float[np.ndarray, "*batch n_q d_k"],
    k: Float[np.ndarray, "*batch n_k d_k"],
    v: Float[np.ndarray, "*batch n_k d_v"],
    *,
    causal: bool = False,
    key_padding_mask: Bool[np.ndarray, "*batch n_k"] | None = None,
    scale: float | None = None,
) -> Float[np.ndarray, "*batch n_q d_v"]:
    """Scaled dot-product attention in numpy only (seed 000 task 2.1): ``pattern_numpy(q, k) @ v``."""
    float_array("q", q, ndim_min=2)
    float_array("k", k, ndim_min=2)
    float_array("v", v, ndim_min=2)
    _qkv_sizes(q.shape, k.shape, v.shape)
    return np.matmul(pattern_numpy(q, k, causal=causal, key_padding_mask=key_padding_mask, scale=scale), v)


# ----------------------------------------------------------------------------------------------- torch
def _same_dtype(**tensors: Tensor) -> None:
    dtypes = {name: t.dtype for name, t in tensors.items()}
    if len(set(dtypes.values())) > 1:
        given = ", ".join(f"{name}: {dtype}" for name, dtype in dtypes.items())
        raise CircuitkitError(f"dtypes differ ({given}); expected one dtype. Cast with .to(dtype).")


def pattern_torch(
    q: Float[Tensor, "*batch n_q d_k"],
    k: Float[Tensor, "*batch n_k d_k"],
    *,
    causal: bool = False,
    key_padding_mask: Bool[Tensor, "*batch n_k"] | None = None,
    scale: float | None = None,
) -> Float[Tensor, "*batch n_q n_k"]:
    """The attention pattern ``softmax(q k^T * scale + mask)`` in torch (see the module docstring)."""
    float_tensor("q", q, ndim_min=2)
    float_tensor("k", k, ndim_min=2)
    causal = validate.boolean("causal", causal)
    same("q", q.shape[-1], "k", k.shape[-1], "last-axis size d_k")
    _same_dtype(q=q, k=k)
    _same_batch(q=q.shape, k=k.shape)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else validate.real("scale", scale, minimum=0.0,
                                                                                  strict_minimum=True)
    scores = q @ k.transpose(-1, -2) * scale
    n_q, n_k = scores.shape[-2:]
    allowed = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device)
    if causal:
        allowed = allowed.tril()
    if key_padding_mask is not None:
        if (
            not isinstance(key_padding_mask, Tensor)
            or key_padding_mask.dtype != torch.bool
            or key_padding_mask.shape[-1:] != (n_k,)
        ):
            raise CircuitkitError(
                f"key_padding_mask is a {describe(key_padding_mask)}; expected a boolean tensor broadcastable "
                f"to [..., n_k={n_k}] (True = padding)."
            )
        _mask_shape(key_padding_mask.shape, q.shape[:-2], n_k, f"a {describe(key_padding_mask)}")
        allowed = allowed & ~key_padding_mask[..., None, :]
    _check_rows(bool(allowed.any(dim=-1).all()))
    pattern = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
    return validate.finite_result("pattern_torch", pattern, why="q k^T * scale overflowed the dtype")


def sdpa_torch(
    q: Float[Tensor, "*batch n_q d_k"],
    k: Float[Tensor, "*batch n_k d_k"],
    v: Float[Tensor, "*batch n_k d_v"],
    *,
    causal: bool = False,
    key_padding_mask: Bool[Tensor, "*batch n_k"] | None = None,
    scale: float | None = None,
) -> Float[Tensor, "*batch n_q d_v"]:
    """Scaled dot-product attention in a few lines of torch (seed 002 ex. 13.19): ``pattern_torch(q, k) @ v``.

    Matches ``F.scaled_dot_product_attention(q, k, v, attn_mask=~key_padding_mask[..., None, :],
    is_causal=causal)`` (tested).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        float_tensor(name, t, ndim_min=2)
    _qkv_sizes(q.shape, k.shape, v.shape)
    _same_dtype(q=q, k=k, v=v)
    return pattern_torch(q, k, causal=causal, key_padding_mask=key_padding_mask, scale=scale) @ v


# ------------------------------------------------------------------------------------------ multi-head
def split_heads(x: Float[Tensor, "batch pos hd"], n_heads: int) -> Float[Tensor, "batch head pos d_head"]:
    """``b t (nh dh) -> b nh t dh`` (seed 004 part 2): the packed projection split into heads."""
    n_heads = positive_int("n_heads", n_heads)
    float_tensor("x", x, ndim=3)
    if x.shape[-1] % n_heads:
        raise CircuitkitError(f"x has last axis {x.shape[-1]}, not divisible by n_heads = {n_heads}.")
    return rearrange(x, "b t (nh dh) -> b nh t dh", nh=n_heads)


def merge_heads(z: Float[Tensor, "batch head pos d_head"]) -> Float[Tensor, "batch pos hd"]:
    """``b nh t dh -> b t (nh dh)``, the inverse of :func:`split_heads`."""
    float_tensor("z", z, ndim=4)
    return rearrange(z, "b nh t dh -> b t (nh dh)")


def _check_mha_weights(x: Tensor, W_Q: Tensor, W_K: Tensor, W_V: Tensor, W_O: Tensor) -> tuple[int, int]:
    float_tensor("x", x, ndim=3)
    for name, w in (("W_Q", W_Q), ("W_K", W_K), ("W_V", W_V), ("W_O", W_O)):
        float_tensor(name, w, ndim=3)
    _same_dtype(x=x, W_Q=W_Q, W_K=W_K, W_V=W_V, W_O=W_O)
    n_heads, d_model, d_head = W_Q.shape
    n_kv = W_K.shape[0]
    same("x", x.shape[-1], "W_Q", d_model, "d_model")
    if W_K.shape != (n_kv, d_model, d_head) or W_V.shape != W_K.shape:
        raise CircuitkitError(
            f"W_K has shape {tuple(W_K.shape)} and W_V {tuple(W_V.shape)}; expected both "
            f"[kv_head, d_model={d_model}, d_head={d_head}]."
        )
    if W_O.shape != (n_heads, d_head, d_model):
        raise CircuitkitError(
            f"W_O has shape {tuple(W_O.shape)}; expected [head={n_heads}, d_head={d_head}, d_model={d_model}]."
        )
    if n_heads % n_kv:
        raise CircuitkitError(
            f"W_Q has {n_heads} heads and W_K {n_kv} key/value heads; expected kv_head to divide head "
            "(kv_head = head: MHA, 1: MQA, a divisor: GQA)."
        )
    return n_heads, n_kv


def multi_head_attention(
    x: Float[Tensor, "batch pos d_model"],
    W_Q: Float[Tensor, "head d_model d_head"],
    W_K: Float[Tensor, "kv_head d_model d_head"],
    W_V: Float[Tensor, "kv_head d_model d_head"],
    W_O: Float[Tensor, "head d_head d_model"],
    *,
    causal: bool = False,
    key_padding_mask: Bool[Tensor, "batch pos"] | None = None,
) -> Float[Tensor, "batch pos d_model"]:
    """Multi-head self-attention (MHA, MQA or GQA by the shape of ``W_K``/``W_V``), written with einops.

    ``out = sum_h softmax(x W_Q^h (x W_K^g(h))^T / sqrt(d_head)) x W_V^g(h) W_O^h`` with ``g(h) = h // group``.
    No biases. ``key_padding_mask`` is ``[batch, pos]``, True = padding.
    """
    n_heads, n_kv = _check_mha_weights(x, W_Q, W_K, W_V, W_O)
    if key_padding_mask is not None and (not isinstance(key_padding_mask, Tensor)
                                         or tuple(key_padding_mask.shape) != tuple(x.shape[:2])):
        raise CircuitkitError(f"key_padding_mask is a {describe(key_padding_mask)}; expected a boolean tensor "
                              f"[batch, pos] = {list(x.shape[:2])} (True = padding).")
    q = einsum(x, W_Q, "b p m, h m d -> b h p d")
    k = einsum(x, W_K, "b p m, g m d -> b g p d")
    v = einsum(x, W_V, "b p m, g m d -> b g p d")
    # (g r): group outer, repeat inner, so query head h reads group h // r (torch's repeat_interleave order)
    k = repeat(k, "b g p d -> b (g r) p d", r=n_heads // n_kv)
    v = repeat(v, "b g p d -> b (g r) p d", r=n_heads // n_kv)
    mask = None if key_padding_mask is None else key_padding_mask[:, None, :]  # broadcast over heads
    z = sdpa_torch(q, k, v, causal=causal, key_padding_mask=mask)
    return validate.finite_result("multi_head_attention", einsum(z, W_O, "b h p d, h d m -> b p m"),
                                  why=f"x or the weights too large for {x.dtype}")


@dataclass(frozen=True)
class KVCacheRun:
    """Result of autoregressive decoding with a key/value cache.

    ``output`` equals causal :func:`multi_head_attention` on the whole sequence; ``cache_bytes`` is the memory
    the K and V caches hold after the last token: ``2 * batch * kv_head * pos * d_head * element_size``.
    """

    output: Float[Tensor, "batch pos d_model"]
    cache_bytes: int
    n_kv_heads: int
    n_tokens: int


def decode_with_kv_cache(
    x: Float[Tensor, "batch pos d_model"],
    W_Q: Float[Tensor, "head d_model d_head"],
    W_K: Float[Tensor, "kv_head d_model d_head"],
    W_V: Float[Tensor, "kv_head d_model d_head"],
    W_O: Float[Tensor, "head d_head d_model"],
) -> KVCacheRun:
    """Decode one position at a time, caching each new key and value instead of recomputing them.

    Only the ``kv_head`` groups are cached, which is the whole point of MQA/GQA (seed 002 ex. 13.23): the
    cache is ``head / kv_head`` times smaller than multi-head attention's.
    """
    n_heads, n_kv = _check_mha_weights(x, W_Q, W_K, W_V, W_O)
    batch, n_pos, _ = x.shape
    d_head = W_Q.shape[-1]
    k_cache = x.new_zeros(batch, n_kv, n_pos, d_head)
    v_cache = x.new_zeros(batch, n_kv, n_pos, d_head)
    outputs = []
    with torch.no_grad():
        for t in range(n_pos):
            x_t = x[:, t]  # [batch, d_model]
            k_cache[:, :, t] = einsum(x_t, W_K, "b m, g m d -> b g d")
            v_cache[:, :, t] = einsum(x_t, W_V, "b m, g m d -> b g d")
            q_t = einsum(x_t, W_Q, "b m, h m d -> b h d")[:, :, None]  # [batch, head, 1, d_head]
            k = repeat(k_cache[:, :, : t + 1], "b g p d -> b (g r) p d", r=n_heads // n_kv)
            v = repeat(v_cache[:, :, : t + 1], "b g p d -> b (g r) p d", r=n_heads // n_kv)
            z_t = sdpa_torch(q_t, k, v)[:, :, 0]  # the newest query sees every cached key: no mask needed
            outputs.append(einsum(z_t, W_O, "b h d, h d m -> b m"))
    cache_bytes = k_cache.element_size() * k_cache.nelement() + v_cache.element_size() * v_cache.nelement()
    output = validate.finite_result("decode_with_kv_cache", torch.stack(outputs, dim=1),
                                    why=f"x or the weights too large for {x.dtype}")
    return KVCacheRun(output, int(cache_bytes), n_kv, n_pos)


# ------------------------------------------------------------------------------------ linear attention
FeatureMap = Literal["elu1", "softplus", "exp"]

_FEATURE_MAPS: dict[str, Callable[[Tensor], Tensor]] = {
    "elu1": lambda t: F.elu(t) + 1.0,  # Katharopoulos et al. 2020: positive, so denominators stay > 0
    "softplus": F.softplus,
    "exp": torch.exp,
}


def _feature_map(name: str) -> Callable[[Tensor], Tensor]:
    return _FEATURE_MAPS[validate.option("feature_map", name, tuple(_FEATURE_MAPS))]


def _linear_inputs(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> bool:
    for name, t in (("q", q), ("k", k), ("v", v)):
        float_tensor(name, t, ndim_min=2)
    _qkv_sizes(q.shape, k.shape, v.shape)
    _same_dtype(q=q, k=k, v=v)
    causal = validate.boolean("causal", causal)
    if causal:
        same("q", q.shape[-2], "k", k.shape[-2], "position count (causal needs self-attention)")
    return causal


_OVERFLOW = "the feature map of q or k overflowed the dtype, or its sums vanished; rescale q and k"


def linear_attention_quadratic(
    q: Float[Tensor, "*batch n_q d_k"],
    k: Float[Tensor, "*batch n_k d_k"],
    v: Float[Tensor, "*batch n_k d_v"],
    *,
    feature_map: FeatureMap = "elu1",
    causal: bool = False,
) -> Float[Tensor, "*batch n_q d_v"]:
    """Kernelised attention the O(N^2) way (seed 003 problem 12.10): ``exp(k.q)`` replaced by ``g(k).g(q)``.

    ``a[n, m] = g(q_n) . g(k_m) / sum_m' g(q_n) . g(k_m')``; materialises the ``[n_q, n_k]`` matrix.
    Raises ``CircuitkitError`` instead of returning NaN/inf when ``g`` overflows (e.g. ``"exp"`` of large
    scores) or a row's weights all underflow to 0 (0/0).
    """
    g = _feature_map(feature_map)
    causal = _linear_inputs(q, k, v, causal)
    a = g(q) @ g(k).transpose(-1, -2)  # [..., n_q, n_k]
    if causal:
        a = a.tril()
    out = (a @ v) / a.sum(dim=-1, keepdim=True)
    return validate.finite_result("linear_attention_quadratic", out, why=_OVERFLOW)


def linear_attention_linear(
    q: Float[Tensor, "*batch n_q d_k"],
    k: Float[Tensor, "*batch n_k d_k"],
    v: Float[Tensor, "*batch n_k d_v"],
    *,
    feature_map: FeatureMap = "elu1",
    causal: bool = False,
) -> Float[Tensor, "*batch n_q d_v"]:
    """The same attention in O(N d_k d_v): sum over keys before the dot product with the query.

    ``out_n = g(q_n)^T S / g(q_n)^T z`` with ``S = sum_m g(k_m) v_m^T`` ``[d_k, d_v]`` and ``z = sum_m g(k_m)``;
    with ``causal`` the sums run over ``m <= n`` (prefix sums, ``[n, d_k, d_v]`` memory). Raises
    ``CircuitkitError`` instead of returning NaN/inf, as :func:`linear_attention_quadratic`.
    """
    g = _feature_map(feature_map)
    causal = _linear_inputs(q, k, v, causal)
    gq, gk = g(q), g(k)
    if not causal:
        S = gk.transpose(-1, -2) @ v  # [..., d_k, d_v]
        z = gk.sum(dim=-2)  # [..., d_k]
        out = (gq @ S) / (gq @ z[..., None])
    else:
        S = torch.cumsum(gk[..., :, :, None] * v[..., :, None, :], dim=-3)  # [..., n, d_k, d_v]
        z = torch.cumsum(gk, dim=-2)  # [..., n, d_k]
        num = (gq[..., :, None, :] @ S)[..., 0, :]  # [..., n, d_v]
        den = (gq * z).sum(dim=-1, keepdim=True)
        out = num / den
    return validate.finite_result("linear_attention_linear", out, why=_OVERFLOW)
