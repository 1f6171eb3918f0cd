"""The report of a training track (:class:`circuitkit.Track`): one self-contained HTML file, offline, no script
needed to read it (:func:`build_track_report`), a notebook summary (:func:`summary_html`) and PNG export of its
figures (:func:`export_track_pngs`).

Figures are static SVG written here, like the scan report's diagrams (:mod:`circuitkit.report.figures`): a few
hundred elements, deterministic bytes for the same track, readable before any script runs. They are:

- the in-context learning score against the step, the phase-change interval shaded;
- the first-copy and repeated-copies losses against the step;
- for each of the scan's default roles (:data:`circuitkit.detect.roles.DEFAULT_ROLES`: induction, previous-token),
  each head's score against the step: the heads that matter (called at the last checkpoint, or named at the phase
  change) in colour with their names, every other head faint grey, the scan's calling threshold dashed;
- the loss per position at a few checkpoints (the first, the two around the phase change, the last);
- with a task (``circuitkit track CKPT --task FILE``): its mean clean and corrupted metric and their gap against
  the step (the interval where the gap rises most shaded), the node circuit's faithfulness on the discovery and
  the held-out pairs, and every head's EAP-IG node score with the :data:`TOP_TASK_HEADS` largest at the last
  checkpoint in colour;
- a table of every checkpoint.

Every string from the user (labels, sources) is HTML-escaped.
"""

from __future__ import annotations

import html
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from circuitkit.detect.roles import DEFAULT_ROLES, HEAD_CALL_THRESHOLD, Role

Track = Any
"""A :class:`circuitkit.tracking.result.Track` (not imported: ``tracking.result`` imports this module to write its
report, and the two must not import each other)."""

WIDTH, HEIGHT = 860, 300
MARGIN = (56, 150, 28, 44)  # left, right, top, bottom: the right margin holds the legend
PALETTE = ("#c0392b", "#2e6db4", "#2e9d5b", "#d9822b", "#8e44ad", "#16a085", "#b7950b", "#7f8c8d")
FAINT = "#c8ccd0"
PHASE_FILL = "#fde9b8"
LOG_X_RATIO = 100
"""Steps are drawn on a log axis (of 1 + step) when the largest is over this many times the smallest non-zero one
(Pythia's checkpoints: 1, 2, 4, ..., 512, 1000, ..., 143000)."""
MAX_LOSS_CURVES = 4
TOP_TASK_HEADS = 5
"""Heads named in colour on the task's head-score chart: those of largest absolute EAP-IG node score at the last
checkpoint."""
PHASE_SCORE = "induction"
"""The score whose heads :mod:`circuitkit.tracking.phase` names at the phase change."""
STYLE = (
    "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;font-size:13px;line-height:1.45;color:#222;"
    "max-width:1060px;margin:0 auto;padding:0 14px}h1{font-size:19px;margin:12px 0 2px}h2{font-size:16px;"
    "margin:0 0 4px}.note{color:#666;margin:2px 0 6px}section{border-top:1px solid #e4e4e4;padding:10px 0 6px}"
    ".ck-answer{background:#f7f9fc;border:1px solid #dfe6ef;border-radius:6px;padding:8px 12px;font-size:14px}"
    "table{border-collapse:collapse;font-variant-numeric:tabular-nums}td,th{border-bottom:1px solid #eee;"
    "padding:1px 8px;text-align:right;white-space:nowrap}th{background:#eef1f5}td.l,th.l{text-align:left}"
    "tr.ck-phase td{background:#fff4d6}svg text{font-family:inherit}"
)


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _f(x: float) -> str:
    text = f"{x:.1f}"
    return text[:-2] if text.endswith(".0") else text


def _nice_ticks(low: float, high: float, n: int = 5) -> list[float]:
    if not math.isfinite(low) or not math.isfinite(high) or high <= low:
        return [low]
    raw = (high - low) / n
    magnitude = 10 ** math.floor(math.log10(raw))
    step = min((m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw), default=raw)
    first = math.ceil(low / step) * step
    return [round(first + i * step, 10) for i in range(int((high - first) / step + 1e-9) + 1)]


