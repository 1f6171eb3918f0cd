"""Attribution: a first-order estimate of every head's ablation effect from one forward and one backward pass.

Why: exact ablation costs one forward pass per layer (a batch copy per head); on a real model that is most of a
scan. Attribution patching (Nanda 2023; Syed, Rager & Conmy 2023) linearises the loss around the clean run and
estimates all heads at once, so the exact passes can be spent on the heads that matter.

Maths. With ``z = blocks.{l}.attn.hook_z`` ``[batch, pos, head, d_head]`` (each head's output before ``W_O``),
``L`` the mean cross-entropy over the repeated copies (:attr:`CleanRun.repeated_loss`, the loss
:func:`~circuitkit.detect.ablation_effects` moves) and ``z_abl`` the ablated value (its clean mean over batch
and positions, ``"mean"``, or ``0``, ``"zero"``), the estimate of head ``(l, h)`` is::

    effect[l, h] = sum_{b, p, d} (z_abl[l, h, d] - z[b, p, l, h, d]) * dL/dz[b, p, l, h, d]

i.e. the directional derivative of ``L`` along the ablation, the first Taylor term of
``L(ablated) - L(clean)``. ``dL/dz`` is the total derivative (through every later layer). It is exact where
``L`` is linear in the head's output and drifts from the exact effect as the ablation moves the loss
nonlinearly (saturated softmaxes, large effects); :func:`agreement` measures by how much.

How. Each ``hook_z`` returns ``z + delta_l`` with ``delta_l`` a zero tensor that requires grad, and
``torch.autograd.grad(L, [delta_l])`` gives ``dL/dz`` for every layer from one backward pass. Gradients are
taken with respect to these activation leaves only: every parameter's ``requires_grad`` is switched off for the
pass and restored after, and no ``.grad`` is written anywhere. The mean ``z`` comes from the same forward pass
(the mean does not depend on the gradient). Each layer's reduction runs on that layer's device and only the
``[head]`` result moves to the CPU, so a model sharded over devices works without moving weights.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from circuitkit import validate
from circuitkit.detect.ablation import ABLATION_METHODS, AblationMethod
from circuitkit.detect.clean_run import CleanRun
from circuitkit.detect.loss import token_losses
from circuitkit.detect.tokens import RepeatedTokens, TokenBatch, as_batch
from circuitkit.errors import CircuitkitError
from circuitkit.models.contract import HOOKS, HookFn, ModelAdapter, adapt
from circuitkit.models.state import keeps_model_state
from circuitkit.scan_types import HeadEffects


@contextlib.contextmanager
def frozen_parameters(model: Any) -> Iterator[None]:
    """Switch off ``requires_grad`` on every parameter of ``model`` (if it has any) and restore each after."""
    parameters = getattr(model, "parameters", None)
    params = list(parameters()) if callable(parameters) else []
    saved = [p.requires_grad for p in params]
    try:
        for p in params:
            p.requires_grad_(False)
        yield
    finally:
        for p, flag in zip(params, saved, strict=True):
            p.requires_grad_(flag)


def attribute(
    adapter: ModelAdapter,
    batch: TokenBatch,
    method: str,
    *,
    resid_layers: Collection[int] = (),
    observers: Sequence[tuple[str, HookFn]] = (),
    taps: Sequence[Any] = (),
) -> tuple[HeadEffects, CleanRun]:
    """One forward and one backward pass over ``batch``: the attribution :class:`HeadEffects` and the
    :class:`CleanRun` the same forward pass filled (losses, every layer's mean ``z``, the residual streams
    entering ``resid_layers``), so a caller needs no separate clean pass.

    ``observers``: extra ``(hook name, fn)`` pairs called on the detached activation (e.g. a pattern scorer);
    their return value is ignored, so they cannot change the run.

    ``taps``: further gradients of the same loss from the same backward pass, each an object with ``hooks()``
    (identity hooks: they return what they were given, or an equal copy), ``inputs()`` (activations to
    differentiate against, after the pass), ``retain_graph`` and ``finish(loss, grads)``
    (:class:`circuitkit.circuits.attribution.GradientTap`, edge attribution's clean pass).
    """
    spec = adapter.spec
    run = CleanRun(batch=batch, losses=torch.empty(0))
    values: dict[int, Tensor] = {}  # layer -> clean z, detached
    leaves: dict[int, Tensor] = {}  # layer -> the zero tensor added to z, differentiated against

    def on_z(z: Tensor, hook: Any) -> Tensor:
        if z.ndim != 4 or z.shape[2] != spec.n_heads:
            raise CircuitkitError(
                f"{hook.name} has shape {tuple(z.shape)}; expected [batch, pos, {spec.n_heads}, d_head] "
                "to attribute heads."
            )
        layer = HOOKS.layer_of(hook.name)
        values[layer] = z.detach()
        run.z_means[layer] = values[layer].mean(dim=(0, 1))
        leaves[layer] = torch.zeros_like(z, requires_grad=True)
        return z + leaves[layer]

    def keep_resid(resid: Tensor, hook: Any) -> None:
        run.resid_pre[HOOKS.layer_of(hook.name)] = resid.detach().clone()

    def observing(fn: HookFn) -> HookFn:
        def observe(activation: Tensor, hook: Any) -> None:
            fn(activation.detach(), hook)

        return observe

    hooks: list[tuple[str, HookFn]] = [(name, observing(fn)) for name, fn in observers]
    hooks += [(HOOKS.resid_pre(layer), keep_resid) for layer in sorted(set(resid_layers))]
    hooks += [(HOOKS.z(layer), on_z) for layer in range(spec.n_layers)]
    hooks += [hook for tap in taps for hook in tap.hooks()]
    with frozen_parameters(adapter.model), torch.enable_grad():
        logits = adapter.run(batch.tokens, hooks)
        missing = [layer for layer in range(spec.n_layers) if layer not in leaves]
        if missing:
            raise CircuitkitError(
                f"attribution_effects: the model ran without calling hook_z of layers {missing}; expected every "
                "layer to expose blocks.{l}.attn.hook_z [batch, pos, head, d_head]."
            )
        losses = token_losses(logits, batch.tokens)
        repeated = batch.repeated_copies.to(losses.device)
        loss = losses[:, repeated].mean()
        layers = sorted(leaves)
        extra = [tap.inputs() for tap in taps]
        grads = torch.autograd.grad(loss, [leaves[layer] for layer in layers] + [x for xs in extra for x in xs],
                                    allow_unused=True, retain_graph=any(tap.retain_graph for tap in taps))
        start = len(layers)
        for tap, xs in zip(taps, extra, strict=True):
            tap.finish(loss, grads[start : start + len(xs)])
            start += len(xs)
        grads = grads[: len(layers)]
    run.losses = losses.detach().cpu()
    effect = torch.zeros(spec.n_layers, spec.n_heads)
    for layer, grad in zip(layers, grads, strict=True):
        if grad is None:  # no path from this layer's heads to the loss: the estimate is 0
            continue
        z = values[layer].float()
        target = run.z_means[layer].float() if method == "mean" else torch.zeros((), device=z.device)
        effect[layer] = ((target - z) * grad.float()).sum(dim=(0, 1, 3)).cpu()
    validate.finite_result(
        "attribution_effects", effect, why="the model's logits or their gradients overflowed or are NaN"
    )
    effects = HeadEffects(kind="attribution", method=method, clean_loss=run.repeated_loss, effect=effect)
    return effects, run


@keeps_model_state
def attribution_effects(
    model: Any,
    tokens: RepeatedTokens | TokenBatch | None = None,
    *,
    method: AblationMethod = "mean",
    device: str | torch.device | None = None,
    clean: CleanRun | None = None,
) -> HeadEffects:
    """Estimate, for every head, the rise of the repeated-copies loss when it is ablated (see the module docstring).

    Args:
        model: a ``TransformerBridge``, an ``AttentionOnlyModel`` or any model under the contract
            (:mod:`circuitkit.models.contract`); its layers may sit on different devices.
        tokens: a :class:`RepeatedTokens` spec (default ``RepeatedTokens()``) or a built :class:`TokenBatch`;
            the same one as given to :func:`~circuitkit.detect.ablation_effects` makes the two comparable.
        method: ``"mean"`` (replace ``z`` by its clean mean over batch and positions) or ``"zero"``.
        device: where the tokens go (default: the model's embedding device).
        clean: a :class:`CleanRun` of an earlier pass; its batch is used (then ``tokens`` must be None).

    Returns:
        :class:`~circuitkit.scan_types.HeadEffects` with ``kind="attribution"``, ``effect[layer, head]`` (nats,
        float32, CPU) for every head, ``clean_loss`` the repeated-copies loss and ``exact=None``.
    """
    method = validate.option("attribution_effects: method", method, ABLATION_METHODS)
    adapter = adapt(model, device)
    if clean is not None:
        if not isinstance(clean, CleanRun):
            raise validate.fail("attribution_effects: clean", clean, "a CleanRun from circuitkit.detect.clean_run")
        if tokens is not None:
            raise validate.fail(
                "attribution_effects: tokens", tokens, "None when clean= is given (the clean run's batch is used)"
            )
        tokens = clean.batch
    batch = as_batch(tokens, adapter)
    effects, _ = attribute(adapter, batch, method)
    return effects


__all__ = ["attribute", "attribution_effects", "frozen_parameters"]
