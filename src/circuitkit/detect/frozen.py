"""Gradients with respect to activations only: every parameter's ``requires_grad`` switched off for a pass.

Why a module of its own: first-order attribution (:mod:`~circuitkit.detect.attribution`), AtP*
(:mod:`~circuitkit.detect.atp`), edge attribution and the task graph all differentiate the loss with respect to
activation leaves they add at hooks; none may write a ``.grad`` or build a graph through the weights.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def frozen_parameters(model: Any) -> Iterator[None]:
    """Switch off ``requires_grad`` on every parameter of ``model`` (if it has any) and restore each after."""
    parameters = getattr(model, "parameters", None)
    params = list(parameters()) if callable(parameters) else []
    saved = [p.requires_grad for p in params]
    try:
        for p in params:
            p.requires_grad_(False)
        yield
    finally:
        for p, flag in zip(params, saved, strict=True):
            p.requires_grad_(flag)


__all__ = ["frozen_parameters"]
