"""The notebooks in notebooks/: each ``.ipynb`` is its own and only source, is committed WITH its outputs (so it
reads on the web with its results), names only circuitkit objects that exist, points at nothing the reader does
not have, and its committed outputs are what running it gives now.

The slow test executes every notebook top to bottom (nbclient, kernel ``python3``) with the network blocked and
compares each cell's outputs with the committed ones after :func:`normalise`: execution counts, cell ids,
execution timings, memory addresses, plotly and CircuitsVis element ids and printed durations are ignored; numbers
may differ by one unit in their last printed digit or :data:`NUMBER_RTOL` relative (thread counts change the
order of float sums between machines), and rounding-level errors printed in scientific notation below
:data:`ROUNDING_LEVEL` count as equal. Anything else that differs fails the test.

Regenerate the committed outputs (after changing a notebook, or anything whose output a notebook shows):

    python tests/test_notebooks.py --execute                 # every notebook
    python tests/test_notebooks.py --execute notebooks/06_scan.ipynb

(from the repository root, with circuitkit importable, e.g. the project's virtual environment active). It runs
each notebook exactly as the test does and writes it back with its outputs, numbered from 1, without timings.

The network guard is a first cell injected before the notebook's own (removed again before comparing or saving):
``socket.connect`` to any non-loopback address raises, so a notebook that downloads anything fails here. Loopback
stays open because the kernel itself talks to this process over local sockets.
"""

from __future__ import annotations

import ast
import copy
import importlib
import json
import math
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

try:
    import nbformat
except ImportError:  # a GPU machine's image has no Jupyter: `pytest -m cuda tests` must still collect there
    if os.environ.get("CI"):
        raise  # CI installs the dev extras: a CI machine cannot silently skip the notebooks
    pytest.skip("nbformat is not installed (pip install -e '.[dev]' installs it)", allow_module_level=True)

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
IDS = [p.stem for p in NOTEBOOKS]
REGENERATE = "python tests/test_notebooks.py --execute"
# a single cell gets this long before the run fails (a hung cell, not a slow notebook, is what it catches)
CELL_TIMEOUT_S = 180
# each notebook takes ~15-50 s on 2 shared cores, most of it kernel start and imports; 3x that is a regression
NOTEBOOK_BUDGET_S = 150
# committed outputs stay small: one CircuitsVis view (its ~1.3 MB script bundle) per notebook at most
MAX_CIRCUITSVIS_VIEWS = 1
MAX_NOTEBOOK_BYTES = 2_500_000
MAX_TOTAL_BYTES = 10_000_000
NUMBER_RTOL = 1e-4
"""Relative difference allowed between a committed and a fresh number: float32 scores summed in another order
(other thread counts, another BLAS, another processor's vector width) move in the 7th digit, and a model trained
for a few hundred steps in a notebook carries that into the 5th (1.1e-5 seen between two Xeons); 1e-4 is well
below any digit a notebook discusses."""
ROUNDING_LEVEL = 1e-4
"""Numbers in scientific notation below this, on both sides, are rounding errors a notebook reports ("largest
difference from the dense SVD: 9.5e-07"); their digits depend on the machine, only their being small is compared."""

ENVIRONMENT = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "MPLBACKEND": "Agg"}

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

REFERENCES_THE_READER_LACKS = re.compile(
    r"\bseeds?/|\bseed (?:exercise|set)s?\b|\bseed \d{3}\b|\bexercise \d|\btask \d|beside the repository", re.I
)
"""Pointers to material that is not in the repository (exercise sets, their numbering)."""


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 6, f"notebooks/*.ipynb: expected the project's six notebooks, found {IDS}"


def test_each_notebook_is_its_only_source():
    """No generator scripts or paired copies beside the notebooks: the ``.ipynb`` is what gets edited."""
    others = sorted(p.name for p in NOTEBOOK_DIR.iterdir() if p.is_file() and p.suffix != ".ipynb")
    assert not others, f"notebooks/ holds {others}; expected only .ipynb files (one source per notebook)"


