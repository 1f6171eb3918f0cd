"""SIGTERM and SIGHUP during save() are handled like SIGINT: the pair is replaced together or not at all, and no
temporary file is left behind; then the signal takes its course (the handler installed before runs, or the
process ends by that signal).

In process: a handler of the test's own stands in for the default action (which would end pytest). In a child
process: the default action, a real SIGTERM sent from outside at the instant between the two renames and while
the temporaries are being written."""

from __future__ import annotations

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

ROOT = Path(__file__).resolve().parents[1]
CHILD_TIMEOUT_S = 90
"""The child builds two small reports first: seconds, on a loaded 2-core machine tens of seconds."""
SIGNALS = [signal.SIGTERM, signal.SIGHUP]


@pytest.fixture(scope="module")
def scans():
    return synthetic_scan(seed=0), synthetic_scan(seed=1)


class Caught(Exception):
    pass


@pytest.fixture
def own_handler(request):
    """The test's handler for the signal: raises Caught (the default action would end pytest)."""
    number = request.param
    previous = signal.signal(number, lambda n, f: (_ for _ in ()).throw(Caught(n)))
    yield number
    signal.signal(number, previous)


@pytest.mark.parametrize("own_handler", SIGNALS, indirect=True, ids=lambda s: s.name)
def test_signal_between_the_renames_is_delivered_after_both(scans, tmp_path, monkeypatch, own_handler):
    old, new = scans
    save(old, tmp_path)
    calls = signal_between_renames(monkeypatch, own_handler)
    with pytest.raises(Caught):
        save(new, tmp_path)
    assert len(calls) == 2
    assert saved_pair(tmp_path) == (build_report(new).encode(), scores_text(new).encode())
    assert leftover_temporaries(tmp_path) == []


@pytest.mark.parametrize("own_handler", SIGNALS, indirect=True, ids=lambda s: s.name)
def test_signal_while_writing_the_temporaries_keeps_the_old_pair_and_removes_them(scans, tmp_path, monkeypatch,
                                                                                   own_handler):
    old, new = scans
    save(old, tmp_path)
    before = saved_pair(tmp_path)
    real = save_module.write_temp
    calls = []

    def write(out, name, payload):
        path = real(out, name, payload)
        calls.append(name)
        if len(calls) == 2:  # both temporaries complete on disk, nothing renamed yet
            os.kill(os.getpid(), own_handler)
        return path

    monkeypatch.setattr(save_module, "write_temp", write)
    with pytest.raises(Caught):
        save(new, tmp_path)
    assert saved_pair(tmp_path) == before
    assert leftover_temporaries(tmp_path) == []


def test_a_handler_that_returns_makes_an_unfinished_save_one_error_line(scans, tmp_path, monkeypatch):
    old, new = scans
    save(old, tmp_path)
    before = saved_pair(tmp_path)
    seen = []
    previous = signal.signal(signal.SIGTERM, lambda n, f: seen.append(n))
    real = save_module.write_temp

    def write(out, name, payload):
        os.kill(os.getpid(), signal.SIGTERM)
        return real(out, name, payload)

    monkeypatch.setattr(save_module, "write_temp", write)
    try:
        with pytest.raises(CircuitkitError, match="interrupted by signal SIGTERM"):
            save(new, tmp_path)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert seen == [signal.SIGTERM] and saved_pair(tmp_path) == before and leftover_temporaries(tmp_path) == []


_CHILD = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from circuitkit.report import saving as save_module
    from tests.report_fixtures import synthetic_scan

    out, ready, when = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    save_module.save(synthetic_scan(seed=0), out)
    new = synthetic_scan(seed=1)
    real_replace, real_write = os.replace, save_module.write_temp
    calls = []

    def replace(src, dst):
        calls.append(dst)
        if when == "between-renames" and len(calls) == 1:
            ready.write_text("between")
            time.sleep(5)  # the parent's SIGTERM arrives here
        return real_replace(src, dst)

    def write(directory, name, payload):
        path = real_write(directory, name, payload)
        if when == "writing":
            ready.write_text("writing")
            time.sleep(5)
        return path

    save_module.os.replace = replace
    save_module.write_temp = write
    save_module.save(new, out)
    print("finished without the signal")
    """
)


@pytest.mark.parametrize("when", ["between-renames", "writing"])
def test_sigterm_from_outside_in_a_child_process(scans, tmp_path, when):
    old, new = scans
    out, ready = tmp_path / "out", tmp_path / "ready"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(out), str(ready), when], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until_ready(child, ready, CHILD_TIMEOUT_S, poll_s=0.02)
        os.kill(child.pid, signal.SIGTERM)
        stdout, stderr = child.communicate(timeout=CHILD_TIMEOUT_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGTERM, stderr[-2000:]
    assert "finished" not in stdout
    expected = (build_report(new) if when == "between-renames" else build_report(old)).encode()
    expected_scores = (scores_text(new) if when == "between-renames" else scores_text(old)).encode()
    assert saved_pair(out) == (expected, expected_scores)
    assert leftover_temporaries(out) == []
