"""A scan as plain data: ``scores.json`` (:func:`scan_json`) and the compact data the report page draws from
(:func:`page_data`).

Why apart from the HTML: the numbers a reader sees and the numbers a script reads must be the same numbers,
computed once. Everything here is a pure function of the :class:`~circuitkit.scan_types.Scan`: no timestamps,
no paths, floats rounded to a fixed number of significant digits, NaN and infinities as ``null``, so the same
scan gives the same bytes.

Page data at scale: a 48 x 25-head model has 1,200 attention patterns ``[pos, pos]`` and 3 x 1,200 x 1,200
composition scores. They travel as *quantised bytes* (uint8: ``round(255 * value / scale)``, a step of 1/255 of
the scale, below what a colour scale shows) packed into binary blobs, gzip-compressed and base64-encoded by the
page builder; exact values stay in ``scores.json`` and in the table (which gets 4 significant digits).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float
from torch import Tensor

from circuitkit.circuits.measures import registered as registered_measures
from circuitkit.detect.roles import DEFAULT_ROLES, Role, called_key
from circuitkit.ranking import Head, head_name, top_heads
from circuitkit.results import HeadValues

if TYPE_CHECKING:
    from circuitkit.circuits.evidence import EdgeEvidence
    from circuitkit.scan_record import ScanRecord as Scan

JSON_FORMAT = 4
"""Version of the ``scores.json`` layout (1 was the pre-``Scan`` CLI's; 3 adds the verified circuit, ``units``,
moves the edge table to ``evidence`` and names the attribution method; 4 adds the bootstrap intervals: ``ci``
beside each figure, ``uncertainty``). Validated by ``scores.schema.json``."""
UNITS = {
    "head_scores": "per score: pattern scores are attention fractions in [0, 1]; copying is in [-1, 1]",
    "induction_loss": "nats (mean next-token cross-entropy)",
    "attribution.effect": "nats: estimated rise of the repeated-copies loss when the head is ablated",
    "ablation.effect": "nats: exact rise of the repeated-copies loss when the head is ablated",
    "agreement.spearman": "rank correlation in [-1, 1]",
    "agreement.largest_miss": "nats",
    "composition": "ratio ||W_A W_B||_F / (||W_A||_F ||W_B||_F), dimensionless",
    "circuit_ablation": "nats: rise of the repeated-copies loss with the group ablated together",
    "circuit.faithfulness": "fraction (L_all - L_circuit) / (L_all - L_clean): 1 = the circuit alone does what "
    "all heads do",
    "circuit.curve.faithfulness": "fraction, as circuit.faithfulness",
    "circuit.necessity": "nats: rise of the repeated-copies loss with only the circuit ablated",
    "circuit.losses": "nats",
    "circuit.passes": "forward passes of the batch",
    "circuit.random_baseline": "faithfulness (fraction) of random head sets of the circuit's size: mean, spread (the "
    "central range of the sets), ci (bootstrap over sequences)",
    "circuit.stability": "inclusion: share of bootstrap-resampled circuits holding the head; jaccard: mean pairwise "
    "Jaccard of those circuits, in [0, 1]",
    "circuit.search": "the search beyond ranking that chose circuit.heads (settings.search): size and start_size "
    "(heads: the searched set, the ranked circuit it started from), faithfulness a fraction as circuit.faithfulness, "
    "passes of the batch, each accepted step of its trace",
    "circuit.evaluation": "the circuit's heads on a held-out batch of the same spec (seed: settings.evaluation_seed): "
    "faithfulness a fraction as circuit.faithfulness, necessity and losses nats",
    "circuit.edges.effect": "nats: exact change of the repeated-copies loss, path patching",
    "circuit.edges.estimate": "nats: first-order estimate (edge attribution), not a measurement",
    "evidence.rows": "composition: ratio; attribution (estimate) and patched (exact): nats",
    "ci": "[lo, hi]: the percentile bootstrap interval over the batch's sequences (uncertainty.level), in the "
    "unit of the figure beside it; null where the figure was not measured",
}
"""The unit of every quantity in ``scores.json`` (written into the file as ``units``)."""
JSON_DIGITS = 7
"""Significant digits in scores.json: float32 carries about 7; more would print rounding noise."""
PAGE_DIGITS = 4
"""Significant digits of the numbers the page shows and sorts on (the table prints 3 decimals)."""
EDGES_PER_HEAD = 3
"""Strongest incoming and outgoing composition edges per head and mode, listed when a head is selected."""
QUANT_LEVELS = 255
MODES = ("Q", "K", "V")
CIRCUIT_VIEW_HEADS = 8
"""Heads in the CircuitsVis ``AttentionHeads`` view of the circuit: thumbnails stay readable up to about 8 in a
row; half the places go to induction heads, half to previous-token heads (a role with fewer leaves its places to
the other)."""


# ---------------------------------------------------------------------------------------------- numbers
def number(value: Any, digits: int = JSON_DIGITS) -> float | None:
    """``value`` as a float rounded to ``digits`` significant digits; None for None, NaN and infinities."""
    if value is None:
        return None
    value = float(value.item() if isinstance(value, Tensor) else value)
    if not math.isfinite(value):
        return None
    rounded = float(f"{value:.{digits}g}")
    return 0.0 if rounded == 0 else rounded  # no "-0.0"


def grid(tensor: Tensor, digits: int = JSON_DIGITS) -> list[list[float | None]]:
    """A ``[layer, head]`` tensor as nested lists of rounded floats (NaN -> None)."""
    return [[number(v, digits) for v in row] for row in tensor.detach().to("cpu", torch.float64).tolist()]


def flat(tensor: Tensor, digits: int = PAGE_DIGITS) -> list[float | None]:
    """A tensor flattened (``layer * n_heads + head`` for ``[layer, head]``), rounded, NaN -> None."""
    return [number(v, digits) for v in tensor.detach().reshape(-1).to("cpu", torch.float64).tolist()]


def plain(value: Any) -> Any:
    """Recursively: tensors to lists, tuples to lists, non-finite floats to None, mapping keys to str."""
    if isinstance(value, Tensor):
        return plain(value.detach().cpu().tolist())
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return number(value)
    if hasattr(value, "item"):  # numpy scalars
        return plain(value.item())
    return str(value)


def names(heads: Iterable[Sequence[int]]) -> list[str]:
    return [head_name(h) for h in heads]


def ranked(values: Tensor, k: int, *, absolute: bool = False) -> list[dict[str, Any]]:
    """The ``k`` best heads of a ``[layer, head]`` tensor (not measured, NaN, never listed) as JSON records."""
    return [
        {"head": head_name(h), "layer": h[0], "index": h[1], "value": number(v)}
        for h, v in HeadValues(values).top(k, absolute=absolute)
    ]


def check_scan(where: str, scan: Any) -> Scan:
    """``scan`` if it is a scan's record (a :class:`~circuitkit.scan_types.Scan`), else a ``CircuitkitError``."""
    from circuitkit.scan_record import ScanRecord
    from circuitkit.validate import fail

    if not isinstance(scan, ScanRecord):
        raise fail(where, scan, "a circuitkit Scan (from circuitkit.scan(model))")
    return scan


