"""What the tests of ``circuitkit.report.save`` share: the saved pair and the temporaries left beside it, a signal
sent to this process between save()'s two renames, and waiting for a child process to reach the point where a test
signals it."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

from circuitkit.report import saving as save_module
from circuitkit.report.saving import REPORT_NAME, SCORES_NAME, TEMP_PREFIX


def saved_pair(out: Path) -> tuple[bytes, bytes]:
    """The report and its scores as written in ``out``."""
    return (out / REPORT_NAME).read_bytes(), (out / SCORES_NAME).read_bytes()


def leftover_temporaries(out: Path) -> list[str]:
    """Names of save()'s temporary files still in ``out``."""
    return sorted(p.name for p in out.iterdir() if p.name.startswith(TEMP_PREFIX))


def signal_between_renames(monkeypatch: Any, number: int) -> list[str]:
    """Make save()'s first rename send signal ``number`` to this process right after it; returns the list of the
    renames' destinations, filled as they run."""
    real_replace = os.replace
    calls: list[str] = []

    def replace(src: Any, dst: Any) -> None:
        calls.append(dst)
        if len(calls) == 1:
            os.kill(os.getpid(), number)  # arrives between the two renames
        return real_replace(src, dst)

    monkeypatch.setattr(save_module.os, "replace", replace)
    return calls


def wait_until_ready(child: subprocess.Popen, ready: Path, timeout_s: float, poll_s: float) -> None:
    """Wait for ``child`` to create ``ready``; fail if it ends first (with its stderr, where piped) or never does."""
    deadline = time.monotonic() + timeout_s
    while not ready.exists():
        if child.poll() is not None:
            detail = f": {child.stderr.read()[-2000:]}" if child.stderr is not None else ""
            raise AssertionError(f"the child process ended before writing{detail}")
        assert time.monotonic() < deadline, "the child never started writing"
        time.sleep(poll_s)
