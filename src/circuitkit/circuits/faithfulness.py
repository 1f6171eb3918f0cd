"""Circuit discovery with faithfulness: the smallest set of heads that does what all heads do, measured exactly.

Why: a head score says where a head looks and a single-head ablation says the model misses it; neither says
whether a set of heads *suffices*. Circuit papers answer with faithfulness (Wang et al. 2022; Hanna et al. 2024).

Definitions, on the repeated-copies loss ``L`` (:attr:`circuitkit.detect.TokenBatch.repeated_copies`), with every
attention head ``(layer, head)`` of the model and a head set ``C``::

    L_clean  nothing ablated
    L_all    every attention head ablated
    L_C      every head outside C ablated, the heads of C kept (they compute as usual on the ablated run)
    faithfulness(C) = (L_all - L_C) / (L_all - L_clean)        1.0: C alone does what all heads do
    necessity(C)    = L_{not C} - L_clean                     nats: the rise with only C ablated

A head is ablated by replacing its output ``z`` (``blocks.{l}.attn.hook_z``, ``[batch, pos, head, d_head]``) with
its clean mean over batch and positions (``"mean"``), zeros (``"zero"``), or its ``z`` on the resampled batch
(``"resample"``: every copy of the block redrawn, :func:`circuitkit.circuits.resampled_batch`). A zero gap
``L_all - L_clean`` below :data:`MIN_GAP` (no head matters: faithfulness divides noise by noise) raises a
``CircuitkitError``, never a NaN.

Discovery (:func:`find_circuit`). Heads are ranked by an effect estimate (default: the attribution estimate of
each head's ablation, :func:`circuitkit.attribution_effects`; the scan uses exact single-head ablation where it
ran one). The faithfulness of the top ``n`` heads is then measured exactly for a geometric sequence
``n = 1, 2, 4, ...`` up to the first ``n`` that reaches ``target`` (the larger sizes are not run: the curve shows
the sizes measured, and ``n = n_heads``, nothing ablated, at 1), and the smallest ``n`` reaching ``target`` is found
by bisection between the last geometric ``n`` below the target and the first at or above it (the curve is close to
monotone; every reported figure is measured, never interpolated). Cost: at most about ``2 log2(n_heads)`` forward
passes of the batch, ``2 log2(circuit size)`` for a circuit found early (:attr:`Circuit.passes` counts them), plus
one for necessity and one for the resampled batch.

Where the batch has at least ``2 * COARSE_SETS`` sequences, a coarse search looks first (:func:`coarse_size`): on a
quarter of the sequences, four sizes per pass of the batch (``4, 16, 64, ...``, then evenly inside the bracket), it
finds where the answer lies in about three passes; the exact search then grows its bracket from there in steps
``1, 2, 4, ...`` on the whole batch (two passes when the coarse answer is right: the size and the one below it) and
bisects. The answer is always the whole batch's, measured; only where the search looks first changes (the curve
then holds the sizes around the answer, not the geometric ones). Both searches are the ones a task's node and edge
circuits run (:func:`smallest`, :func:`coarse_search`), each engine giving its own measurement of a size.

Heads matter together: a head whose own ablation does little (another head backs it up) can be needed once the
heads around it are gone. Faithfulness measures sets, so the curve shows where the single-head ranking falls short
(a slow rise) and the found circuit is always checked as a set.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from circuitkit import validate
from circuitkit.circuits.curve import CurvePoint, check_gap, faithfulness_of, has_gap
from circuitkit.circuits.intervals import circuit_intervals
from circuitkit.circuits.intervals import head_mask as _mask
from circuitkit.circuits.record import CircuitRecord
from circuitkit.detect.ablation import check_heads, copies_per_forward
from circuitkit.detect.joint_path import RADAU_POINTS
from circuitkit.detect.joint_path import gate_gradients as joint_gate_gradients
from circuitkit.detect.joint_path import radau_shares as joint_rule
from circuitkit.detect.loss import loss_positions, token_losses
from circuitkit.detect.reference import Keep, reference_pass
from circuitkit.detect.session import open_session
from circuitkit.detect.tokens import RepeatedTokens, TokenBatch
from circuitkit.graph.nodes import HEAD, NodeSets, NodeType, check_node_sets, node_gates, node_patches
from circuitkit.models.adapters import ModelAdapter
from circuitkit.models.state import keeps_model_state
from circuitkit.ranking import Head, head_name
from circuitkit.uncertainty import DEFAULT_LEVEL, DEFAULT_RESAMPLES, DEFAULT_SEED, check_settings

FAITHFULNESS_METHODS = ("mean", "zero", "resample")
DEFAULT_TARGET = 0.8
"""Faithfulness the circuit must reach (circuit papers call 0.8 and above faithful)."""
MIN_GAP = 0.05
"""Smallest ``|L_all - L_clean|`` (nats) faithfulness divides by. Below it no set of heads does anything worth a
circuit and the ratio divides noise by noise: random-weight GPT-2-small and SmolLM-135M shapes move the loss
by so little that their measured curves swing between -3 and +15; a model with induction heads moves it by nats
(the bundled model: 4.1)."""
DEFAULT_CORRUPT_SEED = 1
"""Seed of the resampled batch for ``method="resample"`` (as :mod:`circuitkit.circuits.corrupt`)."""


def _plain_interval(value: Any) -> Any:
    """An interval (or a mapping of them) as lists of floats; None stays None."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        return {str(k): _plain_interval(v) for k, v in value.items()}
    return [float(value[0]), float(value[1])]


