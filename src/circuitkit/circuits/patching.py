"""Exact path patching of edges between heads (Wang et al. 2022), many edges per forward pass.

Why: a composition score says an earlier head *could* feed a later one; path patching says whether it does.
For an edge ``sender (l1, h1) -> receiver (l2, h2)`` through channel ``c`` (the receiver's query, key or value
input), only the sender's **direct** contribution to the receiver's ``c``-input is replaced; every other path
stays clean (the receiver's other inputs, every other head, the sender's contribution to everything else)::

    delta     = (z_corrupt[l1][:, :, h1] - z[l1][:, :, h1]) @ W_O[l1, h1]       [batch, pos, d_model]
    c_patched = norm(resid_pre[l2] + delta) @ W_c[l2, h2] + b_c                 [batch, pos, d_head]
              = c_clean + (norm(resid_pre[l2] + delta) - norm(resid_pre[l2])) @ W_c[l2, h2]

with ``norm`` the block's ``ln1`` (the identity in attention-only models without LayerNorm, where the increment
is just ``delta @ W_c``). The receiver's ``c`` is swapped for ``c_patched`` at its hook (``HOOKS.q/k/v``), and
the forward pass goes on from there as usual. ``z_corrupt`` comes from the corrupted run (every copy of the
block resampled, :mod:`~circuitkit.circuits.corrupt`) or is the clean batch mean per position
(``corrupt="mean"``).
Each edge is an :class:`~circuitkit.edge_effect.EdgeEffect`, the record of a task's exact edge effects too: the
metric's ``clean`` and ``patched`` values (:mod:`~circuitkit.circuits.metrics`) and the ``effect``, the behaviour
lost: ``patched - clean`` of the repeated-copies loss (and of a callable, read as a loss), ``clean - patched`` of
the receiver's induction score (which falls as the behaviour does). With the loss each sequence's effect is kept
too (``each``, its patched loss minus its clean one), and the effect's interval is the percentile bootstrap over the
sequences (``interval``; one draw of the sequences for every edge, as a task's exact edge effects take theirs over
the pairs; no extra pass).

Grouped-query attention: for ``"k"``/``"v"`` the receiver's key/value group gets the patched input, and the
group's other query heads have their clean ``z`` put back, so only the receiver reads the patched keys/values
(see :mod:`~circuitkit.circuits.edges`).

Cost: one clean and one corrupted forward pass, then per edge one forward pass from the receiver's layer
(resumed from the clean residual stream where the model can resume; stopped at the receiver's pattern for the
``"induction"`` metric). Edges with the same receiver layer share passes: the batch is stacked once per edge,
``edges_per_pass`` copies at a time (by default as many as fit :data:`PASS_MEMORY_BUDGET`). The pass is the one
exact edge pass of both engines, :func:`circuitkit.graph.edge_patch.patched_edges` (a task's
:meth:`~circuitkit.graph.runner.TaskRunner.single_edge_metric` runs it too); this module gives it each edge's delta
and reads its metric.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from circuitkit import validate
from circuitkit.circuits._engine import DEFAULT_CORRUPT_SEED, Context, StopForward, context, corrupt_z
from circuitkit.circuits.edges import EdgeSpec, parse_edges
from circuitkit.circuits.metrics import (
    InductionReader,
    Metric,
    check_value,
    repeated_loss,
    repeated_loss_each,
    resolve_metric,
)
from circuitkit.detect.loss import loss_positions, token_losses
from circuitkit.detect.reference import Keep, reference_pass
from circuitkit.detect.tokens import RepeatedTokens, TokenBatch
from circuitkit.edge_effect import EdgeEffect
from circuitkit.graph.edge_patch import CHANNELS, EdgeModel, Receiver, patched_edges
from circuitkit.models.adapters import HOOKS
from circuitkit.models.state import keeps_model_state
from circuitkit.pass_budget import copies_per_pass
from circuitkit.ranking import Head, top_indices
from circuitkit.results import EdgeValues
from circuitkit.uncertainty import DEFAULT_LEVEL, DEFAULT_RESAMPLES, DEFAULT_SEED, mean_intervals

PASS_MEMORY_BUDGET = 2**28
"""Bytes of the largest stacked activation (logits, or patterns for ``"induction"``) one pass may hold (256 MiB):
the passes' total compute does not depend on it, only how many edges share one pass."""


