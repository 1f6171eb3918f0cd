"""A task scan's ``report.html``: one self-contained page (opens offline) in the induction report's design.

The same layout, stylesheet and page script as :mod:`circuitkit.report.page` (``report/assets``): a main column of
sections and a sticky side panel (``#ck-detail``: the selected head's figures and its attention on the task's first
clean prompt), the page data as JSON and the attention patterns and CircuitsVis bundle packed in ``<script>``
elements. Sections, in order:

- **the answer** (:meth:`TaskScan.answer`, as plain HTML: each line a paragraph, the circuit's heads links that
  select them, its members' explanations in a ``<details>`` element, closed past :data:`MEMBERS_OPEN`) and the
  circuit as a diagram of typed nodes (:mod:`circuitkit.tasks.diagram`);
- **the circuit's attention** on the first clean prompt (CircuitsVis ``AttentionHeads`` of its heads);
- **all heads**: the sortable, filterable table of every head with the task's columns (EAP-IG score, DLA, the
  task's head scores, pattern scores, in the circuit), written as plain HTML too;
- **scores by layer**: one ``[layer, head]`` heatmap per column;
- **faithfulness**: the node circuit's curve (its interval as a whisker), the same sets on the held-out pairs,
  the edge circuit's curve over MIB's sizes;
- **the circuit's edges**: the strongest with their exact effects;
- **the task**: its description and first pairs with their metric; **model and settings**.

Without JavaScript the answer, the diagram, the curves and every table read as they are; the heatmaps, the
attention views and sorting need it. Every string from the model or the user is escaped; the output is a pure
function of the scan (the same scan, the same bytes), so a loaded scan writes the same page.
"""

from __future__ import annotations

import re
from typing import Any

from circuitkit._html import escape, script_json
from circuitkit.report.sections import Section, settings_table

PAIRS_SHOWN = 5
"""Pairs the task section lists with their metric (every pair is in ``scores.json``)."""
MEMBERS_OPEN = 8
"""The circuit's members, each explained on a line of the answer, sit in a ``<details>`` element that opens with
the page up to this many; a larger circuit's (IOI on a 0.5B model: 55 heads) opens on a click, so that the
diagram, the curves and the edges are not pushed a few screens down."""
HEAD_TEXT = re.compile(r"(?<![\d.+\-])(\d+)\.(0|[1-9]\d*)(?!\d|\.\d)")
"""A head name in the answer's text (``1.2``; not a number such as ``+1.284`` or ``0.048``)."""


def _roles(scan: Any) -> dict[str, list[str]] | None:
    """The scan's IOI roles by name, heads as ``"layer.head"`` (None where the rules do not apply)."""
    from circuitkit.ranking import head_name
    from circuitkit.tasks.roles import ioi_roles

    roles = ioi_roles(scan)
    return None if roles is None else {role: [head_name(h) for h in heads] for role, heads in roles.items()}


def _answer_html(scan: Any) -> str:
    """The answer's lines as paragraphs, escaped; head names of the circuit and of the task's roles as links that
    select the head (other numbers untouched)."""
    linked = {f"{a}.{b}" for a, b in (scan.circuit.heads if scan.circuit is not None else ())}
    linked |= {h for heads in (_roles(scan) or {}).values() for h in heads}
    for values in scan.head_scores.values():
        from circuitkit.ranking import top_heads

        linked |= {f"{a}.{b}" for (a, b), _ in top_heads(values, 3)}

    def link(match: re.Match) -> str:
        name = f"{match.group(1)}.{match.group(2)}"
        return f'<span class="ck-head" data-head="{name}" tabindex="0">{name}</span>' if name in linked else name

    lines: list[str] = []
    members: list[str] = []  # the indented lines under "Node circuit:", one per member

    def close_members() -> None:
        if members:
            shown = " open" if len(members) <= MEMBERS_OPEN else ""
            lines.append(f'<details class="ck-members"{shown}><summary>The circuit\'s {len(members)} members, '
                         f"each explained</summary>{''.join(members)}</details>")
            members.clear()

    under_nodes = False
    for line in scan.answer().splitlines():
        legend = line.startswith("Legend:")  # its numbers are thresholds, never heads
        text = escape(line) if legend else HEAD_TEXT.sub(link, escape(line))
        cls = ' class="note"' if legend else ""
        indented = line.startswith("  ")
        paragraph = f"<p{cls}>{'&nbsp;&nbsp;' if indented else ''}{text}</p>"
        if indented and under_nodes:
            members.append(paragraph)
            continue
        close_members()
        under_nodes = line.startswith("Node circuit:")
        lines.append(paragraph)
    close_members()
    return "".join(lines)