@dataclass(frozen=True, eq=False, kw_only=True, repr=False)
class Circuit(CircuitRecord):
    """A circuit found by :func:`find_circuit`: a :class:`~circuitkit.circuits.record.CircuitRecord` (``heads``,
    ``faithfulness``, ``necessity`` in nats, ``target``, ``curve`` by ``n_heads``, ``intervals``, ``ranked_by``,
    ``search``, ``random_baseline``, ``stability``) with the induction scan's own figures.

    ``method`` (how heads are ablated); ``clean_loss`` / ``all_ablated_loss`` / ``circuit_loss`` (nats: nothing,
    every head, every head outside the circuit ablated); ``ranking``: all heads in the order they were added;
    ``passes``: forward passes of the batch the search spent (stacked copies count one each; the random baseline's
    and the stability reruns' are their own); ``edges``: exact path patching of the edges among the circuit's heads
    (:class:`~circuitkit.circuits.PathPatching`) or None; ``roles``: the circuit's heads by role; ``ranked_by``:
    ``"effect"`` (single-head effects) or ``"joint"`` (joint-path integrated gradients); ``intervals``: bootstrap
    intervals over the batch's sequences (:mod:`circuitkit.circuits.intervals`): ``faithfulness``, ``necessity``,
    ``losses`` (name -> interval) and ``curve`` (``n_heads`` -> interval).
    """

    method: str
    clean_loss: float
    all_ablated_loss: float
    circuit_loss: float
    ranking: tuple[Head, ...]
    passes: int
    edges: Any = None
    roles: Mapping[str, tuple[Head, ...]] = field(default_factory=dict)
    ranked_by: str | None = "effect"
    evaluation: Mapping[str, Any] | None = None
    """The circuit on a held-out batch the search did not see (:func:`circuitkit.circuits.heldout.held_out`; the
    scan measures it where it drew its batch from a spec); None where not measured."""

    def to_json(self) -> dict[str, Any]:
        return {
            "heads": [head_name(h) for h in self.heads],
            "faithfulness": self.faithfulness,
            "necessity": self.necessity,
            "target": self.target,
            "method": self.method,
            "losses": {"clean": self.clean_loss, "all_ablated": self.all_ablated_loss,
                       "circuit_only": self.circuit_loss},
            "curve": [p.to_json("n_heads", "loss") for p in self.curve],
            "passes": self.passes,
            "ranked_by": self.ranked_by,
            "roles": {role: [head_name(h) for h in heads] for role, heads in self.roles.items()},
            "edges": [] if self.edges is None else [e.to_json() for e in self.edges.edges],
            "ci": {key: _plain_interval(value) for key, value in self.intervals.items() if key != "curve"},
            "random_baseline": None if self.random_baseline is None else self.random_baseline.to_json(),
            "stability": None if self.stability is None else self.stability.to_json(),
            **({} if self.evaluation is None else {"evaluation": dict(self.evaluation)}),
        }

    def _repr_extra(self) -> str:
        return f", {self.method} ablation, {self.passes} passes"


class Ablator:
    """Runs a batch with sets of nodes ablated, many sets per forward pass (one stacked copy of the batch each).

    ``values[layer]``: what an ablated head's ``z`` becomes, ``[head, d_head]`` (mean, zero) or ``[batch, pos,
    head, d_head]`` (resample). ``further``: node types beside the heads (:class:`~circuitkit.graph.nodes.NodeType`
    records, as a task's node types) with their values by layer, broadcastable to the activation at the type's hook.
    A set is a head mask ``[layer, head]`` or, for several sets, ``[sets, layer, head]``; or node sets of several
    types (:data:`~circuitkit.graph.nodes.NodeSets`: type name -> ``[sets, layer, nodes]``); either way the pass is
    built by :func:`~circuitkit.graph.nodes.node_patches`, as a task runner's is. ``passes`` counts the batch copies
    run so far.
    """

    def __init__(self, adapter: ModelAdapter, batch: TokenBatch, values: dict[int, Tensor],
                 further: Mapping[NodeType, dict[int, Tensor]] | None = None) -> None:
        self.adapter = adapter
        self.batch = batch
        self.values = values
        self.further = dict(further or {})
        self.kinds = {HEAD.name: HEAD} | {kind.name: kind for kind in self.further}
        if len(self.kinds) != 1 + len(self.further):
            raise validate.fail("further", [kind.name for kind in self.further],
                                f"node types with names of their own, none of them {HEAD.name!r}")
        self.node_values = {HEAD.name: values} | {kind.name: v for kind, v in self.further.items()}
        self.passes = 0
        self.positions = loss_positions(batch)  # the passes unembed only where the loss reads
        self.per_forward = copies_per_forward(adapter, batch.tokens, len(self.positions))
        self._each: dict[bytes, Tensor] = {}  # ablated set -> each sequence's loss [batch] (kept for the intervals)

    def subset(self, k: int) -> Ablator:
        """An ablator over the first ``k`` sequences of the batch (the same ablated values; resampled values cut to
        those sequences); its passes count copies of that smaller batch."""
        from dataclasses import replace

        def cut(value: Tensor) -> Tensor:  # per-sequence values are [batch, pos, ...]; per-unit ones are not
            return value[:k] if value.dim() >= 3 and value.shape[0] == self.batch.tokens.shape[0] else value

        head = {layer: value if value.ndim == 2 else value[:k] for layer, value in self.values.items()}
        further = {kind: {layer: cut(v) for layer, v in by_layer.items()} for kind, by_layer in self.further.items()}
        return Ablator(self.adapter, replace(self.batch, tokens=self.batch.tokens[:k]), head, further)

    def sequence_losses(self, ablated: Tensor | NodeSets) -> Tensor | None:
        """Each sequence's repeated-copies loss ``[batch]`` with the nodes of the one set ``ablated`` (a head mask
        ``[layer, head]`` or node sets of one set each) ablated, where a pass measured that set (their mean is
        :meth:`losses`' figure); else None. No extra pass."""
        sets = self._sets(ablated if not isinstance(ablated, Tensor) else ablated[None])
        return self._each.get(_key(sets, 0))

    def losses(self, ablated: Tensor | NodeSets) -> list[float]:
        """``ablated``: ``[sets, layer, head]`` bool (True: ablate that head), or node sets of several types
        (:data:`~circuitkit.graph.nodes.NodeSets`): the repeated-copies loss of each set."""
        from circuitkit.detect.node_patching import in_passes

        sets = self._sets(ablated)
        n = next(iter(sets.values())).shape[0]
        parts = in_passes(n, self.per_forward, lambda part: self._pass({name: m[part] for name, m in sets.items()}))
        return [loss for part in parts for loss in part]

    def _sets(self, ablated: Tensor | NodeSets) -> dict[str, Tensor]:
        """``ablated`` as node sets by type name, each ``[sets, layer, nodes]`` bool on the CPU (checked)."""
        spec = self.adapter.spec
        sets = {HEAD.name: ablated} if isinstance(ablated, Tensor) else ablated
        n = check_node_sets("Ablator: ablated", self.kinds, sets, spec)
        out = {name: mask.to("cpu") for name, mask in sets.items()}
        if HEAD.name not in out:  # every set names its heads, so a set has one key however it was asked for
            out[HEAD.name] = torch.zeros(n, spec.n_layers, spec.n_heads, dtype=torch.bool, device="cpu")
        return out

    def _pass(self, sets: dict[str, Tensor]) -> list[float]:
        """One stacked pass of the node-patching engine (:mod:`circuitkit.detect.node_patching`, the task scan's
        too): each node ablated is its units at its type's hook patched to its values."""
        from circuitkit.detect.node_patching import patched_logits

        S = next(iter(sets.values())).shape[0]
        tokens = self.batch.tokens
        B = tokens.shape[0]
        patches = node_patches(self.kinds, sets, self.node_values)
        logits = patched_logits(self.adapter, tokens, S, patches, positions=self.positions)
        copies = tokens.repeat(S, 1)
        with torch.no_grad():
            each = token_losses(logits, copies, self.batch.repeated_copies)  # as stacked_losses, kept per sequence
            losses = each.view(S, -1).mean(dim=1).cpu()
            each = each.view(S, B, -1).float().mean(dim=2).cpu()
        self.passes += S
        for i in range(S):
            self._each[_key(sets, i)] = each[i]
        means = validate.finite_result("faithfulness", losses, why="the ablated model's logits overflowed")
        return [float(v) for v in means]


