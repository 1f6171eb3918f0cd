"""A memory plan for task scans: refuse, before any pass, a scan whose estimated peak exceeds the device's free memory.

The task engine (:class:`~circuitkit.graph.runner.TaskRunner`) holds, with ``N`` pairs of ``P`` tokens, ``L``
layers, ``H`` query heads, ``G`` key/value heads of width ``d_head``, ``d`` = d_model, ``m`` = d_mlp (0 without
MLPs), ``V`` = d_vocab, ``S`` = EAP-IG steps, ``U = 1 + L H (+ L with MLP nodes)`` senders, ``e`` the model's bytes
per element (4 float32, 2 bfloat16/float16), ``K`` the positions whose logits a pass computes (each prompt's last
position where the model unembeds only there, else all ``P``); every count in bytes:

**Held from the first pass to the last** (``resident``)

- head weights: the float32 copy of ``W_Q, W_K, W_V, W_O`` the runner makes, ``4 L d d_head (2H + 2G)``;
- the two reference runs (clean, corrupted): the input embeddings and each layer's ``z`` and MLP output,
  ``2 N P (d + L (H d_head + d)) e`` (a head's output ``z @ W_O`` is formed where a pass reads it, not kept:
  :meth:`~circuitkit.graph.runner.TaskRunner.outputs`).

**Then the largest of these, one at a time** (``stage``)

- reference run: every sender's output, formed once for direct logit attribution, ``U N P d e``, and its logits,
  ``N V (K e + 8)`` (``K`` positions in the model's dtype, each pair's last one in float32 for the metric; a metric
  of scored positions reads all ``K`` in float32, ``N V K (e + 8)``, and so in every pass below);
- EAP-IG pass (``S`` copies of the pairs, forward and backward with gradients at every receiver): the inputs
  ``S N P d e``; per copy, token and layer what autograd keeps and the backward adds (fitted to the profiled
  allocations of this engine: norms in float32, q/k/v, attention scores, the MLP's four ``m``-wide tensors),
  ``S N P L ((4 d + (H + 2G) d_head + 4.5 m + 3 H P) e + 8 d)``; logits and their gradient ``2 S N V (K e + 4)``;
  with per-query-head key/value receivers each layer's pattern and ``z`` kept for the split of a group's gradient
  by query head, and their gradients, ``S N P L (2 H P + H d_head) e``;
- EAP-IG pull-back: the float32 difference of the runs' sender outputs ``4 U N P d``, the receivers' leaves and
  gradients ``2 S N P (L ((H + 2G) d_head + d) + d) e`` (per query head: ``3 H`` for ``H + 2G``), and a layer's
  query cotangents pulled back through the attention norm, ``[H, S N, P, d]`` float32 with the norm's own buffers,
  ``32 H S N P d``;
- edge patching (``C`` stacked copies: as many as the sender budget allows (:func:`~circuitkit.graph.runner.
  sender_budget`: :data:`~circuitkit.graph.runner.SENDER_BUDGET` on the CPU, more on a GPU with room), at most 32
  and at most the most circuits one call measures, ``max(len(EDGE_FRACTIONS), N_EXACT_EDGES)``): every sender's
  delta ``C U N P d e``, the senders one receiver layer's patch gathers (at most half of them, into one buffer the
  pass reuses) ``C (U / 2) N P d e``, one layer's summed q/k/v patch ``C (H + 2G) N P d e``, its rebuilt query inputs
  through the norm ``12 C H N P d``, the MLP's transient ``1.1 C N P m e``, logits ``C N V (K e + 8)``;
- node patching (one circuit a pass): ``N P (3 m + 4 d + 3 H P) e + N V (K e + 8)``, the bytes of one stacked copy
  of the pairs (:func:`~circuitkit.graph.runner.node_copy_bytes`, by which the runner sizes its stacked copies: as
  many as the sender budget holds, at most 32);
- the exact edge effects (one edge a stacked copy, :func:`~circuitkit.graph.edge_patch.patched_edges`; ``C_1``
  copies, stacked as node patching's, at most :data:`~circuitkit.tasks.circuit.N_EXACT_EDGES`): per copy a
  node-patching pass and the edge's delta with its increments through the norm, ``N P (3 m + 8 d + 3 H P) e +
  N V (K e + 8)``.

**Further node types** (neuron groups, a user's type), each capturing an activation ``w`` wide per token and layer
(:func:`node_widths`: ``m`` for the MLP's neurons): both reference runs keep it, ``2 N P L w e`` (resident), and
EAP-IG's node attribution adds a zero leaf to it, differentiates against it and holds the sum autograd keeps,
``3 S N P L w e`` (in the EAP-IG pass).

With ``N_e`` of the pairs held out for evaluation, ``N`` above is the others (attribution runs on them), and one
stage more counts: the held-out runner's own runs ``2 N_e P (d + L (H d_head + d)) e`` beside the first's,
plus the largest of its reference run and the patching passes on either set after the search (node patching with
as many stacked circuits as the runner stacks, above; edge patching as above), on ``max(N, N_e)`` pairs.

The estimate is ``MARGIN * (resident + the largest stage) + FIXED``. :data:`MARGIN` and :data:`FIXED` cover what
the closed form leaves out (the allocator's rounding and caching, the model's own temporaries, library buffers);
measured figures and their ratios to this estimate are in ``benchmarks/README.md``. The weights are not counted:
the check compares with the memory free now, after they were loaded. :func:`check_task_memory` raises one
:class:`~circuitkit.CircuitkitError` line naming the estimate, its largest parts and a number of pairs that fits
(found by bisection on the same estimate, which never falls as pairs are added).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from circuitkit import validate
from circuitkit.device_memory import available_memory, size_text
from circuitkit.errors import CircuitkitError
from circuitkit.graph.nodes import KV_EDGES
from circuitkit.graph.runner import MAX_COPIES, SENDER_BUDGET, element_bytes, mlp_width, node_copy_bytes, sender_budget
from circuitkit.pass_budget import copies_per_pass
from circuitkit.tasks.circuit import EDGE_FRACTIONS, N_EXACT_EDGES

MARGIN = 1.35
"""The sum of the parts times this is the estimate. Measured (``benchmarks/README.md``, ``benchmarks/task_memory.py``):
the peak was 1.11 to 1.15 times the sum on an H200 (``max_memory_allocated`` less the weights; Llama-3.2-1B and
3.1-8B shapes, float32 and bfloat16) and 0.77 to 1.30 times it on a CPU (the rise of the peak resident set, and
the live tensors' peak; three small shapes, the largest ratio a bfloat16 model's resident set)."""
FIXED = 128 * 2**20
"""Added to the estimate: allocator and library buffers that do not grow with the scan (on the CPU the resident
set rose 40 to 230 MiB above the live tensors' peak, a share that matters only for small scans)."""
FLOAT_BYTES = 4
MAX_SETS = max(len(EDGE_FRACTIONS), N_EXACT_EDGES)
"""Most circuits one call of the edge search measures together (the curve, or the single-edge effects)."""
MAX_STEPS = 64

__all__ = ["FIXED", "MARGIN", "TaskMemoryEstimate", "check_task_memory", "estimate_task_memory", "node_widths"]


@dataclass(frozen=True)
class TaskMemoryEstimate:
    """A task scan's estimated peak, in bytes: ``resident`` parts (held throughout) and ``stages`` (the largest
    counts), by name (module docstring); ``total`` = :data:`MARGIN` times their sum plus :data:`FIXED`."""

    n_pairs: int
    pos: int
    steps: int
    resident: dict[str, int]
    stages: dict[str, int]
    budget: int = SENDER_BUDGET
    """The sender budget the estimate counts the stacked copies with (:func:`~circuitkit.graph.runner.sender_budget`):
    what the scan's runners then use."""

    @property
    def stage(self) -> str:
        """The stage at the peak."""
        return max(self.stages, key=lambda k: self.stages[k])

    @property
    def total(self) -> int:
        return int(MARGIN * (sum(self.resident.values()) + self.stages[self.stage])) + FIXED

    def parts(self) -> str:
        named = {**self.resident, self.stage: self.stages[self.stage]}
        ranked = sorted(((v, k) for k, v in named.items() if v), reverse=True)
        return ", ".join(f"{k} {size_text(v)}" for v, k in ranked[:3])


def _adapter(model: Any, device: Any = None) -> Any:
    from circuitkit.models.adapters import ModelAdapter, adapt

    return model if isinstance(model, ModelAdapter) else adapt(model, device, place_model=False)


def node_widths(adapter: Any, node_types: Any) -> tuple[int, ...]:
    """Each further node type's activation width per token and layer, from the hook it reads: ``d_mlp`` for the MLP's
    hidden activation (neurons), ``H d_head`` for ``hook_z``, ``d_model`` for a residual stream, the MLP's or the
    attention's output, and ``max(d_model, d_mlp)`` for a hook this list does not name (the widest activation a
    block of these models writes). Anything but a node type with a hook counts 0 (the runner refuses it)."""
    from circuitkit.graph.nodes import NodeType
    from circuitkit.models.adapters import HOOKS

    spec = adapter.spec
    d, m = spec.d_model, mlp_width(adapter)
    known = {HOOKS.mlp_post(0): m, HOOKS.z(0): spec.n_heads * spec.d_head}
    known.update({hook(0): d for hook in (HOOKS.resid_pre, HOOKS.resid_post, HOOKS.mlp_out, HOOKS.attn_out,
                                          HOOKS.mlp_in, HOOKS.mlp_normed_in)})
    return tuple(known.get(kind.hook(0), max(d, m)) if isinstance(kind, NodeType) and kind.hook is not None else 0
                 for kind in node_types)


def logit_positions(adapter: Any, last: torch.Tensor, pos: int, scored: torch.Tensor | None = None) -> int:
    """How many positions' logits a pass of the task computes: the distinct last positions ``last`` (and, for a
    metric of scored positions, every position ``scored`` ``[pair, pos]`` marks) where the model unembeds only
    there (Hugging Face causal LMs), else all ``pos``."""
    read = last.detach().cpu()
    if scored is not None:
        read = torch.cat([read, scored.detach().cpu().any(0).nonzero().flatten()])
    positions = torch.unique(read)
    return len(positions) if adapter._keep_kwargs(positions) else pos


def estimate_task_memory(model: Any, n_pairs: int, pos: int, *, steps: int, mlps: bool, edges: bool,
                         evaluation_pairs: int = 0, logit_positions: int | None = None,
                         scored_metric: bool = False, device: Any = None,
                         kv_edges: str = "grouped", node_widths: tuple[int, ...] = (),
                         budget: int = SENDER_BUDGET) -> TaskMemoryEstimate:
    """The estimated peak memory of :func:`~circuitkit.tasks.scan_task` on ``model`` (a model or a
    ``ModelAdapter``) for ``n_pairs`` pairs of ``pos`` tokens (module docstring): ``steps`` EAP-IG points, MLPs as
    graph nodes (``mlps``), the edge circuit measured (``edges``), ``evaluation_pairs`` of the pairs held out
    (attribution runs on the others), logits at ``logit_positions`` positions (None: all ``pos``), the metric read
    in float32 at each pair's last position or, with ``scored_metric``, at all of them; ``kv_edges`` the edge graph's
    key/value receivers (``"per-query-head"``: an edge pass runs up to ``H / G`` copies of the pairs side by side,
    each with ``3 H`` query/key/value patches a layer, so the edge stage is counted ``H / G`` times with ``3 H`` for
    ``H + 2 G``: an upper bound; EAP-IG runs one copy a point and keeps each layer's pattern and ``z`` for the split
    of a group's gradient by query head, with their gradients, ``S N P L (2 H P + H d_head) e`` more, and its
    key/value gradients per query head); ``node_widths`` the further node types' activation widths
    (:func:`node_widths`); ``budget`` the bytes of stacked sender deltas a patching pass may hold (the runners'
    ``budget``). Python ints throughout: no overflow for any size."""
    per_query = validate.option("estimate_task_memory: kv_edges", kv_edges, KV_EDGES) == "per-query-head"
    n_pairs = validate.positive_int("estimate_task_memory: n_pairs", n_pairs)
    pos = validate.positive_int("estimate_task_memory: pos", pos)
    steps = validate.integer("estimate_task_memory: steps", steps, minimum=1, maximum=MAX_STEPS)
    budget = validate.integer("estimate_task_memory: budget", budget, minimum=1)
    mlps = validate.boolean("estimate_task_memory: mlps", mlps)
    edges = validate.boolean("estimate_task_memory: edges", edges)
    held = validate.integer("estimate_task_memory: evaluation_pairs", evaluation_pairs, minimum=0,
                            maximum=n_pairs - 1)
    K = pos if logit_positions is None else validate.integer(
        "estimate_task_memory: logit_positions", logit_positions, minimum=1, maximum=pos)
    widths = [validate.integer("estimate_task_memory: node_widths", w, minimum=0)
              for w in validate.bounded_list("estimate_task_memory: node_widths", node_widths, 16, "a list of widths")]
    adapter = _adapter(model, device)
    spec = adapter.spec
    L, H, G, d, dh, V = spec.n_layers, spec.n_heads, spec.n_kv_heads, spec.d_model, spec.d_head, spec.d_vocab
    m = mlp_width(adapter)
    e = element_bytes(adapter.model)
    F = FLOAT_BYTES
    R = K if validate.boolean("estimate_task_memory: scored_metric", scored_metric) else 1  # float32 metric reads
    P, S = pos, steps
    U = 1 + L * H + (L if mlps else 0)
    mlp_out = d if m else 0

    W = sum(widths)

    def outputs(N: int) -> int:  # the two runs' input embeddings, z, MLP outputs and further node types' activations
        return 2 * N * P * (d + L * (H * dh + mlp_out + W)) * e

    def reference(N: int) -> int:
        return U * N * P * d * e + N * V * (K * e + 2 * F * R)

    def node_patching(N: int, copies: int) -> int:  # N P (3 m + 4 d + 3 H P) e + N V (K e + 2 F R) a copy
        return copies * node_copy_bytes(adapter, N, P, K, R)

    def node_copies(N: int, most: int = MAX_COPIES) -> int:  # as the runner stacks them (TaskRunner._copies_per_pass)
        return copies_per_pass(node_copy_bytes(adapter, N, P, K, R), budget, max_copies=most)

    group, receivers = (H // G, 3 * H) if per_query and G < H else (1, H + 2 * G)

    def exact_edges(N: int) -> int:  # a node-patching pass a copy, with the edge's delta and its increments
        C = node_copies(N, min(MAX_COPIES, N_EXACT_EDGES))
        return node_patching(N, C) + C * 4 * N * P * d * e

    def edge_patching(N: int) -> int:
        C = copies_per_pass(N * P * d * F * U, budget, max_copies=min(MAX_COPIES, MAX_SETS))
        return group * (C * N * P * ((U + U // 2 + receivers) * d * e + 3 * F * H * d + (11 * m * e) // 10)
                        + C * N * V * (K * e + 2 * F * R))

    N = n_pairs - held  # the pairs attribution runs on
    # per-query-head receivers: EAP-IG keeps each layer's pattern and z for the split by query head and takes the
    # pattern's and z's gradients (2 H P + H d_head a token and layer); its key/value gradients are per query head
    split = S * N * P * L * (2 * H * P + H * dh) * e if group > 1 else 0
    resident = {"head weights": F * L * d * dh * (2 * H + 2 * G), "reference runs": outputs(N)}
    stages = {
        "reference run": reference(N),
        "EAP-IG pass": S * N * P * d * e
        + S * N * P * L * ((4 * d + (H + 2 * G) * dh + 3 * H * P) * e + (9 * m * e) // 2 + 2 * d * F)
        + 2 * S * N * V * (K * e + F * R) + 3 * S * N * P * L * W * e + split,
        "EAP-IG pull-back": F * U * N * P * d + 2 * S * N * P * (L * ((H + 2 * G * group) * dh + d) + d) * e
        + 8 * F * H * S * N * P * d,
        "node patching": node_patching(N, 1),
    }
    if edges:
        stages["edge patching"] = edge_patching(N)
        stages["exact edge effects"] = exact_edges(N)
    if held:  # the held-out runner's own outputs, beside the first's, and the passes on either set after the search
        most = max(N, held)
        copies = node_copies(most)
        stages["held-out passes"] = outputs(held) + max(reference(held), node_patching(most, copies),
                                                         edge_patching(most) if edges else 0)
    return TaskMemoryEstimate(n_pairs=n_pairs, pos=P, steps=S, resident=resident, stages=stages, budget=budget)


def check_task_memory(model: Any, n_pairs: int, pos: int, *, steps: int, mlps: bool, edges: bool,
                      evaluation_pairs: int = 0, logit_positions: int | None = None, scored_metric: bool = False,
                      device: Any = None, available: int | None = None, where: str = "scan_task",
                      kv_edges: str = "grouped", node_widths: tuple[int, ...] = ()) -> TaskMemoryEstimate:
    """Raise one :class:`CircuitkitError` line if the task scan's estimated peak (:func:`estimate_task_memory`)
    exceeds the memory free on the model's device (``available`` bytes when given, else
    :func:`~circuitkit.device_memory.available_memory`); else return the estimate, whose ``budget`` the scan's
    runners use: on a GPU the wider one of :func:`~circuitkit.graph.runner.sender_budget` where its estimate fits,
    else :data:`~circuitkit.graph.runner.SENDER_BUDGET`. The message names the estimate,
    its largest parts, the most pairs that fit by the same estimate, and the fewer EAP-IG steps or the skipped edge
    circuit that would let every pair fit, where one would. The pairs that fit are counted without a held-out
    split (attribution on all of them: the larger estimate), so they fit whatever split a rerun draws."""
    def estimate(n: int, **change: Any) -> TaskMemoryEstimate:
        options = {"steps": steps, "edges": edges, "evaluation_pairs": 0, "budget": SENDER_BUDGET, **change}
        return estimate_task_memory(model, n, pos, mlps=mlps, logit_positions=logit_positions,
                                    scored_metric=scored_metric, device=device, kv_edges=kv_edges,
                                    node_widths=node_widths, **options)

    adapter = _adapter(model, device)
    if available is None:
        available = available_memory(adapter.spec.device)
    else:
        available = validate.integer(f"{where}: available", available, minimum=0)
    wide = sender_budget(adapter.spec.device, available)
    if wide > SENDER_BUDGET:  # a GPU with room: wider passes where they fit, else the floor's
        found = estimate(n_pairs, evaluation_pairs=evaluation_pairs, budget=wide)
        if found.total <= available:
            return found
    found = estimate(n_pairs, evaluation_pairs=evaluation_pairs)
    if available is None or found.total <= available:
        return found
    low, high = 0, found.n_pairs  # estimate(low) fits (0: nothing), estimate(high) does not
    while high - low > 1:
        mid = (low + high) // 2
        if estimate(mid).total <= available:
            low = mid
        else:
            high = mid
    # the other settings that would let every pair fit, where one does
    held = {"evaluation_pairs": evaluation_pairs}
    others = [f"steps={k}" for k in range(found.steps - 1, 0, -1)
              if estimate(n_pairs, steps=k, **held).total <= available][:1]
    if edges and estimate(n_pairs, edges=False, **held).total <= available:
        others.append("edges=False (--quick)")
    alternatives = f", or keep them all with {' or '.join(others)}" if others else ""
    if low >= 1:
        fix = f"Use at most {low} pairs (run the task in parts of {low}){alternatives}."
    else:
        fix = (f"Even one pair needs {size_text(estimate(1).total)}: use shorter prompts, fewer EAP-IG steps "
               "(steps=), no edge circuit (edges=False, --quick), or a device with more memory.")
    raise CircuitkitError(
        f"{where}: given {found.n_pairs} pairs of {found.pos} tokens with {found.steps} EAP-IG steps, which need "
        f"about {size_text(found.total)} at the peak ({found.parts()}); expected at most the {size_text(available)} "
        f"free on {adapter.spec.device}. {fix}"
    )
