"""AtP*: first-order attribution with the attention-saturation fix for queries and keys, and GradDrop.

Kramár, Lieberum, Shah & Nanda 2024, "AtP*: An efficient and scalable method for localizing LLM behaviour to
components" (arXiv:2403.00745). The target is the one :mod:`~circuitkit.detect.attribution` estimates: the rise of
the repeated-copies loss ``L`` when head ``s = (l, h)``'s output ``z`` is replaced by its ablated value ``z_abl``
(its clean mean over batch and positions, ``"mean"``, or ``0``). Notation: ``dz_s = z_abl - z`` ``[batch, pos,
d_head]``, ``delta_s = dz_s @ W_O[l, h]`` ``[batch, pos, d_model]`` (what the ablation adds to the residual stream
read by every later layer), ``A_m`` ``[batch, head, q, k]`` the attention pattern of layer ``m``.

AtP (the paper's eq. 4; :func:`~circuitkit.detect.attribution_effects` at ``steps=1``)::

    I(s) = sum_{b,p,d} dz_s[b, p, d] * dL/dz_s[b, p, d]

**QK fix** (the paper's eqs. 7 and 9-10: for a query or key node, recompute the attention softmax exactly with the
patched query/key and linearise only from the pattern onward, ``(A_patched - A) . dL/dA``). A head's ablation reaches
every later layer ``m``'s queries and keys directly through ``delta_s``; where those softmaxes saturate (an induction
head's key reading a previous-token head) the gradient through them is nearly flat and ``I(s)`` misses the effect.
So the direct query/key edge ``s -> m`` is taken out of the linear estimate and put back with ``m``'s pattern
recomputed exactly from the patched residual stream::

    A_m(s)   = pattern of layer m run from resid_pre[m] + delta_s            (every head of m: q and k patched)
    lin_m(s) = sum (dL/dA_m) . J_{A_m}(resid_pre[m]) delta_s = g_m . delta_s, with g_m = J^T (dL/dA_m)
    I_QK(s)  = I(s) + sum_{m > l} [ sum_{b,h,q,k} dL/dA_m * (A_m(s) - A_m) - lin_m(s) ]

``lin_m(s)`` is exactly the part of ``I(s)`` that went from ``delta_s`` through ``m``'s queries and keys, so only the
softmax's linearisation is replaced; the value path, MLPs, the residual path and every indirect path (through a
layer between ``l`` and ``m``) stay first order. ``g_m`` is one vector-Jacobian product per layer (a pass stopped at
``m``'s pattern); ``A_m(s)`` one stopped pass per source, the sources of a layer stacked along the batch.

**GradDrop** (the paper's eq. 11). A head's direct and indirect effects can cancel in the gradient sum and hide an
important head. For each layer ``d`` the gradient is taken again with the residual path through layer ``d``'s
contribution dropped (the block's ``resid_post - resid_pre`` gets no gradient; the skip connection keeps it), giving
``I_d(s)`` (``I_QK`` with every gradient, ``dL/dz`` and ``dL/dA_m``, of that backward pass), and::

    GD(s) = 1/(L - 1) * sum_{d != l} |I_d(s)|

(dropping the head's own layer ``l`` leaves no gradient, hence ``L - 1``; a layer ``d < l`` leaves ``I_d = I``). The
paper scores magnitudes; the target here is signed, so the estimate carries the sign of the undropped estimate:
``atp*(s) = sign(I_QK(s)) * GD_QK(s)``, ``graddrop(s) = sign(I(s)) * GD(s)``. With one layer there is nothing to
drop and both are the undropped estimate. The paper takes ``|.|`` per prompt pair; here the target is the batch mean
of one ablation, so ``|.|`` is taken of each dropped estimate's batch mean.

Cost: one forward pass and ``L`` backward passes over it (the graph kept; a backward costs about two forwards),
then per receiver layer ``m`` one small stopped pass with its VJPs and one stopped pass per stacked chunk of sources.
On an ``L``-layer model about ``1 + 2 L`` forward passes, against ``~L/2`` resumed passes per head for exact ablation.

Requires a model that can resume a pass at a layer (``adapter.can_resume``) and whose heads add ``z @ W_O`` into the
residual stream (``adapter.additive_heads``) for the QK fix; GradDrop alone runs on any model under the contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from circuitkit import validate
from circuitkit.detect.ablation import ABLATION_METHODS, AblationMethod
from circuitkit.detect.clean_run import CleanRun, z_leaf_hook
from circuitkit.detect.effects import HeadEffects
from circuitkit.detect.frozen import frozen_parameters
from circuitkit.detect.loss import differentiated_losses, loss_positions
from circuitkit.detect.session import open_session
from circuitkit.detect.tokens import RepeatedTokens, TokenBatch
from circuitkit.errors import CircuitkitError
from circuitkit.models.adapters import HOOKS, HookFn, ModelAdapter, StopForward
from circuitkit.models.state import keeps_model_state
from circuitkit.vjp import vjp

ATP_ESTIMATORS: tuple[str, ...] = ("atp*", "qk-fix", "graddrop")
"""``"atp*"``: QK fix and GradDrop together (the paper's AtP*); ``"qk-fix"`` and ``"graddrop"``: each part alone."""

PATTERN_PASS_BYTES = 2**27
"""Sources stacked per recomputed-pattern pass while the stacked float32 patterns stay under this (128 MiB)."""


@dataclass(frozen=True)
class AtpEstimates:
    """Every estimate one AtP* computation gives (each a :class:`HeadEffects`, ``kind="attribution"``):
    ``first_order`` (AtP, per sequence kept), ``qk_fix`` (per sequence kept), ``graddrop`` and ``atp_star``
    (magnitudes of batch means: no per-sequence values). ``passes``: forward-pass equivalents spent (a backward
    counted two)."""

    first_order: HeadEffects
    qk_fix: HeadEffects
    graddrop: HeadEffects
    atp_star: HeadEffects
    passes: float

    def pick(self, estimator: str) -> HeadEffects:
        return {"atp*": self.atp_star, "qk-fix": self.qk_fix, "graddrop": self.graddrop}[estimator]


class _DropState:
    dropped: int | None = None


class _DropGate(torch.autograd.Function):
    """Identity on layer ``d``'s output ``resid_post`` in the forward pass; in the backward pass, while
    ``state.dropped == d``, the gradient skips the block (goes to its input ``resid_pre`` directly)."""

    @staticmethod
    def forward(ctx: Any, before: Tensor, after: Tensor, layer: int, state: _DropState) -> Tensor:
        ctx.layer, ctx.state = layer, state
        return after.clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None, None]:
        if ctx.state.dropped == ctx.layer:
            return grad, None, None, None
        return None, grad, None, None


