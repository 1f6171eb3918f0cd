"""Report-only figures drawn as static SVG strings: the summary's circuit diagram, head graphs (top composition
edges; circuit evidence coloured by causal effect) and the per-position loss curve.

Why SVG written here rather than plotly figures: these are small (tens of elements), must show before any
script runs (the summary is also the notebook view), and print the same bytes for the same scan. Every node
carries ``data-head="layer.head"``, which the page script turns into a click that selects the head. All text is
escaped; coordinates are rounded to 0.1 px so the output is deterministic and short.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from circuitkit._html import escape as _esc
from circuitkit.ranking import Head, head_name

MODE_COLOURS = {"Q": "#3b6fb6", "K": "#2e9d5b", "V": "#d9822b"}
MAX_NAMED = 4
"""Heads named per role in the summary sentences and the diagram; the rest are counted ("and 3 more")."""
ROLE_SHORT = {"induction": "induction", "previous-token": "prev-token"}
"""Role names as the diagram and the answer write them."""
GRAPH_WIDTH = 900
MAX_LINK_LABELS = 2
"""The diagram writes scores on its links only up to this many (more cross and collide; the sentences and
each link's tooltip carry them)."""
UNMEASURED_COLOUR = "#a0a4a8"
"""Circuit-diagram links with no causal figure in the evidence, where others are coloured by theirs."""
MAX_LABELLED_EDGES = 16
"""Edge graphs print the score next to at most this many edges (more would overlap); all have a tooltip."""


def _f(x: float) -> str:
    text = f"{x:.1f}"
    return text[:-2] if text.endswith(".0") else text


def diverging(t: float) -> str:
    """Colour for ``t`` in ``[-1, 1]``: blue (-1) through white (0) to red (+1), as ``#rrggbb``."""
    t = max(-1.0, min(1.0, 0.0 if math.isnan(t) else t))
    end = (178, 24, 43) if t >= 0 else (33, 102, 172)
    a = abs(t)
    rgb = [round(255 + (c - 255) * a) for c in end]
    return "#" + "".join(f"{c:02x}" for c in rgb)


def _node(x: float, y: float, head: Head, caption: str, colour: str) -> str:
    name = head_name(head)
    return (
        f'<g class="ck-node" data-head="{name}" tabindex="0"><title>head {name}: {_esc(caption)}</title>'
        f'<rect x="{_f(x - 34)}" y="{_f(y - 15)}" width="68" height="30" rx="6" fill="{colour}" stroke="#333"/>'
        f'<text x="{_f(x)}" y="{_f(y - 1)}" text-anchor="middle" font-weight="600">{name}</text>'
        f'<text x="{_f(x)}" y="{_f(y + 11)}" text-anchor="middle" font-size="9">{_esc(caption)}</text></g>'
    )


def circuit_diagram(story: Any) -> str:
    """``story`` (:class:`circuitkit.report.summary.Story`): the feeding role's heads (left; previous-token heads
    with the default roles) -> the fed role's (right; induction heads), each column named by its role, links
    labelled with the composition score (and the causal edge effect where measured), and two bars: loss on the first
    copy vs the repeated copies."""
    previous = [h for h, _ in story.previous][:MAX_NAMED]
    induction = [h for h, _ in story.induction][:MAX_NAMED]
    rows = max(len(previous), len(induction), 1)
    width, x_prev, x_ind, row_h, top = 380, 50, 300, 40, 24
    has_heads = bool(previous or induction)
    height_heads = top + rows * row_h + 14 if has_heads else 0
    bars = story.first_copy is not None and story.repeated_copies is not None
    height = max(24, height_heads + (58 if bars else 0) + 4)
    parts = [
        f'<svg class="ck-diagram" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="system-ui, sans-serif" font-size="11" role="img" '
        'aria-label="circuit diagram">'
    ]
    if has_heads:
        feeder = story.feeder.name if getattr(story, "feeder", None) is not None else ""
        fed = story.fed.name if getattr(story, "fed", None) is not None else "induction"
        parts.append(f'<text x="{x_prev}" y="12" text-anchor="middle" fill="#555">{_esc(feeder)}</text>'
                     f'<text x="{x_ind}" y="12" text-anchor="middle" fill="#555">{_esc(fed)}</text>')
    ys_prev = {h: top + row_h * (i + 0.5) for i, h in enumerate(previous)}
    ys_ind = {h: top + row_h * (i + 0.5) for i, h in enumerate(induction)}
    shown = [link for link in story.links if link.src in ys_prev and link.dst in ys_ind]
    effects = [abs(link.effect) for link in shown if link.effect is not None]
    effect_scale = max(effects) if effects else 0.0
    labelled = len(shown) <= MAX_LINK_LABELS
    for link in shown:
        y1, y2 = ys_prev[link.src], ys_ind[link.dst]
        excess = (link.score or 0.0) - (link.baseline or 0.0)
        stroke = max(1.0, min(6.0, 1.0 + 12.0 * excess)) if link.score is not None else 1.0
        if link.effect is not None and effect_scale > 0:
            colour = diverging(link.effect / effect_scale)
        else:  # no causal figure: the mode's colour, or grey beside links coloured by their effect
            colour = UNMEASURED_COLOUR if effects else MODE_COLOURS.get(link.mode, "#777")
        label = f"{link.mode} {link.score:.2f}" if link.score is not None else link.mode
        if link.effect is not None:
            label += f", {link.effect:+.2f}"
        mx, my = x_prev + 34 + 0.4 * (x_ind - x_prev - 72), y1 + 0.4 * (y2 - y1)
        parts.append(
            f'<g><title>{head_name(link.src)} -&gt; {head_name(link.dst)}: {_esc(label)}</title>'
            f'<line x1="{x_prev + 34}" y1="{_f(y1)}" x2="{x_ind - 38}" y2="{_f(y2)}" stroke="{colour}" '
            f'stroke-width="{_f(stroke)}" marker-end="url(#ck-arrow)"/>'
            + (f'<text x="{_f(mx)}" y="{_f(my - 4)}" text-anchor="middle" font-size="10" fill="#333" '
               f'paint-order="stroke" stroke="#fff" stroke-width="3">{_esc(label)}</text>' if labelled else "")
            + "</g>"
        )
    if shown:
        unmeasured = effects and any(link.effect is None for link in shown)
        caption = "width: composition" + ("; colour: causal effect" if effects else "") + (
            " (grey: none measured)" if unmeasured else "") + ("" if labelled else "; hover for figures")
        parts.append(f'<text x="{width // 2}" y="{height_heads - 2}" text-anchor="middle" font-size="9" '
                     f'fill="#666">{caption}</text>')
        parts.insert(1, '<defs><marker id="ck-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="9" '
                        'markerHeight="9" markerUnits="userSpaceOnUse" orient="auto">'
                        '<path d="M0 0L10 5L0 10z" fill="#555"/></marker></defs>')
    prev_scores = dict(story.previous)
    ind_scores = dict(story.induction)
    for h, y in ys_prev.items():
        v = prev_scores.get(h)
        parts.append(_node(x_prev, y, h, "prev " + ("n/a" if v is None else f"{v:.2f}"), "#e3eefb"))
    for h, y in ys_ind.items():
        v = ind_scores.get(h)
        parts.append(_node(x_ind, y, h, "induct " + ("n/a" if v is None else f"{v:.2f}"), "#fde3d9"))
    if not has_heads and not bars:
        parts.append('<text x="10" y="14" fill="#555">no induction circuit</text>')
    if bars:
        y0 = height_heads + 8
        top_loss = max(story.first_copy, story.repeated_copies, 1e-9)
        for i, (label, value, colour) in enumerate(
            (("first copy", story.first_copy, "#9aa5b1"), ("repeated", story.repeated_copies, "#2e9d5b"))
        ):
            y = y0 + i * 22
            w = max(1.0, 220.0 * max(value, 0.0) / top_loss)
            parts.append(
                f'<text x="84" y="{_f(y + 12)}" text-anchor="end" fill="#333">{label}</text>'
                f'<rect x="90" y="{_f(y + 2)}" width="{_f(w)}" height="14" fill="{colour}"/>'
                f'<text x="{_f(94 + w)}" y="{_f(y + 13)}" fill="#333">{value:.2f} nats</text>'
            )
    parts.append("</svg>")
    return "".join(parts)


DIAGRAM_LABEL_PLACES = (0.5, 0.38, 0.62, 0.27, 0.73, 0.18, 0.82, 0.1, 0.9)
"""Where along its link (0: the sender, 1: the receiver) a circuit-diagram label may sit, tried in this order."""


def _crosses(box: tuple[float, float, float, float], x1: float, y1: float, x2: float, y2: float) -> bool:
    """Whether the segment (x1, y1) -> (x2, y2) passes through ``box`` (sampled every 2 px along x)."""
    x0, y0, xb, yb = box
    steps = max(2, int((x2 - x1) / 2))
    for k in range(steps + 1):
        x = x1 + (x2 - x1) * k / steps
        y = y1 + (y2 - y1) * k / steps
        if x0 <= x <= xb and y0 <= y <= yb:
            return True
    return False


ROLE_FILLS = ("#e3eefb", "#fde3d9", "#e2f2e4", "#f1e4f7", "#fbf1d0", "#dff3f3")
"""Node fills of the circuit diagram's roles, in the order the roles first occur (then repeated)."""
PLAIN_FILL = "#f2f2f2"
"""The fill of a circuit member without a named role (its tooltip and the Members list say what it does)."""
NODE_W, NODE_H = 60, 30
DIAGRAM_GAP = (14, 80)
"""Space between two members of one layer's row (px): the widest where rows are short (room for the labels of the
edges between them), down to the narrowest for long rows."""
DIAGRAM_WIDTH = 420
"""The width the longest row's members share before their spacing reaches its narrowest."""
DIAGRAM_ROW = (54, 120)
"""Distance between the circuit diagram's layer rows (px): the widest where few rows leave room for the labels of
crossing edges (the bundled model's two), down to the narrowest for many (room for one label between two rows)."""
DIAGRAM_SPAN = 480
"""The height the layer rows share before their distance reaches its narrowest."""
DIAGRAM_LEFT, DIAGRAM_TOP = 40, 30
"""Where the first member's box starts: left of it the layer names, above it the title."""
LANE_GAP = 9
"""Distance between two routed edges' vertical lanes right of the members (px)."""


def _member_node(x: float, y: float, head: Head, caption: str, colour: str, title: str) -> str:
    name = head_name(head)
    hw, hh = NODE_W / 2, NODE_H / 2
    text = (f'<text x="{_f(x)}" y="{_f(y - 1)}" text-anchor="middle" font-weight="600">{name}</text>'
            f'<text x="{_f(x)}" y="{_f(y + 11)}" text-anchor="middle" font-size="9">{_esc(caption)}</text>'
            if caption else
            f'<text x="{_f(x)}" y="{_f(y + 4)}" text-anchor="middle" font-weight="600">{name}</text>')
    return (f'<g class="ck-node" data-head="{name}" data-layer="{head[0]}" tabindex="0"><title>head {name}: '
            f'{_esc(title)}</title><rect x="{_f(x - hw)}" y="{_f(y - hh)}" width="{NODE_W}" height="{NODE_H}" rx="6" '
            f'fill="{colour}" stroke="#333"/>{text}</g>')


def diagram_layout(circuit: Sequence[tuple[Head, Sequence[str]]]) -> tuple[dict[Head, tuple[float, float]], float]:
    """Where the circuit diagram puts each member: ``head -> (x, y)`` of its box's centre, and the distance between
    two rows (:data:`DIAGRAM_ROW`, :data:`DIAGRAM_SPAN`). One row per layer that
    holds a member, in layer order from the top (y strictly increasing with the layer: a 25-head circuit over 20
    layers stays readable on a narrow page, where 20 columns would not); within a row, members grouped by their
    first role (roles in the order they first occur, members without one last), then in the circuit's order."""
    layers = sorted({h[0] for h, _ in circuit})
    pitch = DIAGRAM_ROW[1] if len(layers) <= 2 else max(DIAGRAM_ROW[0], min(DIAGRAM_ROW[1],
                                                                             DIAGRAM_SPAN / (len(layers) - 1)))
    widest = max((sum(1 for h, _ in circuit if h[0] == layer) for layer in layers), default=1)
    gap = DIAGRAM_GAP[1] if widest <= 2 else max(DIAGRAM_GAP[0], min(
        DIAGRAM_GAP[1], (DIAGRAM_WIDTH - widest * NODE_W) / (widest - 1)))
    order = list(dict.fromkeys(r for _, roles in circuit for r in roles[:1]))
    rank = {h: i for i, (h, _) in enumerate(circuit)}
    roles_of = {h: tuple(roles) for h, roles in circuit}
    out = {}
    for r, layer in enumerate(layers):
        row = sorted((h for h, _ in circuit if h[0] == layer),
                     key=lambda h: (order.index(roles_of[h][0]) if roles_of[h] else len(order), rank[h]))
        y = DIAGRAM_TOP + NODE_H / 2 + r * pitch
        for c, h in enumerate(row):
            out[h] = (DIAGRAM_LEFT + NODE_W / 2 + c * (NODE_W + gap), y)
    return out, pitch


def _route(ends: tuple[float, float, float, float], lane: float, gap: float) -> list[tuple[float, float]]:
    """The corners of an edge routed round the members between its ends: down from the sender's bottom into the gap
    below its row, right to the vertical ``lane``, down it to the gap above the receiver's row, back, and down into
    the receiver's top (``gap``: between two rows). Every piece runs right, left or down, never up: an edge only
    goes forward."""
    x1, y1, x2, y2 = ends
    step = 3.0 * (round(lane / LANE_GAP) % 3 - 1)  # neighbouring lanes' horizontal pieces a little apart
    below = y1 + gap / 2 - 2 + step  # the middle of the gap under the sender's row
    above = y2 - gap / 2 + 6 + step  # ... and over the receiver's row (y2: the arrow's tip)
    return [(x1, y1), (x1, below), (lane, below), (lane, above), (x2, above), (x2, y2)]


def _along(points: Sequence[tuple[float, float]], frac: float) -> tuple[float, float]:
    """The point ``frac`` of the way along the polyline ``points`` (by length)."""
    pieces = [math.hypot(bx - ax, by - ay) for (ax, ay), (bx, by) in zip(points, points[1:], strict=False)]
    left = frac * sum(pieces)
    for (ax, ay), (bx, by), length in zip(points, points[1:], pieces, strict=False):
        if left <= length and length > 0:
            return ax + (bx - ax) * left / length, ay + (by - ay) * left / length
        left -= length
    return points[-1]


def _hits(box: tuple[float, float, float, float], points: Sequence[tuple[float, float]]) -> bool:
    """Whether the polyline ``points`` passes through ``box`` (each piece sampled every 2 px)."""
    x0, y0, xb, yb = box
    for (ax, ay), (bx, by) in zip(points, points[1:], strict=False):
        steps = max(1, int(math.hypot(bx - ax, by - ay) / 2))
        for k in range(steps + 1):
            x, y = ax + (bx - ax) * k / steps, ay + (by - ay) * k / steps
            if x0 <= x <= xb and y0 <= y <= yb:
                return True
    return False


def answer_diagram(answer: Any) -> str:
    """The verified circuit, every member drawn: one row per layer in layer order from the top (``L3`` above
    ``L7``), the members of a layer side by side, grouped and coloured by role where they hold one
    (:func:`diagram_layout`); the carrying edges between them from the sender's bottom to the receiver's top,
    coloured and sized by their exact effect (path patching, labelled in nats where a label fits, every one with a
    tooltip), routed round any other member's box in a lane right of the members. Only forward edges are drawn
    (sender in an earlier layer than receiver); any other is counted under the figure, never drawn backwards. Each
    node's tooltip is its explanation (``answer.explanations``). ``answer``:
    :class:`circuitkit.report.summary.Answer` (this module does not import the summary, which draws with it)."""
    circuit = [(tuple(h), tuple(roles)) for h, roles in answer.circuit]
    at, pitch = diagram_layout(circuit)
    explanations = getattr(answer, "explanations", None) or {}
    role_order = list(dict.fromkeys(r for _, roles in circuit for r in roles[:1]))
    fills = {role: ROLE_FILLS[i % len(ROLE_FILLS)] for i, role in enumerate(role_order)}
    boxes = {h: (x - NODE_W / 2, y - NODE_H / 2, x + NODE_W / 2, y + NODE_H / 2) for h, (x, y) in at.items()}
    edges = [e for e in answer.edges if tuple(e.src) in at and tuple(e.dst) in at]
    shown = [e for e in edges if e.src[0] < e.dst[0]]
    backward = len(edges) - len(shown)
    routes: list[tuple[tuple[float, float, float, float], list[tuple[float, float]]]] = []
    right = max((b[2] for b in boxes.values()), default=0.0)
    lanes = 0
    for e in shown:  # straight where that passes no other member's box, else round them in a lane of its own
        (xs, ys), (xd, yd) = at[tuple(e.src)], at[tuple(e.dst)]
        ends = (xs, ys + NODE_H / 2, xd, yd - NODE_H / 2 - 4)
        others = [b for h, b in boxes.items() if h not in (tuple(e.src), tuple(e.dst))]
        points = [ends[:2], ends[2:]]
        if any(_hits(box, points) for box in others):
            lanes += 1
            points = _route(ends, right + LANE_GAP * lanes, pitch - NODE_H)
        routes.append((ends, points))
    xs_all = [x for _, points in routes for x, _ in points] + [b[2] for b in boxes.values()]
    ys_all = [b[3] for b in boxes.values()]
    width = int(max(340, max(xs_all, default=0) + 16))
    legend_h = 16 if role_order else 0
    notes = ["rows: layers, from the top; edges: exact effect (path patching, nats)"]
    if backward:
        notes.append(f"{backward} edge{'s' if backward != 1 else ''} not from an earlier layer, not drawn")
    height = int(max(ys_all, default=0) + 11 + 11 * (len(notes) + 1) + legend_h)
    parts = [
        f'<svg class="ck-diagram" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        'font-family="system-ui, sans-serif" font-size="11" role="img" aria-label="circuit diagram">'
        '<defs><marker id="ck-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="9" markerHeight="9" '
        'markerUnits="userSpaceOnUse" orient="auto"><path d="M0 0L10 5L0 10z" fill="#555"/></marker></defs>'
        f'<text x="{width // 2}" y="12" text-anchor="middle" fill="#555">circuit: {len(circuit)} heads, '
        f'faithfulness {answer.faithfulness:.2f}</text>'
    ]
    for layer in sorted({h[0] for h, _ in circuit}):
        y = next(y for h, (_, y) in at.items() if h[0] == layer)
        parts.append(f'<text x="{DIAGRAM_LEFT - 6}" y="{_f(y + 4)}" text-anchor="end" fill="#777" font-size="10">'
                     f"L{layer}</text>")
    scale = max((abs(e.effect) for e in shown), default=0.0)
    taken = list(boxes.values())  # labels never overlap a node or another label
    labels: list[str] = []
    hidden_said = False
    for i, (e, (ends, points)) in enumerate(zip(shown, routes, strict=True)):
        t = e.effect / scale if scale > 0 else 0.0
        label = f"{e.channel.upper()} {e.effect:+.2f}"
        half = 3.1 * len(label)
        others = [p for j, (_, p) in enumerate(routes) if j != i]
        spot = None
        # beside its own line (right of it, left, above, below, a little further right or left), where neither
        # it nor another line crosses the label
        beside = ((half + 4, 0.0), (-half - 4, 0.0), (0.0, -9.0), (0.0, 10.0), (half + 14, 0.0), (-half - 14, 0.0))
        for frac, (dx, dy) in ((frac, d) for frac in DIAGRAM_LABEL_PLACES for d in beside):
            px, py = _along(points, frac)
            box = (px + dx - half - 1, py + dy - 6, px + dx + half + 1, py + dy + 5)
            if _free(box, taken) and not any(_hits(box, p) for p in others) and not _hits(box, points):
                spot = (px + dx, py + dy + 4)
                taken.append(box)
                break
        if spot is None and not hidden_said:
            notes.append("hover an edge or a head for its figures")
            hidden_said = True
        x1, y1, x2, y2 = ends
        title = (f"<title>{head_name(e.src)} -&gt; {head_name(e.dst)} {e.channel.upper()}: exact effect "
                 f"{e.effect:+.3f} nats (path patching)</title>")
        style = (f'stroke="{diverging(t)}" stroke-width="{_f(1.0 + 4.0 * abs(t))}" fill="none" '
                 'marker-end="url(#ck-arrow)"')
        if len(points) > 2:
            corners = "L".join(f"{_f(x)} {_f(y)}" for x, y in points[1:])
            shape = f'<path d="M{_f(x1)} {_f(y1)}L{corners}" stroke-linejoin="round" {style}/>'
        else:
            shape = f'<line x1="{_f(x1)}" y1="{_f(y1)}" x2="{_f(x2)}" y2="{_f(y2)}" {style}/>'
        parts.append(f'<g class="ck-edge" data-src="{head_name(e.src)}" data-dst="{head_name(e.dst)}">{title}'
                     f"{shape}</g>")
        if spot is not None:
            labels.append(f'<text x="{_f(spot[0])}" y="{_f(spot[1])}" text-anchor="middle" font-size="10" '
                          f'fill="#333" paint-order="stroke" stroke="#fff" stroke-width="3">{_esc(label)}</text>')
    for h, roles in circuit:  # over every line
        x, y = at[h]
        caption = "/".join(ROLE_SHORT.get(r, r) for r in roles)
        title = explanations.get(head_name(h)) or caption or "circuit member"
        parts.append(_member_node(x, y, h, caption, fills.get(roles[0], PLAIN_FILL) if roles else PLAIN_FILL, title))
    parts += labels  # over every line and node
    bottom = height - legend_h
    if role_order:
        lx = 12.0
        plain = any(not roles for _, roles in circuit)
        for role in [*role_order, *([None] if plain else [])]:
            text = "other member" if role is None else ROLE_SHORT.get(role, role)
            colour = PLAIN_FILL if role is None else fills[role]
            parts.append(f'<rect x="{_f(lx)}" y="{bottom}" width="10" height="10" fill="{colour}" stroke="#333"/>'
                         f'<text x="{_f(lx + 14)}" y="{bottom + 9}" font-size="9" fill="#444">{_esc(text)}</text>')
            lx += 24 + 5.2 * len(text)
    for i, line in enumerate(notes):
        parts.append(f'<text x="12" y="{bottom - 5 - 11 * (len(notes) - 1 - i)}" font-size="9" fill="#666">'
                     f"{_esc(line)}</text>")
    parts.append("</svg>")
    return "".join(parts)


def faithfulness_curve(curve: Sequence[tuple[int, float]], target: float, chosen: int, total: int,
                       whiskers: Mapping[int, tuple[float, float] | None] | None = None,
                       baseline: tuple[float, float, float] | None = None, unit: str = "heads",
                       searched: tuple[str, float] | None = None) -> str:
    """Faithfulness of the top-``n`` heads against ``n`` (every point measured exactly), a log2(n + 1) axis, the
    target dashed and the circuit's point ringed; ``whiskers``: ``n -> (lo, hi)``, each point's bootstrap interval
    over the batch's sequences; ``baseline``: ``(mean, lo, hi)`` of random head sets of the circuit's size, a grey
    cross with its whisker at the circuit's size; ``unit``: what ``n`` counts in the labels (a task's edge circuit
    counts ``"edges"``); ``searched``: ``(search, faithfulness)`` of a set of ``chosen`` members that a search
    beyond ranking found (not the curve's top-``chosen`` set): the ring is drawn at its faithfulness, off the curve,
    the axis label names it, and the curve's own point at that size stays a dot."""
    width, height, ml, mr, mt, mb = 300, 170, 40, 12, 22, 34
    top_x = math.log2(total + 1) or 1.0
    whiskers = {n: w for n, w in (whiskers or {}).items() if w is not None}
    ringed = "the circuit" if searched is None else f"the {searched[0]} set"
    values = ([f for _, f in curve] + [v for w in whiskers.values() for v in w] + list(baseline or ())
              + ([] if searched is None else [searched[1]]))
    lo = min(0.0, *values) if values else 0.0
    hi = max(1.0, *values) if values else 1.0

    def x(n: int) -> float:
        return ml + (width - ml - mr) * math.log2(n + 1) / top_x

    def y(f: float) -> float:
        return mt + (height - mt - mb) * (hi - f) / (hi - lo)

    parts = [
        f'<svg class="ck-curve" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        'font-family="system-ui, sans-serif" font-size="10" role="img" aria-label="faithfulness curve">'
        f'<text x="{width // 2}" y="12" text-anchor="middle" fill="#555">faithfulness of the top-n {unit} (exact)'
        "</text>"
    ]
    for tick in sorted({0.0, 0.5, 1.0}):
        parts.append(f'<line x1="{ml}" x2="{width - mr}" y1="{_f(y(tick))}" y2="{_f(y(tick))}" stroke="#eee"/>'
                     f'<text x="{ml - 4}" y="{_f(y(tick) + 3)}" text-anchor="end" fill="#666">{tick:.1f}</text>')
    parts.append(f'<line x1="{ml}" x2="{width - mr}" y1="{_f(y(target))}" y2="{_f(y(target))}" stroke="#b2182b" '
                 f'stroke-dasharray="4 3"/><text x="{width - mr}" y="{_f(y(target) + 11)}" text-anchor="end" '
                 f'fill="#b2182b">target {target:.2f}</text>')

    def half(n: int) -> float:  # half a tick label's width (10 px digits)
        return 3.1 * len(str(n))

    ticks: list[int] = []
    for n in [chosen, total, 0, 1, 4, 16, 64, 256]:  # the circuit's size and the total first; none overlapping
        if n <= total and all(abs(x(n) - x(m)) > max(16.0, half(n) + half(m) + 4) for m in ticks):
            ticks.append(n)
    for n in sorted(ticks):
        # a label that would run past the drawing's right edge (79813 edges) ends at it instead
        end = x(n) + half(n) > width - 1
        parts.append(f'<text x="{width - 1 if end else _f(x(n))}" y="{height - mb + 12}" '
                     f'text-anchor="{"end" if end else "middle"}" fill="#666">{n}</text>')
    points = " ".join(f"{_f(x(n))},{_f(y(f))}" for n, f in curve)
    parts.append(f'<polyline points="{points}" fill="none" stroke="#2e6db4" stroke-width="1.5"/>')
    for n, (low, high) in sorted(whiskers.items()):
        if high > low:
            parts.append(f'<path class="ck-whisker" d="M{_f(x(n))},{_f(y(low))}V{_f(y(high))}M{_f(x(n) - 3)},'
                         f'{_f(y(low))}h6M{_f(x(n) - 3)},{_f(y(high))}h6" stroke="#2e6db4" stroke-width="1">'
                         f"<title>top {n} {unit}: interval {low:.3f} to {high:.3f}</title></path>")
    if baseline is not None:
        mean, low, high = baseline
        bx = x(chosen) + 7
        parts.append(f'<path class="ck-baseline" d="M{_f(bx)},{_f(y(low))}V{_f(y(high))}M{_f(bx - 3)},{_f(y(mean))}'
                     f'h6" stroke="#888" stroke-width="1.5"><title>random sets of {chosen} {unit}: faithfulness '
                     f"{mean:.3f} (interval {low:.3f} to {high:.3f})</title></path>")
    ring = ' r="5" fill="none" stroke="#b2182b" stroke-width="2"'
    for n, f in curve:
        style = ring if n == chosen and searched is None else ' r="2.5" fill="#2e6db4"'
        parts.append(f'<circle cx="{_f(x(n))}" cy="{_f(y(f))}"{style}><title>top {n} {unit}: faithfulness '
                     f"{f:.3f}</title></circle>")
    if searched is not None:
        parts.append(f'<circle class="ck-searched" cx="{_f(x(chosen))}" cy="{_f(y(searched[1]))}"{ring}><title>'
                     f"{_esc(ringed)}: {chosen} {unit} at faithfulness {searched[1]:.3f}</title></circle>")
    parts.append(f'<text x="{(width + ml) // 2}" y="{height - 4}" text-anchor="middle" fill="#555">{unit} kept '
                 f"(ringed: {_esc(ringed)}, {chosen} of {total})</text></svg>")
    return "".join(parts)


@dataclass(frozen=True)
class GraphEdge:
    src: Head
    dst: Head
    colour: str
    width: float
    title: str
    label: str = ""
    dash: bool = False


CHAR_WIDTH = 6.2
"""Width of one character of the graphs' 10 px labels (system-ui), for placing labels without overlap."""
LABEL_HEIGHT = 12.0


def _free(box: tuple[float, float, float, float], taken: list[tuple[float, float, float, float]]) -> bool:
    """Whether ``box`` (x0, y0, x1, y1) overlaps none of ``taken``."""
    x0, y0, x1, y1 = box
    return all(x1 <= a0 or x0 >= a1 or y1 <= b0 or y0 >= b1 for a0, b0, a1, b1 in taken)


def head_graph(
    n_layers: int, n_heads: int, edges: Sequence[GraphEdge], *, legend: Sequence[tuple[str, str, bool]] = ()
) -> str:
    """Heads at ``(x = layer, y = head)``, the given edges as curves from the earlier to the later layer.

    The x axis spans only the layers the edges join (a circuit in layers 0-2 of a 30-layer model fills the width;
    the axis says which layers of how many). Only the heads an edge touches are drawn as nodes (a 48 x 25 model
    would otherwise be 1,200 circles); every layer shown gets a faint guide line. Labels never overlap: each
    node's name takes the first free place beside it (right, left, above, below) and is left out where none is
    free, each edge's score likewise (strongest first, at most :data:`MAX_LABELLED_EDGES`); every node and edge
    keeps its text as a tooltip. ``legend``: (text, colour, dashed) entries.
    """
    margin_l, margin_r, margin_t = 28, 36, 22 + (18 if legend else 0)
    dy = max(6.0, min(22.0, 360.0 / max(1, n_heads - 1))) if n_heads > 1 else 0.0
    height = margin_t + dy * (n_heads - 1) + 36
    touched = [layer for e in edges for layer in (e.src[0], e.dst[0])]
    first, last = (min(touched), max(touched)) if touched else (0, n_layers - 1)
    if last == first:
        first, last = max(0, first - 1), min(n_layers - 1, first + 1)
    partial = first > 0 or last < n_layers - 1
    height += 10 if partial else 0  # room for the line that says which layers these are
    span = max(1, last - first)
    dx = (GRAPH_WIDTH - margin_l - margin_r) / span

    def xy(head: Head) -> tuple[float, float]:
        return margin_l + (head[0] - first) * dx, margin_t + head[1] * dy

    parts = [
        f'<svg class="ck-graph" width="{GRAPH_WIDTH}" height="{_f(height)}" '
        f'viewBox="0 0 {GRAPH_WIDTH} {_f(height)}" font-family="system-ui, sans-serif" font-size="10">'
    ]
    step = max(1, math.ceil((span + 1) / 24))
    for layer in range(first, last + 1):
        x = margin_l + (layer - first) * dx
        bottom = height - (10 if partial else 0)
        parts.append(f'<line x1="{_f(x)}" y1="{margin_t - 6}" x2="{_f(x)}" y2="{_f(bottom - 26)}" stroke="#eee"/>')
        if (layer - first) % step == 0:
            parts.append(f'<text x="{_f(x)}" y="{_f(bottom - 12)}" text-anchor="middle" fill="#666">L{layer}</text>')
    if partial:
        parts.append(f'<text x="{GRAPH_WIDTH - 4}" y="{_f(height - 4)}" text-anchor="end" fill="#666">layers '
                     f"{first}-{last} of {n_layers} (the layers these edges join)</text>")
    x_legend = margin_l
    for text, colour, dashed in legend:
        dash = ' stroke-dasharray="4 3"' if dashed else ""
        parts.append(
            f'<line x1="{_f(x_legend)}" y1="10" x2="{_f(x_legend + 22)}" y2="10" stroke="{colour}" '
            f'stroke-width="3"{dash}/><text x="{_f(x_legend + 27)}" y="14" fill="#333">{_esc(text)}</text>'
        )
        x_legend += 34 + CHAR_WIDTH * len(text)
    nodes: dict[Head, None] = {}
    by_width = sorted(edges, key=lambda e: e.width)
    for edge in by_width:  # strongest drawn last, on top
        (x1, y1), (x2, y2) = xy(edge.src), xy(edge.dst)
        xm = (x1 + x2) / 2
        dash = ' stroke-dasharray="5 4"' if edge.dash else ""
        parts.append(
            f'<path d="M{_f(x1)} {_f(y1)}C{_f(xm)} {_f(y1)} {_f(xm)} {_f(y2)} {_f(x2)} {_f(y2)}" fill="none" '
            f'stroke="{edge.colour}" stroke-width="{_f(edge.width)}" stroke-opacity="0.8"{dash}>'
            f"<title>{_esc(edge.title)}</title></path>"
        )
        nodes[edge.src] = None
        nodes[edge.dst] = None
    # every node's circle is taken first; then node names, then edge scores (strongest first) claim free places
    taken: list[tuple[float, float, float, float]] = [(x - 6, y - 6, x + 6, y + 6) for x, y in map(xy, nodes)]
    names: dict[Head, str] = {}
    for head in sorted(nodes):
        x, y = xy(head)
        text = head_name(head)
        w = CHAR_WIDTH * len(text)
        for lx, anchor, box in ((x + 7, "start", (x + 7, y - 14, x + 7 + w, y - 3)),
                                (x - 7, "end", (x - 7 - w, y - 14, x - 7, y - 3)),
                                (x + 7, "start", (x + 7, y + 3, x + 7 + w, y + 14)),
                                (x - 7, "end", (x - 7 - w, y + 3, x - 7, y + 14))):
            if box[0] >= 0 and box[2] <= GRAPH_WIDTH and _free(box, taken):
                taken.append(box)
                names[head] = (f'<text x="{_f(lx)}" y="{_f(box[3] - 2)}" text-anchor="{anchor}" '
                               f'fill="#111">{text}</text>')
                break
    for edge in [e for e in reversed(by_width) if e.label][:MAX_LABELLED_EDGES]:
        (x1, y1), (x2, y2) = xy(edge.src), xy(edge.dst)
        lx, ly = (x1 + x2) / 2, (y1 + y2) / 2 - 3
        w = CHAR_WIDTH * len(edge.label)
        box = (lx - w / 2, ly - LABEL_HEIGHT + 2, lx + w / 2, ly + 2)
        if _free(box, taken):
            taken.append(box)
            parts.append(
                f'<text x="{_f(lx)}" y="{_f(ly)}" text-anchor="middle" fill="#222" '
                f'paint-order="stroke" stroke="#fff" stroke-width="3">{_esc(edge.label)}</text>'
            )
    for head in sorted(nodes):
        x, y = xy(head)
        name = head_name(head)
        parts.append(
            f'<g class="ck-node" data-head="{name}" tabindex="0"><title>head {name}</title>'
            f'<circle cx="{_f(x)}" cy="{_f(y)}" r="5" fill="#fff" stroke="#333" stroke-width="1.5"/>'
            f"{names.get(head, '')}</g>"
        )
    parts.append("</svg>")
    return "".join(parts)


def loss_curve(per_position: Sequence[float | None], boundaries: Sequence[float], *, width: int = GRAPH_WIDTH) -> str:
    """Per-position loss (index ``t - 1`` predicts token ``t``) as a line; dashed lines where a copy starts."""
    values = [v for v in per_position if v is not None]
    if not values:
        return ""
    height, ml, mr, mt, mb = 170, 44, 12, 10, 26
    top = max(values) * 1.05 or 1.0
    n = len(per_position)
    sx = (width - ml - mr) / max(1, n - 1)

    def y(v: float) -> float:
        return mt + (height - mt - mb) * (1 - v / top)

    points = " ".join(f"{_f(ml + i * sx)},{_f(y(v))}" for i, v in enumerate(per_position) if v is not None)
    parts = [
        f'<svg class="ck-loss" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="system-ui, sans-serif" font-size="10">'
    ]
    for tick in (0.0, top / 2, top / 1.05):
        parts.append(
            f'<line x1="{ml}" x2="{width - mr}" y1="{_f(y(tick))}" y2="{_f(y(tick))}" stroke="#eee"/>'
            f'<text x="{ml - 4}" y="{_f(y(tick) + 3)}" text-anchor="end" fill="#666">{tick:.1f}</text>'
        )
    for b in boundaries:
        x = ml + b * sx
        parts.append(f'<line x1="{_f(x)}" x2="{_f(x)}" y1="{mt}" y2="{height - mb}" stroke="#999" '
                     'stroke-dasharray="4 3"/>')
    parts.append(f'<polyline points="{points}" fill="none" stroke="#2e6db4" stroke-width="1.5"/>')
    parts.append(f'<text x="{(width + ml) // 2}" y="{height - 6}" text-anchor="middle" fill="#555">'
                 "position (predicting the next token); dashed: a copy of the block starts</text>")
    parts.append(f'<text x="10" y="{(height - mb) // 2}" fill="#555" transform="rotate(-90 10 {(height - mb) // 2})"'
                 ' text-anchor="middle">nats</text></svg>')
    return "".join(parts)


__all__ = [
    "GraphEdge", "answer_diagram", "circuit_diagram", "diagram_layout", "diverging", "faithfulness_curve",
    "head_graph", "loss_curve",
]
