"""Thin shapes of :mod:`circuitkit.validate` for the theory modules (their argument names and array checks).

Every check is delegated to :mod:`circuitkit.validate`; only what it has no function for lives here (numpy arrays,
the open unit interval, two sizes that must agree).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from circuitkit import validate
from circuitkit.errors import CircuitkitError

MAX_SIZE = 2**14
"""Largest size a theory function allocates along one axis (``d_k``, ``d_model``, ``n_pos``, token and head
counts, position offsets): a ``[MAX_SIZE, MAX_SIZE]`` float64 matrix is 2 GiB. Larger values are typos, refused
at once rather than overflowing torch's sizes or allocating terabytes."""

MAX_SAMPLES = 10**8
"""Largest ``n_samples`` of the Monte-Carlo checks (drawn in bounded chunks; 1e8 takes about a minute)."""

MAX_LAYERS = 10_000
"""Largest depth of :func:`~circuitkit.theory.rank_collapse` and :func:`~circuitkit.theory.receptive_field`."""


def positive_int(name: str, value: Any, *, minimum: int = 1, maximum: int | None = None) -> int:
    """``value`` as an int in ``[minimum, maximum]``; bools, floats and out-of-range ints are rejected."""
    return validate.integer(name, value, minimum=minimum, maximum=maximum)


def size(name: str, value: Any, *, minimum: int = 1) -> int:
    """An allocated size: an int in ``[minimum, MAX_SIZE]``."""
    return validate.integer(name, value, minimum=minimum, maximum=MAX_SIZE, why="a size that is allocated")


def promoted(**tensors: torch.Tensor) -> list[torch.Tensor]:
    """The tensors cast to their common floating dtype (``torch.promote_types``): float16 with float32 is
    computed in float32, float32 with float64 in float64."""
    dtype = tensors[next(iter(tensors))].dtype
    for t in tensors.values():
        dtype = torch.promote_types(dtype, t.dtype)
    return [t.to(dtype) for t in tensors.values()]


def positive_real(name: str, value: Any, *, allow_zero: bool = False) -> float:
    """``value`` as a finite float > 0 (or >= 0 with ``allow_zero``)."""
    return validate.real(name, value, minimum=0.0, strict_minimum=not allow_zero)


def open_unit(name: str, value: Any) -> float:
    """``value`` as a float strictly inside (0, 1)."""
    expected = "a number in the open interval (0, 1)"
    try:
        value = validate.real(name, value)
    except CircuitkitError:
        raise validate.fail(name, value, expected) from None
    if not 0.0 < value < 1.0:
        raise validate.fail(name, value, expected)
    return value


def float_tensor(name: str, value: Any, *, ndim_min: int = 1, ndim: int | None = None) -> torch.Tensor:
    """A non-empty finite floating-point tensor with at least ``ndim_min`` (or exactly ``ndim``) dimensions."""
    value = validate.tensor(name, value, ndim=ndim, floating=True, finite=True)
    if value.ndim < ndim_min:
        raise validate.fail(name, value, f"a tensor with at least {ndim_min} dimensions")
    if value.numel() == 0:
        raise validate.fail(name, value, "a non-empty tensor")
    return value


def float_array(name: str, value: Any, *, ndim_min: int = 1) -> np.ndarray:
    """A non-empty finite floating-point numpy array with at least ``ndim_min`` dimensions."""
    if not isinstance(value, np.ndarray):
        raise validate.fail(name, value, "a numpy.ndarray", "Convert with np.asarray(...).")
    if not np.issubdtype(value.dtype, np.floating):
        raise validate.fail(
            name, validate.given(f"an array of dtype {value.dtype}"), "a floating-point array", "Use .astype(float)."
        )
    if value.ndim < ndim_min:
        raise validate.fail(
            name, validate.given(f"an array of shape {value.shape}"), f"at least {ndim_min} dimensions"
        )
    if value.size == 0:
        raise validate.fail(name, validate.given(f"an empty array of shape {value.shape}"), "a non-empty array")
    if not np.isfinite(value).all():
        bad = int((~np.isfinite(value)).sum())
        raise validate.fail(
            name, validate.given(f"an array of shape {value.shape} with {bad} NaN or inf entries"), "finite values"
        )
    return value


def same(name_a: str, a: int, name_b: str, b: int, what: str) -> None:
    """Raise unless two sizes agree, naming both."""
    if a != b:
        raise validate.fail(
            name_b, validate.given(f"{what} {b}"), f"{what} {a}, equal to {name_a}'s", "Make the two sizes agree."
        )