def _fmt(value: float) -> str:
    return f"{value:g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.1e}"


class _Axes:
    """Maps data to SVG coordinates (x: step, linear or log of 1 + step)."""

    def __init__(self, xs: Sequence[float], ys: Sequence[float], *, log_x: bool, y_floor: float | None = None):
        self.log_x = log_x
        tx = [self.tx(x) for x in xs]
        self.x0, self.x1 = min(tx), max(tx)
        if self.x1 == self.x0:
            self.x1 = self.x0 + 1
        finite = [y for y in ys if y is not None and math.isfinite(y)] or [0.0, 1.0]
        low, high = min(finite), max(finite)
        if y_floor is not None:
            low = min(low, y_floor)
        pad = (high - low) * 0.05 or 0.5
        self.y0, self.y1 = low - pad, high + pad
        left, right, top, bottom = MARGIN
        self.left, self.right, self.top, self.bottom = left, WIDTH - right, top, HEIGHT - bottom

    def tx(self, x: float) -> float:
        return math.log10(1 + x) if self.log_x else x

    def px(self, x: float) -> float:
        return self.left + (self.tx(x) - self.x0) / (self.x1 - self.x0) * (self.right - self.left)

    def py(self, y: float) -> float:
        return self.bottom - (y - self.y0) / (self.y1 - self.y0) * (self.bottom - self.top)

    def frame(self, x_label: str, y_label: str, steps: Sequence[int]) -> list[str]:
        parts = [f'<rect x="{self.left}" y="{self.top}" width="{self.right - self.left}" '
                 f'height="{self.bottom - self.top}" fill="none" stroke="#bbb"/>']
        for y in _nice_ticks(self.y0, self.y1):
            py = self.py(y)
            parts.append(f'<line x1="{self.left}" x2="{self.right}" y1="{_f(py)}" y2="{_f(py)}" stroke="#eee"/>'
                         f'<text x="{self.left - 5}" y="{_f(py + 4)}" text-anchor="end" font-size="10">'
                         f"{_fmt(y)}</text>")
        if self.log_x:
            ticks = [s for s in (0, 1, 10, 100, 1000, 10_000, 100_000, 1_000_000)
                     if self.x0 <= self.tx(s) <= self.x1]
        else:
            ticks = _nice_ticks(self.x0, self.x1, 8)
        for x in ticks:
            px = self.px(x)
            parts.append(f'<line x1="{_f(px)}" x2="{_f(px)}" y1="{self.bottom}" y2="{self.bottom + 4}" stroke="#888"/>'
                         f'<text x="{_f(px)}" y="{self.bottom + 15}" text-anchor="middle" font-size="10">'
                         f"{_fmt(x)}</text>")
        mid_y = (self.top + self.bottom) / 2
        parts.append(f'<text x="{(self.left + self.right) / 2}" y="{HEIGHT - 6}" text-anchor="middle" '
                     f'font-size="11">{_esc(x_label)}</text>'
                     f'<text transform="translate(13 {_f(mid_y)}) rotate(-90)" text-anchor="middle" font-size="11">'
                     f"{_esc(y_label)}</text>")
        return parts


