"""The one error type circuitkit raises for bad input.

Every message says three things: what was given, what was expected, and how to fix it.
``CircuitkitError`` subclasses ``ValueError`` so callers that already catch ``ValueError`` keep working.
"""

from __future__ import annotations

from typing import Any

import torch


class CircuitkitError(ValueError):
    """Bad input to a circuitkit function. The message names what was given and what was expected."""


def describe(value: Any) -> str:
    """A short description of ``value`` for error messages: shape and dtype for tensors."""
    if isinstance(value, torch.Tensor):
        return f"tensor of shape {tuple(value.shape)} and dtype {value.dtype} on {value.device}"
    if value is None:
        return "None"
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{type(value).__name__} {text}"


