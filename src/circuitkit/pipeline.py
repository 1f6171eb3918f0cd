"""``circuitkit.scan(model) -> Scan``: the whole pipeline as one library call (the CLI is a thin shell on it).

(The module is called ``pipeline``, not ``scan``: a submodule named like the public function would replace
``circuitkit.scan`` on import.)

How a scan runs: its options are checked, the model is adapted once and the batch built in one
:class:`~circuitkit.detect.session.Session` (which then holds every cache a measurement reads: the clean run, the
corrupted ``z``, the edge gradients), the settings become one :class:`~circuitkit.scan_types.ScanSettings`, and the
declared stages (:data:`STAGES`, each a :class:`~circuitkit.stage.Stage`: its name, the :class:`ScanState` fields it
reads and writes, its planned passes, its run) fill a :class:`ScanState`, which :func:`scan_result` turns into the
:class:`~circuitkit.scan_types.Scan` record. The stages (:data:`STAGE_NAMES`; :func:`stage_plan` says which run)::

    scores   tokens (RepeatedTokens) -> one forward + one backward pass: every head's pattern scores, per-token
             losses, mean z per head, residual streams (for resumed ablation), attribution (a first-order ablation
             estimate for every head) and the clean half of edge attribution
    ablate   exact ablation of the heads that count: the top ``ablate_top`` by |attribution|, and for each role
             whose called heads have none among them its strongest (``ablate="top"``; :func:`exact_set`), every
             head (``"all"``) or none; agreement of estimate and exact; each role's called heads ablated together,
             then all of them
    circuit  the verified circuit: heads ranked by their joint-path attribution (or by exact ablation where
             measured, else the estimate); the smallest top-n set whose faithfulness reaches ``target``, measured
             exactly (:mod:`circuitkit.circuits.faithfulness`), and its necessity; with ``random_sets``, random
             head sets of its size measured beside it (2 passes a set pair); then the found heads' faithfulness on a
             held-out batch of the same spec, seed + 1 (:mod:`circuitkit.circuits.heldout`; 4 copies, 5 with resample)
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

Which heads a score calls and the roles the answer gives (:data:`DEFAULT_ROLES`: induction, previous-token) are
data in :mod:`circuitkit.detect.roles` (re-exported here).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch

from circuitkit import validate
from circuitkit.circuits.attribution import GradientTap
from circuitkit.circuits.faithfulness import DEFAULT_TARGET, check_repeats
from circuitkit.circuits.heldout import evaluation_passes, evaluation_seed, evaluation_spec, held_out
from circuitkit.circuits.search import search_estimate
from circuitkit.cpu_threads import warn_if_threads_spin
from circuitkit.detect.ablation import ABLATION_METHODS, ablate_together_each
from circuitkit.detect.ablation import ablate as ablate_heads
from circuitkit.detect.agreement import DEFAULT_ABLATE_TOP, agreement, check_ablate_top
from circuitkit.detect.attribution import attribute
from circuitkit.detect.clean_run import CleanRun
from circuitkit.detect.loss import InductionLoss, summarise
from circuitkit.detect.roles import (
    DEFAULT_ROLES,
    HEAD_CALL_NEUTRAL_RATIO,
    HEAD_CALL_THRESHOLD,
    MAX_ROLES,
    TOGETHER,
    Role,
    called_by_score,
    called_heads,
    check_roles,
    group_labels,
    role_groups,
)
from circuitkit.detect.scores import HeadScores, PatternCollector
from circuitkit.detect.session import Session, open_session
from circuitkit.detect.tokens import RepeatedTokens, TokenBatch
from circuitkit.errors import CircuitkitError
from circuitkit.memory import check_memory
from circuitkit.models.state import keeps_model_state
from circuitkit.progress import Progress, Revision, progress_mode  # noqa: F401  (re-exported: pipeline.Progress)
from circuitkit.ranking import Head
from circuitkit.scan_intervals import scan_intervals
from circuitkit.scan_types import Agreement, HeadEffects, Scan, ScanSettings, StageRecord, summarise_model
from circuitkit.stage import Stage, plan_of, run_planned
from circuitkit.uncertainty import DEFAULT_LEVEL, DEFAULT_RESAMPLES, DEFAULT_SEED, check_settings

if TYPE_CHECKING:
    from circuitkit.circuits.evidence import CircuitEvidence
    from circuitkit.circuits.faithfulness import Circuit
    from circuitkit.composition import CompositionBaseline, Edge
    from circuitkit.weights import HeadWeights

ABLATE_OPTIONS = ("top", "all", "none")
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
# Progress, Revision and progress_mode live in circuitkit.progress (the task scan plans its passes with them too)


# ---------------------------------------------------------------------------------------------- the stages
@dataclass
class ScanState:
    """What the stages read and write: the :class:`~circuitkit.detect.session.Session` (the adapted model, the
    batch, the clean run, the corrupted ``z`` and the gradients, each made once) and each stage's results (empty
    until the stage that writes them ran; :attr:`Stage.reads` / :attr:`Stage.writes` name these fields)."""

    session: Session
    edge_tap: GradientTap | None = None
    attribution: HeadEffects | None = None
    head_scores: HeadScores | None = None
    loss: InductionLoss | None = None
    ablation: HeadEffects | None = None
    agreement: Agreement | None = None
    circuit_ablation: dict[str, float] = field(default_factory=dict)
    circuit_ablation_each: dict[str, torch.Tensor] = field(default_factory=dict)  # label -> [batch] rises
    composition: dict[str, torch.Tensor] = field(default_factory=dict)
    baselines: dict[str, CompositionBaseline] = field(default_factory=dict)
    edges: dict[str, list[Edge]] = field(default_factory=dict)
    spectra: dict[str, torch.Tensor] = field(default_factory=dict)
    evidence: CircuitEvidence | None = None
    verified: Circuit | None = None
    verified_error: str | None = None

    @property
    def run(self) -> CleanRun:
        """The clean run the scores stage's pass filled (losses, mean ``z``, residual streams)."""
        if self.session.clean is None:
            raise RuntimeError("scan: a stage read the clean run before the scores stage ran")  # a bug, not input
        return self.session.clean