# ---------------------------------------------------------------------- committed with clean outputs
def _text(output: nbformat.NotebookNode) -> str:
    """Everything an output shows, as one string (stream text, every mimetype's data, an error's text)."""
    if output.get("output_type") == "stream":
        return output.get("text", "")
    if output.get("output_type") == "error":
        return f"{output.get('ename')}: {output.get('evalue')}"
    return "\n".join(v if isinstance(v, str) else json.dumps(v) for v in output.get("data", {}).values())


def committed_problems(notebook: nbformat.NotebookNode) -> list[str]:
    """What is wrong with a notebook as committed: code cells not executed in order from 1, errors, progress-bar
    or widget output, execution timings in the metadata, more CircuitsVis views than allowed."""
    problems = []
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    counts = [cell.get("execution_count") for cell in code]
    if counts != list(range(1, len(code) + 1)):
        problems.append(f"execution counts {counts}; expected 1..{len(code)} (run it top to bottom: {REGENERATE})")
    if not any(cell.get("outputs") for cell in code):
        problems.append("no outputs at all")
    views = 0
    for index, cell in enumerate(notebook.cells):
        if "execution" in cell.get("metadata", {}):
            problems.append(f"cell {index} has execution timings in its metadata")
        for output in cell.get("outputs", []):
            text = _text(output)
            if output.get("output_type") == "error":
                problems.append(f"cell {index} has an error output: {text[:200]}")
            if "IProgress not found" in text or "TqdmWarning" in text or "it/s]" in text:
                problems.append(f"cell {index} shows a progress bar or its warning: {text[:120]!r}")
            if "application/vnd.jupyter.widget-view+json" in output.get("data", {}):
                problems.append(f"cell {index} has a widget output (its state is not saved; nothing would show)")
            views += text.count('id="circuits-vis-')
            data = output.get("data", {})
            if "application/vnd.plotly.v1+json" in data and "image/png" not in data:
                problems.append(f"cell {index} has a plotly figure without a PNG (most web viewers draw no plotly "
                                "JSON): pio.renderers.default = 'plotly_mimetype+png'")
    if views > MAX_CIRCUITSVIS_VIEWS:
        problems.append(f"{views} CircuitsVis views; expected at most {MAX_CIRCUITSVIS_VIEWS} (each embeds ~1.3 MB)")
    return problems


QUOTED_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+\.\d{2,}(?![\w.])")
"""A measured-looking number in prose (two decimals or more; ``0.1``, ``1.3`` are head names)."""


def quoted_numbers(notebook: nbformat.NotebookNode) -> list[str]:
    """Numbers the markdown quotes outside code spans and maths: prose that quotes results goes stale when the
    outputs change (a re-run, a better estimate), so the figures live in the outputs and the prose describes them."""
    found = []
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "markdown":
            continue
        prose = re.sub(r"\$[^$]*\$", "", re.sub(r"`[^`]*`", "", cell.source))
        found += [f"cell {index}: {number}" for number in QUOTED_NUMBER.findall(prose)]
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_prose_quotes_no_measured_numbers(path):
    found = quoted_numbers(nbformat.read(path, as_version=4))
    assert not found, f"{path.name} quotes numbers in its prose (describe the outputs instead): {found}"


def test_quoted_number_check_finds_a_stale_figure():
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_markdown_cell("The estimate is smaller (0.016 against 0.16 nats for 0.1 -> 1.3);"
                                                    " `x = 0.25` in code and $0.125$ in maths are not prose.")]
    assert quoted_numbers(notebook) == ["cell 0: 0.016", "cell 0: 0.16"]


PUBLIC_MODULES = {"circuitkit", *(f"circuitkit.{name}" for name in ("handbuilt", "circuits", "detect", "models", "zoo",
                                                                   "viz", "theory", "report")),
                  "circuitkit.zoo.train"}
