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


CPU_TORCH = "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
"""The tested torch line: PyTorch's CPU wheel index (the public package index gives the CUDA build on Linux)."""


def _quick_start() -> list[str]:
    quick = README.read_text(encoding="utf-8").split("## Quick start", 1)[1]
    return re.search(r"```bash\n(.*?)```", quick, flags=re.S).group(1).strip().splitlines()


def _pip_installs(text: str) -> list[str]:
    """Every ``pip install ...`` step of a command line or script, ``--quiet`` dropped, in order."""
    steps = re.findall(r"pip install [^&\n]+", text)
    return [" ".join(word for word in step.split() if word != "--quiet") for step in steps]


def test_quick_start_is_two_commands_a_user_install_and_the_tests():
    commands = _quick_start()
    assert len(commands) == 2
    setup, tests = commands
    assert setup.endswith("circuitkit scan") and setup.startswith("python3 -m venv .venv")
    assert _pip_installs(setup) == [CPU_TORCH, "pip install -e ."], "torch first, then the user install (no dev)"
    assert tests == 'pip install -e ".[dev]" && python -m pytest -q'


def test_ci_installs_exactly_as_the_quick_start_says():
    ci = (README.parent / ".ci" / "run").read_text(encoding="utf-8")
    steps = [step for step in _pip_installs(ci) if step != "pip install --upgrade pip"]
    assert steps == _pip_installs("\n".join(_quick_start()))
    assert "circuitkit scan" in ci and ci.rstrip().endswith("python -m pytest -q")


def test_readme_offers_the_cuda_torch_line_beside_the_tested_one():
    text = README.read_text(encoding="utf-8")
    choice = text.split("### CPU or GPU", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in choice.splitlines() if line.startswith("| `pip install torch")]
    assert [row.split("`")[1] for row in rows] == [CPU_TORCH, "pip install torch==2.13.0"]  # the tested one first
    assert "CUDA" in rows[1] and "CPU build" in rows[0]


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