def _n_total(state: ScanState) -> int:
    """Every head of the model (what the ablation and circuit plans are counted over)."""
    return state.session.spec.n_total_heads


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


def _resumable(state: ScanState, settings: ScanSettings) -> bool:
    """Whether exact ablation resumes each head's pass at its layer (the scores pass then keeps the streams)."""
    return settings.ablate != "none" and state.session.adapter.can_resume


def scores_stage(state: ScanState, settings: ScanSettings, bar: Progress) -> None:
    """One forward (+ one backward) pass: head scores, the loss, mean z, residual streams, head attribution and
    the clean half of edge attribution; then the roles are checked against the scores computed."""
    session = state.session
    adapter, batch = session.adapter, session.batch
    bar.start("scores")
    collector = PatternCollector(adapter, batch)
    state.edge_tap = _edge_tap(session) if settings.with_edges else None
    state.attribution, session.clean = attribute(
        adapter,
        batch,
        settings.ablation_method,
        resid_layers=range(1, adapter.spec.n_layers) if _resumable(state, settings) else (),
        observers=collector.hooks(),
        taps=[state.edge_tap] if state.edge_tap is not None else [],
    )
    state.head_scores = collector.result(session.weights())
    state.loss = summarise(session.clean.losses, batch)
    bar.advance(SCORES_STAGE_COST)
    bar.end()
    check_roles(settings.roles, state.head_scores)


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
        parts.append(f"{len(chosen) - planned_heads} role(s) have no called head in the top {ablate_top} by "
                     "attribution: the strongest of each joins the exact set")
    if not groups:
        parts.append(f"no head is called {' or '.join(role.name for role in roles)}, so no group is ablated together")
    elif len(groups) < len(labels):
        missing = [role.group[:-1] for role in roles if role.group not in groups]
        parts.append(f"{len(groups)} groups ablated together, not {len(labels)} (no {missing[0]} called)")
    return "; ".join(parts)


def ablation_groups(head_scores: HeadScores, roles: Sequence[Role] = DEFAULT_ROLES) -> dict[str, tuple[Head, ...]]:
    """The groups of heads the roles' scores call, ablated together (:func:`circuitkit.detect.roles.role_groups`)."""
    return role_groups(roles, called_by_score(head_scores, roles))


def ablate_stage(state: ScanState, settings: ScanSettings, bar: Progress) -> None:
    """Exact ablation of the heads that count, their agreement with the estimate, the called heads together."""
    adapter, spec = state.session.adapter, state.session.spec
    roles, method = settings.roles, settings.ablation_method
    groups = ablation_groups(state.head_scores, roles)
    called = [heads for label, heads in groups.items() if label != TOGETHER]  # one group per role
    chosen = exact_set(state.attribution, settings.ablate, settings.ablate_top, called)
    bar.revise("ablate", len(chosen) + len(groups),
               _ablate_revision(chosen, groups, settings.ablate, settings.ablate_top, spec.n_total_heads, roles))
    bar.start("ablate")
    state.ablation = ablate_heads(adapter, state.run, chosen, method, resume=_resumable(state, settings),
                                  progress=bar.advance)
    state.agreement = agreement(state.attribution, state.ablation)
    for label, heads in groups.items():
        state.circuit_ablation[label], state.circuit_ablation_each[label] = ablate_together_each(
            adapter, state.run, list(heads), method)
        bar.advance(1)
    bar.end()


def circuit_estimate(n_heads_total: int, method: str, rank: str = "effect", with_edges: bool = True, *,
                     batch: int | None = None, clean_end: bool = False) -> int:
    """Planned passes of the circuit search: one with every head ablated (the gap faithfulness divides by); the
    coarse search's rounds and two exact sizes where the batch splits (``batch``: its sequences), else the geometric
    sizes and about log2 of the total for the bisection; one for necessity; one for the resampled batch where no
    earlier pass drew it; the joint-path ranking's passes where it is asked for (one stacked copy, 3 passes, with
    ``clean_end``: the scan's attribution gives the path's clean end; else two; ``"auto"`` adds them only when it
    turns to it: the plan is revised then, saying so)."""
    from circuitkit.circuits.faithfulness import COARSE_MIN_SEQUENCES, COARSE_SETS, geometric_sizes

    if batch is not None and batch // COARSE_SETS >= COARSE_MIN_SEQUENCES:
        rounds = 1 + math.ceil(math.log(max(2.0, n_heads_total / 4)) / math.log(COARSE_SETS + 1))
        search = rounds + 2
    else:
        search = len(geometric_sizes(n_heads_total)) + math.ceil(math.log2(max(2, n_heads_total)))
    joint = 3 * (1 if clean_end else 2) if rank == "joint" else 0  # "auto" adds them only where it turns to them
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