def line_chart(
    series: Sequence[dict[str, Any]], *, x_label: str, y_label: str, log_x: bool = False,
    band: Sequence[float] | None = None, band_label: str = "", hline: float | None = None, y_floor: float | None = None,
) -> str:
    """An SVG line chart. Each series: ``{"name", "xs", "ys", "colour", "width", "opacity", "legend"}`` (ys may
    hold None: a gap). ``band``: an x interval shaded (the phase change); ``hline``: a dashed threshold."""
    xs = [x for s in series for x in s["xs"]]
    ys = [y for s in series for y in s["ys"]] + ([hline] if hline is not None else [])
    axes = _Axes(xs or [0, 1], ys, log_x=log_x, y_floor=y_floor)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
             f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{_esc(y_label)} against {_esc(x_label)}">']
    if band is not None:
        a, b = axes.px(band[0]), axes.px(band[1])
        parts.append(f'<rect x="{_f(a)}" y="{axes.top}" width="{_f(max(b - a, 2))}" height="{axes.bottom - axes.top}"'
                     f' fill="{PHASE_FILL}"><title>{_esc(band_label)}</title></rect>'
                     f'<text x="{_f((a + b) / 2)}" y="{axes.top + 12}" text-anchor="middle" font-size="10" '
                     f'fill="#8a6d1d">{_esc(band_label)}</text>')
    parts += axes.frame(x_label, y_label, [int(x) for x in xs])
    if hline is not None:
        py = axes.py(hline)
        parts.append(f'<line x1="{axes.left}" x2="{axes.right}" y1="{_f(py)}" y2="{_f(py)}" stroke="#555" '
                     f'stroke-dasharray="5 4"><title>threshold {hline:g}</title></line>')
    legend_y = axes.top + 4
    ordered = sorted(series, key=lambda s: s.get("legend", False))  # highlighted lines drawn last, on top
    for s in ordered:
        points, path = [], []
        for x, y in zip(s["xs"], s["ys"], strict=True):
            if y is None or not math.isfinite(y):
                if points:
                    path.append(points)
                points = []
                continue
            points.append(f"{_f(axes.px(x))},{_f(axes.py(y))}")
        if points:
            path.append(points)
        colour, width, opacity = s.get("colour", "#333"), s.get("width", 1.8), s.get("opacity", 1.0)
        for run in path:
            parts.append(f'<polyline points="{" ".join(run)}" fill="none" stroke="{colour}" stroke-width="{width}" '
                         f'stroke-opacity="{opacity}"><title>{_esc(s["name"])}</title></polyline>')
            if s.get("legend") and len(run) <= 60:
                for point in run:
                    x, y = point.split(",")
                    parts.append(f'<circle cx="{x}" cy="{y}" r="2.4" fill="{colour}"/>')
        if s.get("legend"):
            parts.append(f'<line x1="{axes.right + 12}" x2="{axes.right + 32}" y1="{legend_y}" y2="{legend_y}" '
                         f'stroke="{colour}" stroke-width="2.5"/><text x="{axes.right + 37}" y="{legend_y + 4}" '
                         f'font-size="11">{_esc(s["name"])}</text>')
            legend_y += 16
    if any(not s.get("legend") for s in series):
        parts.append(f'<line x1="{axes.right + 12}" x2="{axes.right + 32}" y1="{legend_y}" y2="{legend_y}" '
                     f'stroke="{FAINT}" stroke-width="2"/><text x="{axes.right + 37}" y="{legend_y + 4}" '
                     'font-size="11">other heads</text>')
    parts.append("</svg>")
    return "".join(parts)


def _log_x(steps: Sequence[int]) -> bool:
    positive = [s for s in steps if s > 0]
    return bool(positive) and max(positive) / min(positive) > LOG_X_RATIO


def _band(change: dict[str, Any]) -> tuple[list[float] | None, str]:
    if change["step"] is None:
        return None, ""
    return change["interval"], f"phase change (step {change['step']})"


def head_chart(track: Track, score: str, highlight: Sequence[str], *, hline: float | None) -> str:
    """Every head's ``score`` against the step; ``highlight`` in colour, the others faint."""
    return _heads_chart(track, track.scores(score), highlight, y_label=f"{score.replace('_', '-')} score",
                        hline=hline, y_floor=0.0, band=_band(track.phase_change))


def _heads_chart(track: Track, values: Any, highlight: Sequence[str], *, y_label: str, hline: float | None,
                 y_floor: float | None, band: tuple[list[float] | None, str]) -> str:
    """``values`` ``[checkpoint, layer, head]`` of every head against the step; ``highlight`` in colour."""
    steps = track.steps
    series = []
    n_layers, n_heads = values.shape[1:]
    colours = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(highlight)}
    for layer in range(n_layers):
        for head in range(n_heads):
            name = f"{layer}.{head}"
            ys = [None if v != v else float(v) for v in values[:, layer, head].tolist()]
            chosen = name in colours
            series.append({"name": f"head {name}", "xs": steps, "ys": ys, "legend": chosen,
                           "colour": colours.get(name, FAINT), "width": 2.2 if chosen else 1.0,
                           "opacity": 1.0 if chosen else 0.7})
    return line_chart(series, x_label="training step", y_label=y_label, log_x=_log_x(steps), band=band[0],
                      band_label=band[1], hline=hline, y_floor=y_floor)