def interval(value: Any) -> list[float | None] | None:
    """A scalar interval ``(lo, hi)`` as ``[lo, hi]`` rounded; None for None."""
    if value is None:
        return None
    return [number(value[0]), number(value[1])]


def interval_grid(value: Any) -> list[list[list[float | None] | None]] | None:
    """A per-head interval ``(lo [L, H], hi [L, H])`` as ``[layer][head] -> [lo, hi]`` (None where not measured)."""
    if value is None:
        return None
    lo, hi = (grid(t) for t in value)
    return [[None if a is None or b is None else [a, b] for a, b in zip(row_lo, row_hi, strict=True)]
            for row_lo, row_hi in zip(lo, hi, strict=True)]


def head_interval(value: Any, head: Sequence[int]) -> list[float | None] | None:
    """One head's ``[lo, hi]`` from a per-head interval (None where there is none)."""
    if value is None:
        return None
    lo, hi = (number(t[head[0], head[1]]) for t in value)
    return None if lo is None or hi is None else [lo, hi]


def ranked_ci(records: list[dict[str, Any]], value: Any) -> list[dict[str, Any]]:
    """``records`` from :func:`ranked` with each head's ``ci`` added (where the scan has intervals)."""
    if value is None:
        return records
    return [{**r, "ci": head_interval(value, (r["layer"], r["index"]))} for r in records]


# ---------------------------------------------------------------------------------------------- scan facts
def loss_figures(scan: Scan) -> tuple[float | None, float | None]:
    """(first-copy loss, repeated-copies loss) in nats, None where the scan did not measure it."""
    loss = scan.induction_loss
    if loss is None:
        return None, None
    first = getattr(loss, "first_copy", getattr(loss, "first_half", None))
    repeated = getattr(loss, "repeated_copies", getattr(loss, "repeated_half", None))
    return number(first), number(repeated)


