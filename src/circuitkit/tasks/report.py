"""A task scan's ``report.html``: one self-contained page (opens offline) that puts the answer first.

Sections: the answer; the task (metric on clean and corrupted prompts, a few pairs); the node circuit's
faithfulness curve and the edge circuit's (MIB sizes, CPR / CMD); the circuit's heads with their EAP-IG score,
direct logit attribution and the task's own head scores; the strongest edges with their exact effects; the
circuit heads' attention on the first clean prompt (CircuitsVis, its JavaScript inlined).
"""

from __future__ import annotations

from typing import Any

from circuitkit._html import escape
from circuitkit.errors import CircuitkitError
from circuitkit.ranking import head_name

STYLE = """
body{font:15px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1100px;padding:16px;color:#1d2330}
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #dde;padding-bottom:4px}
.answer{background:#f3f6fb;border-left:4px solid #3465a4;padding:10px 14px;white-space:pre-wrap}
table{border-collapse:collapse;margin:8px 0}td,th{padding:3px 10px;border-bottom:1px solid #eee;text-align:right}
th{background:#f6f6f8}td.l,th.l{text-align:left}.figs{display:flex;flex-wrap:wrap;gap:18px}
.figs figure{margin:0}figcaption{font-size:13px;color:#555;max-width:320px}code{font-size:13px}
.scroll{overflow-x:auto;max-width:100%}
"""


def _curve_svg(points: list[tuple[int, float]], target: float, chosen: int, total: int, unit: str = "heads") -> str:
    from circuitkit.report.figures import faithfulness_curve

    return faithfulness_curve(points, target, chosen, total, unit=unit)


def task_report(result: Any) -> str:
    """The page for a :class:`~circuitkit.tasks.TaskScan`."""
    task, c, model = result.task, result.circuit, result.model
    parts = [f"<!doctype html><html lang=en><head><meta charset=utf-8><meta name=viewport "
             f"content='width=device-width,initial-scale=1'><title>circuitkit: {escape(task.name)} on "
             f"{escape(model.name)}</title><style>{STYLE}</style></head><body>",
             f"<h1>The {escape(task.name)} circuit of {escape(model.name)}</h1>",
             f"<div class=answer>{escape(result.answer())}</div>"]
    parts.append("<h2>The task</h2><p>" + escape(task.description or "") + "</p>")
    parts.append("<div class=scroll><table><tr><th class=l>pair</th><th class=l>clean</th><th class=l>corrupted</th>"
                 "<th class=l>answer</th><th class=l>wrong</th><th>metric clean</th><th>corrupted</th></tr>")
    for i, pair in enumerate(task.pairs[:5]):
        parts.append(f"<tr><td>{i}</td><td class=l><code>{escape(_text(pair.clean))}</code></td>"
                     f"<td class=l><code>{escape(_text(pair.corrupted))}</code></td>"
                     f"<td class=l><code>{escape(_text(pair.answers))}</code></td>"
                     f"<td class=l><code>{escape(_text(pair.wrongs))}</code></td>"
                     f"<td>{float(result.clean[i]):+.3f}</td><td>{float(result.corrupted[i]):+.3f}</td></tr>")
    parts.append("</table></div>")
    if c is not None:
        node_points = [(p.size, p.faithfulness) for p in c.curve]
        edge_points = [(p.size, p.faithfulness) for p in c.edge_curve]
        parts.append("<h2>Faithfulness</h2><div class=figs>")
        parts.append(f"<figure>{_curve_svg(node_points, c.target, len(c.heads) + len(c.mlps), c.n_nodes_total)}"
                     f"<figcaption>Node circuit: the top-n nodes by EAP-IG score kept, every other node patched from "
                     f"the corrupted prompt (every point measured).</figcaption></figure>")
        other = c.other_set
        if other and other.get("curve"):
            points = [(p["size"], p["faithfulness"]) for p in other["curve"]]
            parts.append(f"<figure>{_curve_svg(points, c.target, len(c.heads) + len(c.mlps), c.n_nodes_total)}"
                         f"<figcaption>The same node sets on the {other['pairs']} {escape(other['set'])} pairs the "
                         f"search did not use: faithfulness {other['faithfulness']:.3f} at the circuit's size (every "
                         "point measured).</figcaption></figure>")
        if edge_points:
            parts.append(f"<figure>{_curve_svg(edge_points, c.target, len(c.edges), c.n_edges_total, 'edges')}"
                         f"<figcaption>Edge circuit at MIB's sizes (0.1% to 100% of {c.n_edges_total} edges), "
                         f"edges ranked by {c.rank} score. MIB's CPR {c.cpr:.3f} (the area under this curve with "
                         f"edges ranked by signed score), CMD {c.cmd:.3f} (the area between 1 and it with edges "
                         "ranked by absolute score).</figcaption></figure>")
        parts.append("</div>")
        extra = list(result.head_scores) + [n for n in result.pattern_scores if n not in result.head_scores]
        labels = {n: _short(n) for n in extra}
        values = {**result.pattern_scores, **result.head_scores}
        parts.append("<h2>The circuit's heads</h2><div class=scroll><table><tr><th class=l>head</th><th>EAP-IG "
                     "score</th><th>direct logit attribution</th>"
                     + "".join(f"<th title='{escape(n)}'>{escape(labels[n])}</th>" for n in extra) + "</tr>")
        for layer, head in c.heads:
            dla = "" if result.dla is None else f"{float(result.dla[layer, head]):+.3f}"
            cells = "".join(f"<td>{float(values[n][layer, head]):+.3f}</td>" for n in extra)
            parts.append(f"<tr><td class=l>{head_name((layer, head))}</td>"
                         f"<td>{float(result.scores[layer, head]):+.3f}</td><td>{dla}</td>{cells}</tr>")
        parts.append("</table></div>")
        if c.edge_effects:
            parts.append("<h2>The strongest edges</h2><table><tr><th class=l>edge</th><th>EAP-IG score</th>"
                         "<th>exact effect (path patched)</th></tr>")
            for e in c.edge_effects:
                parts.append(f"<tr><td class=l>{escape(e.name)}</td><td>{e.score:+.3f}</td>"
                             f"<td>{e.effect:+.3f}</td></tr>")
            parts.append("</table>")
        if c.heads:
            parts.append(_patterns(result, c.heads[:MAX_PATTERN_HEADS]))
    parts.append("</body></html>\n")
    return "".join(parts)


def _short(score: str) -> str:
    """A registered score's short column name (``prev`` for ``previous_token``), else the name itself."""
    from circuitkit.detect import registry

    try:
        return registry.get(score).short
    except CircuitkitError:  # a task's own score is not registered
        return score


MAX_PATTERN_HEADS = 16
"""Circuit heads whose attention the report draws (the first in layer order)."""


def _patterns(result: Any, heads: Any) -> str:
    from circuitkit.viz.attention import attention_heads

    view = attention_heads({h: result.patterns[h[0], h[1]] for h in heads}, list(result.tokens))
    return (f"<h2>Attention of the circuit's heads on the first clean prompt</h2><div>{view.local_src}</div>")


def _text(value: Any) -> str:
    if isinstance(value, tuple) and all(isinstance(v, str) for v in value):
        return " | ".join(value)
    return str(list(value)) if isinstance(value, tuple) else str(value)


__all__ = ["task_report"]