def _task_band(track: Track) -> tuple[list[float] | None, str]:
    change = track.phase_change.get("task") or {}
    if change.get("step") is None:
        return None, ""
    return change["interval"], f"task gap rises most (step {change['step']})"


def top_task_heads(track: Track, k: int = TOP_TASK_HEADS) -> list[str]:
    """The ``k`` heads of largest absolute EAP-IG node score for the task at the last checkpoint."""
    last = track.task_scores("scores")[-1].abs().nan_to_num(-1.0).flatten()
    n_heads = track.model["n_heads"]
    order = sorted(range(last.numel()), key=lambda i: (-float(last[i]), i))[:k]
    return [f"{i // n_heads}.{i % n_heads}" for i in order if float(last[i]) >= 0]


def _task_sections(track: Track) -> list[str]:
    """The task's figures along the run (a track measured with a task)."""
    steps, log_x, band = track.steps, _log_x(track.steps), _task_band(track)
    units = track.checkpoints[-1]["task"]["units"]
    setting = track.task
    metric = line_chart(
        [{"name": "clean", "xs": steps, "ys": track.task_values("clean"), "colour": "#2e9d5b", "legend": True},
         {"name": "corrupted", "xs": steps, "ys": track.task_values("corrupted"), "colour": "#d9822b",
          "legend": True},
         {"name": "gap", "xs": steps, "ys": track.task_values("gap"), "colour": "#2e6db4", "width": 2.6,
          "legend": True}],
        x_label="training step", y_label=f"{setting['metric']} ({units})", log_x=log_x, band=band[0],
        band_label=band[1])
    faithful = line_chart(
        [{"name": "discovery pairs", "xs": steps, "ys": track.task_values("faithfulness"), "colour": "#2e6db4",
          "legend": True},
         {"name": "held-out pairs", "xs": steps, "ys": track.task_values("evaluation"), "colour": "#c0392b",
          "legend": True}],
        x_label="training step", y_label="node circuit faithfulness", log_x=log_x, band=band[0],
        band_label=band[1], hline=setting["target"])
    heads = _heads_chart(track, track.task_scores("scores"), top_task_heads(track),
                         y_label="EAP-IG node score", hline=None, y_floor=None, band=band)
    name = setting["name"]
    return [
        _section("task", f"Task {name!r}: metric along the run", f"Mean {setting['metric']} over the task's "
                 f"{setting['pairs']} pairs on the clean and corrupted prompts, and their gap (clean minus "
                 "corrupted); shaded: the interval where the gap rises most.", metric),
        _section("task_circuit", "Task: node circuit faithfulness", f"The smallest top-ranked head set reaching "
                 f"faithfulness {setting['target']} on the discovery pairs (dashed), and the same heads' faithfulness "
                 "on the held-out pairs; a gap in a line: no circuit at that checkpoint (the corrupted prompts do "
                 "not change the metric).", faithful),
        _section("task_heads", "Task: EAP-IG node score of every head", f"Coloured: the {TOP_TASK_HEADS} heads of "
                 "largest absolute score at the last checkpoint; grey: the rest. EAP-IG = edge attribution patching "
                 "with integrated gradients, each head's first-order share of the gap.", heads),
    ]


def _role_section(track: Track, role: Role) -> str:
    """A role's score of every head against the step, its called heads coloured (:func:`_highlight`)."""
    title = f"{role.score.replace('_', '-').capitalize()} score of every head"
    note = f"Coloured: the heads called {role.group} at the last checkpoint"
    if role.score == PHASE_SCORE:  # the first chart says what the highlight and the dashed line mean for all
        note += f" or at the phase change; grey: the rest; dashed: the calling threshold {HEAD_CALL_THRESHOLD}."
    else:
        note += "; grey: the rest."
    return _section(role.score, title, note, head_chart(track, role.score, _highlight(track, role.score),
                                                         hline=HEAD_CALL_THRESHOLD))


