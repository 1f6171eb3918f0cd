"""save(): report.html and scores.json are written together or not at all. A failure, a Ctrl-C or a kill while
writing leaves the previous pair byte-identical; nothing half-written is ever visible under the real names."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from circuitkit import CircuitkitError
from circuitkit.report import build_report, save
from circuitkit.report import saving as save_module
from circuitkit.report.saving import scores_text
from tests.report_fixtures import synthetic_scan
from tests.save_helpers import leftover_temporaries, saved_pair, signal_between_renames, wait_until_ready

KILL_TIMEOUT_S = 60  # the child builds a small report first: seconds on a loaded 2-core machine


@pytest.fixture(scope="module")
def scans():
    old = synthetic_scan(seed=0)
    new = synthetic_scan(seed=1)
    assert build_report(old) != build_report(new)
    return old, new


def test_save_writes_the_report_and_its_scores(scans, tmp_path):
    old, _ = scans
    saved = save(old, tmp_path / "a" / "b")
    assert saved.report.read_text(encoding="utf-8") == build_report(old)
    assert saved.scores.read_text(encoding="utf-8") == scores_text(old)
    assert saved.pngs == () and leftover_temporaries(saved.report.parent) == []
    # the Scan methods go through the same functions
    assert old.save(tmp_path / "c").report.read_bytes() == saved.report.read_bytes()
    assert old.to_json()["format"] == 4 and "Induction heads" in old._repr_html_()


@pytest.mark.parametrize("when", ["first-file", "second-file"])
@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), KeyboardInterrupt()],
                         ids=["disk-full", "ctrl-c"])
def test_failure_while_writing_keeps_the_previoussaved_pair(scans, tmp_path, monkeypatch, when, error):
    old, new = scans
    save(old, tmp_path)
    before = saved_pair(tmp_path)
    real = save_module.write_temp
    calls = []

    def failing(out, name, payload):
        calls.append(name)
        if len(calls) == (1 if when == "first-file" else 2):
            real(out, name, payload[: len(payload) // 2])  # half written, then the failure
            raise error
        return real(out, name, payload)

    monkeypatch.setattr(save_module, "write_temp", failing)
    expected = CircuitkitError if isinstance(error, OSError) else KeyboardInterrupt
    with pytest.raises(expected):
        save(new, tmp_path)
    assert saved_pair(tmp_path) == before
    # the half-written temporary of the failing call is not cleaned by write_together (it never got its path):
    # it is hidden and never read; the complete one of the first call is removed
    assert all(".old." not in name for name in leftover_temporaries(tmp_path))


def test_failure_between_the_renames_restores_the_first_file(scans, tmp_path, monkeypatch):
    old, new = scans
    save(old, tmp_path)
    before = saved_pair(tmp_path)
    real_replace = os.replace
    calls = []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == 2:  # the second target: the first is already replaced
            raise OSError(5, "Input/output error")
        return real_replace(src, dst)

    monkeypatch.setattr(save_module.os, "replace", replace)
    with pytest.raises(CircuitkitError, match="unchanged"):
        save(new, tmp_path)
    assert saved_pair(tmp_path) == before
    assert leftover_temporaries(tmp_path) == []


def test_failure_on_a_fresh_directory_leaves_nothing(scans, tmp_path, monkeypatch):
    _, new = scans
    real_replace = os.replace
    calls = []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(5, "Input/output error")
        return real_replace(src, dst)

    monkeypatch.setattr(save_module.os, "replace", replace)
    with pytest.raises(CircuitkitError):
        save(new, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


_CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from circuitkit.report import saving as save_module
    from tests.report_fixtures import synthetic_scan

    out, ready = Path(sys.argv[1]), Path(sys.argv[2])
    real = save_module.write_temp
    calls = []

    def slow(directory, name, payload):
        calls.append(name)
        path = real(directory, name, payload)
        if len(calls) == 1:  # one complete temporary on disk, the second not yet written
            ready.write_text("writing")
            time.sleep(600)
        return path

    save_module.write_temp = slow
    save_module.save(synthetic_scan(seed=1), out)
    """
)


def test_a_process_killed_while_writing_leaves_the_previoussaved_pair(scans, tmp_path):
    old, _ = scans
    out = tmp_path / "out"
    save(old, out)
    before = saved_pair(out)
    ready = tmp_path / "ready"
    root = Path(__file__).resolve().parents[1]
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(out), str(ready)], cwd=root)
    try:
        wait_until_ready(child, ready, KILL_TIMEOUT_S, poll_s=0.05)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait()
    assert child.returncode == -signal.SIGKILL
    assert saved_pair(out) == before
    assert len(leftover_temporaries(out)) == 1  # the hidden temporary a hard kill cannot clean; never read


def test_ctrl_c_during_the_renames_is_delivered_after_both(scans, tmp_path, monkeypatch):
    old, new = scans
    save(old, tmp_path)
    calls = signal_between_renames(monkeypatch, signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        save(new, tmp_path)
    assert len(calls) == 2  # both renames ran before the interrupt was delivered
    assert saved_pair(tmp_path) == (build_report(new).encode(), scores_text(new).encode())


@pytest.mark.parametrize(
    "out_dir, message",
    [(None, "save: out_dir: given None; expected a directory path"), ("file", "not a file"),
     ("", "a non-empty directory path"), ("a\0b", "without NUL"), (b"dir", "str or os.PathLike"),
     ("under-file", "a writable directory \\(cannot create 'sub' in .*, which is a file")],
    ids=["none", "a-file", "empty", "nul", "bytes", "under-a-file"],
)
def test_bad_out_dir_is_a_circuitkit_error(scans, tmp_path, out_dir, message):
    if out_dir in ("file", "under-file"):
        (tmp_path / "file").write_text("x")
        out_dir = tmp_path / "file" / ("sub" if out_dir == "under-file" else "")
    with pytest.raises(CircuitkitError, match=message):
        save(scans[0], out_dir)


@pytest.mark.parametrize("bad", [None, "scan", {}, object()], ids=["none", "str", "dict", "object"])
def test_entry_points_want_a_scan(bad, tmp_path):
    from circuitkit.report import build_report, scan_json, summary_html

    for call, where in ((lambda: save(bad, tmp_path), "save"), (lambda: scan_json(bad), "scan_json"),
                        (lambda: build_report(bad), "build_report"), (lambda: summary_html(bad), "summary_html")):
        with pytest.raises(CircuitkitError, match=f"{where}: scan: given .*; expected a circuitkit Scan"):
            call()


def test_compress_must_be_a_bool(scans):
    with pytest.raises(CircuitkitError, match="build_report: compress"):
        build_report(scans[0], compress=1)


def test_png_must_be_a_bool(scans, tmp_path):
    with pytest.raises(CircuitkitError, match="save: png"):
        save(scans[0], tmp_path, png="yes")


def test_unwritable_directory_is_a_circuitkit_error(scans, tmp_path):
    if os.geteuid() == 0:
        # root writes anywhere: make the target's parent a file instead
        blocker = tmp_path / "blocker"
        blocker.write_text("x")
        with pytest.raises(CircuitkitError, match="save: out_dir"):
            save(scans[0], blocker / "sub")
        return
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(CircuitkitError, match="cannot write"):
            save(scans[0], locked)
    finally:
        locked.chmod(0o700)


def test_saved_pair_is_deterministic(scans, tmp_path):
    old, _ = scans
    first = saved_pair(save(old, tmp_path / "1").report.parent)
    second = saved_pair(save(dataclasses.replace(old), tmp_path / "2").report.parent)
    assert first == second
