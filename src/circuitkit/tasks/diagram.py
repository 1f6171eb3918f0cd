"""A task circuit drawn as a static SVG: nodes of every type (the input embeddings, attention heads, MLPs, key-value
groups, the logits) in model order, the edge circuit's edges between them.

Why its own drawing: the induction report's graphs (:func:`circuitkit.report.figures.head_graph`) place heads only,
at ``(layer, head)``; a task circuit's edges also leave the input and MLPs and enter MLPs and the logits. Ranks
are the positions in model order (input, then per layer its heads and its MLP, then the logits); only the ranks
that hold a node are drawn (a circuit in layers 0-2 of a 24-layer model fills the width). Where the ranks fit
:data:`WIDTH` side by side they are columns, input on the left and nodes stacked in each; a circuit over more
(a head and an MLP in many layers: 31 ranks for Qwen2.5-0.5B's IOI circuit) is drawn top to bottom instead, the
logits on top and the input at the bottom, each rank a row of nodes: the page then scrolls the way it always does,
and opens at the output, where a task's answer is written (that circuit: 900 x 1,478 px, where side by side it was
2,054 px wide, scrolled sideways and opened at the embeddings). Every head node carries ``data-head="layer.head"`` (a
click selects the head on the page); an edge is coloured by the input it enters (query, key, value; grey: an MLP or
the logits) and is thicker where its exact effect was measured (:attr:`TaskCircuit.edge_effects`). The output is a
pure function of the circuit (coordinates rounded to 0.1 px), all text escaped.
"""

from __future__ import annotations

import re
from typing import Any

from circuitkit._html import escape

WIDTH = 900
"""The drawing's width where its ranks fit in it as columns; a circuit over more ranks (one for each layer's heads and
one for its MLP: up to 50 on a 24-layer model) is drawn top to bottom (module docstring)."""
NODE_W, NODE_H, ROW_H = 58, 24, 32
COLUMN_GAP = NODE_W + 8
RANK_GAP = 46
"""Distance between the rows of a circuit drawn top to bottom: a node's height and room for the edges' bends."""
MAX_EDGES = 60
"""Edges drawn (the first in the circuit's ranking); the rest are counted in the caption."""
MAX_ROWS = 16
"""Nodes drawn per column; the rest are counted under it."""
CHANNEL_COLOURS = {"q": "#3b6fb6", "k": "#2e9d5b", "v": "#d9822b", "": "#7a7f87"}
FILLS = {"circuit": "#cfe0f5", "head": "#ffffff", "mlp": "#eceff3", "end": "#dfe3e8"}
RECEIVER = re.compile(r"^(\d+)\.(g?)(\d+):([qkv])$")


def _f(x: float) -> str:
    text = f"{x:.1f}"
    return text[:-2] if text.endswith(".0") else text


def _node_of(text: str, n_layers: int) -> tuple[float, str, str]:
    """``(position in model order, node name, input channel)`` of an edge end (``"1.2:q"`` -> ``(1, "1.2", "q")``;
    MLP ``mN`` at ``N + 0.5``; input -1; logits ``n_layers``)."""
    if text == "input":
        return -1.0, "input", ""
    if text == "logits":
        return float(n_layers), "logits", ""
    if text.startswith("m"):
        return int(text[1:]) + 0.5, text, ""
    match = RECEIVER.match(text)
    if match:
        return float(match.group(1)), f"{match.group(1)}.{match.group(2)}{match.group(3)}", match.group(4)
    return float(text.split(".")[0]), text, ""


