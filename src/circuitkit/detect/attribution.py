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

Integrated gradients (``steps = m > 1``; EAP-IG, Hanna, Pezzelle & Belinkov 2024). The clean-point gradient is
blind where the loss is flat at the clean run and bends on the way to the ablation (a saturated softmax: the
issue's real-model previous-token head, exact +4.16 nats, first-order -0.62). IG replaces ``dL/dz`` by its mean
over ``m`` points of a straight path whose last point (``k = m``) is the clean run::

    effect[l, h] = sum_{b, p, d} (z_abl - z)[b, p, l, h, d] * (1/m) sum_{k=1..m} dL/dz[b, p, l, h, d] |_{point k}

``m = 1`` is the first-order estimate above, bit for bit. Two paths (``path=``; default ``"layer"``, chosen below):

- ``"inputs"`` (EAP-IG-inputs): point ``k`` runs the model on the interpolated input embeddings
  ``e' + (k/m) (e - e')``, with ``e = blocks.0.hook_resid_pre`` (token + position embedding) of the clean batch
  and ``e'`` that of the corrupted input (``corrupt="resample"``: every copy of the block redrawn, as
  :mod:`circuitkit.circuits.corrupt`; ``"mean"``: the clean embeddings' batch mean at each position). Every head
  is differentiated in the same ``m - 1`` extra forward and backward passes: cost ``m`` gradient passes.
- ``"layer"``: for each layer ``l``, point ``k`` sets that layer's ``z`` (all its heads at once, every other
  layer clean) to ``z_abl + (k/m) (z - z_abl)``: the ablation's own path, so as ``m`` grows the estimate of a
  head tends to its exact ablation wherever the heads of one layer do not interact (their sum over the layer is
  the layer's exact ablation, IG's completeness). Cost ``(m - 1)`` gradient passes per layer (resumed from
  ``resid_pre[l]`` where the model can), i.e. ``~ L (m - 1) / 2`` full passes.

Which path (measured, ``benchmarks/ig.py``, figures in ``benchmarks/README.md``). The inputs path is the
documented EAP-IG, but it moves every head at once: a head's readers are being corrupted on the way, so heads
that back each other up are all credited with the joint effect. On the bundled model (exact mean ablation of all
8 heads) it ranks heads *worse* than first order (Spearman 0.43 at 2-8 steps, from either corrupted input, against
0.74), while the layer path ranks them exactly (Spearman 1.00 from 2 steps on) and turns the previous-token head
0.1, exact +1.26 nats and first-order +0.04, into the largest estimate. Its magnitudes overshoot where the heads of
one layer back each other up (the four layer-1 induction heads: their IG shares add up to the layer's joint
ablation, each exact single-head effect is 0.08-0.23). So for ranking heads by their single-head ablation use
``path="layer"``; two steps already give its ranking, at ``1 + (L + 1) / 2`` gradient passes for ``L`` layers.
On random-weight checkpoints of real shapes (nothing saturates; all heads ablated exactly) the layer path at 2
steps keeps or raises the rank correlation (GPT-2 small 0.999 -> 0.999, SmolLM-135M 30 x 9 GQA 0.970 -> 0.993)
while the inputs path lowers it (0.990; 0.941 at 2 and 0.902 at 4 steps).

How. Each ``hook_z`` returns ``z + delta_l`` with ``delta_l`` a zero tensor that requires grad, and
``torch.autograd.grad(L, [delta_l])`` gives ``dL/dz`` for every layer from one backward pass. Gradients are
taken with respect to these activation leaves only: every parameter's ``requires_grad`` is switched off for the
pass and restored after, and no ``.grad`` is written anywhere. The mean ``z`` comes from the same forward pass
(the mean does not depend on the gradient). Each layer's reduction runs on that layer's device and only the
``[head]`` result moves to the CPU, so a model sharded over devices works without moving weights.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, Protocol

import torch
from torch import Tensor

from circuitkit import validate
from circuitkit.detect.ablation import ABLATION_METHODS, AblationMethod
from circuitkit.detect.atp import ATP_ESTIMATORS, atp_estimates
from circuitkit.detect.clean_run import CleanRun, z_leaf_hook
from circuitkit.detect.effects import HeadEffects
from circuitkit.detect.frozen import frozen_parameters
from circuitkit.detect.loss import differentiated_losses, loss_positions, stacked_losses
from circuitkit.detect.session import open_session
from circuitkit.detect.tokens import RepeatedTokens, TokenBatch, as_batch
from circuitkit.errors import CircuitkitError
from circuitkit.ig_path import PathStart, along, ig_alphas, stacked_inputs
from circuitkit.models.adapters import HOOKS, HookFn, ModelAdapter
from circuitkit.models.state import keeps_model_state
from circuitkit.pass_budget import copies_per_pass

