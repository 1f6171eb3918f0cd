"""The package's lazy public names (``circuitkit._lazy``): cheap import, names resolve, clear errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

import circuitkit as ck


def test_import_does_not_load_transformer_lens_or_plotly():
    code = "import sys, circuitkit, circuitkit.handbuilt, circuitkit.models, circuitkit.viz; " \
        "print(sorted(m for m in ('transformer_lens', 'plotly') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("package", ["circuitkit", "circuitkit.handbuilt", "circuitkit.models", "circuitkit.viz"])
def test_every_public_name_resolves_and_dir_lists_all(package):
    import importlib

    module = importlib.import_module(package)
    assert dir(module) == sorted(module.__all__)
    for name in module.__all__:
        assert getattr(module, name) is not None, f"{package}.{name}"


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="module 'circuitkit.viz' has no attribute 'no_such_view'"):
        ck.viz.no_such_view  # noqa: B018
    assert not hasattr(ck, "no_such_function")
