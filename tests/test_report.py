"""The report package without a browser: self-contained (nothing loads from the network), escaped, deterministic,
its page data and scores.json carry the scan's numbers, sections are a registry, and the summary names the
circuit. Synthetic scans come from ``tests/report_fixtures.py``."""

from __future__ import annotations

import base64
import dataclasses
import gzip
import html
import json
import math
import re

import pytest
import torch

from circuitkit.ranking import head_name, top_heads
from circuitkit.report import (
    GZIP_MIME,
    SECTIONS,
    Section,
    build_report,
    scan_json,
    summary_html,
)
from circuitkit.report.data import QUANT_LEVELS, strongest_edges
from circuitkit.report.page import BASE64_MIME, asset
from tests.report_fixtures import EVIL_NAME, EVIL_TOKEN, PLANTED_COMPOSITION, synthetic_scan

# quantised page data: one step of 1/255 of the scale, rounded to nearest -> at most half a step off
HALF_STEP = 0.5 / QUANT_LEVELS
# page numbers carry 4 significant digits
PAGE_RTOL = 5e-4
# scores.json carries 7 significant digits (float32 precision)
JSON_RTOL = 1e-6


@pytest.fixture(scope="module")
def scan():
    return synthetic_scan()


@pytest.fixture(scope="module")
def report(scan):
    return build_report(scan)


def _data(html: str) -> dict:
    return json.loads(re.search(r'<script type="application/json" id="ck-data">(.*?)</script>', html, re.S).group(1))


def _blobs(html: str) -> dict[str, bytes]:
    out = {}
    for mime, name, text in re.findall(r'<script type="([^"]+)" id="ck-blob-([\w-]+)">([^<]*)</script>', html):
        raw = base64.b64decode(text)
        out[name] = gzip.decompress(raw) if mime == GZIP_MIME else raw
    return out


# attributes and constructs through which a page loads something (script/img/link/iframe, CSS, ES modules)
LOADING_URL = re.compile(
    r"""(?:\b(?:src|href|action|poster|data)\s*=\s*["']?\s*|url\(\s*["']?\s*|\bimport\s*\(?\s*["']\s*|"""
    r"""@import\s+["']?\s*)(?:https?:)?//""",
    re.IGNORECASE,
)


def test_detector_catches_loading_urls():
    # the pattern must be able to fail
    for sample in ['<script src="https://x.org/a.js">', "<link href='http://x/y.css'>", "url(//x/y.png)",
                   'import("https://x/m.js")', "@import 'http://x/s.css'"]:
        assert LOADING_URL.search(sample), sample


def test_no_network_url_anywhere(report):
    assert not LOADING_URL.findall(report)
    assert "://" not in report  # no third-party library any more: no URL of any kind, not even as data
    assert "<script src" not in report and "<link" not in report


def test_page_script_and_style_are_package_assets_inlined_once(report):
    script, style = asset("report.js"), asset("report.css")
    assert len(script) > 5_000 and "circuitkitReport" in script
    assert report.count(script.strip()[:200]) == 1
    assert report.count(style.strip()[:200]) == 1
    assert report.count("<script>") == 1  # one executable script: the loader


def test_circuitsvis_bundle_is_inlined_once_packed_and_offline(scan, report):
    from circuitkit.report.page import CIRCUITSVIS_ID, circuitsvis_bundle
    from circuitkit.viz.attention import attention_heads, parse_rendered

    packed = re.findall(rf'<script type="{GZIP_MIME}" id="{CIRCUITSVIS_ID}">([^<]*)</script>', report)
    assert len(packed) == 1
    bundle = gzip.decompress(base64.b64decode(packed[0])).decode("utf-8")
    assert bundle == circuitsvis_bundle()
    # the oracle: the bundle of another view CircuitsVis renders offline, less its source-map comment
    other = parse_rendered(attention_heads(torch.rand(2, 3, 3).tril(), ["a", "b", "c"])).bundle
    assert bundle == other.replace("\n//# sourceMappingURL=iife.js.map", "")
    assert "var CircuitsVis=" in bundle and "sourceMappingURL" not in bundle and len(bundle) > 500_000
    # only as a packed blob: never as a script the page would load, nor readable (URLs included) in the page text
    assert bundle[:200] not in report and "var CircuitsVis=" not in report
    plain = build_report(scan, compress=False)
    assert base64.b64decode(re.search(rf'id="{CIRCUITSVIS_ID}">([^<]*)<', plain).group(1)).decode() == bundle


