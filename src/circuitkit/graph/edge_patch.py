"""Exact edge patching, one edge a stacked copy (path patching, Wang et al. 2022): the one pass behind both engines'
exact edge effects (the induction scan's :func:`~circuitkit.circuits.path_patching`, a task's
:meth:`~circuitkit.graph.runner.TaskRunner.single_edge_metric`).

An edge ``sender -> receiver`` carries the sender's output difference ``delta`` ``[batch, pos, d_model]`` (its
corrupted output minus its clean one, or a batch mean minus its clean one: the caller's) into the receiver's input,
every other path clean. Everything before the receiver's layer is then the clean run, so a copy's pass may start
there, from the clean residual stream ``r`` entering that layer (or anywhere before it, e.g. a full pass where the
model cannot resume), and at the receiver's hook its input gets::

    channel c (q, k, v) of a head:   c += (norm(r + delta) - norm(r)) @ W_c                  [batch, pos, d_head]
    an MLP's input (before its norm):  x += delta;  in parallel blocks that read ln1:  x += norm(r + delta) - norm(r)
    the logits (the final residual stream):   x += delta   (started at ``n_layers``: no layer runs)

``norm`` is the layer's attention normalisation (the identity where there is none; biases cancel), ``r`` the copy's
own stream entering the receiver's layer (the clean one there). A copy may patch several receivers of one layer with
its delta (path patching's ``"all"``: the query, key and value of one head together).

Grouped-query attention: a key/value receiver patches its key/value head (``Receiver.slot``); every query head of
the group then reads the patched keys/values, unless the receiver names ``only``, one query head: the group's
other query heads then have their clean ``z`` put back, so only that head reads them (path patching's receiver
heads, per-query-head key/value edges).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from circuitkit.models.adapters import HOOKS, ModelAdapter

CHANNELS = ("q", "k", "v")


@dataclass(frozen=True)
class Receiver:
    """Where one copy's delta goes: ``channel`` ``"q"``, ``"k"``, ``"v"`` (a head's input), ``"mlp"`` or
    ``"logits"``, at ``layer`` (the logits: ``n_layers``); for a head's input, ``weight`` (the index into that
    channel's weights, :attr:`EdgeModel.weights`), ``slot`` (the head axis of the activation at the hook: the query
    head, or the key/value head) and ``only`` (a query head that alone reads a patched key/value head; None: every
    head of the group)."""

    channel: str
    layer: int
    weight: int = 0
    slot: int = 0
    only: int | None = None


@dataclass(eq=False)
class EdgeModel:
    """What the pass needs of a model: its ``adapter``; ``weights`` per channel ``q``/``k``/``v`` ``[layer, unit,
    d_model, d_head]`` (units as the receivers' ``weight`` index them); ``norms`` per layer (the attention norm, a
    callable, or None); ``mlp_in``: the hook where an MLP receiver's input is rebuilt, ``mlp_normed``: that input
    is ``ln1``'s output (parallel blocks), so the delta goes through the norm there too."""

    adapter: ModelAdapter
    weights: dict[str, Tensor]
    norms: Sequence[Callable[[Tensor], Tensor] | None]
    mlp_in: Callable[[int], str] = HOOKS.mlp_in
    mlp_normed: bool = False


def patched_edges(model: EdgeModel, deltas: Tensor, receivers: Sequence[Sequence[Receiver]], *, start: int,
                  resid: Tensor | None, tokens: Tensor, clean_z: dict[int, Tensor] | None = None,
                  positions: Tensor | None = None, read: Sequence[tuple[str, Callable]] = ()) -> Tensor:
    """The logits of ``E`` stacked copies of the batch, copy ``i`` with ``deltas[i]`` ``[batch, pos, d_model]``
    added at each of ``receivers[i]`` (module docstring), ``[E * batch, n, vocab]`` (``n``: ``positions``, or
    every position).

    ``start``: where the pass starts, at most the earliest receiver's layer: 0 runs ``tokens`` ``[batch, pos]``;
    a later layer resumes from ``resid`` ``[batch, pos, d_model]``, the clean residual stream entering it
    (``n_layers``: the final one; every receiver is then the logits and no layer runs). ``clean_z``: the clean
    ``z`` ``[batch, pos, head, d_head]`` of every layer with a receiver that names ``only``. ``read``: further
    hooks (read only; one may end the pass by raising)."""
    adapter = model.adapter
    L = adapter.spec.n_layers
    E = deltas.shape[0]
    B, P, d = deltas.shape[1:]
    if start == L:  # only the final residual stream changes: no hook fires, so the delta is added here
        final = resid[None] + deltas.to(device=resid.device, dtype=resid.dtype)
        return adapter.run_from(final.reshape(E * B, P, d), L, positions=positions)
    by_layer: dict[int, list[tuple[int, Receiver]]] = {}
    for i, those in enumerate(receivers):
        for r in those:
            by_layer.setdefault(r.layer, []).append((i, r))
    hooks: list[tuple[str, Callable]] = []
    for layer, at in sorted(by_layer.items()):
        hooks += _layer_hooks(model, layer, at, deltas, clean_z)
    hooks += list(read)
    if start:
        return adapter.run_from(resid.repeat(E, 1, 1), start, hooks, positions=positions)
    return adapter.run(tokens.repeat(E, 1), hooks, positions=positions)