def effect_on(scan: Scan, head: Head) -> tuple[float | None, str | None]:
    """The effect of removing ``head`` on the repeated-copies loss: the exact ablation where it was run, else
    the attribution estimate; with its kind ("ablation" | "attribution"), or (None, None)."""
    layer, index = head
    if scan.ablation is not None and scan.ablation.exact is not None and bool(scan.ablation.exact[layer, index]):
        return number(scan.ablation.effect[layer, index]), "ablation"
    if scan.attribution is not None:
        return number(scan.attribution.effect[layer, index]), "attribution"
    return None, None


def ablated_heads(scan: Scan) -> list[Head]:
    """The heads ablated exactly, in ``(layer, head)`` order."""
    if scan.ablation is None:
        return []
    exact = scan.ablation.exact
    if exact is None:
        exact = ~torch.isnan(scan.ablation.effect)
    return [(int(a), int(b)) for a, b in exact.nonzero().tolist()]


def circuit_rows(scan: Scan) -> list[EdgeEvidence]:
    """The rows of the scan's circuit evidence (:class:`~circuitkit.circuits.evidence.EdgeEvidence`: ``src, dst,
    channel`` and the value of each edge measure), or [] when there is none."""
    if scan.circuit is None:
        return []
    return list(scan.circuit.rows)


def evidence_columns(rows: Sequence[EdgeEvidence]) -> list[tuple[str, str]]:
    """The edge measures the rows hold, as ``(name, column heading)`` in the order measured: the registered
    measures (:mod:`circuitkit.circuits.measures`) under their own headings, any other (a saved scan's measure no
    longer registered) under its name."""
    headings = {m.name: m.column for m in registered_measures()}
    seen: dict[str, str] = {}
    for row in rows:
        for name, _ in row.values:
            seen.setdefault(name, headings.get(name, name))
    return list(seen.items())


def edge_effect(row: EdgeEvidence) -> tuple[float | None, str]:
    """An evidence row's causal effect: path patching where computed, else edge attribution."""
    patched = number(row.patched)
    if patched is not None:
        return patched, "patched"
    return number(row.attribution), "attribution"


