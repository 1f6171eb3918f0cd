"""The notebooks in notebooks/: each ``.ipynb`` is its own and only source, is committed without outputs, names
only circuitkit objects that exist, and runs top to bottom (nbclient, kernel ``python3``) with the network blocked.

The network guard is a first cell injected before the notebook's own (not saved): ``socket.connect`` to any
non-loopback address raises, so a notebook that downloads anything fails here. Loopback stays open because the
kernel itself talks to this process over local sockets.

Edit a notebook in Jupyter (or with ``nbformat``), then clear its outputs before committing:
``python tests/test_notebooks.py --clear`` (every notebook; or name the files) does it with :func:`clear_outputs`.
"""

from __future__ import annotations

import ast
import importlib
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
IDS = [p.stem for p in NOTEBOOKS]
# a single cell gets this long before the run fails (a hung cell, not a slow notebook, is what it catches)
CELL_TIMEOUT_S = 180
# each notebook takes ~10-30 s on 2 shared cores, most of it kernel start and imports; 4x that is a regression
NOTEBOOK_BUDGET_S = 120

NO_NETWORK = '''
import ipaddress as _ip, socket as _socket

_connect = _socket.socket.connect

def _guarded_connect(self, address, *args):
    host = address[0] if isinstance(address, tuple) else None
    if host is not None:
        try:
            local = _ip.ip_address(host).is_loopback
        except ValueError:
            local = host == "localhost"
        if not local:
            raise OSError(f"network access is blocked in notebook tests (tried {address!r})")
    return _connect(self, address, *args)

_socket.socket.connect = _guarded_connect
'''


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 6, f"notebooks/*.ipynb: expected the project's six notebooks, found {IDS}"


def test_each_notebook_is_its_only_source():
    """No generator scripts or paired copies beside the notebooks: the ``.ipynb`` is what gets edited."""
    others = sorted(p.name for p in NOTEBOOK_DIR.iterdir() if p.is_file() and p.suffix != ".ipynb")
    assert not others, f"notebooks/ holds {others}; expected only .ipynb files (one source per notebook)"


# ---------------------------------------------------------------------- committed without outputs
def _output_problems(notebook: nbformat.NotebookNode) -> list[str]:
    problems = []
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        if cell.get("outputs"):
            problems.append(f"cell {index} has {len(cell.outputs)} output(s)")
        if cell.get("execution_count") is not None:
            problems.append(f"cell {index} has execution_count {cell.execution_count}")
        if "execution" in cell.get("metadata", {}):
            problems.append(f"cell {index} has execution timings in its metadata")
    return problems


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_committed_notebook_has_no_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    assert notebook.cells, f"{path.name} has no cells"
    assert notebook.metadata.get("kernelspec", {}).get("name") == "python3"
    problems = _output_problems(notebook)
    assert not problems, f"{path.name}: {problems}; clear the outputs before committing"


