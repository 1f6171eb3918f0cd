"""``circuitkit.track(checkpoints, task=FILE)`` and ``circuitkit track CKPT --task FILE``: a task's metric, head
scores and node circuit at every checkpoint.

The checkpoints are the bundled model with its key weights scaled by 0, 0.5 and 1 (step 0: every head attends
uniformly, no induction; step 200: the bundled model), so the task's gap grows along the "run". The task is a
copy-next task in token ids (tests/test_tasks.py). The figures at each checkpoint are checked against
``scan_task`` run directly on that checkpoint, and the clean and corrupted means against a plain forward pass."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import circuitkit as ck
from circuitkit import CircuitkitError, zoo
from circuitkit.ranking import head_name
from circuitkit.tasks import scan_task
from circuitkit.tracking import load_checkpoint, task_figures
from circuitkit.tracking import sources as track_sources
from circuitkit.tracking.phase import MIN_GAP_RISE, locate_task
from circuitkit.tracking.result import Track
from tests.test_tasks import copy_next_task, task_file

TOKENS = ck.RepeatedTokens(block_len=8, batch=4, seed=0)
SCALES = {0: 0.0, 100: 0.5, 200: 1.0}
TOL = 2e-6
"""Records keep 6 decimals."""


def _checkpoint(root: Path, step: int, scale: float) -> Path:
    target = root / f"step{step}"
    shutil.copytree(zoo.info().path, target)
    state = load_file(str(target / "model.safetensors"))
    save_file({k: v * scale if ".attn.k." in k else v for k, v in state.items()}, str(target / "model.safetensors"))
    return target


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("ckpts")
    return [_checkpoint(root, step, scale) for step, scale in SCALES.items()]


@pytest.fixture(scope="module")
def task_path(tmp_path_factory) -> Path:
    return task_file(copy_next_task(n=12, d_vocab=10), tmp_path_factory.mktemp("task") / "copy.jsonl")


@pytest.fixture(scope="module")
def tracked(checkpoints, task_path, tmp_path_factory) -> tuple[Track, Path]:
    out = tmp_path_factory.mktemp("track")
    return ck.track(checkpoints, tokens=TOKENS, task=task_path, out=out, progress=False), out


def _close(a, b) -> bool:
    return a is None and b is None or a is not None and b is not None and abs(a - b) <= TOL


# ---------------------------------------------------------------------------------------------- the figures
def test_task_figures_equal_scan_task_on_each_checkpoint(tracked, checkpoints, task_path):
    track, _ = tracked
    task = ck.tasks.load_task(task_path)
    assert track.task["sha256"] == task_figures.task_sha256(task) and track.task["edges"] is False
    for record, path in zip(track.checkpoints, checkpoints, strict=True):
        scan = scan_task(load_checkpoint(path), task, edges=False)  # the defaults the track uses
        entry = record["task"]
        assert _close(entry["clean"], float(scan.clean.mean()))
        assert _close(entry["corrupted"], float(scan.corrupted.mean()))
        assert _close(entry["gap"], float(scan.clean.mean() - scan.corrupted.mean()))
        assert torch.allclose(torch.tensor(entry["scores"]), scan.scores, atol=TOL)
        assert torch.allclose(torch.tensor(entry["dla"]), scan.dla, atol=TOL)
        c = scan.circuit
        assert entry["circuit"]["heads"] == [head_name(h) for h in c.heads]
        assert entry["circuit"]["size"] == len(c.heads) and entry["circuit"]["n_nodes"] == 8
        assert _close(entry["circuit"]["faithfulness"], c.faithfulness)
        assert _close(entry["circuit"]["necessity"], c.necessity)
        held = entry["circuit"]["evaluation"]
        assert held["set"] == "evaluation" and held["pairs"] == c.other_set["pairs"] == 6
        assert _close(held["faithfulness"], c.other_set["faithfulness"])


def test_clean_and_corrupted_means_equal_a_plain_forward_pass(tracked, checkpoints, task_path):
    """logit(answer) - logit(wrong) at the last token, read here from the model's own logits (every prompt has 7
    tokens: no padding, no BOS added to token ids)."""
    task = ck.tasks.load_task(task_path)
    clean = torch.tensor([list(p.clean) for p in task.pairs])
    corrupted = torch.tensor([list(p.corrupted) for p in task.pairs])
    answer = torch.tensor([p.answers[0] for p in task.pairs])
    wrong = torch.tensor([p.wrongs[0] for p in task.pairs])
    rows = torch.arange(len(task.pairs))
    for record, path in zip(tracked[0].checkpoints, checkpoints, strict=True):
        model = load_checkpoint(path)
        with torch.no_grad():
            means = [float((lg[rows, answer] - lg[rows, wrong]).mean()) for lg in
                     (model(clean)[:, -1], model(corrupted)[:, -1])]
        assert abs(record["task"]["clean"] - means[0]) < 1e-4
        assert abs(record["task"]["corrupted"] - means[1]) < 1e-4


def test_the_gap_grows_with_the_key_scale_and_the_change_is_located(tracked):
    track, _ = tracked
    gaps = track.task_values("gap")
    assert gaps[0] < 0.5 < gaps[1] < gaps[2]  # uniform attention at step 0 cannot copy
    change = track.phase_change["task"]
    rises = [gaps[1] - gaps[0], gaps[2] - gaps[1]]
    best = max(range(2), key=lambda i: rises[i])
    assert change["interval"] == [track.steps[best], track.steps[best + 1]]
    assert abs(change["share"] - rises[best] / (max(gaps) - gaps[0])) < 1e-5


def test_locate_task_needs_a_rise_and_names_where_a_circuit_first_stays():
    def record(step, gap, circuit):
        return {"step": step, "task": {"gap": gap, "circuit": {} if circuit else None}}

    flat = locate_task([record(0, 1.0, False), record(1, 1.0 + MIN_GAP_RISE / 2, True), record(2, 1.0, True)])
    assert flat["step"] is None and "needs at least" in flat["reason"] and flat["circuit_from"] == 1
    rising = locate_task([record(0, 0.0, True), record(5, 0.2, False), record(9, 2.0, True)])
    assert rising["step"] == 9 and rising["interval"] == [5, 9] and rising["circuit_from"] == 9
    assert abs(rising["share"] - 0.9) < 1e-9
    noise = locate_task([record(0, MIN_GAP_RISE / 2, True), record(1, 1.0, True), record(2, 1.5, True)])
    assert noise["circuit_from"] == 1  # a circuit without a gap to explain does not count


# ---------------------------------------------------------------------------------------------- the files
def test_track_json_holds_the_task_and_loads_back(tracked):
    track, out = tracked
    data = json.loads((out / "track.json").read_text())
    assert data["settings"]["task"] == track.task and "task" in data["units"]
    assert [c["task"] for c in data["checkpoints"]] == [r["task"] for r in track.checkpoints]
    loaded = Track.load(out)
    assert loaded.task_values("gap") == track.task_values("gap")
    assert torch.equal(loaded.task_scores("dla"), track.task_scores("dla"))
    assert loaded.phase_change["task"] == track.phase_change["task"]
    merged = ck.tracking.merge(out)  # the records alone give the same track
    assert [r["task"] for r in merged.checkpoints] == [r["task"] for r in track.checkpoints]


def test_report_draws_the_gap_and_the_top_heads(tracked):
    track, out = tracked
    page = (out / "report.html").read_text()
    for key in ("task", "task_circuit", "task_heads"):
        assert f'id="ck-sec-{key}"' in page
    from circuitkit.report.track_page import top_task_heads

    top = top_task_heads(track)
    last = track.task_scores()[-1].abs().flatten()
    assert len(top) == 5 and top[0] == f"{int(last.argmax()) // 4}.{int(last.argmax()) % 4}"
    for name in top:
        assert f"<title>head {name}</title>" in page
    assert "<th>task gap</th>" in page and f"{track.task_values('gap')[-1]:+.3f}" in page


def test_a_track_without_a_task_has_none(checkpoints, tmp_path):
    track = ck.track(checkpoints[:1], tokens=TOKENS, out=tmp_path, progress=False)
    assert track.task is None and "task" not in track.checkpoints[0] and "task" not in track.phase_change
    assert "task" not in json.loads((tmp_path / "track.json").read_text())["units"]
    assert Track.load(tmp_path).task is None  # a track.json without task figures (as before tasks) loads
    with pytest.raises(CircuitkitError, match="measured no task"):
        track.task_values("gap")
    with pytest.raises(CircuitkitError, match="track: target"):
        ck.track(checkpoints[:1], tokens=TOKENS, target=0.5, progress=False)


def _edit(file: Path, change) -> None:
    data = json.loads(file.read_text())
    change(data)
    file.write_text(json.dumps(data))


@pytest.mark.parametrize(("change", "field"), [
    (lambda r: r["task"].update(gap="abc"), "task.gap"),
    (lambda r: r["task"].pop("clean"), "task.clean"),
    (lambda r: r["task"]["scores"].pop(), "task.scores"),
    (lambda r: r["task"]["dla"][0].append(1.0), "task.dla[0]"),
    (lambda r: r["task"]["circuit"]["heads"].append("5.0"), "task.circuit.heads[" ),
    (lambda r: r["task"]["circuit"].update(faithfulness=None), "task.circuit.faithfulness"),
    (lambda r: r["task"]["circuit"]["evaluation"].update(pairs=0), "task.circuit.evaluation.pairs"),
    (lambda r: r.pop("task"), "task"),
    (lambda r: r["settings"].pop("task"), "task"),
])
def test_bad_task_fields_are_refused_naming_the_field(tracked, tmp_path, change, field):
    out = tmp_path / "copy"
    shutil.copytree(tracked[1], out)
    _edit(out / "track-step100.json", change)
    with pytest.raises(CircuitkitError) as caught:
        ck.tracking.merge(out)
    assert f"field '{field}" in str(caught.value) and "track-step100.json" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_track_json_with_a_checkpoint_lacking_its_task_is_refused(tracked, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(tracked[1], out)
    _edit(out / "track.json", lambda t: t["checkpoints"][1].pop("task"))
    with pytest.raises(CircuitkitError, match=r"field 'checkpoints\[1\]\.task'"):
        Track.load(out)


# ---------------------------------------------------------------------------------------------- resume
def test_a_rerun_resumes_and_another_task_measures_again(checkpoints, task_path, tmp_path, monkeypatch):
    ck.track(checkpoints[:2], tokens=TOKENS, task=task_path, out=tmp_path, progress=False)
    counted = []
    real = task_figures.scan_task
    monkeypatch.setattr(task_figures, "scan_task", lambda *a, **k: counted.append(1) or real(*a, **k))
    again = ck.track(checkpoints[:2], tokens=TOKENS, task=task_path, out=tmp_path, progress=False)
    assert counted == [] and len(again.checkpoints) == 2
    other = task_file(copy_next_task(n=12, d_vocab=10, seed=1), tmp_path.parent / "other.jsonl")
    redone = ck.track(checkpoints[:2], tokens=TOKENS, task=other, out=tmp_path, progress=False)
    assert len(counted) == 2 and redone.task["sha256"] != again.task["sha256"]
    counted.clear()
    ck.track(checkpoints[:2], tokens=TOKENS, task=other, target=0.9, out=tmp_path, progress=False)
    assert len(counted) == 2  # another target: measured again


def test_a_checkpoint_whose_weights_changed_is_measured_again_with_its_task(task_path, tmp_path, monkeypatch):
    ckpts = [_checkpoint(tmp_path / "run", step, scale) for step, scale in ((0, 0.0), (100, 1.0))]
    out = tmp_path / "out"
    first = ck.track(ckpts, tokens=TOKENS, task=task_path, out=out, progress=False)
    _checkpoint(tmp_path / "again", 0, 1.0)  # step 0 retrained: the bundled weights copied over it
    shutil.copy(tmp_path / "again" / "step0" / "model.safetensors", ckpts[0] / "model.safetensors")
    counted = []
    real = task_figures.scan_task
    monkeypatch.setattr(task_figures, "scan_task", lambda *a, **k: counted.append(1) or real(*a, **k))
    second = ck.track(ckpts, tokens=TOKENS, task=task_path, out=out, progress=False)
    assert len(counted) == 1 and second.checkpoints[1]["task"] == first.checkpoints[1]["task"]
    assert second.checkpoints[0]["task"] == second.checkpoints[1]["task"]  # now the same weights as step 100


# ---------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(("content", "name", "needle"), [
    ("not json\n", "bad.jsonl", "task file"),
    ('{"clean": [1, 2], "corrupted": [1, 3]}\n', "missing.jsonl", "task file"),
    ("", "empty.jsonl", "holds no pairs"),
    ('{"clean": [1], "corrupted": [2], "answer": 1, "wrong": 2}\n', "pairs.txt", "suffix"),
    (None, "absent.jsonl", "no such file"),
])
def test_bad_task_files_are_refused_before_any_checkpoint_loads(checkpoints, tmp_path, monkeypatch, content, name,
                                                                  needle):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    loaded = []
    monkeypatch.setattr(track_sources, "load", lambda *a, **k: loaded.append(1))
    with pytest.raises(CircuitkitError, match=needle):
        ck.track(checkpoints, tokens=TOKENS, task=path, out=tmp_path / "out", progress=False)
    assert loaded == [] and not (tmp_path / "out").exists()


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"task": 3}, "track: task"), ({"target": 1.5}, "track: target"), ({"target": 0}, "track: target")])
def test_bad_task_settings_are_refused_before_any_checkpoint_loads(checkpoints, task_path, monkeypatch, kwargs,
                                                                   needle):
    loaded = []
    monkeypatch.setattr(track_sources, "load", lambda *a, **k: loaded.append(1))
    with pytest.raises(CircuitkitError, match=needle):
        ck.track(checkpoints, tokens=TOKENS, progress=False, **({"task": task_path} | kwargs))
    assert loaded == []


def test_cli_track_task_prints_the_table(checkpoints, task_path, tracked, tmp_path, capsys):
    from circuitkit.cli import main

    out = tmp_path / "out"
    assert main(["track", *map(str, checkpoints), "--task", str(task_path), "--out", str(out), "--block-len", "8",
                 "--batch", "4"]) == 0
    printed = capsys.readouterr().out
    header = next(line for line in printed.splitlines() if "corrupted" in line and "held-out" in line)
    rows = printed.splitlines()[printed.splitlines().index(header) + 1:][:3]
    track = tracked[0]
    for row, record in zip(rows, track.checkpoints, strict=True):
        cells = row.split()
        assert cells[0] == str(record["step"]) and cells[3] == f"{record['task']['gap']:+.3f}"
        assert cells[4] == f"{record['task']['circuit']['size']}/8"
    assert "Task 'copy'" in printed
    capsys.readouterr()
    assert main(["track", str(checkpoints[0]), "--task", str(tmp_path / "none.jsonl"), "--out", str(out)]) == 2
    assert "no such file" in capsys.readouterr().err


def test_track_merge_refuses_task(tracked, task_path, capsys):
    from circuitkit.cli import main

    assert main(["track", "--merge", str(tracked[1]), "--task", str(task_path)]) == 2
    assert "--task" in capsys.readouterr().err


def test_cli_track_target_reaches_the_tasks_circuit(checkpoints, task_path, tmp_path, capsys):
    from circuitkit.cli import main

    out = tmp_path / "out"
    assert main(["track", str(checkpoints[-1]), "--task", str(task_path), "--target", "0.5", "--out", str(out),
                 "--block-len", "8", "--batch", "4"]) == 0
    saved = json.loads((out / "track.json").read_text())
    assert saved["settings"]["task"]["target"] == 0.5
    direct = ck.track([checkpoints[-1]], tokens=TOKENS, task=task_path, target=0.5, out=tmp_path / "py",
                      progress=False)
    assert saved["checkpoints"][0]["task"]["circuit"] == direct.checkpoints[0]["task"]["circuit"]
    capsys.readouterr()
    assert main(["track", str(checkpoints[0]), "--target", "0.5", "--out", str(tmp_path / "x")]) == 2
    assert "--target" in capsys.readouterr().err
    assert main(["track", str(checkpoints[0]), "--task", str(task_path), "--target", "1.5"]) == 2