@dataclass(frozen=True, eq=False)
class PathPatching:
    """Per-edge effects of exact path patching, in the order the edges were given."""

    edges: tuple[EdgeEffect, ...]
    metric: str
    corrupt: str

    def edge_values(self, n_layers: int, n_heads: int) -> EdgeValues:
        """The effects as :class:`~circuitkit.results.EdgeValues` named ``"patched"`` (float64) over a model of
        ``n_layers`` x ``n_heads`` heads: NaN on every edge not patched."""
        n_layers = validate.positive_int("PathPatching.edge_values: n_layers", n_layers)
        n_heads = validate.positive_int("PathPatching.edge_values: n_heads", n_heads)
        for e in self.edges:
            if e.src[0] >= n_layers or e.dst[0] >= n_layers or max(e.src[1], e.dst[1]) >= n_heads:
                raise validate.fail("PathPatching.edge_values", validate.given(f"edge {e.name}"),
                                    f"edges between heads of a model of {n_layers} layers x {n_heads} heads")
        return EdgeValues.from_edges(((e.src, e.dst, e.channel, e.effect) for e in self.edges), n_layers, n_heads,
                                     "patched")

    @property
    def effects(self) -> Tensor:
        """``[n_edges]`` float64: each edge's effect, the behaviour lost (module docstring)."""
        return torch.tensor([e.effect for e in self.edges], dtype=torch.float64)

    def top(self, k: int = 10) -> list[EdgeEffect]:
        """The ``k`` edges with the largest ``|effect|``, largest first (ties in given order, NaN last)."""
        k = validate.positive_int("PathPatching.top: k", k)
        return [self.edges[i] for i, _ in top_indices(self.effects, min(k, len(self.edges)), absolute=True)]

    def effect(self, src: Head, dst: Head, channel: str) -> float:
        """The effect of one patched edge (a ``CircuitkitError`` if it was not patched)."""
        for e in self.edges:
            if e.src == tuple(src) and e.dst == tuple(dst) and e.channel == channel:
                return e.effect
        raise validate.fail("PathPatching.effect", (src, dst, channel), "an edge that was patched")

    def to_json(self) -> dict[str, Any]:
        return {"metric": self.metric, "corrupt": self.corrupt, "edges": [e.to_json() for e in self.edges]}

    def __repr__(self) -> str:
        best = ", ".join(f"{e.label}: {e.effect:+.4g}" for e in self.top(3))
        return f"PathPatching({len(self.edges)} edges, metric={self.metric!r}, corrupt={self.corrupt!r}; top {best})"


@keeps_model_state
def path_patching(
    model: Any,
    edges: Any,
    *,
    input: str = "all",
    metric: Any = "loss",
    corrupt: str = "resample",
    tokens: RepeatedTokens | TokenBatch | None = None,
    corrupt_seed: int = DEFAULT_CORRUPT_SEED,
    edges_per_pass: int | None = None,
    device: str | torch.device | None = None,
    n_resamples: int = DEFAULT_RESAMPLES,
    ci_level: float = DEFAULT_LEVEL,
) -> PathPatching:
    """Exact path patching of ``edges`` (see the module docstring).

    Args:
        model: a TransformerBridge, a circuitkit toy model, or a duck-typed hooked model.
        edges: ``[(src, dst), ...]`` with heads ``(layer, head)``, or ``(src, dst, channel)``, or objects with
            ``src``/``dst`` (``circuitkit.Edge``); src layer < dst layer.
        input: the receiver's channel, ``"q"``, ``"k"``, ``"v"``, or ``"all"`` (the three patched together), for
            edges that do not name their own.
        metric: ``"loss"`` (repeated-copies loss), ``"induction"`` (the receiver's induction score) or a callable
            ``metric(logits, batch) -> scalar``, read as a loss (:mod:`~circuitkit.circuits.metrics`); each
            effect is the behaviour lost (``patched - clean`` of a loss, ``clean - patched`` of the induction
            score).
        corrupt: ``"resample"`` (every copy of the block resampled, ``corrupt_seed``) or ``"mean"`` (batch mean
            per position).
        tokens: a :class:`~circuitkit.detect.RepeatedTokens` spec or a built ``TokenBatch`` (default spec if None).
        edges_per_pass: stacked copies per forward pass (default: fit :data:`PASS_MEMORY_BUDGET`).
        n_resamples, ci_level: the percentile bootstrap over the sequences behind each effect's interval (the
            repeated-copies loss; seed 0, as every interval of a scan).

    Returns:
        :class:`PathPatching`, one :class:`EdgeEffect` per edge in the given order.
    """
    from circuitkit.uncertainty import check_settings

    n_resamples, ci_level, _ = check_settings("path_patching", n_resamples, ci_level, DEFAULT_SEED, "ci_level")
    ctx = context(model, tokens, corrupt, corrupt_seed, device, "path_patching")
    specs = parse_edges(edges, input, ctx.spec, where="path_patching: edges")
    m = resolve_metric(metric, "path_patching")
    if edges_per_pass is not None:
        edges_per_pass = validate.positive_int("path_patching: edges_per_pass", edges_per_pass)
    return patch(ctx, specs, m, edges_per_pass, n_resamples=n_resamples, level=ci_level)


