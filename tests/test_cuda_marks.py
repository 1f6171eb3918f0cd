"""Every test that needs a GPU carries the ``cuda`` mark, so that ``pytest -m cuda`` on a GPU machine runs them all:
a test skipped for want of CUDA (a ``skipif`` on ``torch.cuda.is_available()``) without the mark would be left out
there and skipped here, never run anywhere."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _mentions_cuda_skip(node: ast.AST) -> bool:
    """A ``pytest.mark.skipif(...)`` whose condition reads ``torch.cuda.is_available``."""
    return (isinstance(node, ast.Call) and ast.unparse(node.func).endswith("mark.skipif")
            and "cuda.is_available" in ast.unparse(node))


def _has_cuda_mark(nodes: list[ast.expr]) -> bool:
    return any(ast.unparse(node).endswith("mark.cuda") for node in nodes)


def unmarked_gpu_tests(source: str) -> list[str]:
    """The test functions of ``source`` skipped without CUDA yet not marked ``cuda`` (a module's ``pytestmark``
    holding the mark marks every test in it)."""
    tree = ast.parse(source)
    module_marks: list[ast.expr] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            module_marks = list(node.value.elts) if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
    module_skip = any(_mentions_cuda_skip(mark) for mark in module_marks)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            skips = module_skip or any(_mentions_cuda_skip(d) for d in node.decorator_list)
            if skips and not (_has_cuda_mark(node.decorator_list) or _has_cuda_mark(module_marks)):
                found.append(node.name)
    return found


def test_every_test_skipped_without_cuda_is_marked_cuda():
    missing = {path.name: names for path in sorted(TESTS.glob("test_*.py"))
               if (names := unmarked_gpu_tests(path.read_text(encoding="utf-8")))}
    assert not missing, f"mark these @pytest.mark.cuda so `pytest -m cuda` runs them on a GPU: {missing}"


def test_the_check_finds_an_unmarked_test_and_passes_marked_ones():
    skip = '@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")\n'
    assert unmarked_gpu_tests(skip + "def test_a():\n    pass\n") == ["test_a"]
    assert unmarked_gpu_tests("@pytest.mark.cuda\n" + skip + "def test_a():\n    pass\n") == []
    module = "pytestmark = [pytest.mark.cuda, " + skip.strip()[1:] + "]\ndef test_b():\n    pass\n"
    assert unmarked_gpu_tests(module) == []
    assert unmarked_gpu_tests(module.replace("pytest.mark.cuda, ", "")) == ["test_b"]
    assert unmarked_gpu_tests("def test_c():\n    pass\n") == []
