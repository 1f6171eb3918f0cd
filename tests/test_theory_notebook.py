"""The theory notebook reaches the seed exercises through ``circuitkit.theory`` and says which exercise each
section computes.

(The notebook is its own source; that it is committed without outputs, names only existing objects and runs top
to bottom offline is tests/test_notebooks.py's job, for every notebook.)
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat

import circuitkit.theory

PATH = Path(__file__).resolve().parents[1] / "notebooks" / "05_attention_theory.ipynb"
SEED_SETS = ("000", "002", "003", "004")
"""The exercise sets in the design notes' ``seeds/``: Transformer theory, a textbook chapter, UDL ch. 12, a course."""


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


def test_theory_notebook_uses_exported_theory_functions():
    code = [c.source for c in _notebook().cells if c.cell_type == "code"]
    used = theory_names(code)
    assert "from circuitkit import theory" in "\n".join(code)
    assert len(used) >= 20, f"expected the notebook to compute most of circuitkit.theory, it uses {sorted(used)}"
    assert used <= set(circuitkit.theory.__all__), f"not exported: {sorted(used - set(circuitkit.theory.__all__))}"


def test_theory_is_not_reached_through_the_top_level_package():
    """``theory`` is exported only under ``circuitkit.theory`` (issue 10): ``ck.sdpa_torch`` must not exist."""
    import circuitkit

    assert not set(circuitkit.theory.__all__) & set(dir(circuitkit))


def test_every_section_names_its_seed_exercise():
    headings = [
        line
        for cell in _notebook().cells
        if cell.cell_type == "markdown"
        for line in cell.source.splitlines()
        if line.startswith("## ")
    ]
    assert len(headings) >= 10
    uncited = [h for h in headings if not re.search(r"\b(" + "|".join(SEED_SETS) + r")\b", h) and "seeds" not in h]
    assert not uncited, f"sections without a seed exercise reference: {uncited}"


def test_theory_name_reader_sees_attributes_only_of_theory():
    assert theory_names(["x = theory.sdpa_torch(q)\ny = other.rope\nz = theory.rope(1).dim"]) == {"sdpa_torch", "rope"}
