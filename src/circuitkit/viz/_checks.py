"""Input checks shared by the views: every view takes tensors, validates them, and says what was wrong."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from circuitkit.errors import CircuitkitError, describe


def as_float_array(value: Any, *, name: str, caller: str, ndim: int, allow_nan: bool = False) -> np.ndarray:
    """``value`` (tensor or array-like) as a float64 numpy array of ``ndim`` axes, finite unless ``allow_nan``."""
    if isinstance(value, Tensor):
        tensor = value.detach().to("cpu")
    else:
        try:
            tensor = torch.as_tensor(np.asarray(value))
        except (TypeError, ValueError) as error:
            raise CircuitkitError(
                f"{caller}: given {name}={describe(value)}; expected a tensor with {ndim} axes."
            ) from error
    if tensor.is_complex() or not (tensor.is_floating_point() or tensor.dtype in _INT_DTYPES):
        raise CircuitkitError(
            f"{caller}: given {name} of dtype {tensor.dtype}; expected a real (floating) tensor. Cast with .float()."
        )
    if tensor.ndim != ndim:
        raise CircuitkitError(
            f"{caller}: given {name} of shape {tuple(tensor.shape)}; expected {ndim} axes."
        )
    array = tensor.to(torch.float64).numpy()
    bad = np.isinf(array) if allow_nan else ~np.isfinite(array)
    if bad.any():
        raise CircuitkitError(
            f"{caller}: given {name} with {int(bad.sum())} non-finite values; expected finite numbers."
        )
    return array


def check_head(head: Any, n_layers: int, n_heads: int, caller: str) -> tuple[int, int]:
    """``head`` as a ``(layer, head)`` pair of ints inside the model."""
    if (
        not isinstance(head, (tuple, list))
        or len(head) != 2
        or not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in head)
    ):
        raise CircuitkitError(f"{caller}: given head {head!r}; expected a (layer, head) pair of ints.")
    layer, index = int(head[0]), int(head[1])
    if not (0 <= layer < n_layers and 0 <= index < n_heads):
        raise CircuitkitError(
            f"{caller}: given head ({layer}, {index}); expected 0 <= layer < {n_layers} and 0 <= head < {n_heads}."
        )
    return layer, index


def head_name(layer: int, head: int) -> str:
    """The circuitkit name of a head: ``"layer.head"``."""
    return f"{layer}.{head}"


_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
