"""One reference pass: a forward pass that changes nothing and keeps the activations later passes patch from,
resume at or average.

Why: both engines measure against runs of the model left as it is, the clean run and the corrupted (or resampled)
one: the induction scan's clean run (per-token losses, each head's mean ``z``, the residual streams exact ablation
resumes from), path patching's clean and corrupted ``z`` and receivers' streams, the mean- and resample-ablation
values, and the task runner's two reference runs (every sender's ``z`` and MLP output, further node types, the
streams a patched pass resumes from). Each wrote its own hooks to keep them. :func:`reads` is those hooks, once:
a :class:`Keep` says what to keep, a :class:`Kept` is what the pass kept.

What a pass keeps, by layer (shapes: ``B`` sequences, ``P`` positions, ``H`` query heads):

- ``input``: the input embeddings, the stream entering layer 0 ``[B, P, d_model]`` (``HOOKS.resid_pre(0)``);
- ``z``: each head's ``z`` ``[B, P, H, d_head]``; ``z_mean``: its mean over sequences and positions ``[H,
  d_head]`` (reduced as the pass runs: the full ``z`` is not held);
- ``resid``: the stream entering layer ``l`` ``[B, P, d_model]`` (``HOOKS.resid_pre(l)``) and, at ``l =
  n_layers``, the stream the final norm reads (``HOOKS.resid_post(n_layers - 1)``);
- ``mlp``: each MLP's output ``[B, P, d_model]``; ``patterns``: the attention probabilities ``[B, H, q, k]``;
- ``nodes``: further activations by name, each read at ``hook(layer)`` in every layer (a task's node types).

Everything is detached. With ``rows`` (a slice of the batch axis) each activation is that slice, copied (a view
would keep the whole stacked pass alive): what a stacked pass keeps of one of its copies.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from circuitkit.detect.node_patching import unit_mean
from circuitkit.models.adapters import HOOKS, HookFn, ModelAdapter, StopForward


@dataclass(frozen=True)
class Keep:
    """What a reference pass keeps (module docstring); each field a set of layers, ``nodes`` ``(name, hook)``
    pairs (``hook(layer)`` the activation's hook name, read in every layer)."""

    input: bool = False
    z: Sequence[int] = ()
    z_mean: Sequence[int] = ()
    resid: Sequence[int] = ()
    mlp: Sequence[int] = ()
    patterns: Sequence[int] = ()
    nodes: Sequence[tuple[str, Callable[[int], str]]] = ()


@dataclass(eq=False)
class Kept:
    """What a reference pass kept (module docstring), filled by the pass; ``input`` None where not kept."""

    input: Tensor | None = None
    z: dict[int, Tensor] = field(default_factory=dict)
    z_mean: dict[int, Tensor] = field(default_factory=dict)
    resid: dict[int, Tensor] = field(default_factory=dict)
    mlp: dict[int, Tensor] = field(default_factory=dict)
    patterns: dict[int, Tensor] = field(default_factory=dict)
    nodes: dict[str, dict[int, Tensor]] = field(default_factory=dict)


def reads(keep: Keep, n_layers: int, *, rows: slice | None = None, clone: bool = False,
          stop_after: str | None = None) -> tuple[list[tuple[str, HookFn]], Kept]:
    """The read-only hooks that keep what ``keep`` names in a pass of a model of ``n_layers`` layers, and the
    :class:`Kept` they fill. ``rows``: keep that slice of the batch axis, copied; ``clone``: copy every activation
    (where a later in-place change of the model's own tensor must not reach what was kept); ``stop_after``: the
    hook name after which the pass ends (:class:`StopForward`, raised by a last hook there once every read at it
    has run: the caller catches it)."""
    kept = Kept(nodes={name: {} for name, _ in keep.nodes})

    def held(x: Tensor) -> Tensor:
        x = x.detach() if rows is None else x[rows].detach()
        return x.clone() if clone or rows is not None else x

    # every hook is keyed by the layer it was asked for: a bridge's hook.name may be an alias's target
    def into(where: dict[int, Tensor], layer: int) -> Callable[[Tensor, Any], None]:
        def hook(x: Tensor, hook: Any) -> None:
            where[layer] = held(x)
        return hook

    def z_mean(layer: int) -> Callable[[Tensor, Any], None]:
        def hook(z: Tensor, hook: Any) -> None:
            kept.z_mean[layer] = unit_mean(z.detach() if rows is None else z[rows].detach())
        return hook

    def resid_in(layer: int) -> Callable[[Tensor, Any], None]:
        def hook(x: Tensor, hook: Any) -> None:
            x = held(x)
            if layer == 0 and keep.input:
                kept.input = x
            if layer in resid:
                kept.resid[layer] = x
        return hook

    resid = set(keep.resid)
    hooks: list[tuple[str, Callable[[Tensor, Any], None]]] = []
    if keep.input or 0 in resid:
        hooks.append((HOOKS.resid_pre(0), resid_in(0)))
    hooks += [(HOOKS.z(layer), into(kept.z, layer)) for layer in sorted(set(keep.z))]
    hooks += [(HOOKS.z(layer), z_mean(layer)) for layer in sorted(set(keep.z_mean))]
    hooks += [(HOOKS.resid_pre(layer), resid_in(layer)) for layer in sorted(resid - {0, n_layers})]
    if n_layers in resid:
        hooks.append((HOOKS.resid_post(n_layers - 1), into(kept.resid, n_layers)))
    hooks += [(HOOKS.mlp_out(layer), into(kept.mlp, layer)) for layer in sorted(set(keep.mlp))]
    hooks += [(HOOKS.pattern(layer), into(kept.patterns, layer)) for layer in sorted(set(keep.patterns))]
    for name, hook_of in keep.nodes:
        hooks += [(hook_of(layer), into(kept.nodes[name], layer)) for layer in range(n_layers)]
    return hooks + _stop_at(stop_after), kept


def _stop(x: Tensor, hook: Any) -> None:
    raise StopForward


def _stop_at(name: str | None) -> list[tuple[str, HookFn]]:
    """A hook ending the pass at ``name``, registered after every other there (hooks at one point run in the
    order they were added); none for None."""
    return [] if name is None else [(name, _stop)]


def reference_pass(adapter: ModelAdapter, tokens: Tensor, keep: Keep, *, hooks: Sequence[tuple[str, HookFn]] = (),
                   positions: Tensor | None = None, stop_after: str | None = None,
                   clone: bool = False) -> tuple[Tensor | None, Kept]:
    """Run ``tokens`` ``[B, P]`` once through ``adapter``'s model and keep what ``keep`` names (:func:`reads`;
    ``hooks``, the caller's own, run after them on the same pass, and at ``stop_after`` before the pass ends).
    Returns the logits (``[B, P, vocab]``, or at ``positions`` only:
    :meth:`~circuitkit.models.adapters.ModelAdapter.run`; None where the pass ended at ``stop_after``) and the
    :class:`Kept`. Gradients as the caller has them enabled."""
    kept_hooks, kept = reads(keep, adapter.spec.n_layers, clone=clone)
    try:  # the stop after the caller's hooks too: they see the activation it ends at
        logits = adapter.run(tokens, kept_hooks + list(hooks) + _stop_at(stop_after), positions=positions)
    except StopForward:
        logits = None
    return logits, kept


__all__ = ["Keep", "Kept", "StopForward", "reads", "reference_pass"]