def answer_section(scan: Any) -> Section:
    from circuitkit.tasks.diagram import circuit_diagram

    diagram = circuit_diagram(scan) if scan.circuit is not None else ""
    body = f'<div class="ck-answer"><div class="ck-answer-text">{_answer_html(scan)}</div></div>{diagram}'
    return Section("summary", "The answer", body)


def patterns_section(scan: Any) -> Section | None:
    from circuitkit.tasks.report_data import CIRCUIT_VIEW_HEADS, ranked_circuit

    heads = ranked_circuit(scan)[:CIRCUIT_VIEW_HEADS]
    if not heads or scan.patterns is None:
        return None
    tokens = " ".join(f"<code>{escape(t)}</code>" for t in scan.tokens)
    note = (f"CircuitsVis AttentionHeads of the circuit's heads ({', '.join(f'{a}.{b}' for a, b in sorted(heads))}) "
            "on the task's first clean prompt: hover a thumbnail to enlarge it, click to keep it. Rows: query "
            "position, columns: key; blue = attention.")
    return Section("patterns", "The circuit's attention on a task prompt",
                   f'<p class="ck-tokens">{tokens}</p><div id="ck-cv-circuit" class="ck-cv ck-cv-circuit"></div>',
                   note)


def _cell(column: dict[str, Any], i: int) -> str:
    value = column["values"][i]
    if column.get("flag"):
        return "yes" if value else ""
    return "" if value is None else f"{value:.3f}"


def heads_section(scan: Any, columns: list[dict[str, Any]]) -> Section:
    from circuitkit.tasks.table import task_table

    n_heads = scan.model.n_heads
    header = '<th scope="col">head</th>' + "".join(
        f'<th scope="col" title="{escape(c["description"])}">{escape(c["short"])}</th>' for c in columns)
    rows = []
    for row in task_table(scan):  # by |EAP-IG score|, as the page script sorts it
        i = row["layer"] * n_heads + row["index"]
        rows.append(f'<tr><th scope="row">{row["head"]}</th>'
                    + "".join(f"<td>{_cell(c, i)}</td>" for c in columns) + "</tr>")
    legend = "".join(f"<li><b>{escape(c['short'])}</b>: {escape(c['description'])}</li>" for c in columns)
    body = ('<div class="ck-controls"><input id="ck-filter" type="search" spellcheck="false" '
            'placeholder="filter: 3  3.4  circuit>0  EAP-IG>0.1  top" aria-label="filter heads"> '
            '<span id="ck-count" class="note"></span></div>'
            f'<div class="ck-table-wrap"><table id="ck-table" class="ck-heads"><thead><tr>{header}</tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table></div>"
            f'<details class="ck-legend"><summary>columns</summary><ul>{legend}</ul></details>')
    from circuitkit.tasks.table import ranking_column

    first = ("|joint| (its share along the joint path, which ranked the circuit)" if ranking_column(scan) == "joint"
             else "|EAP-IG score| (which ranked the circuit)")
    note = (f"Every head with the task's columns, largest {first} first. Click a column to sort, a row to "
            "inspect the head. Colours: white at 0 (pattern scores: at what a random head scores), red above, blue "
            "below; bold and boxed: the top heads of each column.")
    return Section("heads", "All heads", body, note)


