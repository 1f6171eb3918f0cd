"""What ``track`` reads back and what one track may mix: every record and ``track.json`` goes through the guarded
reader and the record schema (one line naming the file and the field); merges refuse duplicate steps and records
of other score sets, families or shapes; a rerun re-measures a checkpoint whose fingerprint changed; a record of a
step is never replaced by another checkpoint's; ``track`` keeps an in-memory model's state; ``track.json`` and
``report.html`` always describe the same checkpoints; a scan and a track never share a directory.

Checkpoints here are copies of the bundled model's directory (a zoo-format checkpoint), on a small batch."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import circuitkit as ck
from circuitkit import CircuitkitError, detect, zoo
from circuitkit.tracking import merge
from circuitkit.tracking import run as track_run
from circuitkit.tracking.result import Track

TOKENS = ck.RepeatedTokens(block_len=8, batch=4, seed=0)
STEPS = (100, 200)


def _checkpoint(directory: Path, step: int) -> Path:
    target = directory / f"step{step}"
    shutil.copytree(zoo.info().path, target)
    return target


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("ckpts")
    return [_checkpoint(root, step) for step in STEPS]


@pytest.fixture(scope="module")
def records(checkpoints, tmp_path_factory) -> Path:
    """A finished track's directory: two records, track.json, report.html."""
    out = tmp_path_factory.mktemp("track")
    ck.track(checkpoints, tokens=TOKENS, out=out, progress=False)
    return out


def _copy(records: Path, tmp_path: Path) -> Path:
    out = tmp_path / "copy"
    shutil.copytree(records, out)
    return out


def _edit(file: Path, change) -> None:
    data = json.loads(file.read_text())
    change(data)
    file.write_text(json.dumps(data))


def _one_line(caught: pytest.ExceptionInfo) -> str:
    message = str(caught.value)
    assert "\n" not in message, message
    return message


def _merge_fails(out: Path, *needles: str) -> str:
    with pytest.raises(CircuitkitError) as caught:
        merge(out)
    message = _one_line(caught)
    for needle in needles:
        assert needle in message, message
    return message


RECORD = "track-step200.json"


# ------------------------------------------------------------------------------------------ the record schema
@pytest.mark.parametrize("key", ["step", "label", "icl_score", "called", "scores", "model", "top_edges"])
def test_record_missing_a_key_is_one_line_naming_file_and_field(records, tmp_path, key):
    out = _copy(records, tmp_path)
    _edit(out / RECORD, lambda d: d.pop(key))
    _merge_fails(out, RECORD, repr(key), "missing")


@pytest.mark.parametrize("step", ["abc", None, True, -5, 10.7], ids=["text", "null", "true", "negative", "float"])
def test_record_step_must_be_a_non_negative_int(records, tmp_path, step):
    out = _copy(records, tmp_path)
    _edit(out / RECORD, lambda d: d.update(step=step))
    _merge_fails(out, RECORD, "'step'", "integer >= 0")


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_json_tokens_are_refused(records, tmp_path, token):
    out = _copy(records, tmp_path)
    text = (out / RECORD).read_text()
    text = re.sub(r'"icl_score": [-0-9.e]+', f'"icl_score": {token}', text)
    (out / RECORD).write_text(text)
    _merge_fails(out, RECORD, token)


@pytest.mark.parametrize("change", [
    lambda d: d["scores"]["induction"].pop(),
    lambda d: d["scores"]["induction"][0].append(0.5),
    lambda d: d["scores"]["induction"][0].__setitem__(0, "high"),
    lambda d: d["scores"].__setitem__("induction", 3),
], ids=["one-layer-short", "one-head-long", "text-value", "not-a-grid"])
def test_scores_grid_of_the_wrong_shape_is_refused(records, tmp_path, change):
    out = _copy(records, tmp_path)
    _edit(out / RECORD, change)
    _merge_fails(out, RECORD, "scores.induction")


@pytest.mark.parametrize("field,value", [("called", {"induction": ["9.9"]}), ("called", {"induction": ["1.x"]}),
                                         ("top_edges", {"K": [["0.1", "1.7", 0.3]]}),
                                         ("top_edges", {"K": [["1.1", "0.3", 0.3]]})],
                         ids=["layer-out-of-range", "not-a-head", "edge-head-out-of-range", "edge-backwards"])
def test_head_names_out_of_range_are_refused(records, tmp_path, field, value):
    out = _copy(records, tmp_path)
    _edit(out / RECORD, lambda d: d.update({field: value}))
    _merge_fails(out, RECORD, field)


def test_deep_json_is_refused(records, tmp_path):
    out = _copy(records, tmp_path)
    (out / RECORD).write_text("[" * 200_000 + "]" * 200_000)
    _merge_fails(out, RECORD, "nested")


def test_huge_record_is_refused_before_reading(records, tmp_path):
    out = _copy(records, tmp_path)
    with open(out / RECORD, "r+b") as file:
        file.truncate(300 * 2**20)  # sparse: 300 MB on paper
    _merge_fails(out, RECORD, "MiB")