def _key(sets: Mapping[str, Tensor], i: int) -> bytes:
    """Set ``i`` of ``sets`` as bytes: its head mask, then each further type it patches a node of, in name order,
    with its mask (a type that patches nothing is left out, so one set has one key however it was asked for)."""
    parts = []
    for name in sorted(sets):
        mask = sets[name][i].detach().to("cpu", torch.bool).contiguous()
        if bool(mask.any()) or name == HEAD.name:
            parts.append(name.encode() + b":" + mask.numpy().tobytes())
    return b"|".join(parts)


def ablation_values(adapter: ModelAdapter, batch: TokenBatch, method: str, *, z_means: dict[int, Tensor] | None = None,
                    corrupt_seed: int = DEFAULT_CORRUPT_SEED, corrupt_z: dict[int, Tensor] | None = None,
                    ) -> tuple[dict[int, Tensor], int]:
    """Per layer, what an ablated head's ``z`` becomes (see :class:`Ablator`), and the forward passes spent on it.
    ``z_means`` / ``corrupt_z``: values an earlier pass measured (reused; else one pass here)."""
    spec = adapter.spec
    if method == "zero":
        return {layer: torch.zeros(spec.n_heads, spec.d_head) for layer in range(spec.n_layers)}, 0
    layers = range(spec.n_layers)
    if method == "mean" and z_means is not None and all(layer in z_means for layer in layers):
        return {layer: z_means[layer] for layer in layers}, 0
    if method == "resample" and corrupt_z is not None and all(layer in corrupt_z for layer in layers):
        return {layer: corrupt_z[layer] for layer in layers}, 0
    if method == "resample":
        from circuitkit.circuits.corrupt import resampled_batch

        tokens = resampled_batch(batch, corrupt_seed).tokens
    else:
        tokens = batch.tokens
    keep = Keep(z_mean=layers) if method == "mean" else Keep(z=layers)
    with torch.no_grad():
        _, kept = reference_pass(adapter, tokens, keep, clone=True)
    return (kept.z_mean if method == "mean" else kept.z), 1


def check_loss_gap(clean: float, all_ablated: float) -> None:
    """The induction scan's gap rule (:func:`~circuitkit.circuits.curve.check_gap`): ablating every head must move
    the repeated-copies loss by at least :data:`MIN_GAP` nats, else :class:`~circuitkit.circuits.curve.NoBehaviour`.
    """
    check_gap(clean, all_ablated, MIN_GAP, lambda gap: (
        f"faithfulness: ablating every attention head changes the repeated-copies loss by only {-gap:+.3g} nats "
        f"(from {clean:.6g} to {all_ablated:.6g}); expected a change of at least {MIN_GAP:g} nats. No head "
        "matters measurably on this batch, so there is no effect for a set of heads to reproduce. "
        "Use a model that copies in context, or a longer block / larger batch."))


def geometric_sizes(n_total: int) -> list[int]:
    """``1, 2, 4, ...`` below ``n_total``, then ``n_total``."""
    sizes, n = [], 1
    while n < n_total:
        sizes.append(n)
        n *= 2
    return [*sizes, n_total]


