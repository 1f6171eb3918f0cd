"""Edge attribution patching (Syed et al. 2023): a first-order estimate of path patching for every edge at once.

Why: exact path patching costs a forward pass per edge; a model has ``L^2 H^2 / 2 * 3`` edges. The first-order
Taylor expansion of the metric ``M`` in the receiver's input gives all of them from one clean forward pass with
gradients, one backward pass and one corrupted forward pass (no gradients)::

    delta_s          = (z_corrupt[l1][:, :, h1] - z[l1][:, :, h1]) @ W_O[l1, h1]    sender s = (l1, h1), [b, p, d_model]
    g_{r,c}          = dM/d(input of receiver r = (l2, h2) through channel c)         [b, p, d_model]
                     = J_norm(resid_pre[l2])^T (dM/dc_r @ W_c[l2, h2]^T)             (J_norm = I without LayerNorm)
    attribution[s, r, c] = sum_{b, p} delta_s[b, p] . g_{r,c}[b, p]

``dM/dc_r`` is the gradient at the receiver's ``HOOKS.q/k/v`` activation. The estimate is exact wherever ``M``
is linear in the patched input: e.g. the V channel into a last-layer head of an attention-only model without
LayerNorm, with a metric linear in the logits (the attention pattern does not depend on the values).

Metrics (:mod:`~circuitkit.circuits.metrics`): for ``"induction"``, receiver ``r``'s own induction score is the
metric of every edge into ``r`` (as in path patching); one backward pass of the sum of all heads' scores gives
them all, because each head's output ``z`` is detached in that pass (a head's score then depends on its own
queries and keys only, not on what earlier heads' scores did downstream). V edges get exactly 0. For
``"loss"`` and callables, the metric of the logits is differentiated through everything downstream.

Grouped-query attention: edges are per query head (see :mod:`~circuitkit.circuits.edges`). The gradient at a
group's key (value) activation is the sum over its query heads; each query head's part is taken by a local
backward through that layer's pattern (``z``) alone, with the upstream gradient restricted to that head.

No gradient is left on the model: parameters are switched to ``requires_grad=False`` during the call and
restored afterwards; only activations are differentiated (``torch.autograd.grad``, never ``.backward``).

Entries with ``src layer >= dst layer`` are not edges: they are NaN (so rankings put them last).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from circuitkit import validate
from circuitkit.circuits._engine import DEFAULT_CORRUPT_SEED, Context, context, corrupt_z
from circuitkit.circuits.edges import CHANNELS
from circuitkit.circuits.metrics import InductionReader, check_value, resolve_metric
from circuitkit.detect.attribution import frozen_parameters
from circuitkit.detect.tokens import RepeatedTokens, TokenBatch
from circuitkit.models.contract import HOOKS
from circuitkit.ranking import Head, head_name, top_indices


@dataclass(frozen=True)
class AttributedEdge:
    """One edge and its first-order effect estimate."""

    src: Head
    dst: Head
    channel: str
    value: float

    @property
    def name(self) -> str:
        return f"{head_name(self.src)} -> {head_name(self.dst)} ({self.channel})"


@dataclass(frozen=True, eq=False)
class EdgeAttribution:
    """``scores`` ``[src_layer, src_head, dst_layer, dst_head, channel]`` (float32, CPU; channels :data:`CHANNELS`,
    NaN where src layer >= dst layer): the estimated ``metric(patched) - metric(clean)`` of each edge.
    ``clean_metric`` is the metric on the clean run (for ``"induction"``, the sum of all later heads' scores)."""

    scores: Tensor
    metric: str
    corrupt: str
    clean_metric: float

    def channel(self, name: str) -> Tensor:
        """The ``[src_layer, src_head, dst_layer, dst_head]`` scores of channel ``"q"``, ``"k"`` or ``"v"``."""
        return self.scores[..., CHANNELS.index(validate.option("EdgeAttribution.channel", name, CHANNELS))]

    def value(self, src: Head, dst: Head, channel: str) -> float:
        return float(self.channel(channel)[src[0], src[1], dst[0], dst[1]])

    def top(self, k: int = 10, channel: str | None = None) -> list[AttributedEdge]:
        """The ``k`` edges with the largest ``|attribution|`` (all channels, or one), largest first; non-edges
        (NaN) never come before edges."""
        k = validate.positive_int("EdgeAttribution.top: k", k)
        values = self.scores if channel is None else self.channel(channel)[..., None]
        channels = CHANNELS if channel is None else (channel,)
        L, H = self.scores.shape[0], self.scores.shape[1]
        n_edges = H * H * len(channels) * L * (L - 1) // 2
        out = []
        for index, value in top_indices(values, max(1, min(k, n_edges)), absolute=True):
            index, c = divmod(index, len(channels))
            index, h2 = divmod(index, H)
            index, l2 = divmod(index, L)
            l1, h1 = divmod(index, H)
            if not math.isnan(value):
                out.append(AttributedEdge((l1, h1), (l2, h2), channels[c], value))
        return out

    def to_json(self) -> dict[str, Any]:
        """Plain JSON: nested lists ``[src_layer][src_head][dst_layer][dst_head][channel]``, NaN -> None."""
        nested = [[[[[None if math.isnan(v) else v for v in c] for c in h2] for h2 in l2] for l2 in h1]
                  for h1 in self.scores.double().tolist()]
        return {"metric": self.metric, "corrupt": self.corrupt, "clean_metric": self.clean_metric,
                "channels": list(CHANNELS), "scores": nested}

    def __repr__(self) -> str:
        best = ", ".join(f"{e.name}: {e.value:+.4g}" for e in self.top(3))
        L, H = self.scores.shape[:2]
        return f"EdgeAttribution({L} layers x {H} heads, metric={self.metric!r}; top {best})"


class _Stop(Exception):
    """Ends the forward pass after the last layer's pattern (the ``"induction"`` metric needs no logits)."""


def edge_attribution(
    model: Any,
    *,
    metric: Any = "loss",
    corrupt: str | TokenBatch = "resample",
    tokens: RepeatedTokens | TokenBatch | None = None,
    corrupt_seed: int = DEFAULT_CORRUPT_SEED,
    device: str | torch.device | None = None,
) -> EdgeAttribution:
    """First-order effects of all ``[L, H, L, H, 3]`` edges (see the module docstring). Arguments as
    :func:`~circuitkit.circuits.path_patching` (``metric`` ``"loss"``, ``"induction"`` or a differentiable callable
    ``metric(logits, batch) -> scalar``; ``corrupt`` ``"resample"``, ``"mean"`` or a corrupted ``TokenBatch``)."""
    ctx = context(model, tokens, corrupt, corrupt_seed, device, "edge_attribution")
    m = resolve_metric(metric, "edge_attribution")
    spec = ctx.spec
    L, H = spec.n_layers, spec.n_heads
    scores = torch.full((L, H, L, H, len(CHANNELS)), math.nan)
    if L < 2:
        return EdgeAttribution(scores, m.name, ctx.corrupt, math.nan)
    with frozen_parameters(ctx.adapter.model):
        grads, clean_z, resid, value = _clean_gradients(ctx, m)
    with torch.no_grad():
        z_corrupt = corrupt_z(ctx, clean_z, range(L - 1))
        # sender output differences, all senders: [l1, H, N * d_model]
        deltas = torch.stack(
            [torch.einsum("bphd,hdm->hbpm", z_corrupt[s] - clean_z[s], ctx.W_O[s].to(clean_z[s].dtype))
             for s in range(L - 1)]
        )
        deltas = deltas.reshape(L - 1, H, -1)
        for l2 in range(1, L):
            g = _receiver_gradients(ctx, l2, grads, resid.get(l2))  # [3, H, N * d_model]
            block = deltas[:l2].reshape(l2 * H, -1) @ g.reshape(len(CHANNELS) * H, -1).T  # [l2 H, 3 H]
            scores[:l2, :, l2] = block.reshape(l2, H, len(CHANNELS), H).permute(0, 1, 3, 2).float().cpu()
    validate.finite_result("edge_attribution", scores[~scores.isnan()], why="the gradients overflowed")
    return EdgeAttribution(scores, m.name, ctx.corrupt, value)


def _clean_gradients(ctx: Context, m) -> tuple[dict, dict[int, Tensor], dict[int, Tensor], float]:
    """One clean forward pass with gradients and one backward pass: ``dM/d(q, k, v)`` per query head for every
    layer >= 1 (``grads[(c, l)]`` ``[batch, pos, head, d_head]``), the clean ``z`` and normalised-layer inputs."""
    spec = ctx.spec
    L, gs = spec.n_layers, ctx.group_size
    acts: dict[tuple[str, int], Tensor] = {}
    clean_z: dict[int, Tensor] = {}
    resid: dict[int, Tensor] = {}
    reader = InductionReader(ctx.batch, torch.float32)
    local_scores: list[Tensor] = []

    def leaf(x: Tensor, hook: Any) -> Tensor:
        return x.detach().requires_grad_(True)  # everything downstream is differentiated from here

    def keep(key: tuple[str, int]):
        # The returned copy is what the model computes on: a TransformerBridge hands hooks a reshaped view and
        # only a returned tensor is put back into its computation.
        def hook(x: Tensor, hook: Any) -> Tensor:
            acts[key] = x.clone()
            return acts[key]

        return hook

    def on_z(layer: int):
        def hook(z: Tensor, hook: Any) -> Tensor:
            clean_z[layer] = z.detach()
            acts[("z", layer)] = z.clone()
            return z.detach() if m.local else acts[("z", layer)]

        return hook

    def keep_resid(layer: int):
        def hook(x: Tensor, hook: Any) -> None:
            resid[layer] = x.detach()

        return hook

    def on_pattern(layer: int):
        def hook(pattern: Tensor, hook: Any) -> Tensor:
            pattern = acts[("pattern", layer)] = pattern.clone()
            if m.local:
                local_scores.append(reader(pattern.float().transpose(0, 1)).sum())
                if layer == L - 1:
                    raise _Stop
            return pattern

        return hook

    hooks = [(HOOKS.resid_pre(0), leaf)]
    for layer in range(L):
        hooks.append((HOOKS.z(layer), on_z(layer)))
        if layer == 0:
            continue
        hooks += [(getattr(HOOKS, c)(layer), keep((c, layer))) for c in CHANNELS]
        hooks.append((HOOKS.pattern(layer), on_pattern(layer)))
        if ctx.norms[layer] is not None:
            hooks.append((HOOKS.resid_pre(layer), keep_resid(layer)))
    with torch.enable_grad():
        try:
            logits = ctx.adapter.run(ctx.batch.tokens, hooks)
        except _Stop:
            logits = None
        if m.local:
            total = torch.stack(local_scores).sum()
        else:
            total = check_value(m.fn(logits, ctx.batch), "edge_attribution: metric(clean logits)")
        keys = [(c, layer) for layer in range(1, L) for c in CHANNELS]
        if gs > 1:
            keys += [("pattern", layer) for layer in range(1, L)]
            if not m.local:
                keys += [("z", layer) for layer in range(1, L)]
        inputs = [acts[key] for key in keys]
        found = torch.autograd.grad(total, inputs, allow_unused=True, retain_graph=gs > 1)
        grads = {key: (torch.zeros_like(x) if g is None else g) for key, x, g in zip(keys, inputs, found, strict=True)}
        if gs > 1:
            for layer in range(1, L):
                grads[("k", layer)] = _per_query_head(acts[("pattern", layer)], acts[("k", layer)],
                                                      grads[("pattern", layer)], gs, head_axis=1)
                if m.local:
                    grads[("v", layer)] = torch.zeros_like(grads[("q", layer)])
                else:
                    grads[("v", layer)] = _per_query_head(acts[("z", layer)], acts[("v", layer)],
                                                          grads[("z", layer)], gs, head_axis=2)
    return grads, clean_z, resid, float(total.detach())


def _per_query_head(out: Tensor, group_input: Tensor, grad_out: Tensor, gs: int, head_axis: int) -> Tensor:
    """Split ``dM/d(group_input)`` ``[b, p, kv_head, d]`` into query heads ``[b, p, head, d]``: the part of the
    gradient reaching the group's input through query head ``h``'s slice of ``out`` (its pattern or ``z``)."""
    b, p, n_groups, d = group_input.shape
    split = torch.zeros(b, p, n_groups, gs, d, dtype=group_input.dtype, device=group_input.device)
    heads = torch.arange(n_groups * gs, device=grad_out.device)
    for r in range(gs):
        shape = [1] * grad_out.ndim
        shape[head_axis] = -1
        mask = (heads % gs == r).to(grad_out.dtype).reshape(shape)
        (g,) = torch.autograd.grad(out, group_input, grad_outputs=grad_out * mask, retain_graph=True,
                                   allow_unused=True)
        if g is not None:
            split[:, :, :, r] = g
    return split.reshape(b, p, n_groups * gs, d)


def _receiver_gradients(ctx: Context, layer: int, grads: dict, resid: Tensor | None) -> Tensor:
    """``g_{r,c}`` of the module docstring for every receiver head of ``layer``: ``[channel, head, N * d_model]``."""
    out = []
    for c in CHANNELS:
        g = grads[(c, layer)].detach()  # [b, p, head, d_head]
        out.append(torch.einsum("bphd,hmd->bphm", g, ctx.W_in[c][layer].to(g.dtype)))
    g = torch.stack(out, dim=3)  # [b, p, head, 3, d_model]
    b, p, n_heads, n_channels, d_model = g.shape
    norm = ctx.norms[layer]
    if norm is not None:
        g = _norm_vjp(norm, resid, g, getattr(ctx.adapter.model.cfg, "normalization_type", None))
    return g.permute(3, 2, 0, 1, 4).reshape(n_channels, n_heads, -1)


NORM_CHECK_RTOL = 1e-4
"""The closed-form pullback must match autograd on one cotangent to this relative tolerance (float32 sums over
d_model terms differ by ~1e-6), else the generic batched backward is used."""


def _closed_form_norm_vjp(norm: Any, kind: str | None, resid: Tensor, g: Tensor) -> Tensor | None:
    """The pullback through LayerNorm / RMSNorm in closed form (``u = gamma * g``, ``r = 1/sqrt(var + eps)``)::

        LayerNorm:  dx = r (u - mean(u) - xhat mean(u xhat)),   xhat = (x - mean(x)) r
        RMSNorm:    dx = r u - r^3 x mean(u x),                  r = 1/sqrt(mean(x^2) + eps)

    ``None`` when the norm's type, ``gamma`` or ``eps`` cannot be read (the caller then uses autograd)."""
    inner = getattr(norm, "original_component", None) or norm
    eps = next((getattr(inner, n) for n in ("eps", "variance_epsilon") if isinstance(getattr(inner, n, None), float)),
               None)
    if kind is None or eps is None:
        return None
    weight = getattr(inner, "weight", None)
    if kind.endswith("Pre"):
        weight = None
    elif not isinstance(weight, Tensor) or weight.shape != resid.shape[-1:]:
        return None
    x = resid.detach().float()[:, :, None, None, :]
    u = g.float() * (weight.detach().float() if weight is not None else 1.0)
    if kind.startswith("LN"):
        centred = x - x.mean(dim=-1, keepdim=True)
        r = (centred.pow(2).mean(dim=-1, keepdim=True) + eps).rsqrt()
        xhat = centred * r
        out = r * (u - u.mean(dim=-1, keepdim=True) - xhat * (u * xhat).mean(dim=-1, keepdim=True))
    elif kind.startswith("RMS"):
        r = (x.pow(2).mean(dim=-1, keepdim=True) + eps).rsqrt()
        out = r * u - r.pow(3) * x * (u * x).mean(dim=-1, keepdim=True)
    else:
        return None
    return out.to(g.dtype)


def _norm_vjp(norm: Any, resid: Tensor, g: Tensor, kind: str | None = None) -> Tensor:
    """``g`` ``[b, p, head, channel, d_model]`` pulled back through the receiver layer's normalisation at its
    clean input ``resid`` ``[b, p, d_model]``. LayerNorm and RMSNorm (``kind``, TransformerLens's
    ``normalization_type``) in closed form, checked against autograd on one cotangent; any other norm (or a
    failed check) through one forward of the norm and a batched backward over the ``head * channel`` cotangents
    (``is_grads_batched``), or, where that cannot be batched, on an expanded input (the same numbers, more work)."""
    b, p, n_heads, n_channels, d_model = g.shape
    closed = _closed_form_norm_vjp(norm, kind, resid, g)
    if closed is not None:
        with torch.enable_grad():
            x = resid.detach().requires_grad_(True)
            (check,) = torch.autograd.grad(norm(x), x, grad_outputs=g[:, :, 0, 0])
        if torch.allclose(closed[:, :, 0, 0], check.to(closed.dtype), rtol=NORM_CHECK_RTOL,
                          atol=NORM_CHECK_RTOL * float(check.abs().max())):
            return closed
    cotangents = g.permute(2, 3, 0, 1, 4).reshape(n_heads * n_channels, b, p, d_model)
    with torch.enable_grad():
        x = resid.detach().requires_grad_(True)
        y = norm(x)
        try:
            (out,) = torch.autograd.grad(y, x, grad_outputs=cotangents, is_grads_batched=True)
            return out.reshape(n_heads, n_channels, b, p, d_model).permute(2, 3, 0, 1, 4)
        except RuntimeError:
            expanded = resid[:, :, None, None, :].expand_as(g).reshape(b * p, n_heads * n_channels, d_model)
            expanded = expanded.detach().requires_grad_(True)
            (out,) = torch.autograd.grad(norm(expanded), expanded,
                                         grad_outputs=g.reshape(b * p, n_heads * n_channels, d_model))
            return out.reshape(b, p, n_heads, n_channels, d_model)


__all__ = ["AttributedEdge", "EdgeAttribution", "edge_attribution"]
