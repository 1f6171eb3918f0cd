"""Composition, edge attribution and exact path patching side by side: which edges carry the circuit.

Why: a composition score is read from the weights alone; it ignores LayerNorm, MLPs and which tokens actually
flow, and is basis-dependent. Edge attribution estimates every edge's causal effect to first order; exact path
patching measures the strongest ones. :func:`circuit_evidence` puts the three on one table of edges:

- the ``top_k`` edges by composition score (each channel ``q``/``k``/``v`` against its own Q/K/V-composition),
- the ``top_k`` edges by ``|edge attribution|``,
- exact path patching of the ``n_patch`` edges with the largest ``|edge attribution|``,

and flags the disagreements (thresholds are the named constants below; ``effect`` is the patched effect where
measured, else the attribution; fractions are of the largest ``|effect|`` in the table):

- ``weight_only``: strong in the weights (composition at or above the :data:`STRONG_WEIGHT_QUANTILE` quantile of
  all edges of its channel) but carries nothing (``|effect| <`` :data:`CARRIES_NOTHING_FRACTION` of the largest);
- ``effect_only``: carries a strong effect (``|effect| >=`` :data:`STRONG_EFFECT_FRACTION` of the largest and at
  least :data:`MIN_EFFECT`, the threshold the scan's answer uses) but is unremarkable in the weights
  (composition below the :data:`WEAK_WEIGHT_QUANTILE` quantile of its channel).

:meth:`CircuitEvidence.to_json` gives plain floats (NaN and missing values as ``None``) for ``scores.json``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from circuitkit import validate
from circuitkit.circuits._engine import DEFAULT_CORRUPT_SEED, Context, context
from circuitkit.circuits.attribution import EdgeAttribution, attribute
from circuitkit.circuits.edges import CHANNELS, parse_edges
from circuitkit.circuits.measures import EdgeInputs, measure_all
from circuitkit.circuits.metrics import Metric, resolve_metric
from circuitkit.circuits.patching import PathPatching, patch
from circuitkit.detect.attribution import check_steps
from circuitkit.detect.session import open_session
from circuitkit.detect.tokens import RepeatedTokens, TokenBatch
from circuitkit.models.state import keeps_model_state
from circuitkit.ranking import Head, top_indices, unravel
from circuitkit.results import Edge, EdgeValues, plain
from circuitkit.results import channel as as_channel
from circuitkit.uncertainty import DEFAULT_LEVEL, DEFAULT_RESAMPLES, DEFAULT_SEED

STRONG_WEIGHT_QUANTILE = 0.9
"""Composition at or above this quantile of its channel's edges counts as strong in the weights."""
WEAK_WEIGHT_QUANTILE = 0.5
"""Composition below this quantile (the median) of its channel's edges counts as unremarkable in the weights."""
CARRIES_NOTHING_FRACTION = 0.05
"""An edge whose |effect| is below 5% of the table's largest carries nothing (seed noise of patching is ~1%)."""
STRONG_EFFECT_FRACTION = 0.5
"""An edge whose |effect| is at least half the table's largest carries a strong effect."""
MIN_EFFECT = 0.05
"""An edge carries an effect worth a flag only from this |effect| on (in the metric's unit: nats for the loss), the
threshold the scan's answer uses (:data:`circuitkit.circuits.faithfulness.MIN_GAP`): in a model where no edge
matters, the largest of a few thousandths of a nat must not make its peers "strong"."""
DEFAULT_TOP_K = 10


