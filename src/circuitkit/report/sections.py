"""The report's sections, in page order: each is one function ``Scan -> Section | None`` in :data:`SECTIONS`.

To add a section, write a function that returns a :class:`Section` (or ``None`` when the scan has nothing
for it) and append it to :data:`SECTIONS`; the page builder adds its heading, its link in the navigation bar
and, with ``png=`` set, its PNG export. Section bodies are HTML: escape every string from the model with
:func:`esc`. Interactive parts are empty placeholders (``<div id="ck-...">``) that ``assets/report.js`` fills
from the page data (:func:`circuitkit.report.data.page_data`); anything with ``data-head="layer.head"``
selects that head when clicked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from circuitkit._html import escape as esc
from circuitkit.ranking import head_name
from circuitkit.report import data, figures, summary

if TYPE_CHECKING:
    from circuitkit.scan_record import ScanRecord as Scan



@dataclass(frozen=True)
class Section:
    """One section of the page: ``id`` (HTML id, also the PNG name), heading ``title``, HTML ``body``;
    ``png``: export the section as ``png/<id>.png`` with ``--png``; ``note``: a one-line explanation."""

    id: str
    title: str
    body: str
    note: str = ""
    png: bool = True


SectionBuilder = Callable[["Scan"], "Section | None"]


def summary_section(scan: Scan) -> Section:
    return Section("summary", "The answer", summary.story_html(scan))


def patterns_section(scan: Scan) -> Section | None:
    """The circuit's heads (:func:`circuitkit.report.data.circuit_view_heads`) as one CircuitsVis
    ``AttentionHeads`` view, drawn by the page script into ``#ck-cv-circuit``."""
    if scan.patterns is None or not scan.patterns.numel():
        return None
    heads = data.circuit_view_heads(scan)
    if not heads:
        return None
    named = ", ".join(f"{head_name(h)} ({role})" for h, role in heads)
    note = (f"CircuitsVis AttentionHeads of {named} on the repeated sequence: hover a thumbnail to enlarge it, "
            "click to keep it. Rows: query (destination) position, columns: key (source); blue = attention.")
    return Section("patterns", "The circuit's attention patterns",
                   '<div id="ck-cv-circuit" class="ck-cv ck-cv-circuit"></div>', note)


def heads_section(scan: Scan) -> Section:
    columns = data.columns(scan)
    legend = "".join(
        f'<li><b>{esc(c.short)}</b>: {esc(c.description)} (white = {c.neutral:.3g}, '
        f'{"a random head" if c.key not in ("attribution", "ablation") else "no effect"})</li>'
        for c in columns
    )
    body = (
        '<div class="ck-controls"><input id="ck-filter" type="search" spellcheck="false" '
        'placeholder="filter: 3  3.4  induct>0.5  top" aria-label="filter heads"> '
        '<span id="ck-count" class="note"></span></div>'
        '<div class="ck-table-wrap"><table id="ck-table" class="ck-heads">'
        f"{_static_table(columns, scan.model.n_layers, scan.model.n_heads)}</table></div>"
        f'<details class="ck-legend"><summary>columns</summary><ul>{legend}</ul></details>'
    )
    note = (f"Every head, every score. Click a column to sort, a row to inspect the head. Colours: white is what a "
            f"random head scores, red above, blue below; bold and boxed: top {data.marked_top(scan)} per column.")
    return Section("heads", "All heads", body, note)


def _static_table(columns: list[data.Column], n_layers: int, n_heads: int) -> str:
    """The head table as plain HTML (``<thead>`` and ``<tbody>``, heads in order, values as the page script writes
    them: 3 decimals, blank where not measured), readable without JavaScript; the page script replaces it with the
    sortable, coloured one."""
    header = '<th scope="col">head</th>' + "".join(
        f'<th scope="col" title="{esc(c.description)}">{esc(c.short)}</th>' for c in columns)
    rows = []
    for layer in range(n_layers):
        for head in range(n_heads):
            cells = "".join(f"<td>{_plain_number(c.values[layer, head])}</td>" for c in columns)
            rows.append(f'<tr><th scope="row">{layer}.{head}</th>{cells}</tr>')
    return f"<thead><tr>{header}</tr></thead><tbody>{''.join(rows)}</tbody>"


def _plain_number(value: Any) -> str:
    """A table cell's value as the page script shows it (the page data's rounded value, 3 decimals; blank for
    NaN)."""
    rounded = data.number(value)
    return "" if rounded is None else f"{rounded:.3f}"


def heatmaps_section(scan: Scan) -> Section:
    return Section(
        "scores", "Scores by layer",
        '<div id="ck-heatmaps" class="ck-multiples"></div>',
        "One small grid per column of the table, rows = layers (shared), columns = heads. Click a cell.",
    )