def circuit_diagram(scan: Any) -> str:
    """The circuit of ``scan`` (a :class:`~circuitkit.tasks.TaskScan` with a circuit) as an SVG string."""
    c, model = scan.circuit, scan.model
    L = model.n_layers
    members = {f"{a}.{b}" for a, b in c.heads} | {f"m{m}" for m in c.mlps}
    effects = {e.name: e for e in c.edge_effects}
    shown = list(c.edges[:MAX_EDGES])
    nodes: dict[str, float] = {name: float(name.split(".")[0]) if not name.startswith("m") else int(name[1:]) + 0.5
                               for name in members}
    edges = []
    for name in shown:
        sender, receiver = name.split("->")
        (sx, sname, _), (rx, rname, channel) = _node_of(sender, L), _node_of(receiver, L)
        nodes.setdefault(sname, sx)
        nodes.setdefault(rname, rx)
        edges.append((sname, rname, channel, name))
    if edges:
        nodes.setdefault("logits", float(L))
    columns = sorted(set(nodes.values()))
    stacks: dict[float, list[str]] = {x: sorted((n for n, p in nodes.items() if p == x), key=_order) for x in columns}
    rows = max((min(len(s), MAX_ROWS) for s in stacks.values()), default=1)
    top, bottom, margin = 44 if edges else 8, 30, 8 + NODE_W / 2
    down = len(columns) > 1 and 2 * margin + (len(columns) - 1) * COLUMN_GAP > WIDTH
    where: dict[str, tuple[float, float]] = {}
    if down:  # one row per rank, the logits on top
        more = 70 if any(len(stack) > MAX_ROWS for stack in stacks.values()) else 0  # room for "+n more"
        width = max(WIDTH, round(2 * (margin + more) + (rows - 1) * COLUMN_GAP))
        height = top + NODE_H / 2 + (len(columns) - 1) * RANK_GAP + NODE_H / 2 + bottom
        for i, x in enumerate(reversed(columns)):
            stack = stacks[x][:MAX_ROWS]
            x0 = width / 2 - (len(stack) - 1) * COLUMN_GAP / 2
            for j, name in enumerate(stack):
                where[name] = (x0 + j * COLUMN_GAP, top + NODE_H / 2 + i * RANK_GAP)
    else:
        width = WIDTH
        height = top + rows * ROW_H + bottom
        dx = (width - 2 * margin) / max(1, len(columns) - 1)
        for i, x in enumerate(columns):
            stack = stacks[x]
            y0 = top + (rows - min(len(stack), MAX_ROWS)) * ROW_H / 2 + ROW_H / 2
            for j, name in enumerate(stack[:MAX_ROWS]):
                where[name] = (margin + i * dx if len(columns) > 1 else width / 2, y0 + j * ROW_H)
    wide = " ck-wide" if width > WIDTH else ""  # drawn at its size in a box that scrolls, not shrunk to the page
    parts = [f'<div class="ck-scroll-x"><svg class="ck-graph ck-task-circuit{wide}{" ck-down" if down else ""}" '
             f'width="{width}" '
             f'height="{_f(height)}" viewBox="0 0 {width} {_f(height)}" font-family="system-ui, sans-serif" '
             'font-size="11" role="img" aria-label="the circuit: nodes and edges">']
    if edges:
        parts.append(_legend())
    largest = max((abs(e.effect) for e in c.edge_effects), default=0.0) or 1.0
    for sname, rname, channel, name in edges:
        if sname not in where or rname not in where:
            continue
        (x1, y1), (x2, y2) = where[sname], where[rname]
        if down:  # from the sender's top edge up to the receiver's bottom edge
            y1, y2 = y1 - NODE_H / 2, y2 + NODE_H / 2
            ym = (y1 + y2) / 2
            bend = f"{_f(x1)} {_f(ym)} {_f(x2)} {_f(ym)}"
        else:
            x1, x2 = x1 + NODE_W / 2, x2 - NODE_W / 2
            xm = (x1 + x2) / 2
            bend = f"{_f(xm)} {_f(y1)} {_f(xm)} {_f(y2)}"
        effect = effects.get(name)
        stroke = 1.2 if effect is None else 1.5 + 3.5 * abs(effect.effect) / largest
        title = name + ("" if effect is None else f": exact effect {effect.effect:+.3f} (EAP-IG {effect.score:+.3f})")
        parts.append(f'<path d="M{_f(x1)} {_f(y1)}C{bend} {_f(x2)} {_f(y2)}" '
                     f'fill="none" stroke="{CHANNEL_COLOURS[channel]}" stroke-width="{_f(stroke)}" '
                     f'stroke-opacity="0.75"><title>{escape(title)}</title></path>')
    for name, (x, y) in where.items():
        parts.append(_node(name, x, y, name in members, scan))
    for stack in stacks.values():
        if len(stack) > MAX_ROWS:
            last_x, last_y = where[stack[MAX_ROWS - 1]]
            at = (f'x="{_f(last_x + NODE_W / 2 + 4)}" y="{_f(last_y + 4)}"' if down
                  else f'x="{_f(where[stack[0]][0])}" y="{_f(height - 16)}" text-anchor="middle"')
            parts.append(f'<text {at} fill="#555">+{len(stack) - MAX_ROWS} more</text>')
    said = (f"{len(shown)} of {len(c.edges)} edges drawn (the first by EAP-IG rank)" if len(c.edges) > len(shown)
            else f"{len(c.edges)} edges" if c.edges else "edges not measured: the node circuit alone")
    order = "; the logits on top, the input at the bottom" if down else ""
    parts.append(f'<text x="4" y="{_f(height - 4)}" fill="#666">{escape(said)}; filled: in the node circuit{order}'
                 "</text></svg></div>")
    return "".join(parts)


