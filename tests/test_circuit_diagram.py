"""The answer's circuit diagram draws every member, in layer order (one row per layer, from the top), with edges only
forward: a synthetic 30 x 9 scan whose verified circuit has 25 heads over 21 layers (a previous-token head in layer
23, as a real model's), the SVG parsed back."""

from __future__ import annotations

import dataclasses
import re

import pytest

from circuitkit.circuits.evidence import EdgeEvidence
from circuitkit.circuits.patching import PathPatching
from circuitkit.report.figures import NODE_W, _hits, answer_diagram, diagram_layout
from circuitkit.report.summary import find_answer
from tests.report_fixtures import FakeEvidence, sized_scan

NODE = re.compile(r'<g class="ck-node" data-head="(\d+)\.(\d+)" data-layer="(\d+)" tabindex="0"><title>(.*?)</title>'
                  r'<rect x="([\d.]+)" y="([\d.]+)"')
EDGE = re.compile(r'<g class="ck-edge" data-src="(\d+)\.(\d+)" data-dst="(\d+)\.(\d+)"><title>[^<]*</title>'
                  r'(?:<line x1="([\d.]+)" y1="([\d.]+)" x2="([\d.]+)" y2="([\d.]+)"|<path d="([^"]+)")')
POINT = re.compile(r"[ML]([\d.]+) ([\d.]+)")


def _edges(svg):
    """``(src, dst, points)`` of every drawn edge: a line's two ends, a routed path's corners."""
    out = []
    for a, b, c, d, *coords, path in EDGE.findall(svg):
        points = [(float(x), float(y)) for x, y in POINT.findall(path)] if path else [
            (float(coords[0]), float(coords[1])), (float(coords[2]), float(coords[3]))]
        out.append(((int(a), int(b)), (int(c), int(d)), points))
    return out
PREVIOUS = ((0, 1), (1, 3), (23, 4))
INDUCTION = ((2, 2), (5, 0), (29, 0))
FORWARD = [((0, 1), (2, 2), 0.9), ((1, 3), (5, 0), 0.6), ((23, 4), (29, 0), 0.8), ((3, 3), (23, 4), 0.3),
           ((5, 0), (29, 0), 0.05), ((0, 1), (29, 0), 0.4)]
BACKWARD = [((23, 4), (5, 0), 0.7), ((7, 1), (7, 5), 0.5)]  # a later layer into an earlier one; one layer to itself


def wide_scan():
    """The 30 x 9 synthetic scan with a 25-head circuit: the planted roles, 19 more heads in layers 3-22 (two in
    layer 7), carrying edges forward and two that are not."""
    scan = sized_scan("30x9", verified=True)
    others = [(layer, (4 * layer) % 9) for layer in range(3, 23) if layer != 5][:18] + [(7, 5)]
    heads = tuple(dict.fromkeys([*PREVIOUS, *INDUCTION, *others]))
    assert len(heads) == 25
    rows = tuple(EdgeEvidence(src, dst, "k", 0.3, effect, effect) for src, dst, effect in FORWARD + BACKWARD)
    verified = dataclasses.replace(
        scan.verified, heads=heads, ranking=heads + tuple(h for h in scan.verified.ranking if h not in heads),
        roles={"induction": INDUCTION, "previous-token": PREVIOUS}, edges=PathPatching((), "loss", "resample"))
    return dataclasses.replace(scan, verified=verified, circuit=FakeEvidence(rows))


@pytest.fixture(scope="module")
def drawn():
    scan = wide_scan()
    answer = find_answer(scan)
    return scan, answer, answer_diagram(answer)


def _nodes(svg):
    return {(int(a), int(b)): (int(layer), title, float(x) + NODE_W / 2, float(y) + 15)  # box centres
            for a, b, layer, title, x, y in NODE.findall(svg)}


def test_every_member_is_drawn_in_layer_order(drawn):
    scan, answer, svg = drawn
    nodes = _nodes(svg)
    assert sorted(nodes) == sorted(scan.verified.heads)  # 25 nodes, each member once
    by_layer = sorted(nodes.values(), key=lambda n: (n[0], n[2]))
    for (l1, _, x1, y1), (l2, _, x2, y2) in zip(by_layer, by_layer[1:], strict=False):
        assert (y1 < y2) if l1 < l2 else (y1 == y2 and x1 < x2), (l1, l2, y1, y2)  # one row per layer, top down
    # the previous-token head of layer 23 sits below every earlier layer's head, above layer 29's
    y23 = nodes[(23, 4)][3]
    assert all(y < y23 for layer, _, _, y in nodes.values() if layer < 23)
    assert all(y > y23 for layer, _, _, y in nodes.values() if layer > 23)
    boxes = [(x - NODE_W / 2, y - 15, x + NODE_W / 2, y + 15) for _, _, x, y in nodes.values()]
    assert not any(a != b and a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]
                   for a in boxes for b in boxes)  # no two members overlap


def test_edges_are_drawn_forward_only_and_the_rest_counted(drawn):
    scan, answer, svg = drawn
    nodes = _nodes(svg)
    edges = _edges(svg)
    drawn_pairs = {(src, dst) for src, dst, _ in edges}
    carrying = {(tuple(e.src), tuple(e.dst)) for e in answer.edges}
    assert drawn_pairs == {(s, d) for s, d in carrying if s[0] < d[0]}
    assert drawn_pairs >= {(s, d) for s, d, effect in FORWARD if effect >= 0.05 * 0.9}
    assert len(edges) == len(drawn_pairs)
    for src, dst, points in edges:
        assert src[0] < dst[0]
        assert points[0] == pytest.approx((nodes[src][2], nodes[src][3] + 15))  # the sender's bottom
        assert points[-1] == pytest.approx((nodes[dst][2], nodes[dst][3] - 19))  # above the receiver's top (arrow)
        assert all(y2 >= y1 for (_, y1), (_, y2) in zip(points, points[1:], strict=False))  # never upwards
        for head, (_, _, x, y) in nodes.items():  # it passes no other member's box
            if head not in (src, dst):
                assert not _hits((x - NODE_W / 2, y - 15, x + NODE_W / 2, y + 15), points), (src, dst, head)
    assert "2 edges not from an earlier layer, not drawn" in svg
    assert any(len(points) > 2 for *_, points in edges)  # 0.1 -> 29.0 is routed round the members between


def test_each_node_says_what_the_member_does(drawn):
    from circuitkit._html import escape

    scan, answer, svg = drawn
    for head, (_, title, _, _) in _nodes(svg).items():
        name = f"{head[0]}.{head[1]}"
        assert title == f"head {name}: {escape(answer.explanations[name])}"
        assert "no role" not in title


def test_members_of_a_layer_are_grouped_by_role():
    """Layer 7 holds an unnamed member ranked first and an induction head: the role's head is drawn first."""
    at, _ = diagram_layout([((7, 1), ()), ((7, 5), ("induction",)), ((3, 0), ("previous-token",))])
    assert at[(7, 5)][1] == at[(7, 1)][1] > at[(3, 0)][1]
    assert at[(7, 5)][0] < at[(7, 1)][0]


def test_the_whole_report_draws_the_same_diagram(drawn):
    from circuitkit.report import build_report

    scan, answer, svg = drawn
    page = build_report(scan)
    assert svg in page and page.count('class="ck-members"') == 1
