"""A layered graph of the strongest composition edges between heads, as a plotly figure.

Heads are nodes at ``(x = layer, y = head)``; each edge from an earlier head to a later one is a line whose
width grows with its composition score. Edges come from :func:`circuitkit.top_edges` (objects with ``src``,
``dst``, ``score`` and ``name``), either one list or a mapping ``mode -> list`` (``"Q"``, ``"K"``, ``"V"``),
coloured by mode.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from circuitkit import validate
from circuitkit.errors import CircuitkitError
from circuitkit.ranking import head_name
from circuitkit.viz._checks import check_head, text

MAX_GRAPH_EDGES = 10_000
"""The most edges a graph draws per mode (an iterator is read that far: an endless one is refused)."""
MODE_COLOURS = {"Q": "#1f77b4", "K": "#2ca02c", "V": "#d62728", "": "#555555"}
MIN_WIDTH, MAX_WIDTH = 1.0, 8.0
# with several modes, each mode's edges are shifted this far apart vertically so Q, K and V edges between the
# same two heads stay visible side by side
MODE_OFFSET = 0.12
MAX_GRID = 1024
"""Largest ``n_layers`` or ``n_heads`` drawn: the graph has one node per head, and a figure of more than
1024 x 1024 nodes is not readable (nor quick to build)."""


def composition_graph(
    edges: Sequence[Any] | Mapping[str, Sequence[Any]],
    *,
    n_layers: int | None = None,
    n_heads: int | None = None,
    title: str = "top composition edges",
) -> go.Figure:
    """Draw ``edges`` between the heads of an ``n_layers x n_heads`` model (inferred from the edges if omitted).

    One trace per edge, named ``"<mode> <edge.name>"`` (e.g. ``"K 0.3 -> 1.2"``), with ``x = [src_layer,
    dst_layer]``, ``y = [src_head, dst_head] + offset`` (``offset`` = 0 for a single group, else the mode's
    multiple of :data:`MODE_OFFSET`, centred) and ``customdata = [score, score]``; its width is linear in the
    score between :data:`MIN_WIDTH` and :data:`MAX_WIDTH` over all edges shown. The last trace holds the nodes.
    ``n_layers`` and ``n_heads`` are ``None`` or ints in ``[1, MAX_GRID]``; ``title`` is a str.
    """
    if n_layers is not None:
        n_layers = validate.integer("composition_graph: n_layers", n_layers, minimum=1, maximum=MAX_GRID)
    if n_heads is not None:
        n_heads = validate.integer("composition_graph: n_heads", n_heads, minimum=1, maximum=MAX_GRID)
    title = text("composition_graph: title", title)
    groups = _groups(edges)
    all_edges = [(mode, edge) for mode, group in groups.items() for edge in group]
    checked = [(mode, _check_edge(edge)) for mode, edge in all_edges]
    offsets = {mode: (i - (len(groups) - 1) / 2) * MODE_OFFSET for i, mode in enumerate(groups)}
    if n_layers is None:
        n_layers = 1 + max((max(src[0], dst[0]) for _, (src, dst, _) in checked), default=0)
    if n_heads is None:
        n_heads = 1 + max((max(src[1], dst[1]) for _, (src, dst, _) in checked), default=0)
    for _, (src, dst, _) in checked:
        check_head(src, n_layers, n_heads, "composition_graph")
        check_head(dst, n_layers, n_heads, "composition_graph")
    scores = [score for _, (_, _, score) in checked]
    low, high = (min(scores), max(scores)) if scores else (0.0, 0.0)

    figure = go.Figure()
    for mode, (src, dst, score) in checked:
        fraction = 0.5 if high == low else (score - low) / (high - low)
        name = f"{mode} {head_name(src)} -> {head_name(dst)}".strip()
        figure.add_trace(
            go.Scatter(
                x=[src[0], dst[0]],
                y=[src[1] + offsets[mode], dst[1] + offsets[mode]],
                mode="lines",
                name=name,
                legendgroup=mode or "edges",
                line={"color": MODE_COLOURS.get(mode, MODE_COLOURS[""]),
                      "width": MIN_WIDTH + fraction * (MAX_WIDTH - MIN_WIDTH)},
                opacity=0.75,
                customdata=[score, score],
                hovertemplate=f"{name}<br>score %{{customdata:.4f}}<extra></extra>",
            )
        )
    layers = [layer for layer in range(n_layers) for _ in range(n_heads)]
    heads = [head for _ in range(n_layers) for head in range(n_heads)]
    figure.add_trace(
        go.Scatter(
            x=layers,
            y=heads,
            mode="markers+text",
            name="heads",
            text=[head_name((layer, head)) for layer, head in zip(layers, heads, strict=True)],
            textposition="middle right",
            marker={"size": 10, "color": "#ffffff", "line": {"color": "#333333", "width": 1.5}},
            hovertemplate="head %{text}<extra></extra>",
            showlegend=False,
        )
    )
    figure.update_layout(
        title={"text": title},
        xaxis={"title": {"text": "layer"}, "dtick": 1, "range": [-0.5, n_layers - 0.3]},
        yaxis={"title": {"text": "head"}, "dtick": 1, "autorange": "reversed"},
        width=max(480, 200 * n_layers),
        height=max(320, 80 + 30 * n_heads),
        margin={"l": 60, "r": 20, "t": 80, "b": 50},
    )
    return figure


def _groups(edges: Sequence[Any] | Mapping[str, Sequence[Any]]) -> dict[str, list[Any]]:
    if isinstance(edges, Mapping):
        return {str(mode): validate.bounded_list(f"composition_graph: edges[{mode!r}]", group, MAX_GRAPH_EDGES,
                                                 "a list of Edge (circuitkit.top_edges(scores))",
                                                 why="MAX_GRAPH_EDGES edges per mode")
                for mode, group in edges.items()}
    if isinstance(edges, (str, bytes)) or not isinstance(edges, Sequence):
        raise CircuitkitError(
            f"composition_graph: given {type(edges).__name__}; expected a list of Edge "
            "(circuitkit.top_edges(scores)) or a mapping mode -> list of Edge."
        )
    return {"": list(edges)}


def _check_edge(edge: Any) -> tuple[tuple[int, int], tuple[int, int], float]:
    try:
        src, dst, score = tuple(edge.src), tuple(edge.dst), float(edge.score)
    except (AttributeError, TypeError, ValueError) as error:
        raise CircuitkitError(
            f"composition_graph: given edge {edge!r}; expected an object with src=(layer, head), "
            "dst=(layer, head) and a float score, as circuitkit.top_edges returns."
        ) from error
    if not math.isfinite(score):
        raise CircuitkitError(f"composition_graph: given edge {edge!r} with score {score}; expected a finite score.")
    if len(src) != 2 or len(dst) != 2:
        raise CircuitkitError(f"composition_graph: given edge {edge!r}; expected (layer, head) pairs.")
    src, dst = (check_head(h, MAX_GRID, MAX_GRID, "composition_graph: edge") for h in (src, dst))
    return src, dst, score