def heatmaps_section(scan: Any) -> Section:
    return Section("scores", "Scores by layer", '<div id="ck-heatmaps" class="ck-multiples"></div>',
                   "One grid per column of the table: rows = layers, columns = heads. Click a cell.")


def faithfulness_section(scan: Any) -> Section | None:
    from circuitkit.report.figures import faithfulness_curve

    c = scan.circuit
    if c is None:
        return None
    size = len(c.heads) + len(c.mlps) + sum(len(members) for members in c.nodes.values())
    unit = "nodes" if c.mlps or c.n_nodes_total > scan.model.n_layers * scan.model.n_heads else "heads"
    whisker = {size: c.intervals["faithfulness"]} if "faithfulness" in c.intervals else None
    figures = [(faithfulness_curve([(p.size, p.faithfulness) for p in c.curve], c.target, size, c.n_nodes_total,
                                   whisker, unit=unit, searched=_searched(scan, c.faithfulness)),
                f"Node circuit: the top-n {unit} by "
                f"{'joint-path share' if c.ranked_by == 'joint' else 'EAP-IG score'} kept, every other one patched "
                "from the corrupted "
                "prompt (every point measured; the whisker: the interval over the pairs)."
                + _searched_nodes(scan, size, unit, c.faithfulness))]
    other = c.other_set
    if other and other.get("curve"):
        points = [(p["size"], p["faithfulness"]) for p in other["curve"]]
        at_size = other.get("faithfulness")  # none where patching every node there leaves the metric as it was
        interval = (other.get("ci") or {}).get("faithfulness")
        said = "no faithfulness" if at_size is None else f"faithfulness {at_size:.3f}{_interval(interval)}"
        figures.append((faithfulness_curve(points, c.target, size, c.n_nodes_total,
                                           None if interval is None else {size: tuple(interval)}, unit=unit,
                                           searched=_searched(scan, at_size)),
                        f"The same {unit} on the {other['pairs']} {escape(other['set'])} pairs the search did not "
                        f"use: {said} at the circuit's size{'' if interval is None else ' (the whisker)'}."
                        + _searched_nodes(scan, size, unit, at_size)))
    if c.edge_curve:
        edge_whisker = ({len(c.edges): c.intervals["edge_faithfulness"]} if "edge_faithfulness" in c.intervals
                        else None)
        figures.append((faithfulness_curve([(p.size, p.faithfulness) for p in c.edge_curve], c.target, len(c.edges),
                                           c.n_edges_total, edge_whisker, unit="edges"),
                        f"Edge circuit at MIB's sizes (0.1% to 100% of {c.n_edges_total} edges), edges ranked by "
                        f"{escape(c.rank)} score{'; the whisker: the interval over the pairs' if edge_whisker else ''}."
                        f" MIB's CPR {c.cpr:.3f}{_interval(c.intervals.get('cpr'))} (the area under this curve with "
                        f"edges ranked by signed score), CMD {c.cmd:.3f}{_interval(c.intervals.get('cmd'))} (the area "
                        "between 1 and it with edges ranked by absolute score)." + _searched_edges(scan)))
    body = '<div class="ck-answer">' + "".join(
        f'<figure style="margin:0">{svg}<figcaption class="note" style="max-width:300px">{caption}</figcaption>'
        "</figure>" for svg, caption in figures) + "</div>"
    return Section("faithfulness", "Faithfulness", body)


def _interval(pair: tuple[float, float] | None) -> str:
    return "" if pair is None else f" [{pair[0]:.3f}, {pair[1]:.3f}]"