"""Where notebooks may import from: the package and its public subpackages (names in their ``__all__``), and the
bundled model's training script (its documented entry points: the training notebook reruns it)."""


def private_imports(sources: list[str]) -> list[str]:
    """``from circuitkit.X import name`` where X is an internal module, or name is not in X's ``__all__``."""
    found = []
    for source in sources:
        for node in ast.walk(ast.parse(source)):
            modules = []
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("circuitkit"):
                modules = [(node.module, [alias.name for alias in node.names])]
            elif isinstance(node, ast.Import):
                modules = [(alias.name, []) for alias in node.names if alias.name.startswith("circuitkit")]
            for module, names in modules:
                if module not in PUBLIC_MODULES:
                    found.append(f"{module} (internal)")
                    continue
                public = getattr(importlib.import_module(module), "__all__", None)
                submodules = getattr(importlib.import_module(module), "_SUBPACKAGES", ())
                found += [f"{module}.{name}" for name in names
                          if public is not None and name not in public and name not in submodules]
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_imports_public_names_only(path):
    found = private_imports(_code_sources(path))
    assert not found, f"{path.name} imports internals: {found}"


def test_private_import_check_finds_internal_modules():
    assert private_imports(["from circuitkit.viz.attention import token_strings\nimport circuitkit.report.track_page"
                            "\nfrom circuitkit.viz import token_strings\nfrom circuitkit import scan, nope"]) == [
        "circuitkit.viz.attention (internal)", "circuitkit.report.track_page (internal)", "circuitkit.nope"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_committed_notebook_has_clean_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    assert notebook.metadata.get("kernelspec", {}).get("name") == "python3"
    problems = committed_problems(notebook)
    assert not problems, f"{path.name}: {problems}"
    assert path.stat().st_size <= MAX_NOTEBOOK_BYTES, f"{path.name}: {path.stat().st_size:,} bytes"


def test_notebooks_stay_small_together():
    total = sum(path.stat().st_size for path in NOTEBOOKS)
    assert total < MAX_TOTAL_BYTES, f"notebooks/ holds {total:,} bytes; expected under {MAX_TOTAL_BYTES:,}"


def _executed_looking(outputs: list[nbformat.NotebookNode], count: int = 1) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell("1 + 1")
    cell.outputs = outputs
    cell.execution_count = count
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# t"), cell])


def test_committed_check_finds_problems():
    """The check above can fail: errors, progress bars, timings and a wrong execution order are each reported."""
    good = _executed_looking([nbformat.v4.new_output("stream", name="stdout", text="2\n")])
    assert committed_problems(good) == []
    bad = _executed_looking(
        [
            nbformat.v4.new_output("error", ename="ValueError", evalue="boom", traceback=[]),
            nbformat.v4.new_output("stream", name="stderr", text="TqdmWarning: IProgress not found."),
        ],
        count=3,
    )
    bad.cells[1].metadata["execution"] = {"iopub.execute_input": "2025-01-01T00:00:00Z"}
    problems = committed_problems(bad)
    assert len(problems) == 4, problems
    assert "execution counts [3]" in problems[0] and "timings" in problems[1]
    assert "error output" in problems[2] and "progress bar" in problems[3]


# ---------------------------------------------------------------------- comparing outputs
_SCRUB = [
    (re.compile(r"\b0x[0-9a-fA-F]{6,}\b"), "0xADDRESS"),
    (re.compile(r"circuits-vis-[0-9a-f]{4,}(?:-[0-9a-f]{2,})*"), "circuits-vis-ID"),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"), "UUID"),
    (re.compile(r"\b\d+(?:\.\d+)?\s?(?:s|ms|µs|seconds|min)\b(?! *=)"), "DURATION"),
    (re.compile(r"/tmp/[\w./-]+"), "TMPPATH"),
]
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


def normalise(notebook: nbformat.NotebookNode) -> list[tuple[str, list[str]]]:
    """``(source, [output text, ...])`` per cell, without what differs between runs of the same notebook:
    execution counts, cell ids and metadata, output metadata, image bytes, memory addresses, element ids,
    printed durations and temporary paths. Numbers stay; :func:`same_text` compares them."""
    cells = []
    for cell in notebook.cells:
        outputs = []
        for output in cell.get("outputs", []):
            kind = output.get("output_type")
            if kind == "stream":
                parts = [f"stream {output.get('name')}", output.get("text", "")]
            elif kind == "error":
                parts = [f"error {output.get('ename')}: {output.get('evalue')}"]
            else:
                parts = [kind]
                for mime, value in sorted(output.get("data", {}).items()):
                    if mime.startswith("image/"):
                        parts.append(f"{mime} (image bytes not compared)")
                    else:
                        shown = value if isinstance(value, str) else json.dumps(_decoded(value), sort_keys=True)
                        parts.append(f"{mime}: {shown}")
            text = "\n".join(parts)
            for pattern, replacement in _SCRUB:
                text = pattern.sub(replacement, text)
            outputs.append(text)
        if cell.cell_type == "code":
            # consecutive stream outputs of one name are one stream (how they split depends on flush timing)
            merged: list[str] = []
            for text in outputs:
                if merged and text.startswith("stream ") and merged[-1].split("\n", 1)[0] == text.split("\n", 1)[0]:
                    merged[-1] += text.split("\n", 1)[1] if "\n" in text else ""
                else:
                    merged.append(text)
            outputs = merged
        cells.append((cell.source, outputs))
    return cells


def _decoded(value: Any) -> Any:
    """``value`` with each of plotly's packed arrays (``{"bdata": base64, "dtype": "f4", "shape": ...}``) written
    out as its numbers (nine significant digits), so that :func:`same_text` compares a figure's values as numbers,
    not as the bytes of their last bit."""
    if isinstance(value, dict) and isinstance(value.get("bdata"), str) and isinstance(value.get("dtype"), str):
        import base64

        import numpy as np

        numbers = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        return {**{k: v for k, v in value.items() if k != "bdata"},
                "values": [float(f"{x:.9g}") if np.issubdtype(numbers.dtype, np.floating) else int(x)
                           for x in numbers.tolist()]}
    if isinstance(value, dict):
        return {key: _decoded(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_decoded(item) for item in value]
    return value


def _digits_unit(token: str) -> float:
    """One unit in the last printed digit of a number as written (``"0.235"`` -> 0.001, ``"1.5e-03"`` -> 1e-4)."""
    mantissa, _, exponent = token.lower().partition("e")
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    return 10.0 ** (-decimals + (int(exponent) if exponent else 0))


def same_number(a: str, b: str) -> bool:
    x, y = float(a), float(b)
    if x == y or (math.isnan(x) and math.isnan(y)):
        return True
    if ("e" in a.lower() and "e" in b.lower()) and abs(x) < ROUNDING_LEVEL and abs(y) < ROUNDING_LEVEL:
        return True
    allowed = max(_digits_unit(a), _digits_unit(b), NUMBER_RTOL * max(abs(x), abs(y)))
    return abs(x - y) <= allowed * (1 + 1e-9)


def same_text(a: str, b: str) -> bool:
    """Equal but for numbers that agree under :func:`same_number`."""
    if a == b:
        return True
    words_a, words_b = _NUMBER.split(a), _NUMBER.split(b)
    numbers_a, numbers_b = _NUMBER.findall(a), _NUMBER.findall(b)
    return (
        words_a == words_b
        and len(numbers_a) == len(numbers_b)
        and all(same_number(x, y) for x, y in zip(numbers_a, numbers_b, strict=True))
    )


def differences(committed: nbformat.NotebookNode, fresh: nbformat.NotebookNode) -> list[str]:
    """Where a fresh run's outputs differ from the committed ones (after :func:`normalise`), cell by cell."""
    old, new = normalise(committed), normalise(fresh)
    if [source for source, _ in old] != [source for source, _ in new]:
        return ["the cells' sources differ"]
    found = []
    for index, ((source, before), (_, after)) in enumerate(zip(old, new, strict=True)):
        if len(before) != len(after):
            heads = [text.split("\n", 2)[:2] for text in after]  # each output's kind and first line: what came or went
            found.append(f"cell {index} ({source[:40]!r}...): {len(before)} committed outputs, {len(after)} now: "
                         + "; ".join(" ".join(head)[:160] for head in heads))
            continue
        for x, y in zip(before, after, strict=True):
            if not same_text(x, y):
                found.append(f"cell {index} ({source[:40]!r}...): committed {_excerpt(x, y)}")
    return found


def _excerpt(a: str, b: str) -> str:
    start = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    lo = max(0, start - 60)
    return f"{a[lo:start + 60]!r}, now {b[lo:start + 60]!r}"


def test_normalise_ignores_ids_timings_addresses_and_rounding():
    def stream(text):
        return nbformat.v4.new_output("stream", name="stdout", text=text)

    def html(text):
        return nbformat.v4.new_output("display_data", data={"text/html": text})

    a = _executed_looking([stream("took 4.28 s at 0x7f3a2b1c9d80\n"), stream("score 0.235, error 9.5e-07\n"),
                           html('<div id="circuits-vis-e0c0fc52-13e1"></div> 0.93617469')], count=1)
    b = _executed_looking([stream("took 12.5 s at 0x7f00aa11bb22\nscore 0.236, error 1.2e-06\n"),
                           html('<div id="circuits-vis-0b1f3a2e-99aa"></div> 0.93617470')], count=7)
    b.cells[1].metadata["execution"] = {"iopub.execute_input": "2026-01-01T00:00:00Z"}
    assert differences(a, b) == []


def test_plotly_packed_arrays_compare_as_numbers():
    """Two float32 heatmaps a last bit apart are the same output; one value moved by 1% is not."""
    import base64

    import numpy as np

    def heatmap(z):
        data = {"data": [{"type": "heatmap", "z": {"bdata": base64.b64encode(np.asarray(z, "f4").tobytes()).decode(),
                                                  "dtype": "f4", "shape": "1, 3"}}]}
        return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("fig", outputs=[
            nbformat.v4.new_output("display_data", data={"application/vnd.plotly.v1+json": data})])])

    z = np.array([0.19446088, 0.1931645, float("nan")], "f4")
    last_bit = np.nextafter(z, np.float32(1))
    assert differences(heatmap(z), heatmap(last_bit)) == []
    assert len(differences(heatmap(z), heatmap(z * np.array([1.01, 1, 1], "f4")))) == 1


