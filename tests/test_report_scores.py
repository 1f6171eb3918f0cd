"""scores.json format 4: every written file validates against the JSON Schema shipped in the package, carries a
unit for every quantity, and the verified circuit's figures equal the scan's."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

import circuitkit as ck
from circuitkit import RepeatedTokens, zoo
from circuitkit.report import build_report, scan_json
from circuitkit.report.data import JSON_FORMAT, UNITS
from tests.report_fixtures import SIZES, sized_scan, synthetic_scan

SCHEMA = json.loads((Path(ck.__file__).parent / "report" / "scores.schema.json").read_text())


def validate(data: dict) -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    jsonschema.Draft202012Validator(SCHEMA).validate(data)


@pytest.fixture(scope="module")
def zoo_scan():
    return ck.scan(zoo.load(), tokens=RepeatedTokens(batch=4))


def test_a_real_scan_writes_valid_scores_with_its_circuit(zoo_scan, tmp_path):
    saved = zoo_scan.save(tmp_path)
    data = json.loads(saved.scores.read_text())
    validate(data)
    assert data["format"] == JSON_FORMAT == 4 and data["units"] == UNITS
    circuit, verified = data["circuit"], zoo_scan.verified
    assert circuit["heads"] == [f"{a}.{b}" for a, b in verified.heads]
    assert circuit["faithfulness"] == pytest.approx(verified.faithfulness, rel=1e-6)
    assert circuit["necessity"] == pytest.approx(verified.necessity, rel=1e-6)
    assert [p["n_heads"] for p in circuit["curve"]] == [p.size for p in verified.curve]
    patched = {(e.src, e.dst, e.channel): e.effect for e in verified.edges.edges}
    for edge in circuit["edges"]:  # exact effects only, each the patched figure
        key = (tuple(map(int, edge["src"].split("."))), tuple(map(int, edge["dst"].split("."))), edge["channel"])
        assert edge["effect"] == pytest.approx(patched[key], rel=1e-6, abs=1e-9)
    assert data["attribution"]["method"] == "gradient" and data["attribution"]["steps"] == 1
    assert set(data["agreement"]) >= {"spearman", "largest_miss"}
    # every figure over the batch has its interval beside it, and the interval holds the figure
    low, high = circuit["ci"]["faithfulness"]
    assert low <= circuit["faithfulness"] <= high
    assert all(len(p["ci"]) == 2 for p in circuit["curve"])
    assert all(e["ci"][0] <= e["effect"] <= e["ci"][1] for e in circuit["edges"])
    for name, grid in data["head_scores_ci"].items():  # pattern scores; weight scores have no sample of sequences
        definition = data["scores"][name]
        assert (grid is None) == (definition["kind"] == "weight"), name
        assert grid is None or len(grid) == len(data["head_scores"][name])
    for record in data["top_heads"]["induction"] + data["top_heads"]["ablation"]:
        assert record["ci"][0] <= record["value"] <= record["ci"][1]
    assert data["uncertainty"]["n_resamples"] == 1000 and data["uncertainty"]["extra_passes"] == 0


@pytest.mark.parametrize("verified", [False, True], ids=["no-circuit", "circuit"])
@pytest.mark.parametrize("size", list(SIZES))
def test_synthetic_scans_validate(size, verified):
    validate(json.loads(json.dumps(scan_json(sized_scan(size, verified=verified)), allow_nan=False)))


def test_schema_refuses_what_the_format_forbids(zoo_scan):
    data = json.loads(json.dumps(scan_json(zoo_scan)))
    for path, value in ((("format",), 3), (("circuit", "heads"), []),
                        (("circuit", "ci", "faithfulness"), [0.1]), (("circuit", "target"), 1.5),
                        (("attribution", "method"), "exact"), (("circuit", "curve"), [{"n_heads": 1}])):
        bad = json.loads(json.dumps(data))
        where = bad
        for key in path[:-1]:
            where = where[key]
        where[path[-1]] = value
        with pytest.raises(jsonschema.ValidationError):
            validate(bad)


def test_the_answer_names_the_circuit_its_faithfulness_and_the_curve():
    import html
    import re

    scan = synthetic_scan(3, 4, verified=True)
    report = build_report(scan)
    summary = report.split('id="ck-sec-summary"')[1].split("</section>")[0]
    text = html.unescape(re.sub(r"<[^>]+>", " ", summary))
    text = " ".join(text.split())
    assert "Circuit : 4 of 12 heads" in text.replace("Circuit:", "Circuit :")
    assert "Faithfulness : 0.92 (target 0.80" in text.replace("Faithfulness:", "Faithfulness :")
    assert "exact effect on the loss, path patching, nats" in text
    assert '<svg class="ck-curve"' in summary and "faithfulness of the top-n heads (exact)" in summary
    assert summary.count("<circle") == len(scan.verified.curve)