def circuit_stage(state: ScanState, settings: ScanSettings, bar: Progress) -> None:
    """The smallest set of top-ranked heads whose faithfulness reaches ``target`` (exact forward passes); heads
    ranked along the joint path (``rank="joint"``) or by exact single-head ablation where the scan ran it, else
    by the attribution estimate (``"effect"``)."""
    from circuitkit.circuits.faithfulness import Ablator, ablation_values, discover, rank_heads

    session, method = state.session, settings.faithfulness_method
    bar.start("circuit")
    effect = state.attribution.effect.clone()
    if state.ablation is not None and state.ablation.exact is not None:
        effect = torch.where(state.ablation.exact, state.ablation.effect, effect)
    order = rank_heads(effect)
    ctx = state.edge_tap.ctx if state.edge_tap is not None else None
    values, passes = ablation_values(session.adapter, session.batch, method, z_means=state.run.z_means,
                                     corrupt_z=ctx.z_corrupt if ctx is not None else None)
    bar.advance(passes)
    if method == "resample" and ctx is not None and ctx.corrupt == "resample":
        # the same resampled batch (seed) as edge attribution's corrupted run: that run is then not needed
        ctx.z_corrupt.update(values)
    ablator, searching = Ablator(session.adapter, session.batch, values), settings.search != "ranked"
    intervals = (settings.n_resamples, settings.ci_level, DEFAULT_SEED)
    try:
        # the attribution estimate ablates to the same values as the search (mean: the clean run's z means; zero):
        # minus it is the joint path's gradient at the clean end
        clean_gradient = -state.attribution.effect if method == state.attribution.method else None
        state.verified = discover(ablator, order, settings.target, method, state.run.repeated_loss,
                                  extra_passes=passes, progress=bar.advance, rank=settings.circuit_rank,
                                  clean_gradient=clean_gradient, clean_losses=state.run.repeated_per_sequence,
                                  intervals=intervals, random_sets=0 if searching else settings.random_sets)
    except CircuitkitError as error:  # no head matters on this batch: the scan reports it and goes on
        state.verified, state.verified_error = None, str(error)
    if state.verified is not None and searching:  # the ranked circuit searched further, its figures measured again
        from circuitkit.circuits.search import search_found

        state.verified = search_found(ablator, state.verified, settings.search, settings.search_options,
                                      intervals=intervals, random_sets=settings.random_sets, progress=bar.advance)
    if state.verified is not None and settings.evaluation_seed is not None:  # the found heads on held-out sequences
        state.verified = replace(state.verified, evaluation=held_out(
            session.adapter, evaluation_spec(block_len=settings.block_len, n_repeats=settings.n_repeats,
                                             batch=settings.batch, seed=settings.evaluation_seed, bos=settings.bos,
                                             token_range=settings.token_range),
            state.verified.heads, method))
        bar.advance(state.verified.evaluation["passes"])
    bar.end(_circuit_revision(state))


def _circuit_revision(state: ScanState) -> str:
    """Why the circuit stage's passes differ from its plan, in words."""
    if state.verified is None:
        return "no head changes the loss measurably, so the search stopped after its first pass"
    searched = state.verified.search
    ranked = len(state.verified.heads) if searched is None else searched.start  # the ranked search's circuit
    said = f"the search measured {len(state.verified.curve)} circuit sizes and stopped at {ranked} heads"
    if searched is None:
        return said
    from circuitkit.circuits.search import stop_words

    took = f"took them to {searched.size}" if searched.size != searched.start else "kept them all"
    return (f"{said}; the {searched.search} search {took} in {searched.passes:.1f} passes, "
            f"{stop_words(searched.settings.get('stopped'))}")


def stability_stage(state: ScanState, settings: ScanSettings, bar: Progress) -> None:
    """The circuit search rerun on ``settings.stability`` bootstrap resamples of the batch
    (:mod:`circuitkit.circuits.stability`; each resample ranked by its own attribution estimate and, with
    ``rank="joint"``, its joint path)."""
    from circuitkit.circuits.faithfulness import DEFAULT_CORRUPT_SEED, resampled_search
    from circuitkit.circuits.stability import rerun

    bar.start("stability")
    if state.verified is not None:
        search = resampled_search(settings.target, settings.faithfulness_method, None, settings.circuit_rank,
                                  DEFAULT_CORRUPT_SEED)
        stability = rerun(state.session.adapter, state.session.batch, settings.stability, search,
                          progress=bar.advance)
        state.verified = replace(state.verified, stability=stability)
    bar.end()


def stability_estimate(n: int, n_heads_total: int, method: str, rank: str, batch: int | None = None) -> float:
    """Planned passes of ``n`` reruns: each an attribution pass (3), the mean values (1) and a circuit search."""
    return int(n * (ATTRIBUTION_COST + 1 + circuit_estimate(n_heads_total, method, rank, with_edges=False,
                                                             batch=batch, clean_end=method != "resample")))


def weights_stage(state: ScanState, settings: ScanSettings, bar: Progress) -> None:
    """Composition scores, their random baselines and top edges per mode; the QK/OV spectra (no forward pass)."""
    bar.start("weights")
    weights = state.session.weights()
    state.composition, state.baselines, state.edges = _composition(weights, settings.edges_per_mode)
    state.spectra = _spectra(weights)
    bar.end()


def edges_stage(state: ScanState, settings: ScanSettings, bar: Progress) -> None:
    """Edge attribution over every edge and exact path patching of the ``n_patch`` edges among the circuit's
    heads with the largest |attribution| (skipped without a circuit: the edge evidence serves it)."""
    if state.verified is None:
        bar.skip("edges", "no circuit found, and edge attribution and path patching serve the circuit")
        return
    reused = settings.reuses_corrupt_run
    bar.revise("edges", edges_estimate(settings.n_patch, state.verified.heads, corrupt_pass=not reused),
               f"the circuit's {len(state.verified.heads)} heads have fewer than {settings.n_patch} edges between "
               "them" if not reused else "the circuit search already ran the resampled batch")
    bar.start("edges")
    ctx = state.edge_tap.ctx
    corrupt_pass = 0.0 if len(ctx.z_corrupt) >= ctx.spec.n_layers - 1 else 1.0
    state.evidence = _circuit_evidence(state.edge_tap, state.composition, settings, state.verified.heads)
    patched = state.evidence.patching.edges
    integration = (EDGE_ATTRIBUTION_STEPS - 1) * ATTRIBUTION_COST  # one forward + backward per further point
    bar.advance(int(corrupt_pass) + integration + len(patched))
    state.verified = replace(state.verified, edges=state.evidence.patching)
    bar.end()