def _axes(canvas_id: str, x_label: str, y_label: str) -> str:
    """A heatmap canvas with its axis labels: ``y_label`` written upwards at its left, ``x_label`` below it (the page
    script adds the layers shown to both)."""
    return (f'<div class="ck-axes"><div class="ck-ylab" id="{canvas_id}-y">{y_label}</div>'
            f'<div><canvas id="{canvas_id}"></canvas><div class="ck-xlab" id="{canvas_id}-x">{x_label}</div></div>'
            "</div>")


def composition_section(scan: Scan) -> Section | None:
    if not scan.composition and not scan.edges:
        return None
    modes = [m for m in data.MODES if m in scan.composition]
    buttons = "".join(
        f'<button type="button" class="ck-mode" data-mode="{esc(m)}">{esc(m)}-composition</button>' for m in modes
    )
    interactive = (
        f'<div class="ck-controls">{buttons} <button type="button" id="ck-comp-all">whole model</button> '
        '<span id="ck-comp-where" class="note"></span></div>'
        '<div class="ck-comp"><div><div class="ck-cap">layer &rarr; layer (max over head pairs); click to zoom</div>'
        + _axes("ck-comp-layers", "destination layer &rarr;", "source layer &darr;")
        + '</div><div><div class="ck-cap">head &rarr; head (rows: source, columns: destination)</div>'
        + _axes("ck-comp-heads", "destination head &rarr;", "source head &darr;") + "</div></div>"
        if modes else ""
    )
    edges = []
    rows = []
    for mode in data.MODES:
        baseline = scan.baselines.get(mode)
        mean = None if baseline is None else float(baseline.mean)
        top = max((float(e.score) for e in scan.edges.get(mode, ())), default=0.0)
        for e in scan.edges.get(mode, ()):
            score = float(e.score)
            rel = (score - (mean or 0.0)) / max(top - (mean or 0.0), 1e-12)
            edges.append(figures.GraphEdge(
                e.src, e.dst, figures.MODE_COLOURS[mode], 1.0 + 4.0 * max(0.0, rel),
                f"{head_name(e.src)} -> {head_name(e.dst)}: {mode} {score:.3f}"
                + ("" if mean is None else f" (random {mean:.3f})"),
                f"{score:.2f}",
            ))
            rows.append(f"<tr><td>{mode}</td><td>{_head(e.src)} &rarr; {_head(e.dst)}</td><td>{score:.4f}</td>"
                        f"<td>{'' if mean is None else f'{mean:.4f}'}</td></tr>")
    legend = [(f"{m}-composition", figures.MODE_COLOURS[m], False) for m in data.MODES if scan.edges.get(m)]
    graph = figures.head_graph(scan.model.n_layers, scan.model.n_heads, edges, legend=legend) if edges else ""
    table = (
        "<details><summary>top edges as a table</summary><table class=\"ck-small\"><tr><th>mode</th><th>edge</th>"
        f"<th>score</th><th>random</th></tr>{''.join(rows)}</table></details>" if rows else ""
    )
    note = ("Composition scores ||W_A W_B|| / (||W_A|| ||W_B||) between every earlier and later head; white is the "
            "random baseline of the same shapes. Below: the top edges per mode only.")
    return Section("composition", "Composition between heads", interactive + graph + table, note)


