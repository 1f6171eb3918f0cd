"""The import graph of circuitkit: no circle, and no import from a lower layer to a higher one.

An import counts wherever it stands (module level, inside a function, under ``TYPE_CHECKING``): an import deferred
to call time only hides a dependency, it does not remove it. A name taken from a package's face
(``from circuitkit.report import save``) counts as an import of the module that defines it (the face's lazy table
or its own imports say which), so a lazy face hides no edge either.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation", ("__init__", "errors", "_lazy", "_html", "_terminal", "validate", "ranking", "uncertainty",
                    "model_state", "cpu_threads", "results", "edge_effect", "device_memory", "pass_budget",
                    "metric_registry", "vjp", "ig_path")),
    ("weights", ("weights", "factored", "composition", "random_baseline", "theory")),
    ("models", ("models", "zoo")),
    ("hand-built circuits, views", ("handbuilt", "viz")),
    ("detect", ("detect",)),
    ("graph engine", ("graph",)),
    ("circuits", ("circuits",)),
    ("scan records", ("scan_record", "progress", "stage")),
    ("report", ("report",)),
    ("tasks", ("tasks",)),
    ("scan", ("pipeline", "scan_types", "scan_intervals", "memory")),
    ("tracking", ("tracking",)),
    ("entry points", ("cli", "_entry", "zoo.train")),
)
"""The layers of the package, lowest first: a module may import its own layer and the layers below it, never one
above. Each entry names a top-level module or a subpackage (relative to ``circuitkit``; ``__init__`` is the package's
face), and the longest entry that contains a module decides its layer: ``zoo`` (the bundled models, which
``load_model`` loads by name) is part of model loading, while ``zoo.train`` (the script that trains them and checks
their heads with ``detect``) is an entry point."""

def _module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _faces(files: Mapping[str, Path]) -> dict[str, dict[str, str]]:
    """For each package face (``__init__.py``): public name -> the module that defines it, from the face's lazy
    table (a ``_LAZY = {name: module}`` literal) and its own ``from X import name`` lines."""
    faces: dict[str, dict[str, str]] = {}
    for name, path in files.items():
        if path.name != "__init__.py":
            continue
        table: dict[str, str] = {}
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign) else []
            if any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in targets) and isinstance(node.value, ast.Dict):
                table.update({k.value: v.value for k, v in zip(node.value.keys, node.value.values, strict=True)
                              if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)})
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                table.update({alias.asname or alias.name: node.module for alias in node.names})
        faces[name] = table
    return faces


def _imports(path: Path, name: str, files: Mapping[str, Path], faces: Mapping[str, Mapping[str, str]]) -> set[str]:
    """Every circuitkit module ``path`` imports, anywhere in the file. ``from X import Y`` counts ``X.Y`` when that
    is a module, else the module X's face says defines ``Y``, else ``X``; a name read off an imported face
    (``import circuitkit as ck; ck.scan``) counts the module the face says defines it."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))

    def through(base: str, attribute: str) -> str:
        if f"{base}.{attribute}" in files:
            return f"{base}.{attribute}"
        return faces.get(base, {}).get(attribute, base)

    found: set[str] = set()
    bound: dict[str, str] = {}  # local name -> the package face it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.add(alias.name)
                local = alias.asname or alias.name.split(".")[0]
                bound[local] = alias.name if alias.asname else alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            for alias in node.names:
                found.add(through(base, alias.name))
                bound[alias.asname or alias.name] = through(base, alias.name)
    faced = {local: module for local, module in bound.items() if module in faces}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in faced:
            found.add(through(faced[node.value.id], node.attr))
    return {module for module in found if module in files and module != name}


def _graph(src: Path = SRC) -> dict[str, set[str]]:
    """``module -> the circuitkit modules it imports`` for the package under ``src``."""
    files = {_module_name(path, src): path for path in (src / "circuitkit").rglob("*.py")}
    faces = _faces(files)
    return {name: _imports(path, name, files, faces) for name, path in files.items()}