@pytest.mark.parametrize(
    "fresh",
    ["score 0.245\n", "score 0.235 heads (1, 3)\n", "Score 0.235\n", "score 0.2350 extra\n", "score 2.35e-01 1\n"],
    ids=["number", "text-added", "word", "number-added", "another-number"],
)
def test_differences_catch_a_changed_output(fresh):
    committed = _executed_looking([nbformat.v4.new_output("stream", name="stdout", text="score 0.235\n")])
    now = _executed_looking([nbformat.v4.new_output("stream", name="stdout", text=fresh)])
    assert differences(committed, now)


def test_differences_catch_a_missing_output_and_large_rounding_errors():
    committed = _executed_looking([nbformat.v4.new_output("stream", name="stdout", text="error 3.2e-02\n")])
    assert differences(committed, _executed_looking([]))
    assert differences(committed, _executed_looking([nbformat.v4.new_output("stream", name="stdout",
                                                                            text="error 4.1e-02\n")]))


# ---------------------------------------------------------------------- the notebooks' text and names
@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_points_at_nothing_the_reader_lacks(path):
    notebook = nbformat.read(path, as_version=4)
    hits = [match.group(0) for cell in notebook.cells for match in REFERENCES_THE_READER_LACKS.finditer(cell.source)]
    assert not hits, f"{path.name} refers to material outside the repository: {hits}"