def circuit_section(scan: Scan) -> Section | None:
    """The edge table (every edge measure side by side, each in its own column: composition, edge attribution,
    path patching and any registered measure, :mod:`circuitkit.circuits.measures`) and a
    graph of the exactly patched edges only (an estimate is never drawn as if measured). The flags come from the
    evidence (:mod:`circuitkit.circuits.evidence`, the one home of their thresholds)."""
    rows = data.circuit_rows(scan)
    if not rows:
        return None
    measures = data.evidence_columns(rows)  # one column per edge measure (circuitkit.circuits.measures)
    members = {tuple(h) for h in scan.verified.heads} if getattr(scan, "verified", None) is not None else set()
    patched = [(row, data.number(row.patched)) for row in rows]
    largest = max((abs(v) for _, v in patched if v is not None), default=0.0)
    edges, table = [], []
    for row, effect in patched:
        channel = str(row.channel).upper()
        comp = data.number(row.composition)
        flag = ""
        if row.weight_only:
            flag = "strong in the weights, carries nothing"
        elif row.effect_only:
            flag = "carries an effect without weight support"
        inside = tuple(row.src) in members and tuple(row.dst) in members
        if effect is not None:
            t = 0.0 if largest == 0 else effect / largest
            edges.append(figures.GraphEdge(
                tuple(row.src), tuple(row.dst), figures.diverging(t), 1.5 + 4.0 * abs(t),
                f"{head_name(row.src)} -> {head_name(row.dst)} ({channel}): exact effect {effect:+.3f} nats "
                "(path patching)" + ("" if comp is None else f", composition {comp:.3f}") + (f"; {flag}" if flag
                                                                                             else ""),
                f"{effect:+.2g}",  # two significant figures: small effects do not read +0.00
                dash=bool(flag),
            ))
        cells = [
            f"{_head(row.src)} &rarr; {_head(row.dst)}", esc(channel), "yes" if inside else "",
            *(_fmt(data.number(row.get(name))) for name, _ in measures), esc(flag),
        ]
        table.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    legend = [("effect > 0", figures.diverging(1.0), False), ("effect < 0", figures.diverging(-1.0), False),
              ("weights and effect disagree", "#888", True)]
    graph = figures.head_graph(scan.model.n_layers, scan.model.n_heads, edges, legend=legend) if edges else ""
    body = graph + (
        '<table class="ck-small"><tr><th>edge</th><th>channel</th><th>in the circuit</th>'
        + "".join(f"<th>{esc(heading)}</th>" for _, heading in measures)
        + f"<th></th></tr>{''.join(table)}</table>"
    )
    note = ("Edge-level causal evidence: the change of the repeated-copies loss when only the sender's path into "
            "the receiver's query/key/value is corrupted. The graph draws the exactly patched edges only (the edges "
            "between the circuit's heads); the table adds the top edges by composition and by edge attribution, "
            "an estimate. Dashed: the weights and the effect disagree.")
    return Section("circuit", "Causal evidence per edge", body, note)


def loss_section(scan: Scan) -> Section | None:
    loss = scan.induction_loss
    per_position = getattr(loss, "per_position", None) if loss is not None else None
    if per_position is None:
        return None
    settings = scan.settings
    offset = 1 if settings.bos is not None else 0
    # loss index i predicts token i + 1: copy c (tokens offset + c T ...) starts at index offset + c T - 1
    boundaries = [offset + c * settings.block_len - 1.5 for c in range(1, settings.n_repeats)]
    first, repeated = data.loss_figures(scan)
    note = (f"Loss on the first copy {first if first is None else f'{first:.3f}'} nats, on the repeated copies "
            f"{repeated if repeated is None else f'{repeated:.3f}'} nats (random tokens: the first copy cannot be "
            "predicted, the repeats can by copying).")
    return Section("loss", "Loss per position", figures.loss_curve(data.flat(per_position), boundaries), note)


def setting_text(value: Any) -> str:
    """A setting as the details table prints it: a record as ``key value; key value`` (keys sorted, empty parts left
    out), a list comma-separated, a float to 6 significant digits (a plan's 26.16666666666667 passes as 26.1667), None
    as ``none``; never a Python or JSON literal."""
    if isinstance(value, dict):
        # keys sorted: a scan read back from scores.json prints the same page as the scan that wrote it
        return "; ".join(f"{key} {setting_text(value[key])}" for key in sorted(value)
                         if value[key] is not None and value[key] != {}) or "none"
    if isinstance(value, list | tuple):
        return ", ".join(setting_text(v) for v in value) or "none"
    if isinstance(value, float):
        return f"{value:.6g}"
    return "none" if value is None else str(value)


def settings_table(rows: list[tuple[str, Any]]) -> str:
    """The model's facts and a scan's settings as one table (the "Model and settings" section of every report)."""
    body = "".join(f"<tr><th>{esc(key)}</th><td>{esc(setting_text(value))}</td></tr>" for key, value in rows)
    return f'<table class="ck-small">{body}</table>'


def details_section(scan: Scan) -> Section:
    rows = [(k, v) for k, v in scan.model.as_dict().items() if v is not None]
    rows += list(scan.settings.as_dict().items())
    tokens = " ".join(f"<code>{esc(t)}</code>" for t in scan.tokens)
    body = (f'{settings_table(rows)}<details><summary>token strings ({len(scan.tokens)})</summary>'
            f'<p class="ck-tokens">{tokens}</p></details>')
    return Section("details", "Model and settings", body, png=False)


def _head(head: Any) -> str:
    name = head_name(head)
    return f'<span class="ck-head" data-head="{name}" tabindex="0">{name}</span>'


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"


SECTIONS: list[SectionBuilder] = [
    summary_section,
    patterns_section,
    heads_section,
    heatmaps_section,
    composition_section,
    circuit_section,
    loss_section,
    details_section,
]
"""The page's sections in order; a new section is one function appended here."""

__all__ = ["SECTIONS", "Section", "SectionBuilder", "esc"]