def _highlight(track: Track, score: str) -> list[str]:
    change = track.phase_change
    names = list(change["formation"].get(score, {}))
    if score == PHASE_SCORE:
        names += [h for h in change["heads"] if h not in names]
    return sorted(names, key=lambda n: tuple(int(p) for p in n.split(".")))


def _loss_checkpoints(track: Track) -> list[int]:
    """Indices of the checkpoints whose per-position loss is drawn: first, around the phase change, last."""
    n = len(track.checkpoints)
    chosen = [0, n - 1]
    change = track.phase_change
    if change["step"] is not None:
        end = track.steps.index(change["step"])
        chosen += [end - 1, end]
    unique = sorted(set(chosen))
    return unique[:MAX_LOSS_CURVES]


def sentences(track: Track) -> list[str]:
    """The summary in words (plain text)."""
    change = track.phase_change
    n = len(track.checkpoints)
    lines = [f"{n} checkpoint{'s' if n != 1 else ''}, steps {track.steps[0]} to {track.steps[-1]}; in-context "
             f"learning score (first-copy loss minus repeated-copies loss) from {track.icl_scores[0]:.3f} to "
             f"{track.icl_scores[-1]:.3f} nats per token."]
    if change["step"] is None:
        lines.append(f"No phase change located: {change['reason']}.")
    else:
        a, b = change["interval"]
        lines.append(f"Phase change at step {change['step']}: the score rises most between steps {a} and {b} "
                     f"(+{change['rise']:.3f} nats, {100 * change['share']:.0f}% of its total rise of "
                     f"{change['total_rise']:.3f}).")
        if change["heads"]:
            lines.append(f"Induction heads forming with it (their induction score crosses the threshold there): "
                         f"{', '.join(change['heads'])}.")
    formed = change["formation"]
    for score, what in (("previous_token", "Previous-token heads"), ("induction", "Induction heads")):
        heads = formed.get(score, {})
        if heads:
            text = ", ".join(f"{name} (rising from step {w['rise_at']}, called from step {w['called_at']})"
                             for name, w in heads.items())
            lines.append(f"{what} at the last checkpoint: {text}.")
    if change["order"]:
        lines.append(f"Order of formation (earliest rise, a fifth of the way to the final score): {change['order']}.")
    if track.task is not None:
        lines += task_sentences(track)
    return lines


def task_sentences(track: Track) -> list[str]:
    """The task's figures in words (a track measured with a task)."""
    setting, change = track.task, track.phase_change.get("task") or {}
    gaps = track.task_values("gap")
    last = track.checkpoints[-1]["task"]
    lines = [f"Task {setting['name']!r} ({setting['pairs']} pairs, metric {setting['metric']}, {last['units']}): "
             f"the gap between clean and corrupted goes from {gaps[0]:+.3f} to {gaps[-1]:+.3f}."]
    if change.get("step") is not None:
        a, b = change["interval"]
        lines.append(f"The task's gap rises most between steps {a} and {b} ({change['rise']:+.3f}, "
                     f"{100 * change['share']:.0f}% of its total rise).")
    elif change.get("reason"):
        lines.append(f"No change of the task's gap located: {change['reason']}.")
    circuit = last["circuit"]
    if circuit is None:
        lines.append(f"No node circuit at the last checkpoint: {last['circuit_error']}")
    else:
        held = circuit["evaluation"]
        held_text = ("" if held is None or held["faithfulness"] is None else
                     f"; on the {held['pairs']} held-out pairs {held['faithfulness']:.3f}")
        lines.append(f"Node circuit at the last checkpoint: {circuit['size']} of {circuit['n_nodes']} nodes reach "
                     f"faithfulness {circuit['faithfulness']:.3f} on the discovery pairs (target {setting['target']})"
                     f"{held_text}; heads {', '.join(circuit['heads'][:12])}"
                     f"{' ...' if len(circuit['heads']) > 12 else ''}.")
    if change.get("circuit_from") is not None:
        lines.append(f"From step {change['circuit_from']} on, every checkpoint shows the behaviour (a gap of at least "
                     f"{change['min_gap']}) and a node circuit of it.")
    return lines