def edges_section(scan: Any) -> Section | None:
    c = scan.circuit
    if c is None or not c.edge_effects:
        return None
    rows = "".join(f"<tr><td>{escape(e.name)}</td><td>{e.score:+.3f}</td><td>{e.effect:+.3f}"
                   f"{_interval(e.interval)}</td></tr>" for e in c.edge_effects)
    more = (f"<details><summary>every edge of the circuit ({len(c.edges)})</summary><p>"
            + ", ".join(f"<code>{escape(e)}</code>" for e in c.edges) + "</p></details>") if c.edges else ""
    body = ('<table class="ck-small"><tr><th>edge</th><th>EAP-IG score</th><th>exact effect (path patched)</th></tr>'
            f"{rows}</table>{more}")
    level = scan.settings.get("ci_level", 0.95) if isinstance(getattr(scan, "settings", None), dict) else 0.95
    return Section("edges", "The circuit's strongest edges", body,
                   "Each edge's exact effect: the mean metric lost when only that edge takes its corrupted value; "
                   f"beside it, [lo, hi], its {level:.0%} percentile bootstrap interval over the pairs.")


def typed_nodes_section(scan: Any) -> Section | None:
    """The circuit's nodes of the further node types (neuron groups, a user's types) with their EAP-IG scores."""
    c = scan.circuit
    if c is None or not c.nodes:
        return None
    parts = []
    for name, members in c.nodes.items():
        kind = scan.nodes.get(name, {})
        where = {label: (layer, i) for layer, row in enumerate(kind.get("labels", [])) for i, label in enumerate(row)}
        rows = "".join(f"<tr><td>{escape(label)}</td><td>{float(kind['score'][where[label]]):+.3f}</td></tr>"
                       if label in where else f"<tr><td>{escape(label)}</td><td></td></tr>" for label in members)
        said = f" ({escape(kind['describe'])}; a node outside the circuit: {escape(kind['patch'])})" if kind else ""
        parts.append(f"<h3>The circuit's {escape(name)} nodes</h3><p>{len(members)} nodes{said}.</p>"
                     f'<table class="ck-small"><tr><th>node</th><th>EAP-IG score</th></tr>{rows}</table>')
    return Section("nodes", "The circuit's further nodes", "".join(parts),
                   "Nodes of the types beyond heads and MLPs that the node circuit keeps.")


def _text(value: Any) -> str:
    if isinstance(value, tuple) and all(isinstance(v, str) for v in value):
        return " | ".join(value)
    return str(list(value)) if isinstance(value, tuple) else str(value)


def task_section(scan: Any) -> Section:
    task = scan.task
    rows = "".join(
        f"<tr><td>{i}</td><td><code>{escape(_text(p.clean))}</code></td><td><code>{escape(_text(p.corrupted))}"
        f"</code></td><td><code>{escape(_text(p.answers))}</code></td><td><code>{escape(_text(p.wrongs))}</code></td>"
        f"<td>{float(scan.clean[i]):+.3f}</td><td>{float(scan.corrupted[i]):+.3f}</td></tr>"
        for i, p in enumerate(task.pairs[:PAIRS_SHOWN]))
    body = (f"<p>{escape(task.description)}</p>" if task.description else "") + (
        '<div style="overflow-x:auto"><table class="ck-small"><tr><th>pair</th><th>clean</th><th>corrupted</th>'
        f"<th>answer</th><th>wrong</th><th>metric clean</th><th>corrupted</th></tr>{rows}</table></div>")
    note = f"The first {min(PAIRS_SHOWN, task.n_pairs)} of {task.n_pairs} pairs (scores.json holds them all)."
    return Section("task", "The task", body, note, png=False)


def details_section(scan: Any) -> Section:
    rows = [(k, v) for k, v in scan.model.as_dict().items() if v is not None]
    rows += sorted(scan.settings.items())
    rows += [(f"stage {s.name}", f"{s.passes:g} pass{'' if s.passes == 1 else 'es'}, {s.seconds:.2f} s")
             for s in scan.stages]
    return Section("details", "Model and settings", settings_table(rows), png=False)


