"""The offline report: self-contained (no network URL that loads anything), small, escaped, deterministic,
and its views carry the scores they show. ``synthetic_results`` is also used by the browser test."""

from __future__ import annotations

import base64
import gzip
import json
import re
from dataclasses import dataclass

import pytest
import torch

from circuitkit import CircuitkitError, Edge
from circuitkit.report import (
    GZIP_MIME,
    MAX_REPORT_BYTES,
    ModelSummary,
    ScanResults,
    build_report,
    scores_json,
    top_heads,
    write_report,
)

EVIL_TOKEN = "</script><img src=x onerror=alert(1)>&amp;"
# patterns are shown to PATTERN_DECIMALS=4 decimals
PATTERN_ATOL = 0.5e-4



@dataclass(frozen=True)
class FakeAblation:
    clean_loss: float
    loss: torch.Tensor
    delta: torch.Tensor


@dataclass(frozen=True)
class FakeInductionLoss:
    first_half: float
    repeated_half: float


def synthetic_results(n_layers: int = 2, n_heads: int = 4, block: int = 6, d_head: int = 8, seed: int = 0):
    """Scan-shaped results built from seeded random tensors: [BOS] + a block of tokens repeated twice."""
    g = torch.Generator().manual_seed(seed)
    pos = 1 + 2 * block
    scores = {name: torch.rand(n_layers, n_heads, generator=g) for name in ("induction", "previous_token")}
    causal = torch.ones(pos, pos, dtype=torch.bool).triu(1)
    patterns = {
        head: torch.randn(pos, pos, generator=g).masked_fill(causal, float("-inf")).softmax(-1)
        for head in [(n_layers - 1, 0), (0, 1), (0, 2)]
    }
    composition = {}
    src = torch.arange(n_layers)[:, None, None, None]
    dst = torch.arange(n_layers)[None, None, :, None]
    for mode in "QKV":
        raw = torch.rand(n_layers, n_heads, n_layers, n_heads, generator=g)
        composition[mode] = torch.where(src < dst, raw, torch.zeros(()))
    edges = {
        mode: [
            Edge((0, h), (n_layers - 1, (h + 1) % n_heads), float(composition[mode][0, h, -1, (h + 1) % n_heads]))
            for h in range(min(3, n_heads))
        ]
        for mode in "QKV"
    }
    tokens = ["<BOS>"] + [f"t{i}" for i in range(block - 1)] + [EVIL_TOKEN]
    tokens = tokens + tokens[1:]
    loss = torch.rand(n_layers, n_heads, generator=g) + 1.0
    return ScanResults(
        model=ModelSummary("synthetic <model>", n_layers, n_heads, d_model=n_heads * d_head, d_head=d_head,
                           d_vocab=100, n_ctx=64),
        head_scores=scores,
        tokens=tokens,
        patterns=patterns,
        composition=composition,
        baselines={"Q": 0.25, "K": 0.25, "V": 0.3},
        edges=edges,
        spectra={"OV": torch.rand(n_layers, n_heads, d_head, generator=g).sort(-1, descending=True).values},
        ablation=FakeAblation(clean_loss=1.0, loss=loss, delta=loss - 1.0),
        induction_loss=FakeInductionLoss(first_half=4.5, repeated_half=0.5),
        settings={"seq_len": block, "seed": 0},
        top_k=3,
    )


def _views(html: str) -> dict[str, tuple[str, dict]]:
    """view id -> (kind, decoded JSON data) for every view in the report."""
    out = {}
    for match in re.finditer(r'<div class="ck-view [^"]*" id="([^"]+)" data-kind="(\w+)"', html):
        view_id, kind = match.groups()
        data = re.search(rf'<script type="application/json" id="{view_id}-data">(.*?)</script>', html, re.DOTALL)
        out[view_id] = (kind, json.loads(data.group(1)))
    return out