def _layer_hooks(model: EdgeModel, layer: int, at: list[tuple[int, Receiver]], deltas: Tensor,
                 clean_z: dict[int, Tensor] | None) -> list[tuple[str, Callable]]:
    """The hooks that add each copy's delta at its receivers of ``layer`` (``at``: ``(copy, receiver)``)."""
    E, B, P, d = deltas.shape
    L = model.adapter.spec.n_layers
    if layer == L:
        copies = torch.tensor([i for i, _ in at], device=deltas.device)

        def final(x: Tensor, hook: Any) -> Tensor:
            out = x.clone()
            out.view(E, B, P, d)[copies.to(x.device)] += deltas[copies].to(device=x.device, dtype=x.dtype)
            return out

        return [(HOOKS.resid_post(L - 1), final)]
    normed = model.mlp_normed and any(r.channel == "mlp" for _, r in at)
    attention = [(i, r) for i, r in at if r.channel in CHANNELS]
    increment: dict[str, Tensor] = {}  # "x": [n, B, P, d]: each copy's norm(r + delta) - norm(r), in copy order
    through_norm = sorted({i for i, r in at if r.channel in CHANNELS or (normed and r.channel == "mlp")})
    rows = {i: j for j, i in enumerate(through_norm)}

    def keep_increment(x: Tensor, hook: Any) -> None:
        delta = deltas[through_norm].to(device=x.device, dtype=x.dtype)
        norm = model.norms[layer]
        if norm is None:  # the increment is the delta itself
            increment["x"] = delta
            return
        stream = x.view(E, B, P, d)[through_norm]  # each copy's own stream: the clean one, nothing before patched
        n = len(through_norm)
        increment["x"] = norm((stream + delta).reshape(n * B, P, d)).reshape(n, B, P, -1) - norm(
            stream.reshape(n * B, P, d)).reshape(n, B, P, -1)

    hooks: list[tuple[str, Callable]] = [(HOOKS.resid_pre(layer), keep_increment)] if through_norm else []
    for c in CHANNELS:
        chosen = [(i, r) for i, r in attention if r.channel == c]
        if chosen:
            hooks.append((getattr(HOOKS, c)(layer), _channel_hook(model, layer, c, chosen, rows, increment, E)))
    restore = [(i, r) for i, r in attention if r.channel != "q" and r.only is not None]
    if restore:
        hooks.append((HOOKS.z(layer), _restore_group(model, restore, clean_z[layer], E)))
    mlp = [i for i, r in at if r.channel == "mlp"]
    if mlp:
        copies = torch.tensor(mlp, device=deltas.device)
        slots = torch.tensor([rows[i] for i in mlp], device=deltas.device) if normed else None

        def mlp_hook(x: Tensor, hook: Any) -> Tensor:
            out = x.clone()
            add = increment["x"][slots.to(increment["x"].device)] if normed else deltas[copies]
            out.view(E, B, P, -1)[copies.to(x.device)] += add.to(device=x.device, dtype=x.dtype)
            return out

        hooks.append((model.mlp_in(layer), mlp_hook))
    return hooks


def _channel_hook(model: EdgeModel, layer: int, c: str, chosen: list[tuple[int, Receiver]], rows: dict[int, int],
                  increment: dict[str, Tensor], E: int) -> Callable:
    """The hook at ``HOOKS.<c>(layer)`` adding each chosen copy's ``increment @ W_c`` at its slot."""
    device = model.weights[c].device
    copies = torch.tensor([i for i, _ in chosen], device=device)
    slots = torch.tensor([r.slot for _, r in chosen], device=device)
    inputs = torch.tensor([rows[i] for i, _ in chosen], device=device)
    W = model.weights[c][layer, torch.tensor([r.weight for _, r in chosen], device=device)]  # [n, d_model, d_head]

    def hook(act: Tensor, hook: Any) -> Tensor:
        x = increment["x"][inputs.to(increment["x"].device)]
        inc = torch.einsum("nbpm,nmd->nbpd", x, W.to(device=x.device, dtype=x.dtype))
        out = act.clone()
        view = out.view(E, -1, *act.shape[1:])
        view[copies.to(act.device), :, :, slots.to(act.device)] += inc.to(act.dtype)
        return out

    return hook


def _restore_group(model: EdgeModel, restore: list[tuple[int, Receiver]], z_clean: Tensor, E: int) -> Callable:
    """A ``z`` hook putting back the clean output of every other query head of each receiver's key/value group, so
    that only the receiver (``only``) reads the patched keys/values."""
    spec = model.adapter.spec
    group = spec.n_heads // spec.n_kv_heads
    copies, heads = [], []
    for i, r in restore:
        for other in range(r.slot * group, (r.slot + 1) * group):
            if other != r.only:
                copies.append(i)
                heads.append(other)
    copies_t = torch.tensor(copies, device=z_clean.device)
    heads_t = torch.tensor(heads, device=z_clean.device)

    def hook(z: Tensor, hook: Any) -> Tensor:
        out = z.clone()
        view = out.view(E, -1, *z.shape[1:])
        view[copies_t.to(z.device), :, :, heads_t.to(z.device)] = z_clean[:, :, heads_t].permute(2, 0, 1, 3).to(
            device=z.device, dtype=z.dtype)
        return out

    return hook


__all__ = ["EdgeModel", "Receiver", "patched_edges"]