def search(
    ablator: Ablator,
    ranking: Sequence[Head],
    target: float,
    clean_loss: float,
    *,
    all_ablated: float | None = None,
    progress: Any = None,
    predicted: int | None = None,
) -> tuple[int, float, float, dict[int, tuple[float, float]]]:
    """Smallest ``n`` whose top-``n`` heads of ``ranking`` reach ``target`` (module docstring). Returns
    ``(n, L_all, L_circuit, measured)`` with ``measured`` ``n -> (faithfulness, loss)`` for every measured ``n``.
    ``all_ablated``: ``L_all`` where measured already (:func:`all_ablated_loss`). ``progress(passes)`` is told the
    passes as they run. ``predicted``: a size the caller expects the answer near (:func:`coarse_size`): the
    bracket then grows from it in steps ``1, 2, 4, ...`` instead of from ``n = 1``, so a good prediction costs two
    or three passes (both ways end in the same bisection)."""
    spec = ablator.adapter.spec
    L, H = spec.n_layers, spec.n_heads
    N = len(ranking)

    def run(sizes: list[int]) -> list[float]:
        before = ablator.passes
        masks = torch.stack([_mask(ranking[:n], L, H, keep=True) for n in sizes])
        out = ablator.losses(masks)
        if progress is not None:
            progress(ablator.passes - before)
        return out

    if all_ablated is None:
        all_ablated = run([0])[0]  # n = 0: every head ablated
    check_loss_gap(clean_loss, all_ablated)  # before any other pass
    losses = {0: all_ablated, N: clean_loss}  # n = 0: every head ablated; n = N: nothing ablated, the clean run

    def evaluate(n: int) -> float:
        losses[n] = run([n])[0]
        return faithfulness_of(losses[n], clean_loss, all_ablated)

    faith = {0: 0.0, N: 1.0}
    if predicted is None or N < 2:
        n = smallest(evaluate, [n for n in geometric_sizes(N) if n < N], N, target, faith)
    else:  # the prediction kept inside (0, N): the bracket grows from it towards the target's side
        n = smallest(evaluate, [], N, target, faith, predict=lambda low, high: min(max(int(predicted), 1), N - 1))
    return n, all_ablated, losses[n], {k: (faith[k], losses[k]) for k in faith}


def smallest(evaluate: Callable[[int], float], sizes: Sequence[int], total: int, target: float,
             measured: dict[int, float], *, resolution: float = 0.0, predict: Callable[[int, int], int] | None = None,
             predict_after: int = 0) -> int:
    """The smallest ``n`` whose ``evaluate(n) -> faithfulness`` reaches ``target``, to within ``resolution`` of
    ``n`` (relative; 0: exactly, ``n - 1`` measured below it): the one exact search of both engines' circuits
    (heads, a task's nodes and edges). ``measured`` holds the points known (``0`` and ``total`` at least) and
    collects every point measured; ``total`` where none reaches the target.

    ``evaluate`` at ``sizes`` in order until one reaches ``target`` (with ``predict``: only those up to
    ``predict_after``), then bisection between the last point below it and the first at or above it. With
    ``predict(low, high) -> n`` (where the answer likely lies in the bracket: a coarse search on a subset,
    :func:`coarse_search`) and no size up to ``predict_after`` reaching the target, the bracket first grows from
    the prediction in steps of ``1, 2, 4, ...`` units (:func:`gallop`: two passes where the prediction is right),
    then bisects. Every point is measured, never interpolated: where the curve crosses the target once the answer
    is the smallest size reaching it; where it dips back below, a size reaching it whose predecessor was measured
    short of it. Only where the search looks first depends on the prediction."""

    def unit(n: int) -> int:
        return max(1, int(resolution * n))

    def reaches(n: int) -> bool:
        if n not in measured:
            measured[n] = evaluate(n)
        return measured[n] >= target

    for n in sizes:
        if (predict is not None and n > predict_after) or reaches(n):
            break
    reached = [n for n in sorted(measured) if measured[n] >= target]
    if not reached:
        return total
    high = reached[0]
    low = max([n for n in measured if n < high], default=0)
    if predict is not None and low >= predict_after and high - low > unit(high):
        low, high = gallop(predict(low, high), low, high, reaches, unit)
    while high - low > unit(high):  # bisection: low below the target, high at or above it
        mid = (low + high) // 2
        if reaches(mid):
            high = mid
        else:
            low = mid
    return high


def coarse_search(measure: Callable[[list[int]], list[float]], low: int, high: int, target: float,
                  unit: Callable[[int], int] | None = None, first: Sequence[int] = ()) -> int:
    """Where an exact search should look first (:func:`smallest`'s ``predict``): a ``COARSE_SETS + 1``-ary search
    between ``low`` (below the target) and ``high`` (at or above it) whose every round measures up to
    :data:`COARSE_SETS` sizes in one call of ``measure(sizes) -> [faithfulness]`` (stacked on a subset of the
    batch or pairs), evenly inside the bracket (the first round ``first`` where given), until the bracket is one
    ``unit(size)`` wide (default 1); its upper end."""
    unit = unit or (lambda n: 1)
    sizes = [n for n in first if low < n < high]
    while high - low > unit(high):
        if not sizes:
            step = (high - low) / (COARSE_SETS + 1)
            sizes = sorted({min(high - 1, max(low + 1, round(low + step * j))) for j in range(1, COARSE_SETS + 1)})
        for n, value in zip(sizes, measure(sizes), strict=True):
            if value >= target:
                high = min(high, n)
            elif n < high:
                low = max(low, n)
        low = min(low, high - 1)
        sizes = []
    return high


def gallop(start: int, low: int, high: int, reaches: Any, unit: Any = None) -> tuple[int, int]:
    """``(low, high)``: a size below the target and one at or above it, inside the bracket ``(low, high)`` given
    (for the induction circuit ``(0, N)``: every head ablated, none), found by galloping from ``start`` in steps of
    1, 2, 4, ... ``unit(size)`` (default 1) towards the side the target lies on."""
    unit = unit or (lambda n: 1)
    start = min(max(start, low + 1), high)
    if start == high or reaches(start):
        top, step = start, unit(start)
        while top - step > low:
            if not reaches(top - step):
                return top - step, top
            top, step = top - step, 2 * step
        return low, top
    bottom, step = start, unit(start)
    while bottom + step < high:
        if reaches(bottom + step):
            return bottom, bottom + step
        bottom, step = bottom + step, 2 * step
    return bottom, high


