"""Node patching: stacked copies of a batch, each with its own set of nodes replaced. The one pass that the
induction scan (:func:`circuitkit.detect.ablation.ablate`: one head a copy; :class:`~circuitkit.circuits.
faithfulness.Ablator`: head sets) and the task scan (:meth:`circuitkit.graph.runner.TaskRunner.patched_metric`: node
sets of every type) run; each reads its own metric from the logits.

A pass of ``S`` copies runs ``tokens`` ``[B, P]`` repeated ``S`` times along the batch axis (copy-major: rows
``s * B .. s * B + B - 1`` are copy ``s``). At each patched hook the activation ``x`` ``[S * B, P, U, ...]`` (``U``
units along its third axis: the heads of a layer's ``z`` ``[.., head, d_head]``, an MLP's output ``[.., d_model]``,
the neurons of a group) becomes, for copy ``s``, sequence ``b``, position ``p`` and unit ``u``::

    x[s, b, p, u, ...] = value[b, p, u, ...]   where mask[s, node(u)]
                         x[s, b, p, u, ...]    elsewhere

``mask`` ``[S, N]`` names nodes, not units: the ``N`` nodes split the ``U`` units into contiguous groups as equal
as can be, ``node(u) = floor(u * N / U)`` (:func:`groups_of`); ``N = U`` (a head of ``z``) is a unit each, ``N = 1``
(an MLP's output) all of them. Both engines' node sets are such masks, one per node type and layer
(:func:`circuitkit.graph.nodes.node_patches`).

``value`` broadcasts against ``[B, P, U, ...]``: a per-unit value ``[U, ...]`` (a mean, zeros) or one per sequence
and position ``[B, P, U, ...]`` (a corrupted or resampled run); or it is a function of the pass's own activation
``[S, B, P, U, ...]`` at that hook returning such a tensor (the held-out batch's means, taken from its unpatched
copy 0 in the same pass). Everything downstream of a patched hook is
recomputed. The selection is exact (``torch.where``): a unit not patched keeps its own activation, and a copy
that patches nothing is the plain run (up to the rounding of a larger batch's matrix products).

The sets of one measurement are split into passes of at most ``per_pass`` copies (:func:`in_passes`; each engine
sizes ``per_pass`` by :func:`circuitkit.pass_budget.copies_per_pass`): fewer copies a pass change how many passes
run, never a copy's result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import Tensor

from circuitkit.errors import CircuitkitError
from circuitkit.models.adapters import ModelAdapter

T = TypeVar("T")


def groups_of(units: int, n: int, device: Any = "cpu") -> Tensor:
    """``[units]``: the node each unit belongs to, ``floor(u * n / units)`` (contiguous, sizes within one)."""
    return torch.arange(units, device=device) * n // units


@dataclass(frozen=True)
class Patch:
    """One hook of a stacked pass: ``mask`` ``[S, N]`` bool (True: that copy patches that node; ``N`` nodes
    splitting the hook's units, :func:`groups_of`), ``value`` broadcastable to ``[B, P, U, ...]``, or a function of
    the activation ``[S, B, P, U, ...]`` returning one (module docstring)."""

    hook: str
    mask: Tensor
    value: Tensor | Callable[[Tensor], Tensor]


def _hook(patch: Patch, S: int, B: int) -> Callable[[Tensor, Any], Tensor]:
    N = patch.mask.shape[1]

    def hook(x: Tensor, hook: Any) -> Tensor:
        if x.dim() < 3 or x.shape[0] != S * B or x.shape[2] < N:
            raise CircuitkitError(f"{hook.name} has shape {tuple(x.shape)}; expected [{S * B}, pos, {N}, ...] "
                                  f"({S} copies of {B} sequences, {N} nodes to patch, at least a unit each).")
        view = x.view(S, B, *x.shape[1:])  # [S, B, P, U, ...]
        mask = patch.mask.to(x.device)
        if N != x.shape[2]:
            mask = mask[:, groups_of(x.shape[2], N, x.device)]  # [S, U]
        units = mask.view(S, 1, 1, x.shape[2], *([1] * (x.dim() - 3)))
        value = patch.value(view) if callable(patch.value) else patch.value
        value = value.to(device=x.device, dtype=x.dtype)[None]
        return torch.where(units, value, view).reshape(x.shape)

    return hook


def patched_logits(adapter: ModelAdapter, tokens: Tensor, copies: int, patches: Sequence[Patch], *,
                   positions: Tensor | None = None, resume: tuple[Tensor, int] | None = None,
                   read: Sequence[tuple[str, Callable[[Tensor, Any], None]]] = ()) -> Tensor:
    """Logits ``[copies * B, len(positions), d_vocab]`` (every position where ``positions`` is None) of ``copies``
    stacked copies of ``tokens`` ``[B, P]``, each with its units of ``patches`` replaced (module docstring); no
    gradients. A hook with no unit patched in any copy can be left out of ``patches``: it changes nothing.
    ``resume``: ``(resid_pre, layer)``, the plain run's residual stream ``[B, P, d_model]`` entering ``layer``, from
    which the pass runs (:meth:`~circuitkit.models.adapters.ModelAdapter.run_from`; every patched hook at or after
    ``layer``, so the layers before it are the plain run's); ``read``: further hooks that only read (they return
    None)."""
    B = tokens.shape[0]
    hooks = [(patch.hook, _hook(patch, copies, B)) for patch in patches] + list(read)
    with torch.no_grad():
        if resume is not None:
            resid, layer = resume
            return adapter.run_from(resid.repeat(copies, 1, 1), layer, hooks, positions=positions)
        return adapter.run(tokens.repeat(copies, 1), hooks, positions=positions)


def unit_mean(x: Tensor, real: Tensor | None = None) -> Tensor:
    """What a node outside a circuit becomes under mean ablation, in both engines: its activation ``x`` ``[B, P, U,
    ...]`` averaged over the sequences and the real positions, ``[U, ...]`` in ``x``'s dtype::

        mean[u, ...] = sum_{b, p} real[b, p] x[b, p, u, ...] / sum_{b, p} real[b, p]

    ``real`` ``[B, P]`` bool marks the positions that hold a token (a task's pairs are padded to one length); None
    where every position does (a repeated-tokens batch), the plain mean over ``B`` and ``P``. With ``real``, the
    sum is taken in float32 whatever ``x``'s dtype and read back in it."""
    if real is None:
        return x.mean(dim=(0, 1))
    weight = real.float()
    weight = weight / weight.sum()
    return torch.einsum("bp,bp...->...", weight, x.float()).to(x.dtype)


def in_passes(sets: int, per_pass: int, run: Callable[[slice], T]) -> list[T]:
    """``run(part)`` for consecutive slices ``part`` of ``range(sets)``, each at most ``per_pass`` long (one stacked
    pass each), in order."""
    return [run(slice(start, min(start + per_pass, sets))) for start in range(0, sets, max(1, per_pass))]


__all__ = ["Patch", "groups_of", "in_passes", "patched_logits", "unit_mean"]
