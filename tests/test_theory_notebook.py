"""The theory notebook teaches on its own: it computes through ``circuitkit.theory``, every section states its
formula, it covers rank collapse, the capacity of a head and positional encodings, and it points at nothing the
reader does not have.

(The notebook is its own source; that its committed outputs are current, that it names only existing objects and
runs top to bottom offline is tests/test_notebooks.py's job, for every notebook.)
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

try:
    import nbformat
except ImportError:  # a GPU machine's image has no Jupyter: `pytest -m cuda tests` must still collect there
    if os.environ.get("CI"):
        raise  # CI installs the dev extras: a CI machine cannot silently skip the notebooks
    pytest.skip("nbformat is not installed (pip install -e '.[dev]' installs it)", allow_module_level=True)

import circuitkit.theory

PATH = Path(__file__).resolve().parents[1] / "notebooks" / "05_attention_theory.ipynb"
TOPICS = ("rank collapse", "capacity", "positional encoding", "rotary")
"""Sections the notebook must hold (matched case-insensitively against its ``## `` headings)."""


def _notebook() -> nbformat.NotebookNode:
    return nbformat.read(PATH, as_version=4)


def theory_names(sources: list[str]) -> set[str]:
    """The ``theory.<name>`` attributes the code cells use."""
    names = set()
    for source in sources:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "theory":
                names.add(node.attr)
    return names


def sections(notebook: nbformat.NotebookNode) -> list[tuple[str, str]]:
    """``(heading, text)`` of each ``## `` section: its heading and the markdown up to the next heading."""
    found: list[tuple[str, str]] = []
    for cell in notebook.cells:
        if cell.cell_type != "markdown":
            continue
        for line in cell.source.splitlines():
            if line.startswith("## "):
                found.append((line[3:].strip(), ""))
            elif found:
                found[-1] = (found[-1][0], found[-1][1] + line + "\n")
    return found


def test_theory_notebook_uses_exported_theory_functions():
    code = [c.source for c in _notebook().cells if c.cell_type == "code"]
    used = theory_names(code)
    assert "from circuitkit import theory" in "\n".join(code)
    assert len(used) >= 30, f"expected the notebook to compute most of circuitkit.theory, it uses {sorted(used)}"
    assert used <= set(circuitkit.theory.__all__), f"not exported: {sorted(used - set(circuitkit.theory.__all__))}"


def test_theory_is_not_reached_through_the_top_level_package():
    """``theory`` is exported only under ``circuitkit.theory``: ``ck.sdpa_torch`` must not exist."""
    import circuitkit

    assert not set(circuitkit.theory.__all__) & set(dir(circuitkit))


def test_every_section_states_a_formula():
    found = sections(_notebook())
    assert len(found) >= 10
    without = [heading for heading, text in found if "$" not in text]
    assert not without, f"sections that state no formula ($...$): {without}"


def test_the_notebook_covers_the_topics():
    headings = " | ".join(heading.lower() for heading, _ in sections(_notebook()))
    missing = [topic for topic in TOPICS if topic not in headings]
    assert not missing, f"no section about {missing}; headings: {headings}"


def test_section_reader_sees_headings_and_their_text():
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# t\nintro"),
        nbformat.v4.new_markdown_cell("## One\n$a = b$"),
        nbformat.v4.new_code_cell("x = 1"),
        nbformat.v4.new_markdown_cell("more\n## Two\nplain"),
    ])
    assert sections(notebook) == [("One", "$a = b$\nmore\n"), ("Two", "plain\n")]


def test_theory_name_reader_sees_attributes_only_of_theory():
    assert theory_names(["x = theory.sdpa_torch(q)\ny = other.rope\nz = theory.rope(1).dim"]) == {"sdpa_torch", "rope"}