STAGES: tuple[Stage[ScanState, ScanSettings], ...] = (
    Stage("scores", "one forward + backward pass: pattern scores, loss, every head's attribution estimate",
          reads=("session",), writes=("edge_tap", "attribution", "head_scores", "loss", "session.clean"),
          estimate=lambda s, state: SCORES_STAGE_COST, run=scores_stage),
    Stage("ablate", "exact ablation of the chosen heads, then the called heads together",
          reads=("session", "attribution", "head_scores"),
          writes=("ablation", "agreement", "circuit_ablation", "circuit_ablation_each"),
          estimate=lambda s, state: ablate_plan(s.ablate, s.ablate_top, _n_total(state), len(group_labels(s.roles))),
          run=ablate_stage, runs=lambda s: _runs("ablate", s)),
    Stage("circuit", "circuit search: faithfulness of the top-n heads, exactly",
          reads=("session", "attribution", "ablation", "edge_tap"), writes=("verified", "verified_error"),
          estimate=lambda s, state: circuit_estimate(_n_total(state), s.faithfulness_method, s.circuit_rank,
                                                     s.with_edges, batch=s.batch,
                                                     clean_end=s.faithfulness_method == s.ablation_method)
          + 2 * s.random_sets + (0 if s.evaluation_seed is None else evaluation_passes(s.faithfulness_method))
          + search_estimate(s.search, s.search_options),
          run=circuit_stage, runs=lambda s: _runs("circuit", s)),
    Stage("stability", "the circuit search rerun on bootstrap resamples of the batch (opt-in)",
          reads=("session", "verified"), writes=("verified",),
          estimate=lambda s, state: stability_estimate(s.stability, _n_total(state), s.faithfulness_method,
                                                       s.circuit_rank, s.batch),
          run=stability_stage, runs=lambda s: _runs("stability", s)),
    Stage("weights", "composition and QK/OV spectra (weights only)",
          reads=("session",), writes=("composition", "baselines", "edges", "spectra"),
          estimate=lambda s, state: WEIGHT_STAGE_COST, run=weights_stage),
    Stage("edges", "edge attribution and exact path patching of the circuit's edges",
          reads=("session", "edge_tap", "composition", "verified"), writes=("evidence", "verified"),
          estimate=lambda s, state: edges_estimate(s.n_patch, corrupt_pass=not s.reuses_corrupt_run),
          run=edges_stage, runs=lambda s: _runs("edges", s)),
)
"""The stages in the order they run (:func:`stage_plan` says which run with given settings)."""
STAGE_NAMES = {stage.name: stage.what for stage in STAGES}
"""The scan's stages, in order (short names that fit a progress bar; what each does)."""


def _runs(name: str, settings: ScanSettings) -> bool:
    """Whether stage ``name`` runs with ``settings`` (:func:`stage_plan`)."""
    return name in stage_plan(settings.ablate, settings.circuit, settings.with_edges, settings.stability > 0)


def circuit_roles(head_scores: HeadScores, circuit: Circuit, roles: Sequence[Role]) -> dict[str, tuple[Head, ...]]:
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


def run_stages(state: ScanState, settings: ScanSettings, mode: str) -> tuple[StageRecord, ...]:
    """Run the stages that run with ``settings`` (:func:`stage_plan`) on ``state``, with progress in ``mode`` planned
    from their estimates before the first pass; then the roles the evidence gives the circuit's heads. The stages
    as they ran."""
    bar = Progress(mode, plan_of(STAGES, settings, state))
    try:
        run_planned(STAGES, state, settings, bar)
        if state.verified is not None:
            state.verified = replace(state.verified,
                                     roles=circuit_roles(state.head_scores, state.verified, settings.roles))
    finally:
        bar.close()
    return tuple(bar.ran)


# ---------------------------------------------------------------------------------------------- settings
def check_options(*, ablate: str | None, ablate_top: int | None, ablation_method: str | None, top_k: int,
                  n_patch: int,
                  circuit: bool, target: float, faithfulness_method: str | None, circuit_rank: str,
                  roles: Sequence[Role] | None, n_resamples: int, ci_level: float, random_sets: int, stability: int,
                  search: str | None = None, search_options: Any = None) -> dict[str, object]:
    """The scan's options, each checked (a CircuitkitError naming the first bad one), before any model is read;
    ``ablate`` None is the induction scan's default, ``"top"``; ``ablate_top`` None its default,
    :data:`~circuitkit.detect.agreement.DEFAULT_ABLATE_TOP` (given, it needs ``"top"``); ``ablation_method`` None
    its default, ``"mean"``."""
    from circuitkit.circuits.faithfulness import FAITHFULNESS_METHODS, RANKINGS, check_target
    from circuitkit.circuits.search import SEARCH_NAMES, check_search_options

    checked: dict[str, object] = {
        "ablate": validate.option("scan: ablate", "top" if ablate is None else ablate, ABLATE_OPTIONS),
        "ablate_top": check_ablate_top("scan", "top" if ablate is None else ablate, ablate_top),
        "ablation_method": validate.option("scan: ablation_method", "mean" if ablation_method is None
                                           else ablation_method, ABLATION_METHODS),
        "top_k": validate.positive_int("scan: top_k", top_k),
        "n_patch": validate.positive_int("scan: n_patch", n_patch),
        "circuit": validate.boolean("scan: circuit", circuit),
        "target": check_target("scan: target", target),
    }
    checked["faithfulness_method"] = validate.option(
        "scan: faithfulness_method", faithfulness_method or checked["ablation_method"], FAITHFULNESS_METHODS)
    checked["circuit_rank"] = validate.option("scan: circuit_rank", circuit_rank, RANKINGS)
    checked["roles"] = check_roles(DEFAULT_ROLES if roles is None else roles)
    checked["n_resamples"], checked["ci_level"], _ = check_settings("scan", n_resamples, ci_level, DEFAULT_SEED,
                                                                    "ci_level")
    checked["random_sets"] = check_repeats("scan: random_sets", random_sets)
    checked["stability"] = check_repeats("scan: stability", stability)
    checked["search"] = validate.option("scan: search", "ranked" if search is None else search, SEARCH_NAMES)
    checked["search_options"] = check_search_options("scan: search_options", checked["search"], search_options)
    return checked