MAX_IG_STEPS = 1024
"""The most integration points accepted: each costs a forward and a backward pass (per layer on the
``"layer"`` path); the quadrature error of a smooth path is far below the estimate's own error well before."""

IG_PATHS: tuple[str, ...] = ("layer", "inputs")
"""Paths integrated-gradient attribution can integrate along (see the module docstring)."""

ESTIMATORS: tuple[str, ...] = ("gradient", *ATP_ESTIMATORS)
"""What :func:`attribution_effects` estimates with: the gradient (first order, or integrated gradients with
``steps > 1``) or AtP* and its parts (:mod:`circuitkit.detect.atp`)."""

DEFAULT_IG_PATH = "layer"
"""Chosen from measurements (module docstring, "Which path"): the one that ranks heads like their exact ablation."""

IG_CORRUPTIONS: tuple[str, ...] = ("resample", "mean")
"""The corrupted input ``e'`` of the ``"inputs"`` path (a corrupted :class:`TokenBatch` is accepted too)."""

DEFAULT_IG_CORRUPT_SEED = 1
"""Seed of the resampled corrupted input: the same as :data:`circuitkit.circuits.corrupt.DEFAULT_CORRUPT_SEED`,
so head and edge attribution integrate along the same path by default."""

MAX_IG_LOGIT_BYTES = 256 * 2**20
"""Interpolation points run together as copies of the batch while one pass's float32 logits stay under this."""


def check_steps(where: str, steps: Any) -> int:
    """``steps`` as an int in ``[1, MAX_IG_STEPS]``."""
    return validate.integer(
        f"{where}: steps", steps, minimum=1, maximum=MAX_IG_STEPS,
        why="the number of points the gradient is averaged over; 1 is first-order attribution, each point costs "
        "a forward and a backward pass",
    )


class Tap(Protocol):
    """Further gradients of the same loss from :func:`attribute`'s one backward pass (edge attribution's clean pass,
    :class:`circuitkit.circuits.attribution.GradientTap`, rides on the scan's head attribution this way).

    The host registers :meth:`hooks` on its pass after its own (identity hooks: each returns what it was given, or
    an equal copy), differentiates its loss with respect to :meth:`inputs` (``torch.autograd.grad(...,
    allow_unused=True, retain_graph=retain_graph)``, still under ``enable_grad``) and hands the gradients, one per
    input (None where unused), to :meth:`finish`."""

    retain_graph: bool
    """Whether :meth:`finish` differentiates the graph again (the host's backward must keep it)."""

    @property
    def reads_repeated_loss_only(self) -> bool:
        """Whether the tap's metric reads the logits at the repeated-copies loss's positions only (or none): the
        host may then build the graph there alone."""
        ...

    def hooks(self) -> list[tuple[str, HookFn]]: ...

    def inputs(self) -> list[Tensor]:
        """The activations to differentiate against, after the pass."""
        ...

    def finish(self, total: Tensor, found: tuple[Tensor | None, ...]) -> None:
        """Take the gradients of the host's loss ``total`` at :meth:`inputs`."""
        ...


