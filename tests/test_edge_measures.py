"""The edge-measure registry: a new edge measure is one definition plus its registration, and shows in the
evidence table, ``scores.json`` and the report without an edit anywhere else."""

from __future__ import annotations

import json
import math
from pathlib import Path

import jsonschema
import pytest
import torch

import circuitkit as ck
from circuitkit import CircuitkitError, RepeatedTokens, zoo
from circuitkit.circuits import EdgeInputs, edge_measure, measures
from circuitkit.results import EdgeValues

SCHEMA = json.loads((Path(ck.__file__).parent / "report" / "scores.schema.json").read_text())
PRODUCT_RTOL = 1e-6
"""The registered product is taken in float32 over the whole tensor; the oracle multiplies the row's two floats
in float64: they agree to float32 rounding."""


def _weighted(inputs: EdgeInputs) -> torch.Tensor:
    """The new measure: composition score times edge attribution, over every edge."""
    return inputs.measured["composition"].values * inputs.measured["attribution"].values


@pytest.fixture(scope="module")
def scanned():
    """A scan of the bundled model with the new measure registered (and removed again after the module)."""
    measures.register(edge_measure("weighted", column="composition x attribution", compute=_weighted,
                                   description="composition score times edge attribution"))
    try:
        yield ck.scan(zoo.load(), tokens=RepeatedTokens(batch=4), name=zoo.DEFAULT)
    finally:
        measures.unregister("weighted")


def test_the_builtin_measures_are_registered_in_order():
    assert measures.measure_names()[:3] == ("composition", "attribution", "patched")


def test_a_new_measure_shows_in_the_evidence_table(scanned):
    evidence = scanned.circuit
    assert evidence is not None and evidence.rows
    for row in evidence.rows:
        assert [name for name, _ in row.values] == ["composition", "attribution", "patched", "weighted"]
        assert row.weighted == pytest.approx(row.composition * row.attribution, rel=PRODUCT_RTOL)
    assert isinstance(evidence.measured["weighted"], EdgeValues)
    assert "weighted" in repr(evidence)


def test_a_new_measure_shows_in_scores_json_and_loads_back(scanned, tmp_path):
    saved = scanned.save(tmp_path)
    data = json.loads(saved.scores.read_text())
    jsonschema.Draft202012Validator(SCHEMA).validate(data)  # the schema did not have to change
    rows = data["evidence"]["rows"]
    assert rows and all("weighted" in r for r in rows)
    for row, record in zip(scanned.circuit.rows, rows, strict=True):
        assert record["weighted"] == pytest.approx(row.weighted, rel=1e-6)
    assert ck.Scan.load(tmp_path).to_json()["evidence"] == data["evidence"]


def test_a_new_measure_shows_in_the_report(scanned, tmp_path):
    html = scanned.save(tmp_path).report.read_text()
    section = html[html.index('id="ck-sec-circuit"'):]
    section = section[section.index("<th>in the circuit</th>"):]  # the evidence table
    section = section[: section.index("</table>")]
    assert "<th>composition x attribution</th>" in section
    for row in scanned.circuit.rows:
        assert f"<td>{row.weighted:.4f}</td>" in section


def test_without_the_measure_nothing_shows(scanned):
    """Control: once unregistered, new evidence has no such value (the fixture's scan kept it)."""
    removed = measures.unregister("weighted")
    try:
        assert "weighted" not in measures.measure_names()
        evidence = ck.circuit_evidence(zoo.load(), tokens=RepeatedTokens(batch=2), top_k=2)
        assert evidence.rows and all("weighted" not in dict(r.values) for r in evidence.rows)
        assert "weighted" not in evidence.to_json()["rows"][0] and "weighted" not in evidence.measured
    finally:
        measures.register(removed)


# ------------------------------------------------------------------------------------------------ the guards
@pytest.mark.parametrize("name", ["", "with space", "src", "weight_only", 3, None],
                         ids=["empty", "not-identifier", "src", "flag", "int", "None"])
def test_edge_measure_refuses_bad_names(name):
    with pytest.raises(CircuitkitError, match="name"):
        edge_measure(name, column="c", description="d", compute=_weighted)


def test_edge_measure_refuses_a_compute_that_is_not_a_function():
    with pytest.raises(CircuitkitError, match="compute"):
        edge_measure("x", column="c", description="d", compute="composition")


def test_register_refuses_a_duplicate_and_unregister_an_unknown_name():
    with pytest.raises(CircuitkitError, match="already registered"):
        measures.register(edge_measure("composition", column="c", description="d", compute=_weighted))
    with pytest.raises(CircuitkitError, match="edge measure"):
        measures.unregister("no_such_measure")
    with pytest.raises(CircuitkitError, match="EdgeMeasure"):
        measures.register("composition")


def _inputs() -> EdgeInputs:
    L, H = 2, 2
    return EdgeInputs(L, H, {"q": torch.rand(L, H, L, H)}, None, None)


@pytest.mark.parametrize("compute, match", [
    (lambda inputs: 1 / 0, "ZeroDivisionError"),
    (lambda inputs: torch.zeros(2, 2, 2, 2), r"\[2, 2, 2, 2, 3\]"),
    (lambda inputs: torch.full((2, 2, 2, 2, 3), math.inf), "infinite"),
    (lambda inputs: torch.zeros(2, 2, 2, 2, 3, dtype=torch.long), "floating"),
    (lambda inputs: "values", "EdgeValues"),
], ids=["raises", "wrong-shape", "inf", "int", "str"])
def test_a_measures_code_is_guarded(compute, match):
    measure = edge_measure("guarded", column="c", description="d", compute=compute)
    with pytest.raises(CircuitkitError, match=match) as error:
        measures.compute(measure, _inputs())
    assert "'guarded'" in str(error.value)


def test_the_composition_measure_leaves_a_channel_not_given_unmeasured():
    values = measures.compute(measures.get("composition"), _inputs())
    assert values.input("q")[0, :, 1].isfinite().all() and values.input("k").isnan().all()