def test_reference_check_finds_exercise_pointers():
    text = "as in seed 000, exercise 1.3; Task 2.2 of the seed exercises (seeds/ beside the repository)"
    assert len(REFERENCES_THE_READER_LACKS.findall(text)) == 6
    plain = "RepeatedTokens(seed=0); torch.manual_seed(0); the task is induction"
    assert not REFERENCES_THE_READER_LACKS.findall(plain)


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


# ---------------------------------------------------------------------- every notebook runs, offline, as committed
def execute(path: Path) -> tuple[nbformat.NotebookNode, float]:
    """``path`` run top to bottom behind the network guard: the executed notebook (guard removed, execution counts
    from 1, no timing metadata) and the seconds it took. Raises ``CellExecutionError`` on a failing cell."""
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    notebook.cells.insert(0, nbformat.v4.new_code_cell(NO_NETWORK))
    saved = {key: os.environ.get(key) for key in ENVIRONMENT}
    os.environ.update(ENVIRONMENT)
    try:
        client = NotebookClient(notebook, kernel_name="python3", timeout=CELL_TIMEOUT_S,
                                resources={"metadata": {"path": str(path.parent)}})
        start = time.perf_counter()
        client.execute()
        elapsed = time.perf_counter() - start
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    del notebook.cells[0]
    for cell in notebook.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code" and cell.execution_count is not None:
            cell.execution_count -= 1
            for output in cell.outputs:
                if "execution_count" in output:
                    output["execution_count"] = cell.execution_count
    return notebook, elapsed


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


