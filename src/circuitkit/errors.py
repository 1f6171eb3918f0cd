"""The one error type circuitkit raises for bad input.

Every message says three things: what was given, what was expected, and how to fix it.
``CircuitkitError`` subclasses ``ValueError`` so callers that already catch ``ValueError`` keep working.
"""

from __future__ import annotations

import sys
from typing import Any


class CircuitkitError(ValueError):
    """Bad input to a circuitkit function. The message names what was given and what was expected."""


def describe(value: Any) -> str:
    """A short one-line description of ``value`` for error messages: type, shape and dtype for tensors and arrays
    (numpy, anything with ``shape`` and ``dtype``), never a multi-line repr; other values as a repr cut at 80
    characters with line breaks escaped."""
    torch = sys.modules.get("torch")  # not imported here: the CLI's errors come before torch loads
    if torch is not None and isinstance(value, torch.Tensor):
        layout = "" if value.layout == torch.strided else f" ({value.layout})"
        return f"tensor of shape {tuple(value.shape)} and dtype {value.dtype} on {value.device}{layout}"
    if value is None:
        return "None"
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is not None and dtype is not None and not isinstance(value, (int, float, complex)):
        try:
            dims = tuple(int(size) for size in shape)
        except (TypeError, ValueError):
            dims = shape
        return f"{type(value).__module__.split('.')[0]}.{type(value).__name__} of shape {dims} and dtype {dtype}"
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a broken __repr__ must not replace the error being reported
        text = f"<{type(value).__name__} object>"
    text = text.replace("\n", "\\n").replace("\r", "\\r")
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{type(value).__name__} {text}"


