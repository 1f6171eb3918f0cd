"""No two circuitkit modules import each other (at module level or inside a function): a circle means one of them
holds something that belongs in a third module, and an import deferred to call time only hides it."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str) -> set[str]:
    """Every circuitkit module ``path`` imports, anywhere in the file (``from X import Y`` counts ``X.Y`` when that
    is a module)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {module for module in found if module.startswith("circuitkit")}


def _graph() -> dict[str, set[str]]:
    files = {_module_name(path): path for path in (SRC / "circuitkit").rglob("*.py")}
    return {name: _imports(path, name) & set(files) for name, path in files.items()}


KNOWN = {("circuitkit.report.figures", "circuitkit.report.summary")}
"""Circles still open, in code another change reworks (the report); none may be added."""


def test_no_two_modules_import_each_other():
    graph = _graph()
    packages = {name for name in graph if (SRC / Path(*name.split(".")) / "__init__.py").is_file()}
    # a package's __init__ re-exporting its modules is not a circle: only module <-> module pairs count
    circles = sorted({tuple(sorted((a, b))) for a, targets in graph.items() for b in targets
                      if a != b and a in graph.get(b, set()) and not {a, b} & packages})
    assert set(circles) <= KNOWN, sorted(set(circles) - KNOWN)
    for pair in [("circuitkit.composition", "circuitkit.random_baseline"),
                 ("circuitkit.detect.registry", "circuitkit.detect.tokens"),
                 ("circuitkit.models.bridge", "circuitkit.models.toy")]:
        assert pair not in circles


def test_the_graph_sees_imports_inside_functions():
    """Control: the deferred import ``_boot`` makes (transformer_lens aside) is found."""
    assert "circuitkit.models.tokenizer" in _graph()["circuitkit.models.loading"]
