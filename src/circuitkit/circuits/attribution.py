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

One implementation with the graph engine: the estimate is the task runner's EAP-IG
(:meth:`~circuitkit.graph.runner.TaskRunner.attribute` at the points ``k = 1 .. m`` below, ``points="right"``)
read at its head-to-head entries, by a runner of the batch's heads (per-query-head key/value receivers, no MLP
nodes) whose clean and corrupted runs are this context's (:func:`edge_runner`): what the runner contracts, pulls
back and splits by query head is what is measured here.

Cost and memory: the clean point is a pass of its own with a :class:`GradientTap` (whose graph starts at layer 1:
layer 0 holds no receiver of another head), or the scan's head attribution carrying the tap, so no pass of its own;
the corrupted pass stops at the last layer's ``z`` and keeps the corrupted embeddings (both kept in the session for
path patching); the further points run as the runner's stacked pass(es). LayerNorm / RMSNorm pullbacks are taken in
closed form with their per-position terms found in ``d_head`` space
(:class:`~circuitkit.graph.pullback.ReceiverGradients`), so the rest is one ``[senders, n * d_model] @ [n *
d_model, receivers]`` product per group of receivers, with the senders' deltas held a block of sequences at a time
within half the runner's budget and the group's gradients within the other half (:data:`CONTRACTION_BUDGET`).

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