def scan_settings(options: Mapping[str, object], session: Session,
                  tokens: RepeatedTokens | TokenBatch | None, *, edges: bool = True) -> ScanSettings:
    """The one :class:`ScanSettings` of a scan, built from its checked ``options`` and its session before the first
    pass (``top_k`` sets the three listing sizes; edge evidence applies with a circuit search, two layers or more
    and heads that add into the residual stream, unless ``edges`` is False: the circuit of heads alone)."""
    batch, adapter = session.batch, session.adapter
    with_edges = edges and bool(options["circuit"]) and adapter.spec.n_layers > 1 and adapter.additive_heads
    spec = RepeatedTokens() if tokens is None else tokens  # a built TokenBatch: no spec to draw a held-out batch
    drawn = isinstance(spec, RepeatedTokens) and bool(options["circuit"])
    return ScanSettings(
        block_len=batch.block_len, n_repeats=batch.n_repeats, batch=batch.batch,
        seed=tokens.seed if isinstance(tokens, RepeatedTokens) else 0, bos=batch.bos,
        evaluation_seed=evaluation_seed(spec.seed) if drawn else None, token_range=spec.token_range if drawn else None,
        device=str(adapter.spec.device), attribution_method=ATTRIBUTION_METHOD, attribution_steps=ATTRIBUTION_STEPS,
        edge_attribution_steps=EDGE_ATTRIBUTION_STEPS if with_edges else None, **options)


