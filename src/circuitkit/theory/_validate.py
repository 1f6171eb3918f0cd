"""Input validation shared by the theory modules: every failure is a ``CircuitkitError`` naming the value."""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any

import numpy as np
import torch

from circuitkit.errors import CircuitkitError, describe


def positive_int(name: str, value: Any, *, minimum: int = 1) -> int:
    """``value`` as an int >= ``minimum``; bools, floats and smaller ints are rejected."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise CircuitkitError(f"{name} = {describe(value)}; expected an integer >= {minimum}.")
    if value < minimum:
        raise CircuitkitError(f"{name} = {value}; expected an integer >= {minimum}.")
    return int(value)


def positive_real(name: str, value: Any, *, allow_zero: bool = False) -> float:
    """``value`` as a finite float > 0 (or >= 0 with ``allow_zero``)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise CircuitkitError(f"{name} = {describe(value)}; expected a finite real number.")
    value = float(value)
    bound = "0" if allow_zero else "0 (exclusive)"
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise CircuitkitError(f"{name} = {value!r}; expected a finite number > {bound}.")
    return value


def open_unit(name: str, value: Any) -> float:
    """``value`` as a float strictly inside (0, 1)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise CircuitkitError(f"{name} = {describe(value)}; expected a real number in the open interval (0, 1).")
    value = float(value)
    if not (0.0 < value < 1.0):
        raise CircuitkitError(f"{name} = {value!r}; expected a number in the open interval (0, 1).")
    return value


def float_tensor(name: str, value: Any, *, ndim_min: int = 1, ndim: int | None = None) -> torch.Tensor:
    """A finite floating-point tensor with at least ``ndim_min`` (or exactly ``ndim``) dimensions."""
    if not isinstance(value, torch.Tensor):
        raise CircuitkitError(f"{name} is a {describe(value)}; expected a torch.Tensor.")
    if not value.is_floating_point():
        raise CircuitkitError(f"{name} is a {describe(value)}; expected a floating-point tensor. Call .float().")
    if ndim is not None and value.ndim != ndim:
        raise CircuitkitError(f"{name} is a {describe(value)}; expected exactly {ndim} dimensions.")
    if value.ndim < ndim_min:
        raise CircuitkitError(f"{name} is a {describe(value)}; expected at least {ndim_min} dimensions.")
    if not torch.isfinite(value).all():
        raise CircuitkitError(f"{name} ({describe(value)}) contains NaN or inf; expected finite values.")
    return value


def float_array(name: str, value: Any, *, ndim_min: int = 1) -> np.ndarray:
    """A finite floating-point numpy array with at least ``ndim_min`` dimensions."""
    if not isinstance(value, np.ndarray):
        raise CircuitkitError(f"{name} is a {describe(value)}; expected a numpy.ndarray.")
    if not np.issubdtype(value.dtype, np.floating):
        raise CircuitkitError(f"{name} has dtype {value.dtype}; expected a floating-point array. Use .astype(float).")
    if value.ndim < ndim_min:
        raise CircuitkitError(f"{name} has shape {value.shape}; expected at least {ndim_min} dimensions.")
    if not np.isfinite(value).all():
        raise CircuitkitError(f"{name} (shape {value.shape}) contains NaN or inf; expected finite values.")
    return value


def same(name_a: str, a: int, name_b: str, b: int, what: str) -> None:
    """Raise unless two sizes agree, naming both."""
    if a != b:
        raise CircuitkitError(f"{name_a} has {what} {a} but {name_b} has {what} {b}; expected them to be equal.")