class EdgeEvidence(Edge):
    """One row of the edge table: an :class:`~circuitkit.results.Edge` holding the value of every registered edge
    measure (:mod:`~circuitkit.circuits.measures`; built in: ``composition``, None if not given for its channel,
    ``attribution``, and the exact ``patched`` effect, None where not patched), plus the two disagreement flags.
    Built positionally from the three built-in values, or with :meth:`of` from all the measured ones."""

    def __init__(self, src: Head, dst: Head, channel: str, composition: float | None, attribution: float,
                 patched: float | None, weight_only: bool = False, effect_only: bool = False) -> None:
        flags = {name for name, on in (("weight_only", weight_only), ("effect_only", effect_only)) if on}
        super().__init__(tuple(src), tuple(dst), channel,
                         (("composition", composition), ("attribution", attribution), ("patched", patched)),
                         frozenset(flags))

    @classmethod
    def of(cls, src: Head, dst: Head, channel: str, values: Mapping[str, float | None],
           flags: Iterable[str] = ()) -> EdgeEvidence:
        """A row holding ``values`` (measure name -> value, None where not measured), in that order."""
        row = cls.__new__(cls)
        Edge.__init__(row, tuple(src), tuple(dst), channel, tuple(values.items()), frozenset(flags))
        return row

    @property
    def composition(self) -> float | None:
        return self.get("composition")

    @property
    def attribution(self) -> float | None:
        return self.get("attribution")

    @property
    def patched(self) -> float | None:
        return self.get("patched")

    @property
    def weight_only(self) -> bool:
        return "weight_only" in self.flags

    @property
    def effect_only(self) -> bool:
        return "effect_only" in self.flags

    @property
    def effect(self) -> float:
        """The patched effect where measured, else the attribution."""
        return self.attribution if self.patched is None else self.patched

    def to_json(self) -> dict[str, Any]:
        """``src``, ``dst`` (``[layer, head]``), ``channel``, every measured value by name (None where not
        measured), the flags and ``name``."""
        return {"src": list(self.src), "dst": list(self.dst), "channel": self.channel,
                **{name: plain(value) for name, value in self.values},
                "weight_only": self.weight_only, "effect_only": self.effect_only, "name": self.name}

    def __repr__(self) -> str:
        values = ", ".join(f"{name}={value!r}" for name, value in self.values)
        return (f"EdgeEvidence(src={self.src!r}, dst={self.dst!r}, channel={self.channel!r}, {values}, "
                f"weight_only={self.weight_only}, effect_only={self.effect_only})")


@dataclass(frozen=True, eq=False)
class CircuitEvidence:
    """The edge table (``rows``, strongest effect first), the full results it was drawn from and ``measured``:
    every registered edge measure's values over all edges (:class:`~circuitkit.results.EdgeValues` by name)."""

    rows: tuple[EdgeEvidence, ...]
    metric: str
    corrupt: str
    attribution: EdgeAttribution
    patching: PathPatching
    measured: Mapping[str, EdgeValues] = field(default_factory=dict)

    @property
    def weight_only(self) -> list[EdgeEvidence]:
        """Edges strong in the weights that carry nothing."""
        return [r for r in self.rows if r.weight_only]

    @property
    def effect_only(self) -> list[EdgeEvidence]:
        """Edges that carry a strong effect but are unremarkable in the weights."""
        return [r for r in self.rows if r.effect_only]

    def to_json(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "corrupt": self.corrupt,
            "thresholds": {
                "strong_weight_quantile": STRONG_WEIGHT_QUANTILE,
                "weak_weight_quantile": WEAK_WEIGHT_QUANTILE,
                "carries_nothing_fraction": CARRIES_NOTHING_FRACTION,
                "strong_effect_fraction": STRONG_EFFECT_FRACTION,
                "min_effect": MIN_EFFECT,
            },
            "rows": [r.to_json() for r in self.rows],
        }

    def __repr__(self) -> str:
        lines = [f"CircuitEvidence({len(self.rows)} edges, metric={self.metric!r}, corrupt={self.corrupt!r})"]
        for r in self.rows:
            cells = "  ".join(f"{name} {_cell(name, value)}" for name, value in r.values)
            flag = " weight-only" if r.weight_only else " effect-only" if r.effect_only else ""
            lines.append(f"  {r.name:<16} {cells}{flag}")
        return "\n".join(lines)


def _cell(name: str, value: float | None) -> str:
    """A value of the printed table: composition as a ratio, the rest signed (``-``: not measured)."""
    if value is None:
        return "-" if name != "composition" else f"{'-':>6}"
    return f"{value:>6.3f}" if name == "composition" else f"{value:+.4g}"


def _composition(weights: Any, composition: Any, L: int, H: int) -> dict[str, Tensor]:
    """``channel -> [L, H, L, H]`` float tensors (CPU), computed from ``weights`` where ``composition`` is None."""
    if composition is None:
        from circuitkit.composition import composition_scores

        return {c: composition_scores(weights, c.upper()).float().cpu() for c in CHANNELS}
    if isinstance(composition, Tensor):
        composition = validate.tensor("circuit_evidence: composition", composition, shape=(L, H, L, H, 3),
                                      floating=True)
        return {c: composition[..., i].detach().float().cpu() for i, c in enumerate(CHANNELS)}
    if isinstance(composition, Mapping):
        out = {}
        for key, value in composition.items():
            channel = as_channel(key, "circuit_evidence: composition key")  # "q" or the mode's "Q"
            out[channel] = validate.tensor(f"circuit_evidence: composition[{key!r}]", value, shape=(L, H, L, H),
                                           floating=True).detach().float().cpu()
        return out
    raise validate.fail("circuit_evidence: composition", composition,
                        "None (computed), a {'q'|'k'|'v': [L, H, L, H]} mapping or an [L, H, L, H, 3] tensor")