def attribute(
    adapter: ModelAdapter,
    batch: TokenBatch,
    method: str,
    *,
    steps: int = 1,
    path: str = DEFAULT_IG_PATH,
    corrupt: str | TokenBatch = "resample",
    corrupt_seed: int = DEFAULT_IG_CORRUPT_SEED,
    resid_layers: Collection[int] = (),
    observers: Sequence[tuple[str, HookFn]] = (),
    taps: Sequence[Tap] = (),
) -> tuple[HeadEffects, CleanRun]:
    """One forward and one backward pass over ``batch``: the attribution :class:`HeadEffects` and the
    :class:`CleanRun` the same forward pass filled (losses, every layer's mean ``z``, the residual streams
    entering ``resid_layers``), so a caller needs no separate clean pass.

    ``observers``: extra ``(hook name, fn)`` pairs called on the detached activation (e.g. a pattern scorer);
    their return value is ignored, so they cannot change the run.

    ``taps``: further gradients of the same loss from the same backward pass (:class:`Tap`).

    ``steps``, ``path``, ``corrupt``, ``corrupt_seed`` (checked by the caller): integrated gradients (module
    docstring); the clean pass above is the path's last point, the others run after it without observers or taps.
    """
    spec = adapter.spec
    ig_layer = steps > 1 and path == "layer" and adapter.can_resume
    if ig_layer:  # the layer path resumes each layer's passes from the clean residual stream
        resid_layers = set(resid_layers) | set(range(1, spec.n_layers))
    run = CleanRun(batch=batch, losses=torch.empty(0, device="cpu"))
    values: dict[int, Tensor] = {}  # layer -> clean z, detached
    leaves: dict[int, Tensor] = {}  # layer -> the zero tensor added to z, differentiated against

    on_z = z_leaf_hook(run, spec.n_heads, values, leaves)

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
        # every position's logits (the reported loss), the graph only where the differentiated losses read them
        # (a tap's own metric may read any position: then everywhere)
        graph = loss_positions(batch) if all(tap.reads_repeated_loss_only for tap in taps) else None
        logits = adapter.run(batch.tokens, hooks, graph_positions=graph)
        missing = [layer for layer in range(spec.n_layers) if layer not in leaves]
        if missing:
            raise CircuitkitError(
                f"attribution_effects: the model ran without calling hook_z of layers {missing}; expected every "
                "layer to expose blocks.{l}.attn.hook_z [batch, pos, head, d_head]."
            )
        # every position's loss is reported; only the repeated copies' is differentiated
        loss, run.losses = differentiated_losses(logits, batch.tokens, batch.repeated_copies)
        layers = sorted(leaves)
        extra = [tap.inputs() for tap in taps]
        grads = torch.autograd.grad(loss, [leaves[layer] for layer in layers] + [x for xs in extra for x in xs],
                                    allow_unused=True, retain_graph=any(tap.retain_graph for tap in taps))
        start = len(layers)
        for tap, xs in zip(taps, extra, strict=True):
            tap.finish(loss, grads[start : start + len(xs)])
            start += len(xs)
        grads = grads[: len(layers)]
    # per layer: the sum over the path's points of dL/dz (float32); None where no head of the layer reaches L
    sums: dict[int, Tensor | None] = {layer: None if g is None else g.float() for layer, g in zip(layers, grads,
                                                                                                   strict=True)}
    del grads
    targets = {layer: run.z_means[layer].float() if method == "mean" else torch.zeros((), device=z.device)
               for layer, z in values.items()}
    if steps > 1 and path == "inputs":
        _inputs_path(adapter, batch, steps, corrupt, corrupt_seed, sums)
    elif steps > 1:
        _layer_path(adapter, run, steps, values, targets, sums, resume=ig_layer)
    effect = torch.zeros(spec.n_layers, spec.n_heads, device="cpu")
    B = batch.tokens.shape[0]
    # each sequence's term of the sum, times the batch size: their batch mean is the effect (the intervals resample
    # them; the ablation value and the gradient stay those of the whole batch)
    per_sequence = torch.zeros(B, spec.n_layers, spec.n_heads, device="cpu")
    for layer in layers:
        grad = sums[layer]
        if grad is None:  # no path from this layer's heads to the loss: the estimate is 0
            continue
        if steps > 1:
            grad = grad / steps
        z = values[layer].float()
        terms = (targets[layer] - z) * grad
        effect[layer] = terms.sum(dim=(0, 1, 3)).cpu()
        per_sequence[:, layer] = terms.sum(dim=(1, 3)).cpu() * B
    validate.finite_result(
        "attribution_effects", effect, why="the model's logits or their gradients overflowed or are NaN"
    )
    effects = HeadEffects(kind="attribution", method=method, clean_loss=run.repeated_loss, effect=effect,
                          per_sequence=per_sequence)
    return effects, run


def points_per_pass(adapter: ModelAdapter, batch: TokenBatch) -> int:
    """How many interpolation points run together as copies of the batch (:data:`MAX_IG_LOGIT_BYTES` of float32
    logits at the loss's positions): the induction engine's one rule, for head and edge attribution alike."""
    n_logits = batch.tokens.shape[0] * len(loss_positions(batch))
    return copies_per_pass(n_logits * adapter.spec.d_vocab * 4, MAX_IG_LOGIT_BYTES)