COARSE_SETS = 4
"""Head sets per pass of the coarse search (:func:`coarse_size`): each measured on ``1 / COARSE_SETS`` of the
batch's sequences, so one pass of the batch measures that many sizes."""
COARSE_MIN_SEQUENCES = 2
"""The coarse search runs only where each set gets at least this many sequences (else the search is the exact one
alone)."""


def coarse_size(ablator: Ablator, ranking: Sequence[Head], target: float, clean_each: Tensor | None,
                all_each: Tensor | None, progress: Any = None) -> tuple[int | None, int]:
    """Where the exact search should look first: the smallest top-``n`` of ``ranking`` reaching ``target`` on the
    first ``batch / COARSE_SETS`` sequences, found by a ``COARSE_SETS + 1``-ary search whose every round measures
    ``COARSE_SETS`` sizes inside the bracket in one pass of the batch (first round ``4, 16, 64, ...``), and the
    passes spent. ``clean_each`` / ``all_each`` ``[batch]``: each sequence's clean and all-ablated loss (kept by
    earlier passes: no pass here for them). ``(None, 0)`` where the batch is too small or the subset's gap is below
    :data:`MIN_GAP`. The answer is only a starting point: :func:`search` measures the circuit on the whole batch."""
    B = ablator.batch.batch
    k = B // COARSE_SETS
    if k < COARSE_MIN_SEQUENCES or clean_each is None or all_each is None or len(ranking) < 2:
        return None, 0
    clean, everything = float(clean_each[:k].mean()), float(all_each[:k].mean())
    if not has_gap(clean, everything, MIN_GAP):
        return None, 0
    sub = ablator.subset(k)
    spec = ablator.adapter.spec
    N = len(ranking)
    passes = 0

    def measure(sizes: list[int]) -> list[float]:
        nonlocal passes
        masks = torch.stack([_mask(ranking[:n], spec.n_layers, spec.n_heads, keep=True) for n in sizes])
        losses = sub.losses(masks)
        passes += 1
        if progress is not None:
            progress(1)
        return [faithfulness_of(loss, clean, everything) for loss in losses]

    high = coarse_search(measure, 0, N, target, first=[4 ** i for i in range(1, COARSE_SETS + 1)])
    return high, passes


DEFAULT_JOINT_STEPS = 2
"""Midpoints of the joint path from every head ablated to none (``alpha = (k + 1/2) / steps``) averaged by
:func:`joint_attribution`; all of them run as stacked copies in one forward and one backward pass (``3 * steps``
passes). Two order the bundled model's heads and the hand-built circuit's exactly as 16 midpoints do (the shares
themselves within 15% of the largest), for 6 passes instead of 9 at three. (The search itself ranks by the
Gauss-Radau rule, :data:`RADAU_POINTS`: one interior point beside the clean end the scan already has.)"""


def joint_attribution(ablator: Ablator, steps: int = DEFAULT_JOINT_STEPS) -> Tensor:
    """Each head's share of the all-ablated -> clean change of the loss, by integrated gradients along the joint
    path where every head is restored together: with gates ``g`` ``[layer, head]`` and each head's output
    ``z_g = v + g (z - v)`` (``v`` its ablated value, ``z`` what it computes in the gated run)::

        share[l, h] = (1 / steps) sum_k dL/dg[l, h] at g = alpha_k * 1,   alpha_k = (k + 1/2) / steps

    the midpoint rule for ``int_0^1 dL/dg[l, h](alpha 1) d alpha``; the shares add up to about
    ``L_clean - L_all`` (completeness). Along this path a head is credited while the heads it works with are
    partly there, so heads that matter only together (a previous-token head and the induction head reading it)
    are credited together, which single-head ablation from the clean run misses. Negative: restoring the head
    lowers the loss. Cost: ``steps`` stacked copies, one forward and one backward (about ``3 * steps`` passes)."""
    alphas = (torch.arange(steps, dtype=torch.float64) + 0.5) / steps
    gradients = gate_gradients(ablator, alphas)
    return gradients.mean(dim=0)


def radau_shares(ablator: Ablator, clean_gradient: Tensor | None = None) -> Tensor:
    """The joint-path shares (:func:`joint_attribution`) by the Gauss-Radau rule :data:`RADAU_POINTS`:
    ``3/4 g(1/3) + 1/4 g(1)`` with ``g(alpha)`` ``[layer, head]`` = ``dL/dg`` with every gate at ``alpha``.

    ``clean_gradient``: ``g(1)`` where known: at the clean run ``dL/dg = sum (z - v) dL/dz`` (batch mean of the
    loss), minus the attribution estimate of ablating each head to the same value ``v``
    (:func:`circuitkit.detect.attribution.attribute`); else it is differentiated here too. Cost: one stacked copy
    (3 passes), two without ``clean_gradient``."""
    if clean_gradient is None:
        gradients = gate_gradients(ablator, torch.tensor(RADAU_POINTS, dtype=torch.float64, device="cpu"))
        inner, end = gradients[0], gradients[1]
    else:
        inner = gate_gradients(ablator, torch.tensor(RADAU_POINTS[:1], dtype=torch.float64, device="cpu"))[0]
        end = clean_gradient.detach().float().cpu()
    shares = joint_rule(inner, end)
    return validate.finite_result("joint_attribution", shares, why="the gated model's gradients overflowed")