def _require_png_browser(notebook: nbformat.NotebookNode) -> None:
    """A notebook committed with PNGs of its figures gives them again only where kaleido finds a Chromium to draw
    them (``viz.notebook_figures``; without one its figures stay interactive and the outputs differ). As the browser
    tests: skipped without one locally, failed under CI (``CI`` set)."""
    from circuitkit.viz.notebook import _png_browser

    outputs = [output for cell in notebook.cells for output in cell.get("outputs", [])]
    has_png = any("image/png" in output.get("data", {}) for output in outputs)
    if has_png and _png_browser() is None:
        reason = "its committed figures include PNGs, which kaleido draws with a Chromium (apt-get install chromium)"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run every notebook: {reason}")
        pytest.skip(reason)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_runs_offline_and_gives_its_committed_outputs(path):
    committed = nbformat.read(path, as_version=4)
    _require_png_browser(committed)
    fresh, elapsed = execute(path)
    assert not committed_problems(fresh), committed_problems(fresh)
    found = differences(committed, copy.deepcopy(fresh))
    assert not found, f"{path.name}: outputs differ from the committed ones; if the change is intended, run " \
                      f"{REGENERATE} {path.relative_to(NOTEBOOK_DIR.parent)}\n" + "\n".join(found[:10])
    assert elapsed < NOTEBOOK_BUDGET_S, f"{path.name} took {elapsed:.0f} s; expected under {NOTEBOOK_BUDGET_S} s"


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] != ["--execute"]:
        sys.exit(f"usage: {REGENERATE} [NOTEBOOK.ipynb ...]  (default: every notebook)")
    for target in [Path(name).resolve() for name in sys.argv[2:]] or NOTEBOOKS:
        executed, seconds = execute(target)
        problems = committed_problems(executed)
        nbformat.write(executed, target)
        print(f"executed {target.name} in {seconds:.0f} s, {target.stat().st_size:,} bytes"
              + (f"; PROBLEMS: {problems}" if problems else ""))