def test_circuit_view_shows_the_called_heads_at_most_eight(scan, report):
    from circuitkit.report.data import CIRCUIT_VIEW_HEADS, circuit_view_heads

    n_heads = scan.model.n_heads
    assert _data(report)["circuit_view"] == [{"head": 1, "role": "prev"}, {"head": n_heads, "role": "induct"}]
    assert 'id="ck-cv-circuit"' in report
    # many called heads: half the places per role, best score first, shown in (layer, head) order
    big = synthetic_scan(6, 8)
    ind = top_heads(big.head_scores["induction"], 10)
    prev = top_heads(big.head_scores["previous_token"], 10)
    many = dataclasses.replace(big, induction_heads=tuple(h for h, _ in ind),
                               previous_token_heads=tuple(h for h, _ in prev if h not in dict(ind)))
    chosen = circuit_view_heads(many)
    assert len(chosen) == CIRCUIT_VIEW_HEADS and chosen == sorted(chosen)
    assert [h for h, r in chosen if r == "induct"] == sorted(h for h, _ in ind[:4])
    # none called: the best head by each score, so the view is never empty
    none = dataclasses.replace(big, induction_heads=(), previous_token_heads=())
    assert {r for _, r in circuit_view_heads(none)} == {"best induct", "best prev"}


def test_token_strings_and_names_are_escaped(scan, report):
    assert EVIL_TOKEN not in report and "<img" not in report
    assert EVIL_NAME not in report and "synthetic &lt;model&gt; &amp; &quot;co&quot;" in report
    # the visible token list, escaped, once per occurrence
    assert report.count("<code>&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;&amp;amp;</code>") == 2
    # inside JSON the token decodes back to itself
    assert _data(report)["tokens"].count(EVIL_TOKEN) == 2
    # only the page's own script tags close
    assert report.count("</script>") == report.count("<script")


def test_summary_html_is_escaped_and_has_no_script(scan):
    text = summary_html(scan)
    assert "<script" not in text and EVIL_NAME not in text and "&lt;model&gt;" in text
    assert "Induction heads" in text and 'data-head="1.0"' in text


def test_report_is_deterministic(scan, report):
    assert build_report(scan) == report
    again = build_report(synthetic_scan())  # a separately built equal scan
    assert again == report
    assert json.dumps(scan_json(synthetic_scan())) == json.dumps(scan_json(scan))
    assert not re.search(r"20\d\d-\d\d-\d\d", report)


def test_uncompressed_report_holds_the_same_data(scan, report):
    plain = build_report(scan, compress=False)
    assert f'type="{GZIP_MIME}"' not in plain and f'type="{BASE64_MIME}"' in plain
    assert _blobs(plain) == _blobs(report) and _data(plain) == _data(report)