def _add(sums: dict[int, Tensor | None], layer: int, grad: Tensor | None, copies: int) -> None:
    """Add the gradients of ``copies`` stacked points (``[copies * batch, ...]``) to ``sums[layer]``."""
    if grad is None:
        return
    grad = grad.float().view(copies, -1, *grad.shape[1:]).sum(dim=0)
    sums[layer] = grad if sums[layer] is None else sums[layer] + grad


def _inputs_path(adapter: ModelAdapter, batch: TokenBatch, steps: int, corrupt: str | TokenBatch,
                 corrupt_seed: int, sums: dict[int, Tensor | None]) -> None:
    """Add to ``sums`` the gradients at the points ``k = 1 .. steps - 1`` of the inputs path."""
    from circuitkit.detect.corrupt import position_mean, resampled_batch

    base: PathStart = position_mean  # "mean": read from the clean embeddings in the pass
    if not isinstance(corrupt, str) or corrupt == "resample":
        if isinstance(corrupt, str):
            corrupt = resampled_batch(batch, corrupt_seed)
        base = adapter.embedded(corrupt.tokens)
    alphas = ig_alphas(steps, "interior")
    per_pass = points_per_pass(adapter, batch)
    spec = adapter.spec
    for first in range(0, len(alphas), per_pass):
        chunk = alphas[first : first + per_pass]
        copies = len(chunk)
        tokens = batch.tokens.repeat(copies, 1)
        leaves: dict[int, Tensor] = {}

        def on_z(z: Tensor, hook: Any, leaves: dict[int, Tensor] = leaves) -> Tensor:
            leaves[HOOKS.layer_of(hook.name)] = leaf = torch.zeros_like(z, requires_grad=True)
            return z + leaf

        hooks = [(HOOKS.resid_pre(0), stacked_inputs(chunk, base))]
        hooks += [(HOOKS.z(layer), on_z) for layer in range(spec.n_layers)]
        with frozen_parameters(adapter.model), torch.enable_grad():
            logits = adapter.run(tokens, hooks, positions=loss_positions(batch))
            layers = sorted(leaves)
            total = stacked_losses(logits, tokens, batch, copies).sum()  # each copy's gradient: its own loss
            grads = torch.autograd.grad(total, [leaves[la] for la in layers], allow_unused=True)
        for layer, grad in zip(layers, grads, strict=True):
            _add(sums, layer, grad, copies)


def _layer_path(adapter: ModelAdapter, run: CleanRun, steps: int, values: dict[int, Tensor],
                targets: dict[int, Tensor], sums: dict[int, Tensor | None], *, resume: bool) -> None:
    """Add to ``sums[l]`` the gradients at the points ``k = 1 .. steps - 1`` of layer ``l``'s own path (its ``z``
    between the ablated and the clean value, every other layer clean), for every layer."""
    batch = run.batch
    alphas = ig_alphas(steps, "interior")
    per_pass = points_per_pass(adapter, batch)
    for layer in sorted(values):
        clean_z = values[layer]
        target = targets[layer].to(clean_z.dtype)
        for first in range(0, len(alphas), per_pass):
            chunk = alphas[first : first + per_pass]
            copies = len(chunk)
            tokens = batch.tokens.repeat(copies, 1)
            moved = along(target, clean_z[None], chunk).flatten(0, 1)  # [copies * batch, pos, head, d]
            leaf = torch.zeros_like(moved, requires_grad=True)

            def on_z(z: Tensor, hook: Any, moved: Tensor = moved, leaf: Tensor = leaf) -> Tensor:
                return moved.to(z.device, z.dtype) + leaf

            hooks = [(HOOKS.z(layer), on_z)]
            with frozen_parameters(adapter.model), torch.enable_grad():
                at = loss_positions(batch)
                if resume and layer > 0:
                    logits = adapter.run_from(run.resid_pre[layer].repeat(copies, 1, 1), layer, hooks, positions=at)
                else:
                    logits = adapter.run(tokens, hooks, positions=at)
                total = stacked_losses(logits, tokens, batch, copies).sum()  # each copy's gradient: its own loss
                (grad,) = torch.autograd.grad(total, [leaf], allow_unused=True)
            _add(sums, layer, grad, copies)