@pytest.mark.parametrize("target", ["/dev/zero", "fifo", "directory"])
def test_record_that_is_not_a_regular_file_is_refused(records, tmp_path, target):
    out = _copy(records, tmp_path)
    (out / RECORD).unlink()
    if target == "fifo":
        os.mkfifo(out / RECORD)
    elif target == "directory":
        (out / RECORD).mkdir()  # a file no process can read as a record
    else:
        (out / RECORD).symlink_to(target)
    _merge_fails(out, RECORD)


def test_two_files_holding_one_step_are_refused(records, tmp_path):
    out = _copy(records, tmp_path)
    shutil.copy(out / RECORD, out / "track-step0200.json")
    _merge_fails(out, "200", "track-step0200.json")


def test_file_named_for_another_step_is_refused(records, tmp_path):
    out = _copy(records, tmp_path)
    shutil.copy(out / RECORD, out / "track-step300.json")
    _merge_fails(out, "track-step300.json", "holds step 200")


def test_record_lacking_a_score_the_others_have_is_refused(records, tmp_path):
    out = _copy(records, tmp_path)
    _edit(out / RECORD, lambda d: d["scores"].pop("duplicate_token"))
    _merge_fails(out, "without ['duplicate_token']", "score set")


def test_records_of_another_family_are_refused(records, tmp_path):
    out = _copy(records, tmp_path)
    _edit(out / RECORD, lambda d: d["model"].update(family="GPT-NeoX (TransformerBridge) [gpt_neox]"))
    _merge_fails(out, "family")


def test_a_valid_directory_still_merges(records):
    merged = merge(records)
    assert merged.steps == list(STEPS)


# ------------------------------------------------------------------------------------------ Track.load
@pytest.mark.parametrize("change,field", [
    (lambda d: d.update(checkpoints=[]), "checkpoints"),
    (lambda d: d.pop("checkpoints"), "checkpoints"),
    (lambda d: d.pop("model"), "model"),
    (lambda d: d["checkpoints"][0].pop("icl_score"), "checkpoints[0].icl_score"),
    (lambda d: d["checkpoints"][1].update(step=100), "checkpoints"),
], ids=["no-checkpoints", "no-checkpoints-key", "no-model", "entry-missing-key", "repeated-step"])
def test_track_load_checks_its_file(records, tmp_path, change, field):
    out = _copy(records, tmp_path)
    _edit(out / "track.json", change)
    with pytest.raises(CircuitkitError) as caught:
        Track.load(out)
    message = _one_line(caught)
    assert "track.json" in message and repr(field) in message


def test_track_load_reads_what_save_wrote(records):
    loaded = Track.load(records)
    assert loaded.steps == list(STEPS)


# ------------------------------------------------------------------------------------------ one experiment
def test_two_families_of_one_shape_are_not_one_track():
    from circuitkit.models.toy import AttentionOnlyModel

    bridge = zoo.load()
    toy = AttentionOnlyModel(bridge)  # the same weights and shapes, run by another family
    with pytest.raises(CircuitkitError) as caught:
        ck.track([bridge, toy], steps=[0, 1], tokens=TOKENS, top_k=0)
    assert "family" in _one_line(caught)


def test_a_second_job_given_the_same_step_is_refused(checkpoints, tmp_path):
    out = tmp_path / "jobs"
    ck.track([checkpoints[0]], steps=[5], tokens=TOKENS, out=out, write_track=False, progress=False)
    before = (out / "track-step5.json").read_bytes()
    with pytest.raises(CircuitkitError) as caught:
        ck.track([checkpoints[1]], steps=[5], tokens=TOKENS, out=out, write_track=False, progress=False)
    assert "already holds step 5" in _one_line(caught)
    assert (out / "track-step5.json").read_bytes() == before


def test_rerun_measures_a_checkpoint_whose_weights_changed(tmp_path, monkeypatch):
    checkpoint = _checkpoint(tmp_path, 100)
    out = tmp_path / "out"
    first = ck.track([checkpoint], tokens=TOKENS, out=out, progress=False)
    weights = checkpoint / "model.safetensors"
    stat = weights.stat()
    data = bytearray(weights.read_bytes())
    header_len = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + header_len])
    name = next(k for k in header if k.endswith("1.attn.k.weight"))
    start, end = (8 + header_len + offset for offset in header[name]["data_offsets"])
    data[start:end] = torch.frombuffer(bytearray(data[start:end]), dtype=torch.float32).flip(0).numpy().tobytes()
    weights.write_bytes(bytes(data))  # other values, the same size...
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # ...and the old time
    measured = []
    original = track_run.measure
    monkeypatch.setattr(track_run, "measure", lambda *a, **k: measured.append(1) or original(*a, **k))
    second = ck.track([checkpoint], tokens=TOKENS, out=out, progress=False)
    assert measured == [1]
    assert second.checkpoints[0]["fingerprint"] != first.checkpoints[0]["fingerprint"]
    assert second.checkpoints[0]["scores"] != first.checkpoints[0]["scores"]