def _libraries(html: str) -> dict[str, str]:
    packed = re.findall(rf'<script type="{GZIP_MIME}" id="ck-lib-(\w+)">([^<]*)</script>', html)
    return {name: gzip.decompress(base64.b64decode(data)).decode("utf-8") for name, data in packed}


@pytest.fixture(scope="module")
def results():
    return synthetic_results()


@pytest.fixture(scope="module")
def report(results):
    return build_report(results)


# attributes and constructs through which a page loads something (script/img/link/iframe, CSS, ES modules)
LOADING_URL = re.compile(
    r"""(?:\b(?:src|href|action|poster|data)\s*=\s*["']?\s*|url\(\s*["']?\s*|\bimport\s*\(?\s*["']\s*|"""
    r"""@import\s+["']?\s*)(?:https?:)?//""",
    re.IGNORECASE,
)


def test_no_network_url_that_loads_anything(report):
    assert not LOADING_URL.findall(report)
    for name, code in _libraries(report).items():
        # plotly.js holds map-tile attributions (<a href="https://...">) as data; nothing is fetched at load
        # time, which the browser test checks with every request blocked. No ES-module import from the net:
        assert not re.search(r"""\bimport\s*\(?\s*["']https?://""", code), name
    assert "unpkg.com" not in report and "cdn.plot.ly" not in report


def test_detector_catches_loading_urls():
    # the pattern above must be able to fail
    for sample in ['<script src="https://x.org/a.js">', "<link href='http://x/y.css'>", "url(//x/y.png)",
                   'import("https://x/m.js")', "@import 'http://x/s.css'"]:
        assert LOADING_URL.search(sample), sample


def test_each_library_is_inlined_once(report):
    libraries = _libraries(report)
    assert sorted(libraries) == ["circuitsvis", "plotly"]
    assert report.count(f'<script type="{GZIP_MIME}"') == 2
    assert "var CircuitsVis" in libraries["circuitsvis"] and "sourceMappingURL" not in libraries["circuitsvis"]
    assert "Plotly" in libraries["plotly"]


def test_uncompressed_report_inlines_plain_scripts_once(results):
    html = build_report(results, compress=False)
    assert html.count('<script id="ck-lib-plotly">') == 1 and html.count('<script id="ck-lib-circuitsvis">') == 1
    assert html.count("var CircuitsVis=") == 1
    # outside the two library scripts (whose string data hold attribution links) nothing loads from the net
    outside = re.sub(r'<script id="ck-lib-\w+">.*?</script>', "", html, flags=re.DOTALL)
    assert len(outside) < len(html) // 10
    assert not LOADING_URL.findall(outside)


def test_token_strings_are_escaped(report):
    assert EVIL_TOKEN not in report
    assert "<img" not in report.split('id="ck-lib-')[0]
    assert "&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;&amp;amp;" in report  # the visible token list
    # inside JSON, the token decodes back to itself
    (_, spec), = [v for v in _views(report).values() if v[0] == "circuitsvis"]
    assert spec["props"]["tokens"].count(EVIL_TOKEN) == 2
    assert "synthetic &lt;model&gt;" in report


def test_views_carry_the_scores_they_show(results, report):
    views = _views(report)
    by_label = {}
    for view_id, (kind, spec) in views.items():
        label = re.search(rf'id="{view_id}" data-kind="\w+" data-label="([^"]+)"', report).group(1)
        by_label[label] = (kind, spec)
    assert set(by_label) >= {"head-score-induction", "head-score-previous_token", "attention-heads",
                             "composition-Q", "composition-K", "composition-V", "composition-graph",
                             "spectra-OV", "ablation-delta"}
    z = by_label["head-score-induction"][1]["data"][0]["z"]
    assert _decode(z) == pytest.approx(results.head_scores["induction"].double().flatten().tolist())
    props = by_label["attention-heads"][1]["props"]
    expected = torch.stack(list(results.patterns.values()))
    torch.testing.assert_close(torch.tensor(props["attention"]), expected, atol=PATTERN_ATOL, rtol=0)
    assert props["attentionHeadNames"] == ["1.0", "0.1", "0.2"]
    assert by_label["composition-K"][1]["data"][0]["zmid"] == 0.25
    delta = by_label["ablation-delta"][1]["data"][0]
    assert _decode(delta["z"]) == pytest.approx(results.ablation.delta.double().flatten().tolist())


