"""Lazy public names for circuitkit's packages.

Why: ``import circuitkit`` (and its subpackages) must stay cheap: the modules behind the public names import
torch, TransformerLens, plotly. Each package lists ``public name -> module that defines it`` and gets a
module ``__getattr__`` (PEP 562) from :func:`lazy_exports` that imports the defining module on first use.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Collection, Mapping
from typing import Any


def lazy_exports(
    package: str, names: Mapping[str, str], submodules: Collection[str] = (), renamed: Mapping[str, str] | None = None,
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``names`` maps each public name to its module,
    ``submodules`` are imported as ``package.<name>``; ``renamed`` maps a subpackage's former name to its name (the
    attribute keeps working; it is not listed). A value is cached in the package once looked up.
    ``__dir__`` lists the package's ``__all__``."""
    renamed = dict(renamed or {})
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        if name in names:
            value = getattr(importlib.import_module(names[name]), name)
        elif name in submodules or name in renamed:
            value = importlib.import_module(f"{package}.{renamed.get(name, name)}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(namespace["__all__"])

    return __getattr__, __dir__