# ---------------------------------------------------------------------------------------------- scan
@keeps_model_state
def scan(
    model: Any = None,
    *,
    tokens: RepeatedTokens | TokenBatch | None = None,
    ablate: str | None = None,
    ablate_top: int | None = None,
    ablation_method: str | None = None,
    top_k: int = 5,
    n_patch: int = DEFAULT_N_PATCH,
    circuit: bool = True,
    target: float = DEFAULT_TARGET,
    faithfulness_method: str | None = None,
    circuit_rank: str = "joint",
    roles: Sequence[Role] | None = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    progress: bool | str | None = False,
    name: str | None = None,
    allow_download: bool = False,
    task: Any = None,
    prepend_bos: bool | None = None,
    metric: Any = None,
    holdout: float | None = None,
    target_on: str | None = None,
    n_resamples: int = DEFAULT_RESAMPLES,
    ci_level: float = DEFAULT_LEVEL,
    random_sets: int = 0,
    stability: int = 0,
    edges: bool = True,
    ig_points: str | None = None,
    kv_edges: str | None = None,
    edge_search: str | None = None,
    search: str | None = None,
    search_options: dict[str, Any] | None = None,
    node_ranking: str | None = None,
) -> Scan:
    """Score every head, check the important ones causally, find the circuit, read composition and spectra.

    Args:
        model: a loaded model (TransformerBridge, toy model, any model under :mod:`circuitkit.models.adapters`),
            or what :func:`circuitkit.models.load_model` takes (a zoo name, a local Hugging Face directory, a
            cached hub name; ``None``: the bundled known-answer model).
        tokens: the batch spec (:class:`~circuitkit.detect.RepeatedTokens`) or a built batch.
        ablate: ``"top"`` (the induction scan's default, None: exact ablation of the top ``ablate_top`` heads by
            |attribution|, and the strongest called induction / previous-token head where none is among them),
            ``"all"`` or ``"none"``. With a task (off by default, None): each of the top ``ablate_top`` heads by
            |EAP-IG score| (``"top"``) or every head (``"all"``) patched alone against its score
            (:mod:`circuitkit.tasks.single_heads`).
        ablation_method: ``"mean"`` (None, the default) or ``"zero"`` (for attribution and exact ablation alike).
            With a task, given: what a node outside the circuit is patched to instead of the task's own ablation
            (``"mean"``: its mean over the corrupted prompts; ``"zero"``), as ``--ablation-method`` does; None: the
            task's own (:attr:`circuitkit.tasks.Task.ablation`, by default the corrupted prompt's value).
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
        device: where to run (default: the model's device). A model wholly on another device is moved there for
            the call and moved back when it returns; a model spread over devices (``device_map``) runs where it is.
        dtype: the weights' dtype when ``model`` is a name or path (``"float32"``, ``"bfloat16"``, ``"float16"``;
            see :func:`~circuitkit.models.load_model`); a loaded model is scanned in its own dtype (cast it first).
        progress: ``True``: a bar on a terminal, one line per stage otherwise (logs, pipes); ``"bar"``,
            ``"lines"``; ``None``: a bar on a terminal, else nothing; ``False`` (default in library use): nothing.
        name: the model's name in the report (default: the name it was loaded by, else its class).
        task: the behaviour to find the circuit of: ``None`` or ``"induction"`` (repeated random tokens, this
            scan), a :class:`circuitkit.tasks.Task`, a built-in task's name (``"ioi"``, ``"greater-than"``,
            ``"docstring"``) or a task file's path: then :func:`circuitkit.tasks.scan_task` runs (node and edge
            circuits by counterfactual patching, with ``target``) and a :class:`~circuitkit.tasks.TaskScan` is
            returned.
        prepend_bos: with a task, how its text prompts become tokens (:func:`circuitkit.tasks.scan_task`):
            ``None`` (default: the model's tokenizer's own rule), ``True`` or ``False``; the induction scan builds
            its own batch (``tokens``) and takes only ``None``.
        metric: with a task, the metric to read instead of its own (a name or a function ``metric(logits, batch)
            -> [pair]``: :func:`circuitkit.tasks.scan_task`); the induction scan reads its loss and takes ``None``.
        holdout, target_on: with a task, the share of its pairs held out for evaluation (default 0.5) and the set
            ``target`` applies to (default ``"discovery"``): :func:`circuitkit.tasks.scan_task`. ``None`` for the
            induction scan.
        n_resamples, ci_level: the percentile bootstrap over the batch's sequences behind every figure's interval
            (:mod:`circuitkit.scan_intervals`; seed 0, from values the passes kept: no extra pass).
        random_sets: measure that many random head sets of the circuit's size per kind (uniform, and with the
            circuit's per-layer counts) beside the circuit (:mod:`circuitkit.circuits.baseline`; ``2 *
            random_sets`` passes, in the circuit stage's plan; 0, the default: none). With a task: random head sets
            of the node circuit's size (:mod:`circuitkit.tasks.robustness`).
        stability: rerun the circuit search on that many bootstrap resamples of the batch: each head's inclusion
            frequency and the mean pairwise Jaccard (:mod:`circuitkit.circuits.stability`; a stage of its own,
            each rerun about one circuit search plus an attribution pass; 0, the default: none; the ranked search,
            also beside ``search``). With a task: the node search rerun on resamples of its pairs.
        edges: measure the edges too (default): the induction scan's edge evidence (edge attribution and path
            patching of the circuit's edges), a task's edge circuit. ``False``: the circuit of heads (nodes) only.
        ig_points: a task's EAP-IG points, ``"left"`` (EAP-IG's own) or ``"right"``
            (:func:`circuitkit.tasks.scan_task`; None: its default); the induction scan takes none.
        kv_edges: a task's key/value edges on a grouped-query model, ``"grouped"`` (one per key/value head) or
            ``"per-query-head"`` (each query head its own, as EAP-IG's graph) (:func:`circuitkit.tasks.scan_task`;
            None: its default); the induction scan takes none.
        edge_search: how a task's edge circuit is found, ``"ranked"`` (the smallest top-k set) or ``"refined"``
            (that set pruned and refined within a pass budget) (:func:`circuitkit.tasks.scan_task`; None: its
            default); the induction scan takes none.
        search: how the circuit is chosen (:mod:`circuitkit.circuits.search`): ``"ranked"`` (None, the default:
            the smallest top-n set), ``"refined"`` (exact drops and swaps from it) or ``"masks"`` (learned masks);
            every figure is then measured again on the searched set (random sets at its size), the curve stays the
            ranking's. With a task: its node circuit (:func:`circuitkit.tasks.scan_task`). ``search_options``: the
            search's own (e.g. ``{"max_passes": 40}``, the refined search's pass budget; ``circuit.search.settings``
            in ``scores.json`` records what ran).
        node_ranking: what orders a task's nodes, ``"joint"`` (their shares along the joint path from every node
            patched to none, the induction scan's own ranking) or ``"eap-ig"`` (their EAP-IG node scores)
            (:func:`circuitkit.tasks.scan_task`; None: its default, ``"joint"``); the induction scan takes none.

    Returns:
        :class:`~circuitkit.scan_types.Scan` (a :class:`~circuitkit.tasks.TaskScan` for a task); ``.save(dir)``
        writes report.html and scores.json.
    """
    options = check_options(ablate=ablate, ablate_top=ablate_top, ablation_method=ablation_method, top_k=top_k,
                            n_patch=n_patch, circuit=circuit, target=target, faithfulness_method=faithfulness_method,
                            circuit_rank=circuit_rank, roles=roles, n_resamples=n_resamples, ci_level=ci_level,
                            random_sets=random_sets, stability=stability, search=search, search_options=search_options)
    device, edges = validate.device("scan: device", device), validate.boolean("scan: edges", edges)
    dtype = _check_dtype(model, dtype)
    mode = progress_mode(progress)
    if mode == "lines":  # the first line at once: loading a model can take a while
        print("scan: preparing the model and the batch", file=sys.stderr, flush=True)
    model, name = _model_and_name(model, name, task, device=device, allow_download=allow_download, dtype=dtype)
    task_only = dict(prepend_bos=prepend_bos, metric=metric, holdout=holdout, target_on=target_on,  # a task's own
                     ig_points=ig_points, kv_edges=kv_edges, edge_search=edge_search, node_ranking=node_ranking)
    if task is not None and not (isinstance(task, str) and task == "induction"):
        _refuse_induction_options(options, tokens)
        return _task_scan(model, task, options, device=device, name=name, mode=mode, edges=edges, ablate=ablate,
                          ablate_top=ablate_top, ablation_method=ablation_method, **task_only)
    _refuse_task_options(**task_only)
    session = open_session(model, tokens, device)  # the model adapted once, the batch built once
    settings = scan_settings(options, session, tokens, edges=edges)
    _check_batch_memory(session, settings, tokens, device)  # before any pass: refuse what cannot fit
    state = ScanState(session)
    return scan_result(state, settings, run_stages(state, settings, mode), name)


