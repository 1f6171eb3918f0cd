"""``circuitkit.scan(model) -> Scan``: the whole pipeline as one library call (the CLI is a thin shell on it).

(The module is called ``pipeline``, not ``scan``: a submodule named like the public function would replace
``circuitkit.scan`` on import.)

The stages (:data:`STAGE_NAMES`, a function each; :func:`stage_plan` says which run)::

    scores   tokens (RepeatedTokens) -> one forward + one backward pass: every head's pattern scores, per-token
             losses, mean z per head, residual streams (for resumed ablation), attribution (a first-order ablation
             estimate for every head) and the clean half of edge attribution
    ablate   exact ablation of the heads that count: the top ``ablate_top`` by |attribution| joined with the
             heads called induction / previous-token heads (``ablate="top"``), every head (``"all"``) or none;
             agreement of estimate and exact; the called heads ablated together
    circuit  the verified circuit: heads ranked by their joint-path attribution (or by exact ablation where
             measured, else the estimate); the smallest top-n set whose faithfulness reaches ``target``, measured
             exactly (:mod:`circuitkit.circuits.faithfulness`), and its necessity; with ``random_sets``, random
             head sets of its size measured beside it (2 passes a set pair)
    stability  (opt-in, ``stability=N``) the circuit search rerun on N bootstrap resamples of the batch
    weights  Q/K/V composition + random baselines + top edges, QK/OV spectra (weights only, no forward pass)
    edges    edge attribution of every edge, exact path patching of the ``n_patch`` edges between the circuit's
             heads; then the roles the evidence gives the circuit's heads (:func:`circuit_roles`)

Every figure that is a mean over the batch gets a bootstrap interval from per-sequence values the stages kept
(:mod:`circuitkit.scan_intervals`; no extra pass).

Progress (:class:`Progress`) is planned in passes of the batch (integers) from these stages before the first pass;
the plan changes only where a stage's size becomes known, grows, shrinks or the stage is skipped (the edges without a
circuit), and each change is said in words; without a terminal it prints the plan, each change and one line per
stage.

A head is *called* an induction (previous-token) head when its score is at least
:data:`HEAD_CALL_THRESHOLD` and at least :data:`HEAD_CALL_NEUTRAL_RATIO` times what a uniformly attending head
scores on the same batch (the score definition's ``neutral``).
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from circuitkit import validate
from circuitkit.circuits.faithfulness import DEFAULT_TARGET, check_repeats
from circuitkit.detect.ablation import ABLATION_METHODS, ablate_together_each
from circuitkit.detect.ablation import ablate as ablate_heads
from circuitkit.detect.agreement import agreement
from circuitkit.detect.attribution import attribute
from circuitkit.detect.loss import summarise
from circuitkit.detect.roles import (
    DEFAULT_ROLES,
    HEAD_CALL_NEUTRAL_RATIO,
    HEAD_CALL_THRESHOLD,
    MAX_ROLES,
    Role,
    called_by_score,
    called_heads,
    check_roles,
    group_labels,
    role_groups,
)
from circuitkit.detect.scores import HeadScores, PatternCollector
from circuitkit.detect.tokens import RepeatedTokens, TokenBatch, as_batch
from circuitkit.errors import CircuitkitError
from circuitkit.memory import check_memory
from circuitkit.models.adapters import ModelAdapter, adapt
from circuitkit.models.state import keeps_model_state
from circuitkit.ranking import Head
from circuitkit.scan_intervals import scan_intervals
from circuitkit.scan_types import HeadEffects, ModelSummary, Scan, ScanSettings, StageRecord
from circuitkit.uncertainty import DEFAULT_LEVEL, DEFAULT_RESAMPLES, DEFAULT_SEED, check_settings

ABLATE_OPTIONS = ("top", "all", "none")
DEFAULT_ABLATE_TOP = 8
"""Heads ranked by |attribution| ablated exactly (joined with the called heads), each about one resumed pass of
the batch. The exact set feeds the agreement figure and the ranked table (the circuit search ranks heads on its
own joint path); 8 keeps the scan near 24 counted passes on GPT-2-small / SmolLM shapes, Spearman over the set
measured in benchmarks/README.md ("Scan")."""
DEFAULT_N_PATCH = 8
"""Edges between the circuit's heads path-patched exactly (those with the largest |edge attribution|), each about
one resumed pass. Eight covers every previous-token -> induction K-edge of the bundled model's largest circuit
(2 x 4 heads at target 0.99: its eight K-edges rank first by two-step edge attribution, every Q/V edge below them
carries under 0.006 nats), and more than the ``top_k`` edges the answer lists."""
COMPOSITION_MODES = ("Q", "K", "V")
SPECTRA = ("QK", "OV")

ATTRIBUTION_METHOD = "gradient"
"""How the scan's attribution estimates are computed: ``"gradient"`` (first order) or ``"ig"`` (integrated
gradients); recorded in ``scores.json``."""
ATTRIBUTION_STEPS = 1
"""Integration steps of the head attribution (1: the plain gradient). Heads stay first order in the scan: the
integrated path that ranks heads like exact ablation (each layer's own, ``path="layer"``) costs about
``1 + (L + 1) / 2`` gradient passes (about 50 forward passes at 30 layers), the heads that count are ablated
exactly anyway, and the circuit search ranks heads with its own joint-path integrated gradients."""
EDGE_ATTRIBUTION_STEPS = 2
"""Integration steps of the scan's edge attribution (inputs path, EAP-IG). Two steps put the bundled model's
exact top 3 edges first, in order (first order: its strongest edge estimated at a tenth of its exact effect),
for one more gradient pass; the edges that count are then path-patched exactly."""


ATTRIBUTION_COST = 3
"""Passes of one forward + backward pass (a backward costs about two forwards)."""
SCORES_STAGE_COST = 1 + ATTRIBUTION_COST
"""The first stage: the forward + backward pass (3) and the pattern scores read on it (counted one, as planned
since the first version of the bar)."""
WEIGHT_STAGE_COST = 0
"""Composition and spectra read the weights only: no forward pass."""


# ---------------------------------------------------------------------------------------------- progress
@dataclass(frozen=True)
class Revision:
    """A change of the plan: ``stage``'s passes went from ``before`` to ``after`` (0: skipped), ``why`` in words."""

    stage: str
    before: int
    after: int
    why: str


class Progress:
    """The scan's progress over its stages, in passes of the batch (integers: one run of the batch through the
    model, resumed from a later layer or not, counts one; a backward pass counts two).

    ``plan``: ``(stage, passes)`` for each stage the scan will run, fixed before the first pass: the bar's total
    is their sum. The plan changes only through :meth:`revise` (a stage whose size became known, grew, shrank or
    is skipped), and each change is said in words (:attr:`revisions`; the bar's text, or a line). ``mode``:
    ``"bar"`` (tqdm, for a terminal), ``"lines"`` (one line per stage on ``stream``: a log or a pipe; the plan
    first), or ``"off"``."""

    def __init__(self, mode: str, plan: list[tuple[str, int]], stream: Any = None) -> None:
        self.mode = mode
        self.plan = [name for name, _ in plan]
        self.estimates = {name: int(passes) for name, passes in plan}
        self.planned_total = self._total()
        self.revisions: list[Revision] = []
        self.ran: list[StageRecord] = []
        self.stream = stream if stream is not None else sys.stderr
        self.current: str | None = None
        self.done = 0
        self.stage_passes = 0
        self.bar = None
        self.started = time.perf_counter()
        if mode == "bar":
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.planned_total, desc="scan", unit="pass", file=self.stream,
                            bar_format="{desc:<16}{percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} passes "
                            "[{elapsed}<{remaining}]")
        elif mode == "lines":
            stages = ", ".join(f"{name} {passes}" for name, passes in self.estimates.items())
            self._line(f"scan: {len(self.plan)} stages, {self.planned_total} passes planned ({stages})")

    def _line(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def _total(self) -> int:
        return sum(self.estimates.values())

    def revise(self, name: str, passes: int, why: str) -> None:
        """Change ``name``'s planned passes to ``passes`` (0 with a skipped stage), saying ``why``."""
        passes = int(passes)
        before = self.estimates.get(name, 0)
        if passes == before:
            return
        old_total = self._total()
        self.estimates[name] = passes
        self.revisions.append(Revision(name, before, passes, why))
        line = f"scan: plan {old_total} -> {self._total()} passes: {name} {before} -> {passes} ({why})"
        if self.bar is not None:  # the reason as a line above the bar (a postfix would squeeze the bar away)
            self.bar.total = self._total()
            self.bar.write(line, file=self.stream)
            self.bar.refresh()
        elif self.mode == "lines":
            self._line(line)

    def skip(self, name: str, why: str) -> None:
        """``name`` will not run: its passes leave the plan, and the bar says ``why``."""
        self.revise(name, 0, f"skipped: {why}")
        if name in self.plan:
            self.plan.remove(name)

    def start(self, name: str) -> None:
        self.current, self.stage_passes, self.stage_started = name, 0, time.perf_counter()
        if self.bar is not None:
            self.bar.set_description_str(f"scan: {name}")
            self.bar.refresh()

    def advance(self, passes: int) -> None:
        self.stage_passes += int(passes)
        if self.bar is not None:
            self.bar.n = self.done + min(self.stage_passes, self.estimates[self.current])
            self.bar.refresh()

    def end(self, why: str | None = None) -> None:
        """End the current stage. Its cost is the passes advanced; where that differs from the plan, the plan is
        revised first, saying ``why`` (default: the measured count)."""
        name = self.current
        passes = self.stage_passes
        if passes != self.estimates[name]:
            self.revise(name, passes, why or f"measured {passes} passes, planned {self.estimates[name]}")
        seconds = time.perf_counter() - self.stage_started
        self.done += passes
        self.ran.append(StageRecord(name, passes, seconds))
        if self.bar is not None:
            self.bar.n = self.done
            self.bar.refresh()
        elif self.mode == "lines":
            unit = "pass" if passes == 1 else "passes"
            self._line(f"scan [{len(self.ran)}/{len(self.plan)}] {name:<8} {passes:4d} {unit:<6} {seconds:7.2f} s")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.mode == "lines" and len(self.ran) == len(self.plan):
            total = sum(r.passes for r in self.ran)
            self._line(f"scan: done, {total} passes in {time.perf_counter() - self.started:.2f} s")


def progress_mode(progress: Any, stream: Any = None) -> str:
    """``progress`` (True / False / None / ``"bar"`` / ``"lines"``) as a mode: True and None draw a bar on a
    terminal and print lines elsewhere (None: nothing elsewhere)."""
    if isinstance(progress, str):
        return validate.option("scan: progress", progress, ("bar", "lines", "off"))
    if progress is not None:
        progress = validate.boolean("scan: progress", progress)
        if not progress:
            return "off"
    stream = stream if stream is not None else sys.stderr
    terminal = bool(getattr(stream, "isatty", lambda: False)())
    if terminal:
        return "bar"
    return "lines" if progress else "off"


# ---------------------------------------------------------------------------------------------- the stages
@dataclass
class _Work:
    """What the stages hand each other."""

    adapter: ModelAdapter
    batch: TokenBatch
    weights: Any
    edge_tap: Any = None
    attribution: HeadEffects | None = None
    run: Any = None
    head_scores: HeadScores | None = None
    loss: Any = None
    ablation: HeadEffects | None = None
    agreement: Any = None
    circuit_ablation: dict[str, float] = field(default_factory=dict)
    composition: dict = field(default_factory=dict)
    baselines: dict = field(default_factory=dict)
    edges: dict = field(default_factory=dict)
    spectra: dict = field(default_factory=dict)
    evidence: Any = None
    verified: Any = None
    verified_error: str | None = None
    ci: tuple[int, float, int] | None = None  # (n_resamples, level, seed) of the bootstrap intervals
    random_sets: int = 0  # random head sets per kind measured beside the circuit (0: none)
    circuit_ablation_each: dict[str, torch.Tensor] = field(default_factory=dict)  # label -> [batch] rises


STAGE_NAMES = {
    "scores": "one forward + backward pass: pattern scores, loss, every head's attribution estimate",
    "ablate": "exact ablation of the chosen heads, then the called heads together",
    "circuit": "circuit search: faithfulness of the top-n heads, exactly",
    "stability": "the circuit search rerun on bootstrap resamples of the batch (opt-in)",
    "weights": "composition and QK/OV spectra (weights only)",
    "edges": "edge attribution and exact path patching of the circuit's edges",
}
"""The scan's stages, in order (short names that fit a progress bar; what each does)."""


def stage_plan(ablate: str, circuit: bool, with_edges: bool, stability: bool = False) -> list[str]:
    """The stages a scan with these settings runs, in order (``with_edges``: edge evidence applies: a circuit
    search asked for, two layers or more, heads that add into the residual stream; ``stability``: the search rerun
    on resampled batches, after the circuit stage)."""
    plan = ["scores"]
    if ablate != "none":
        plan.append("ablate")
    if circuit:
        plan.append("circuit")
    if circuit and stability:
        plan.append("stability")
    plan.append("weights")
    if circuit and with_edges:
        plan.append("edges")
    return plan


def scores_stage(work: _Work, ablation_method: str, resumable: bool, with_edges: bool, bar: Progress) -> None:
    """One forward (+ one backward) pass: head scores, the loss, mean z, residual streams, head attribution and
    the clean half of edge attribution."""
    adapter, batch = work.adapter, work.batch
    spec = adapter.spec
    collector = PatternCollector(adapter, batch)
    work.edge_tap = _edge_tap(adapter, batch, work.weights) if with_edges else None
    work.attribution, work.run = attribute(
        adapter,
        batch,
        ablation_method,
        resid_layers=range(1, spec.n_layers) if resumable else (),
        observers=collector.hooks(),
        taps=[work.edge_tap] if work.edge_tap is not None else [],
    )
    work.head_scores = collector.result(work.weights)
    work.loss = summarise(work.run.losses, batch)
    bar.advance(SCORES_STAGE_COST)


ABLATION_GROUPS = group_labels(DEFAULT_ROLES)
"""The groups of called heads ablated together with the default roles (each role's, then all of them), each one
pass (a group without heads is not run)."""


def ablate_plan(ablate: str, ablate_top: int, n_total: int, n_groups: int = len(ABLATION_GROUPS)) -> int:
    """Planned passes of the ablate stage before the first pass: one per head ablated exactly (``ablate_top`` of
    them, or every head) and one per group of called heads ablated together (``n_groups``)."""
    heads = {"all": n_total, "top": min(n_total, ablate_top), "none": 0}[ablate]
    return heads + n_groups if heads else 0


def _ablate_revision(chosen: list[Head], groups: dict, ablate: str, ablate_top: int, n_total: int,
                     roles: Sequence[Role] = DEFAULT_ROLES) -> str:
    """Why the ablate stage's passes differ from :func:`ablate_plan`, in words."""
    parts = []
    labels = group_labels(roles)
    planned_heads = {"all": n_total, "top": min(n_total, ablate_top)}[ablate]
    if len(chosen) != planned_heads:
        parts.append(f"{len(chosen) - planned_heads} called head(s) outside the top {ablate_top} by attribution "
                     "join the exact set")
    if not groups:
        parts.append(f"no head is called {' or '.join(role.name for role in roles)}, so no group is ablated together")
    elif len(groups) < len(labels):
        missing = [role.group[:-1] for role in roles if role.group not in groups]
        parts.append(f"{len(groups)} groups ablated together, not {len(labels)} (no {missing[0]} called)")
    return "; ".join(parts)


def ablation_groups(head_scores: HeadScores, roles: Sequence[Role] = DEFAULT_ROLES) -> dict[str, tuple[Head, ...]]:
    """The groups of heads the roles' scores call, ablated together (:func:`circuitkit.detect.roles.role_groups`)."""
    return role_groups(roles, called_by_score(head_scores, roles))


def ablate_stage(work: _Work, ablate: str, ablate_top: int, ablation_method: str, resumable: bool,
                 bar: Progress, roles: Sequence[Role] = DEFAULT_ROLES) -> None:
    """Exact ablation of the heads that count, their agreement with the estimate, the called heads together."""
    adapter, spec = work.adapter, work.adapter.spec
    groups = ablation_groups(work.head_scores, roles)
    called = tuple(dict.fromkeys(h for heads in groups.values() for h in heads))
    chosen = exact_set(work.attribution, ablate, ablate_top, called)
    bar.revise("ablate", len(chosen) + len(groups),
               _ablate_revision(chosen, groups, ablate, ablate_top, spec.n_layers * spec.n_heads, roles))
    bar.start("ablate")
    work.ablation = ablate_heads(adapter, work.run, chosen, ablation_method, resume=resumable, progress=bar.advance)
    work.agreement = agreement(work.attribution, work.ablation)
    for label, heads in groups.items():
        work.circuit_ablation[label], work.circuit_ablation_each[label] = ablate_together_each(
            adapter, work.run, list(heads), ablation_method)
        bar.advance(1)


def circuit_estimate(n_heads_total: int, method: str, rank: str = "effect", with_edges: bool = True) -> int:
    """Planned passes of the circuit search: one with every head ablated (the gap faithfulness divides by), the
    geometric sizes, about log2 of the total for the bisection, one for necessity, one for the resampled batch
    where no earlier pass drew it; the joint-path ranking's passes where it is asked for (``"auto"`` adds them
    only when it turns to it: the plan is revised then, saying so)."""
    from circuitkit.circuits.faithfulness import DEFAULT_JOINT_STEPS, geometric_sizes

    search = len(geometric_sizes(n_heads_total)) + math.ceil(math.log2(max(2, n_heads_total)))
    joint = 3 * DEFAULT_JOINT_STEPS if rank == "joint" else 0  # "auto" adds them only where it turns to them
    return 1 + search + joint + 1 + (method == "resample" and not with_edges)


def edges_estimate(n_patch: int, circuit_heads: Sequence[Head] | None = None, *, corrupt_pass: bool = True) -> int:
    """Planned passes of the edge stage: the corrupted run (resampled batch), the further integration points of
    edge attribution (a forward + backward each) and one per edge path-patched: ``n_patch``, or as many edges as
    the circuit's heads have between them (three channels per pair in different layers) where fewer.
    ``corrupt_pass``: False where the circuit search already ran the resampled batch."""
    edges = n_patch
    if circuit_heads is not None:
        pairs = sum(1 for a in circuit_heads for b in circuit_heads if a[0] < b[0])
        edges = min(n_patch, 3 * pairs)
    return int(corrupt_pass) + (EDGE_ATTRIBUTION_STEPS - 1) * ATTRIBUTION_COST + edges


def circuit_stage(work: _Work, target: float, method: str, rank: str, bar: Progress) -> None:
    """The smallest set of top-ranked heads whose faithfulness reaches ``target`` (exact forward passes); heads
    ranked along the joint path (``rank="joint"``) or by exact single-head ablation where the scan ran it, else
    by the attribution estimate (``"effect"``)."""
    from circuitkit.circuits.faithfulness import Ablator, ablation_values, discover, rank_heads

    adapter = work.adapter
    effect = work.attribution.effect.clone()
    if work.ablation is not None and work.ablation.exact is not None:
        effect = torch.where(work.ablation.exact, work.ablation.effect, effect)
    order = rank_heads(effect)
    corrupt_z = work.edge_tap.ctx.z_corrupt if work.edge_tap is not None else None
    values, passes = ablation_values(adapter, work.batch, method, z_means=work.run.z_means, corrupt_z=corrupt_z)
    bar.advance(passes)
    if method == "resample" and work.edge_tap is not None and work.edge_tap.ctx.corrupt == "resample":
        # the same resampled batch (seed) as edge attribution's corrupted run: that run is then not needed
        work.edge_tap.ctx.z_corrupt.update(values)
    try:
        work.verified = discover(Ablator(adapter, work.batch, values), order, target, method,
                                 work.run.repeated_loss, extra_passes=passes, progress=bar.advance, rank=rank,
                                 clean_losses=work.run.repeated_per_sequence, intervals=work.ci,
                                 random_sets=work.random_sets)
    except CircuitkitError as error:  # no head matters on this batch: the scan reports it and goes on
        work.verified, work.verified_error = None, str(error)


def _circuit_revision(work: _Work) -> str:
    """Why the circuit stage's passes differ from its plan, in words."""
    if work.verified is None:
        return "no head changes the loss measurably, so the search stopped after its first pass"
    sizes = len(work.verified.curve)
    return f"the search measured {sizes} circuit sizes and stopped at {len(work.verified.heads)} heads"


def stability_stage(work: _Work, n: int, target: float, method: str, rank: str, bar: Progress) -> None:
    """The circuit search rerun on ``n`` bootstrap resamples of the batch (:mod:`circuitkit.circuits.stability`;
    each resample ranked by its own attribution estimate and, with ``rank="joint"``, its joint path)."""
    from circuitkit.circuits.faithfulness import DEFAULT_CORRUPT_SEED, resampled_search
    from circuitkit.circuits.stability import rerun

    if work.verified is None:
        return
    search = resampled_search(target, method, None, rank, DEFAULT_CORRUPT_SEED)
    stability = rerun(work.adapter, work.batch, n, search, progress=bar.advance)
    work.verified = replace(work.verified, stability=stability)


def stability_estimate(n: int, n_heads_total: int, method: str, rank: str) -> float:
    """Planned passes of ``n`` reruns: each an attribution pass (3), the mean values (1) and a circuit search."""
    return int(n * (ATTRIBUTION_COST + 1 + circuit_estimate(n_heads_total, method, rank, with_edges=False)))


def weights_stage(work: _Work, top_k: int) -> None:
    work.composition, work.baselines, work.edges = _composition(work.weights, top_k)
    work.spectra = _spectra(work.weights)


def edges_stage(work: _Work, top_k: int, n_patch: int, bar: Progress) -> None:
    """Edge attribution over every edge and exact path patching of the ``n_patch`` edges among the circuit's
    heads with the largest |attribution| (without a circuit: the top ``n_patch`` edges of the model)."""
    ctx = work.edge_tap.ctx
    corrupt_pass = 0.0 if len(ctx.z_corrupt) >= ctx.spec.n_layers - 1 else 1.0
    among = work.verified.heads if work.verified is not None else None
    work.evidence = _circuit_evidence(work.edge_tap, work.composition, top_k, n_patch, among)
    patched = work.evidence.patching.edges
    integration = (EDGE_ATTRIBUTION_STEPS - 1) * ATTRIBUTION_COST  # one forward + backward per further point
    bar.advance(int(corrupt_pass) + integration + len(patched))
    if work.verified is not None:
        work.verified = replace(work.verified, edges=work.evidence.patching)


def circuit_roles(head_scores: HeadScores, circuit: Any, roles: Sequence[Role]) -> dict[str, tuple[Head, ...]]:
    """Which circuit heads the answer gives each role: a head of the circuit whose ``role.score`` passes the
    threshold (:func:`called_heads`); for a role that ``feeds`` another, only where it sits in an earlier layer
    than a head of that role and an exactly patched edge from it into one carries (|effect| at least
    :data:`circuitkit.circuits.evidence.CARRIES_NOTHING_FRACTION` of the circuit's largest)."""
    from circuitkit.circuits.evidence import CARRIES_NOTHING_FRACTION

    members = set(circuit.heads)
    out: dict[str, tuple[Head, ...]] = {}
    edges = list(circuit.edges.edges) if circuit.edges is not None else []
    largest = max((abs(e.effect) for e in edges), default=0.0)
    ordered = sorted(roles, key=lambda role: role.feeds is not None)  # roles fed by others first
    for role in ordered:
        heads = tuple(h for h in called_heads(head_scores, role.score) if h in members)
        if role.feeds is not None:
            fed = out.get(role.feeds, ())
            heads = tuple(h for h in heads if any(
                e.src == h and e.dst in fed and largest > 0 and abs(e.effect) >= CARRIES_NOTHING_FRACTION * largest
                for e in edges))
        out[role.name] = heads
    return {role.name: out[role.name] for role in roles}


# ---------------------------------------------------------------------------------------------- scan
@keeps_model_state
def scan(
    model: Any = None,
    *,
    tokens: RepeatedTokens | TokenBatch | None = None,
    ablate: str = "top",
    ablate_top: int = DEFAULT_ABLATE_TOP,
    ablation_method: str = "mean",
    top_k: int = 5,
    n_patch: int = DEFAULT_N_PATCH,
    circuit: bool = True,
    target: float = DEFAULT_TARGET,
    faithfulness_method: str | None = None,
    circuit_rank: str = "joint",
    roles: Sequence[Role] | None = None,
    device: str | torch.device | None = None,
    progress: bool | str | None = False,
    name: str | None = None,
    allow_download: bool = False,
    task: Any = None,
    n_resamples: int = DEFAULT_RESAMPLES,
    ci_level: float = DEFAULT_LEVEL,
    random_sets: int = 0,
    stability: int = 0,
) -> Scan:
    """Score every head, check the important ones causally, find the circuit, read composition and spectra.

    Args:
        model: a loaded model (TransformerBridge, toy model, any model under :mod:`circuitkit.models.adapters`),
            or what :func:`circuitkit.models.load_model` takes (a zoo name, a local Hugging Face directory, a
            cached hub name; ``None``: the bundled known-answer model).
        tokens: the batch spec (:class:`~circuitkit.detect.RepeatedTokens`) or a built batch.
        ablate: ``"top"`` (default: exact ablation of the top ``ablate_top`` heads by |attribution| joined with
            the heads called induction / previous-token heads), ``"all"`` or ``"none"``.
        ablation_method: ``"mean"`` or ``"zero"`` (for attribution and exact ablation alike).
        top_k: composition edges per mode, heads per score and edges the summary lists.
        n_patch: edges between the circuit's heads path-patched exactly (largest |edge attribution| first).
        circuit: find the circuit by faithfulness (:mod:`circuitkit.circuits.faithfulness`) and compute edge-level
            causal evidence (edge attribution + path patching of the circuit's edges).
        target: the faithfulness the circuit must reach, in ``(0, 1]``.
        faithfulness_method: how heads outside the circuit are ablated: ``"mean"``, ``"zero"``, ``"resample"``
            (default: ``ablation_method``).
        circuit_rank: the order heads join the circuit (:data:`circuitkit.circuits.faithfulness.RANKINGS`):
            ``"joint"`` (default: integrated gradients along the joint all-ablated -> clean path, so heads that
            matter together join together; about 6 passes), ``"effect"`` (exact single-head ablation where
            measured, else the estimate; no extra pass), ``"auto"`` (effect, and joint too where the effect
            ranking needs more than 10% of the heads).
        roles: the roles the answer gives circuit heads (default :data:`DEFAULT_ROLES`): :class:`Role` s or
            ``(name, score[, feeds])`` with any registered head score.
        device: where to run (default: the model's device).
        progress: ``True``: a bar on a terminal, one line per stage otherwise (logs, pipes); ``"bar"``,
            ``"lines"``; ``None``: a bar on a terminal, else nothing; ``False`` (default in library use): nothing.
        name: the model's name in the report (default: the name it was loaded by, else its class).
        task: the behaviour to find the circuit of: ``None`` or ``"induction"`` (repeated random tokens, this
            scan), a :class:`circuitkit.tasks.Task`, a built-in task's name (``"ioi"``, ``"greater-than"``,
            ``"docstring"``) or a task file's path: then :func:`circuitkit.tasks.scan_task` runs (node and edge
            circuits by counterfactual patching, with ``target``) and a :class:`~circuitkit.tasks.TaskScan` is
            returned.
        n_resamples, ci_level: the percentile bootstrap over the batch's sequences behind every figure's interval
            (:mod:`circuitkit.scan_intervals`; seed 0, from values the passes kept: no extra pass).
        random_sets: measure that many random head sets of the circuit's size per kind (uniform, and with the
            circuit's per-layer counts) beside the circuit (:mod:`circuitkit.circuits.baseline`; ``2 *
            random_sets`` passes, in the circuit stage's plan; 0, the default: none).
        stability: rerun the circuit search on that many bootstrap resamples of the batch: each head's inclusion
            frequency and the mean pairwise Jaccard (:mod:`circuitkit.circuits.stability`; a stage of its own,
            each rerun about one circuit search plus an attribution pass; 0, the default: none).

    Returns:
        :class:`~circuitkit.scan_types.Scan` (a :class:`~circuitkit.tasks.TaskScan` for a task); ``.save(dir)``
        writes report.html and scores.json.
    """
    from circuitkit.circuits.faithfulness import FAITHFULNESS_METHODS, RANKINGS, check_target

    ablate = validate.option("scan: ablate", ablate, ABLATE_OPTIONS)
    ablate_top = validate.positive_int("scan: ablate_top", ablate_top)
    ablation_method = validate.option("scan: ablation_method", ablation_method, ABLATION_METHODS)
    top_k = validate.positive_int("scan: top_k", top_k)
    n_patch = validate.positive_int("scan: n_patch", n_patch)
    circuit = validate.boolean("scan: circuit", circuit)
    target = check_target("scan: target", target)
    faithfulness_method = validate.option("scan: faithfulness_method", faithfulness_method or ablation_method,
                                          FAITHFULNESS_METHODS)
    circuit_rank = validate.option("scan: circuit_rank", circuit_rank, RANKINGS)
    roles = check_roles(DEFAULT_ROLES if roles is None else roles)
    n_resamples, ci_level, ci_seed = check_settings("scan", n_resamples, ci_level, DEFAULT_SEED)
    random_sets = check_repeats("scan: random_sets", random_sets)
    stability = check_repeats("scan: stability", stability)
    device = validate.device("scan: device", device)
    mode = progress_mode(progress)
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise validate.fail("scan: name", name, "a non-empty string")
    if mode == "lines":  # the first line at once: loading a model can take a while
        print("scan: preparing the model and the batch", file=sys.stderr, flush=True)
    if model is None or isinstance(model, (str, os.PathLike)):
        from circuitkit import zoo
        from circuitkit.models.loading import load_model

        name = name or (str(model) if model is not None else zoo.DEFAULT)
        model = load_model(model, device=device, allow_download=allow_download)
    if task is not None and not (isinstance(task, str) and task == "induction"):
        if tokens is not None:
            raise validate.fail("scan: tokens", tokens, "None when a task is given (the task brings its prompts)")
        induction_only = {"ablate": (ablate, "top"), "ablate_top": (ablate_top, DEFAULT_ABLATE_TOP),
                          "ablation_method": (ablation_method, "mean"), "top_k": (top_k, 5),
                          "n_patch": (n_patch, DEFAULT_N_PATCH), "circuit": (circuit, True),
                          "faithfulness_method": (faithfulness_method, ablation_method),
                          "circuit_rank": (circuit_rank, "joint"), "roles": (roles, DEFAULT_ROLES),
                          "random_sets": (random_sets, 0), "stability": (stability, 0)}
        changed = [key for key, (value, default) in induction_only.items() if value != default]
        if changed:
            raise validate.fail(f"scan: {changed[0]}", induction_only[changed[0]][0],
                                f"its default with a task (the induction scan's settings {changed} do not apply "
                                "to a task scan; see circuitkit.tasks.scan_task for its own)")
        return _task_scan(model, task, target=target, device=device, name=name, mode=mode,
                          n_resamples=n_resamples, ci_level=ci_level)
    adapter = adapt(model, device)
    spec = adapter.spec
    batch = as_batch(tokens, adapter)
    resumable = ablate != "none" and adapter.can_resume
    n_total = spec.n_total_heads
    with_edges = circuit and spec.n_layers > 1 and adapter.additive_heads  # else edges cannot be isolated
    if isinstance(tokens, RepeatedTokens) or tokens is None:  # before any pass: refuse what cannot fit
        spec_tokens = tokens or RepeatedTokens()
        check_memory(adapter.model, spec_tokens.batch, spec_tokens.block_len, spec_tokens.n_repeats,
                     bos=spec_tokens.bos is not False, circuit=circuit, device=device)
    plan = stage_plan(ablate, circuit, with_edges, stability > 0)
    reused_corrupt = circuit and faithfulness_method == "resample"  # the search's resampled run serves the edges
    estimates = {
        "scores": SCORES_STAGE_COST,
        # revised once the exact set is known, saying why
        "ablate": ablate_plan(ablate, ablate_top, n_total, len(group_labels(roles))),
        "circuit": circuit_estimate(n_total, faithfulness_method, circuit_rank, with_edges) + 2 * random_sets,
        "stability": stability_estimate(stability, n_total, faithfulness_method, circuit_rank),
        "weights": WEIGHT_STAGE_COST,
        "edges": edges_estimate(n_patch, corrupt_pass=not reused_corrupt),
    }
    bar = Progress(mode, [(stage, estimates[stage]) for stage in plan])
    work = _Work(adapter, batch, adapter.weights(), ci=(n_resamples, ci_level, ci_seed), random_sets=random_sets)
    try:
        bar.start("scores")
        scores_stage(work, ablation_method, resumable, with_edges, bar)
        bar.end()
        roles = check_roles(roles, work.head_scores)
        if ablate != "none":
            ablate_stage(work, ablate, ablate_top, ablation_method, resumable, bar, roles)  # starts its own stage
            bar.end()
        if circuit:
            bar.start("circuit")
            circuit_stage(work, target, faithfulness_method, circuit_rank, bar)
            bar.end(_circuit_revision(work))
        if circuit and stability:
            bar.start("stability")
            stability_stage(work, stability, target, faithfulness_method, circuit_rank, bar)
            bar.end()
        bar.start("weights")
        weights_stage(work, top_k)
        bar.end()
        if with_edges and work.verified is None:  # the edge evidence serves the circuit: none, so no edges
            bar.skip("edges", "no circuit found, and edge attribution and path patching serve the circuit")
        elif with_edges:
            bar.revise("edges", edges_estimate(n_patch, work.verified.heads, corrupt_pass=not reused_corrupt),
                       f"the circuit's {len(work.verified.heads)} heads have fewer than {n_patch} edges between them"
                       if not reused_corrupt else "the circuit search already ran the resampled batch")
            bar.start("edges")
            edges_stage(work, top_k, n_patch, bar)
            bar.end()
        if work.verified is not None:
            work.verified = replace(work.verified, roles=circuit_roles(work.head_scores, work.verified, roles))
        intervals = scan_intervals(
            head_scores=work.head_scores, run=work.run, attribution=work.attribution, ablation=work.ablation,
            circuit_ablation=work.circuit_ablation_each, edges=getattr(work.verified, "edges", None),
            n_resamples=n_resamples, level=ci_level, seed=ci_seed)
    finally:
        bar.close()

    from circuitkit.viz.attention import token_strings

    settings = ScanSettings(
        block_len=batch.block_len,
        n_repeats=batch.n_repeats,
        batch=batch.batch,
        seed=tokens.seed if isinstance(tokens, RepeatedTokens) else 0,
        bos=batch.bos,
        ablate=ablate,
        ablate_top=ablate_top,
        ablation_method=ablation_method,
        top_k=top_k,
        device=str(spec.device),
        n_patch=n_patch,
        target=target,
        faithfulness_method=faithfulness_method,
        circuit_rank=circuit_rank,
        attribution_method=ATTRIBUTION_METHOD,
        attribution_steps=ATTRIBUTION_STEPS,
        edge_attribution_steps=EDGE_ATTRIBUTION_STEPS if with_edges else None,
        roles=roles,
        n_resamples=n_resamples,
        ci_level=ci_level,
        random_sets=random_sets,
        stability=stability,
    )
    head_scores = work.head_scores
    return Scan(
        model=summarise_model(adapter, name),
        settings=settings,
        head_scores=head_scores,
        tokens=tuple(token_strings(model, batch.tokens[0].cpu())),
        patterns=head_scores.patterns,
        induction_loss=work.loss,
        attribution=work.attribution,
        ablation=work.ablation,
        agreement=work.agreement,
        composition=work.composition,
        baselines=work.baselines,
        edges=work.edges,
        spectra=work.spectra,
        circuit=work.evidence,
        called=called_by_score(head_scores, roles),
        circuit_ablation=work.circuit_ablation,
        verified=work.verified,
        verified_error=work.verified_error,
        stages=tuple(bar.ran),
        intervals=intervals,
    )


def _task_scan(model: Any, task: Any, *, target: float, device: Any, name: str | None, mode: str,
               n_resamples: int, ci_level: float) -> Any:
    """A task's circuit (:func:`circuitkit.tasks.scan_task`), with one progress line per stage unless ``mode`` is
    ``"off"``."""
    from circuitkit.tasks import Task, get_task, scan_task

    if not isinstance(task, Task):
        if not isinstance(task, (str, os.PathLike)):
            raise validate.fail("scan: task", task, "a Task, a built-in task name or a task file's path")
        task = get_task(os.fspath(task), model)
    started = time.perf_counter()

    def line(stage: str, passes: float) -> None:
        if mode != "off":
            print(f"scan {task.name}: {stage:<9} {passes:3.0f} passes {time.perf_counter() - started:7.1f} s",
                  file=sys.stderr, flush=True)

    return scan_task(model, task, target=target, device=device, name=name, progress=line, n_resamples=n_resamples,
                     ci_level=ci_level)


def exact_set(attribution: HeadEffects, ablate: str, ablate_top: int, circuit: tuple[Head, ...]) -> list[Head]:
    """The heads ablated exactly: all of them, or the top ``ablate_top`` by |attribution| joined with ``circuit``."""
    n_layers, n_heads = attribution.effect.shape
    if ablate == "all":
        return [(layer, head) for layer in range(n_layers) for head in range(n_heads)]
    chosen = {head for head, _ in attribution.top(ablate_top, absolute=True)}
    return sorted(chosen | set(circuit))


def summarise_model(adapter: ModelAdapter, name: str | None) -> ModelSummary:
    spec = adapter.spec
    if name is None:
        name = adapter.default_name
    return ModelSummary(
        name=str(name),
        n_layers=spec.n_layers,
        n_heads=spec.n_heads,
        d_model=spec.d_model,
        d_head=spec.d_head,
        d_vocab=spec.d_vocab,
        n_ctx=spec.n_ctx,
        n_kv_heads=spec.n_kv_heads,
        attn_only=adapter.attn_only,
        family=spec.family,
    )


def _composition(weights: Any, top_k: int) -> tuple[dict, dict, dict]:
    from circuitkit.composition import composition_baseline, composition_scores, top_edges

    composition, baselines, edges = {}, {}, {}
    if weights.n_layers > 1:
        for mode in COMPOSITION_MODES:
            composition[mode] = composition_scores(weights, mode).float().cpu()
            baselines[mode] = composition_baseline(weights, mode)
            edges[mode] = top_edges(composition[mode], k=top_k)
    return composition, baselines, edges


def _spectra(weights: Any) -> dict[str, torch.Tensor]:
    from circuitkit.factored import singular_values

    return {circuit: singular_values(weights, circuit).float().cpu() for circuit in SPECTRA}


def _edge_tap(adapter: ModelAdapter, batch: TokenBatch, weights: Any) -> Any:
    """Edge attribution's clean pass (repeated-copies loss, resampled corruption) as a tap on the scan's
    attribution pass: the same loss, differentiated once."""
    from circuitkit.circuits._engine import DEFAULT_CORRUPT_SEED, context
    from circuitkit.circuits.attribution import GradientTap
    from circuitkit.circuits.metrics import resolve_metric

    ctx = context(adapter, batch, "resample", DEFAULT_CORRUPT_SEED, None, "scan", weights)
    return GradientTap(ctx, resolve_metric("loss", "scan"), leaf=False)


def _circuit_evidence(tap: Any, composition: dict, top_k: int, n_patch: int, among: Any) -> Any:
    """Edge-level evidence (:func:`circuitkit.circuits.circuit_evidence`) on the scan's batch, from the tap's
    clean pass and the scan's composition scores (keyed by lower-case channel there); the patched edges are
    those among the heads ``among`` (the circuit) where given."""
    from circuitkit.circuits.evidence import evidence_in

    # composition exists whenever evidence does (both need two layers)
    channels = {mode.lower(): scores.float().cpu() for mode, scores in composition.items()}
    return evidence_in(tap.ctx, tap.m, channels, top_k, n_patch, among, steps=EDGE_ATTRIBUTION_STEPS)


__all__ = [
    "ABLATE_OPTIONS",
    "DEFAULT_ABLATE_TOP",
    "DEFAULT_N_PATCH",
    "DEFAULT_ROLES",
    "STAGE_NAMES",
    "Progress",
    "circuit_roles",
    "stage_plan",
    "HEAD_CALL_NEUTRAL_RATIO",
    "MAX_ROLES",
    "Role",
    "check_roles",
    "HEAD_CALL_THRESHOLD",
    "called_heads",
    "exact_set",
    "scan",
]
