"""The computational graph of a task circuit (EAP-IG / MIB): nodes, edges, and the passes that measure them.

Nodes. **Senders** write into the residual stream: the input embeddings (``input``: the residual stream entering
layer 0), every attention head ``(l, h)`` (``z[:, :, h] @ W_O[l, h]``), every MLP ``l`` (``hook_mlp_out``).
**Receivers** read from it: each query head's query input ``l.h:q``, each key/value group's key and value inputs
``l.g:k`` / ``l.g:v`` (with grouped-query attention a group's key is one input, read by all its query heads; with
multi-head attention the group is the head), each MLP's input ``m{l}``, and the ``logits``. An **edge** joins every
sender to every receiver downstream of it: a head of layer ``l`` feeds receivers of layers ``> l``, the MLP of its
own layer (not where attention and MLP run in parallel) and the logits; an MLP of layer ``l`` feeds layers ``> l``
and the logits; the input feeds everything.

Per-query-head key/value edges (``kv_edges="per-query-head"``, EAP-IG's graph): every query head has its own key and
value inputs ``l.h:k`` / ``l.h:v``, its keys and values computed from its own input while the other heads of its
group keep theirs, so a grouped edge ``u -> l.g:k`` is the ``Q`` edges ``u -> l.h:k`` of its group's query heads
(``Q = n_heads / n_kv``). The model's attention computes a key/value head once for its group, so each edge-patching
pass runs ``Q`` copies of its pairs side by side, copy ``j`` computing every group's keys and values from its
``j``-th query head's input, and each query head's ``z`` is taken from its own copy (:meth:`TaskRunner._edge_pass`).
EAP-IG needs no copies: every query head sees the same values along its path, so its pass is the grouped graph's
and the gradient at a group's keys (values) is split into the part through each query head's pattern (``z``), a
vector-Jacobian product through that layer's attention alone (:func:`~circuitkit.graph.pullback.
split_by_query_head`, as the induction engine's edge attribution splits it). The gradient at a grouped input is the
sum of its query heads' (each reads it), so a grouped edge's EAP-IG score is the sum of its per-query-head edges'
scores.

Edge patching (a circuit of edges ``E``). With ``out_u`` a sender's output in the current (patched) run and
``out'_u`` its output on the corrupted prompt of the same pair, receiver ``v`` reads::

    x_v = resid_v + sum_{u -> v not in E} (out'_u - out_u)          [pair, pos, d_model]

where ``resid_v`` is the residual stream at ``v`` in the current run (``resid_pre`` for attention inputs, the
MLP's ``ln2`` input, the final residual stream for the logits). A query/key/value input goes through the block's
attention norm and the head's weight: ``c += (norm(x_v) - norm(resid_v)) @ W_c`` at ``hook_q/k/v`` (biases cancel);
an MLP input replaces the input of its norm (``HOOKS.mlp_in``); the logits' replaces the last block's
output. Every edge kept: the clean run; none: the corrupted run (both exact, tested). One edge alone patched (its
exact effect) runs the one edge pass of both engines instead, :mod:`circuitkit.graph.edge_patch`: only that
sender's delta, from the receiver's layer on (:meth:`TaskRunner.single_edge_metric`).

Node patching (a circuit of nodes): a head outside it has ``z`` replaced by its corrupted (or mean, zero) value, an
MLP outside it (when MLPs are nodes) its output, a node of a further type (:mod:`circuitkit.graph.nodes`, e.g. a
group of an MLP's neurons) its units of its hook's activation; everything else is recomputed. The graph's nodes are
built from node types (:data:`~circuitkit.graph.nodes.EDGE_TYPES`), every hook name from
:class:`~circuitkit.models.adapters.HOOKS`.

Edge attribution (EAP-IG, Hanna et al. 2024): with ``g_v = dM/dx_v`` averaged over the ``steps`` points
``alpha = k / steps`` on the straight line from the corrupted (``alpha = 0``) to the clean input embeddings, with
``k = 0 .. steps - 1`` (``points="left"``, default: EAP-IG's own points, hence MIB's) or ``k = 1 .. steps``
(``"right"``: ``steps = 1`` is plain attribution patching, the gradient at the clean run) (:func:`ig_alphas`),
``score(u -> v) = sum_{pair, pos} (out_u - out'_u) . g_v / n_pairs``: the first-order estimate of how much the
mean metric falls when the edge is corrupted (positive: the edge carries the clean behaviour). A node's score is
the sum over its outgoing edges (the estimate of patching the node itself).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from circuitkit import validate
from circuitkit.detect.reference import Keep, Kept, reference_pass
from circuitkit.detect.reference import reads as reference_reads
from circuitkit.detect.session import EdgeGradients, Session
from circuitkit.errors import CircuitkitError
from circuitkit.graph.metrics import METRICS, last_logits
from circuitkit.graph.nodes import (
    DEFAULT_KV_EDGES,
    HEAD,
    MLP,
    NodeType,
    check_node_sets,
    edge_types,
    groups_of,
    node_gates,
    node_patches,
)
from circuitkit.graph.pullback import ReceiverGradients, closed_form, session_norms, split_by_query_head
from circuitkit.graph.task import TaskBatch
from circuitkit.ig_path import DEFAULT_IG_POINTS, IG_POINTS, along, ig_alphas
from circuitkit.models.adapters import HOOKS, ModelAdapter
from circuitkit.pass_budget import copies_per_pass

EDGES_UNDEFINED = ("in this family a norm or a scale follows the attention, so a head's z @ W_O is not its "
                   "contribution to the residual stream and an edge from it is not defined here")
"""Why a family without additive heads has node circuits only. EAP-IG's own evaluation (Hanna et al.) defines a
Gemma-2 edge through the sender layer's post-attention norm, recomputed per receiver with the missing edges' heads
corrupted; circuitkit does not (yet) build that graph, so it measures no edge there rather than a different one."""
SENDER_BUDGET = 2**30
"""Bytes of sender outputs one edge pass may hold (every sender's delta, for each stacked copy): the floor, and the
budget on the CPU (:func:`sender_budget`)."""
GPU_SENDER_SHARE = 16
MAX_SENDER_BUDGET = 16 * 2**30
"""On a GPU the budget is the larger of :data:`SENDER_BUDGET` and ``1 / GPU_SENDER_SHARE`` of the memory free
when the scan starts, at most this: a pass there costs its launches more than its arithmetic at these batch sizes
(8 pairs of a 1B-shaped model on an H200: 15 copies a pass rather than 1), so fewer, wider passes finish sooner
(``benchmarks/README.md``, "On one GPU")."""
MAX_COPIES = 32
"""Most stacked copies of the pairs in one patching pass."""
LocalMetric = Callable[[Tensor], Tensor]
"""A score each receiver head reads from its own attention pattern: ``pattern [head, copies, pair, q, k]`` ->
``[head, copies]`` (:meth:`TaskRunner.attribute`'s ``local``)."""


def mlp_width(adapter: ModelAdapter) -> int:
    """The model's MLP hidden width ``d_mlp`` (0 without MLPs; ``4 d_model`` where the config does not say)."""
    if adapter.attn_only:
        return 0
    value = getattr(adapter.model.cfg, "d_mlp", None)
    return int(value) if isinstance(value, int) and value > 0 else 4 * adapter.spec.d_model


def element_bytes(model: Any) -> int:
    """Bytes per element of the model's floating parameters (float32 where it has none)."""
    parameters = getattr(model, "parameters", None)
    if callable(parameters):
        for p in parameters():
            if p.is_floating_point():
                return p.element_size()
    return 4


def node_copy_bytes(adapter: ModelAdapter, pairs: int, pos: int, logit_positions: int, metric_positions: int) -> int:
    """Bytes one stacked copy of the pairs holds in a node-patching pass (and in the one exact edge pass, beside its
    edge's delta): per pair and token the MLP's and the residual stream's transients and the attention scores,
    ``P (3 m + 4 d + 3 H P) e``, and per pair its logits at the ``K`` positions a pass reads, with the metric's
    float32 reads at ``R`` of them, ``V (K e + 8 R)`` (``e`` the model's bytes per element; the task memory plan's
    node-patching term, :mod:`circuitkit.tasks.memory`). What sizes the stacked copies of those passes: with a large
    vocabulary and a metric of every scored position, the logits are most of a copy."""
    spec = adapter.spec
    e, m = element_bytes(adapter.model), mlp_width(adapter)
    return (pairs * pos * (3 * m + 4 * spec.d_model + 3 * spec.n_heads * pos) * e
            + pairs * spec.d_vocab * (logit_positions * e + 8 * metric_positions))


def sender_budget(device: torch.device | str, available: int | None) -> int:
    """The bytes of stacked sender deltas one edge pass may hold on ``device`` with ``available`` bytes free (None:
    unknown): :data:`SENDER_BUDGET` on the CPU and where the free memory is unknown; on a CUDA device up to
    ``available / GPU_SENDER_SHARE``, at most :data:`MAX_SENDER_BUDGET`. More copies a pass never change a result,
    only how many passes run (:mod:`circuitkit.pass_budget`); the memory plan counts the copies this allows and
    falls back to the floor where they would not fit (:func:`~circuitkit.tasks.memory.check_task_memory`)."""
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError, ValueError):
        raise validate.fail("sender_budget: device", device, "a device such as 'cpu' or 'cuda:0'") from None
    if available is not None:
        available = validate.integer("sender_budget: available", available, minimum=0)
    if kind != "cuda" or available is None:
        return SENDER_BUDGET
    return max(SENDER_BUDGET, min(MAX_SENDER_BUDGET, available // GPU_SENDER_SHARE))


@dataclass(frozen=True)
class Graph:
    """The nodes and edges of one model (module docstring), built from node types
    (:data:`~circuitkit.graph.nodes.EDGE_TYPES`). ``senders`` / ``receivers``: names in order (senders: ``input``,
    then per layer its heads ``l.h`` and MLP ``m{l}``; receivers: per layer ``l.h:q``, the key/value groups'
    ``l.g:k`` / ``l.g:v`` (``l.h`` where every head has its own), ``m{l}``; then ``logits``); ``allowed``:
    ``[sender, receiver]`` bool, True where an edge exists; ``parallel``: attention and MLP read the same stream;
    ``sender_slices`` / ``receiver_slices``: where each ``(node type, layer)``'s senders and each ``(channel,
    layer)``'s receivers lie (the input at layer -1, the logits at ``n_layers``)."""

    n_layers: int
    n_heads: int
    n_kv: int
    mlps: bool
    parallel: bool
    senders: tuple[str, ...]
    receivers: tuple[str, ...]
    allowed: Tensor
    sender_slices: dict[tuple[str, int], slice] = field(default_factory=dict)
    receiver_slices: dict[tuple[str, int], slice] = field(default_factory=dict)
    kv_edges: str = DEFAULT_KV_EDGES

    @property
    def n_edges(self) -> int:
        return int(self.allowed.sum())

    @property
    def kv_copies(self) -> int:
        """Query heads per key/value head where each has its own key and value receivers (``"per-query-head"`` on
        a grouped-query model), else 1: the copies of the pairs each edge pass runs side by side
        (:meth:`TaskRunner._edge_pass`)."""
        return self.n_heads // self.n_kv if self.kv_edges == "per-query-head" else 1

    def sender_index(self, layer: int, head: int | None) -> int:
        """Index of head ``(layer, head)`` (or the MLP of ``layer`` with ``head=None``) among the senders."""
        if head is None:
            return self.sender_slices[("mlp", layer)].start
        return self.sender_slices[("head", layer)].start + head

    @property
    def head_senders(self) -> Tensor:
        """``[layer, head]`` long (CPU): each head's index among the senders (:meth:`sender_index`), to read a
        ``[sender]`` vector as a ``[layer, head]`` grid."""
        return torch.tensor([[self.sender_index(layer, h) for h in range(self.n_heads)]
                             for layer in range(self.n_layers)], dtype=torch.long, device="cpu")

    def receivers_of(self, layer: int) -> dict[str, slice]:
        """Receiver index ranges of ``layer``: ``q`` (query heads), ``k``, ``v`` (kv groups), ``mlp``."""
        return {channel: cols for (channel, at), cols in self.receiver_slices.items() if at == layer}

    @property
    def receiver_layers(self) -> Tensor:
        """``[receiver]`` long (CPU): each receiver's layer (the logits: ``n_layers``)."""
        out = torch.empty(len(self.receivers), dtype=torch.long, device="cpu")
        for (_, layer), cols in self.receiver_slices.items():
            out[cols] = layer
        return out

    @property
    def logits_index(self) -> int:
        return self.receiver_slices[("logits", self.n_layers)].start

    def edge_names(self, index: Tensor) -> list[str]:
        """``index`` ``[n, 2]`` (sender, receiver) as ``"sender->receiver"`` names."""
        return [f"{self.senders[int(s)]}->{self.receivers[int(r)]}" for s, r in index.tolist()]


def build_graph(adapter: ModelAdapter, mlps: bool, kv_edges: str = DEFAULT_KV_EDGES) -> Graph:
    """The graph of ``adapter``'s model (``mlps``: MLPs are nodes; refused where the model has none): the senders
    and receivers of every node type of :func:`~circuitkit.graph.nodes.edge_types` in order (``kv_edges``: key and
    value receivers per key/value head or per query head, :data:`~circuitkit.graph.nodes.KV_EDGES`), an edge
    wherever a receiver reads after its sender writes (:mod:`~circuitkit.graph.nodes`)."""
    spec = adapter.spec
    L = spec.n_layers
    facts = getattr(adapter, "facts", None)
    parallel = bool(facts is not None and facts.parallel_attention)
    types = [t for t in edge_types(kv_edges) if mlps or t is not MLP]
    plan = ([(t, -1) for t in types if t.where == "before"] + [(t, layer) for layer in range(L) for t in types
                                                                if t.where == "layer"]
            + [(t, L) for t in types if t.where == "after"])
    senders: list[str] = []
    receivers: list[str] = []
    writes: list[int] = []  # where each sender writes, 2 * layer + writes_at
    reads: list[int] = []
    sender_slices: dict[tuple[str, int], slice] = {}
    receiver_slices: dict[tuple[str, int], slice] = {}
    for kind, layer in plan:
        if kind.sends:
            n = kind.count(spec)
            sender_slices[(kind.name, layer)] = slice(len(senders), len(senders) + n)
            senders += [kind.label(layer, i) for i in range(n)]
            writes += [2 * layer + kind.writes_at] * n
        for port in kind.ports:
            n = port.count(spec)
            receiver_slices[(port.channel, layer)] = slice(len(receivers), len(receivers) + n)
            receivers += [port.label(layer, i, spec) for i in range(n)]
            reads += [2 * layer + (0 if parallel else port.reads_at)] * n
    allowed = torch.tensor(writes, device="cpu")[:, None] < torch.tensor(reads, device="cpu")[None, :]
    return Graph(L, spec.n_heads, spec.n_kv_heads, mlps, parallel, tuple(senders), tuple(receivers), allowed,
                 sender_slices, receiver_slices, kv_edges)


class TaskRunner:
    """A model ready to measure one :class:`TaskBatch`: weights, norms, the clean and corrupted runs (computed once,
    on demand: what each sender writes, from which :meth:`outputs` forms the senders' outputs), the metric.

    ``metric``: a name in :data:`~circuitkit.graph.metrics.METRICS` or a
    :class:`~circuitkit.graph.metrics.UserMetric`; ``mlps``: MLPs are graph nodes; ``node_types``: further kinds of
    node a node circuit may keep or patch beside the heads and MLPs (:mod:`circuitkit.graph.nodes`, e.g.
    :func:`~circuitkit.graph.nodes.neuron_groups`); each is captured in both reference runs and scored by
    :meth:`attribute`; ``kv_edges``: key/value receivers per key/value head (``"grouped"``) or per query head
    (``"per-query-head"``; module docstring); ``budget``: the bytes of stacked sender deltas one patching pass
    may hold (:func:`sender_budget`; the task scan's memory plan chooses it).

    ``model``: the :class:`~circuitkit.detect.session.Session` the runner measures through (:attr:`session`), or an
    adapter (then a session of its own, without a token batch). What the runner reads of the model is the session's,
    read once for every runner and edge measurement on it: the head weights (:meth:`Session.device_weights`: a
    float32 copy of every head's ``W_Q, W_K, W_V, W_O``, 5 GiB at the Llama-3.1-8B shape) and the receivers'
    attention norms (:func:`~circuitkit.graph.pullback.session_norms`); a scan's runners (its discovery and
    evaluation pairs, the resamples of its stability) share one session. What it runs on its own pairs (their clean
    and corrupted runs, the node values) it holds itself."""

    def __init__(self, model: ModelAdapter | Session, batch: TaskBatch, metric: str, *, mlps: bool, ablation: str,
                 node_types: tuple[NodeType, ...] = (), kv_edges: str = DEFAULT_KV_EDGES,
                 budget: int = SENDER_BUDGET) -> None:
        session = model if isinstance(model, Session) else Session(model, None)
        adapter = session.adapter
        if adapter.spec.bidirectional:
            raise validate.fail("task circuit: model", validate.given(f"a bidirectional {adapter.spec.family} model"),
                                "a causal language model (a task's metric is read at each prompt's last token, "
                                "which sees only the tokens before it)")
        if mlps and adapter.attn_only:
            raise validate.fail("task circuit: mlps", mlps, "False for an attention-only model (it has no MLPs)")
        self.session = session
        self.adapter = adapter
        self.spec = adapter.spec
        self.batch = batch
        from circuitkit.graph.metrics import UserMetric, metric_label, reads_every_position, reads_scored

        self.metric_name = metric_label(metric)
        self.metric_fn = metric if isinstance(metric, UserMetric) else METRICS[metric]
        self.ablation = ablation
        self.budget = validate.integer("task circuit: budget", budget, minimum=1)
        self.graph = build_graph(adapter, mlps, kv_edges)
        # edges need each head's z @ W_O to be its contribution to the residual stream (EDGES_UNDEFINED)
        self.edges_defined = bool(adapter.additive_heads)
        self.mlp_in = mlp_input_hook(adapter) if mlps and self.edges_defined else HOOKS.mlp_in
        self.mlp_normed = self.mlp_in is HOOKS.mlp_normed_in  # the MLP reads through the shared norm ln1
        self.node_types = _node_types(adapter, node_types)
        self.extra_types = tuple(t for t in self.node_types.values() if t is not HEAD and t is not MLP)
        self.weights = weights = session.device_weights()
        self.W_Q, self.W_K, self.W_V = weights.W_Q, weights.W_K, weights.W_V  # k, v: [layer, kv, d_model, d_head]
        self.W_O = weights.W_O
        self.norms = session_norms(session)  # callable outside the forward pass, offloaded weights brought in
        self.scored_metric = reads_scored(metric)
        self.every_position_metric = reads_every_position(metric)  # a researcher's function of every position
        self._read_at(batch)
        self.pattern_masks: dict[str, tuple[Tensor, float]] = {}  # score -> ([pair, q, k] targets, target rows)
        self.pattern_scores: dict[str, Tensor] = {}  # filled by the clean pass: score -> [layer, head]
        self.passes = 0.0
        self.direct = True  # the clean run also measures direct logit attribution and the patterns (a backward)
        self.keep_node_pairs = False  # attribute() also keeps each pair's term of every node score (node_pairs)
        self.node_pairs: Tensor | None = None  # [sender, pair]: filled by attribute() where keep_node_pairs
        self._clean: dict[str, Any] | None = None
        self._corrupt: dict[str, Any] | None = None
        self._values: dict[str, dict[int, Tensor]] = {}  # node type -> its patched values by layer, made once
        self._all_patched: dict[tuple, dict[int, Tensor]] = {}  # node types -> that run's resid_pre by layer
        self._norm_forms: dict[int, Any] = {}  # layer -> its attention norm's closed form (None: autograd)

    def _read_at(self, batch: TaskBatch) -> None:
        """Where the passes read the logits: only at the positions where some pair's prompt ends, and with a
        ``"scored"`` metric at every scored position too (the vocabulary matrix is most of a small model's forward
        pass); a metric of every position reads them all. ``positions`` ``[n]`` (CPU, sorted); ``last_index``
        ``[pair]``: each pair's last token among them; with a scored metric ``targets`` / ``scored`` ``[pair, n]``:
        the clean token after each position and whether the metric reads it there."""
        last = batch.last.cpu()
        if self.scored_metric:
            if batch.scored is None:
                raise validate.fail(f"task metric {self.metric_name!r}", validate.given("a batch without scored "
                                    "positions"), "a task whose pairs name their scored positions (Task.scored)")
            read = torch.cat([last, batch.scored.cpu().any(0).nonzero().flatten()])
        elif self.every_position_metric:
            read = torch.arange(batch.pos, device="cpu")
        else:
            read = last
        self.positions = torch.unique(read)
        self.last_index = torch.searchsorted(self.positions, last)
        if self.scored_metric:
            at = self.positions.to(batch.clean.device)
            nxt = (at + 1).clamp(max=batch.pos - 1)
            self.targets = batch.clean[:, nxt]
            self.scored = batch.scored[:, at]

    def _metric_of(self, logits: Tensor, clean_logprobs: Tensor | None) -> Tensor:
        """Per-pair metric ``[copies, pair]`` (float32) of stacked logits ``[copies * pair, n, vocab]`` at
        :attr:`positions`, read from the one metric registry's function (module docstring)."""
        if self.scored_metric:
            view = logits.view(-1, self.batch.n_pairs, *logits.shape[1:])
            return self.metric_fn(view, self.targets, self.scored).float()
        if self.every_position_metric:  # the logits at every position, [copies, pair, pos, vocab]
            return self.metric_fn(logits.view(-1, self.batch.n_pairs, *logits.shape[1:]), self.batch).float()
        return self.metric_fn(last_logits(logits, self.last_index), self.batch, clean_logprobs).float()

    # ------------------------------------------------------------------ the two reference runs
    @property
    def clean(self) -> dict[str, Any]:
        """The clean run: ``input`` (the input embeddings, ``[pair, pos, d_model]``), ``z`` and ``mlp`` by layer
        (every sender's output from them: :meth:`outputs`),
        ``nodes`` (each further node type's activation by layer: ``{type: {layer: [pair, pos, unit, ...]}}``),
        ``metric`` ``[pair]``, ``logprobs`` ``[pair, vocab]`` at the last token, ``dla`` ``[sender]``,
        ``last_attention`` (each head's attention from each prompt's last token, ``[layer, pair, head, pos]``) and
        ``first_patterns`` (the first prompt's patterns, ``[layer, head, q, k]``)."""
        if self._clean is None:
            self._clean = self._reference(self.batch.clean, dla=self.direct, keep_resid=self.adapter.can_resume)
        return self._clean

    @property
    def corrupted(self) -> dict[str, Any]:
        """The corrupted run (as :attr:`clean`, without ``dla``)."""
        if self._corrupt is None:
            _ = self.clean  # the KL metric of the corrupted run reads the clean run's distribution
            self._corrupt = self._reference(self.batch.corrupted, dla=False)
        return self._corrupt

    def corrupt_by_mean(self) -> None:
        """Make the corrupted run each sender's clean mean over the pairs at each position (the batch-mean corruption
        of path patching and edge attribution, ``corrupt="mean"``; the mean over the pairs real at that position):
        the input embeddings, every head's ``z``, every MLP's output and every further node type's activation. No
        forward pass makes such a run, so it has no metric or logits: the single-edge effects read it
        (:meth:`single_edge_metric`, through each sender's delta), a task scan's faithfulness does not."""
        from circuitkit.detect.corrupt import position_mean

        clean = self.clean
        real = self.batch.real

        def mean(x: Tensor) -> Tensor:  # [pair, pos, ...]: each position's mean over the pairs real there
            return position_mean(x, real).expand_as(x)

        self._corrupt = _given_run(mean(clean["input"]), {k: mean(v) for k, v in clean["z"].items()},
                                   {k: mean(v) for k, v in clean["mlp"].items()},
                                   {name: {k: mean(v) for k, v in by_layer.items()}
                                    for name, by_layer in clean["nodes"].items()})
        self._values = {}  # what a node is ablated to may come from the corrupted run

    def adopt_runs(self, clean: tuple[Tensor, dict[int, Tensor]], corrupted: tuple[Tensor, dict[int, Tensor]]
                   ) -> None:
        """Make the clean and corrupted runs ones another measurement on these pairs made, so that they run once:
        each ``(input embeddings [pair, pos, d_model], z by layer [pair, pos, head, d_head])``, every layer's
        (the induction engine's edge attribution hands in the clean ``z`` its gradient tap kept and the corrupted
        ``z`` its session keeps for path patching). Such a run has no logits, metric or MLP outputs: what reads
        the senders' outputs (EAP-IG's deltas, the single edges' deltas) may use it, so the runner may have no MLP
        or further node type."""
        if self.graph.mlps or self.extra_types:
            raise validate.fail("TaskRunner.adopt_runs", validate.given("a runner with MLP or further node types"),
                                "a runner of heads alone (a run handed in holds every layer's z only)")
        L = self.spec.n_layers
        for name, (embedded, z) in (("clean", clean), ("corrupted", corrupted)):
            if not isinstance(embedded, Tensor) or not isinstance(z, dict) or sorted(z) != list(range(L)):
                raise validate.fail(f"TaskRunner.adopt_runs: {name}", validate.given(
                    f"layers {sorted(z) if isinstance(z, dict) else type(z).__name__}"),
                    f"(input embeddings, z of every layer 0..{L - 1})")
        self._clean, self._corrupt = _given_run(*clean, {}, {}), _given_run(*corrupted, {}, {})
        self._values = {}

    def _reference(self, tokens: Tensor, dla: bool, keep_resid: bool = False) -> dict[str, Any]:
        """One pass capturing every sender's output (with ``keep_resid``: and the residual stream entering every
        layer and, at ``n_layers``, the final one, ``resid`` ``{layer: [pair, pos, d_model]}``, from which a patched
        pass that changes nothing below a layer resumes; with ``dla``: and a backward of the logit difference
        through the final norm with its scale frozen, for direct logit attribution).

        Counted as one pass, with or without ``dla``: the backward starts at a detached leaf at the last block's
        output (parameters frozen, so nothing before it is on the autograd graph), so it runs only through the
        final norm and the unembedding at :attr:`positions`, the tail of this same forward pass, not through the
        model (tests/test_task_passes.py counts its autograd nodes; benchmarks/README.md, "The task search's
        passes", times it on a real model)."""
        spec = self.spec
        final: list[Tensor] = []

        # direct logit attribution exists where a head's output adds into the residual stream
        direct = dla and self.edges_defined

        def final_hook(x: Tensor, hook: Any) -> Tensor:
            if not direct:
                return x
            x = x.detach().requires_grad_(True)
            final.append(x)
            return x

        norm_seen: dict[str, Tensor] = {}

        def keep_scale(scale: Tensor, hook: Any) -> None:  # read only: an edited norm hook changes some families
            norm_seen["scale"] = scale.detach()

        def keep_normalized_grad(normalized: Tensor, hook: Any) -> None:
            if normalized.requires_grad:
                normalized.register_hook(lambda g: norm_seen.__setitem__("grad", g.detach()))

        rows = torch.arange(self.batch.n_pairs, device=spec.device)
        last_rows: dict[int, Tensor] = {}
        first: dict[int, Tensor] = {}

        def pattern_hook(pattern: Tensor, hook: Any) -> None:
            layer = HOOKS.layer_of(hook.name)
            p = pattern.detach()
            last_rows[layer] = p[rows.to(p.device), :, self.batch.last.to(p.device)].float().cpu()  # [pair, head, k]
            n = int(self.batch.last[0]) + 1
            first[layer] = p[0, :, :n, :n].float().cpu()
            for name, (mask, rows_with_target) in self.pattern_masks.items():
                if name not in self.pattern_scores:
                    self.pattern_scores[name] = torch.zeros(L, spec.n_heads, device="cpu")
                self.pattern_scores[name][layer] = (
                    torch.einsum("bhqk,bqk->h", p.float(), mask.to(p.device)) / rows_with_target).cpu()

        L = spec.n_layers
        hooks: list[tuple[str, Callable]] = []
        if direct:
            hooks.append((HOOKS.resid_post(L - 1), final_hook))
        final_norm = direct and self.adapter.norm_kind is not None and _has_hook(self.adapter, HOOKS.final_scale())
        if final_norm:
            hooks += [(HOOKS.final_scale(), keep_scale), (HOOKS.final_normalized(), keep_normalized_grad)]
        if dla:
            hooks += [(HOOKS.pattern(layer), pattern_hook) for layer in range(L)]
        from circuitkit.detect.attribution import frozen_parameters

        with frozen_parameters(self.adapter.model), torch.enable_grad() if direct else torch.no_grad():
            # what the run keeps (every resid_pre and the final norm's input only where passes resume) is read before
            # this pass's own hooks: the final hook makes the last block's output a leaf
            logits, kept = reference_pass(self.adapter, tokens, self._keep(resid=keep_resid), hooks=hooks,
                                          positions=self.positions)
            last = last_logits(logits, self.last_index)[0]
            dla_values = None
            if direct:
                from circuitkit.graph.metrics import logit_diff, next_token_logit

                if self.scored_metric:
                    target = next_token_logit(logits, self.targets, self.scored).mean()
                else:
                    target = logit_diff(last, self.batch).mean()
                (grad,) = torch.autograd.grad(target, final[0])
                if final_norm and "grad" in norm_seen and "scale" in norm_seen:
                    grad = _frozen_scale_pullback(norm_seen["grad"], norm_seen["scale"], self.adapter.norm_kind)
        self.passes += 1.0  # the backward of ``dla`` runs through this pass's tail only (docstring)
        result = self._run_record(logits, kept.input, kept.z, kept.mlp, kept.nodes, kept.resid)
        # every sender's output [sender, pair, pos, d_model], for direct logit attribution only: not kept after it
        out = self.outputs(result) if direct else None
        if direct and self.scored_metric:
            # the gradient is zero where the metric reads no prediction: the sum over every position is the sum over
            # the scored ones (senders a few at a time: no float32 copy of every output at once)
            g = grad.detach().float().flatten()
            dla_values = torch.cat([part.float().flatten(1) @ g for part in out.split(32)])
        elif direct:
            rows = torch.arange(self.batch.n_pairs, device=out.device)
            at_last = out[:, rows, self.batch.last]  # [sender, pair, d_model]
            g_last = grad[rows, self.batch.last]  # [pair, d_model]
            # the gradient is of the mean over pairs: the sum over pairs is the mean of each pair's attribution
            dla_values = torch.einsum("spm,pm->s", at_last.float(), g_last.float())
        del out
        result["dla"] = None if dla_values is None else dla_values.detach().cpu()
        if dla:
            result["last_attention"] = torch.stack([last_rows[layer] for layer in range(L)])  # [layer, pair, head, k]
            result["first_patterns"] = torch.stack([first[layer] for layer in range(L)])  # [layer, head, q, k]
        return result

    def _run_record(self, logits: Tensor, embedded: Tensor, z: dict[int, Tensor], mlp: dict[int, Tensor],
                    extra: dict[str, dict[int, Tensor]], resid: dict[int, Tensor]) -> dict[str, Any]:
        """A reference run (:attr:`clean`, :attr:`corrupted`) from what its pass kept: ``logits`` ``[pair, K,
        vocab]``, the input embeddings, each layer's ``z`` and MLP output, the further node types' activations
        (checked) and the residual streams kept; its metric (checked finite) and last-token log-probabilities
        computed here. ``dla`` None (the clean run adds it)."""
        for kind in self.extra_types:
            _check_units(kind, extra[kind.name], self.spec)
        logits = logits.detach()
        clean_lp = self._clean["logprobs"] if self._clean is not None else None
        metric = self._metric_of(logits, clean_lp)[0]
        return {"input": embedded, "z": z, "mlp": mlp, "nodes": extra,
                "metric": validate.finite_result("task metric", metric.cpu(), why="the model's logits overflowed"),
                "logprobs": last_logits(logits, self.last_index)[0].float().log_softmax(-1), "dla": None,
                "resid": resid}

    @property
    def node_scores_from_outputs(self) -> bool:
        """Whether :meth:`node_attribution` gives the node scores :meth:`attribute` gives (the sum of each node's
        edges' scores): where a node is patched to its corrupted value, as its edges are, or where the family has no
        edges (then it is all there is). Elsewhere the two differ: the edges are patched from the corrupted prompt,
        the nodes to their ablation."""
        return not self.edges_defined or self.ablation == "corrupted"

    def folds_corrupted(self, steps: int, points: str) -> bool:
        """Whether EAP-IG (:meth:`attribute`) gives the corrupted run too: its first point, ``alpha = 0``, is the
        corrupted input, and its forward then runs the corrupted prompts (every later activation follows from the
        input embeddings). So where the corrupted run has not run yet and one of the points (stacked in one pass
        of every pair; a family without edges runs :meth:`node_attribution`'s one pass) is ``alpha = 0``, the
        corrupted run is read from that copy and does not run apart."""
        return self._corrupt is None and bool((ig_alphas(steps, points) == 0).any())

    def outputs(self, run: dict[str, Any], first: int = 0, stop: int | None = None) -> Tensor:
        """The outputs of senders ``first .. stop - 1`` (every sender by default) in ``run`` (:attr:`clean` or
        :attr:`corrupted`), ``[sender, pair, pos, d_model]``: the input embeddings, each head's ``z @ W_O`` (formed
        from the run's ``z`` a layer at a time, by the product the reference pass would have taken: the same
        values), each MLP's output. Formed where a pass reads them rather than kept: a run keeps its ``z``,
        ``d_model / d_head`` times smaller than its heads' outputs (32x at the Llama-3.1-8B shape)."""
        graph = self.graph
        n = len(graph.senders)
        stop = n if stop is None else validate.integer("TaskRunner.outputs: stop", stop, minimum=1, maximum=n)
        first = validate.integer("TaskRunner.outputs: first", first, minimum=0, maximum=stop - 1)
        blocks = []
        for (kind, layer), where in graph.sender_slices.items():
            lo, hi = max(first, where.start), min(stop, where.stop)
            if lo >= hi:
                continue
            if kind == "input":
                block = run["input"][None]
            elif kind == "head":
                z = run["z"][layer]
                block = torch.einsum("bphd,hdm->hbpm", z, self.W_O[layer].to(z.dtype))
            else:
                block = run["mlp"][layer][None]
            blocks.append(block[lo - where.start : hi - where.start])
        return blocks[0] if len(blocks) == 1 else torch.cat(blocks)

    def metric(self, logits: Tensor) -> Tensor:
        """Per-pair metric ``[copies, pair]`` of stacked logits ``[copies * pair, pos, vocab]``."""
        clean_lp = self.clean["logprobs"] if self.metric_name == "neg_kl" else None
        return self._metric_of(logits, clean_lp)

    # ------------------------------------------------------------------ node patching
    def node_values(self) -> tuple[dict[int, Tensor], dict[int, Tensor]]:
        """What a node outside a circuit becomes: per layer, a head's ``z`` and an MLP's output, on the corrupted
        prompts (``"corrupted"``), their mean over the corrupted prompts' real positions (``"mean"``), over the clean
        prompts' (``"clean_mean"``) or zeros."""
        return self.values_of("head"), self.values_of("mlp")

    def values_of(self, name: str) -> dict[int, Tensor]:
        """What the activation of node type ``name`` becomes outside a circuit, by layer (:meth:`node_values`);
        computed once per runner."""
        if name in self._values:
            return self._values[name]
        run = self.clean if self.ablation == "clean_mean" else self.corrupted
        acts = run["z"] if name == "head" else run["mlp"] if name == "mlp" else run["nodes"][name]
        if self.ablation == "corrupted" or not acts:
            self._values[name] = acts
            return acts
        from circuitkit.detect.node_patching import unit_mean

        def mean(x: Tensor) -> Tensor:  # the node-ablation mean of both engines, over the real positions
            m = unit_mean(x, self.batch.real)
            return (torch.zeros_like(m) if self.ablation == "zero" else m).expand_as(x)

        self._values[name] = {k: mean(v) for k, v in acts.items()}
        return self._values[name]

    def first_pairs(self, k: int) -> TaskRunner:
        """A runner over this one's first ``k`` pairs that runs no reference pass: its clean and corrupted runs and
        its nodes' patched values are this runner's, cut to those pairs (a mean over the pairs stays the mean over
        all of them). Its :attr:`passes` count stacked copies of the ``k`` pairs (the coarse circuit search)."""
        k = validate.integer("task circuit: first_pairs", k, minimum=1, maximum=self.batch.n_pairs)
        return self._pair_range(0, k)

    def _pair_range(self, a: int, k: int) -> TaskRunner:
        """:meth:`first_pairs` for the pairs ``a .. k - 1``."""
        import copy

        clean, corrupted = self.clean, self.corrupted
        values = {name: self.values_of(name) for name in ("head", "mlp", *(t.name for t in self.extra_types))}
        sub = copy.copy(self)
        sub.batch = self.batch.subset(torch.arange(a, k, device="cpu"))
        width = sub.batch.clean.shape[1]
        sub._read_at(sub.batch)
        sub.passes = 0.0
        sub.pattern_masks, sub.pattern_scores = {}, {}

        def cut_layers(acts: dict[int, Tensor]) -> dict[int, Tensor]:
            return {i: v[a:k, :width] for i, v in acts.items()}

        def cut(run: dict[str, Any]) -> dict[str, Any]:
            return {"input": run["input"][a:k, :width], "z": cut_layers(run["z"]), "mlp": cut_layers(run["mlp"]),
                    "nodes": {name: cut_layers(acts) for name, acts in run.get("nodes", {}).items()},
                    "metric": run["metric"][a:k], "logprobs": run["logprobs"][a:k], "dla": None,
                    "resid": cut_layers(run.get("resid", {}))}

        sub._clean, sub._corrupt = cut(clean), cut(corrupted)
        sub._values = {name: cut_layers(acts) for name, acts in values.items()}
        sub._all_patched = {key: cut_layers(resid) for key, resid in self._all_patched.items()}
        return sub

    def node_metric(self, heads: Tensor, mlps: Tensor | None, *, per_pair: bool = False) -> Tensor:
        """``heads`` ``[sets, layer, head]`` / ``mlps`` ``[sets, layer]`` bool, True where a node is **patched**:
        the mean metric of each set, ``[sets]`` (one stacked copy of the pairs per set); with ``per_pair``, each
        pair's metric, ``[sets, pair]`` (what the bootstrap intervals resample). :meth:`patched_metric` takes
        node sets of every type."""
        patched = {"head": heads} | ({} if mlps is None else {"mlp": mlps[..., None]})
        return self.patched_metric(patched, per_pair=per_pair)

    def patched_metric(self, patched: dict[str, Tensor], *, per_pair: bool = False) -> Tensor:
        """``patched``: node type name -> ``[sets, layer, nodes]`` bool, True where a node is **patched** (types
        left out: every node clean); as :meth:`node_metric`.

        Each set's pass resumes where the layers before it are a run already made (:meth:`node_starts`): the clean
        run's below the lowest layer it patches, or the run with every node patched (of the same types) below the
        lowest layer it keeps; sets of one start share stacked passes."""
        sets = check_node_sets("task circuit: patched", self.node_types, patched, self.spec)
        starts = self.node_starts(patched)
        out: Tensor | None = None
        for start in sorted(set(starts)):
            which = torch.tensor([i for i, st in enumerate(starts) if st == start], device="cpu")
            group = {name: mask[which.to(mask.device)] for name, mask in patched.items()}
            values = self._in_passes(len(which), node=True, run=lambda part, group=group, start=start: self._node_pass(
                {name: mask[part] for name, mask in group.items()}, start))
            if out is None:
                out = torch.empty(sets, *values.shape[1:], dtype=values.dtype, device=values.device)
            out[which] = values
        return out if per_pair else out.mean(-1)

    def node_starts(self, patched: dict[str, Tensor]) -> list[tuple[int, str]]:
        """Where each set of ``patched`` (:meth:`patched_metric`) starts: ``(layer, source)``, ``source``
        ``"clean"`` (nothing patched before ``layer``: the clean run's residual stream entering it) or
        ``"patched"`` (every node of ``patched``'s types patched before ``layer``: that of the run with every such
        node patched, where it was recorded, :meth:`record_all_patched`); ``(0, "full")`` for a full pass. The later
        of the two where both apply (:meth:`resume_layer`: at most the last layer)."""
        L = self.spec.n_layers
        recorded = self._all_patched.get(self._types_key(patched))
        out = []
        for first_patched, first_kept in self._first_layers(patched):
            from_clean = self.resume_layer(first_patched)
            from_patched = min(first_kept, L - 1) if recorded is not None and self.adapter.can_resume else 0
            if max(from_clean, from_patched) == 0:
                out.append((0, "full"))
            else:
                out.append((from_clean, "clean") if from_clean >= from_patched else (from_patched, "patched"))
        return out

    def _first_layers(self, patched: dict[str, Tensor]) -> list[tuple[int, int]]:
        """Per set of ``patched``: ``(first layer with a node patched, first layer with a node kept)``, each
        ``n_layers`` where there is none."""
        L = self.spec.n_layers
        any_patched = torch.stack([mask.any(-1) for mask in patched.values()]).any(0).cpu()  # [sets, L]
        any_kept = torch.stack([(~mask).any(-1) for mask in patched.values()]).any(0).cpu()
        return [(int(p.nonzero()[0]) if bool(p.any()) else L, int(k.nonzero()[0]) if bool(k.any()) else L)
                for p, k in zip(any_patched, any_kept, strict=True)]

    def _types_key(self, patched: dict[str, Tensor]) -> tuple[tuple[str, int], ...]:
        return tuple(sorted((name, mask.shape[-1]) for name, mask in patched.items()))

    def record_all_patched(self, names: tuple[str, ...]) -> Tensor:
        """Run the pass with every node of the types ``names`` patched, recording its residual stream entering each
        layer (where the model can resume) for the passes that patch every such node below some layer
        (:meth:`node_starts`); its metric per pair ``[pair]``, one pass."""
        L = self.spec.n_layers
        patched = {name: torch.ones(1, L, self.node_types[name].count(self.spec), dtype=torch.bool, device="cpu")
                   for name in names}
        return self._node_pass(patched, (0, "full"), record=self.adapter.can_resume)[0]

    def all_patched_metric(self, names: tuple[str, ...], then: dict[str, Tensor] | None) -> Tensor:
        """Each pair's metric with every node of the types ``names`` patched, ``[pair]``: the corrupted run's where
        that is what it is (:meth:`every_node_patched_is_corrupted`) and the sets measured next (``then``, as
        :meth:`patched_metric` takes them; None: none) would not save more than its one pass by resuming from it
        (:meth:`resume_saving`); else the pass itself, recorded for them to resume from
        (:meth:`record_all_patched`)."""
        if self.every_node_patched_is_corrupted() and (then is None or self.resume_saving(then) <= 1.0):
            return self.corrupted["metric"]
        return self.record_all_patched(names)

    def resume_saving(self, patched: dict[str, Tensor]) -> float:
        """The passes the sets of ``patched`` would save by resuming from the run with every node of their types
        patched (:meth:`record_all_patched`) rather than from the clean run only: what that run is worth."""
        L = self.spec.n_layers
        if not self.adapter.can_resume:
            return 0.0
        return sum((max(0, min(first_kept, L - 1) - self.resume_layer(first_patched)) / L
                    for first_patched, first_kept in self._first_layers(patched)), 0.0)

    def _node_pass(self, patched: dict[str, Tensor], start: tuple[int, str] = (0, "full"),
                   record: bool = False) -> Tensor:
        """One stacked pass of the node-patching engine (:mod:`circuitkit.detect.node_patching`, the induction
        scan's too): per copy ``s``, the units of every patched node (a node's units: :func:`groups_of`) take their
        :meth:`values_of` (``[pair, pos, unit, ...]``). ``start``: where it resumes (:meth:`node_starts`), counted
        as its share of the layers (:meth:`pass_share`); ``record``: the first copy patches every node, and its
        residual stream entering each layer is kept (:meth:`record_all_patched`)."""
        from circuitkit.detect.node_patching import patched_logits

        S = next(iter(patched.values())).shape[0]
        L = self.spec.n_layers
        layer, source = start
        patches = node_patches(self.node_types, patched, {name: self.values_of(name) for name in patched}, layer)
        resume = None
        if source == "clean":
            resume = (self.clean["resid"][layer], layer)
        elif source == "patched":
            resume = (self._all_patched[self._types_key(patched)][layer], layer)
        read: list[tuple[str, Callable]] = []
        kept: dict[int, Tensor] = {}
        if record:
            B = self.batch.n_pairs

            def keep(x: Tensor, hook: Any) -> None:
                kept[HOOKS.layer_of(hook.name)] = x[:B].detach()

            read = [(HOOKS.resid_pre(at), keep) for at in range(1, L)]
        logits = patched_logits(self.adapter, self.batch.clean, S, patches, positions=self.positions, resume=resume,
                                read=read)
        if record:
            self._all_patched[self._types_key(patched)] = kept
        self.passes += S * self.pass_share(layer)
        return validate.finite_result("task circuit: metric", self.metric(logits).cpu(),
                                      why="the patched model's logits overflowed")

    def _in_passes(self, sets: int, *, node: bool, run: Callable[[slice], Tensor]) -> Tensor:
        """``run(part)`` for consecutive slices of ``sets``, as many sets a pass as memory allows, concatenated
        (:func:`circuitkit.detect.node_patching.in_passes`)."""
        from circuitkit.detect.node_patching import in_passes

        return torch.cat(in_passes(sets, self._copies_per_pass(node=node), run))

    def every_node_patched_is_corrupted(self) -> bool:
        """Whether patching every node (every head's ``z`` among them) from the corrupted run gives the corrupted
        run's own metric, pair by pair, so that the all-patched pass need not run: with ``"corrupted"`` ablation,
        where each pair's prompts have the same token at every position the metric reads. Attention is the only
        step that mixes positions, and every head's output is then the corrupted run's; everything else (MLPs,
        norms, the unembedding) works position by position from the same token at the same position, so at a read
        position every activation is the corrupted run's."""
        if self.ablation != "corrupted":
            return False
        batch = self.batch
        at = self.positions.to(batch.clean.device)
        rows = torch.arange(batch.n_pairs, device=batch.clean.device)
        read = torch.zeros(batch.n_pairs, len(at), dtype=torch.bool, device=batch.clean.device)
        read[rows, self.last_index.to(batch.clean.device)] = True
        if self.scored_metric:
            read |= self.scored.to(batch.clean.device)
        elif self.every_position_metric:
            read |= batch.real[:, at]
        same = batch.clean[:, at] == batch.corrupted[:, at]
        return bool(same[read].all())

    def resume_layer(self, first: int) -> int:
        """Where a patched pass that changes nothing before layer ``first`` starts: that layer (at most the last
        one: the logits' input is patched at its output), resumed from the clean run's residual stream entering it,
        where the model can resume (:attr:`~circuitkit.models.adapters.ModelAdapter.can_resume`); else 0, a full
        pass."""
        start = min(first, self.spec.n_layers - 1)
        if start <= 0 or not self.adapter.can_resume or start not in self.clean.get("resid", {}):
            return 0
        return start

    def final_layer(self) -> int:
        """Where a pass that changes only the final residual stream starts: ``n_layers`` (past the last layer,
        from the clean run's final residual stream) where the model can resume there, else
        :meth:`resume_layer` of the last layer."""
        L = self.spec.n_layers
        if self.adapter.can_resume and L in self.clean.get("resid", {}):
            return L
        return self.resume_layer(L - 1)

    def pass_share(self, start: int) -> float:
        """The passes one copy of the pairs counts when it starts at layer ``start`` (:meth:`resume_layer`): its
        share of the layers, ``(L - start) / L``, as the induction scan counts a resumed ablation
        (:func:`circuitkit.detect.ablation.together_cost`); 1 for a full pass."""
        L = self.spec.n_layers
        return (L - start) / L

    # ------------------------------------------------------------------ edge passes
    def edge_metric(self, kept: Tensor, pairs: list[Tensor] | None = None) -> Tensor:
        """``kept`` ``[sets, sender, receiver]`` bool (True: the edge is in the circuit, clean): the mean metric of
        each set with every other edge patched from the corrupted prompt, ``[sets]``; with ``pairs`` (a list), each
        pass also appends its sets' metric per pair, ``[sets in the pass, pair]`` on the CPU, in order (what the
        bootstrap intervals resample; no extra pass)."""
        def run(part: slice) -> Tensor:
            chunk = kept[part]
            with torch.no_grad():
                logits, copies = self._edge_pass(chunk.shape[0], chunk, None, None)
            self.passes += chunk.shape[0] * copies
            return self._means_of(logits, pairs)

        return self._in_passes(kept.shape[0], node=False, run=run)

    def _means_of(self, logits: Tensor, pairs: list[Tensor] | None) -> Tensor:
        """The mean metric of each stacked copy's logits ``[copies]`` (checked finite); its per-pair values
        ``[copies, pair]`` appended to ``pairs`` where given."""
        per_pair = self.metric(logits)  # [copies, pair]
        # checked through its mean: a non-finite pair's metric makes the mean non-finite
        means = validate.finite_result("task circuit: metric", per_pair.mean(-1).cpu(),
                                       why="the patched model's logits overflowed")
        if pairs is not None:
            pairs.append(per_pair.cpu())
        return means

    def single_edge_metric(self, edges: Tensor, pairs: list[Tensor] | None = None,
                           progress: Callable[[int], Any] | None = None) -> Tensor:
        """``edges`` ``[n, 2]`` (sender, receiver) indices of edges of the graph: the mean metric with that edge
        alone patched from the corrupted prompt, every other edge clean (its exact effect: path patching), ``[n]``;
        ``pairs`` as :meth:`edge_metric`'s; ``progress`` is called with the number of edges each pass measured.

        Everything before the receiver's layer is then the clean run, so each edge's pass resumes from the clean
        run's residual stream entering that layer (:meth:`resume_layer`), the sender's delta (its corrupted output
        minus its clean one) added at the receiver's input, and counts its share of the layers
        (:meth:`pass_share`): the one exact edge pass of both engines, :func:`~circuitkit.graph.edge_patch.
        patched_edges`, one edge a stacked copy. An edge into the logits changes only the final residual stream:
        its pass starts from the clean run's, that edge's delta added, and runs no layer, only the final norm and
        the unembedding at the read positions (:meth:`final_layer`; counted 0, as the direct logit attribution's
        backward through them). A per-query-head key or value edge patches its group's key/value head and puts
        the group's other query heads' clean ``z`` back (one copy, where :meth:`edge_metric` runs the group's
        copies side by side). The same values as :meth:`edge_metric` of the masks with that edge dropped (to float
        rounding; tests/test_task_passes.py), which a model that cannot resume runs as full passes."""
        starts = self._single_edge_starts(edges)
        edges = edges.cpu()
        out = torch.empty(edges.shape[0], device="cpu")
        per_pair = torch.empty(edges.shape[0], self.batch.n_pairs, device="cpu")
        for start in sorted(set(starts)):
            which = [i for i, s in enumerate(starts) if s == start]
            got: list[Tensor] = []
            out[which] = self._single_edges_from(edges[which], start, got, progress)
            per_pair[which] = torch.cat(got)
        if pairs is not None:
            pairs.append(per_pair)
        return out

    def _single_edges_from(self, edges: Tensor, start: int, pairs: list[Tensor],
                           progress: Callable[[int], Any] | None = None) -> Tensor:
        """:meth:`single_edge_metric` of ``edges`` whose passes all start at layer ``start``."""
        from circuitkit.graph.edge_patch import patched_edges

        resid = self.clean["resid"][start] if start else None

        def run(part: slice) -> Tensor:
            chunk = edges[part].tolist()
            with torch.no_grad():
                home = self.clean["input"].device  # a sharded model's layers write on devices of their own
                deltas = torch.stack([self._sender_delta(s).to(home) for s, _ in chunk])
                logits = patched_edges(self.edge_model, deltas, [(self._receiver(r),) for _, r in chunk],
                                       start=start, resid=resid, tokens=self.batch.clean, clean_z=self.clean["z"],
                                       positions=self.positions)
            self.passes += len(chunk) * self.pass_share(start)
            if progress is not None:
                progress(len(chunk))
            return self._means_of(logits, pairs)

        return self._in_passes(edges.shape[0], node=True, run=run)

    def _sender_delta(self, sender: int) -> Tensor:
        """Sender ``sender``'s corrupted output minus its clean one, ``[pair, pos, d_model]``."""
        return self.outputs(self.corrupted, sender, sender + 1)[0] - self.outputs(self.clean, sender, sender + 1)[0]

    def _receiver(self, index: int) -> Any:
        """Receiver ``index`` of the graph as the edge pass's :class:`~circuitkit.graph.edge_patch.Receiver`."""
        from circuitkit.graph.edge_patch import Receiver

        graph = self.graph
        for (channel, layer), cols in graph.receiver_slices.items():
            if cols.start <= index < cols.stop:
                unit = index - cols.start
                if channel in ("k", "v") and graph.kv_copies > 1:  # a query head's own keys/values
                    group = unit // graph.kv_copies
                    return Receiver(channel, layer, weight=group, slot=group, only=unit)
                return Receiver(channel, layer, weight=unit, slot=unit)
        raise validate.fail("task circuit: receiver", index, f"a receiver index below {len(graph.receivers)}")

    @property
    def edge_model(self) -> Any:
        """The model as the exact edge pass reads it (:class:`~circuitkit.graph.edge_patch.EdgeModel`)."""
        from circuitkit.graph.edge_patch import EdgeModel

        return EdgeModel(self.adapter, {"q": self.W_Q, "k": self.W_K, "v": self.W_V}, self.norms, self.mlp_in,
                         self.mlp_normed)

    def single_edge_share(self, edges: Tensor) -> float:
        """The passes :meth:`single_edge_metric` of ``edges`` will count, one copy of the pairs each, from where
        each resumes."""
        return sum((self.pass_share(start) for start in self._single_edge_starts(edges)), 0.0)

    def _single_edge_starts(self, edges: Tensor) -> list[int]:
        """Where each edge of ``edges`` ``[n, 2]`` (checked: edges of the graph) patched alone resumes: past the
        last layer for an edge into the logits (:meth:`final_layer`), else its receiver's layer
        (:meth:`resume_layer`)."""
        graph = self.graph
        shape_ok = (isinstance(edges, Tensor) and edges.dim() == 2 and edges.shape[1] == 2
                    and not edges.is_floating_point() and edges.dtype != torch.bool and not edges.is_complex())
        edges = edges.cpu() if shape_ok else edges
        in_range = shape_ok and bool(((edges >= 0) & (edges < torch.tensor(graph.allowed.shape, device="cpu"))).all())
        if not in_range or not bool(graph.allowed[edges[:, 0], edges[:, 1]].all()):
            raise validate.fail("task circuit: single_edge_metric edges", getattr(edges, "shape", edges),
                                "[n, 2] (sender, receiver) integer indices of edges of the graph")
        layer_of = graph.receiver_layers
        return [self.final_layer() if r == graph.logits_index else self.resume_layer(int(layer_of[r]))
                for r in edges[:, 1].tolist()]

    def edge_gradients(self, steps: int, points: str = DEFAULT_IG_POINTS) -> tuple[Tensor, Tensor]:
        """EAP-IG: ``(scores [sender, receiver], node_scores [sender])`` (module docstring), zero where no edge;
        ``points``: where on the path the gradients are taken (:func:`ig_alphas`)."""
        scores, node_scores, _ = self.attribute(steps, points)
        return scores, node_scores

    def attribute(self, steps: int, points: str = DEFAULT_IG_POINTS, *, local: LocalMetric | None = None,
                  clean_point: EdgeGradients | None = None) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """EAP-IG of every edge and node in one stacked pass: :meth:`edge_gradients`'s ``(scores, node_scores)``
        and each further node type's node scores, ``{type: [layer, nodes]}`` (:mod:`~circuitkit.graph.nodes`; the
        gradient at a zero leaf added at its hook, which changes no value). Per-query-head key/value receivers
        of a grouped-query model take their gradients from the same pass: the group's gradient split by query
        head through each layer's pattern (keys) and ``z`` (values), :func:`~circuitkit.graph.pullback.
        split_by_query_head`, as the induction engine's edge attribution splits it.

        With :attr:`keep_node_pairs`, each pair's term of every node score is kept too, as :attr:`node_pairs`
        ``[sender, pair]``: ``B`` times pair ``p``'s share of the score (the metric is the mean over the ``B``
        pairs), so that their mean over the pairs is the node score, what a bootstrap over the pairs resamples.

        ``local``: instead of the task's metric of the logits, each receiver head's own score read from its
        attention pattern (``local(pattern [head, copies, pair, q, k]) -> [head, copies]``, e.g. the induction
        score, :class:`~circuitkit.circuits.metrics.InductionReader`), differentiated with every head's ``z``
        detached, so that a receiver's gradient is that of its own score alone (what the induction engine's edge
        attribution calls a local metric): every edge into a head's queries and keys gets the estimate of that
        head's score lost, as the task's metric's scores estimate the metric lost; values, MLPs and the logits
        get 0.

        ``clean_point``: the gradients at the clean run (the point ``alpha = 1``: ``points="right"`` only) taken by
        another pass over the same pairs and metric, a gradient tap riding on it
        (:class:`~circuitkit.detect.session.EdgeGradients`, what the induction engine's
        :class:`~circuitkit.circuits.attribution.GradientTap` leaves: the induction scan's head attribution carries
        it), so that the stacked pass runs the other ``steps - 1`` points only (no pass at ``steps = 1``). Its
        gradients are at every layer's q/k/v activations per query head, with each layer's ``resid_pre``; they are
        of a loss (minus this runner's metric) unless its metric is local, when they are of the receivers' own
        scores as ``local``'s. A receiver it holds no gradient for (layer 0's, whose inputs a tap's graph does not
        reach; the MLPs and the logits) gets NaN scores, and so does every node score."""
        scores, typed = self._attribute_part(steps, points, local, clean_point)
        return scores, scores.sum(1), typed

    def _attribute_part(self, steps: int, points: str, local: LocalMetric | None = None,
                        clean_point: EdgeGradients | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        """:meth:`attribute`'s edge scores and further node types' scores: the points stacked as copies of the
        pairs, as many a pass as the runner's budget holds (:meth:`_copies_per_pass`: one pass for every task
        measured), each pass's gradients contracted with the senders' deltas once it ends (the clean point's from
        ``clean_point`` where given, with the last pass's)."""
        graph = self.graph
        # the corrupted run read from the point alpha = 0 where it has not run (folds_corrupted): its embeddings
        # first, from a pass that stops before the first layer
        fold = self.folds_corrupted(steps, points)
        clean_in = self.clean["input"]
        corrupt_in = self.adapter.embedded(self.batch.corrupted) if fold else self.corrupted["input"]
        alphas = ig_alphas(steps, points).to(clean_in.device)
        if clean_point is not None:
            alphas = alphas[:-1]  # the clean point is the tap's (checked: it is alpha = 1)
            self._check_clean_point(clean_point, points)
        scores = torch.zeros(len(graph.senders), len(graph.receivers), device="cpu")
        summed: dict[tuple[str, int], Tensor] = {}  # the further node types' gradients summed over the points
        B, S = self.batch.n_pairs, len(graph.senders)
        # summed where the products are, brought to the CPU once: a copy per pair and receiver block would wait on
        # a GPU's queue each time
        pairs = torch.zeros(S, B, dtype=torch.float32, device=self.spec.device) if self.keep_node_pairs else None
        per_pass = self._copies_per_pass(node=True)
        chunks = [alphas[i : i + per_pass] for i in range(0, len(alphas), per_pass)] or [alphas]
        untapped: list[tuple[str, int]] = []
        for i, chunk in enumerate(chunks):
            n = len(chunk)
            got, node_got, resid = self._points_pass(chunk, corrupt_in, clean_in, local, fold) if n else ({}, {}, {})
            copies = n
            if clean_point is not None and i == len(chunks) - 1:
                got, resid, untapped = self._with_clean_point(got, resid, n, clean_point)
                copies = n + 1
            self._contract(scores, pairs, got, resid, copies, steps)
            _add_summed(summed, node_got, n)
        if pairs is not None:
            self.node_pairs = pairs.cpu() * B
        scores = scores * graph.allowed
        for key in untapped:  # no gradient at the clean point: not measured
            cols = self._receiver_columns(key)
            scores[:, cols] = torch.where(graph.allowed[:, cols], torch.nan, 0.0)
        return scores, self._typed_scores(summed, steps)

    def _points_pass(self, alphas: Tensor, corrupt_in: Tensor, clean_in: Tensor, local: LocalMetric | None,
                     fold: bool) -> tuple[dict, dict, dict[int, Tensor]]:
        """One forward and backward pass of the points ``alphas`` stacked as copies of the pairs (EAP-IG's pass):
        ``(got, node_got, resid)``, the metric's gradient at every receiver's leaf (key/value leaves split by query
        head where the graph has per-query-head receivers) and at the further node types' leaves, ``[copies * pair,
        ...]`` (the MLPs' and the logits' ``[copies, pair, ...]``), and each layer's ``resid_pre`` (detached). With
        ``fold``, the copy at ``alpha = 0`` (if the pass holds it) is also recorded as the corrupted run."""
        from circuitkit.detect.attribution import frozen_parameters

        graph = self.graph
        n = len(alphas)
        start = along(corrupt_in[None], clean_in[None], alphas)  # [n, pair, pos, d_model]
        grads: dict[tuple[str, int], Tensor] = {}
        resid: dict[int, Tensor] = {}
        node_leaves: dict[tuple[str, int], Tensor] = {}
        # per-query-head key/value receivers: each layer's pattern and z, through which a group's gradient is split
        by_head: dict[tuple[str, int], Tensor] | None = {} if graph.kv_copies > 1 else None
        at_zero = (alphas == 0).nonzero().flatten()
        fold = fold and len(at_zero) > 0
        zero = int(at_zero[0]) if fold else 0  # the copy at alpha = 0
        read, kept = self._copy_reads(zero) if fold else ([], None)
        local_scores: list[Tensor] | None = None if local is None else []
        with frozen_parameters(self.adapter.model), torch.enable_grad():
            logits, _ = self._edge_pass(n, None, start.reshape(-1, *start.shape[2:]), grads, resid, node_leaves,
                                        read=read, by_head=by_head,
                                        local=None if local is None else (local, local_scores))
            if fold:
                self._corrupted_from(logits, zero, corrupt_in, kept)
            if local_scores is not None:  # each head's own score, summed: z is detached, so each is its own
                total = torch.stack(local_scores).sum()
            else:
                total = self.metric(logits).mean(-1).sum()
            leaves = sorted(grads)
            named = sorted(node_leaves)
            outs = sorted(by_head or {})
            got = torch.autograd.grad(total, [grads[i] for i in leaves] + [node_leaves[i] for i in named]
                                      + [by_head[i] for i in outs], allow_unused=True, retain_graph=bool(outs))
            got_leaves = dict(zip(leaves, got[: len(leaves)], strict=True))
            node_got = dict(zip(named, got[len(leaves) : len(leaves) + len(named)], strict=True))
            if outs:
                self._split_by_query_head(got_leaves, grads, by_head, dict(zip(outs, got[-len(outs):], strict=True)))
        # the graph the split retained, and every layer's pattern gradient, freed before the pullback's buffers: the
        # residual streams kept on the graph would hold it alive
        del by_head, logits, total, got
        self.passes += 3.0 * n  # the split's products, each through one layer's attention, are not counted
        return got_leaves, node_got, {layer: x.detach() for layer, x in resid.items()}

    def _contract(self, scores: Tensor, pairs: Tensor | None, got: dict[tuple[str, int], Tensor | None],
                  resid: dict[int, Tensor], copies: int, steps: int) -> None:
        """Add ``sum_{pair, pos} (out_u - out'_u) . g_v / steps`` to ``scores`` ``[sender, receiver]`` for the
        gradients ``got`` of ``copies`` points (each receiver's pulled back to its input at that point's ``resid``,
        :meth:`_pulled_back`), and each pair's term to ``pairs`` ``[sender, pair]`` where given.

        Memory: half the runner's budget holds the senders' deltas ``[sender, pairs * pos * d_model]``, formed a
        block of pairs at a time (the same sum; one block where they fit, as on every task's pairs measured), the
        other half the pulled-back gradients of a group of receivers, so that one product reads the deltas once for
        the whole group (a product per receiver layer and channel read all of them each time, at memory speed)."""
        graph = self.graph
        B, P = self.batch.clean.shape
        half = max(1, self.budget // 2)
        block = max(1, min(B, half // max(1, len(graph.senders) * P * self.spec.d_model * 4)))
        cols = {key: self._receiver_columns(key) for key in sorted(got) if got[key] is not None}
        sizes = [where.stop - where.start for where in cols.values()]
        for first in range(0, B, block):
            rows = slice(first, min(first + block, B))
            flat = self._output_deltas(slice(None) if block == B else rows)
            width = flat.shape[1]
            n_rows = min(sum(sizes), max(max(sizes, default=0), half // (width * 4)))
            buffer = torch.empty(n_rows, width, dtype=flat.dtype, device=flat.device)  # a group's, written in place
            group: list[tuple[slice, int]] = []  # each receiver's columns and its first row in the buffer
            used = 0
            for key, where in cols.items():
                layer = key[1]
                at = {layer: _rows_of(resid[layer], copies, B, rows)} if layer in resid else {}
                g = self._pulled_back(key, _rows_of(got[key].detach().float(), copies, B, rows), at, copies)
                if used + g.shape[0] > buffer.shape[0]:
                    self._add_products(scores, pairs, flat, buffer[:used], group, rows)
                    group, used = [], 0
                torch.div(g, steps, out=buffer[used : used + g.shape[0]])  # mean over the points
                group.append((where, used))
                used += g.shape[0]
                del g
            if group:
                self._add_products(scores, pairs, flat, buffer[:used], group, rows)
            del flat, buffer

    def _add_products(self, scores: Tensor, pairs: Tensor | None, flat: Tensor, grads: Tensor,
                      group: list[tuple[slice, int]], rows: slice) -> None:
        """:meth:`_contract`'s product of the deltas ``flat`` ``[sender, n]`` with a group of receivers' gradients
        ``grads`` ``[rows, n]`` (each receiver's columns in ``scores`` and first row in ``grads``), added to
        ``scores`` (and a pair at a time to ``pairs``, the pairs ``rows``)."""
        product = (flat @ grads.T).cpu()
        for cols, at in group:
            scores[:, cols] += product[:, at : at + cols.stop - cols.start]
        if pairs is None:
            return
        allowed = torch.cat([self.graph.allowed[:, cols] for cols, _ in group], dim=1).to(device=flat.device,
                                                                                       dtype=flat.dtype)
        width = flat.shape[1] // (rows.stop - rows.start)
        for j, p in enumerate(range(rows.start, rows.stop)):  # views of each pair's columns: no copy
            part = slice(j * width, (j + 1) * width)
            pairs[:, p] += ((flat[:, part] @ grads[:, part].T) * allowed).sum(1)

    def _check_clean_point(self, point: EdgeGradients, points: str) -> None:
        """Refuse a clean point (:meth:`attribute`) the runner cannot add to its own points: off the right points'
        path (the clean run is their last point), or where the runner also scores what a tap does not measure
        (further node types, each pair's term of the node scores)."""
        if not isinstance(point, EdgeGradients):
            raise validate.fail("TaskRunner.attribute: clean_point", point, "EdgeGradients (a gradient tap's record)")
        if points != "right":
            raise validate.fail("TaskRunner.attribute: points", points, "'right' with a clean_point (its gradients "
                                "are the point alpha = 1, the last of the right points)")
        if self.extra_types or self.keep_node_pairs:
            raise validate.fail("TaskRunner.attribute: clean_point", validate.given(
                "a runner that also scores further node types or each pair's term"), "a runner of heads (and "
                "MLPs) alone: the tap measures the receivers' gradients only")

    def _with_clean_point(self, got: dict[tuple[str, int], Tensor | None], resid: dict[int, Tensor], n: int,
                          point: EdgeGradients) -> tuple[dict, dict[int, Tensor], list[tuple[str, int]]]:
        """The pass's ``n`` points' gradients ``got`` and residual streams ``resid`` with the clean point's after them
        (``[(n + 1) * pair, ...]``, float32; a receiver the pass left unreached is 0 at its points), and the
        receivers the clean point holds no gradient for (:meth:`attribute`'s ``clean_point``)."""
        H, G = self.spec.n_heads, self.spec.n_kv_heads
        sign = 1.0 if point.metric.local else -1.0  # a loss is minus the runner's metric
        merged: dict[tuple[str, int], Tensor] = {}
        untapped = []
        for key in self.graph.receiver_slices:
            g = point.grads.get(key)
            if g is None:
                untapped.append(key)
                continue
            g = sign * g.detach().float()  # [pair, pos, head, d_head]: per query head
            if key[0] in ("k", "v") and self.graph.kv_copies == 1 and G < H:  # a group's input: its heads' sum
                g = g.unflatten(2, (G, H // G)).sum(3)
            own = got.get(key)
            own = torch.zeros((n * g.shape[0], *g.shape[1:]), device=g.device) if own is None else own.float()
            merged[key] = torch.cat([own, g])  # one session: the tap's pass and the runner's on one device
        layers = {layer for _, layer in merged}
        missing = sorted(layer for layer in layers if layer not in point.resid)
        if missing:
            raise CircuitkitError(f"TaskRunner.attribute: the clean point holds gradients at layers {missing} but "
                                  "not their residual streams; expected resid_pre of every layer it has gradients at")
        stacked = {layer: torch.cat([*([resid[layer].float()] if n else []), point.resid[layer].detach().float()])
                   for layer in layers}
        return merged, stacked, untapped

    def _split_by_query_head(self, got: dict[tuple[str, int], Tensor | None], leaves: dict[tuple[str, int], Tensor],
                             outs: dict[tuple[str, int], Tensor], grad_outs: dict[tuple[str, int], Tensor | None]
                             ) -> None:
        """Replace each key/value leaf's gradient in ``got`` (``[n * pair, pos, kv_head, d_head]``) by its split
        into query heads (``[n * pair, pos, head, d_head]``, query head ``g * Q + j`` the ``j``-th of group ``g``,
        as :meth:`_receiver_weights` orders them): the keys' through each layer's pattern, the values' through its
        ``z`` (:func:`~circuitkit.graph.pullback.split_by_query_head`)."""
        Q = self.graph.kv_copies
        wanted = {("pattern" if c == "k" else "z", layer) for c, layer in leaves if c in ("k", "v")}
        if wanted - set(outs):
            missing = sorted(wanted - set(outs), key=lambda key: (key[1], key[0]))
            hooks = [HOOKS.pattern(layer) if name == "pattern" else HOOKS.z(layer) for name, layer in missing]
            raise CircuitkitError(f"task circuit: {type(self.adapter.model).__name__} ran without calling the hooks "
                                  f"{hooks[:4]}{' ...' if len(hooks) > 4 else ''}; expected every attention layer to "
                                  "expose its pattern and z, through which per-query-head key/value receivers split "
                                  "a group's gradient (kv_edges='grouped' needs neither).")
        for (channel, layer), leaf in leaves.items():
            if channel not in ("k", "v"):
                continue
            out_key = ("pattern" if channel == "k" else "z", layer)
            grad_out = grad_outs.get(out_key)
            if got.get((channel, layer)) is None or grad_out is None:
                got[(channel, layer)] = None  # the metric does not read this layer's keys/values
                continue
            got[(channel, layer)] = split_by_query_head(outs[out_key], leaf, grad_out, Q,
                                                        head_axis=1 if channel == "k" else 2)

    def _output_deltas(self, rows: slice = slice(None)) -> Tensor:
        """Every sender's clean output minus its corrupted one on the pairs ``rows``, flattened: ``[sender, pairs *
        pos * d_model]`` float32 (what EAP-IG multiplies the gradients at the receivers by)."""
        clean, corrupted = self.clean, self.corrupted
        if rows != slice(None):
            clean, corrupted = _run_rows(clean, rows), _run_rows(corrupted, rows)
        delta = torch.cat([(self.outputs(clean, where.start, where.stop)  # [sender, pair, pos, d_model]
                            - self.outputs(corrupted, where.start, where.stop)).float()
                           for where in self.graph.sender_slices.values()])
        return delta.reshape(delta.shape[0], -1)

    def _copy_reads(self, copy: int) -> tuple[list[tuple[str, Callable]], Kept]:
        """Hooks that keep copy ``copy`` of a stacked pass's every ``z``, MLP output and further node type's
        activation (copied), and the :class:`~circuitkit.detect.reference.Kept` they fill: what a reference run
        keeps (:meth:`_keep`), for :meth:`_corrupted_from`."""
        B = self.batch.n_pairs
        keep = dataclasses.replace(self._keep(resid=False), input=False)  # the caller has the corrupted embeddings
        return reference_reads(keep, self.spec.n_layers, rows=slice(copy * B, (copy + 1) * B))

    def _keep(self, *, resid: bool) -> Keep:
        """What a reference run keeps (:meth:`_reference`): the input embeddings, every layer's ``z``, MLP output
        and further node type's activation, and with ``resid`` every layer's ``resid_pre`` and the final norm's
        input (at ``n_layers``)."""
        L = self.spec.n_layers
        return Keep(input=True, z=range(L), resid=range(L + 1) if resid else (),
                    mlp=() if self.adapter.attn_only else range(L),
                    nodes=tuple((kind.name, kind.hook) for kind in self.extra_types))

    def _corrupted_from(self, logits: Tensor, copy: int, embedded: Tensor, kept: Kept) -> None:
        """The corrupted run (:attr:`corrupted`) read from copy ``copy`` of a stacked pass (:meth:`folds_corrupted`):
        its logits ``[copies * pair, K, vocab]``, the corrupted prompts' ``embedded`` inputs and what
        :meth:`_copy_reads` kept."""
        B = self.batch.n_pairs
        self._corrupt = self._run_record(logits[copy * B : (copy + 1) * B], embedded, kept.z, kept.mlp, kept.nodes, {})

    def _typed_scores(self, summed: dict[tuple[str, int], Tensor], S: int) -> dict[str, Tensor]:
        """Each further node type's EAP-IG node scores ``[layer, nodes]`` (:mod:`~circuitkit.graph.nodes`) from the
        gradients at its hook summed over the ``S`` points (``[pair, pos, unit, ...]``, :func:`_add_summed`;
        divided by ``S``)."""
        real = self.batch.real.float()
        out: dict[str, Tensor] = {}
        for kind in self.extra_types:
            n = kind.count(self.spec)
            clean, values = self.clean["nodes"][kind.name], self.values_of(kind.name)
            scores = torch.zeros(self.spec.n_layers, n, device="cpu")
            for layer in range(self.spec.n_layers):
                g = summed.get((kind.name, layer))
                if g is None:
                    continue
                delta = (clean[layer] - values[layer]).float()
                per_unit = torch.einsum("bpu...,bpu...,bp->u", delta, g, real.to(g.device)).cpu()
                scores[layer].index_add_(0, groups_of(per_unit.shape[0], n), per_unit / S)
            out[kind.name] = scores
        return out

    def joint_shares(self, mlp_nodes: bool) -> tuple[Tensor, dict[str, Tensor]]:
        """Each node's share of the metric's change along the joint path from every node patched to none
        (:mod:`circuitkit.detect.joint_path`, the induction scan's ranking): every head's ``z`` (with
        ``mlp_nodes`` every MLP's output, and every further node type's units) gated between its
        :meth:`values_of` and itself, the gates' gradients of the mean metric at ``alpha = 1/3`` and ``1`` taken as
        two stacked copies of one forward and one backward pass (6 passes) and combined by the Gauss-Radau rule.
        The shares add up to about ``M(clean) - M(every node patched)``; positive: restoring the node restores the
        behaviour. Returns ``(scores [sender], {type: [layer, nodes]})`` as :meth:`node_attribution` does (0 for
        the input, and for the MLPs without ``mlp_nodes``)."""
        from circuitkit.detect.joint_path import RADAU_POINTS, gate_gradients, radau_shares

        graph, spec = self.graph, self.spec
        L = spec.n_layers
        kinds = [HEAD, *([MLP] if mlp_nodes and graph.mlps else []), *self.extra_types]
        gates, where = node_gates(kinds, {kind.name: self.values_of(kind.name) for kind in kinds}, spec)
        alphas = torch.tensor(RADAU_POINTS, dtype=torch.float64, device="cpu")
        grads = gate_gradients(self.adapter, self.batch.clean, gates, alphas,
                               lambda logits: self.metric(logits).mean(dim=-1), positions=self.positions)
        self.passes += 3.0 * len(alphas)
        shares = {kind.name: torch.zeros(L, kind.count(spec), device="cpu") for kind in kinds}
        for (name, layer), grad in zip(where, grads, strict=True):
            if grad is not None:
                shares[name][layer] = radau_shares(grad[0], grad[1])
        validate.finite_result("joint_shares", torch.cat([v.flatten() for v in shares.values()]),
                               why="the gated model's gradients overflowed")
        scores = torch.zeros(len(graph.senders), device="cpu")
        for (name, layer), senders in graph.sender_slices.items():
            if name in ("head", "mlp") and name in shares:  # MLPs where they are nodes; the input stays 0
                scores[senders] = shares[name][layer]
        return scores, {kind.name: shares[kind.name] for kind in self.extra_types}

    def node_gradients(self, steps: int, points: str = DEFAULT_IG_POINTS) -> Tensor:
        """:meth:`node_attribution`'s scores of the heads and MLPs, ``[sender]``."""
        return self.node_attribution(steps, points)[0]

    def node_attribution(self, steps: int, points: str = DEFAULT_IG_POINTS) -> tuple[Tensor, dict[str, Tensor]]:
        """Node-level EAP-IG, ``[sender]``: for each head ``(z - z_ablated) . mean_k dM/dz`` summed over pairs and
        positions (the gradient of the mean metric at the ``steps`` points of :meth:`edge_gradients`), for each
        MLP the same at its output; 0 for the input. Defined whatever follows the attention (a norm, a scale):
        what the node circuit patches is ``z`` itself. The node scores of families without edges
        (:data:`EDGES_UNDEFINED`), and of any scan that needs no edge score (``edges=False``): where a node is
        patched to its corrupted value a head's (an MLP's) score equals the sum of its edges' EAP-IG scores, which
        :meth:`attribute` adds up (the gradient at its output is the sum of the gradients at the receivers that read
        it), without their pullback to every receiver; the input's is 0 (it is no node of a node circuit). Returns
        ``(scores [sender], {type: [layer, nodes]})``, the second each further node type's scores
        (:meth:`attribute`); with :attr:`keep_node_pairs`, each pair's term in :attr:`node_pairs`, as there."""
        from circuitkit.detect.attribution import frozen_parameters

        graph, spec, batch = self.graph, self.spec, self.batch
        S, L = steps, spec.n_layers
        fold = self.folds_corrupted(S, points)  # the corrupted run read from the point alpha = 0 (attribute)
        clean_in = self.clean["input"]
        corrupt_in = self.adapter.embedded(batch.corrupted) if fold else self.corrupted["input"]
        alphas = ig_alphas(S, points).to(clean_in.device)
        start = along(corrupt_in[None], clean_in[None], alphas)
        zero = int((alphas == 0).nonzero()[0]) if fold else 0  # the copy at alpha = 0
        leaves: dict[str, Tensor] = {}
        typed: dict[tuple[str, int], Tensor] = {}

        def resid_hook(x: Tensor, hook: Any) -> Tensor:
            return start.reshape(x.shape).to(x.dtype)

        def add_leaf(kind: str) -> Callable[[Tensor, Any], Tensor]:
            def hook(x: Tensor, hook: Any) -> Tensor:  # keyed by layer: a bridge's hook.name may be an alias's target
                leaf = torch.zeros(x.shape, dtype=x.dtype, device=x.device, requires_grad=True)
                leaves[f"{kind}{HOOKS.layer_of(hook.name)}"] = leaf
                return x + leaf
            return hook

        hooks: list[tuple[str, Callable]] = [(HOOKS.resid_pre(0), resid_hook)]
        hooks += [(HOOKS.z(layer), add_leaf("z")) for layer in range(L)]
        if graph.mlps:
            hooks += [(HOOKS.mlp_out(layer), add_leaf("m")) for layer in range(L)]
        hooks += _leaf_hooks(self.extra_types, L, typed)
        read, kept = self._copy_reads(zero) if fold else ([], None)
        hooks += read
        with frozen_parameters(self.adapter.model), torch.enable_grad():
            logits = self.adapter.run(batch.clean.repeat(S, 1), hooks, positions=self.positions)
            if fold:
                self._corrupted_from(logits, zero, corrupt_in, kept)
            total = self.metric(logits).mean(-1).sum()
            names = sorted(leaves)
            keys = sorted(typed)
            grads = torch.autograd.grad(total, [leaves[n] for n in names] + [typed[k] for k in keys],
                                        allow_unused=True)
            got = dict(zip(names, grads[:len(names)], strict=True))
            typed_got = dict(zip(keys, grads[len(names):], strict=True))
        self.passes += 3.0 * S
        z_values, mlp_values = self.node_values()
        summed: dict[tuple[str, int], Tensor] = {}
        _add_summed(summed, typed_got, S)
        scores = torch.zeros(len(graph.senders), device="cpu")
        B = batch.n_pairs
        pairs = torch.zeros(len(graph.senders), B, device="cpu") if self.keep_node_pairs else None
        real = batch.real.to(clean_in.device)
        for layer in range(L):
            grad = got.get(f"z{layer}")
            if grad is not None:  # [S * pair, pos, head, d_head]
                g = grad.detach().float().view(S, -1, *grad.shape[1:]).sum(0)
                delta = (self.clean["z"][layer] - z_values[layer]).float()
                per_head = torch.einsum("bphd,bphd,bp->h", delta, g, real.float())
                for h in range(spec.n_heads):
                    scores[graph.sender_index(layer, h)] = float(per_head[h]) / S
                if pairs is not None:  # the metric is the mean over the B pairs: B times each pair's share
                    index = graph.sender_slices[("head", layer)]
                    pairs[index] = torch.einsum("bphd,bphd,bp->hb", delta, g, real.float()).cpu() * B / S
            grad = got.get(f"m{layer}")
            if grad is not None:
                g = grad.detach().float().view(S, -1, *grad.shape[1:]).sum(0)
                delta = (self.clean["mlp"][layer] - mlp_values[layer]).float()
                scores[graph.sender_index(layer, None)] = float(torch.einsum("bpm,bpm,bp->", delta, g,
                                                                             real.float())) / S
                if pairs is not None:
                    pairs[graph.sender_index(layer, None)] = (
                        torch.einsum("bpm,bpm,bp->b", delta, g, real.float()).cpu() * B / S)
        if pairs is not None:
            self.node_pairs = pairs
        return scores, self._typed_scores(summed, S)

    def _pulled_back(self, key: tuple[str, int], grad: Tensor, resid: dict[int, Tensor], steps: int) -> Tensor:
        """``[R, pair * pos * d_model]``: dM/d(receiver input) summed over the ``steps`` copies, from a gradient
        ``grad`` at a q/k/v activation ``[steps * pair, pos, R, d_head]`` (through the head's weight and the
        block's attention norm at the run's residual stream: the one pullback of both engines,
        :class:`~circuitkit.graph.pullback.ReceiverGradients`, in closed form for LayerNorm and RMSNorm) or at an
        MLP / logits input ``[steps * pair, pos, d_model]``. Float32 whatever the model's dtype."""
        d = self.spec.d_model
        channel, layer = key
        if channel == "mlp" and self.mlp_normed:  # back through the shared norm
            norm = self.norms[layer]
            x = resid[layer].detach().reshape(grad.shape).requires_grad_(True)
            with torch.enable_grad():
                (grad,) = torch.autograd.grad(norm(x), x, grad)
        if channel in ("mlp", "logits"):
            return grad.float().reshape(steps, -1).sum(0).reshape(1, -1)
        N, P, R = grad.shape[:3]  # per-query-head keys/values: already split by query head (R = H)
        W = self._receiver_weights(channel, layer).float().transpose(1, 2)  # [R, d_head, d_model]
        norm = self.norms[layer]
        x = None if norm is None else resid[layer].detach().reshape(N * P, d).float()
        if layer not in self._norm_forms:  # the norm's closed form where it agrees with autograd (graph/pullback.py)
            self._norm_forms[layer] = None if x is None else closed_form(norm, self.adapter.norm_kind, x)
        receivers = ReceiverGradients.from_parts(grad.float().permute(2, 0, 1, 3).reshape(R, N * P, -1), W, norm, x,
                                                 self._norm_forms[layer])
        return receivers.pulled().reshape(R, steps, -1).sum(1)

    def _kv_slots(self, kept: Tensor, S: int) -> tuple[dict[int, Tensor], dict[int, Tensor], int]:
        """Where each query head's keys and values are computed in a per-query-head edge pass of ``S`` circuits:
        ``(slots, heads_of, Q)``, ``slots[layer]`` ``[S, H]`` the copy of each query head, ``heads_of[layer]``
        ``[S, Q, G]`` the query head whose inputs each copy's key/value head takes, ``Q`` the copies. Query heads
        of a group whose key and value edges are the same in a circuit read the same inputs, so they share a copy:
        ``Q`` is the most distinct heads of a group in any circuit and layer (1 where a circuit treats each group as
        a whole)."""
        graph = self.graph
        G, Qf, L = graph.n_kv, graph.kv_copies, graph.n_layers
        first_heads = (torch.arange(G, device="cpu") * Qf)[None, None, :]
        missing = (~kept & graph.allowed[None]).cpu()
        slots, heads_of, most = {}, {}, 1
        for layer in range(L):
            cols = graph.receivers_of(layer)
            edges = torch.cat([missing[:, :, cols["k"]], missing[:, :, cols["v"]]], dim=1)  # [S, 2 senders, H]
            edges = edges.transpose(1, 2).reshape(S, G, Qf, -1)
            same = (edges[:, :, :, None] == edges[:, :, None, :]).all(-1)  # [S, G, Q, Q]
            first = same.to(torch.uint8).argmax(dim=2)  # the first head of its group with the same edges
            distinct = first == torch.arange(Qf)  # [S, G, Q]
            rank = distinct.long().cumsum(-1) - 1
            slots[layer] = rank.gather(2, first).reshape(S, -1)
            heads = first_heads.expand(S, Qf, G).clone()  # copies no head of a group uses: its first head's
            s, g, j = distinct.nonzero(as_tuple=True)
            heads[s, rank[s, g, j], g] = g * Qf + j
            heads_of[layer] = heads
            most = max(most, int(distinct.sum(-1).max()))
        return slots, {layer: heads[:, :most] for layer, heads in heads_of.items()}, most

    def _receiver_weights(self, channel: str, layer: int) -> Tensor:
        """``[R, d_model, d_head]``: the weight of each of ``layer``'s ``channel`` receivers (q, k, v): a key/value
        head's, repeated for each query head of its group where those have receivers of their own."""
        W = {"q": self.W_Q, "k": self.W_K, "v": self.W_V}[channel][layer]
        Q = self.graph.kv_copies
        return W if Q == 1 or channel == "q" else W.repeat_interleave(Q, dim=0)

    def _receiver_columns(self, key: tuple[str, int]) -> slice:
        """Grad leaves are keyed ``(channel, layer)`` (q, k, v, mlp; the logits at ``n_layers``), as the graph's
        receivers."""
        return self.graph.receiver_slices[key]

    def _copies_per_pass(self, node: bool) -> int:
        """Stacked copies of the pairs one pass may hold within :attr:`budget`: a node-patching or exact edge pass
        (``node``) at :func:`node_copy_bytes` a copy, an edge circuits' pass at every sender's delta a copy."""
        B, P = self.batch.clean.shape
        if node:
            K = len(self.positions)
            per_copy = node_copy_bytes(self.adapter, B, P, K, K if self.scored_metric or self.every_position_metric
                                       else 1)
        else:
            per_copy = B * P * self.spec.d_model * 4 * len(self.graph.senders)
        return copies_per_pass(per_copy, self.budget, max_copies=MAX_COPIES)

    def _edge_pass(self, S: int, kept: Tensor | None, start: Tensor | None,
                   grads: dict[tuple[str, int], Tensor] | None, resid: dict[int, Tensor] | None = None,
                   node_leaves: dict[tuple[str, int], Tensor] | None = None,
                   read: list[tuple[str, Callable]] | None = None,
                   by_head: dict[tuple[str, int], Tensor] | None = None,
                   local: tuple[LocalMetric, list[Tensor]] | None = None) -> tuple[Tensor, int]:
        """One stacked pass of ``S`` copies: the logits of each and how many copies of each ran side by side (1, or
        with per-query-head key/value edges ``Q`` below). ``kept``: edge masks (patching) or None (every edge
        clean); ``start``: the residual stream entering layer 0 per copy (IG points) or None; ``grads``: filled with
        zero leaves added at every receiver (attribution: q/k/v activations, MLP inputs, the logits' input);
        ``resid``: filled with each layer's ``resid_pre``; ``node_leaves``: filled with zero leaves at the further
        node types' hooks (their node scores); ``read``: hooks that only read, run after the pass's own
        (:meth:`_copy_reads`); ``by_head`` (attribution with per-query-head key/value receivers): filled with each
        layer's pattern ``("pattern", layer)`` and ``z`` ``("z", layer)`` as the pass computes on them, through which
        the caller splits a key/value leaf's gradient by query head; ``local`` (attribution): ``(reader, scores)``,
        every head's ``z`` detached and ``reader`` of each layer's pattern appended to ``scores``
        (:meth:`attribute`'s ``local``).

        Patching with per-query-head key/value receivers on a grouped-query model runs each copy as ``Q``
        side-by-side copies of its pairs (:meth:`_kv_slots`): in copy ``c`` every key/value head takes the keys and
        values of one query head of its group (its own patch), and at ``hook_z`` every copy takes each query
        head's ``z`` from the copy that computed it with its own keys and values, so that the residual streams stay
        equal across the copies and every head of the model's own attention (rotary, norms, masks) sees exactly
        its patched inputs. The metric is read on the first copy. Attribution needs no such copies: its forward
        values are the same for every query head, only the gradients are split (``by_head``)."""
        spec, graph, batch = self.spec, self.graph, self.batch
        B, P = batch.clean.shape
        d = spec.d_model
        split = graph.kv_copies > 1 and kept is not None
        slots, heads_of, Q = self._kv_slots(kept, S) if split else ({}, {}, 1)

        def each(x: Tensor) -> Tensor:
            """``[S * B, ...]`` -> ``[Q * S * B, ...]``: the same value in every key/value copy."""
            return x if Q == 1 else x.repeat(Q, *([1] * (x.dim() - 1)))

        def copy0(x: Tensor) -> Tensor:
            """``[Q * S * B, ...]`` -> the first key/value copy's ``[S * B, ...]`` (every copy holds its value)."""
            return x if Q == 1 else x[: x.shape[0] // Q]
        corrupted = self.corrupted if kept is not None else None
        # every sender's (corrupted - current) output ``[S, sender, B * P * d]`` (copy-major, so that each copy's
        # sum over senders is one matrix product over a prefix view), filled in as the pass reaches it
        like = None if corrupted is None else corrupted["input"]
        deltas = None if like is None else torch.zeros(S, len(graph.senders), B * P * d, dtype=like.dtype,
                                                        device=like.device)
        reached = [0]  # one past the last sender index recorded (senders are in layer order)
        total = [None]  # [S, B * P * d]: the sum of every recorded sender's delta
        resid = {} if resid is None else resid
        missing = None if kept is None else (~kept & graph.allowed[None])
        kept_f = None if kept is None else kept.to(like.dtype)
        attention_patch: dict[int, Tensor | None] = {}  # layer -> [S, R_qkv, B, P, d], computed at its q hook

        def record(first: int, current: Tensor) -> None:
            """``current`` ``[n, S, B, P, d]``: the outputs of the ``n`` senders from index ``first`` on, their
            deltas written as one block (a layer's heads together). The total adds them one sender at a time, in
            sender order: the same sums, bit for bit, as recording each sender alone."""
            if deltas is not None:
                n = current.shape[0]
                corrupt_out = self.outputs(corrupted, first, first + n)
                block = (corrupt_out[:, None] - current).transpose(0, 1).reshape(S, n, -1)
                deltas[:, first : first + n] = block
                for j in range(n):
                    total[0] = block[:, j].clone() if total[0] is None else total[0] + block[:, j]
                reached[0] = max(reached[0], first + n)

        L = spec.n_layers
        gathered: list[Tensor | None] = [None]  # one buffer for every gather of the pass (see weighted)

        def weighted(senders: Tensor | slice, weights: Tensor) -> Tensor:
            """``[S, R, B, P, d]``: per copy, ``weights[s]^T @ deltas[s, senders]`` (``weights``: [S, U, R])."""
            if isinstance(senders, Tensor):
                # the masks are decided on the CPU; a blocking copy from pageable memory would wait for the GPU's
                # queue
                senders = senders.to(deltas.device, non_blocking=True)
                # Gathered into one buffer the pass reuses: a fresh tensor of this size is new memory each time,
                # which on a CPU is paged in at 2-3x the cost of the copy itself. At most half the senders are
                # gathered (``over``), what a fresh tensor took at that moment.
                need = S * senders.numel() * deltas.shape[2]
                if gathered[0] is None or gathered[0].numel() < need:
                    gathered[0] = None
                    gathered[0] = torch.empty(need, dtype=deltas.dtype, device=deltas.device)
                chosen = torch.index_select(deltas, 1, senders, out=gathered[0][:need].view(S, -1, deltas.shape[2]))
            else:
                chosen = deltas[:, senders]  # a view of a prefix
            weights = weights.transpose(1, 2).to(chosen.dtype).to(chosen.device, non_blocking=True)
            out = torch.bmm(weights, chosen)  # [S, R, BPd]
            return out.view(S, -1, B, P, d)

        def patch_for(cols: slice) -> Tensor | None:
            """``[S, R, B, P, d]``: the summed deltas of the missing edges into receivers ``cols``. Computed over
            the fewer of two sender sets: those with a missing edge into ``cols``, or (where every recorded sender
            may feed ``cols``) those with a kept edge, subtracted from the total."""
            if missing is None or reached[0] == 0:
                return None
            upto = reached[0]
            R = cols.stop - cols.start

            def over(rows: Tensor, weights: Tensor) -> Tensor:
                """``weighted`` over the senders ``rows`` (those with a nonzero weight in ``weights`` ``[S, upto,
                R]``): where they are more than half the prefix, over the whole prefix as a view (zero weights
                elsewhere), since a gather would read and write most of it once more."""
                if len(rows) > upto // 2:
                    return weighted(slice(0, upto), weights)
                return weighted(rows, weights[:, rows])

            miss = missing[:, :upto, cols]  # [S, sender so far, R]
            by_missing = miss.any(dim=(0, 2)).nonzero().flatten()
            if bool(graph.allowed[:upto, cols].all()):
                keep = kept_f[:, :upto, cols]
                by_kept = keep.any(dim=2).any(dim=0).nonzero().flatten()
                if len(by_kept) < len(by_missing):
                    out = total[0].view(S, 1, B, P, d).expand(S, R, B, P, d)
                    return out if len(by_kept) == 0 else out - over(by_kept, keep)
            if len(by_missing) == 0:
                return torch.zeros(S, R, B, P, d, dtype=deltas.dtype, device=deltas.device)
            return over(by_missing, miss)

        def leaf(key: tuple[str, int], shape: tuple[int, ...], like: Tensor) -> Tensor | None:
            if grads is None:
                return None
            e = torch.zeros(shape, dtype=like.dtype, device=like.device, requires_grad=True)
            grads[key] = e
            return e

        def resid_hook(x: Tensor, hook: Any) -> Tensor:
            layer = HOOKS.layer_of(hook.name)
            if layer == 0:
                if start is not None:
                    x = each(start.to(x.dtype))
                record(0, copy0(x).reshape(1, S, B, P, d))
            resid[layer] = copy0(x)
            return x

        def channel_hook(name: str) -> Callable[[Tensor, Any], Tensor]:
            def hook(act: Tensor, hook: Any) -> Tensor:
                layer = HOOKS.layer_of(hook.name)
                receivers = graph.receivers_of(layer)
                cols = receivers[name]
                R = cols.stop - cols.start
                r = resid[layer].view(S, B, P, d)
                if grads is not None:  # dM/d(act) here; pulled back to each receiver's input after the backward
                    return act + leaf((name, layer), tuple(act.shape), act)
                if layer not in attention_patch:  # q, k and v of a layer read the same senders: one product
                    attention_patch[layer] = patch_for(slice(receivers["q"].start, receivers["v"].stop))
                both = attention_patch[layer]
                if both is None:
                    return act
                first = receivers["q"].start
                extra = both[:, cols.start - first : cols.stop - first]
                x = r[:, None].expand(S, R, B, P, d) + extra
                norm = self.norms[layer]
                if norm is not None:
                    inc = norm(x.reshape(-1, P, d)).reshape(S, R, B, P, -1) - norm(r.reshape(-1, P, d)).reshape(
                        S, 1, B, P, -1)
                else:
                    inc = x - r[:, None]
                W = self._receiver_weights(name, layer).to(inc.dtype)  # [R, d_model, d_head]
                add = torch.einsum("srbpm,rmd->sbprd", inc, W)
                if split and name == "q":
                    add = each(add.reshape(copy0(act).shape))
                elif split:  # copy c's key/value head g: the keys/values of the query head heads_of[c, g]
                    chosen = heads_of[layer].to(add.device)  # [S, Q, G]
                    add = add.permute(0, 3, 1, 2, 4)[torch.arange(S, device=add.device)[:, None, None], chosen]
                    add = add.permute(1, 0, 3, 4, 2, 5)  # [Q, S, B, P, G, d_head]
                return act + add.reshape(act.shape).to(act.dtype)

            return hook

        def z_hook(z: Tensor, hook: Any) -> Tensor | None:
            # the layer's q/k/v patch is read by its q, k and v hooks alone, all called before its z
            attention_patch.pop(HOOKS.layer_of(hook.name), None)
            if split:  # each query head's z from the copy that computed its keys and values, in every copy
                at = slots[HOOKS.layer_of(hook.name)].to(z.device)  # [S, H]
                view = z.reshape(Q, S, B, P, *z.shape[2:])
                own = torch.gather(view, 0, at[None, :, None, None, :, None].expand(1, S, B, P, *z.shape[2:]))
                z = each(own.reshape(S * B, P, *z.shape[2:]))
            if corrupted is not None:
                layer = HOOKS.layer_of(hook.name)
                head_out = torch.einsum("bphd,hdm->hbpm", copy0(z), self.W_O[layer].to(z.dtype))
                record(graph.sender_index(layer, 0), head_out.reshape(spec.n_heads, S, B, P, d))
            if by_head is not None:  # the pass computes on the returned copy: the split differentiates through it
                z = by_head[("z", HOOKS.layer_of(hook.name))] = z.clone()
                return z.detach() if local is not None else z
            if local is not None:  # a receiver's own score: nothing downstream of a head's output
                return z.detach()
            return z if split else None

        def pattern_hook(pattern: Tensor, hook: Any) -> Tensor:
            pattern = by_head[("pattern", HOOKS.layer_of(hook.name))] = pattern.clone()
            return pattern

        def local_hook(pattern: Tensor, hook: Any) -> None:  # after pattern_hook: reads what the split reads
            reader, scores = local
            heads_first = pattern.float().transpose(0, 1).unflatten(1, (S, B))  # [head, copy, pair, q, k]
            scores.append(reader(heads_first).sum())

        def mlp_in_hook(x: Tensor, hook: Any) -> Tensor:
            layer = HOOKS.layer_of(hook.name)
            cols = graph.receivers_of(layer)["mlp"]
            extra = patch_for(cols)
            e = leaf(("mlp", layer), (S, B, P, d), x)
            one = copy0(x).shape
            if extra is not None:
                if self.mlp_normed:  # x = ln1(resid_pre): rebuilt through that norm
                    r = resid[layer]
                    norm = self.norms[layer]
                    x = x + each((norm(r + extra[:, 0].reshape(r.shape)) - norm(r)).to(x.dtype))
                else:
                    x = x + each(extra[:, 0].reshape(one))
            if e is not None:
                x = x + each(e.reshape(one))
            return x

        def mlp_out_hook(x: Tensor, hook: Any) -> None:
            record(graph.sender_index(HOOKS.layer_of(hook.name), None), copy0(x).reshape(1, S, B, P, d))

        def final_hook(x: Tensor, hook: Any) -> Tensor:
            cols = slice(graph.logits_index, graph.logits_index + 1)
            extra = patch_for(cols)
            e = leaf(("logits", spec.n_layers), (S, B, P, d), x)
            one = copy0(x).shape
            if extra is not None:
                x = x + each(extra[:, 0].reshape(one))
            if e is not None:
                x = x + each(e.reshape(one))
            return x

        hooks: list[tuple[str, Callable]] = []
        for layer in range(L):
            hooks.append((HOOKS.resid_pre(layer), resid_hook))
            hooks += [(port.hook(layer), channel_hook(port.channel)) for port in HEAD.ports]
            if by_head is not None:
                hooks.append((HOOKS.pattern(layer), pattern_hook))
            if local is not None:
                hooks.append((HOOKS.pattern(layer), local_hook))
            hooks.append((HOOKS.z(layer), z_hook))
            if graph.mlps:
                hooks += [(self.mlp_in(layer), mlp_in_hook), (HOOKS.mlp_out(layer), mlp_out_hook)]
        hooks.append((HOOKS.resid_post(L - 1), final_hook))
        if node_leaves is not None:
            hooks += _leaf_hooks(self.extra_types, L, node_leaves, Q)
        hooks += read or []
        return copy0(self.adapter.run(batch.clean.repeat(Q * S, 1), hooks, positions=self.positions)), Q


def _rows_of(x: Tensor, copies: int, pairs: int, rows: slice) -> Tensor:
    """``x`` ``[copies * pairs, ...]`` (or ``[copies, pairs, ...]``: the MLPs' and the logits' leaves) at the pairs
    ``rows`` of every copy, in the same layout (itself where ``rows`` are all the pairs)."""
    if rows.start == 0 and rows.stop >= pairs:
        return x
    if x.shape[0] == copies * pairs:
        return x.unflatten(0, (copies, pairs))[:, rows].flatten(0, 1)
    return x[:, rows]


def _run_rows(run: dict[str, Any], rows: slice) -> dict[str, Any]:
    """A run's senders' activations (its input, ``z`` and MLP outputs) at the pairs ``rows``."""
    return {"input": run["input"][rows], "z": {k: v[rows] for k, v in run["z"].items()},
            "mlp": {k: v[rows] for k, v in run["mlp"].items()}}


def _given_run(embedded: Tensor, z: dict[int, Tensor], mlp: dict[int, Tensor], nodes: dict[str, dict[int, Tensor]]
               ) -> dict[str, Any]:
    """A run record (:attr:`TaskRunner.clean`'s keys) that no pass of the runner made: its senders' activations
    only, no metric, logits or direct logit attribution."""
    return {"input": embedded, "z": dict(z), "mlp": mlp, "nodes": nodes, "metric": None, "logprobs": None,
            "dla": None, "resid": {}}


def _frozen_scale_pullback(grad_normalized: Tensor, scale: Tensor, kind: str) -> Tensor:
    """d(metric)/d(final residual) through the final norm with its scale ``s`` frozen at the clean run's: the norm is
    then linear, ``y = gamma * center(x) / s + beta`` (LayerNorm; RMSNorm without the centring), so the gradient is
    ``center(g) / s`` with ``g`` the gradient at the normalised vector ``center(x) / s`` (``hook_normalized``, before
    ``gamma``), read from the backward pass rather than from the norm's weights (some families have none)."""
    g = grad_normalized.float()
    if kind.startswith("LN"):
        g = g - g.mean(-1, keepdim=True)
    return g / scale.float()


def _has_hook(adapter: ModelAdapter, name: str) -> bool:
    hook_dict = getattr(adapter.model, "hook_dict", None)
    return isinstance(hook_dict, dict) and name in hook_dict


def mlp_input_hook(adapter: ModelAdapter) -> Callable[[int], str]:
    """Where an MLP receiver's input is rebuilt: before the MLP's own norm (:meth:`HOOKS.mlp_in`) where the model has
    one, else, in parallel blocks that share ``ln1``, after it (:meth:`HOOKS.mlp_normed_in`)."""
    hook_dict = getattr(adapter.model, "hook_dict", None)
    if not isinstance(hook_dict, dict) or HOOKS.mlp_in(0) in hook_dict:
        return HOOKS.mlp_in
    if build_graph(adapter, mlps=True).parallel and HOOKS.mlp_normed_in(0) in hook_dict:
        return HOOKS.mlp_normed_in
    raise CircuitkitError(
        f"task circuit: {type(adapter.model).__name__} has no hook point {HOOKS.mlp_in(0)!r} (an MLP's input before "
        "its norm); expected it, or parallel attention and MLP sharing ln1. Pass mlps=False for a graph of heads only."
    )


def _add_summed(summed: dict[tuple[str, int], Tensor], got: dict[tuple[str, int], Tensor | None], n: int) -> None:
    """Add to ``summed`` each gradient of ``got`` (``[n * pair, ...]``, ``n`` points stacked) summed over its
    points, ``[pair, ...]`` float32."""
    for key, grad in got.items():
        if grad is not None:
            g = grad.detach().float().view(n, -1, *grad.shape[1:]).sum(0)
            summed[key] = g if key not in summed else summed[key] + g


def _leaf_hooks(kinds: tuple[NodeType, ...], L: int, leaves: dict[tuple[str, int], Tensor],
                copies: int = 1) -> list[tuple[str, Callable]]:
    """Hooks adding a zero leaf (recorded in ``leaves`` by ``(type, layer)``) at every layer's hook of ``kinds``;
    with ``copies``, one leaf the size of the first of that many equal copies of the batch, added to each."""
    def add(name: str) -> Callable[[Tensor, Any], Tensor]:
        def hook(x: Tensor, hook: Any) -> Tensor:  # keyed by layer: a bridge's hook.name may be an alias's target
            leaf = torch.zeros((x.shape[0] // copies, *x.shape[1:]), dtype=x.dtype, device=x.device,
                               requires_grad=True)
            leaves[(name, HOOKS.layer_of(hook.name))] = leaf
            return x + (leaf if copies == 1 else leaf.repeat(copies, *([1] * (x.dim() - 1))))
        return hook

    return [(kind.hook(layer), add(kind.name)) for kind in kinds for layer in range(L)]


def _node_types(adapter: ModelAdapter, extra: tuple[NodeType, ...]) -> dict[str, NodeType]:
    """The node types a node circuit of ``adapter``'s model may patch, by name: heads, MLPs (where the model has
    them), then ``extra`` (checked: :class:`NodeType` records with distinct names and hooks the model has)."""
    types = {HEAD.name: HEAD} | ({} if adapter.attn_only else {MLP.name: MLP})
    hook_dict = getattr(adapter.model, "hook_dict", None)
    for kind in extra:
        if not isinstance(kind, NodeType) or kind.hook is None:
            raise validate.fail("task circuit: node_types", kind, "NodeType records with a hook "
                                "(circuitkit.graph.nodes, e.g. neuron_groups(8))")
        if kind.name in types or kind.name in ("input", "logits"):
            raise validate.fail("task circuit: node_types", kind.name, f"a name other than {sorted(types)} and "
                                "'input', 'logits' (each node type once)")
        if isinstance(hook_dict, dict) and kind.hook(0) not in hook_dict:
            raise CircuitkitError(f"task circuit: node type {kind.name!r} reads hook point {kind.hook(0)!r}, which "
                                  f"{type(adapter.model).__name__} does not have; expected a model with it (an MLP's "
                                  "neurons need a model with MLPs).")
        count = kind.count(adapter.spec)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise validate.fail(f"task circuit: node type {kind.name!r}: nodes per layer", count, "an int >= 1")
        types[kind.name] = kind
    return types


def _check_units(kind: NodeType, acts: dict[int, Tensor], spec: Any) -> None:
    """Every layer's activation of ``kind`` has at least one unit per node along its third axis."""
    n = kind.count(spec)
    for layer, x in acts.items():
        if x.dim() < 3 or x.shape[2] < n:
            raise CircuitkitError(
                f"task circuit: node type {kind.name!r}: layer {layer}'s activation at {kind.hook(layer)!r} has shape "
                f"{tuple(x.shape)}; expected [batch, pos, units, ...] with at least {n} units (one per node): ask "
                "for fewer nodes per layer.")


def check_hooks(adapter: ModelAdapter, mlps: bool) -> None:
    """Refuse a model without the hook points edge patching needs (named in the error)."""
    hook_dict = getattr(adapter.model, "hook_dict", None)
    names = [HOOKS.resid_post(adapter.spec.n_layers - 1)]
    if mlps:
        names += ([mlp_input_hook(adapter)(0)] if adapter.additive_heads else []) + [HOOKS.mlp_out(0)]
    if isinstance(hook_dict, dict):
        absent = [n for n in names if n not in hook_dict]
        if absent:
            raise CircuitkitError(
                f"task circuit: {type(adapter.model).__name__} has no hook points {absent}; expected a "
                "TransformerBridge, an AttentionOnlyModel, or a model with TransformerLens hook names."
            )


__all__ = ["DEFAULT_IG_POINTS", "EDGES_UNDEFINED", "IG_POINTS", "Graph", "TaskRunner", "build_graph", "check_hooks",
           "ig_alphas", "mlp_input_hook"]