def patch(ctx: Context, specs: list[EdgeSpec], m: Metric, edges_per_pass: int | None = None, *,
          n_resamples: int = DEFAULT_RESAMPLES, level: float = DEFAULT_LEVEL) -> PathPatching:
    """:func:`path_patching` of parsed edges in a prepared context. Reuses the clean activations an earlier
    :func:`~circuitkit.circuits.attribution.attribute` left in ``ctx.clean`` (same metric) and the corrupted
    ``z`` in ``ctx.z_corrupt``; runs its own clean pass otherwise. ``n_resamples``, ``level``: the effects'
    intervals (checked by the caller)."""
    batch = ctx.batch
    with torch.no_grad():
        z_clean, resid, patterns, value, dtype, clean_each = _clean_activations(ctx, specs, m)
        z_corrupt = corrupt_z(ctx, z_clean, {e.src[0] for e in specs})
        reader = InductionReader(batch, dtype)
        if m.local:
            clean = [float(reader(patterns[e.dst[0]][:, e.dst[1]])) for e in specs]
        else:
            clean = [value] * len(specs)
        per_pass = edges_per_pass or _edges_per_pass(ctx, m, dtype)
        by_layer: dict[int, list[int]] = defaultdict(list)
        for i, e in enumerate(specs):
            by_layer[e.dst[0]].append(i)
        patched = [math.nan] * len(specs)
        each: list[Tensor | None] = [None] * len(specs)
        for layer, indices in sorted(by_layer.items()):
            for start in range(0, len(indices), per_pass):
                chunk = indices[start : start + per_pass]
                kept: list[Tensor] = []
                values = _patched_pass(ctx, layer, [specs[i] for i in chunk], resid[layer], z_clean, z_corrupt, m,
                                       reader, kept)
                for i, value in zip(chunk, values, strict=True):
                    patched[i] = value
                for i, sequences in zip(chunk, kept, strict=False):
                    each[i] = sequences
    validate.finite_result("path_patching", torch.tensor(patched, device="cpu"), why="the patched runs overflowed")
    rises = [None if q is None or clean_each is None else q.double() - clean_each.double() for q in each]
    intervals = mean_intervals(rises, n_resamples, level)  # one draw of the sequences for every edge
    # the behaviour lost: the loss (and a callable, read as one) rises, the receiver's induction score falls
    sign = -1.0 if m.local else 1.0
    effects = tuple(
        EdgeEffect.between_heads(e.src, e.dst, e.channel, clean=c, patched=p, effect=sign * (p - c), each=r,
                                 interval=i, patched_each=q)
        for e, c, p, q, r, i in zip(specs, clean, patched, each, rises, intervals, strict=True)
    )
    return PathPatching(effects, m.name, ctx.corrupt)


def _clean_activations(
    ctx: Context, specs: list[EdgeSpec], m: Metric
) -> tuple[dict[int, Tensor], dict[int, Tensor], dict[int, Tensor], float | None, torch.dtype, Tensor | None]:
    """The clean ``z``, ``resid_pre`` and (``"induction"``) receiver patterns by layer, the clean metric of the
    logits (None for ``"induction"``), the activations' dtype and, with the repeated-copies loss, each sequence's
    clean loss ``[batch]`` (float32, CPU; the session's clean run's where it holds one): from the session's edge
    gradients (``ctx.clean``) where they hold all of them for ``m``, else from one clean pass."""
    receivers = sorted({e.dst[0] for e in specs})
    needed_z = {e.src[0] for e in specs}
    if ctx.group_size > 1 and not m.local:
        needed_z |= set(receivers)  # the group's other query heads are restored from the clean z
    cached = ctx.clean
    # each sequence's clean loss: the session's clean run where it holds one (the run a scan's other intervals
    # resample), else the run the clean activations come from
    held = ctx.session.clean if m.fn is repeated_loss else None
    each = None if held is None else held.repeated_per_sequence
    if (cached is not None and cached.metric == m and needed_z <= cached.z.keys()
            and set(receivers) <= cached.resid.keys() and (not m.local or set(receivers) <= cached.patterns.keys())):
        z_clean, resid, patterns, value = cached.z, cached.resid, cached.patterns, cached.value
        dtype = next(iter(z_clean.values())).dtype
        each = cached.each if each is None else each
    else:
        keep = Keep(z=sorted(needed_z), resid=receivers, patterns=receivers if m.local else ())
        logits, kept = reference_pass(ctx.adapter, ctx.batch.tokens, keep)
        z_clean, resid, patterns = kept.z, kept.resid, kept.patterns
        value = None if m.local else float(check_value(m.fn(logits, ctx.batch), "path_patching: metric(clean logits)"))
        dtype = logits.dtype if logits.is_floating_point() else torch.float32
        if each is None and m.fn is repeated_loss:
            each = repeated_loss_each(logits, ctx.batch)
    return z_clean, resid, patterns, value, dtype, each


