"""What a task report's page script draws: the head table's columns and the page data, in the shape the induction
report's script (``report/assets/report.js``) reads, so both pages share one script and one stylesheet.

Columns (:class:`circuitkit.report.data.Column`), in the table's order (:func:`circuitkit.tasks.table.columns`):
the EAP-IG score, the joint path's share, each head patched alone (``exact``, where asked for) and DLA (white at 0,
red above, blue below, symmetric; ranked by size, ``abs``), the task's own head scores (in [-1, 1], white at 0), the
registered pattern scores (in [0, 1], white at what a random head scores) and ``in_circuit`` (a ``flag``: "yes" or
blank). The page data adds the tokens of the first clean prompt and every
head's attention on it (the ``patterns`` blob, causal rows only), the circuit's heads for the CircuitsVis view and
the roles that select a head first.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from circuitkit.ranking import top_heads
from circuitkit.report.data import Column, _range, pattern_bytes
from circuitkit.tasks.table import ranking_column, ranking_scores

CIRCUIT_VIEW_HEADS = 12
"""Heads of the circuit the CircuitsVis view shows: the first in the column that ranked them
(:func:`ranked_circuit`)."""


def marked_top(scan: Any) -> int:
    """How many top heads per column are highlighted: at most 5 and an eighth of the heads (at least 1)."""
    return min(5, max(1, scan.model.n_layers * scan.model.n_heads // 8))


def _top(values: torch.Tensor, k: int, absolute: bool) -> tuple[int, ...]:
    n_heads = values.shape[1]
    ranked = top_heads(values.abs() if absolute else values, k)
    return tuple(layer * n_heads + head for (layer, head), v in ranked if not math.isnan(v))


def columns(scan: Any) -> list[dict[str, Any]]:
    """The head table's columns as the page script reads them (see the module docstring)."""
    from circuitkit.detect import registry
    from circuitkit.errors import CircuitkitError
    from circuitkit.graph.metrics import dla_meaning, metric_units
    from circuitkit.tasks.table import columns as table_columns

    units = metric_units(scan.task.metric)
    own = {name: (to, minus) for name, to, minus in scan.task.attention_scores}
    k = marked_top(scan)
    out = []
    for name, values in table_columns(scan):
        values = values.detach().float().cpu()
        extra: dict[str, Any] = {}
        if name in ("score", "dla", "joint", "exact"):
            lo, hi = _range(values)
            bound = max(abs(lo), abs(hi), 1e-12)
            short = {"score": "EAP-IG", "dla": "DLA", "joint": "joint", "exact": "exact"}[name]
            lo, hi, neutral, extra = -bound, bound, 0.0, {"abs": True}
            description = {"score": f"EAP-IG node score ({units}): the metric estimated lost when the head takes its "
                                    "corrupted value",
                           "dla": f"direct logit attribution (logits): {dla_meaning(scan.task.metric)}",
                           "joint": f"joint-path share ({units}): the head's part of the metric's change as every "
                                    "node moves together from its patched value to its own (what ordered the "
                                    "nodes)",
                           "exact": f"exact ({units}): the metric lost with the head alone patched, every other node "
                                    "clean (blank: not patched alone); what the EAP-IG score estimates"}[name]
        elif name in own:
            short, lo, hi, neutral = name, -1.0, 1.0, 0.0
            description = f"attention from the last token to {own[name][0]} minus to {own[name][1]}"
        else:
            try:
                definition = registry.get(name)
                short, description, neutral = definition.short, definition.description, definition.neutral
            except CircuitkitError:  # a pattern score registered while scanning, gone since
                short, description, neutral = name, name, 0.0
            neutral = 0.0 if neutral is None or not math.isfinite(neutral) else float(neutral)
            lo, hi = 0.0, 1.0
            description = f"{description} (on the task's clean prompts)"
        column = Column(name, short, description, values, neutral, lo, hi, _top(values, k, bool(extra)))
        out.append({**column.as_json(), **extra})
    flags = torch.zeros(scan.model.n_layers, scan.model.n_heads)
    for layer, head in (scan.circuit.heads if scan.circuit is not None else ()):
        flags[layer, head] = 1.0
    circuit = Column("in_circuit", "circuit", "in the node circuit", flags, 0.0, 0.0, 3.0, ())
    out.append({**circuit.as_json(), "flag": True})
    return out


def ranked_circuit(scan: Any) -> list[tuple[int, int]]:
    """The node circuit's heads, largest first in the column that ranked them (:func:`~circuitkit.tasks.table.
    ranking_column`: the joint path's share, or the EAP-IG score); none without a circuit."""
    if scan.circuit is None:
        return []
    values, _ = ranking_scores(scan)
    return sorted(scan.circuit.heads, key=lambda h: (-abs(float(values[h[0], h[1]])), h))


def page_data(scan: Any, roles: dict[str, list[str]] | None) -> tuple[dict[str, Any], dict[str, bytes]]:
    """(JSON-able data, binary blobs by name) for ``report.js`` (see the module docstring); ``roles``: the IOI roles
    by name (``scores.json``'s ``roles``)."""
    n_layers, n_heads = scan.model.n_layers, scan.model.n_heads
    circuit = ranked_circuit(scan)
    index = {h: h[0] * n_heads + h[1] for h in circuit}
    role_heads = [{"role": "in the circuit", "heads": [index[h] for h in circuit]}]
    for role, heads in (roles or {}).items():
        parsed = [tuple(int(v) for v in h.split(".")) for h in heads]
        role_heads.append({"role": role, "heads": [a * n_heads + b for a, b in parsed]})
    named = {h: role for role, heads in (roles or {}).items() for h in heads}
    view = sorted(circuit[:CIRCUIT_VIEW_HEADS])
    data: dict[str, Any] = {
        "n_layers": n_layers, "n_heads": n_heads, "columns": columns(scan), "tokens": list(scan.tokens),
        "role_heads": role_heads, "pattern": None, "copies": [], "spectra": {}, "composition": {},
        "sort": ranking_column(scan),
        "circuit_view": [{"head": a * n_heads + b, "role": named.get(f"{a}.{b}", "circuit")} for a, b in view],
    }
    blobs: dict[str, bytes] = {}
    if scan.patterns is not None and scan.patterns.numel():
        blobs["patterns"] = pattern_bytes(scan.patterns, triangular=True)
        data["pattern"] = {"pos": int(scan.patterns.shape[-1]), "triangular": True, "blob": "patterns",
                           "on": "the first clean prompt"}
    return data, blobs


__all__ = ["CIRCUIT_VIEW_HEADS", "columns", "page_data", "ranked_circuit"]
