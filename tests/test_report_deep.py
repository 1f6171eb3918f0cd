"""The report at 30+ layers: edge graphs drawn over the layers their edges join, labels that never overlap (left out
rather than piled up; every node keeps its tooltip), axis labels on the composition heatmaps, the evidence table's
flag at the answer's threshold, and at narrow widths a table-row click brings the head panel into view."""

from __future__ import annotations

import re

import pytest

from circuitkit.report import build_report
from circuitkit.report.figures import CHAR_WIDTH, GRAPH_WIDTH, LABEL_HEIGHT, GraphEdge, head_graph
from tests.report_fixtures import sized_scan

_TEXT = re.compile(r'<text x="([\d.-]+)" y="([\d.-]+)"(?: text-anchor="(\w+)")?[^>]*>([^<]*)</text>')


def _label_boxes(svg: str) -> list[tuple[str, tuple[float, float, float, float]]]:
    """Every label of a head graph but the axis and legend (y below the legend, above the axis) as (text, box)."""
    out = []
    for x, y, anchor, text in _TEXT.findall(svg):
        x, y, w = float(x), float(y), CHAR_WIDTH * len(text)
        x0 = {"start": x, "end": x - w, "middle": x - w / 2}[anchor or "start"]
        out.append((text, (x0, y - LABEL_HEIGHT + 2, x0 + w, y + 2)))
    return out


def _overlap(a, b) -> bool:
    return not (a[2] <= b[0] or a[0] >= b[2] or a[3] <= b[1] or a[1] >= b[3])


def _circuit_in_first_layers() -> list[GraphEdge]:
    """Dense edges among heads 0-8 of layers 0-2 (a 30-layer model's circuit), each with a score label."""
    edges = []
    for src_layer, dst_layer in ((0, 1), (0, 2), (1, 2)):
        for h in range(9):
            edges.append(GraphEdge((src_layer, h), (dst_layer, (h * 4) % 9), "#c00", 1.0 + h / 3, f"edge {h}",
                                   f"-0.00{h}"))
    return edges


def test_edges_are_drawn_over_the_layers_they_join():
    svg = head_graph(30, 9, _circuit_in_first_layers())
    xs = sorted({float(x) for x in re.findall(r'<circle cx="([\d.]+)"', svg)})
    assert len(xs) == 3 and xs[-1] - xs[0] > 0.8 * GRAPH_WIDTH  # layers 0-2 span the width, not a tenth of it
    assert "layers 0-2 of 30 (the layers these edges join)" in svg
    assert ">L0<" in svg and ">L2<" in svg and ">L3<" not in svg


@pytest.mark.parametrize("n_heads", [9, 25])
def test_labels_never_overlap_and_every_node_keeps_a_tooltip(n_heads):
    edges = _circuit_in_first_layers() + [GraphEdge((5, h), (6, (h + 1) % n_heads), "#00c", 2.0, "e", "+0.17")
                                          for h in range(n_heads)]
    svg = head_graph(30, n_heads, edges)
    boxes = [(t, b) for t, b in _label_boxes(svg) if b[1] > 24 and not t.startswith(("L", "layers"))]
    assert len(boxes) > 10  # labels are drawn, not all dropped
    for i, (text_a, a) in enumerate(boxes):
        for text_b, b in boxes[i + 1:]:
            assert not _overlap(a, b), (text_a, text_b)
    nodes = re.findall(r'<g class="ck-node" data-head="([\d.]+)" tabindex="0"><title>head \1</title>', svg)
    assert len(nodes) == len({h for e in edges for h in (e.src, e.dst)})


def test_composition_heatmaps_have_axis_labels():
    html = build_report(sized_scan("30x9"))
    for canvas in ("ck-comp-layers", "ck-comp-heads"):
        assert f'<canvas id="{canvas}"></canvas><div class="ck-xlab" id="{canvas}-x">destination' in html
        assert f'<div class="ck-ylab" id="{canvas}-y">source' in html


def test_effect_only_flag_needs_the_answers_threshold():
    """The flag "carries an effect without weight support" needs |effect| >= 0.05 nats (the threshold the answer
    and faithfulness use), besides half the table's largest: recomputed for every row of a scan of a 30-layer
    random model, whose edges carry thousandths of a nat."""
    import torch

    import circuitkit as ck
    from circuitkit.circuits.evidence import MIN_EFFECT, STRONG_EFFECT_FRACTION, WEAK_WEIGHT_QUANTILE
    from circuitkit.circuits.faithfulness import MIN_GAP
    from tests.conftest import boot_bridge

    assert MIN_EFFECT == MIN_GAP
    # seed 2: one low-weight edge at half the largest effect (0.017 nats), the case the threshold is for
    model = boot_bridge(n_layers=30, n_heads=9, d_model=36, d_head=4, d_vocab=50, n_ctx=32, seed=2)
    result = ck.scan(model, tokens=ck.RepeatedTokens(batch=2, block_len=6), ablate="none", circuit_rank="effect")
    assert result.circuit is not None
    rows = result.circuit.rows
    largest = max(abs(r.effect) for r in rows)
    L = result.model.n_layers
    valid = (torch.arange(L)[:, None, None, None] < torch.arange(L)[None, None, :, None]).expand(L, 9, L, 9)
    weak = {c.lower(): torch.quantile(s[valid], WEAK_WEIGHT_QUANTILE).item() for c, s in result.composition.items()}
    small_but_relatively_strong = 0
    for r in rows:
        if r.composition is None:
            continue
        low_weight = r.composition < weak[r.channel]
        strong = abs(r.effect) >= STRONG_EFFECT_FRACTION * largest
        small_but_relatively_strong += low_weight and strong and abs(r.effect) < MIN_EFFECT
        assert r.effect_only == (low_weight and strong and abs(r.effect) >= MIN_EFFECT), r.name
    # the case the threshold is for occurs: a low-weight edge at half the (tiny) largest effect, not flagged
    assert largest < MIN_EFFECT and small_but_relatively_strong >= 1