# ---------------------------------------------------------------------------------------------- scores.json
def scan_json(scan: Scan) -> dict[str, Any]:
    """The machine-readable scan (what ``scores.json`` holds). Plain numbers (7 significant digits), NaN as
    null, deterministic. Keys (the layout is ``circuitkit/report/scores.schema.json``; units in ``units``):

    ``format, circuitkit_version, units, model, settings, scores`` (definitions: short, description, kind,
    neutral), ``head_scores`` (name -> ``[layer][head]``), ``top_heads`` (name -> best
    ``settings.heads_per_score`` heads, also for ``attribution`` and ``ablation``), ``<score>_heads`` for the score
    of each role (the heads it calls: ``induction_heads, previous_token_heads`` with the default roles),
    ``induction_loss, attribution`` (``method`` ``"gradient"`` | ``"ig"``, ``steps``, ``ablation_method``),
    ``ablation`` (with ``ablated``: the heads ablated exactly), ``agreement, composition``
    (mode -> random baseline and top edges), ``circuit`` (the verified circuit: ``heads``, ``faithfulness``,
    ``necessity``, ``curve``, ``roles``, ``explanations`` (head -> what it does, in words), ``edges`` with exact
    effects; null when not found, with
    ``circuit_error``), ``evidence`` (the edge table, or null), ``circuit_ablation``; where the scan has bootstrap
    intervals, ``ci: [lo, hi]`` beside each figure over the batch (``induction_loss.ci``, ``attribution.ci``,
    ``ablation.ci``, each ``top_heads`` record, ``circuit.ci``, each curve point and circuit edge), and
    ``head_scores_ci``, ``circuit_ablation_ci`` and ``uncertainty`` (how the intervals were made).
    """
    from circuitkit import __version__

    check_scan("scan_json: scan", scan)
    k = scan.settings.heads_per_score
    hs = scan.head_scores
    definitions = getattr(hs, "definitions", {})
    first, repeated = loss_figures(scan)
    bounds = getattr(scan, "intervals", None) or {}
    score_bounds = bounds.get("head_scores", {})
    out: dict[str, Any] = {
        "format": JSON_FORMAT,
        "circuitkit_version": __version__,
        "units": dict(UNITS),
        "model": plain(scan.model.as_dict()),
        "settings": plain(scan.settings.as_dict()),
        "scores": {name: definition_json(definitions.get(name)) for name in hs},
        "head_scores": {name: grid(hs[name]) for name in hs},
        "top_heads": {name: ranked_ci(ranked(hs[name], k), score_bounds.get(name)) for name in hs},
        **{called_key(score): names(heads) for score, heads in scan.called.items()},
        "induction_loss": None,
        "attribution": None,
        "ablation": None,
        "agreement": None,
        "composition": {},
        "circuit": circuit_json(scan),
        "circuit_error": getattr(scan, "verified_error", None),
        "evidence": None,
        "circuit_ablation": {label: number(value) for label, value in getattr(scan, "circuit_ablation", {}).items()},
    }
    if bounds:
        settings = scan.settings
        out["uncertainty"] = {
            "method": "percentile bootstrap over the batch's sequences, one seeded draw for every figure",
            "n_resamples": getattr(settings, "n_resamples", None), "level": number(getattr(settings, "ci_level", None)),
            "seed": 0, "extra_passes": 0,
        }
        out["head_scores_ci"] = {name: interval_grid(score_bounds.get(name)) for name in hs}
        out["circuit_ablation_ci"] = {label: interval(bounds.get("circuit_ablation", {}).get(label))
                                      for label in out["circuit_ablation"]}
    if scan.induction_loss is not None:
        per_position = getattr(scan.induction_loss, "per_position", None)
        out["induction_loss"] = {
            "first_copy": first,
            "repeated_copies": repeated,
            "per_position": None if per_position is None else flat(per_position, JSON_DIGITS),
        }
        if "induction_loss" in bounds:
            out["induction_loss"]["ci"] = {key: interval(value) for key, value in bounds["induction_loss"].items()}
    for kind in ("attribution", "ablation"):
        effects = getattr(scan, kind)
        if effects is None:
            continue
        record: dict[str, Any] = {"method": effects.method}
        if kind == "attribution":
            record = {"method": scan.settings.attribution_method, "steps": scan.settings.attribution_steps,
                      "ablation_method": effects.method}
        record.update(clean_loss=number(effects.clean_loss), effect=grid(effects.effect),
                      top=ranked_ci(ranked(effects.effect, k), bounds.get(kind)))
        if kind in bounds:
            record["ci"] = {"effect": interval_grid(bounds[kind])}
        if kind == "ablation":
            record["ablated"] = names(ablated_heads(scan))
        out[kind] = record
        out["top_heads"][kind] = record["top"]
    if scan.agreement is not None:
        miss = scan.agreement.largest_miss
        out["agreement"] = {
            "n_exact": scan.agreement.n_exact,
            "spearman": number(scan.agreement.spearman),
            "largest_miss": None
            if miss is None
            else {"head": head_name(miss[0]), "exact": number(miss[1]), "estimate": number(miss[2])},
        }
        if "agreement" in bounds:
            out["agreement"]["ci"] = interval(bounds["agreement"])
    for mode in sorted(set(scan.composition) | set(scan.baselines) | set(scan.edges), key=_mode_order):
        baseline = scan.baselines.get(mode)
        out["composition"][mode] = {
            "baseline": None
            if baseline is None
            else {"mean": number(baseline.mean), "std": number(getattr(baseline, "std", None))},
            "top_edges": [
                {"src": head_name(e.src), "dst": head_name(e.dst), "score": number(e.score)}
                for e in scan.edges.get(mode, ())
            ],
        }
    if scan.circuit is not None:
        out["evidence"] = plain(scan.circuit.to_json())
    return out


def circuit_edges(scan: Scan) -> list[Any]:
    """The evidence rows between two heads of the verified circuit that were path-patched (exact effect), largest
    |effect| first; [] without a circuit."""
    verified = getattr(scan, "verified", None)
    if verified is None:
        return []
    members = {tuple(h) for h in verified.heads}
    rows = [r for r in circuit_rows(scan)
            if tuple(r.src) in members and tuple(r.dst) in members and number(r.patched) is not None]
    return sorted(rows, key=lambda r: -abs(float(r.patched)))


RANKED_BY = {"effect": "single-head ablation effect", "joint": "joint-path attribution"}
"""What the circuit search's order reads, as a member's explanation names it."""