def gate_gradients(ablator: Ablator, alphas: Tensor) -> Tensor:
    """``dL/dg`` ``[points, layer, head]`` at every gate set to each ``alpha`` (see :func:`joint_attribution`): the
    points run as stacked copies of the batch in one forward and one backward pass (``3 * points`` passes, counted
    on ``ablator``), through the joint path of both engines (:func:`circuitkit.detect.joint_path.gate_gradients`)
    with each head's ``z`` gated between its ablated value and itself and the loss on the repeated copies."""
    adapter, batch = ablator.adapter, ablator.batch
    spec = adapter.spec
    steps = len(alphas)
    copies = batch.tokens.repeat(steps, 1)

    def losses(logits: Tensor) -> Tensor:  # each point's mean loss on the repeated copies, [points]
        return token_losses(logits, copies, batch.repeated_copies).view(steps, -1).mean(dim=1)

    gates, _ = node_gates([HEAD], {HEAD.name: ablator.values}, spec)
    grads = joint_gate_gradients(adapter, batch.tokens, gates, alphas, losses, positions=ablator.positions)
    ablator.passes += 3 * steps
    out = torch.zeros(steps, spec.n_layers, spec.n_heads, device="cpu")
    for layer, grad in enumerate(grads):
        if grad is not None:
            out[:, layer] = grad
    return validate.finite_result("joint_attribution", out, why="the gated model's gradients overflowed")


def rank_heads(effect: Tensor) -> list[Head]:
    """Every head, largest estimated effect first (NaN last; ties in ``(layer, head)`` order)."""
    values = effect.detach().float().cpu()
    L, H = values.shape
    key = torch.where(values.isnan(), torch.full_like(values, -math.inf), values).reshape(-1)
    order = sorted(range(L * H), key=lambda i: (-float(key[i]), i))
    return [divmod(i, H) for i in order]


def check_target(where: str, target: Any) -> float:
    return validate.real(where, target, minimum=0.0, maximum=1.0, strict_minimum=True)


@keeps_model_state
def find_circuit(
    model: Any,
    tokens: RepeatedTokens | TokenBatch | None = None,
    *,
    target: float = DEFAULT_TARGET,
    method: str = "mean",
    ranking: Tensor | Sequence[Head] | None = None,
    necessity: bool = True,
    rank: str = "joint",
    corrupt_seed: int = DEFAULT_CORRUPT_SEED,
    n_resamples: int = DEFAULT_RESAMPLES,
    ci_level: float = DEFAULT_LEVEL,
    random_sets: int = 0,
    stability: int = 0,
    device: str | torch.device | None = None,
    search: str = "ranked",
    search_options: dict[str, Any] | None = None,
) -> Circuit:
    """The smallest top-``n`` set of heads whose faithfulness reaches ``target`` (see the module docstring).

    Args:
        model: a TransformerBridge, a circuitkit toy model, or any model under :mod:`circuitkit.models.adapters`.
        tokens: the batch spec or a built batch (default ``RepeatedTokens()``).
        target: faithfulness to reach, in ``(0, 1]``.
        method: ``"mean"``, ``"zero"`` or ``"resample"`` (how a head outside the circuit is ablated).
        ranking: the order heads are added in: an ``[L, H]`` effect tensor (largest first) or a sequence of every
            head; default: the attribution estimate of each head's ablation (``method`` ``"zero"`` for zero,
            ``"mean"`` otherwise).
        necessity: also measure the loss rise with only the circuit ablated (one pass).
        rank: :data:`RANKINGS` (default ``"joint"``: heads that matter together join together).
        n_resamples, ci_level: the bootstrap intervals of the figures over the batch's sequences
            (:attr:`Circuit.intervals`, seed 0; from the losses the search measured, no extra pass).
        random_sets: measure the faithfulness of that many random head sets of the circuit's size, uniform and
            with the circuit's per-layer counts (:attr:`Circuit.random_baseline`; ``2 * random_sets`` passes;
            0: none, else at least 2).
        stability: rerun the search on that many bootstrap resamples of the batch's sequences and report each
            head's inclusion frequency and the circuits' mean pairwise Jaccard (:attr:`Circuit.stability`; each
            rerun costs about what this search costs; 0: none, else at least 2).
        search: ``"ranked"`` (default: the smallest top-``n`` set), ``"refined"`` or ``"masks"``
            (:mod:`circuitkit.circuits.search`: that set searched further, every figure measured again on the
            chosen heads; ``search_options``: the search's options). :attr:`Circuit.search` says what ran.
    """
    target = check_target("find_circuit: target", target)
    n_resamples, ci_level, ci_seed = check_settings("find_circuit", n_resamples, ci_level, DEFAULT_SEED,
                                                   "ci_level")
    random_sets = check_repeats("find_circuit: random_sets", random_sets)
    stability = check_repeats("find_circuit: stability", stability)
    method = validate.option("find_circuit: method", method, FAITHFULNESS_METHODS)
    necessity = validate.boolean("find_circuit: necessity", necessity)
    rank = validate.option("find_circuit: rank", rank, RANKINGS)
    corrupt_seed = validate.seed("find_circuit: corrupt_seed", corrupt_seed)
    from circuitkit.circuits.search import SEARCH_NAMES, check_search_options, search_found

    search = validate.option("find_circuit: search", search, SEARCH_NAMES)
    search_options = check_search_options("find_circuit: search_options", search, search_options)
    session = open_session(model, tokens, device)
    adapter, batch = session.adapter, session.batch
    spec = adapter.spec
    order = None if ranking is None else _ranking(ranking, spec.n_layers, spec.n_heads)
    searching = search != "ranked"  # then the random sets are measured at the searched circuit's size
    ablator, ranked = _prepared_search(adapter, batch, method, order, corrupt_seed)
    found = ranked(target, necessity=necessity, rank=rank, intervals=(n_resamples, ci_level, ci_seed),
                   random_sets=0 if searching else random_sets)
    if searching:  # the ranked circuit searched further, on the same ablator (its ablation values and passes)
        found = search_found(ablator, found, search, search_options, necessity=necessity,
                             intervals=(n_resamples, ci_level, ci_seed), random_sets=random_sets)
    if stability:
        from dataclasses import replace

        from circuitkit.circuits.stability import rerun

        found = replace(found, stability=rerun(adapter, batch, stability, resampled_search(
            target, method, order, rank, corrupt_seed)))
    return found