def test_narrow_page_row_click_brings_the_head_panel_into_view(tmp_path):
    from tests.conftest import require_browser

    executable = require_browser()
    from playwright.sync_api import sync_playwright

    from circuitkit.report import CHROMIUM_FLAGS

    path = tmp_path / "report.html"
    path.write_text(build_report(sized_scan("30x9")), encoding="utf-8")
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=executable, args=list(CHROMIUM_FLAGS))
        try:
            page = browser.new_page(viewport={"width": 800, "height": 900})
            page.route("**/*", lambda route: route.continue_() if route.request.url == path.as_uri()
                       else route.abort())
            page.goto(path.as_uri())
            page.wait_for_function("document.documentElement.dataset.ckReady !== undefined", timeout=60_000)
            row = page.locator("#ck-table tbody tr").nth(3)
            row.scroll_into_view_if_needed()
            name = row.get_attribute("data-head")
            before = page.evaluate("document.getElementById('ck-detail').getBoundingClientRect().top")
            assert before > 900  # the panel is below the fold: the old page changed it out of sight
            row.click()
            page.wait_for_function(f"document.getElementById('ck-detail').dataset.head === '{name}'")
            top = page.evaluate("document.getElementById('ck-detail').getBoundingClientRect().top")
            assert -1 <= top < 900, top
            labels = page.evaluate("['ck-comp-heads-x', 'ck-comp-heads-y', 'ck-comp-layers-x']"
                                   ".map(id => document.getElementById(id).textContent)")
            assert labels[0].startswith("destination heads: layers ") and labels[1].startswith("source heads: layers")
            assert labels[2] == "destination layer 0 \u2192 29"
        finally:
            browser.close()


def test_circuit_diagram_labels_are_crossed_by_no_other_link():
    """The bundled circuit's four K-edges form an X (each previous-token head feeds both induction heads): every
    label is drawn, beside its own link, and no other link passes through it."""
    from types import SimpleNamespace

    from circuitkit.report.figures import _crosses, answer_diagram

    edge = SimpleNamespace
    edges = [edge(src=(0, 1), dst=(1, 3), channel="k", effect=0.18), edge(src=(0, 1), dst=(1, 1), channel="k",
             effect=0.11), edge(src=(0, 0), dst=(1, 3), channel="k", effect=0.08),
             edge(src=(0, 0), dst=(1, 1), channel="k", effect=0.06)]
    answer = SimpleNamespace(edges=edges, faithfulness=0.88, circuit=[((0, 1), ("previous-token",)),
                             ((0, 0), ("previous-token",)), ((1, 3), ("induction",)), ((1, 1), ("induction",))])
    svg = answer_diagram(answer)
    lines = [tuple(map(float, m)) for m in re.findall(
        r'<line x1="([\d.]+)" y1="([\d.]+)" x2="([\d.]+)" y2="([\d.]+)"', svg)]
    labels = [(t, b) for t, b in _label_boxes(svg) if t.startswith("K ")]
    assert sorted(t for t, _ in labels) == ["K +0.06", "K +0.08", "K +0.11", "K +0.18"]
    for text, box in labels:
        crossing = [line for line in lines if _crosses(box, *line)]
        assert len(crossing) <= 1, (text, crossing)  # at most its own link, which it sits beside


@pytest.mark.parametrize("total, chosen", [(5, 2), (336, 61), (79813, 5423), (79813, 79000), (1_000_000, 9)])
def test_faithfulness_curve_tick_labels_stay_inside_and_apart(total, chosen):
    """The x axis's numbers (the circuit's size, the total, powers of 4) fit the drawing and do not overlap: a task's
    edge curve of 79,813 edges printed its total past the right edge."""
    from circuitkit.report.figures import faithfulness_curve

    curve = [(0, 0.0), (1, 0.2), (chosen, 0.8), (total, 1.0)]
    svg = faithfulness_curve(curve, 0.8, chosen, total, unit="edges")
    width = float(re.search(r'<svg class="ck-curve" width="(\d+)"', svg).group(1))
    ticks = [(text, x0, x1) for text, (x0, _, x1, _) in _label_boxes(svg) if text.isdigit()]
    shown = {t for t, _, _ in ticks}
    assert {str(chosen), "0"} <= shown  # the total too, unless the circuit's size sits on it (the caption says both)
    assert (str(total) in shown) == (chosen != 79000)
    for text, x0, x1 in ticks:
        assert 0 <= x0 and x1 <= width, (text, x0, x1)
    ticks.sort(key=lambda t: t[1])
    for (a, _, a1), (b, b0, _) in zip(ticks[:-1], ticks[1:], strict=True):
        assert a1 <= b0, (a, b)