@keeps_model_state
def circuit_evidence(
    model: Any,
    composition: Any = None,
    *,
    top_k: int = DEFAULT_TOP_K,
    n_patch: int | None = None,
    metric: Any = "loss",
    corrupt: str | TokenBatch = "resample",
    tokens: RepeatedTokens | TokenBatch | None = None,
    corrupt_seed: int = DEFAULT_CORRUPT_SEED,
    device: str | torch.device | None = None,
    steps: int = 1,
    n_resamples: int = DEFAULT_RESAMPLES,
    ci_level: float = DEFAULT_LEVEL,
) -> CircuitEvidence:
    """The edge table of the module docstring.

    ``composition``: ``None`` computes raw Q/K/V composition scores (:func:`circuitkit.composition_scores`);
    or a mapping ``{"q"|"k"|"v": [L, H, L, H]}`` (any subset), or an ``[L, H, L, H, 3]`` tensor. ``top_k`` edges
    are taken by composition and by ``|attribution|``; the ``n_patch`` (default ``top_k``) edges with the largest
    ``|attribution|`` are path-patched exactly, each with its interval over the sequences (``n_resamples``,
    ``ci_level``). ``steps``: the edge attribution's integration points
    (:func:`~circuitkit.circuits.edge_attribution`; 1 is first order). Other arguments as
    :func:`~circuitkit.circuits.path_patching`.
    """
    from circuitkit.uncertainty import check_settings

    n_resamples, ci_level, _ = check_settings("circuit_evidence", n_resamples, ci_level, DEFAULT_SEED, "ci_level")
    session = open_session(model, tokens, device)
    spec = session.spec
    L, H = spec.n_layers, spec.n_heads
    top_k = validate.positive_int("circuit_evidence: top_k", top_k)
    steps = check_steps("circuit_evidence", steps)
    n_patch = top_k if n_patch is None else validate.positive_int("circuit_evidence: n_patch", n_patch)
    if L < 2:
        raise validate.fail("circuit_evidence: model", validate.given(f"a model with {L} layer"),
                            "at least 2 layers (an edge runs from an earlier layer to a later one)")
    weights = session.weights(embeddings=False)  # read once: composition and the context
    comp = _composition(weights, composition, L, H)
    # one context: patching reuses the clean activations and corrupted z the attribution's passes left
    ctx = context(session, None, corrupt, corrupt_seed, None, "circuit_evidence")
    return evidence_in(ctx, resolve_metric(metric, "circuit_evidence"), comp, top_k, n_patch, steps=steps,
                       n_resamples=n_resamples, level=ci_level)


def evidence_in(ctx: Context, m: Metric, comp: dict[str, Tensor], top_k: int, n_patch: int,
                among: Any = None, *, steps: int = 1, n_resamples: int = DEFAULT_RESAMPLES,
                level: float = DEFAULT_LEVEL) -> CircuitEvidence:
    """:func:`circuit_evidence` in a prepared context (checked arguments, ``comp`` ``channel -> [L, H, L, H]``):
    where a host pass carried a :class:`~circuitkit.circuits.attribution.GradientTap` for ``ctx``, the
    attribution runs only its corrupted pass (and, with ``steps > 1``, its further integration points).
    ``among``: heads (a circuit); the ``n_patch`` edges patched are then those between these heads with the largest
    ``|attribution|``. ``n_resamples``, ``level``: the patched effects' intervals (a scan's own settings)."""
    L, H = ctx.spec.n_layers, ctx.spec.n_heads
    attribution = attribute(ctx, m, steps=steps)
    by_attribution = attribution.top(max(top_k, n_patch))
    patch_edges = [(e.src, e.dst, e.channel) for e in by_attribution[:n_patch]]
    if among is not None:
        inside = torch.zeros(L, H, dtype=torch.bool, device="cpu")
        for layer, head in among:
            inside[layer, head] = True
        pairs = (inside[:, :, None, None] & inside[None, None]).unsqueeze(-1).expand(L, H, L, H, len(CHANNELS))
        within = EdgeAttribution(torch.where(pairs, attribution.scores, math.nan), m.name, ctx.corrupt, math.nan)
        patch_edges = [(e.src, e.dst, e.channel) for e in within.top(n_patch)]
        if not patch_edges:  # no two circuit heads in different layers: nothing to patch
            empty = PathPatching((), m.name, ctx.corrupt)
            return _table(ctx, attribution, by_attribution, empty, comp, top_k)
    patching = patch(ctx, parse_edges(patch_edges, "all", ctx.spec, where="circuit_evidence"), m,
                     n_resamples=n_resamples, level=level)
    # each patched edge's record carries the estimate beside its exact effect, as a task scan's edges carry EAP-IG's
    patching = replace(patching, edges=tuple(replace(e, score=attribution.value(e.src, e.dst, e.channel))
                                             for e in patching.edges))
    return _table(ctx, attribution, by_attribution, patching, comp, top_k)