def _searched_nodes(scan: Any, size: int, unit: str, faithfulness: float | None) -> str:
    """A node curve's caption, where a node search beyond ranking ran: the ringed size is the searched circuit's,
    and its figure and whisker are that set's, not the curve's point there (the top-``size`` set by score)."""
    name = scan.searched()
    if name is None:
        return ""
    said = "" if faithfulness is None else f" at {faithfulness:.3f}"
    return (f" The ring is the {escape(name)} search's circuit ({size} {unit}{said}), found from the "
            "ranked one: drawn at that set's own figure, with its whisker, off this curve (whose point there is the "
            f"top {size} by score).")


def _searched(scan: Any, faithfulness: float | None) -> tuple[str, float] | None:
    """A node curve's ``searched`` (:func:`~circuitkit.report.figures.faithfulness_curve`): the search and the
    searched set's own ``faithfulness``, ringed off the ranking's curve; None for the ranked circuit or where the
    set has no figure there."""
    name = scan.searched()
    return None if name is None or faithfulness is None else (name, faithfulness)


def _searched_edges(scan: Any) -> str:
    """The edge curve's caption, where an edge search ran: the marked size is the searched circuit's."""
    name = scan.searched("edge_search")
    c = scan.circuit
    if name is None or c is None or c.edge_faithfulness is None:
        return ""
    return (f" The marked size is the {escape(name)} search's circuit ({len(c.edges)} edges at "
            f"{c.edge_faithfulness:.3f}), found from the ranked one, not a point of this curve.")


def task_report(scan: Any, *, compress: bool = True) -> str:
    """The page for a :class:`~circuitkit.tasks.TaskScan` (see the module docstring)."""
    from circuitkit import __version__
    from circuitkit.report import summary
    from circuitkit.report.page import (
        CIRCUITSVIS_ID,
        NO_SCRIPT_STATUS,
        asset,
        pack,
        packed_circuitsvis,
        render_section,
        script_code,
    )
    from circuitkit.tasks.report_data import page_data

    data, blobs = page_data(scan, _roles(scan))
    sections = [s for s in (answer_section(scan), patterns_section(scan), heads_section(scan, data["columns"]),
                            heatmaps_section(scan), faithfulness_section(scan), typed_nodes_section(scan),
                            edges_section(scan), task_section(scan), details_section(scan)) if s is not None]
    nav = "".join(f'<a href="#ck-sec-{escape(s.id)}">{escape(s.title)}</a>' for s in sections)
    packed = []
    for name, blob in blobs.items():
        mime, text = pack(blob, compress=compress)
        packed.append(f'<script type="{mime}" id="ck-blob-{escape(name)}">{text}</script>')
    lib_mime, lib_text = packed_circuitsvis(compress)
    packed.append(f'<script type="{lib_mime}" id="{CIRCUITSVIS_ID}">{lib_text}</script>')
    title = f"circuitkit: the {scan.task.name} circuit of {scan.model.name}"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{asset('report.css')}</style></head><body>\n"
        '<div class="ck-layout"><main class="ck-main">'
        f'<header><h1>{escape(title)}</h1><p class="ck-model">{summary.model_line(scan)}</p>'
        f'<nav>{nav}</nav><p id="ck-status" class="note">{NO_SCRIPT_STATUS}</p></header>\n'
        + "\n".join(render_section(s) for s in sections)
        + f'\n<footer class="note">circuitkit {escape(__version__)}</footer></main>\n'
        '<aside id="ck-detail" class="ck-detail" aria-live="polite"><p class="note">Click a head (a table row, a '
        "heatmap cell, a node of the diagram) to see its scores and its attention on the first clean prompt.</p>"
        "</aside></div>\n"
        f'<script type="application/json" id="ck-data">{script_json(data)}</script>\n'
        + "\n".join(packed)
        + f"\n<script>{script_code(asset('report.js'))}</script>\n</body></html>\n"
    )


__all__ = ["task_report"]