def task_table(track: Track) -> list[str]:
    """The task's figures per checkpoint as fixed-width text rows (the terminal's table), header first, a line saying
    what the columns are last."""
    rows = [("step", "clean", "corrupted", "gap", "circuit", "faithful", "held-out", "top head")]
    n_heads = track.model["n_heads"]
    for r in track.checkpoints:
        entry, circuit = r["task"], r["task"]["circuit"]
        flat = [abs(v) if v is not None else -1.0 for row in entry["scores"] for v in row]
        best = max(range(len(flat)), key=lambda i: (flat[i], -i))
        held = None if circuit is None or circuit["evaluation"] is None else circuit["evaluation"]["faithfulness"]
        rows.append((str(r["step"]), f"{entry['clean']:+.3f}", f"{entry['corrupted']:+.3f}", f"{entry['gap']:+.3f}",
                     "-" if circuit is None else f"{circuit['size']}/{circuit['n_nodes']}",
                     "-" if circuit is None else f"{circuit['faithfulness']:.3f}",
                     "-" if held is None else f"{held:.3f}", f"{best // n_heads}.{best % n_heads}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    legend = (f"(mean {track.task['metric']}; circuit: node circuit size / nodes at faithfulness "
              f"{track.task['target']} on the discovery pairs; faithful: its faithfulness there; held-out: the same "
              "heads on the held-out pairs; top head: largest |EAP-IG node score|)")
    return ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows] + [legend]


def _table(track: Track) -> str:
    phase = track.phase_change["step"]
    rows = []
    for r in track.checkpoints:
        cls = ' class="ck-phase"' if r["step"] == phase else ""
        rows.append(f"<tr{cls}><td>{r['step']}</td><td class=\"l\">{_esc(r['label'])}</td>"
                    f"<td>{r['icl_score']:.3f}</td><td>{r['first_copy_loss']:.3f}</td><td>{r['repeated_loss']:.3f}</td>"
                    + "".join(f"<td class=\"l\">{_esc(', '.join(r['called'].get(role.score, [])))}</td>"
                              for role in DEFAULT_ROLES) + _task_cells(r) + "</tr>")
    called = "".join(f"<th class=\"l\">{_esc(role.group)}</th>" for role in DEFAULT_ROLES)
    task = ("<th>task gap</th><th>circuit size</th><th>faithfulness</th><th>held-out</th>"
            if track.task is not None else "")
    return ("<table><thead><tr><th>step</th><th class=\"l\">label</th><th>ICL score</th><th>first-copy loss</th>"
            f"<th>repeated loss</th>{called}{task}</tr></thead><tbody>" + "".join(rows) + "</tbody></table>")


def _task_cells(record: dict[str, Any]) -> str:
    if "task" not in record:
        return ""
    entry, circuit = record["task"], record["task"]["circuit"]
    held = None if circuit is None or circuit["evaluation"] is None else circuit["evaluation"]["faithfulness"]
    cells = [f"{entry['gap']:+.3f}", "" if circuit is None else f"{circuit['size']} of {circuit['n_nodes']}",
             "" if circuit is None else f"{circuit['faithfulness']:.3f}", "" if held is None else f"{held:.3f}"]
    return "".join(f"<td>{c}</td>" for c in cells)


def _section(key: str, title: str, note: str, body: str) -> str:
    return (f'<section id="ck-sec-{key}" data-png="{key}"><h2>{_esc(title)}</h2><p class="note">{_esc(note)}</p>'
            f"{body}</section>")


def build_track_report(track: Track) -> str:
    """The report of ``track`` as one HTML string (see the module docstring)."""
    from circuitkit import __version__

    steps, change = track.steps, track.phase_change
    band, band_label = _band(change)
    log_x = _log_x(steps)
    icl = line_chart([{"name": "ICL score", "xs": steps, "ys": track.icl_scores, "colour": "#2e6db4",
                       "legend": True}], x_label="training step", y_label="ICL score (nats)", log_x=log_x,
                     band=band, band_label=band_label)
    losses = line_chart(
        [{"name": "first copy", "xs": steps, "ys": [r["first_copy_loss"] for r in track.checkpoints],
          "colour": "#d9822b", "legend": True},
         {"name": "repeated copies", "xs": steps, "ys": [r["repeated_loss"] for r in track.checkpoints],
          "colour": "#2e9d5b", "legend": True}],
        x_label="training step", y_label="loss (nats per token)", log_x=log_x, band=band, band_label=band_label,
        y_floor=0.0)
    per_position = line_chart(
        [{"name": f"step {track.steps[i]}", "xs": list(range(1, len(track.checkpoints[i]["loss_per_position"]) + 1)),
          "ys": track.checkpoints[i]["loss_per_position"], "colour": PALETTE[k], "legend": True}
         for k, i in enumerate(_loss_checkpoints(track))],
        x_label="position of the predicted token", y_label="loss (nats)", y_floor=0.0)
    body = [
        _section("summary", "Summary", "Definitions: in-context learning (ICL) score = mean loss on the first copy of "
                 "a repeated random block minus the mean loss on its repeats; the phase change is the checkpoint "
                 "interval with the largest rise of that score.",
                 '<div class="ck-answer">' + "".join(f"<p>{_esc(s)}</p>" for s in sentences(track)) + "</div>"),
        _section("icl", "In-context learning score", "Shaded: the phase-change interval.", icl),
        _section("losses", "First-copy and repeated-copies loss", "The repeated copies become predictable in "
                 "context; the first copy cannot.", losses),
        *(_role_section(track, role) for role in DEFAULT_ROLES),
        *(_task_sections(track) if track.task is not None else ()),
        _section("loss_per_position", "Loss per position", "At the first and last checkpoints and either side of the "
                 "phase change; the random block repeats, so the loss drops after its first copy once the model "
                 "learns in context.", per_position),
        _section("checkpoints", "Checkpoints", "Highlighted: the phase-change step.", _table(track)),
    ]
    model = track.model
    subtitle = (f"{model.get('n_layers')} layers x {model.get('n_heads')} heads, d_model {model.get('d_model')}, "
                f"vocabulary {model.get('d_vocab')}; {len(track.checkpoints)} checkpoints"
                + ("" if track.complete else " (incomplete: the track was interrupted)"))
    return ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><meta name="viewport" '
            'content="width=device-width, initial-scale=1"><title>circuitkit training track</title>'
            f"<style>{STYLE}</style></head><body>\n<h1>circuitkit training track</h1><p class=\"note\">"
            f"{_esc(subtitle)}</p>\n" + "\n".join(body)
            + f'\n<p class="note">circuitkit {_esc(__version__)}</p>\n</body></html>\n')


