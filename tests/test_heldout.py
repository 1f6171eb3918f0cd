"""The induction circuit on held-out sequences: the scan measures the heads it found on a second batch of the same
spec (seed + 1) and reports that faithfulness beside the search batch's; the figure equals
``circuitkit.circuits.faithfulness`` recomputed on that batch; the bundled model's circuit and discovery figure do
not move; ``scores.json`` holds it (checked, reloaded) and older files without it still load."""

from __future__ import annotations

import json

import pytest
import torch

import circuitkit as ck
from circuitkit import CircuitkitError, RepeatedTokens, zoo
from circuitkit.circuits import faithfulness as faithfulness_module
from circuitkit.circuits.faithfulness import faithfulness
from circuitkit.circuits.heldout import evaluation_seed, evaluation_spec, held_out
from circuitkit.models.adapters import adapt
from circuitkit.report.summary import answer_lines
from tests.conftest import mean_ablated_logits, repeated_copies_loss
from tests.test_report_scores import validate

BUNDLED_CIRCUIT = ((0, 1), (0, 0), (1, 3), (1, 1))
BUNDLED_FAITHFULNESS = 0.871


@pytest.fixture(scope="module")
def model():
    return zoo.load()


@pytest.fixture(scope="module")
def bundled(model):
    """The bundled model's scan with its default batch (the known answer)."""
    return ck.scan(model)


def test_the_held_out_figure_equals_faithfulness_on_a_fresh_batch(bundled, model):
    held = bundled.verified.evaluation
    assert held["seed"] == bundled.settings.evaluation_seed == 1 and held["sequences"] == 16
    fresh = RepeatedTokens(seed=1)  # the default spec with the next seed, written here
    expected = faithfulness(model, bundled.verified.heads, fresh, method="mean")
    assert held["faithfulness"] == pytest.approx(expected, abs=1e-6)
    assert not torch.equal(fresh.build(model).tokens, RepeatedTokens().build(model).tokens)
    # necessity: the circuit's heads mean-ablated on that batch with hooks written here
    batch = fresh.build(model)
    tokens, heads = batch.tokens, bundled.verified.heads
    with torch.no_grad():
        clean = repeated_copies_loss(model(tokens), tokens, batch.repeated_copies)
    ablated = repeated_copies_loss(mean_ablated_logits(model, tokens, heads), tokens, batch.repeated_copies)
    assert held["necessity"] == pytest.approx(ablated - clean, abs=1e-4)
    assert held["losses"]["clean"] == pytest.approx(clean, abs=1e-4)


def test_the_bundled_answer_is_unchanged(bundled):
    v = bundled.verified
    assert v.heads == BUNDLED_CIRCUIT and round(v.faithfulness, 3) == BUNDLED_FAITHFULNESS
    assert 0.8 <= v.evaluation["faithfulness"] <= 0.95  # fresh sequences: as faithful, within sampling


def test_the_answer_and_the_report_say_it_beside_the_discovery_figure(bundled, tmp_path):
    lines = answer_lines(bundled)
    held = next(line for line in lines if line.startswith("Held out: "))
    assert f"faithfulness {bundled.verified.evaluation['faithfulness']:.2f}" in held
    assert f"on the search batch {bundled.verified.faithfulness:.2f}" in held and "16 fresh sequences" in held
    saved = bundled.save(tmp_path)
    assert "Held out" in saved.report.read_text()


def test_scores_json_holds_it_checks_it_and_reloads_it(bundled, tmp_path):
    saved = bundled.save(tmp_path)
    data = json.loads(saved.scores.read_text())
    validate(data)
    assert data["settings"]["evaluation_seed"] == 1
    assert data["circuit"]["evaluation"]["faithfulness"] == pytest.approx(bundled.verified.evaluation["faithfulness"])
    loaded = ck.Scan.load(tmp_path)
    assert loaded.verified.evaluation == data["circuit"]["evaluation"]
    assert loaded.settings.evaluation_seed == 1
    assert loaded.to_json()["circuit"] == data["circuit"]


def test_files_written_before_it_still_load(bundled, tmp_path):
    bundled.save(tmp_path)
    path = tmp_path / "scores.json"
    data = json.loads(path.read_text())
    del data["circuit"]["evaluation"], data["settings"]["evaluation_seed"]
    path.write_text(json.dumps(data))
    validate(data)
    loaded = ck.Scan.load(tmp_path)
    assert loaded.verified.evaluation is None and loaded.settings.evaluation_seed is None
    assert not any(line.startswith("Held out") for line in answer_lines(loaded))


