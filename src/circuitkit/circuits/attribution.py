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

Cost and memory: the clean pass builds a graph from layer 1 on (layer 0 holds no receiver) and the corrupted
pass stops at the last sender's ``z``. LayerNorm / RMSNorm pullbacks are taken in closed form with their
per-position terms found in ``d_head`` space (:class:`~circuitkit.graph.pullback.ReceiverGradients`), so the rest is one
``[senders, n * d_model] @ [n * d_model, 3 H]`` product per receiver layer, summed over chunks of ``n``
positions that keep the senders' differences under :data:`MAX_DELTA_BYTES`.

Metrics (:mod:`~circuitkit.circuits.metrics`): for ``"induction"``, receiver ``r``'s own induction score is the
metric of every edge into ``r`` (as in path patching); one backward pass of the sum of all heads' scores gives
them all, because each head's output ``z`` is detached in that pass (a head's score then depends on its own
queries and keys only, not on what earlier heads' scores did downstream). V edges get exactly 0. For
``"loss"`` and callables, the metric of the logits is differentiated through everything downstream. Each score
estimates the behaviour lost, as path patching's effects give it: the estimate of ``metric(patched) -
metric(clean)`` for the loss and callables (read as a loss), its negative for the induction score, which falls as
the behaviour does.

Integrated gradients (``steps = m > 1``; EAP-IG-inputs, Hanna, Pezzelle & Belinkov 2024): ``g_{r,c}`` is replaced
by its mean over ``m`` points of the straight path between the corrupted and the clean input embeddings
(``blocks.0.hook_resid_pre``, token + position embedding; ``e'`` of the corrupted batch, or for
``corrupt="mean"`` the clean embeddings' batch mean at each position)::

    attribution[s, r, c] = sum_{b, p} delta_s[b, p] . (1/m) sum_{k=1..m} g_{r,c}[b, p] |_(e' + (k/m) (e - e'))