def test_rerun_of_an_unchanged_checkpoint_is_skipped(records, tmp_path, monkeypatch, checkpoints):
    out = _copy(records, tmp_path)
    monkeypatch.setattr(track_run, "measure", lambda *a, **k: pytest.fail("measured again"))
    assert ck.track(checkpoints, tokens=TOKENS, out=out, progress=False).steps == list(STEPS)


def test_rerun_after_a_score_was_removed_measures_again(checkpoints, tmp_path):
    from circuitkit.detect.targets import induction_targets

    out = tmp_path / "out"
    detect.register(detect.pattern_score("extra_test", short="xtra", description="d", targets=induction_targets))
    try:
        ck.track(checkpoints[:1], tokens=TOKENS, out=out, progress=False)
    finally:
        detect.unregister("extra_test")
    result = ck.track(checkpoints, tokens=TOKENS, out=out, progress=False)
    assert all("extra_test" not in r["scores"] for r in result.checkpoints)
    assert "extra_test" not in json.loads((out / "track-step100.json").read_text())["scores"]


def test_track_keeps_the_models_training_mode_and_measures_in_eval(tmp_path):
    from tests.test_loading_safety import save_tiny_gpt2

    directory = tmp_path / "gpt2"
    save_tiny_gpt2(directory)
    model = ck.models.load_model(str(directory))
    model.eval()
    reference = ck.track([model], steps=[0], tokens=TOKENS, top_k=0).checkpoints[0]
    model.train()
    runs = [ck.track([model], steps=[0], tokens=TOKENS, top_k=0).checkpoints[0] for _ in range(2)]
    assert model.training and all(m.training for m in model.modules())
    for run in runs:
        assert run["icl_score"] == reference["icl_score"]
        assert run["scores"] == reference["scores"]


# ------------------------------------------------------------------------------------------ written together
def test_signal_leaves_track_json_and_report_of_the_same_checkpoints(checkpoints, tmp_path):
    """SIGTERM while the third checkpoint is measured: track.json and report.html both hold the first two."""
    extra = _checkpoint(tmp_path, 300)
    out = tmp_path / "out"
    script = textwrap.dedent(f"""
        import os, signal
        import circuitkit as ck
        from circuitkit.tracking import run
        original = run.measure
        calls = []
        def measure(*args, **kwargs):
            calls.append(1)
            if len(calls) == 3:
                os.kill(os.getpid(), signal.SIGTERM)
            return original(*args, **kwargs)
        run.measure = measure
        ck.track({[str(c) for c in [*checkpoints, extra]]!r}, tokens=ck.RepeatedTokens(block_len=8, batch=4, seed=0),
                 out={str(out)!r}, progress=False)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(ck.__file__).parents[1]), str(Path.cwd())])}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, timeout=300)
    assert done.returncode == -signal.SIGTERM, done.stderr.decode()[-2000:]
    saved = json.loads((out / "track.json").read_text())
    labels = [c["label"] for c in saved["checkpoints"]]
    assert labels == ["step100", "step200"]
    report = (out / "report.html").read_text()
    assert all(label in report for label in labels) and "step300" not in report


# ------------------------------------------------------------------------------------------ one kind per directory
def test_track_refuses_a_scan_directory_before_any_pass(tmp_path, monkeypatch, checkpoints):
    out = tmp_path / "scan"
    ck.scan(zoo.load(), tokens=TOKENS, ablate="none", circuit=False).save(out)
    monkeypatch.setattr(track_run, "measure", lambda *a, **k: pytest.fail("a pass ran"))
    with pytest.raises(CircuitkitError) as caught:
        ck.track(checkpoints, tokens=TOKENS, out=out, progress=False)
    assert "holding a scan" in _one_line(caught)
    assert not list(out.glob("track*"))


def test_scan_refuses_a_track_directory(records, tmp_path):
    out = _copy(records, tmp_path)
    before = (out / "report.html").read_bytes()
    result = ck.scan(zoo.load(), tokens=TOKENS, ablate="none", circuit=False)
    with pytest.raises(CircuitkitError) as caught:
        result.save(out)
    assert "holding a track" in _one_line(caught)
    assert (out / "report.html").read_bytes() == before and not (out / "scores.json").exists()


def test_cli_scan_refuses_a_track_directory_before_the_scan(records, tmp_path, monkeypatch):
    from circuitkit import cli

    out = _copy(records, tmp_path)
    monkeypatch.setattr(ck, "scan", lambda *a, **k: pytest.fail("the scan ran"))
    code = cli.main(["scan", "--out", str(out)])
    assert code != 0
    assert not (out / "scores.json").exists()


def test_track_gets_a_model_with_a_nan_weight_refused_by_name():
    model = zoo.load()
    with torch.no_grad():
        next(iter(model.parameters())).fill_(float("nan"))
    with pytest.raises(CircuitkitError, match=r"^track: given a model whose weight"):
        ck.track([model], steps=[0], tokens=TOKENS)