def _check_dtype(model: Any, dtype: Any) -> torch.dtype | None:
    """``dtype`` checked: a dtype to load a named model in; None with a loaded model (scanned in its own)."""
    dtype = validate.dtype("scan: dtype", dtype)
    if dtype is not None and not (model is None or isinstance(model, (str, os.PathLike))):
        raise validate.fail("scan: dtype", dtype, "None with a loaded model (it is scanned in its own dtype)",
                            "Cast the model first, e.g. model.to(torch.bfloat16), or pass its name or path.")
    return dtype


def _check_batch_memory(session: Session, settings: ScanSettings, tokens: Any, device: Any) -> None:
    """:func:`~circuitkit.memory.check_memory` for a batch the scan builds from a spec (a built batch is there)."""
    if isinstance(tokens, RepeatedTokens) or tokens is None:
        spec_tokens = tokens or RepeatedTokens()
        check_memory(session.adapter, spec_tokens.batch, spec_tokens.block_len, spec_tokens.n_repeats,
                     bos=spec_tokens.bos is not False, circuit=settings.circuit, device=device)


def _model_and_name(model: Any, name: str | None, task: Any, *, device: Any, allow_download: bool,
                    dtype: Any) -> tuple[Any, str | None]:
    """``(model, name)``: a loaded model as given, or the one a name or path gives (:func:`_load_named`), named by
    ``name`` or that name; ``name`` checked; then the one-line warning where torch's threads spin beside busy
    cores."""
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise validate.fail("scan: name", name, "a non-empty string")
    if model is None or isinstance(model, (str, os.PathLike)):
        from circuitkit import zoo

        name = name or (str(model) if model is not None else zoo.DEFAULT)
        model = _load_named(model, task, device=device, allow_download=allow_download, dtype=dtype)
    warn_if_threads_spin()  # torch loaded before circuitkit, no wait policy, other work busy: one line, the fix
    return model, name


def _load_named(model: Any, task: Any, *, device: Any, allow_download: bool, dtype: Any) -> Any:
    """The model a name or path gives: for the induction scan :func:`~circuitkit.models.loading.induction_model`
    (circuitkit's own model where it runs the checkpoint, the CLI's choice too), for a task
    :func:`~circuitkit.models.load_model`, a family that cannot run a task refused from its config first."""
    from circuitkit.models.loading import induction_model, load_model

    induction = task is None or (isinstance(task, str) and task == "induction")
    if induction:  # circuitkit's own model where it runs the checkpoint: the same figures, TransformerLens not loaded
        return induction_model(model, device=device, allow_download=allow_download, dtype=dtype)
    from circuitkit.models.families import task_refusal

    if reason := task_refusal(model):
        raise validate.fail("scan: model", model, f"a causal language model for a task ({reason})")
    return load_model(model, device=device, allow_download=allow_download, dtype=dtype)


def _refuse_task_options(**given: Any) -> None:
    """The options that only a task takes (``holdout``, ``target_on``, ``metric``, ``prepend_bos``, ...) must be None
    in the induction scan: it splits no pairs, reads the repeated-copies loss and sets its own BOS."""
    for key, value in given.items():
        if value is not None:
            raise validate.fail(f"scan: {key}", value, "None for the induction scan (it splits no pairs, reads the "
                                "repeated-copies loss and sets its own BOS: RepeatedTokens(bos=...)); the option "
                                "applies to a task")


def _refuse_induction_options(options: Mapping[str, object], tokens: RepeatedTokens | TokenBatch | None) -> None:
    """A task scan takes none of the induction scan's own options: each must keep its default."""
    if tokens is not None:
        raise validate.fail("scan: tokens", tokens, "None when a task is given (the task brings its prompts)")
    defaults = {"top_k": 5,
                "n_patch": DEFAULT_N_PATCH, "circuit": True, "faithfulness_method": options["ablation_method"],
                "circuit_rank": "joint", "roles": DEFAULT_ROLES}
    changed = [key for key, default in defaults.items() if options[key] != default]
    if changed:
        raise validate.fail(f"scan: {changed[0]}", options[changed[0]],
                            f"its default with a task (the induction scan's settings {changed} do not apply "
                            "to a task scan; see circuitkit.tasks.scan_task for its own)")


def scan_result(state: ScanState, settings: ScanSettings, stages: tuple[StageRecord, ...], name: str | None) -> Scan:
    """The :class:`Scan` record of a finished ``state``: every stage's results, the bootstrap intervals of the
    figures over the batch (from the per-sequence values the passes kept: no extra pass)."""
    from circuitkit.viz.attention import token_strings

    session, head_scores = state.session, state.head_scores
    intervals = scan_intervals(
        head_scores=head_scores, run=state.run, attribution=state.attribution, ablation=state.ablation,
        circuit_ablation=state.circuit_ablation_each, edges=state.verified.edges if state.verified else None,
        n_resamples=settings.n_resamples, level=settings.ci_level, seed=DEFAULT_SEED)
    return Scan(
        model=summarise_model(session.adapter, name),
        settings=settings,
        head_scores=head_scores,
        tokens=tuple(token_strings(session.adapter, session.batch.tokens[0].cpu())),
        patterns=head_scores.patterns,
        induction_loss=state.loss,
        attribution=state.attribution,
        ablation=state.ablation,
        agreement=state.agreement,
        composition=state.composition,
        baselines=state.baselines,
        edges=state.edges,
        spectra=state.spectra,
        circuit=state.evidence,
        called=called_by_score(head_scores, settings.roles),
        circuit_ablation=state.circuit_ablation,
        verified=state.verified,
        verified_error=state.verified_error,
        stages=stages,
        intervals=intervals,
    )