def _table(ctx: Context, attribution: EdgeAttribution, by_attribution: list, patching: PathPatching,
           comp: dict[str, Tensor], top_k: int) -> CircuitEvidence:
    L, H = ctx.spec.n_layers, ctx.spec.n_heads
    keys: dict[tuple[Head, Head, str], None] = {}
    for e in by_attribution[:top_k]:
        keys[(e.src, e.dst, e.channel)] = None
    layers = torch.arange(L, device="cpu")
    valid = (layers[:, None, None, None] < layers[None, None, :, None]).expand(L, H, L, H)
    missing = torch.full((L, H, L, H), math.nan, device="cpu")
    stacked = torch.stack([torch.where(valid, comp[c].float().cpu(), math.nan) if c in comp else missing
                           for c in CHANNELS], dim=-1)
    for index, value in top_indices(stacked, top_k):
        if math.isnan(value):
            break
        l1, h1, l2, h2, c = unravel(index, (L, H, L, H, len(CHANNELS)))
        keys[((l1, h1), (l2, h2), CHANNELS[c])] = None
    for e in patching.edges:
        keys[(e.src, e.dst, e.channel)] = None
    # every registered measure over all edges; each row holds its edge's value of each
    measured = measure_all(EdgeInputs(L, H, comp, attribution, patching, context=ctx))
    quantiles = {c: (torch.quantile(comp[c][valid], STRONG_WEIGHT_QUANTILE).item(),
                     torch.quantile(comp[c][valid], WEAK_WEIGHT_QUANTILE).item()) for c in comp}
    raw = []
    for src, dst, c in keys:
        values = {name: plain(v.value(src, dst, c)) for name, v in measured.items()}
        composition_value = float(comp[c][src[0], src[1], dst[0], dst[1]]) if c in comp else None
        raw.append((src, dst, c, composition_value, values))
    patched = {(e.src, e.dst, e.channel): e.effect for e in patching.edges}
    effects = [patched.get((src, dst, c), attribution.value(src, dst, c)) for src, dst, c, _, _ in raw]
    largest = max((abs(e) for e in effects), default=0.0)
    rows = []
    for (src, dst, c, comp_value, values), effect in zip(raw, effects, strict=True):
        weight_only = effect_only = False
        if comp_value is not None and largest > 0:
            strong, weak = quantiles[c]
            weight_only = comp_value >= strong and abs(effect) < CARRIES_NOTHING_FRACTION * largest
            effect_only = comp_value < weak and abs(effect) >= max(STRONG_EFFECT_FRACTION * largest, MIN_EFFECT)
        flags = [name for name, on in (("weight_only", weight_only), ("effect_only", effect_only)) if on]
        rows.append(EdgeEvidence.of(src, dst, c, values, flags))
    rows.sort(key=lambda r: (r.patched is None, -abs(r.effect)))
    return CircuitEvidence(tuple(rows), attribution.metric, attribution.corrupt, attribution, patching, measured)



__all__ = [
    "CARRIES_NOTHING_FRACTION",
    "STRONG_EFFECT_FRACTION",
    "STRONG_WEIGHT_QUANTILE",
    "WEAK_WEIGHT_QUANTILE",
    "CircuitEvidence",
    "EdgeEvidence",
    "circuit_evidence",
]