def resampled_search(target: float, method: str, order: list[Head] | None, rank: str, corrupt_seed: int) -> Any:
    """``(adapter, batch) -> (Circuit, passes)``: the search :func:`find_circuit` runs, on another batch (no
    necessity, no intervals), with its cost in forward passes (the attribution ranking's 3 included where it ran);
    what :mod:`circuitkit.circuits.stability` reruns on each resample."""

    def search(adapter: ModelAdapter, batch: TokenBatch) -> tuple[Circuit, float]:
        found = search_batch(adapter, batch, target, method, order, necessity=False, rank=rank,
                             corrupt_seed=corrupt_seed)
        return found, found.passes + (3 if order is None else 0)

    return search


def search_batch(adapter: ModelAdapter, batch: TokenBatch, target: float, method: str, order: list[Head] | None,
                 *, necessity: bool = True, rank: str = "joint", corrupt_seed: int = DEFAULT_CORRUPT_SEED,
                 intervals: tuple[int, float, int] | None = None, random_sets: int = 0) -> Circuit:
    """:func:`find_circuit` on a built batch with validated arguments (``order``: every head, or None for the
    attribution estimate's order: its forward and backward pass, 3 passes, are not in :attr:`Circuit.passes`)."""
    _, ranked = _prepared_search(adapter, batch, method, order, corrupt_seed)
    return ranked(target, necessity=necessity, rank=rank, intervals=intervals, random_sets=random_sets)


def _prepared_search(adapter: ModelAdapter, batch: TokenBatch, method: str, order: list[Head] | None,
                     corrupt_seed: int) -> tuple[Ablator, Callable[..., Circuit]]:
    """The :class:`Ablator` of the ranked search (its ablation values; the attribution estimate's order and clean
    figures where ``order`` is None, else one clean pass) and ``ranked(target, **options)``, the ranked search on
    it (:func:`discover`), so that a search beyond ranking runs on the same ablator without recomputing its
    values."""
    if order is None:
        from circuitkit.detect.attribution import attribute

        estimate, run = attribute(adapter, batch, "zero" if method == "zero" else "mean")
        order, clean_loss, z_means = rank_heads(estimate.effect), run.repeated_loss, run.z_means
        clean_each = run.repeated_per_sequence
        # the estimate ablates to the ablator's own values (mean: these z means; zero): minus it is dL/dgate there
        clean_gradient = None if method == "resample" else -estimate.effect
    else:
        z_means, clean_loss, clean_gradient = None, None, None
    values, passes = ablation_values(adapter, batch, method, z_means=z_means, corrupt_seed=corrupt_seed)
    if clean_loss is None:
        with torch.no_grad():
            logits = adapter.run(batch.tokens, positions=loss_positions(batch))
            losses = token_losses(logits, batch.tokens, batch.repeated_copies)
            clean_loss = float(losses.mean())
            clean_each = losses.float().mean(dim=1).cpu()
        passes += 1
    ablator = Ablator(adapter, batch, values)

    def ranked(target: float, **options: Any) -> Circuit:
        return discover(ablator, order, target, method, clean_loss, extra_passes=passes,
                        clean_gradient=clean_gradient, clean_losses=clean_each, **options)

    return ablator, ranked


def check_repeats(name: str, value: Any) -> int:
    """A count of extra measurements: 0 (none) or at least 2 (one gives no spread)."""
    value = validate.integer(name, value, minimum=0, maximum=10_000)
    if value == 1:
        raise validate.fail(name, value, "0 (none) or at least 2 (a single draw has no spread)")
    return value


RANKINGS = ("joint", "effect", "auto")
"""How heads are ordered for the search: by the joint-path share (:func:`radau_shares`, ``"joint"``, the
default: 3 passes where the clean end's gradient is known from the attribution pass, else 6), by their single-head
effect (``"effect"``: no extra pass), or ``"auto"``: by effect, and by the joint path too where the effect ranking
needs more than :data:`JOINT_FALLBACK_SHARE` of the heads (the smaller circuit wins; the most passes)."""
JOINT_FALLBACK_SHARE = 0.1
"""``"auto"`` tries the joint-path ranking when the single-head ranking's circuit holds more than this share of
the heads: there heads that matter only together are likely being missed, and the extra passes are worth it."""