def _layer_of(module: str) -> int | None:
    """The index in :data:`LAYERS` of the longest entry that contains ``module`` (None: in no layer)."""
    relative = "__init__" if module == "circuitkit" else module.removeprefix("circuitkit.")
    best, best_len = None, -1
    for index, (_, entries) in enumerate(LAYERS):
        for entry in entries:
            if (relative == entry or relative.startswith(entry + ".")) and len(entry) > best_len:
                best, best_len = index, len(entry)
    return best


def _up_imports(graph: Mapping[str, Iterable[str]]) -> set[tuple[str, str]]:
    """Every import ``(importer, imported)`` whose target stands in a higher layer than the importer."""
    layers = {module: _layer_of(module) for module in graph}
    return {(a, b) for a, targets in graph.items() for b in targets
            if layers[a] is not None and layers.get(b) is not None and layers[b] > layers[a]}


def _circles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_every_module_stands_in_one_layer():
    graph = _graph()
    assert [m for m in sorted(graph) if _layer_of(m) is None] == []
    # every entry names a module or subpackage that exists, and names it once
    entries = [entry for _, group in LAYERS for entry in group]
    assert len(entries) == len(set(entries))
    for entry in entries:
        module = "circuitkit" if entry == "__init__" else f"circuitkit.{entry}"
        assert module in graph, entry


def test_no_import_circle():
    circles = _circles(_graph())
    assert circles == [], circles


def test_no_import_up_the_layers():
    up = _up_imports(_graph())
    assert up == set(), sorted(up)


def test_the_graph_sees_imports_inside_functions():
    """Control: the deferred import ``_boot`` makes (transformer_lens aside) is found."""
    assert "circuitkit.models.tokenizer" in _graph()["circuitkit.models.loading"]


def test_a_name_from_a_lazy_face_is_an_import_of_its_module():
    """Control: ``Scan.save`` imports ``save`` from the report's lazy face: the edge runs to ``report.saving``."""
    graph = _graph()
    assert "circuitkit.report.saving" in graph["circuitkit.scan_types"]
    assert "circuitkit.report" not in graph["circuitkit.scan_types"]


def _package(tmp_path: Path, sources: Mapping[str, str]) -> dict[str, set[str]]:
    for relative, text in sources.items():
        path = tmp_path / "circuitkit" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return _graph(tmp_path)


def test_a_synthetic_up_import_is_caught(tmp_path):
    """Control: in foundation, ``validate`` importing the pipeline inside a function, ``errors`` taking a report
    function through the report's lazy face and ``ranking`` reading ``ck.scan`` off the package's face are each
    an import up the layers."""
    graph = _package(tmp_path, {
        "__init__.py": '_LAZY = {"scan": "circuitkit.pipeline"}\n',
        "validate.py": "def check():\n    from circuitkit.pipeline import scan\n",
        "errors.py": "from circuitkit.report import save\n",
        "ranking.py": "import circuitkit as ck\n\ndef top():\n    return ck.scan\n",
        "pipeline.py": "",
        "report/__init__.py": '_LAZY = {"save": "circuitkit.report.saving"}\n',
        "report/saving.py": "from circuitkit.errors import CircuitkitError\n",
    })
    assert _up_imports(graph) == {("circuitkit.validate", "circuitkit.pipeline"),
                                  ("circuitkit.errors", "circuitkit.report.saving"),
                                  ("circuitkit.ranking", "circuitkit.pipeline")}
    assert _circles(graph) == [["circuitkit.errors", "circuitkit.report.saving"]]


def test_a_synthetic_circle_is_caught(tmp_path):
    """Control: three modules of one layer that import each other in a loop form one circle; a fourth that
    imports one of them stays out of it."""
    graph = _package(tmp_path, {
        "__init__.py": "",
        "detect/__init__.py": "",
        "detect/a.py": "from circuitkit.detect import b\n",
        "detect/b.py": "def f():\n    from circuitkit.detect.c import g\n",
        "detect/c.py": "from . import a\n",
        "detect/d.py": "import circuitkit.detect.a\n",
    })
    assert _up_imports(graph) == set()
    assert _circles(graph) == [["circuitkit.detect.a", "circuitkit.detect.b", "circuitkit.detect.c"]]