def _order(name: str) -> tuple[int, int, str]:
    """Nodes within a column: heads by index, then groups, then the rest."""
    if "." in name:
        head = name.split(".")[1]
        return (0, int(head), "") if head.isdigit() else (1, int(head[1:]), "")
    return 2, 0, name


def _node(name: str, x: float, y: float, member: bool, scan: Any) -> str:
    kind = "end" if name in ("input", "logits") else "mlp" if name.startswith("m") else "head"
    fill = FILLS["circuit"] if member else FILLS[kind]
    head = kind == "head" and name.split(".")[1].isdigit()
    attrs, tip = "", name
    if head:
        layer, index = (int(v) for v in name.split("."))
        attrs = f' data-head="{name}" tabindex="0"'
        tip = f"head {name}: EAP-IG score {float(scan.scores[layer, index]):+.3f}"
        if scan.dla is not None:
            tip += f", DLA {float(scan.dla[layer, index]):+.3f}"
    elif kind == "mlp" and scan.scores_mlp is not None:
        tip = f"MLP {name[1:]}: EAP-IG score {float(scan.scores_mlp[int(name[1:])]):+.3f}"
    label = {"input": "input", "logits": "logits"}.get(name, name)
    return (f'<g class="ck-node"{attrs}><title>{escape(tip)}{" (in the node circuit)" if member else ""}</title>'
            f'<rect x="{_f(x - NODE_W / 2)}" y="{_f(y - NODE_H / 2)}" width="{NODE_W}" height="{NODE_H}" rx="5" '
            f'fill="{fill}" stroke="{"#2e6db4" if member else "#555"}" stroke-width="{1.6 if member else 1}"/>'
            f'<text x="{_f(x)}" y="{_f(y + 4)}" text-anchor="middle" font-weight="{600 if head else 400}">'
            f"{escape(label)}</text></g>")


def _legend() -> str:
    out, x = [], 8.0
    for text, colour in (("into a query", CHANNEL_COLOURS["q"]), ("into a key", CHANNEL_COLOURS["k"]),
                         ("into a value", CHANNEL_COLOURS["v"]), ("into an MLP or the logits", CHANNEL_COLOURS[""])):
        out.append(f'<line x1="{_f(x)}" y1="12" x2="{_f(x + 20)}" y2="12" stroke="{colour}" stroke-width="3"/>'
                   f'<text x="{_f(x + 25)}" y="16" fill="#333">{escape(text)}</text>')
        x += 34 + 6.2 * len(text)
    out.append(f'<text x="{_f(x)}" y="16" fill="#666">thicker: larger exact effect</text>')
    return "".join(out)


__all__ = ["circuit_diagram"]
