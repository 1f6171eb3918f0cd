"""The committed theory notebook is what its generator writes, and is committed without outputs.

(Executing it top to bottom is tests/test_notebooks.py's job, for every notebook.)
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import nbformat

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def _generator():
    spec = importlib.util.spec_from_file_location("make_05", NOTEBOOKS / "make_05_attention_theory.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_notebook_matches_generator_and_has_no_outputs():
    committed = nbformat.read(NOTEBOOKS / "05_attention_theory.ipynb", as_version=4)
    generated = _generator().CELLS
    assert [c.source for c in committed.cells] == [c.source for c in generated]
    assert [c.cell_type for c in committed.cells] == [c.cell_type for c in generated]
    assert all(not c.get("outputs") for c in committed.cells if c.cell_type == "code")
    nbformat.validate(committed)