def summary_html(track: Track) -> str:
    """Notebook view: the sentences and the ICL-score chart (no script)."""
    change = track.phase_change
    band, label = _band(change)
    chart = line_chart([{"name": "ICL score", "xs": track.steps, "ys": track.icl_scores, "colour": "#2e6db4",
                         "legend": True}], x_label="training step", y_label="ICL score (nats)",
                       log_x=_log_x(track.steps), band=band, band_label=label)
    return ('<div style="font-family:system-ui,sans-serif;font-size:13px;max-width:900px">'
            + "".join(f"<p>{_esc(s)}</p>" for s in sentences(track)) + chart + "</div>")


def export_track_pngs(report: str | os.PathLike, out_dir: str | os.PathLike, *, scale: float = 2.0) -> list[Path]:
    """Each section of a written track report as ``out_dir/<section>.png`` (headless Chromium, network blocked);
    the paths written."""
    from circuitkit.report.png import offline_page

    written: list[Path] = []
    with offline_page(report, out_dir, caller="export_track_pngs", scale=scale,
                      written_by="Track.save()") as (page, out):
        for key in page.evaluate("Array.from(document.querySelectorAll('[data-png]'), e => e.dataset.png)"):
            path = out / f"{key}.png"
            page.locator(f"#ck-sec-{key}").screenshot(path=str(path))
            written.append(path)
    return written


__all__ = ["build_track_report", "export_track_pngs", "line_chart", "sentences", "summary_html", "task_sentences",
           "task_table", "top_task_heads"]
