"""The ``circuitkit`` console script (``circuitkit._entry``) behaves as ``circuitkit.cli.main`` does: the same exit
codes, output and files, and the ``atexit`` handlers still run; it only skips the interpreter's teardown. Each case
runs in a subprocess, since the script ends its process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _run(code: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=300)


ENTRY = "import sys; sys.argv[0] = 'circuitkit'; from circuitkit._entry import main; main()"
CLI = "import sys; sys.argv[0] = 'circuitkit'; from circuitkit.cli import main; sys.exit(main())"


@pytest.mark.parametrize("args", [("scan", "/no/such/model/dir"), ("--version",), (), ("scan", "--batch", "x")],
                         ids=["path error", "version", "help", "usage error"])
def test_exit_code_and_output_equal_the_cli(args):
    entry, cli = _run(ENTRY, *args), _run(CLI, *args)
    assert (entry.returncode, entry.stdout, entry.stderr) == (cli.returncode, cli.stdout, cli.stderr)


def test_atexit_handlers_still_run():
    code = "import atexit; atexit.register(print, 'atexit ran'); " + ENTRY
    out = _run(code, "scan", "/no/such/model/dir")
    assert out.returncode == 2 and out.stdout.strip().endswith("atexit ran")


def test_exit_code_of_sys_exit_values():
    from circuitkit._entry import exit_code

    assert (exit_code(None), exit_code(0), exit_code(3)) == (0, 0, 3)


@pytest.mark.slow
def test_the_scan_writes_the_same_files(tmp_path):
    entry = _run(ENTRY, "scan", "--out", str(tmp_path / "entry"))
    cli = _run(CLI, "scan", "--out", str(tmp_path / "cli"))
    assert entry.returncode == cli.returncode == 0, entry.stderr
    for name in ("scores.json", "report.html"):
        assert (tmp_path / "entry" / name).read_bytes() == (tmp_path / "cli" / name).read_bytes(), name
    assert entry.stdout.replace("entry", "cli") == cli.stdout  # the table and the answer, the path aside


def test_the_console_script_is_the_entry():
    pyproject = (Path(SRC).parent / "pyproject.toml").read_text(encoding="utf-8")
    assert 'circuitkit = "circuitkit._entry:main"' in pyproject