def test_page_data_carries_the_scan(scan, report):
    data, blobs = _data(report), _blobs(report)
    n_layers, n_heads = scan.model.n_layers, scan.model.n_heads
    columns = {c["key"]: c for c in data["columns"]}
    assert list(columns) == [*scan.head_scores, "attribution", "ablation"]
    for name in scan.head_scores:
        assert columns[name]["values"] == pytest.approx(scan.head_scores[name].flatten().tolist(), rel=PAGE_RTOL)
        marked = min(scan.settings.top_k, n_layers * n_heads // 8)  # 1 of 8 heads: see data.columns
        best = [a * n_heads + b for (a, b), _ in top_heads(scan.head_scores[name], marked)]
        assert columns[name]["top"] == best
    # ablation: blank (None) exactly where no exact ablation ran
    exact = scan.ablation.exact.flatten().tolist()
    assert [v is not None for v in columns["ablation"]["values"]] == exact
    # patterns: the causal triangle of every head, quantised
    pos = len(scan.tokens)
    rows, cols = torch.tril_indices(pos, pos)
    decoded = torch.tensor(list(blobs["patterns"]), dtype=torch.float32).reshape(n_layers * n_heads, -1) / 255
    expected = scan.patterns.reshape(n_layers * n_heads, pos, pos)[:, rows, cols]
    torch.testing.assert_close(decoded, expected, atol=HALF_STEP + 1e-7, rtol=0)
    # composition: layer-pair blocks src < dst, scaled to the maximum
    comp = data["composition"]["K"]
    block = torch.tensor(list(blobs["composition-K"]), dtype=torch.float32).reshape(-1, n_heads, n_heads)
    torch.testing.assert_close(block[0] / 255 * comp["scale"], scan.composition["K"][0, :, 1, :],
                               atol=HALF_STEP * comp["scale"] + 1e-6, rtol=0)
    assert comp["baseline"] == 0.25


def test_strongest_edges_against_a_sorting_oracle():
    g = torch.Generator().manual_seed(3)
    n_layers, n_heads, k = 3, 4, 3
    scores = torch.randint(0, 4, (n_layers, n_heads, n_layers, n_heads), generator=g).float() / 4  # many ties
    out_edges, in_edges = strongest_edges(scores, k)
    n = n_layers * n_heads
    flat = scores.reshape(n, n)
    for i in range(n):
        valid = [j for j in range(n) if i // n_heads < j // n_heads]
        oracle = sorted(valid, key=lambda j: (-float(flat[i, j]), j))[:k]
        assert [j for j, _ in out_edges[i]] == oracle
        valid_in = [j for j in range(n) if j // n_heads < i // n_heads]
        oracle_in = sorted(valid_in, key=lambda j: (-float(flat[j, i]), j))[:k]
        assert [j for j, _ in in_edges[i]] == oracle_in


def test_scores_json_holds_every_score_and_the_causal_checks(scan):
    data = json.loads(json.dumps(scan_json(scan), allow_nan=False))
    assert data["format"] == 4 and data["model"]["n_heads"] == 4 and data["settings"]["block_len"] == 6
    for name, values in scan.head_scores.items():
        assert sum(data["head_scores"][name], []) == pytest.approx(values.flatten().tolist(), rel=JSON_RTOL)
        assert data["scores"][name]["short"] == scan.head_scores.definitions[name].short
        expected = [head_name(h) for h, _ in top_heads(values, scan.settings.top_k)]
        assert [entry["head"] for entry in data["top_heads"][name]] == expected
    ablation = data["ablation"]
    assert ablation["ablated"] == [head_name(h) for h in scan.ablation.exact.nonzero().tolist()]
    for layer, row in enumerate(ablation["effect"]):
        for head, value in enumerate(row):
            assert (value is None) == (not bool(scan.ablation.exact[layer, head]))
    assert data["agreement"] == {"n_exact": 6, "spearman": 0.93,
                                 "largest_miss": {"head": "1.0", "exact": 2.0, "estimate": pytest.approx(
                                     float(scan.attribution.effect[1, 0]), rel=JSON_RTOL)}}
    assert data["composition"]["K"]["baseline"] == {"mean": 0.25, "std": 0.02}
    assert data["composition"]["K"]["top_edges"][0] == {"src": "0.1", "dst": "1.0", "score": PLANTED_COMPOSITION}
    assert data["induction_heads"] == ["1.0"] and data["previous_token_heads"] == ["0.1"]
    assert data["induction_loss"]["first_copy"] > data["induction_loss"]["repeated_copies"]
    assert data["evidence"]["rows"][0]["channel"] == "k" and data["circuit"] is None
    assert list(data["composition"]) == ["Q", "K", "V"]


def test_scores_json_without_optional_parts(scan):
    bare = dataclasses.replace(scan, attribution=None, ablation=None, agreement=None, circuit=None, composition={},
                               baselines={}, edges={}, spectra={})
    data = scan_json(bare)
    assert data["ablation"] is None and data["evidence"] is None and data["composition"] == {}
    html = build_report(bare)
    assert 'id="ck-sec-circuit"' not in html and 'id="ck-sec-composition"' not in html
    assert 'id="ck-sec-heads"' in html


def test_summary_names_the_circuit(scan, report):
    summary = report.split('id="ck-sec-summary"')[1].split("</section>")[0]
    text = html.unescape(re.sub(r"<[^>]+>", "", summary))
    induct, prev = float(scan.head_scores["induction"][1, 0]), float(scan.head_scores["previous_token"][0, 1])
    first, repeated = scan.induction_loss.first_copy, scan.induction_loss.repeated_copies
    assert f"Induction heads: 1.0 (induction {induct:.2f})" in text
    assert f"Previous-token heads: 0.1 (prev {prev:.2f})" in text
    assert ("They connect (composition score; random K 0.25; edge effect on the loss in nats by path patching): "
            "0.1 \u2192 1.0 K 0.90, effect +0.90.") in text
    assert f"repeated copies {repeated:.2f} nats vs {first:.2f} on the first copy (in-context copying works)" in text
    assert "raises the repeated-copies loss by 1.0 +2.00 nats" in text
    assert '<svg class="ck-diagram"' in summary


def test_summary_without_an_induction_circuit(scan):
    none_found = dataclasses.replace(scan, induction_heads=(), previous_token_heads=())
    text = html.unescape(re.sub(r"<[^>]+>", "", summary_html(none_found)))
    assert "No induction circuit found" in text and "the best is 1.0" in text


def test_circuit_section_flags_disagreement_between_weights_and_effect(report):
    section = report.split('id="ck-sec-circuit"')[1].split("</section>")[0]
    assert "strong in the weights, carries nothing" in section
    assert "carries an effect without weight support" in section
    # the graph draws exact (patched) effects only: the weight-only edge is dashed there; the effect-only edge has
    # an estimate only and is flagged in the table
    assert section.count('stroke-dasharray="5 4"') == 1


def test_a_new_section_is_one_function(scan, monkeypatch):
    def custom(scan):
        return Section("custom", "My <own> section", f"<p>{len(scan.tokens)} tokens</p>")

    monkeypatch.setattr("circuitkit.report.sections.SECTIONS", [*SECTIONS, custom])
    monkeypatch.setattr("circuitkit.report.page.SECTIONS", [*SECTIONS, custom])
    html = build_report(scan)
    assert '<section id="ck-sec-custom" class="ck-section" data-png="custom"><h2>My &lt;own&gt; section</h2>' in html
    assert '<a href="#ck-sec-custom">' in html and "13 tokens" in html


def test_registered_score_reaches_table_and_json(scan):
    # a score the library has never heard of: it flows through by the definitions alone
    from circuitkit.detect.registry import weight_score
    from circuitkit.detect.scores import HeadScores

    definition = weight_score("successor", short="succ", description="a test <score>", compute=lambda w: None,
                              neutral=0.0)
    hs = scan.head_scores
    scores = {**{n: hs[n] for n in hs}, "successor": torch.full((2, 4), 0.5)}
    definitions = {**hs.definitions, "successor": definition}
    extended = dataclasses.replace(scan, head_scores=HeadScores(
        scores, definitions, tokens=hs.tokens, patterns=hs.patterns, block_len=6, n_repeats=2, bos=0))
    html = build_report(extended)
    assert [c["short"] for c in _data(html)["columns"]][-3:] == ["succ", "attr", "ablate"]
    assert "a test &lt;score&gt;" in html
    assert scan_json(extended)["scores"]["successor"]["description"] == "a test <score>"


def test_numbers_are_json_safe():
    from circuitkit.report.data import number, plain

    assert number(float("nan")) is None and number(float("inf")) is None and number(-0.0) == 0.0
    assert number(1 / 3) == 0.3333333
    assert plain({"a": (1.0, float("nan")), 2: torch.tensor([0.5])}) == {"a": [1.0, None], "2": [0.5]}
    assert math.isfinite(number(1e-30))


@pytest.mark.slow
def test_largest_report_stays_under_the_budget():
    from circuitkit.report import MAX_REPORT_BYTES
    from tests.report_fixtures import sized_scan

    size = len(build_report(sized_scan("48x25")).encode("utf-8"))
    assert size < MAX_REPORT_BYTES, f"{size / 2**20:.2f} MB"


def test_edge_graph_labels_the_strongest_edges_when_labels_would_collide():
    """Edges whose label spots collide (all midpoints of a two-layer graph are close): the strongest edge keeps its
    label, a weaker one does not take its place, and the labels are drawn over every curve."""
    from circuitkit.report.figures import GraphEdge, head_graph

    edges = [GraphEdge((0, 1), (1, h), "#c00", width, f"edge {h}", label)
             for h, width, label in [(0, 1.6, "+0.0049"), (1, 5.5, "+0.16"), (2, 1.7, "+0.005")]]
    svg = head_graph(2, 4, edges)
    assert ">+0.16</text>" in svg and ">+0.0049</text>" not in svg
    assert svg.rindex("<path") < svg.index("<text x=\"", svg.index("</path>"))  # text after the last curve


def test_circuit_diagram_greys_links_without_a_causal_figure_and_says_so():
    from circuitkit.report.figures import UNMEASURED_COLOUR, circuit_diagram
    from circuitkit.report.summary import Link, Story

    links = [Link((0, 1), (1, 3), "K", 0.23, 0.12, 0.16, "path patching"), Link((0, 0), (1, 3), "K", 0.19, 0.12)]
    story = Story([((1, 3), 0.94)], [((0, 1), 0.49), ((0, 0), 0.42)], links, 4.3, 0.03, [], None)
    svg = circuit_diagram(story)
    assert svg.count(f'stroke="{UNMEASURED_COLOUR}"') == 1 and "(grey: none measured)" in svg
    story.links[:] = links[1:]  # no causal figure anywhere: the mode's colour, no grey caption
    svg = circuit_diagram(story)
    assert UNMEASURED_COLOUR not in svg and "grey" not in svg