def _decode(array) -> list[float]:
    """plotly's JSON typed arrays ({"dtype": "f8", "bdata": base64}) or plain nested lists, flattened."""
    import numpy as np

    if isinstance(array, dict):
        return np.frombuffer(base64.b64decode(array["bdata"]), dtype=array["dtype"]).astype(float).tolist()
    return np.asarray(array, dtype=float).flatten().tolist()


def test_report_is_deterministic(results, report):
    assert build_report(results) == report
    assert not re.search(r"20\d\d-\d\d-\d\d", report.split('id="ck-lib-')[0])


@pytest.mark.slow
def test_twelve_by_twelve_report_is_under_5_mb():
    big = synthetic_results(n_layers=12, n_heads=12, block=40, d_head=64, seed=1)
    size = len(build_report(big).encode("utf-8"))
    assert size < MAX_REPORT_BYTES, f"{size / 2**20:.2f} MB"


def test_scores_json_round_trips_and_ranks(results):
    data = json.loads(json.dumps(scores_json(results), allow_nan=False))
    assert data["model"]["n_heads"] == 4
    flat = [value for row in data["head_scores"]["induction"] for value in row]
    assert flat == pytest.approx(results.head_scores["induction"].flatten().tolist())
    best = top_heads(results.head_scores["induction"], 3)
    assert [entry["head"] for entry in data["top_heads"]["induction"]] == [f"{ly}.{h}" for (ly, h), _ in best]
    scores = [entry["score"] for entry in data["top_heads"]["induction"]]
    assert scores == sorted(scores, reverse=True)
    assert data["composition"]["V"]["baseline"] == 0.3 and len(data["composition"]["V"]["top_edges"]) == 3
    assert data["ablation"]["clean_loss"] == 1.0


def test_top_heads_against_sorting():
    scores = torch.tensor([[0.1, 0.9, 0.3], [0.8, 0.2, 0.95]])
    assert top_heads(scores, 3) == [((1, 2), pytest.approx(0.95)), ((0, 1), pytest.approx(0.9)),
                                    ((1, 0), pytest.approx(0.8))]


def test_write_report_to_unwritable_path_is_a_circuitkit_error(results, tmp_path):
    with pytest.raises(CircuitkitError, match="cannot write"):
        write_report(results, tmp_path / "missing-dir" / "report.html")
    path = write_report(results, tmp_path / "report.html")
    assert path.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"head_scores": {}}, "non-empty mapping"),
        ({"head_scores": {"induction": torch.rand(3, 4)}}, "of shape \\(2, 4\\)"),
        ({"composition": {"Q": torch.rand(2, 4, 2)}}, "expected shape \\(2, 4, 2, 4\\)"),
        ({"tokens": ["a"]}, "pos = len\\(tokens\\) = 1"),
        ({"top_k": 0}, "positive int"),
    ],
    ids=["no-scores", "scores-shape", "composition-shape", "tokens-length", "top-k"],
)
def test_scan_results_rejects_inconsistent_input(results, change, message):
    fields = {**vars(results), **change}
    with pytest.raises(CircuitkitError, match=message):
        ScanResults(**fields)


def test_top_heads_puts_undefined_scores_last():
    scores = torch.tensor([[float("nan"), 0.1], [0.3, 0.2]])
    assert [head for head, _ in top_heads(scores, 4)] == [(1, 0), (1, 1), (0, 1), (0, 0)]