def _edges_per_pass(ctx: Context, m: Metric, dtype: torch.dtype) -> int:
    B, P = ctx.batch.tokens.shape
    spec = ctx.spec
    width = spec.n_heads * P if m.local else max(spec.d_vocab, 4 * spec.d_model)
    per_edge = B * P * (width + 4 * spec.d_model) * dtype.itemsize
    return copies_per_pass(per_edge, PASS_MEMORY_BUDGET)


def _patched_pass(
    ctx: Context,
    layer: int,
    edges: list[EdgeSpec],
    resid: Tensor,
    z_clean: dict[int, Tensor],
    z_corrupt: dict[int, Tensor],
    m: Metric,
    reader: InductionReader,
    keep: list[Tensor] | None = None,
) -> list[float]:
    """The metric with each of ``edges`` (all into ``layer``) patched, one stacked copy of the batch per edge: the
    one exact edge pass of both engines (:func:`~circuitkit.graph.edge_patch.patched_edges`); ``resid`` ``[B, P,
    d_model]`` is the layer's clean ``resid_pre``. ``keep`` (the repeated-copies loss): each edge's per-sequence
    loss ``[B]`` is appended to it."""
    E = len(edges)
    deltas = torch.stack(
        [(z_corrupt[e.src[0]][:, :, e.src[1]].float() - z_clean[e.src[0]][:, :, e.src[1]].float())
         @ ctx.W_O[e.src[0], e.src[1]].float() for e in edges]
    ).to(resid.dtype)  # [E, B, P, d_model]; the difference in float32 (half-precision activations, float32 W_O)
    # the receiver's key/value group is patched; without the "induction" metric (read at the receiver's own
    # pattern) the group's other query heads then get their clean z back, so only the receiver reads it
    alone = ctx.group_size > 1 and not m.local

    def receiver(channel: str, head: int) -> Receiver:
        unit = head if channel == "q" else ctx.kv_index(head)  # keys/values: the model's weights per key/value head
        return Receiver(channel, layer, weight=unit, slot=unit, only=head if alone and channel != "q" else None)

    receivers = [tuple(receiver(c, e.dst[1]) for c in (CHANNELS if e.channel == "all" else (e.channel,)))
                 for e in edges]
    read: list[Tensor] = []
    hooks = []
    if m.local:
        dst_heads = torch.tensor([e.dst[1] for e in edges], device=deltas.device)

        def pattern_hook(pattern: Tensor, hook: Any) -> None:
            rows = torch.arange(E, device=pattern.device)
            per_copy = pattern.view(E, -1, *pattern.shape[1:])[rows, :, dst_heads.to(pattern.device)]
            read.append(reader(per_copy))  # [E, B, q, k] -> [E]
            raise StopForward  # the "induction" metric needs nothing after the receiver's pattern

        hooks.append((HOOKS.pattern(layer), pattern_hook))
    at = loss_positions(ctx.batch) if m.fn is repeated_loss else None  # a user metric reads every position
    model = EdgeModel(ctx.adapter, ctx.W_in, ctx.norms)
    try:
        logits = patched_edges(model, deltas, receivers, start=layer if ctx.adapter.can_resume else 0, resid=resid,
                               tokens=ctx.batch.tokens, clean_z=z_clean, positions=at, read=hooks)
    except StopForward:
        return [float(v) for v in read[0]]
    stacked = logits.view(E, -1, *logits.shape[1:])
    if m.fn is repeated_loss:
        # repeated_losses(stacked, batch), with each sequence's mean kept
        tokens = ctx.batch.tokens.repeat(E, 1)
        per_token = token_losses(stacked.flatten(0, 1), tokens, ctx.batch.repeated_copies)
        if keep is not None:  # each copy's sequences, as repeated_loss_each reads a clean run's
            keep.extend(per_token.view(E, -1, per_token.shape[-1]).float().mean(dim=2).cpu())
        return [float(v) for v in per_token.view(E, -1).mean(dim=1)]
    return [float(check_value(m.fn(stacked[i], ctx.batch), "path_patching: metric(patched logits)")) for i in range(E)]


__all__ = ["PASS_MEMORY_BUDGET", "EdgeEffect", "PathPatching", "path_patching"]