def _pattern_from(adapter: ModelAdapter, resid: Tensor, layer: int) -> Tensor:
    """Layer ``layer``'s pattern ``[batch, head, q, k]`` from the residual stream ``resid`` entering it (a pass
    resumed there and stopped at the pattern; in the autograd graph where grad is enabled)."""
    kept: list[Tensor] = []

    def keep(pattern: Tensor, hook: Any) -> None:
        kept.append(pattern)
        raise StopForward

    try:
        adapter.run_from(resid, layer, [(HOOKS.pattern(layer), keep)])
    except StopForward:
        pass
    if not kept:
        raise CircuitkitError(
            f"{type(adapter.model).__name__} resumed at layer {layer} without calling {HOOKS.pattern(layer)}; the "
            "QK fix recomputes each later layer's attention pattern there."
        )
    return kept[0]


def check_estimator(where: str, estimator: Any) -> str:
    return validate.option(f"{where}: estimator", estimator, ATP_ESTIMATORS)


def atp_estimates(adapter: ModelAdapter, batch: TokenBatch, method: str, *, weights: Any = None) -> AtpEstimates:
    """First order, QK fix, GradDrop and AtP* of every head (module docstring) from one computation.
    ``weights``: the model's :class:`~circuitkit.HeadWeights` (read from the adapter when None; only ``W_O``)."""
    spec = adapter.spec
    L, H = spec.n_layers, spec.n_heads
    qk = L > 1
    if qk and not adapter.can_resume:
        raise validate.fail("AtP*: model", validate.given(f"a {spec.family} model that cannot resume a pass"),
                            "a model that can resume at a layer (TransformerBridge, AttentionOnlyModel): the QK fix "
                            "recomputes each later layer's pattern from the residual stream there")
    if qk and not adapter.additive_heads:
        raise validate.fail("AtP*: model", validate.given(f"a {spec.family} model"),
                            "a model whose heads add z @ W_O into the residual stream: the QK fix patches one head's "
                            "contribution into the stream each later layer reads")
    B = batch.tokens.shape[0]
    state = _DropState()
    values: dict[int, Tensor] = {}
    z_leaves: dict[int, Tensor] = {}
    a_leaves: dict[int, Tensor] = {}
    patterns: dict[int, Tensor] = {}
    block_in: dict[int, Tensor] = {}
    run = CleanRun(batch=batch, losses=torch.empty(0, device="cpu"))

    on_z = z_leaf_hook(run, H, values, z_leaves)

    def on_pattern(pattern: Tensor, hook: Any) -> Tensor:
        layer = HOOKS.layer_of(hook.name)
        patterns[layer] = pattern.detach()
        a_leaves[layer] = torch.zeros_like(pattern, requires_grad=True)
        return pattern + a_leaves[layer]

    def on_resid_pre(resid: Tensor, hook: Any) -> Tensor:
        layer = HOOKS.layer_of(hook.name)
        block_in[layer] = resid
        run.resid_pre[layer] = resid.detach().clone()
        return resid

    def on_resid_post(resid: Tensor, hook: Any) -> Tensor:
        layer = HOOKS.layer_of(hook.name)
        return _DropGate.apply(block_in[layer], resid, layer, state)

    hooks: list[tuple[str, HookFn]] = []
    for layer in range(L):
        hooks += [(HOOKS.resid_pre(layer), on_resid_pre), (HOOKS.z(layer), on_z)]
        if layer > 0:
            hooks.append((HOOKS.pattern(layer), on_pattern))
        if L > 1:
            hooks.append((HOOKS.resid_post(layer), on_resid_post))
    drops = list(range(1, L))  # dropping layer 0 changes no gradient of a later head: never needed
    fo = torch.zeros(L, B, L, H, device="cpu")  # [drop (0: none), batch, layer, head]: each sequence's term times B
    grads_a: dict[int, dict[int, Tensor]] = {}  # drop (0: none) -> receiver layer -> dL/dA
    with frozen_parameters(adapter.model), torch.enable_grad():
        logits = adapter.run(batch.tokens, hooks, graph_positions=loss_positions(batch))
        missing = [layer for layer in range(L) if layer not in z_leaves or (layer > 0 and layer not in a_leaves)]
        if missing or (L > 1 and len(block_in) < L):
            raise CircuitkitError(
                f"AtP*: the model ran without calling hook_z/hook_pattern/hook_resid_pre of layers {missing}; "
                "expected every layer to expose them (TransformerLens names)."
            )
        loss, run.losses = differentiated_losses(logits, batch.tokens, batch.repeated_copies)
        targets = {layer: run.z_means[layer] if method == "mean" else torch.zeros((), device=z.device,
                                                                                   dtype=z.dtype)
                   for layer, z in values.items()}
        dz = {layer: (targets[layer] - z) for layer, z in values.items()}
        del logits
        inputs = [z_leaves[layer] for layer in range(L)] + [a_leaves[layer] for layer in range(1, L)]
        for index, dropped in enumerate([None, *drops]):
            state.dropped = dropped
            last = index == len(drops)
            found = torch.autograd.grad(loss, inputs, allow_unused=True, retain_graph=not last)
            slot = 0 if dropped is None else dropped
            for layer in range(L):
                g = found[layer]
                if g is not None:
                    fo[slot, :, layer] = (dz[layer].float() * g.float()).sum(dim=(1, 3)).cpu() * B
            # receivers before the dropped layer need their own dL/dA; at or after it they equal the undropped ones
            # or vanish (its own), so those are not kept
            grads_a[slot] = {m: found[L + m - 1].float() for m in range(1, L)
                             if found[L + m - 1] is not None and (dropped is None or m < dropped)}
            del found
        state.dropped = None
    del inputs, loss
    for kept in (z_leaves, a_leaves, block_in):
        kept.clear()
    corr = torch.zeros(L, B, L, H, device="cpu")  # the QK fix's correction under each drop, per sequence (times B)
    passes = 1.0 + 2.0 * (1 + len(drops))
    if qk:
        W_O = (weights if weights is not None else adapter.weights(embeddings=False)).W_O
        passes += _qk_corrections(adapter, run, dz, W_O, patterns, grads_a, corr)
    fo_mean = fo.mean(dim=1)  # [drop, layer, head]
    total = fo + corr
    total_mean = total.mean(dim=1)
    graddrop = _grad_drop(fo_mean)
    atp_star = _grad_drop(total_mean)
    for name, effect in (("first order", fo_mean[0]), ("QK fix", total_mean[0]), ("GradDrop", graddrop),
                         ("AtP*", atp_star)):
        validate.finite_result(f"AtP* ({name})", effect, why="the model's logits or their gradients overflowed")
    clean_loss = run.repeated_loss

    def effects(effect: Tensor, per_sequence: Tensor | None) -> HeadEffects:
        return HeadEffects(kind="attribution", method=method, clean_loss=clean_loss, effect=effect.float(),
                           per_sequence=per_sequence)

    return AtpEstimates(first_order=effects(fo_mean[0], fo[0]), qk_fix=effects(total_mean[0], total[0]),
                        graddrop=effects(graddrop, None), atp_star=effects(atp_star, None), passes=passes)