def clear_outputs(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Remove every code cell's outputs, execution count and execution timings (in place; returned)."""
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
            cell.metadata.pop("execution", None)
    return notebook


def _executed_looking() -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell("1 + 1")
    cell.outputs = [nbformat.v4.new_output("execute_result", data={"text/plain": "2"}, execution_count=1)]
    cell.execution_count = 1
    cell.metadata["execution"] = {"iopub.execute_input": "2025-01-01T00:00:00Z"}
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# t"), cell])


def test_output_check_finds_outputs():
    """The check above can fail: an executed-looking cell is reported three ways."""
    assert _output_problems(_executed_looking()) == [
        "cell 1 has 1 output(s)",
        "cell 1 has execution_count 1",
        "cell 1 has execution timings in its metadata",
    ]


def test_clear_outputs_leaves_the_sources():
    notebook = _executed_looking()
    sources = [cell.source for cell in notebook.cells]
    clear_outputs(notebook)
    assert _output_problems(notebook) == []
    assert [cell.source for cell in notebook.cells] == sources
    nbformat.validate(notebook)


# ---------------------------------------------------------------------- the names a notebook uses exist
def _resolve(path: str) -> Any:
    """The module or object at a dotted path (``circuitkit.viz.attention.token_strings``)."""
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError as error:
        if error.name != path:
            raise
    parent, _, name = path.rpartition(".")
    return getattr(_resolve(parent), name)


def missing_circuitkit_names(sources: list[str]) -> list[str]:
    """Names of circuitkit objects that code cells use but that do not exist: ``from circuitkit.x import y``
    where ``x`` has no ``y``, and ``alias.attr`` where ``alias`` is bound by such an import (or by
    ``import circuitkit as ck``) and has no ``attr``. Cells share one namespace, as in a kernel. Public names
    are read with ``dir()``, so lazy packages list them without importing what defines them."""
    aliases: dict[str, str] = {}
    missing: list[str] = []

    def check(owner: str, name: str) -> None:
        if name not in dir(_resolve(owner)):
            missing.append(f"{owner}.{name}")

    for source in sources:
        tree = ast.parse(source)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for item in node.names:
                    if item.name.split(".")[0] == "circuitkit":
                        aliases[item.asname or "circuitkit"] = item.name if item.asname else "circuitkit"
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "circuitkit":
                for item in node.names:
                    check(node.module, item.name)
                    aliases[item.asname or item.name] = f"{node.module}.{item.name}"
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                check(aliases[node.value.id], node.attr)
    return sorted(set(missing))


def _code_sources(path: Path) -> list[str]:
    notebook = nbformat.read(path, as_version=4)
    return [cell.source for cell in notebook.cells if cell.cell_type == "code"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_names_only_existing_circuitkit_objects(path):
    """A fast, kernel-free check that a notebook follows the current API (renamed functions, moved modules)."""
    assert not missing_circuitkit_names(_code_sources(path)), f"{path.name} uses names circuitkit does not have"


def test_name_check_finds_missing_names():
    sources = [
        "import circuitkit as ck\nfrom circuitkit import viz\nfrom circuitkit.detect.tokens import RepeatedTokens",
        "ck.head_scores\nck.no_such_function\nviz.attention_heads\nviz.nope\nRepeatedTokens.build\n"
        "RepeatedTokens.first_half\nfrom circuitkit.detect import gone",
    ]
    assert missing_circuitkit_names(sources) == [
        "circuitkit.detect.gone",
        "circuitkit.detect.tokens.RepeatedTokens.first_half",
        "circuitkit.no_such_function",
        "circuitkit.viz.nope",
    ]


# ---------------------------------------------------------------------- every notebook runs, offline
@pytest.mark.slow
def test_network_guard_blocks_outside_connections_but_not_loopback():
    """The guard can fail a notebook: a cell that opens a socket to a public address errors."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    probe = nbformat.v4.new_notebook()
    probe.cells = [
        nbformat.v4.new_code_cell(NO_NETWORK),
        nbformat.v4.new_code_cell("import socket\nsocket.create_connection(('93.184.215.14', 80), timeout=2)"),
    ]
    with pytest.raises(CellExecutionError, match="network access is blocked"):
        NotebookClient(probe, kernel_name="python3", timeout=CELL_TIMEOUT_S).execute()


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_runs_offline(path, monkeypatch):
    from nbclient import NotebookClient

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = nbformat.read(path, as_version=4)
    assert notebook.cells, f"{path.name} has no cells"
    notebook.cells.insert(0, nbformat.v4.new_code_cell(NO_NETWORK))
    client = NotebookClient(
        notebook,
        kernel_name="python3",
        timeout=CELL_TIMEOUT_S,
        resources={"metadata": {"path": str(path.parent)}},
    )
    start = time.perf_counter()
    client.execute()  # raises CellExecutionError, naming the cell, on the first failing cell
    elapsed = time.perf_counter() - start
    errors = [
        output
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        if output.get("output_type") == "error"
    ]
    assert not errors
    assert elapsed < NOTEBOOK_BUDGET_S, f"{path.name} took {elapsed:.0f} s; expected under {NOTEBOOK_BUDGET_S} s"


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] != ["--clear"]:
        sys.exit("usage: python tests/test_notebooks.py --clear [NOTEBOOK.ipynb ...]  (default: every notebook)")
    for target in [Path(name) for name in sys.argv[2:]] or NOTEBOOKS:
        nbformat.write(clear_outputs(nbformat.read(target, as_version=4)), target)
        print(f"cleared {target}")