The point ``k = m`` is the clean run, so ``m = 1`` is the first-order estimate above; the sender differences
``delta_s`` stay those of the clean and corrupted runs. The further points run as copies of the batch stacked in
one forward and one backward pass on the clean labels (each copy's metric read on its own), as many a pass as the
runner's budget holds, as a task's EAP-IG runs its points.

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
    INPUT,
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
from circuitkit.detect.attribution import check_steps, frozen_parameters
from circuitkit.detect.loss import loss_positions
from circuitkit.detect.tokens import RepeatedTokens, TokenBatch
from circuitkit.errors import CircuitkitError
from circuitkit.graph.pullback import split_by_query_head
from circuitkit.graph.runner import Graph, TaskRunner
from circuitkit.graph.task import TaskBatch, UserMetric
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
    :func:`~circuitkit.circuits.patching.patch` on the batch.

    The estimate is the graph engine's EAP-IG (:meth:`~circuitkit.graph.runner.TaskRunner.attribute` at the right
    points) read at its head-to-head entries: a runner of the batch's heads, its clean and corrupted runs the
    context's (:func:`edge_runner`), its clean point the gradients of the tap's pass (a pass of its own, or the
    scan's head attribution that carried the tap), its further points stacked in passes of its own."""
    spec = ctx.spec
    L, H = spec.n_layers, spec.n_heads
    if L < 2:
        return EdgeAttribution(torch.full((L, H, L, H, len(CHANNELS)), math.nan, device="cpu"), m.name, ctx.corrupt,
                               math.nan)
    if ctx.clean is None or ctx.clean.metric != m:  # else a host pass (or an earlier call) left them in the session
        with frozen_parameters(ctx.adapter.model):
            _clean_gradients(ctx, m)
    clean = ctx.clean
    runner = edge_runner(ctx, m)
    local = InductionReader(ctx.batch, torch.float32) if m.local else None
    graph_scores, _, _ = runner.attribute(steps, "right", local=local, clean_point=clean)
    scores = head_edge_grid(runner.graph, graph_scores)
    validate.finite_result("edge_attribution", scores[~scores.isnan()], why="the gradients overflowed")
    return EdgeAttribution(scores, m.name, ctx.corrupt, clean.total)


CONTRACTION_BUDGET = 2**29
"""The runner's budget for edge attribution (:attr:`~circuitkit.graph.runner.TaskRunner.budget`): half of it holds
the senders' deltas of a block of sequences, half a group of receivers' gradients (256 MiB each), as many points a
pass as it holds."""


def edge_runner(ctx: Context, m: Metric) -> TaskRunner:
    """The graph engine's runner of the context's batch, measuring ``m`` as the task engine measures its metrics
    (more behaviour scoring higher: the loss on the copies is ``next_token_logprob`` on them, a callable read as a
    loss its negative, the same value for every sequence), with per-query-head key/value receivers and no MLP
    nodes. Its clean and corrupted runs are the context's, run once for every measurement on the batch: the clean
    ``z`` the tap kept (``ctx.clean``), the corrupted ``z`` the session keeps for path patching
    (:func:`~circuitkit.circuits._engine.corrupt_z`), and the input embeddings of both (for ``corrupt="mean"``,
    the clean ones' batch mean at each position)."""
    batch, adapter, L = ctx.batch, ctx.adapter, ctx.spec.n_layers
    tokens = batch.tokens
    B, P = tokens.shape
    device = tokens.device
    if ctx.corrupt == "given":
        corrupted = ctx.corrupt_batch.tokens
    elif ctx.corrupt == "resample":
        corrupted = resampled_batch(batch, ctx.corrupt_seed).tokens
    else:  # "mean": no corrupted prompt; the corrupted run is the clean run's means
        corrupted = tokens
    scored = torch.zeros(B, P, dtype=torch.bool, device="cpu")
    scored[:, : P - 1] = batch.repeated_copies  # position t predicts token t + 1
    one = torch.ones(B, 1, dtype=torch.bool, device=device)
    pairs = TaskBatch(tokens, corrupted.to(device), torch.full((B,), P - 1, device=device), tokens[:, :1],
                      tokens[:, 1:2], one, one, scored=scored.to(device))
    metric: Any = "next_token_logprob"
    if not m.local and m.fn is not repeated_loss:
        metric = UserMetric(_per_sequence(m, batch), reads="all")
    runner = TaskRunner(ctx.session, pairs, metric, mlps=False, ablation="corrupted", kv_edges="per-query-head",
                        budget=CONTRACTION_BUDGET)
    z = dict(ctx.clean.z)
    # A local metric's pass stops at the last layer's pattern: that layer's heads send into the logits alone, which
    # no receiver's own score reads, so their output is taken as unchanged (a zero delta, an exact zero score).
    for layer in range(L):
        if layer not in z:
            z[layer] = torch.zeros_like(z[0])
    z_corrupt = corrupt_z(ctx, ctx.clean.z, sorted(ctx.clean.z), with_input=ctx.corrupt != "mean")
    z_corrupt = {layer: z_corrupt.get(layer, z[layer]) for layer in range(L)}
    embedded = ctx.clean.input
    if embedded is None:  # a tap's record from a pass that did not keep them
        embedded = adapter.embedded(tokens)
    start = position_mean(embedded).expand_as(embedded) if ctx.corrupt == "mean" else ctx.z_corrupt[INPUT]
    runner.adopt_runs((embedded, z), (start, z_corrupt))
    return runner


def _per_sequence(m: Metric, batch: TokenBatch):
    """A callable read as a loss (``m.fn(logits [batch, pos, vocab], batch) -> scalar``) as a task metric of every
    position: its negative, the same value for every sequence (the runner means them back to it)."""

    def metric(logits: Tensor, _pairs: Any) -> Tensor:
        value = check_value(m.fn(logits, batch), "edge_attribution: metric(logits)")
        return (-value.float()).expand(logits.shape[0])

    metric.__name__ = m.name
    return metric


def head_edge_grid(graph: Graph, scores: Tensor) -> Tensor:
    """The runner's ``[sender, receiver]`` scores (per-query-head key/value receivers) at every head-to-head entry,
    ``[src_layer, src_head, dst_layer, dst_head, channel]`` (channels :data:`CHANNELS`), NaN where the source layer
    is not before the destination's (no edge)."""
    L, H = graph.n_layers, graph.n_heads
    receivers = torch.tensor([[[graph.receiver_slices[(c, layer)].start + h for c in CHANNELS] for h in range(H)]
                              for layer in range(L)], dtype=torch.long, device="cpu")
    grid = scores.float().cpu()[graph.head_senders.flatten()][:, receivers.flatten()]
    layers = torch.arange(L, device="cpu")
    edge = (layers[:, None] < layers[None, :])[:, None, :, None, None]
    return torch.where(edge, grid.reshape(L, H, L, H, len(CHANNELS)), math.nan)


def _clean_gradients(ctx: Context, m: Metric) -> None:
    """One clean forward pass with gradients and one backward pass (:class:`GradientTap` on a pass of its own,
    parameters frozen: only the receivers' gradients are wanted), leaving ``ctx.clean``: ``dM/d(q, k, v)`` per query
    head for every layer >= 1 (``grads[(c, l)]`` ``[batch, pos, head, d_head]``), the clean ``z`` and ``resid_pre``
    of layers >= 1 and the metric's value; with the loss, each sequence's (``each``), which path patching's intervals
    resample where the session holds no clean run to read them from."""
    tap = GradientTap(ctx, m, leaf=True)
    with frozen_parameters(ctx.adapter.model), torch.enable_grad():
        try:
            at = loss_positions(ctx.batch) if m.fn is repeated_loss else None  # a user metric reads every position
            logits = ctx.adapter.run(ctx.batch.tokens, tap.hooks(), positions=at)
        except StopForward:
            logits = None
        if m.local:
            total = torch.stack(tap.local_scores).sum()
        else:
            total = check_value(m.fn(logits, ctx.batch), "edge_attribution: metric(clean logits)")
        found = torch.autograd.grad(total, tap.inputs(), allow_unused=True, retain_graph=tap.retain_graph)
        gradients = tap.record(total, found)
    if m.fn is repeated_loss and ctx.session.clean is None:
        gradients.each = repeated_loss_each(logits, ctx.batch)
    ctx.clean = gradients


class GradientTap:
    """The hooks and gradient requests of edge attribution's clean pass, so that it can ride on another pass that
    differentiates the same metric (the scan's head attribution, :func:`circuitkit.detect.attribution.attribute`,
    with the repeated-copies loss), saving a forward and a backward pass.

    Protocol: register :meth:`hooks` on the pass (after the host's own hooks), differentiate the metric with
    respect to :meth:`inputs` (``torch.autograd.grad(..., allow_unused=True, retain_graph=retain_graph)``, still
    under ``enable_grad``) and hand the result to :meth:`finish`, which leaves ``ctx.clean`` (with ``grads``) for
    :func:`attribute`. ``leaf=True`` (a pass of its own) starts the graph at layer 1's input; a host that
    differentiates earlier activations itself needs ``leaf=False``."""

    def __init__(self, ctx: Context, m: Metric, *, leaf: bool) -> None:
        self.ctx, self.m, self.leaf = ctx, m, leaf
        self.acts: dict[tuple[str, int], Tensor] = {}
        self.clean_z: dict[int, Tensor] = {}
        self.resid: dict[int, Tensor] = {}
        self.input: Tensor | None = None
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
        hooks = [(HOOKS.resid_pre(0), self._keep_input)]
        hooks += [(HOOKS.resid_pre(1), self._leaf)] if self.leaf else []
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
        return EdgeGradients(m, self.clean_z, self.resid, patterns, grads, float(total.detach()), input=self.input)

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

    def _keep_input(self, x: Tensor, hook: Any) -> None:
        self.input = x.detach()

    def _keep_resid(self, layer: int):
        def hook(x: Tensor, hook: Any) -> None:
            self.resid[layer] = x.detach()

        return hook

    def _on_pattern(self, layer: int):
        def hook(pattern: Tensor, hook: Any) -> Tensor:
            pattern = self.acts[("pattern", layer)] = pattern.clone()
            if self.m.local:  # [head, batch, q, k]
                self.local_scores.append(self._reader(pattern.float().transpose(0, 1)).sum())
                if layer == self.ctx.spec.n_layers - 1:
                    raise StopForward  # the "induction" metric needs no logits
            return pattern

        return hook


__all__ = ["AttributedEdge", "EdgeAttribution", "GradientTap", "edge_attribution"]