@pytest.mark.parametrize(("change", "field"), [
    (lambda e: e.update(faithfulness="high"), "circuit.evaluation.faithfulness"),
    (lambda e: e.update(faithfulness=None), "circuit.evaluation.note"),
    (lambda e: e.pop("losses"), "circuit.evaluation"),
    (lambda e: e.update(sequences=0), "circuit.evaluation.sequences"),
    (lambda e: e.update(extra=1), "circuit.evaluation"),
])
def test_a_bad_evaluation_record_is_refused(bundled, tmp_path, change, field):
    bundled.save(tmp_path)
    path = tmp_path / "scores.json"
    data = json.loads(path.read_text())
    change(data["circuit"]["evaluation"])
    path.write_text(json.dumps(data))
    with pytest.raises(CircuitkitError, match=field.replace(".", r"\.")):
        ck.Scan.load(tmp_path)


@pytest.mark.parametrize("method", ["zero", "resample"])
def test_other_ablations_match_faithfulness_too(model, method):
    spec = RepeatedTokens(batch=4, seed=7)
    heads = BUNDLED_CIRCUIT
    held = held_out(adapt(model), spec, heads, method)
    assert held["faithfulness"] == pytest.approx(faithfulness(model, heads, spec, method=method),
                                                 abs=1e-6)
    assert held["passes"] == (5 if method == "resample" else 4)


@pytest.mark.parametrize("per_forward", [1, 2])
def test_four_copies_that_do_not_fit_one_pass_give_the_same_figures(model, monkeypatch, per_forward):
    """Where fewer than four copies fit a forward pass (a large vocabulary) the unablated copy runs first and keeps
    the means: the same figures, still four copies, so the scan's plan holds."""
    spec = RepeatedTokens(batch=4, seed=3)
    stacked = held_out(adapt(model), spec, BUNDLED_CIRCUIT, "mean")
    monkeypatch.setattr("circuitkit.circuits.heldout.copies_per_forward", lambda *a, **k: per_forward)
    monkeypatch.setattr("circuitkit.circuits.faithfulness.copies_per_forward", lambda *a, **k: per_forward)
    split = held_out(adapt(model), spec, BUNDLED_CIRCUIT, "mean")
    assert split["passes"] == stacked["passes"] == 4
    for key in ("faithfulness", "necessity"):
        assert stacked[key] == pytest.approx(split[key], abs=1e-5)
    assert stacked["faithfulness"] == pytest.approx(faithfulness(model, BUNDLED_CIRCUIT, spec), abs=1e-6)


def test_a_batch_where_no_head_matters_gives_a_reason_not_a_figure():
    silent = zoo.load()
    with torch.no_grad():
        for name, param in silent.named_parameters():
            if ".attn." in name and ".o." in name:
                param.zero_()
    held = held_out(adapt(silent), RepeatedTokens(batch=2), BUNDLED_CIRCUIT, "mean")
    assert held["faithfulness"] is None and "no effect for the circuit to reproduce" in held["note"]


def test_a_built_batch_has_no_held_out_batch(model):
    batch = RepeatedTokens(batch=4).build(model)
    result = ck.scan(model, tokens=batch, ablate="none")
    assert result.verified is not None and result.verified.evaluation is None
    assert result.settings.evaluation_seed is None


def test_the_held_out_spec_keeps_the_search_spec_but_its_seed(model):
    spec = RepeatedTokens(block_len=7, n_repeats=3, batch=5, seed=11, bos=False, token_range=(3, 40))
    built = spec.build(model)
    again = evaluation_spec(block_len=built.block_len, n_repeats=built.n_repeats, batch=5, seed=evaluation_seed(11),
                            bos=built.bos, token_range=spec.token_range)
    assert again == RepeatedTokens(block_len=7, n_repeats=3, batch=5, seed=12, bos=False, token_range=(3, 40))
    assert evaluation_seed(2**63 - 1) == 0
    result = ck.scan(model, tokens=spec, ablate="none")
    assert result.settings.token_range == (3, 40) and result.verified.evaluation["seed"] == 12


def test_the_search_passes_and_figures_do_not_include_the_held_out_batch(bundled, model, monkeypatch):
    """The circuit's own passes are the search's; the circuit stage's are the search's plus the held-out pass."""
    stage = next(s for s in bundled.stages if s.name == "circuit")
    assert stage.passes == bundled.verified.passes + bundled.verified.evaluation["passes"]
    assert faithfulness_module.Circuit.__dataclass_fields__["evaluation"].default is None