def circuit_explanations(scan: Scan) -> dict[str, str]:
    """``head name -> what it does`` for every head of the verified circuit, worded from the scan's own figures by
    :func:`circuitkit.circuits.explain.induction_explanations` (the scores that call it, its exactly patched
    edges, its exact single-head ablation and its role's group ablated together, its measured step on the
    faithfulness curve, its share of the resampled circuits); {} without a circuit."""
    from circuitkit.circuits.explain import MeasuredEdge, induction_explanations, score_calls

    verified = getattr(scan, "verified", None)
    if verified is None:
        return {}
    members = [tuple(h) for h in verified.heads]
    labels = {role.score: role.name for role in scan_roles(scan)}
    edges = [MeasuredEdge(head_name(r.src), head_name(r.dst), str(r.channel), number(r.patched))
             for r in circuit_rows(scan) if number(r.patched) is not None]
    removal = {}
    if scan.ablation is not None:
        for h in members:
            effect, kind = effect_on(scan, h)
            if kind == "ablation" and effect is not None:
                removal[h] = effect
    estimates = None
    if scan.attribution is not None:
        estimates = {h: value for h in members if (value := number(scan.attribution.effect[h[0], h[1]])) is not None}
    stability = getattr(verified, "stability", None)
    roles = scan_roles(scan)
    called = getattr(scan, "called", None) or {}
    groups = {role.group: (tuple(called.get(role.score, ())), scan.circuit_ablation[role.group]) for role in roles
              if role.group in (scan.circuit_ablation or {}) and scan.circuit_ablation[role.group] is not None}
    # a searched set is not a prefix of the ranking the curve measures: no member's step on it is the set's (nor is
    # the ranking saved, so a loaded scan could not say it)
    order = [] if getattr(verified, "search", None) is not None else [tuple(h) for h in verified.ranking]
    return induction_explanations(
        members, calls=score_calls(scan.head_scores, members, labels), edges=edges, removal=removal,
        order=order, curve={p.size: float(p.faithfulness) for p in verified.curve},
        ranked_by=RANKED_BY.get(getattr(verified, "ranked_by", "effect"), "attribution"),
        n_total=scan.model.n_layers * scan.model.n_heads, estimates=estimates,
        stability=None if stability is None else dict(stability.ranked()), groups=groups)


def circuit_json(scan: Scan) -> dict[str, Any] | None:
    """``scores.json``'s ``circuit``: the verified circuit (see :func:`scan_json`), or None."""
    verified = getattr(scan, "verified", None)
    if verified is None:
        return None
    bounds = getattr(verified, "intervals", None) or {}
    curve_bounds = bounds.get("curve", {})
    edge_bounds = (getattr(scan, "intervals", None) or {}).get("edges", {})
    out = {
        "heads": names(verified.heads),
        "faithfulness": number(verified.faithfulness),
        "necessity": number(verified.necessity),
        "target": number(verified.target),
        "method": verified.method,
        "losses": {"clean": number(verified.clean_loss), "all_ablated": number(verified.all_ablated_loss),
                   "circuit_only": number(verified.circuit_loss)},
        "curve": [{"n_heads": p.size, "faithfulness": number(p.faithfulness), "loss": number(p.value),
                   **({"ci": interval(curve_bounds.get(p.size))} if bounds else {})}
                  for p in verified.curve],
        "passes": verified.passes,
        "ranked_by": getattr(verified, "ranked_by", "effect"),
        "roles": {role: names(heads) for role, heads in verified.roles.items()},
        "explanations": circuit_explanations(scan),
        "edges": [
            {"src": head_name(r.src), "dst": head_name(r.dst), "channel": r.channel,
             "effect": number(r.patched), "estimate": number(r.attribution), "composition": number(r.composition),
             "weight_only": bool(r.weight_only),
             **({"ci": interval(edge_bounds.get((tuple(r.src), tuple(r.dst), r.channel)))} if edge_bounds else {})}
            for r in circuit_edges(scan)
        ],
    }
    for key in ("random_baseline", "stability", "search"):  # opt-in measurements, only where asked for
        found = getattr(verified, key, None)
        if found is not None:
            out[key] = plain(found.to_json())
    held = getattr(verified, "evaluation", None)  # the circuit on a held-out batch, where the scan drew one
    if held is not None:
        out["evaluation"] = {**held, "faithfulness": number(held["faithfulness"]),
                             "necessity": number(held["necessity"]),
                             "losses": {key: number(value) for key, value in held["losses"].items()}}
    if bounds:
        out["ci"] = {"faithfulness": interval(bounds.get("faithfulness")),
                     "necessity": interval(bounds.get("necessity")),
                     "losses": {key: interval(value) for key, value in bounds.get("losses", {}).items()}}
    return out


def definition_json(definition: Any) -> dict[str, Any]:
    if definition is None:
        return {"short": None, "description": None, "kind": None, "neutral": None}
    return {
        "short": definition.short,
        "description": definition.description,
        "kind": definition.kind,
        "neutral": number(definition.neutral),
    }


def _mode_order(mode: str) -> tuple[int, str]:
    return (MODES.index(mode) if mode in MODES else len(MODES), mode)


