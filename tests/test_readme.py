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


def test_notebook_extra_the_readme_names_exists():
    """``pip install -e ".[notebooks]"`` in the README installs JupyterLab and ipywidgets (no widget warnings)."""
    text = README.read_text(encoding="utf-8")
    assert 'pip install -e ".[notebooks]"' in text and "jupyter lab notebooks/" in text
    pyproject = (README.parent / "pyproject.toml").read_text(encoding="utf-8")  # tomllib is Python >= 3.11 only
    extra = re.search(r"^notebooks = \[(.*?)^\]", pyproject, flags=re.S | re.M).group(1)
    names = {re.split(r"[<>=\[ ]", requirement, maxsplit=1)[0] for requirement in re.findall(r'"([^"]+)"', extra)}
    assert {"jupyterlab", "ipywidgets"} <= names


USER_DOCS = ("README.md", "benchmarks/README.md")
DEVELOPMENT_HISTORY = re.compile(r"\bissue #?\d+|\(issue|\bgoal\b|\b0\.1\.0 took\b|#\d{1,3}\b", re.I)
"""Issue numbers, goals and project history: the user docs speak about what the tool does now."""


def test_docs_carry_no_issue_numbers_goals_or_history():
    root = README.parent
    hits = {name: DEVELOPMENT_HISTORY.findall((root / name).read_text(encoding="utf-8")) for name in USER_DOCS}
    assert not any(hits.values()), hits
    assert DEVELOPMENT_HISTORY.findall("edge attribution 4.5x (goal 5x); 0.1.0 took about 370x; issue 20")
