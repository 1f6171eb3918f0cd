"""``circuitkit.scan(model) -> Scan``: the whole pipeline as one library call (the CLI is a thin shell on it).

(The module is called ``pipeline``, not ``scan``: a submodule named like the public function would replace
``circuitkit.scan`` on import.)

The path of data, each pass done once::

    tokens (RepeatedTokens)  ->  one forward + one backward pass: every head's pattern scores, per-token losses,
                                 mean z per head, residual streams (for resumed ablation), and attribution:
                                 a first-order ablation estimate for every head
                             ->  exact ablation of the heads that count: the top ``ablate_top`` by |attribution|
                                 joined with the heads called induction / previous-token heads (``ablate="top"``),
                                 every head (``"all"``) or none; agreement of estimate and exact;
                                 the called induction / previous-token heads ablated together
    weights (HeadWeights)    ->  Q/K/V composition + random baselines + top edges, QK/OV spectra
                             ->  edge-level causal evidence (edge attribution, path patching of the top edges)

A head is *called* an induction (previous-token) head when its score is at least
:data:`HEAD_CALL_THRESHOLD` and at least :data:`HEAD_CALL_NEUTRAL_RATIO` times what a uniformly attending head
scores on the same batch (the score definition's ``neutral``).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from circuitkit import validate
from circuitkit.detect.ablation import ABLATION_METHODS, ablate_together
from circuitkit.detect.ablation import ablate as ablate_heads
from circuitkit.detect.agreement import agreement
from circuitkit.detect.attribution import attribute
from circuitkit.detect.loss import summarise
from circuitkit.detect.scores import HeadScores, PatternCollector
from circuitkit.detect.tokens import RepeatedTokens, TokenBatch, as_batch
from circuitkit.models.contract import ModelAdapter, adapt
from circuitkit.ranking import Head, top_heads
from circuitkit.scan_types import HeadEffects, ModelSummary, Scan, ScanSettings

ABLATE_OPTIONS = ("top", "all", "none")
DEFAULT_ABLATE_TOP = 16
COMPOSITION_MODES = ("Q", "K", "V")
SPECTRA = ("QK", "OV")

HEAD_CALL_THRESHOLD = 0.3
"""A head is called an induction / previous-token head from this score on (a perfect head scores 1.0)..."""
HEAD_CALL_NEUTRAL_RATIO = 3.0
"""...and only if it scores at least this many times a uniformly attending head on the same batch."""

ATTRIBUTION_COST = 3.0
"""Progress units of one forward + backward pass, in forward passes (a backward costs about two forwards)."""
EDGE_ATTRIBUTION_COST = 2.0
"""Progress units of edge attribution in the scan (its corrupted pass and the contraction; the clean half rides on
the attribution pass). Path patching adds about one pass per patched edge (``top_k`` of them)."""


class _Progress:
    """One bar over the scan's stages, in units of one forward pass over the batch, with tqdm's estimate."""

    def __init__(self, enabled: bool | None, total: float) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=round(total, 2), disable=not enabled if enabled is not None else None,
                        desc="scan", unit="pass", bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed}<{remaining}")

    def stage(self, name: str) -> None:
        self.bar.set_description_str(f"scan: {name}")

    def advance(self, units: float) -> None:
        self.bar.update(round(units, 2))

    def close(self) -> None:
        self.bar.close()


def scan(
    model: Any = None,
    *,
    tokens: RepeatedTokens | TokenBatch | None = None,
    ablate: str = "top",
    ablate_top: int = DEFAULT_ABLATE_TOP,
    ablation_method: str = "mean",
    top_k: int = 5,
    circuit: bool = True,
    device: str | torch.device | None = None,
    progress: bool | None = False,
    name: str | None = None,
    allow_download: bool = False,
) -> Scan:
    """Score every head of ``model``, check the important ones causally, read composition and spectra.

    Args:
        model: a loaded model (TransformerBridge, toy model, any model under :mod:`circuitkit.models.contract`),
            or what :func:`circuitkit.models.load_model` takes (a zoo name, a local Hugging Face directory, a
            cached hub name; ``None``: the bundled known-answer model).
        tokens: the batch spec (:class:`~circuitkit.detect.RepeatedTokens`) or a built batch.
        ablate: ``"top"`` (default: exact ablation of the top ``ablate_top`` heads by |attribution| joined with
            the heads called induction / previous-token heads), ``"all"`` or ``"none"``.
        ablation_method: ``"mean"`` or ``"zero"`` (for attribution and exact ablation alike).
        top_k: composition edges per mode and heads per score the summary lists.
        circuit: compute edge-level causal evidence (edge attribution + path patching of the top edges).
        device: where to run (default: the model's device).
        progress: one progress bar over the stages (``None``: tqdm decides; default off in library use).
        name: the model's name in the report (default: the name it was loaded by, else its class).

    Returns:
        :class:`~circuitkit.scan_types.Scan`; ``.save(dir)`` writes report.html and scores.json.
    """
    ablate = validate.option("scan: ablate", ablate, ABLATE_OPTIONS)
    ablate_top = validate.positive_int("scan: ablate_top", ablate_top)
    ablation_method = validate.option("scan: ablation_method", ablation_method, ABLATION_METHODS)
    top_k = validate.positive_int("scan: top_k", top_k)
    circuit = validate.boolean("scan: circuit", circuit)
    device = validate.device("scan: device", device)
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise validate.fail("scan: name", name, "a non-empty string")
    if model is None or isinstance(model, (str, os.PathLike)):
        from circuitkit import zoo
        from circuitkit.models.loading import load_model

        name = name or (str(model) if model is not None else zoo.DEFAULT)
        model = load_model(model, device=device, allow_download=allow_download)
    adapter = adapt(model, device)
    spec = adapter.spec
    batch = as_batch(tokens, adapter)
    resumable = ablate != "none" and adapter.can_resume
    n_heads = spec.n_total_heads
    expected_exact = {"all": n_heads, "top": min(n_heads, ablate_top + 4), "none": 0}[ablate]
    with_evidence = circuit and spec.n_layers > 1 and adapter.additive_heads  # else edges cannot be isolated
    evidence_cost = (EDGE_ATTRIBUTION_COST + top_k) * with_evidence
    total = 1 + ATTRIBUTION_COST + expected_exact / max(1, spec.n_heads) + 1 + evidence_cost
    bar = _Progress(progress, total)
    try:
        bar.stage("clean pass with attribution: head scores, loss, every head's estimated effect")
        collector = PatternCollector(adapter, batch)
        weights = adapter.weights()
        edge_tap = _edge_tap(adapter, batch, weights) if with_evidence else None
        # one forward (+ one backward) serves head scores, the loss, mean z, the residual streams, head attribution
        # and the clean half of edge attribution
        attribution, run = attribute(
            adapter,
            batch,
            ablation_method,
            resid_layers=range(1, spec.n_layers) if resumable else (),
            observers=collector.hooks(),
            taps=[edge_tap] if edge_tap is not None else [],
        )
        head_scores = collector.result(weights)
        loss = summarise(run.losses, batch)
        bar.advance(1 + ATTRIBUTION_COST)

        induction_heads = called_heads(head_scores, "induction")
        previous_heads = called_heads(head_scores, "previous_token")
        ablation = agreement_result = None
        circuit_ablation: dict[str, float] = {}
        if ablate != "none":
            bar.stage("exact ablation")
            chosen = exact_set(attribution, ablate, ablate_top, induction_heads + previous_heads)
            ablation = ablate_heads(
                adapter, run, chosen, ablation_method, resume=resumable,
                progress=lambda n: bar.advance(n / max(1, spec.n_heads)),
            )
            agreement_result = agreement(attribution, ablation)
            groups = {"induction heads": induction_heads, "previous-token heads": previous_heads,
                      "circuit": induction_heads + previous_heads}
            circuit_ablation = {
                label: ablate_together(adapter, run, list(heads), ablation_method)
                for label, heads in groups.items() if heads
            }

        bar.stage("composition and spectra")
        composition, baselines, edges = _composition(weights, top_k)
        spectra = _spectra(weights)
        bar.advance(1)
        evidence = None
        if with_evidence:
            bar.stage("edge attribution and path patching")
            evidence = _circuit_evidence(edge_tap, composition, top_k)
            bar.advance(evidence_cost)
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
    )
    return Scan(
        model=summarise_model(adapter, name),
        settings=settings,
        head_scores=head_scores,
        tokens=tuple(token_strings(model, batch.tokens[0].cpu())),
        patterns=head_scores.patterns,
        induction_loss=loss,
        attribution=attribution,
        ablation=ablation,
        agreement=agreement_result,
        composition=composition,
        baselines=baselines,
        edges=edges,
        spectra=spectra,
        circuit=evidence,
        induction_heads=induction_heads,
        previous_token_heads=previous_heads,
        circuit_ablation=circuit_ablation,
    )


def called_heads(scores: HeadScores, name: str) -> tuple[Head, ...]:
    """The heads the scan calls ``name`` heads (see the module docstring), best first."""
    if name not in scores:
        return ()
    neutral = scores.definitions[name].neutral or 0.0
    floor = max(HEAD_CALL_THRESHOLD, HEAD_CALL_NEUTRAL_RATIO * neutral)
    ranked = top_heads(scores[name], scores[name].numel())
    return tuple(head for head, value in ranked if value >= floor)


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


def _circuit_evidence(tap: Any, composition: dict, top_k: int) -> Any:
    """Edge-level evidence (:func:`circuitkit.circuits.circuit_evidence`) on the scan's batch, from the tap's
    clean pass and the scan's composition scores (keyed by lower-case channel there)."""
    from circuitkit.circuits.evidence import evidence_in

    # composition exists whenever evidence does (both need two layers)
    channels = {mode.lower(): scores.float().cpu() for mode, scores in composition.items()}
    return evidence_in(tap.ctx, tap.m, channels, top_k, top_k)


__all__ = [
    "ABLATE_OPTIONS",
    "DEFAULT_ABLATE_TOP",
    "HEAD_CALL_NEUTRAL_RATIO",
    "HEAD_CALL_THRESHOLD",
    "called_heads",
    "exact_set",
    "scan",
]
