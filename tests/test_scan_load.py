"""Results come back: ``Scan.load(dir)`` rebuilds the saved scan (its JSON round-trips exactly and its figures
equal the fresh scan's), ``Scan.table()`` / ``Scan.to_pandas()`` give the head table, ``Track.load`` reads a
saved track."""

from __future__ import annotations

import json
import sys

import pytest
import torch

import circuitkit as ck
from circuitkit import CircuitkitError, RepeatedTokens
from circuitkit.report.data import JSON_FORMAT

FLOAT32_RTOL = 1e-6
"""scores.json keeps 7 significant digits of float32 values: a loaded figure is within 1e-6 of the fresh one."""


@pytest.fixture(scope="module")
def scans(tmp_path_factory):
    """The bundled model scanned in full (a circuit found) and quickly (no ablation, no circuit), each saved."""
    out = {}
    for label, kwargs in {"full": {}, "quick": {"ablate": "none", "circuit": False}}.items():
        result = ck.scan(tokens=RepeatedTokens(batch=4), **kwargs)
        directory = tmp_path_factory.mktemp(label)
        result.save(directory)
        out[label] = (result, directory)
    return out


@pytest.mark.parametrize("label", ["full", "quick"])
def test_load_round_trips_scores_json(scans, label):
    _, directory = scans[label]
    saved = json.loads((directory / "scores.json").read_text(encoding="utf-8"))
    loaded = ck.Scan.load(directory)
    assert isinstance(loaded, ck.Scan)
    assert loaded.to_json() == saved
    assert ck.Scan.load(directory / "scores.json").to_json() == saved  # the file itself works too


def test_loaded_figures_equal_the_fresh_scan(scans):
    fresh, directory = scans["full"]
    loaded = ck.Scan.load(directory)
    assert list(loaded.head_scores) == list(fresh.head_scores)
    for name in fresh.head_scores:
        torch.testing.assert_close(loaded.head_scores[name].float(), fresh.head_scores[name], rtol=FLOAT32_RTOL,
                                   atol=1e-7)
    torch.testing.assert_close(loaded.attribution.effect.float(), fresh.attribution.effect, rtol=FLOAT32_RTOL,
                               atol=1e-7)
    torch.testing.assert_close(loaded.ablation.effect.float(), fresh.ablation.effect, rtol=FLOAT32_RTOL,
                               atol=1e-7, equal_nan=True)
    assert torch.equal(loaded.ablation.exact, fresh.ablation.exact)
    assert loaded.verified.heads == fresh.verified.heads
    assert loaded.verified.faithfulness == pytest.approx(fresh.verified.faithfulness, rel=FLOAT32_RTOL)
    assert loaded.verified.roles == fresh.verified.roles
    assert loaded.induction_heads == fresh.induction_heads
    assert [r.name for r in loaded.circuit.rows] == [r.name for r in fresh.circuit.rows]
    assert loaded.top("induction", 3) == [(h, pytest.approx(v, rel=FLOAT32_RTOL)) for h, v in fresh.top("induction", 3)]
    assert repr(loaded) == repr(fresh)


def test_table_ranks_every_head_like_the_scan(scans):
    fresh, _ = scans["full"]
    rows = fresh.table()
    n = fresh.model.n_layers * fresh.model.n_heads
    assert len(rows) == n and len({r["head"] for r in rows}) == n
    assert [(r["layer"], r["index"]) for r in rows[:4]] == [h for h, _ in fresh.top("induction", 4)]
    first = rows[0]
    for name in fresh.head_scores:
        assert first[name] == float(fresh.head_scores[name][first["layer"], first["index"]])
    assert first["attribution"] == float(fresh.attribution.effect[first["layer"], first["index"]])
    by_ablation = fresh.table(sort="ablation")
    exact = [r for r in by_ablation if r["ablation"] is not None]
    assert exact and by_ablation[: len(exact)] == exact  # heads not ablated (None) last
    assert [r["ablation"] for r in exact] == sorted((r["ablation"] for r in exact), reverse=True)
    assert "ablation" not in scans["quick"][0].table()[0]
    with pytest.raises(CircuitkitError, match="Scan.table: sort: given str 'ablation'; expected a column"):
        scans["quick"][0].table(sort="ablation")


def test_to_pandas_is_the_table(scans):
    import pandas  # optional for users, in the dev extra: the tests always have it
    fresh, directory = scans["full"]
    frame = ck.Scan.load(directory).to_pandas()
    assert isinstance(frame, pandas.DataFrame)
    rows = ck.Scan.load(directory).table()
    assert list(frame.index) == [r["head"] for r in rows]
    assert frame["induction"].tolist() == [r["induction"] for r in rows]


def test_to_pandas_without_pandas_is_a_clear_error(scans, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas now raises ImportError
    with pytest.raises(CircuitkitError, match=r"Scan.to_pandas: needs pandas, which is not installed here"):
        scans["quick"][0].to_pandas()


def test_load_refuses_what_is_not_a_saved_scan(tmp_path):
    with pytest.raises(CircuitkitError, match="no such file or directory"):
        ck.Scan.load(tmp_path / "nowhere")
    (tmp_path / "scores.json").write_text(json.dumps({"format": 1}))
    with pytest.raises(CircuitkitError, match="format 1"):
        ck.Scan.load(tmp_path)
    for alike in (float(JSON_FORMAT), str(JSON_FORMAT)):  # equal to the format or spelling it, and not it
        (tmp_path / "scores.json").write_text(json.dumps({"format": alike, "circuitkit_version": "0"}))
        with pytest.raises(CircuitkitError, match=f"field 'format'.*format {alike!r}"):
            ck.Scan.load(tmp_path)
    (tmp_path / "scores.json").write_text(json.dumps({"format": JSON_FORMAT, "model": {}}))
    with pytest.raises(CircuitkitError, match="field 'circuitkit_version': given nothing .the key is missing"):
        ck.Scan.load(tmp_path)
    (tmp_path / "scores.json").write_text("{not json")
    with pytest.raises(CircuitkitError, match="not JSON"):
        ck.Scan.load(tmp_path)


def test_heads_not_ablated_come_last_as_none():
    from tests.report_fixtures import synthetic_scan

    scan = synthetic_scan(2, 4)
    rows = scan.table(sort="ablation")
    exact = [r["ablation"] for r in rows if r["ablation"] is not None]
    assert 0 < len(exact) < len(rows)
    assert [r["ablation"] for r in rows] == sorted(exact, reverse=True) + [None] * (len(rows) - len(exact))


def test_load_scan_builds_the_class_it_is_given_and_refuses_others(tmp_path):
    """The report layer builds a scan back as the record class it is given (``Scan.load`` passes ``Scan``, with its
    views); anything but a scan record class is one CircuitkitError naming it."""
    import pytest

    import circuitkit as ck
    from circuitkit import CircuitkitError
    from circuitkit.report import load_scan
    from circuitkit.scan_record import ScanRecord

    ck.scan(circuit=False).save(tmp_path)
    record = load_scan(tmp_path)
    assert type(record) is ScanRecord and not hasattr(record, "save")
    loaded = ck.Scan.load(tmp_path)
    assert type(loaded) is ck.Scan and loaded.to_json() == ck.Scan.load(tmp_path / "scores.json").to_json()
    for bad in (dict, "Scan", 3, object()):
        with pytest.raises(CircuitkitError, match="load_scan: cls"):
            load_scan(tmp_path, bad)
