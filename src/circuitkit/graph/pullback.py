"""A receiver's gradient pulled back through the normalisation in front of it: the one pullback of both edge
attributions (the induction scan's, :mod:`circuitkit.circuits.attribution`, and a task's EAP-IG,
:meth:`circuitkit.graph.runner.TaskRunner.attribute`).

An edge's attribution is ``sum_{b, p} delta_s[b, p] . g_{r,c}[b, p]`` (the sender's output difference against the
gradient at the receiver's input, ``[d_model]`` at each position). A head's receiver reads ``norm(x) @ W_c``, so
``g = J_norm(x)^T (W_c grad_c)`` with ``grad_c = dM/dc`` at its query, key or value activation ``[d_head]``.
:class:`ReceiverGradients` forms it for ``k`` receivers of one layer on ``n`` positions: for LayerNorm and RMSNorm
in closed form (``gamma`` the norm's weight, ``r = 1/sqrt(var + eps)``, ``xhat`` the normalised input)::

    LayerNorm:  dx = r (gamma u - mean(gamma u) - xhat mean(gamma u xhat))
    RMSNorm:    dx = r (gamma u - xhat mean(gamma u xhat)),                       xhat = r x

with the per-position terms found in ``d_head`` space, so only one product per receiver touches ``d_model``; the
closed form is used only where it agrees with autograd through the norm at the same input
(:func:`closed_form`); any other norm is pulled back by autograd (:func:`autograd_pullback`).

Grouped-query attention: a key/value head's activation is read by every query head of its group, and an edge into a
query head's key or value input is that head's alone. :func:`split_by_query_head` splits the group's gradient into
the part that reaches it through each query head (a local backward through one layer's pattern or ``z``), so both
engines take every query head's key/value gradient from one pass of the batch.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from circuitkit.models.adapters import norm_parameters
from circuitkit.vjp import vjp


def receiver_norms(adapter: Any) -> list[ReceiverNorm | None]:
    """The normalisation in front of each layer's attention (the adapter's), as a :class:`ReceiverNorm`, or None
    where a layer has none: the receivers' norms of both engines (path patching and edge attribution's
    :class:`~circuitkit.circuits._engine.Context`, the task runner)."""
    norms = [adapter.attention_norm(layer) for layer in range(adapter.spec.n_layers)]
    return [None if norm is None else ReceiverNorm(norm, _offloaded_holders(norm)) for norm in norms]


def session_norms(session: Any) -> list[ReceiverNorm | None]:
    """:func:`receiver_norms` of a :class:`~circuitkit.detect.session.Session`'s model, read once for the session:
    every measurement on it (path patching, edge attribution, a task scan's runners) shares them."""
    return session.held("receiver_norms", lambda: receiver_norms(session.adapter))


class ReceiverNorm:
    """A block's ``ln1``, callable outside the block's forward pass (path patching recomputes a receiver's input
    through it; both edge attributions read its weight and pull gradients back through it). Where accelerate has
    offloaded its weights (a ``device_map`` with disk or CPU offload: parameters on ``meta``), each use brings
    them in on the module's execution device and lets accelerate offload them again after."""

    def __init__(self, module: Any, holders: tuple[Any, ...] = ()) -> None:
        self.module = module
        self.holders = holders  # the modules whose accelerate hooks hold the norm's weights

    @contextlib.contextmanager
    def loaded(self) -> Iterator[Any]:
        """The module with its weights in memory (nothing to do unless offloaded)."""
        with contextlib.ExitStack() as stack:
            if self.holders:
                from accelerate.utils import align_module_device

                for holder in self.holders:
                    stack.enter_context(align_module_device(holder))
            yield self.module

    def __call__(self, x: Tensor) -> Tensor:
        with self.loaded() as module:
            return module(x)


def _offloaded_holders(norm: Any) -> tuple[Any, ...]:
    """The norm's modules (itself, submodules) that carry an accelerate offload hook; () without accelerate."""
    modules = getattr(norm, "modules", None)
    if not callable(modules) or "accelerate" not in sys.modules:  # nothing offloads without accelerate loaded
        return ()
    try:
        from accelerate.utils import has_offloaded_params
    except ImportError:  # accelerate absent: nothing can be offloaded
        return ()
    return tuple(m for m in modules() if has_offloaded_params(m))



NORM_CHECK_RTOL = 1e-4
"""The closed-form pullback must match autograd on a random cotangent to this relative tolerance (float32 sums
over d_model terms differ by ~1e-6), else the generic autograd pullback is used."""

HALF_NORM_CHECK_RTOL = 3e-2
"""The same check where the norm's weights are in half precision: autograd then runs in it (8 bits of mantissa in
bfloat16, each rounding up to 4e-3 relative), while the closed form runs in float32 on the same input."""

NORM_CHECK_POSITIONS = 64
NORM_CHECK_SEED = 20231


ClosedForm = tuple[Tensor | None, float, bool]
"""``(gamma, eps, centred)`` of a LayerNorm (``centred``) or RMSNorm; ``gamma`` None for the ``...Pre`` kinds."""


@dataclass
class ReceiverGradients:
    """``k`` receivers of one layer seen from the residual stream on ``n`` positions (:meth:`pulled`): ``u[k, n] =
    W[k] @ grad[k, n]`` ``[d_model]`` pulled back through the norm (module docstring), in closed form as ``(r grad)
    @ (gamma W) - a - b xhat`` with the per-position coefficients ``a = (r grad) . rowsum(gamma W) / d_model``
    (LayerNorm only) and ``b = (r grad) . (xhat @ (gamma W)^T) / d_model``; other norms by autograd
    (``pullback``)."""

    grad: Tensor  # [k = 3 H, n, d_head] dM/d(q, k, v) per query head (times r where the closed form applies)
    W: Tensor  # [k, d_head, d_model] W_c^T per query head (times gamma where the closed form applies)
    a: Tensor | None = None  # [k, n, 1] LayerNorm's mean term
    b: Tensor | None = None  # [k, n, 1] the xhat term
    xhat: Tensor | None = None  # [n, d_model]
    pullback: Any = None  # generic: the norm, pulled back through by autograd
    resid: Tensor | None = None  # [n, d_model], its input, for the generic pullback

    @classmethod
    def from_parts(cls, grad: Tensor, W: Tensor, norm: Any, x: Tensor | None,
                   form: ClosedForm | None) -> ReceiverGradients:
        """``grad`` ``[k, n, d_head]``, ``W`` ``[k, d_head, d_model]``; ``norm`` (None: no normalisation) at its input
        ``x`` ``[n, d_model]``, in closed form where ``form`` (:func:`closed_form`) is given, else by autograd."""
        if norm is None:
            return cls(grad, W)
        if form is None:
            return cls(grad, W, pullback=norm, resid=x)
        gamma, eps, centred = form
        r, xhat = _normalise(x, eps, centred)
        grad = grad * r[None, :, None]
        if gamma is not None:
            W = W * gamma
        d_model = x.shape[-1]
        k, d_head = W.shape[0], W.shape[1]
        projected = (xhat @ W.reshape(k * d_head, d_model).T).view(-1, k, d_head).transpose(0, 1)  # one product
        b = (grad * projected).sum(dim=-1, keepdim=True) / d_model
        a = (grad @ W.sum(dim=-1)[:, :, None]) / d_model if centred else None
        return cls(grad, W, a, b, xhat)

    def pulled(self) -> Tensor:
        """``g[k, n]``: each receiver's gradient in the residual stream before the norm, ``[k, n, d_model]``."""
        u = torch.matmul(self.grad, self.W)  # [k, n, d_model]
        if self.pullback is not None:
            return autograd_pullback(self.pullback, self.resid, u)
        return self._correct(u)

    def _correct(self, u: Tensor) -> Tensor:
        """The closed form's per-position terms taken off ``u = grad @ W`` in place (none without a norm)."""
        if self.b is not None:
            if self.a is not None:
                u.sub_(self.a)
            u.addcmul_(self.b, self.xhat, value=-1)
        return u


def closed_form(norm: Any, kind: str | None, x: Tensor) -> ClosedForm | None:
    """The norm's closed-form terms where they can be read and agree with autograd through the norm at ``x``
    (:func:`_closed_form_agrees`), else None (the receiver then pulls back by autograd)."""
    terms = _norm_terms(norm, kind, x)
    return terms if terms is not None and _closed_form_agrees(norm, x, *terms) else None


def _norm_terms(norm: Any, kind: str | None, x: Tensor) -> ClosedForm | None:
    """``(gamma, eps, centred)`` of a LayerNorm (``centred``) or RMSNorm, read from the module; ``None`` when the
    type (TransformerLens's ``normalization_type``), ``eps`` or the weight cannot be read."""
    with norm.loaded() if isinstance(norm, ReceiverNorm) else contextlib.nullcontext(norm) as module:
        eps, weight = norm_parameters(module)
        if kind is None or eps is None or not kind.startswith(("LN", "RMS")):
            return None
        gamma = None
        if not kind.endswith("Pre"):
            gamma = weight
            if not isinstance(gamma, Tensor) or gamma.shape != x.shape[-1:]:
                return None
            # a copy: an offloaded weight goes back to the meta device when the module is left
            gamma = gamma.detach().to(device=x.device, dtype=x.dtype, copy=True)
    return gamma, eps, kind.startswith("LN")


def _normalise(x: Tensor, eps: float, centred: bool) -> tuple[Tensor, Tensor]:
    """``r = 1/sqrt(var + eps)`` ``[N]`` and ``xhat`` ``[N, d_model]`` (centred first for LayerNorm)."""
    if centred:
        x = x - x.mean(dim=-1, keepdim=True)
    r = (x.pow(2).mean(dim=-1) + eps).rsqrt()
    return r, x * r[:, None]


def _closed_form_agrees(norm: Any, x: Tensor, gamma: Tensor | None, eps: float, centred: bool) -> bool:
    """The closed form of :class:`ReceiverGradients` against autograd through ``norm`` on one seeded random
    cotangent, on the first :data:`NORM_CHECK_POSITIONS` positions (the norm acts on each position alone). The
    tolerance is relative to the scale of the terms, ``r |gamma v|``: the pullback itself can be near zero (a
    cotangent along ``x`` is in a LayerNorm's null space)."""
    x = x[:NORM_CHECK_POSITIONS]
    seeded = torch.Generator().manual_seed(NORM_CHECK_SEED)
    v = torch.randn(x.shape, generator=seeded, dtype=x.dtype, device="cpu").to(x.device)
    r, xhat = _normalise(x, eps, centred)
    u = v * gamma if gamma is not None else v
    closed = u - (xhat * u).mean(dim=-1, keepdim=True) * xhat
    if centred:
        closed = closed - u.mean(dim=-1, keepdim=True)
    closed = closed * r[:, None]
    (check,) = autograd_pullback(norm, x, v[None])
    scale = float((u * r[:, None]).abs().max())
    rtol = NORM_CHECK_RTOL if _norm_dtype(norm, x.dtype).itemsize >= 4 else HALF_NORM_CHECK_RTOL
    return bool(torch.allclose(closed, check.to(closed.dtype), rtol=rtol, atol=rtol * scale))


def _norm_dtype(norm: Any, default: torch.dtype) -> torch.dtype:
    """The dtype of the norm's floating-point weights (a module computing in float32 may refuse a half-precision
    weight beside a float32 input: ``torch.nn.LayerNorm``), or ``default`` for a norm without any."""
    module = norm.module if isinstance(norm, ReceiverNorm) else norm
    parameters = getattr(module, "parameters", None)
    for parameter in parameters() if callable(parameters) else ():
        if parameter.is_floating_point():
            return parameter.dtype
    return default


def autograd_pullback(norm: Any, x: Tensor, u: Tensor) -> Tensor:
    """``u`` ``[k, n, d_model]`` pulled back through ``norm`` at its input ``x`` ``[n, d_model]``: one forward of the
    norm and a batched backward over the ``k`` cotangents (``is_grads_batched``), or, where that cannot be batched,
    on an input expanded ``k`` times (the same numbers, more work). The norm runs in its weights' dtype (the input
    and cotangents are cast to it), the result is in ``u``'s."""
    dtype = _norm_dtype(norm, x.dtype)
    x, want, u = x.to(dtype), u.dtype, u.to(dtype)
    with torch.enable_grad():
        leaf = x.detach()[None].requires_grad_(True)  # [1, n, d_model]: norms expect [batch, pos, d_model]
        if u.shape[0] == 1:  # one cotangent: a plain vector-Jacobian product
            (out,) = vjp(norm(leaf), leaf, u)
            return out.to(want)
        try:
            (out,) = torch.autograd.grad(norm(leaf), leaf, grad_outputs=u[:, None], is_grads_batched=True)
            return out[:, 0].to(want)
        except RuntimeError:
            expanded = x.detach()[None].expand_as(u).contiguous().requires_grad_(True)
            (out,) = torch.autograd.grad(norm(expanded), expanded, grad_outputs=u)
            return out.to(want)


def split_by_query_head(out: Tensor, group_input: Tensor, grad_out: Tensor, group_size: int,
                        head_axis: int) -> Tensor:
    """``dM/d(group_input)`` split into query heads: ``group_input`` ``[b, p, kv_head, d]`` (a layer's keys or
    values, on the autograd graph of ``out``), ``out`` the query heads' output of that layer that reads it (the
    pattern ``[b, head, q, k]`` for the keys, ``z`` ``[b, p, head, d]`` for the values; ``head_axis`` its head
    axis), ``grad_out`` ``dM/d(out)``. Returns ``[b, p, head, d]``: at query head ``h = g * group_size + r`` the
    part of the gradient reaching key/value head ``g`` through ``h``'s slice of ``out`` (their sum over ``r`` is
    the group's gradient). One vector-Jacobian product per position ``r`` in a group, each through that layer's
    attention alone (the graph must be retained)."""
    b, p, n_groups, d = group_input.shape
    split = torch.zeros(b, p, n_groups, group_size, d, dtype=group_input.dtype, device=group_input.device)
    heads = torch.arange(n_groups * group_size, device=grad_out.device)
    for r in range(group_size):
        shape = [1] * grad_out.ndim
        shape[head_axis] = -1
        mask = (heads % group_size == r).to(grad_out.dtype).reshape(shape)
        (g,) = vjp(out, group_input, grad_out * mask, retain_graph=True, allow_unused=True)
        if g is not None:
            split[:, :, :, r] = g
    return split.reshape(b, p, n_groups * group_size, d)


__all__ = ["NORM_CHECK_RTOL", "ClosedForm", "ReceiverGradients", "ReceiverNorm", "autograd_pullback", "closed_form",
           "receiver_norms", "session_norms", "split_by_query_head"]