The point ``k = m`` is the clean run, so ``m = 1`` is the first-order estimate above, bit for bit; the sender
differences ``delta_s`` stay those of the clean and corrupted runs. The further points run as copies of the batch
stacked in one forward and one backward pass on the clean labels (each copy's metric read on its own), as head
attribution's points (:func:`~circuitkit.detect.attribution.points_per_pass`, its rule for how many a pass holds) and
a task's EAP-IG run theirs; at most :data:`RUNS_PER_CONTRACTION` runs' gradients are held at once and contracted
together (with their own normalisation pullbacks), so a pass holds at most that many points, and the stacked points
give what one point a pass gave (bit for bit on the bundled model, ``benchmarks/README.md``).

Measured on the bundled model against exact path patching of all 48 edges (``benchmarks/ig.py``): with the
loss metric the strongest edge (previous-token head 0.1 -> induction head 1.3 through K, exact +0.160) is
estimated +0.016 at first order (10x low) and +0.197 at 2 steps; the estimate's top 3 edges are the exact top 3 in
order from 2 steps on, and its top 5 hold all of the exact top 5 from 4 steps on (4 of 5 at first order), but the
rank correlation over all edges falls (0.95 -> 0.68 at 2 steps: the path moves every sender at once, so the many
small edges are credited with joint effects). With the induction metric the error shrinks with the steps
(relative error 0.75, 0.64, 0.55 at 1, 2, 4 steps; Spearman 0.91 -> 0.97).

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
from circuitkit.circuits._engine import (
    DEFAULT_CORRUPT_SEED,
    Context,
    EdgeGradients,
    StopForward,
    context,
    corrupt_z,
)
from circuitkit.circuits.corrupt import position_mean, resampled_batch
from circuitkit.circuits.edges import CHANNELS
from circuitkit.circuits.metrics import (
    InductionReader,
    Metric,
    check_value,
    repeated_loss,
    repeated_loss_each,
    resolve_metric,
)
from circuitkit.detect.attribution import check_steps, frozen_parameters, points_per_pass
from circuitkit.detect.loss import loss_positions
from circuitkit.detect.tokens import RepeatedTokens, TokenBatch
from circuitkit.errors import CircuitkitError
from circuitkit.graph.pullback import ClosedForm, ReceiverGradients, closed_form, split_by_query_head
from circuitkit.ig_path import PathStart, ig_alphas, stacked_inputs
from circuitkit.models.adapters import HOOKS
from circuitkit.models.state import keeps_model_state
from circuitkit.ranking import Head
from circuitkit.results import Edge, EdgeValues


class AttributedEdge(Edge):
    """One edge and its first-order effect estimate: an :class:`~circuitkit.results.Edge` holding the value
    ``"attribution"``."""

    def __init__(self, src: Head, dst: Head, channel: str, value: float) -> None:
        super().__init__(tuple(src), tuple(dst), channel, (("attribution", value),))

    @property
    def value(self) -> float:
        """The estimated behaviour lost with the edge patched (:attr:`EdgeAttribution.scores`)."""
        return self.values[0][1]

    def __repr__(self) -> str:
        return f"AttributedEdge(src={self.src!r}, dst={self.dst!r}, channel={self.channel!r}, value={self.value!r})"


@dataclass(frozen=True, eq=False)
class EdgeAttribution:
    """``scores`` ``[src_layer, src_head, dst_layer, dst_head, channel]`` (float32, CPU; channels :data:`CHANNELS`,
    NaN where src layer >= dst layer): each edge's estimated behaviour lost, the quantity path patching measures
    exactly (:class:`~circuitkit.edge_effect.EdgeEffect`): ``metric(patched) - metric(clean)`` of the loss (and of a
    callable, read as one), ``clean - patched`` of the receiver's induction score; also as the per-edge result
    :attr:`edge_values`. ``clean_metric`` is the metric on the clean run (for ``"induction"``, the
    sum of all later heads' scores)."""

    scores: Tensor
    metric: str
    corrupt: str
    clean_metric: float

    @property
    def edge_values(self) -> EdgeValues:
        """The scores as :class:`~circuitkit.results.EdgeValues` named ``"attribution"``."""
        return EdgeValues(self.scores, "attribution")

    def channel(self, name: str) -> Tensor:
        """The ``[src_layer, src_head, dst_layer, dst_head]`` scores of channel ``"q"``, ``"k"`` or ``"v"``."""
        return self.scores[..., CHANNELS.index(validate.option("EdgeAttribution.channel", name, CHANNELS))]

    def value(self, src: Head, dst: Head, channel: str) -> float:
        return float(self.channel(channel)[src[0], src[1], dst[0], dst[1]])

    def top(self, k: int = 10, channel: str | None = None) -> list[AttributedEdge]:
        """The ``k`` edges with the largest ``|attribution|`` (all channels, or one), largest first; non-edges
        (NaN) never come before edges."""
        k = validate.positive_int("EdgeAttribution.top: k", k)
        if channel is not None:
            channel = validate.option("EdgeAttribution.channel", channel, CHANNELS)
        return [AttributedEdge(e.src, e.dst, e.channel, e.attribution)
                for e in self.edge_values.top(k, absolute=True, input=channel)]

    def to_json(self) -> dict[str, Any]:
        """Plain JSON: nested lists ``[src_layer][src_head][dst_layer][dst_head][channel]``, NaN -> None."""
        values = self.edge_values.to_json()
        return {"metric": self.metric, "corrupt": self.corrupt, "clean_metric": self.clean_metric,
                "channels": values["inputs"], "scores": values["values"]}

    def __repr__(self) -> str:
        best = ", ".join(f"{e.name}: {e.value:+.4g}" for e in self.top(3))
        L, H = self.scores.shape[:2]
        return f"EdgeAttribution({L} layers x {H} heads, metric={self.metric!r}; top {best})"


@keeps_model_state
def edge_attribution(
    model: Any,
    *,
    metric: Any = "loss",
    corrupt: str | TokenBatch = "resample",
    tokens: RepeatedTokens | TokenBatch | None = None,
    corrupt_seed: int = DEFAULT_CORRUPT_SEED,
    device: str | torch.device | None = None,
    steps: int = 1,
) -> EdgeAttribution:
    """Estimated effects of all ``[L, H, L, H, 3]`` edges (see the module docstring). Arguments as
    :func:`~circuitkit.circuits.path_patching` (``metric`` ``"loss"``, ``"induction"`` or a differentiable callable
    ``metric(logits, batch) -> scalar``; ``corrupt`` ``"resample"``, ``"mean"`` or a corrupted ``TokenBatch``).
    ``steps``: points the gradient is averaged over on the inputs path (integrated gradients); 1 (default) is
    first-order attribution, at most :data:`~circuitkit.detect.attribution.MAX_IG_STEPS`."""
    steps = check_steps("edge_attribution", steps)
    ctx = context(model, tokens, corrupt, corrupt_seed, device, "edge_attribution")
    return attribute(ctx, resolve_metric(metric, "edge_attribution"), steps=steps)


def attribute(ctx: Context, m: Metric, *, steps: int = 1) -> EdgeAttribution:
    """:func:`edge_attribution` in a prepared context (``steps`` checked by the caller); leaves the clean activations
    in ``ctx.clean`` and the corrupted ``z`` in ``ctx.z_corrupt`` for a later
    :func:`~circuitkit.circuits.patching.patch` on the batch."""
    spec = ctx.spec
    L, H = spec.n_layers, spec.n_heads
    scores = torch.full((L, H, L, H, len(CHANNELS)), math.nan, device="cpu")
    if L < 2:
        return EdgeAttribution(scores, m.name, ctx.corrupt, math.nan)
    if ctx.clean is None or ctx.clean.metric != m:  # else a host pass (or an earlier call) left them in the session
        with frozen_parameters(ctx.adapter.model):
            _clean_gradients(ctx, m)
    clean = ctx.clean
    clean_z, value = clean.z, clean.total
    with torch.no_grad():
        z_corrupt = corrupt_z(ctx, clean_z, range(L - 1))
        work = torch.promote_types(clean_z[0].dtype, torch.float32)
        dz = [(z_corrupt[s] - clean_z[s]).flatten(0, 1).transpose(0, 1).to(work) for s in range(L - 1)]  # [H, N, dh]
        W_O = ctx.W_O[: L - 1].to(work)
        totals = [torch.zeros(l2 * H, len(CHANNELS) * H, dtype=work, device=W_O.device) for l2 in range(1, L)]
    # The contraction with the senders' deltas is linear in each run's pulled-back gradients: runs (the clean one,
    # the integration points) are summed before it, so it is paid once per group of runs, not once per run.
    runs = [(clean.grads, clean.resid)]
    if steps > 1:
        base = _corrupted_input(ctx)
        alphas = ig_alphas(steps, "interior")
        per_pass = points_per_pass(ctx.adapter, ctx.batch)
        first = 0
        while first < len(alphas):
            # the points stacked in one pass fill the current group of runs, never more: the contractions sum the
            # same runs together whatever a pass holds
            chunk = alphas[first : first + min(per_pass, RUNS_PER_CONTRACTION - len(runs))]
            runs += _path_gradients(ctx, m, base, chunk)
            first += len(chunk)
            if len(runs) == RUNS_PER_CONTRACTION:
                with torch.no_grad():
                    _contract_all(ctx, runs, dz, W_O, totals)
                runs = []
    if runs:
        with torch.no_grad():
            _contract_all(ctx, runs, dz, W_O, totals)
    del runs
    sign = -1.0 if m.local else 1.0  # the behaviour lost, as path patching's effects: the induction score falls
    with torch.no_grad():
        for l2 in range(1, L):
            total = totals[l2 - 1] / steps if steps > 1 else totals[l2 - 1]
            scores[:l2, :, l2] = sign * total.reshape(l2, H, len(CHANNELS), H).permute(0, 1, 3, 2).float().cpu()
    validate.finite_result("edge_attribution", scores[~scores.isnan()], why="the gradients overflowed")
    return EdgeAttribution(scores, m.name, ctx.corrupt, value)


RECEIVER_LAYERS_PER_PRODUCT = 8
"""Receiver layers contracted with the senders' deltas in one product (see :func:`_contract_all`)."""

RUNS_PER_CONTRACTION = 4
"""Runs whose gradients are held at once and summed before one contraction (each holds ``dM/d(q, k, v)`` of every
layer: 130 MB at SmolLM-135M's shape and the default batch), so also the most points one stacked pass holds."""


def _contract_all(ctx: Context, runs: list[tuple[dict, dict[int, Tensor]]], dz: list[Tensor], W_O: Tensor,
                  totals: list[Tensor]) -> None:
    """Add ``sum_{b, p} delta_s . g_{r,c}`` for every edge to ``totals[l2 - 1]`` ``[l2 * H, 3 H]``, with ``g`` summed
    over ``runs`` (the clean one, points of the integration path): each run's receivers' gradients ``grads`` pulled
    back through the normalisation at that run's inputs ``resid``; ``dz`` ``[H, N, d_head]`` per sender layer, the
    senders' corrupted minus clean ``z``."""
    spec = ctx.spec
    L, H = spec.n_layers, spec.n_heads
    work = W_O.dtype
    kind = ctx.adapter.norm_kind
    # per run and receiver layer: the normalisation's input [N, d_model] and whether the closed form applies to it
    inputs = []
    for grads, resid in runs:
        x = {l2: resid[l2].detach().flatten(0, 1).to(work) for l2 in range(1, L) if ctx.norms[l2] is not None}
        inputs.append((grads, x, {l2: closed_form(ctx.norms[l2], kind, x[l2]) for l2 in x}))
    n_positions, d_model = dz[0].shape[1], spec.d_model
    K = len(CHANNELS) * H  # receivers per layer
    block = min(RECEIVER_LAYERS_PER_PRODUCT, L - 1)
    rows = ((L - 1) * H + block * K) * d_model * W_O.element_size()  # deltas and one block of receivers, per position
    chunk = min(n_positions, max(1, MAX_DELTA_BYTES // rows))
    buffer = torch.empty(block * K * chunk * d_model, dtype=work, device=W_O.device)  # written in place, per block
    weights: dict[int, Tensor] = {}
    for first in range(0, n_positions, chunk):
        part = slice(first, min(first + chunk, n_positions))
        # the senders' output differences on these positions: [L - 1, H, n, d_model]
        deltas = torch.empty(L - 1, H, part.stop - part.start, d_model, dtype=work, device=W_O.device)
        for s in range(L - 1):
            torch.matmul(dz[s][:, part], W_O[s], out=deltas[s])
        # Receiver layers a block at a time, so that one product reads the deltas once for the whole block (one
        # product per layer read them once per layer, and ran at memory speed); the block's products with senders
        # in or after a receiver's own layer are computed and dropped.
        n = part.stop - part.start
        for start in range(1, L, block):
            layers = range(start, min(start + block, L))
            U = buffer[: len(layers) * K * n * d_model].view(len(layers), K, n, d_model)
            for i, l2 in enumerate(layers):  # the closed-form check ran once per run, above
                ReceiverGradients.pulled_sum([_receivers(ctx, l2, grads, x.get(l2), forms.get(l2), part, work, weights)
                                      for grads, x, forms in inputs], out=U[i])
            product = deltas[: layers[-1]].flatten(0, 1).flatten(1) @ U.flatten(2).flatten(0, 1).T  # [senders, .. K]
            for i, l2 in enumerate(layers):
                totals[l2 - 1] += product[: l2 * H, i * K : (i + 1) * K]


def _corrupted_input(ctx: Context) -> PathStart:
    """``e'``, the embedded corrupted input (``blocks.0.hook_resid_pre`` of the corrupted batch), or for
    ``corrupt="mean"`` how it is read from the clean embeddings in the pass, their batch mean at each position."""
    if ctx.corrupt == "mean":
        return position_mean
    corrupted = ctx.corrupt_batch or resampled_batch(ctx.batch, ctx.corrupt_seed)
    return ctx.adapter.embedded(corrupted.tokens)


def _path_gradients(ctx: Context, m: Metric, base: PathStart, alphas: Tensor) -> list[tuple[dict, dict]]:
    """The receivers' gradients and normalisation inputs ``(grads, resid)`` at each point ``e' + alpha (e - e')``
    of the inputs path, one per ``alphas``: one forward pass with gradients from layer 1 on and one backward pass of
    the points stacked as copies of the batch (a :class:`GradientTap` of its own; each copy's gradient is of its own
    metric), as head attribution runs its points and the task runner its EAP-IG."""
    n = len(alphas)
    point = _tapped_pass(ctx, m, [(HOOKS.resid_pre(0), stacked_inputs(alphas, base))], "interpolated logits", n)
    if n == 1:
        return [(point.grads, point.resid)]
    B = ctx.batch.tokens.shape[0]
    return [({key: g[i * B : (i + 1) * B] for key, g in point.grads.items()},
             {layer: x[i * B : (i + 1) * B] for layer, x in point.resid.items()}) for i in range(n)]


def _clean_gradients(ctx: Context, m: Metric) -> None:
    """One clean forward pass with gradients and one backward pass (:class:`GradientTap` on a pass of its own),
    leaving ``ctx.clean``: ``dM/d(q, k, v)`` per query head for every layer >= 1 (``grads[(c, l)]`` ``[batch, pos,
    head, d_head]``), the clean ``z`` and ``resid_pre`` of layers >= 1 and the metric's value."""
    ctx.clean = _tapped_pass(ctx, m, [], "clean logits", clean=True)


def _tapped_pass(ctx: Context, m: Metric, hooks: list, what: str, copies: int = 1, *,
                 clean: bool = False) -> EdgeGradients:
    """One forward pass of the batch (``copies`` of it stacked on the batch axis) with ``hooks`` and a
    :class:`GradientTap` of its own, then one backward pass of the metric, summed over the copies, to the tap's
    inputs (parameters frozen: only the receivers' gradients are wanted); ``clean``: the clean run, whose
    per-sequence loss the gradients then carry (``each``)."""
    tap = GradientTap(ctx, m, leaf=True, copies=copies)
    tokens = ctx.batch.tokens if copies == 1 else ctx.batch.tokens.repeat(copies, 1)
    with frozen_parameters(ctx.adapter.model), torch.enable_grad():
        try:
            at = loss_positions(ctx.batch) if m.fn is repeated_loss else None  # a user metric reads every position
            logits = ctx.adapter.run(tokens, [*hooks, *tap.hooks()], positions=at)
        except StopForward:
            logits = None
        if m.local:
            total = torch.stack(tap.local_scores).sum()
        else:  # each copy's metric of its own logits: the sum's gradient in a copy is that copy's
            B = ctx.batch.tokens.shape[0]
            total = torch.stack([check_value(m.fn(logits[i * B : (i + 1) * B], ctx.batch),
                                             f"edge_attribution: metric({what})") for i in range(copies)]).sum()
        found = torch.autograd.grad(total, tap.inputs(), allow_unused=True, retain_graph=tap.retain_graph)
        gradients = tap.record(total, found)
    if clean and m.fn is repeated_loss and ctx.session.clean is None:  # for path patching's intervals, where the
        gradients.each = repeated_loss_each(logits, ctx.batch)  # session holds no clean run to read them from
    return gradients


class GradientTap:
    """The hooks and gradient requests of edge attribution's clean pass, so that it can ride on another pass that
    differentiates the same metric (the scan's head attribution, :func:`circuitkit.detect.attribution.attribute`,
    with the repeated-copies loss), saving a forward and a backward pass.

    Protocol: register :meth:`hooks` on the pass (after the host's own hooks), differentiate the metric with
    respect to :meth:`inputs` (``torch.autograd.grad(..., allow_unused=True, retain_graph=retain_graph)``, still
    under ``enable_grad``) and hand the result to :meth:`finish`, which leaves ``ctx.clean`` (with ``grads``) for
    :func:`attribute`. ``leaf=True`` (a pass of its own) starts the graph at layer 1's input; a host that
    differentiates earlier activations itself needs ``leaf=False``. ``copies``: the batch runs as that many copies
    stacked on the batch axis (points of the inputs path), each read by the metric on its own."""

    def __init__(self, ctx: Context, m: Metric, *, leaf: bool, copies: int = 1) -> None:
        self.ctx, self.m, self.leaf, self.copies = ctx, m, leaf, copies
        self.acts: dict[tuple[str, int], Tensor] = {}
        self.clean_z: dict[int, Tensor] = {}
        self.resid: dict[int, Tensor] = {}
        self.local_scores: list[Tensor] = []
        self._reader = InductionReader(ctx.batch, torch.float32) if m.local else None
        L, gs = ctx.spec.n_layers, ctx.group_size
        self.keys = [(c, layer) for layer in range(1, L) for c in CHANNELS]
        if gs > 1:
            self.keys += [("pattern", layer) for layer in range(1, L)]
            if not m.local:
                self.keys += [("z", layer) for layer in range(1, L)]
        self.retain_graph = gs > 1  # the per-query-head split of a group's gradient differentiates again

    @property
    def reads_repeated_loss_only(self) -> bool:
        """Whether the tap's metric reads the logits at the repeated-copies loss's positions only (or none)."""
        return self.m.local or self.m.fn is repeated_loss

    def hooks(self) -> list[tuple[str, Any]]:
        L = self.ctx.spec.n_layers
        hooks = [(HOOKS.resid_pre(1), self._leaf)] if self.leaf else []
        for layer in range(L):
            hooks.append((HOOKS.z(layer), self._on_z(layer)))
            if layer == 0:
                continue
            hooks += [(getattr(HOOKS, c)(layer), self._keep((c, layer))) for c in CHANNELS]
            hooks.append((HOOKS.pattern(layer), self._on_pattern(layer)))
            hooks.append((HOOKS.resid_pre(layer), self._keep_resid(layer)))
        return hooks

    def inputs(self) -> list[Tensor]:
        """The activations to differentiate the metric against (after the pass)."""
        missing = sorted({f"{name} of layer {layer}" for name, layer in self.keys if (name, layer) not in self.acts})
        if missing:
            raise CircuitkitError(
                f"edge_attribution: the model ran without calling the hooks for {', '.join(missing[:4])}"
                f"{' ...' if len(missing) > 4 else ''}; expected every layer >= 1 to expose hook_q, hook_k, hook_v "
                "and hook_pattern (TransformerLens names) and hook_z."
            )
        return [self.acts[key] for key in self.keys]

    def finish(self, total: Tensor, found: tuple[Tensor | None, ...]) -> None:
        """Per-query-head gradients from ``found`` (one per :meth:`inputs`), kept with the clean activations in
        ``ctx.clean``."""
        self.ctx.clean = self.record(total, found)

    def record(self, total: Tensor, found: tuple[Tensor | None, ...]) -> EdgeGradients:
        """:meth:`finish`'s :class:`EdgeGradients`, without keeping it in the session (a point of the IG path)."""
        ctx, m, acts = self.ctx, self.m, self.acts
        L, gs = ctx.spec.n_layers, ctx.group_size
        grads = {key: (torch.zeros_like(acts[key]) if g is None else g.detach())
                 for key, g in zip(self.keys, found, strict=True)}
        if gs > 1:
            for layer in range(1, L):
                grads[("k", layer)] = split_by_query_head(acts[("pattern", layer)], acts[("k", layer)],
                                                          grads[("pattern", layer)], gs, head_axis=1)
                if m.local:
                    grads[("v", layer)] = torch.zeros_like(grads[("q", layer)])
                else:
                    grads[("v", layer)] = split_by_query_head(acts[("z", layer)], acts[("v", layer)],
                                                              grads[("z", layer)], gs, head_axis=2)
        patterns = {layer: acts[("pattern", layer)].detach() for layer in range(1, L)} if m.local else {}
        self.acts = {}  # the graph is no longer needed
        return EdgeGradients(m, self.clean_z, self.resid, patterns, grads, float(total.detach()))

    # ------------------------------------------------------------------ hooks
    def _leaf(self, x: Tensor, hook: Any) -> Tensor:
        # everything downstream is differentiated from here; layer 0 holds no receiver, so it builds no graph
        return x.detach().requires_grad_(True)

    def _keep(self, key: tuple[str, int]):
        # The returned copy is what the model computes on: a TransformerBridge hands hooks a reshaped view and
        # only a returned tensor is put back into its computation.
        def hook(x: Tensor, hook: Any) -> Tensor:
            self.acts[key] = x.clone()
            return self.acts[key]

        return hook

    def _on_z(self, layer: int):
        def hook(z: Tensor, hook: Any) -> Tensor:
            self.clean_z[layer] = z.detach()
            self.acts[("z", layer)] = z.clone()
            return z.detach() if self.m.local else self.acts[("z", layer)]

        return hook

    def _keep_resid(self, layer: int):
        def hook(x: Tensor, hook: Any) -> None:
            self.resid[layer] = x.detach()

        return hook

    def _on_pattern(self, layer: int):
        def hook(pattern: Tensor, hook: Any) -> Tensor:
            pattern = self.acts[("pattern", layer)] = pattern.clone()
            if self.m.local:  # [head, batch, q, k], or per copy [head, copies, batch, q, k]
                heads_first = pattern.float().transpose(0, 1)
                if self.copies > 1:
                    heads_first = heads_first.unflatten(1, (self.copies, -1))
                self.local_scores.append(self._reader(heads_first).sum())
                if layer == self.ctx.spec.n_layers - 1:
                    raise StopForward  # the "induction" metric needs no logits
            return pattern

        return hook


MAX_DELTA_BYTES = 256 * 2**20
"""The senders' output differences ``[L - 1, H, positions, d_model]`` and one block of receivers' pulled-back
gradients are held for this many bytes at a time: the attribution is a sum over (batch, position), taken in chunks
of positions."""

def _receivers(ctx: Context, layer: int, grads: dict, x: Tensor | None, form: ClosedForm | None, part: slice,
               work: torch.dtype, weights: dict[int, Tensor]) -> ReceiverGradients:
    """Layer ``layer``'s receivers on the positions ``part``, from ``grads[(c, layer)]`` ``[batch, pos, head,
    d_head]`` and its normalisation's input ``x`` ``[N, d_model]``, in dtype ``work``. ``weights``: the layers'
    stacked ``W_c^T`` already built (filled here; the same for every chunk and run)."""
    grad = torch.cat([grads[(c, layer)].detach().flatten(0, 1)[part].transpose(0, 1) for c in CHANNELS])
    W = weights.get(layer)
    if W is None:  # contiguous: the products and gamma's scaling read it many times
        W = weights[layer] = ctx.receiver_weights(layer).transpose(1, 2).to(work).contiguous()
    return ReceiverGradients.from_parts(grad.to(work), W, ctx.norms[layer], None if x is None else x[part], form)


__all__ = ["AttributedEdge", "EdgeAttribution", "GradientTap", "edge_attribution"]