def _task_scan(model: Any, task: Any, options: Mapping[str, Any], *, device: Any, name: str | None, mode: str,
               prepend_bos: Any = None, metric: Any = None, holdout: float | None = None,
               target_on: str | None = None, edges: bool = True, ig_points: str | None = None,
               kv_edges: str | None = None, edge_search: str | None = None, node_ranking: str | None = None,
               ablate: str | None = None, ablate_top: int | None = None, ablation_method: str | None = None) -> Any:
    """A task's circuit (:func:`circuitkit.tasks.scan_task`) with the scan's checked ``options`` that apply to a task
    (``target``, ``n_resamples``, ``ci_level``, ``random_sets``, ``stability``, ``search`` and its options,
    ``ablate`` and ``ablate_top`` as given, ``ablate`` "none" where it was not), its
    progress in ``mode`` (the task scan's own plan of passes, :mod:`circuitkit.tasks.stages`); ``ablation_method``
    where one was given (not None): the task's ablation, as checked in ``options`` (the command line's
    ``--ablation-method``)."""
    from circuitkit.tasks import Task, get_task, scan_task

    if not isinstance(task, Task):
        if not isinstance(task, (str, os.PathLike)):
            raise validate.fail("scan: task", task, "a Task, a built-in task name or a task file's path")
        task = get_task(os.fspath(task), model)
    if ablation_method is not None:
        task = replace(task, ablation=options["ablation_method"])
    return scan_task(model, task, target=options["target"], device=device, name=name, progress=mode,
                     n_resamples=options["n_resamples"], ci_level=options["ci_level"], prepend_bos=prepend_bos,
                     metric=metric, edges=edges, random_sets=options["random_sets"], stability=options["stability"],
                     **({} if holdout is None else {"holdout": holdout}),
                     **({} if target_on is None else {"target_on": target_on}),
                     **({} if ig_points is None else {"ig_points": ig_points}),
                     **({} if kv_edges is None else {"kv_edges": kv_edges}),
                     **({} if edge_search is None else {"edge_search": edge_search}),
                     **({} if node_ranking is None else {"node_ranking": node_ranking}),
                     search=options["search"], search_options=options["search_options"],
                     ablate="none" if ablate is None else options["ablate"], ablate_top=ablate_top)


def exact_set(attribution: HeadEffects, ablate: str, ablate_top: int,
              called: Sequence[Sequence[Head]] = ()) -> list[Head]:
    """The heads ablated exactly: all of them (``ablate="all"``), or the top ``ablate_top`` by |attribution|, and
    for each group of ``called`` heads (one per kind: induction heads, previous-token heads) that has no head among
    them, the group's head with the largest |attribution|.

    Why not every called head: a pretrained model calls dozens of heads previous-token or induction heads (51 of
    Qwen2.5-Coder-0.5B's 336), each exact ablation costs about a pass, and the circuit search measures the heads
    that matter as sets anyway; one exact figure per kind keeps the answer's "ablating the strongest induction head"
    exact (benchmarks/README.md, "Real models at real speed")."""
    n_layers, n_heads = attribution.effect.shape
    if ablate == "all":
        return [(layer, head) for layer in range(n_layers) for head in range(n_heads)]
    chosen = {head for head, _ in attribution.top(ablate_top, absolute=True)}
    size = attribution.effect.detach().abs().float().nan_to_num(nan=-1.0)
    for group in called:
        if group and not chosen & set(group):
            chosen.add(max(group, key=lambda h: (float(size[h]), -h[0], -h[1])))
    return sorted(chosen)


def _composition(weights: HeadWeights, top_k: int) -> tuple[dict, dict, dict]:
    from circuitkit.composition import composition_baseline, composition_scores, top_edges

    composition, baselines, edges = {}, {}, {}
    if weights.n_layers > 1:
        for mode in COMPOSITION_MODES:
            composition[mode] = composition_scores(weights, mode).float().cpu()
            baselines[mode] = composition_baseline(weights, mode)
            edges[mode] = top_edges(composition[mode], k=top_k)
    return composition, baselines, edges


def _spectra(weights: HeadWeights) -> dict[str, torch.Tensor]:
    from circuitkit.factored import singular_values

    return {circuit: singular_values(weights, circuit).float().cpu() for circuit in SPECTRA}


def _edge_tap(session: Session) -> GradientTap:
    """Edge attribution's clean pass (repeated-copies loss, resampled corruption) as a tap on the scan's
    attribution pass: the same loss, differentiated once; its context is built on the scan's session."""
    from circuitkit.circuits._engine import DEFAULT_CORRUPT_SEED, context
    from circuitkit.circuits.metrics import resolve_metric

    session.weights()  # read once with the embeddings, which the weights stage reads too: the context's are these
    ctx = context(session, None, "resample", DEFAULT_CORRUPT_SEED, None, "scan")
    return GradientTap(ctx, resolve_metric("loss", "scan"), leaf=False)


def _circuit_evidence(tap: GradientTap, composition: Mapping[str, torch.Tensor], settings: ScanSettings,
                      among: Sequence[Head] | None) -> CircuitEvidence:
    """Edge-level evidence (:func:`circuitkit.circuits.circuit_evidence`) on the scan's batch, from the tap's
    clean pass and the scan's composition scores (keyed by lower-case channel there): the settings' listed and
    patched edges, the patched effects' intervals by its bootstrap; the patched edges are those among the heads
    ``among`` (the circuit) where given."""
    from circuitkit.circuits.evidence import evidence_in

    # composition exists whenever evidence does (both need two layers)
    channels = {mode.lower(): scores.float().cpu() for mode, scores in composition.items()}
    return evidence_in(tap.ctx, tap.m, channels, settings.edges_listed, settings.n_patch, among,
                       steps=EDGE_ATTRIBUTION_STEPS, n_resamples=settings.n_resamples, level=settings.ci_level)


__all__ = [
    "ABLATE_OPTIONS",
    "STAGES",
    "ScanState",
    "Stage",
    "run_stages",
    "scan_settings",
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
