"""Composition graph view: one trace per edge, at the heads' positions, carrying the edge's score."""

from __future__ import annotations

import numpy as np
import pytest

from circuitkit import CircuitkitError, Edge
from circuitkit.viz import composition_graph
from circuitkit.viz.graph import MAX_WIDTH, MIN_WIDTH, MODE_OFFSET

EDGES = [Edge((0, 1), (1, 3), 0.9), Edge((0, 0), (2, 2), 0.5), Edge((1, 2), (2, 0), 0.3)]


def test_one_trace_per_edge_with_positions_and_scores():
    figure = composition_graph(EDGES, n_layers=3, n_heads=4)
    edge_traces, nodes = figure.data[:-1], figure.data[-1]
    assert len(edge_traces) == len(EDGES)
    for trace, edge in zip(edge_traces, EDGES, strict=True):
        assert trace.name == edge.name
        assert list(trace.x) == [edge.src[0], edge.dst[0]]
        assert list(trace.y) == [edge.src[1], edge.dst[1]]
        assert list(trace.customdata) == [edge.score, edge.score]
    widths = [trace.line.width for trace in edge_traces]
    assert widths[0] == pytest.approx(MAX_WIDTH) and widths[2] == pytest.approx(MIN_WIDTH)
    assert widths[0] > widths[1] > widths[2]
    assert len(nodes.x) == 12 and list(nodes.text)[5] == "1.1"


def test_modes_colour_edges_and_name_them():
    figure = composition_graph({"Q": EDGES[:1], "V": EDGES[1:]})
    names = [trace.name for trace in figure.data[:-1]]
    assert names == ["Q 0.1 -> 1.3", "V 0.0 -> 2.2", "V 1.2 -> 2.0"]
    assert figure.data[0].line.color != figure.data[1].line.color
    # two modes: shifted -/+ half an offset, so Q and V edges between the same heads do not overlap
    assert list(figure.data[0].y) == pytest.approx([1 - MODE_OFFSET / 2, 3 - MODE_OFFSET / 2])
    assert list(figure.data[1].y) == pytest.approx([0 + MODE_OFFSET / 2, 2 + MODE_OFFSET / 2])
    # inferred size: layers 0..2, heads 0..3
    assert len(figure.data[-1].x) == 12


def test_no_edges_still_draws_the_heads():
    figure = composition_graph([], n_layers=2, n_heads=2)
    assert len(figure.data) == 1 and np.asarray(figure.data[0].x).tolist() == [0, 0, 1, 1]


@pytest.mark.parametrize(
    "edges, kwargs, message",
    [
        ("0.1 -> 1.2", {}, "list of Edge"),
        ([object()], {}, "src=\\(layer, head\\)"),
        ([Edge((0, 0), (5, 0), 0.1)], {"n_layers": 2, "n_heads": 2}, r"head layer: .*expected an int >= 0 and <= 1"),
        ([Edge((0, 0), (1, 0), float("nan"))], {}, "finite score"),
    ],
    ids=["string", "not-an-edge", "head-out-of-range", "nan-score"],
)
def test_rejects_bad_edges(edges, kwargs, message):
    with pytest.raises(CircuitkitError, match=message):
        composition_graph(edges, **kwargs)


def test_edges_from_circuitkit_top_edges():
    from circuitkit.composition import composition_scores, top_edges
    from tests.conftest import random_weights

    weights = random_weights(n_layers=3, n_heads=2, d_model=16, d_head=4, seed=5)
    edges = {mode: top_edges(composition_scores(weights, mode), k=4) for mode in ("K", "V")}
    figure = composition_graph(edges, n_layers=3, n_heads=2)
    shown = [(trace.name, trace.customdata[0]) for trace in figure.data[:-1]]
    assert shown == [(f"{mode} {edge.name}", edge.score) for mode in ("K", "V") for edge in edges[mode]]