def discover(ablator: Ablator, order: Sequence[Head], target: float, method: str, clean_loss: float, *,
             necessity: bool = True, extra_passes: int = 0, progress: Any = None, rank: str = "effect",
             clean_gradient: Tensor | None = None, clean_losses: Tensor | None = None,
             intervals: tuple[int, float, int] | None = None, random_sets: int = 0) -> Circuit:
    """:func:`find_circuit` with the ablation values and the effect ranking at hand (the scan's entry point).
    ``clean_gradient``: ``dL/dg`` of every head's gate at the clean run where known (minus the attribution
    estimate to the ablator's own values): the joint-path ranking then costs one copy less (:func:`radau_shares`).
    ``clean_losses``: each sequence's clean repeated-copies loss ``[batch]``; with ``intervals``
    ``(n_resamples, level, seed)`` the circuit's figures get bootstrap intervals (no extra pass).
    ``random_sets``: that many random sets of the circuit's size per kind measured as its baseline
    (:mod:`circuitkit.circuits.baseline`, ``2 * random_sets`` passes; 0: none)."""
    spec = ablator.adapter.spec
    N = spec.n_layers * spec.n_heads
    L, H = spec.n_layers, spec.n_heads
    before = ablator.passes
    every_head = torch.ones(1, L, H, dtype=torch.bool, device="cpu")
    everything = ablator.losses(every_head)[0]  # L_all, then the gap check: a model
    if progress is not None:  # where no head matters costs one pass here
        progress(ablator.passes - before)
    check_loss_gap(clean_loss, everything)
    all_each = ablator.sequence_losses(torch.ones(L, H, dtype=torch.bool, device="cpu"))
    coarse_passes = 0

    def measured_search(ranking: Sequence[Head]) -> tuple[int, float, float, dict[int, tuple[float, float]]]:
        nonlocal coarse_passes  # the coarse passes run on the ablator's subset: counted here, in whole passes
        start, spent = coarse_size(ablator, ranking, target, clean_losses, all_each, progress)
        coarse_passes += spent
        return search(ablator, ranking, target, clean_loss, all_ablated=everything, progress=progress,
                      predicted=start)

    found = None
    if rank in ("auto", "effect"):
        found = (*measured_search(order), tuple(order), "effect")
    if rank == "joint" or (rank == "auto" and found[0] > JOINT_FALLBACK_SHARE * N):
        before = ablator.passes
        shares = radau_shares(ablator, clean_gradient)
        joint = tuple(rank_heads(-shares))
        if progress is not None:
            progress(ablator.passes - before)
        other = (*measured_search(joint), joint, "joint")
        if found is None or other[0] < found[0] or (other[0] == found[0] and other[3][other[0]][0] >
                                                      found[3][found[0]][0]):
            found = other
    n, all_ablated, circuit_loss, measured, ranking, ranked_by = found
    heads = tuple(ranking[:n])
    rise = None
    if necessity:
        before = ablator.passes
        rise = ablator.losses(_mask(heads, spec.n_layers, spec.n_heads, keep=False)[None])[0] - clean_loss
        if progress is not None:
            progress(ablator.passes - before)
    curve = tuple(CurvePoint(k, f, loss) for k, (f, loss) in sorted(measured.items()))
    baseline = None
    if random_sets:
        from circuitkit.circuits.baseline import measure

        resamples, level, _ = intervals or (DEFAULT_RESAMPLES, DEFAULT_LEVEL, DEFAULT_SEED)
        baseline = measure(ablator, heads, clean_loss, all_ablated, clean_losses, random_sets, 0, level, resamples,
                           progress)
    bounds: dict[str, Any] = {}
    if intervals is not None and clean_losses is not None:
        bounds = circuit_intervals(ablator, ranking, sorted(measured), heads, clean_losses, necessity, *intervals)
    search_passes = ablator.passes + coarse_passes + extra_passes - (baseline.passes if baseline is not None else 0)
    return Circuit(heads=heads, faithfulness=measured[n][0], necessity=rise, target=target, curve=curve,
                   method=method, clean_loss=clean_loss, all_ablated_loss=all_ablated, circuit_loss=circuit_loss,
                   ranking=ranking, passes=search_passes, ranked_by=ranked_by, intervals=bounds,
                   random_baseline=baseline)


@keeps_model_state
def faithfulness(
    model: Any,
    heads: Iterable[Head],
    tokens: RepeatedTokens | TokenBatch | None = None,
    *,
    method: str = "mean",
    corrupt_seed: int = DEFAULT_CORRUPT_SEED,
    device: str | torch.device | None = None,
) -> float:
    """Faithfulness of the head set ``heads`` (module docstring): three losses, exactly (one stacked pass)."""
    method = validate.option("faithfulness: method", method, FAITHFULNESS_METHODS)
    session = open_session(model, tokens, device)
    adapter, batch = session.adapter, session.batch
    spec = adapter.spec
    chosen = check_heads(heads, spec.n_layers, spec.n_heads, "faithfulness")
    if not chosen:
        raise validate.fail("faithfulness: heads", chosen, "at least one (layer, head): an empty circuit does nothing")
    values, _ = ablation_values(adapter, batch, method, corrupt_seed=validate.seed("faithfulness: corrupt_seed",
                                                                                   corrupt_seed))
    ablator = Ablator(adapter, batch, values)
    L, H = spec.n_layers, spec.n_heads
    masks = torch.stack([torch.zeros(L, H, dtype=torch.bool), torch.ones(L, H, dtype=torch.bool),
                         _mask(chosen, L, H, keep=True)])
    clean, all_ablated, kept = ablator.losses(masks)
    check_loss_gap(clean, all_ablated)
    return faithfulness_of(kept, clean, all_ablated)


def _ranking(ranking: Any, n_layers: int, n_heads: int) -> list[Head]:
    if isinstance(ranking, Tensor):
        values = validate.tensor("find_circuit: ranking", ranking, shape=(n_layers, n_heads), floating=True)
        return rank_heads(values)
    order = validate.bounded_list("find_circuit: ranking", ranking, n_layers * n_heads,
                                  "an [L, H] effect tensor or a list of every head",
                                  why=f"L x H = {n_layers} x {n_heads} heads")
    heads = check_heads(order, n_layers, n_heads, "find_circuit: ranking")
    if len(heads) != len(order) or len(heads) != n_layers * n_heads:
        raise validate.fail("find_circuit: ranking", validate.given(f"{len(order)} heads"),
                            f"every one of the model's {n_layers * n_heads} heads once")
    return [(int(a), int(b)) for a, b in order]


__all__ = [
    "DEFAULT_TARGET",
    "FAITHFULNESS_METHODS",
    "MIN_GAP",
    "RANKINGS",
    "Circuit",
    "CurvePoint",
    "faithfulness",
    "find_circuit",
    "joint_attribution",
]