def _grad_drop(estimates: Tensor) -> Tensor:
    """``sign(I) * 1/(L-1) sum_{d != l} |I_d|`` per head from ``estimates`` ``[drop, layer, head]`` (drop 0: none;
    drop ``d``: layer ``d``'s path dropped, valid for heads in layers before ``d``); the undropped estimate itself
    with one layer."""
    L = estimates.shape[1]
    if L == 1:
        return estimates[0].clone()
    out = torch.empty_like(estimates[0])
    for layer in range(L):
        kept = estimates[0, layer].abs() * layer  # every layer d < l leaves the estimate as it is (d = 0 included)
        for dropped in range(layer + 1, L):
            kept = kept + estimates[dropped, layer].abs()
        out[layer] = estimates[0, layer].sign() * kept / (L - 1)
    return out


def _qk_corrections(adapter: ModelAdapter, run: CleanRun, dz: dict[int, Tensor], W_O: Tensor,
                    patterns: dict[int, Tensor], grads_a: dict[int, dict[int, Tensor]], corr: Tensor) -> float:
    """Add to ``corr[drop, batch, layer, head]`` (each sequence's term times the batch size) every direct
    query/key edge's exact-pattern term minus its linear term (module docstring), under every drop. Returns the
    passes spent (a stopped pass through one layer's attention counted ``1/L`` of a pass)."""
    L = corr.shape[0]
    B = corr.shape[1]
    passes = 0.0
    for m in range(1, L):
        # the cotangents dL/dA_m: undropped (0), and under each drop d > m (for d < m they are the undropped ones,
        # for d = m zero: no term)
        slots = [0] + [d for d in range(m + 1, L) if m in grads_a.get(d, {})]
        resid = run.resid_pre[m]
        clean = patterns[m]
        cot = torch.stack([grads_a[s][m] if m in grads_a[s] else torch.zeros_like(clean, dtype=torch.float32)
                           for s in slots])  # [C, batch, head, q, k]
        x = resid.detach().clone().requires_grad_(True)
        with frozen_parameters(adapter.model), torch.enable_grad():
            pattern = _pattern_from(adapter, x, m)
            g = torch.stack([vjp(pattern, x, c.to(pattern.dtype), retain_graph=True)[0].float()
                             for c in cot])  # [C, batch, pos, d_model]
        del pattern, x
        passes += 3.0 / L
        per_pass = max(1, PATTERN_PASS_BYTES // (clean.numel() * 4))
        for layer in range(m):
            W = W_O[layer].to(device=dz[layer].device, dtype=dz[layer].dtype)
            delta = torch.einsum("bphe,hem->hbpm", dz[layer], W)  # [head, batch, pos, d_model]
            lin = torch.einsum("cbpm,hbpm->chb", g, delta.float().to(g.device))  # [C, head, batch]
            for first in range(0, delta.shape[0], per_pass):
                chunk = delta[first : first + per_pass]
                k = chunk.shape[0]
                stacked = (resid.to(chunk.device)[None] + chunk).flatten(0, 1)
                with torch.no_grad():
                    patched = _pattern_from(adapter, stacked.to(resid.dtype), m)
                passes += 1.0 / L * k
                change = (patched.view(k, *clean.shape).float() - clean.float()[None]).to(cot.device)
                quad = torch.einsum("cbhqk,nbhqk->cnb", cot, change)  # [C, k, batch]
                term = (quad - lin[:, first : first + k].to(quad.device)).cpu() * B  # [C, k, batch]
                heads = slice(first, first + k)
                corr[0, :, layer, heads] += term[0].T
                for d in range(layer + 1, L):  # drop d (valid for this source, layer < d)
                    if d < m:
                        corr[d, :, layer, heads] += term[0].T
                    elif d > m:
                        corr[d, :, layer, heads] += term[slots.index(d)].T if d in slots else 0.0
    return passes


@keeps_model_state
def atp_effects(
    model: Any,
    tokens: RepeatedTokens | TokenBatch | None = None,
    *,
    method: AblationMethod = "mean",
    estimator: str = "atp*",
    device: str | torch.device | None = None,
) -> HeadEffects:
    """Estimate every head's ablation effect on the repeated-copies loss with AtP* or one of its parts (module
    docstring).

    Args:
        model: a ``TransformerBridge``, an ``AttentionOnlyModel`` or any model under the contract; the QK fix needs
            one that can resume at a layer and whose heads add into the residual stream.
        tokens: a :class:`RepeatedTokens` spec (default ``RepeatedTokens()``) or a built :class:`TokenBatch`.
        method: ``"mean"`` or ``"zero"`` ablation (as :func:`~circuitkit.detect.ablation_effects`).
        estimator: ``"atp*"`` (QK fix and GradDrop), ``"qk-fix"`` or ``"graddrop"``.
        device: where the tokens go (default: the model's embedding device).

    Returns:
        :class:`~circuitkit.scan_types.HeadEffects` with ``kind="attribution"``; ``per_sequence`` kept for
        ``"qk-fix"`` only (the GradDrop estimates are magnitudes of batch means).
    """
    method = validate.option("atp_effects: method", method, ABLATION_METHODS)
    estimator = check_estimator("atp_effects", estimator)
    session = open_session(model, tokens, device)
    return atp_estimates(session.adapter, session.batch, method).pick(estimator)


__all__ = ["ATP_ESTIMATORS", "AtpEstimates", "atp_effects", "atp_estimates", "check_estimator"]