# ---------------------------------------------------------------------------------------------- page data
@dataclass(frozen=True)
class Column:
    """One column of the head table (and one small-multiple heatmap): a score, attribution or ablation.

    ``lo <= neutral <= hi`` is the colour domain: ``neutral`` (what a random head scores) is white, values above
    it shade red up to ``hi``, values below it blue down to ``lo``.
    """

    key: str
    short: str
    description: str
    values: Float[Tensor, "layer head"]
    neutral: float
    lo: float
    hi: float
    top: tuple[int, ...]  # flat indices of the best heads (highlighted)
    interval: tuple[Tensor, Tensor] | None = None  # (lo, hi) [layer, head]: bootstrap interval over sequences

    def as_json(self) -> dict[str, Any]:
        bounds = {} if self.interval is None else {"ci_lo": flat(self.interval[0]), "ci_hi": flat(self.interval[1])}
        return {**bounds,
            "key": self.key,
            "short": self.short,
            "description": self.description,
            "neutral": number(self.neutral, PAGE_DIGITS),
            "lo": number(self.lo, PAGE_DIGITS),
            "hi": number(self.hi, PAGE_DIGITS),
            "top": list(self.top),
            "values": flat(self.values),
        }


def marked_top(scan: Scan) -> int:
    """How many top heads per column the table highlights: ``min(heads_per_score, n_heads_total // 8)``, at least
    1."""
    return min(scan.settings.heads_per_score, max(1, scan.model.n_layers * scan.model.n_heads // 8))


def columns(scan: Scan) -> list[Column]:
    """The head table's columns: every head score in registry order, then attribution and exact ablation.
    The top ``min(top_k, n_heads_total // 8)`` heads (at least 1) of each are highlighted: in a 2 x 4 model,
    five of eight heads marked would mark nothing."""
    hs = scan.head_scores
    definitions = getattr(hs, "definitions", {})
    k = marked_top(scan)
    bounds = getattr(scan, "intervals", None) or {}
    out = []
    for name in hs:
        definition = definitions.get(name)
        values = hs[name].detach().float().cpu()
        kind = getattr(definition, "kind", None)
        neutral = getattr(definition, "neutral", None)
        if kind == "pattern":  # attention fractions: a fixed [0, 1] domain reads the same at every size
            lo, hi = 0.0, 1.0
        else:
            lo, hi = _range(values)
        if neutral is None or not math.isfinite(neutral):
            neutral = 0.0 if lo <= 0.0 <= hi else lo
        out.append(
            Column(
                key=name,
                short=getattr(definition, "short", name),
                description=getattr(definition, "description", name),
                values=values,
                neutral=float(neutral),
                lo=min(lo, neutral),
                hi=max(hi, neutral),
                top=_top_flat(values, k),
                interval=bounds.get("head_scores", {}).get(name),
            )
        )
    for kind, short, description in (
        ("attribution", "attr", "first-order estimate of the rise of the repeated-copies loss (nats) when the "
         "head is removed"),
        ("ablation", "ablate", "exact rise of the repeated-copies loss (nats) when the head is ablated; blank "
         "where not ablated"),
    ):
        effects = getattr(scan, kind)
        if effects is None:
            continue
        values = effects.effect.detach().float().cpu()
        if kind == "ablation" and effects.exact is not None:
            values = torch.where(effects.exact.cpu(), values, torch.full_like(values, float("nan")))
        lo, hi = _range(values)
        bound = max(abs(lo), abs(hi), 1e-12)
        description = f"{description} ({effects.method} ablation)"
        out.append(Column(kind, short, description, values, 0.0, -bound, bound, _top_flat(values, k),
                          bounds.get(kind)))
    return out


def _range(values: Tensor) -> tuple[float, float]:
    finite = values[torch.isfinite(values)]
    if finite.numel() == 0:
        return 0.0, 1.0
    lo, hi = float(finite.min()), float(finite.max())
    return (lo, hi) if hi > lo else (lo - 1.0, hi + 1.0)


def _top_flat(values: Tensor, k: int) -> tuple[int, ...]:
    n_heads = values.shape[1]
    return tuple(a * n_heads + b for (a, b), v in top_heads(values, k) if not math.isnan(v))


def quantise(values: Tensor, scale: float) -> bytes:
    """``values`` (in ``[0, scale]``) as uint8 ``round(255 * v / scale)``; NaN -> 0."""
    if scale <= 0:
        return bytes(values.numel())
    q = (values.detach().to("cpu", torch.float64).nan_to_num(0.0) / scale * QUANT_LEVELS).round()
    return q.clamp(0, QUANT_LEVELS).to(torch.uint8).reshape(-1).numpy().tobytes()


def pattern_bytes(patterns: Tensor, *, triangular: bool) -> bytes:
    """Every head's pattern ``[L, H, pos, pos]`` as uint8 (probability * 255), head after head; with
    ``triangular`` only the causal part (row ``q``: keys ``0..q``), ``pos (pos + 1) / 2`` bytes per head."""
    p = patterns.detach().to("cpu", torch.float32)
    n_layers, n_heads, pos, _ = p.shape
    p = p.reshape(n_layers * n_heads, pos, pos)
    if triangular:
        rows, cols = torch.tril_indices(pos, pos, device=p.device)
        p = p[:, rows, cols]
    return quantise(p, 1.0)


def composition_blocks(scores: Tensor) -> tuple[bytes, float]:
    """A ``[L, H, L, H]`` composition tensor as uint8 blocks ``[H_src, H_dst]`` for every layer pair
    ``src < dst`` in ``(src, dst)`` order, quantised to ``[0, max]``; returns (bytes, max)."""
    s = scores.detach().to("cpu", torch.float32)
    n_layers = s.shape[0]
    blocks = [s[a, :, b, :] for a in range(n_layers) for b in range(a + 1, n_layers)]
    if not blocks:
        return b"", 0.0
    packed = torch.stack(blocks)
    finite = packed[torch.isfinite(packed)]
    scale = float(finite.max()) if finite.numel() else 0.0
    return quantise(packed.clamp(min=0), scale), scale


def strongest_edges(scores: Tensor, k: int = EDGES_PER_HEAD) -> tuple[list[list[Any]], list[list[Any]]]:
    """Per head (flat index), its ``k`` strongest outgoing and incoming edges as ``[other_flat, score]`` pairs,
    strongest first; ties keep flat order, pairs with ``src_layer >= dst_layer`` never listed."""
    s = scores.detach().to("cpu", torch.float32)
    n_layers, n_heads = s.shape[:2]
    n = n_layers * n_heads
    layer = torch.arange(n, device=s.device) // n_heads
    valid = (layer[:, None] < layer[None, :]) & torch.isfinite(s.reshape(n, n))
    m = torch.where(valid, s.reshape(n, n), torch.tensor(-math.inf, device=s.device))
    k = min(k, n)
    return _stable_top(m, k), _stable_top(m.T.contiguous(), k)


def _stable_top(m: Tensor, k: int) -> list[list[Any]]:
    """Row-wise ``k`` largest finite entries of ``m`` as ``[column, value]``, ties in column order.

    ``topk`` finds each row's k-th value fast; rows where that value is tied beyond the k chosen (or -inf)
    are re-ranked with a stable full sort, so ties never depend on ``topk``'s internal order."""
    values, index = m.topk(k, dim=1)
    kth = values[:, -1:]
    ambiguous = ((m >= kth).sum(dim=1) > k).nonzero().flatten()
    if ambiguous.numel():
        v, i = torch.sort(m[ambiguous], dim=1, descending=True, stable=True)
        values[ambiguous], index[ambiguous] = v[:, :k], i[:, :k]
    # within the k chosen: by value descending, then column ascending
    order = torch.argsort(index, dim=1, stable=True)
    values, index = values.gather(1, order), index.gather(1, order)
    order = torch.argsort(-values, dim=1, stable=True)
    values, index = values.gather(1, order), index.gather(1, order)
    return [
        [[j, number(x, PAGE_DIGITS)] for x, j in zip(vr, ir, strict=True) if math.isfinite(x)]
        for vr, ir in zip(values.tolist(), index.tolist(), strict=True)
    ]


def copy_starts(scan: Scan) -> list[int]:
    """Positions where each copy of the random block starts (after the BOS, if any)."""
    settings = scan.settings
    offset = 1 if settings.bos is not None else 0
    return [offset + c * settings.block_len for c in range(settings.n_repeats)]


def scan_roles(scan: Any) -> tuple[Role, ...]:
    """The roles ``scan`` ran with (:mod:`circuitkit.detect.roles`; the defaults where it records none)."""
    return tuple(getattr(getattr(scan, "settings", None), "roles", ()) or DEFAULT_ROLES)


def score_short(scan: Any, score: str) -> str:
    """The short name of head score ``score`` (``"prev"``), else the score's name."""
    definition = (getattr(getattr(scan, "head_scores", None), "definitions", None) or {}).get(score)
    return str(getattr(definition, "short", None) or score)


def circuit_view_heads(scan: Scan, limit: int = CIRCUIT_VIEW_HEADS) -> list[tuple[Head, str]]:
    """The heads the circuit's CircuitsVis view shows, in ``(layer, head)`` order, each with its role, named by its
    score's short name (``"induct"`` | ``"prev"`` with the default roles): the heads each role's score calls, best
    score first within a role, at most ``limit`` in all. When the scan called none, the best head by each role's
    score (``"best induct"``, ``"best prev"``) so the view is never empty."""
    def best(heads: Sequence[Head], score: str) -> list[Head]:
        values = scan.head_scores[score] if score in scan.head_scores else None
        if values is None:
            return list(heads)
        # stable: equal scores keep the scan's order
        return sorted(heads, key=lambda h: -_finite(values[h[0], h[1]]))

    verified = getattr(scan, "verified", None)
    if verified is not None:  # the verified circuit's heads, with the roles the evidence gave them
        given = getattr(verified, "roles", {}) or {}
        short = {role.name: score_short(scan, role.score) for role in scan_roles(scan)}
        heads = [(tuple(h), next((short.get(r, r) for r, hs in given.items() if tuple(h) in hs), "circuit"))
                 for h in verified.heads]
        return sorted(heads[:limit])
    scores = list(dict.fromkeys(role.score for role in scan_roles(scan)))
    called = getattr(scan, "called", None) or {}
    roles = {score_short(scan, score): best([tuple(h) for h in called.get(score, ())], score) for score in scores}
    if not any(roles.values()):
        roles = {}
        for role, score in ((f"best {score_short(scan, score)}", score) for score in scores):
            if score in scan.head_scores:
                top = [h for h, v in top_heads(scan.head_scores[score], 1) if not math.isnan(v)]
                roles[role] = [h for h in top if all(h not in v for v in roles.values())]
    chosen: dict[Head, str] = {}
    share = max(1, limit // max(1, len(roles)))
    for role, heads in roles.items():  # each role its share first ...
        for head in heads[:share]:
            chosen.setdefault(head, role)
    for role, heads in roles.items():  # ... then what is left over, in role order
        for head in heads[share:]:
            if len(chosen) < limit:
                chosen.setdefault(head, role)
    return sorted(chosen.items())[:limit]


def _finite(value: Any) -> float:
    value = float(value)
    return value if math.isfinite(value) else -math.inf


def page_data(scan: Scan) -> tuple[dict[str, Any], dict[str, bytes]]:
    """What the page script draws: (JSON-able data, binary blobs by name). See the module docstring."""
    m = scan.model
    patterns = scan.patterns
    bidirectional = bool(getattr(scan.head_scores, "bidirectional", False))
    blobs: dict[str, bytes] = {}
    data: dict[str, Any] = {
        "n_layers": m.n_layers,
        "n_heads": m.n_heads,
        "columns": [c.as_json() for c in columns(scan)],
        "tokens": list(scan.tokens),
        # the roles in order, each with the heads its score calls: the page's role labels and its first head
        "role_heads": [{"role": f"{role.name} head", "heads": [layer * m.n_heads + head
                                                               for layer, head in scan.called_by(role.score)]}
                       for role in scan_roles(scan)],
        "pattern": None,
        "copies": copy_starts(scan),
        "circuit_view": [{"head": a * m.n_heads + b, "role": role} for (a, b), role in circuit_view_heads(scan)],
        "spectra": {},
        "composition": {},
    }
    if patterns is not None and patterns.numel():
        blobs["patterns"] = pattern_bytes(patterns, triangular=not bidirectional)
        data["pattern"] = {"pos": int(patterns.shape[-1]), "triangular": not bidirectional, "blob": "patterns"}
    for circuit, sigma in sorted(scan.spectra.items()):
        s = sigma.detach().to("cpu", torch.float32)
        top = s.amax(dim=-1, keepdim=True).clamp(min=1e-30)
        blobs[f"spectra-{circuit}"] = quantise(s / top, 1.0)
        data["spectra"][circuit] = {"k": int(s.shape[-1]), "max": flat(top[..., 0]), "blob": f"spectra-{circuit}"}
    for mode in sorted(scan.composition, key=_mode_order):
        scores = scan.composition[mode]
        packed, scale = composition_blocks(scores)
        blobs[f"composition-{mode}"] = packed
        out_edges, in_edges = strongest_edges(scores)
        baseline = scan.baselines.get(mode)
        data["composition"][mode] = {
            "blob": f"composition-{mode}",
            "scale": number(scale, JSON_DIGITS),
            "baseline": None if baseline is None else number(baseline.mean, PAGE_DIGITS),
            "baseline_std": None if baseline is None else number(getattr(baseline, "std", None), PAGE_DIGITS),
            "out": out_edges,
            "in": in_edges,
        }
    return data, blobs


__all__ = [
    "JSON_FORMAT", "UNITS", "Column", "circuit_edges", "circuit_json", "columns", "number", "page_data", "plain",
    "scan_json",
]