@keeps_model_state
def attribution_effects(
    model: Any,
    tokens: RepeatedTokens | TokenBatch | None = None,
    *,
    method: AblationMethod = "mean",
    steps: int = 1,
    path: str = DEFAULT_IG_PATH,
    corrupt: str | TokenBatch = "resample",
    corrupt_seed: int = DEFAULT_IG_CORRUPT_SEED,
    device: str | torch.device | None = None,
    clean: CleanRun | None = None,
    estimator: str = "gradient",
) -> HeadEffects:
    """Estimate, for every head, the rise of the repeated-copies loss when it is ablated (see the module docstring).

    Args:
        model: a ``TransformerBridge``, an ``AttentionOnlyModel`` or any model under the contract
            (:mod:`circuitkit.models.adapters`); its layers may sit on different devices.
        tokens: a :class:`RepeatedTokens` spec (default ``RepeatedTokens()``) or a built :class:`TokenBatch`;
            the same one as given to :func:`~circuitkit.detect.ablation_effects` makes the two comparable.
        method: ``"mean"`` (replace ``z`` by its clean mean over batch and positions) or ``"zero"``.
        steps: points the gradient is averaged over (integrated gradients, module docstring); 1 (default):
            the first-order estimate from one forward and one backward pass. At most :data:`MAX_IG_STEPS`.
        path: ``"layer"`` (default: interpolate each layer's ``z`` between its ablated and clean value, all heads of
            the layer at once) or ``"inputs"`` (interpolate the input embeddings between the corrupted and the clean
            input, EAP-IG-inputs); unused at ``steps=1``. The module docstring says why the default.
        corrupt: the corrupted input of the ``"inputs"`` path: ``"resample"`` (every copy of the block redrawn
            with ``corrupt_seed``), ``"mean"`` (the clean embeddings' batch mean at each position) or a corrupted
            :class:`TokenBatch` of the clean shape.
        device: where the tokens go (default: the model's embedding device).
        clean: a :class:`CleanRun` of an earlier pass; its batch is used (then ``tokens`` must be None).
        estimator: ``"gradient"`` (default: first order, or integrated gradients with ``steps > 1``), or one of
            :data:`~circuitkit.detect.atp.ATP_ESTIMATORS`: ``"atp*"`` (AtP*: the QK fix and GradDrop,
            :mod:`circuitkit.detect.atp`), ``"qk-fix"`` or ``"graddrop"`` (each part alone; ``steps`` must be 1).

    Returns:
        :class:`~circuitkit.scan_types.HeadEffects` with ``kind="attribution"``, ``effect[layer, head]`` (nats,
        float32, CPU) for every head, ``clean_loss`` the repeated-copies loss and ``exact=None``.
    """
    method = validate.option("attribution_effects: method", method, ABLATION_METHODS)
    steps = check_steps("attribution_effects", steps)
    estimator = validate.option("attribution_effects: estimator", estimator, ESTIMATORS)
    if estimator != "gradient" and steps != 1:
        raise validate.fail("attribution_effects: steps", steps,
                            f"1 with estimator={estimator!r} (AtP* is a first-order estimate; integrated gradients "
                            "are estimator='gradient' with steps > 1)")
    path = validate.option("attribution_effects: path", path, IG_PATHS)
    corrupt_seed = validate.seed("attribution_effects: corrupt_seed", corrupt_seed)
    if not isinstance(corrupt, TokenBatch):
        corrupt = validate.option("attribution_effects: corrupt", corrupt, IG_CORRUPTIONS)
    if clean is not None:
        if not isinstance(clean, CleanRun):
            raise validate.fail("attribution_effects: clean", clean, "a CleanRun from circuitkit.detect.clean_run")
        if tokens is not None:
            raise validate.fail(
                "attribution_effects: tokens", tokens, "None when clean= is given (the clean run's batch is used)"
            )
        tokens = clean.batch
    session = open_session(model, tokens, device)
    adapter, batch = session.adapter, session.batch
    if isinstance(corrupt, TokenBatch):
        corrupt = as_batch(corrupt, adapter)
        if corrupt.tokens.shape != batch.tokens.shape:
            raise validate.fail("attribution_effects: corrupt", corrupt.tokens,
                                f"a TokenBatch of the clean shape {tuple(batch.tokens.shape)}")
    if estimator != "gradient":
        return atp_estimates(adapter, batch, method).pick(estimator)
    effects, _ = attribute(adapter, batch, method, steps=steps, path=path, corrupt=corrupt,
                           corrupt_seed=corrupt_seed)
    return effects


__all__ = [
    "IG_CORRUPTIONS",
    "DEFAULT_IG_PATH",
    "ESTIMATORS",
    "IG_PATHS",
    "MAX_IG_STEPS",
    "Tap",
    "attribute",
    "attribution_effects",
    "check_steps",
    "frozen_parameters",
]
