"""The README's Python examples run as written, and its quick start names commands that exist."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_readme_python_examples_run():
    blocks = _python_blocks()
    assert len(blocks) >= 2, "the README's API tour should hold Python examples"
    namespace: dict = {}
    for block in blocks:  # later blocks may use names from earlier ones, as a reader would
        exec(compile(block, str(README), "exec"), namespace)
    assert namespace["ex"].two_token.shape == (16, 16)
    assert namespace["out"].shape == (1, 5, 16)


def test_quick_start_is_two_commands_and_runs_scan_and_pytest():
    text = README.read_text(encoding="utf-8")
    quick = text.split("## Quick start", 1)[1]
    commands = re.search(r"```bash\n(.*?)```", quick, flags=re.S).group(1).strip().splitlines()
    assert len(commands) == 2
    assert commands[0].endswith("circuitkit scan") and "pip install torch==2.13.0" in commands[0]
    assert commands[1] == "python -m pytest -q"
    ci = (README.parent / ".ci" / "run").read_text(encoding="utf-8")
    assert "python -m pytest -q" in ci and 'pip install --quiet -e ".[dev]"' in ci
