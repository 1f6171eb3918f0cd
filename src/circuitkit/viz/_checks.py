"""Input checks shared by the views: every view takes tensors, validates them, and says what was wrong."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from circuitkit import validate


def as_float_array(value: Any, *, name: str, caller: str, ndim: int, allow_nan: bool = False) -> np.ndarray:
    """``value`` (tensor, numpy array or nested list) as a float64 numpy array of ``ndim`` axes, not empty, of a
    floating dtype (integer, bool and complex tensors are refused: scores and patterns are real numbers), finite
    unless ``allow_nan`` (NaN then marks a missing value; inf is never accepted). Checked by
    :func:`validate.tensor`."""
    label = f"{caller}: {name}"
    tensor = validate.tensor(label, value, ndim=ndim, convert=True)
    if not tensor.is_floating_point():
        raise validate.fail(label, tensor, "a real floating-point tensor (float16/32/64)", "Cast with .float().")
    if tensor.numel() == 0:
        raise validate.fail(label, tensor, "a non-empty tensor")
    array = tensor.detach().to("cpu", torch.float64).numpy()
    bad = np.isinf(array) if allow_nan else ~np.isfinite(array)
    if bad.any():
        raise validate.fail(label, tensor, "finite numbers", f"It holds {int(bad.sum())} non-finite values.")
    return array


def check_head(head: Any, n_layers: int, n_heads: int, caller: str) -> tuple[int, int]:
    """``head`` as a ``(layer, head)`` pair of ints inside the model."""
    if not isinstance(head, (tuple, list)) or len(head) != 2:
        raise validate.fail(f"{caller}: head", head, "a (layer, head) pair of ints")
    layer = validate.integer(f"{caller}: head layer", head[0], minimum=0, maximum=n_layers - 1)
    index = validate.integer(f"{caller}: head index", head[1], minimum=0, maximum=n_heads - 1)
    return layer, index


def token_ids(caller: str, tokens: torch.Tensor, cfg: Any) -> None:
    """Integer ``tokens`` checked against the model: at least one, at most ``cfg.n_ctx`` positions (last axis), ids
    in ``[0, cfg.d_vocab)`` (where the config says)."""
    label = f"{caller}: tokens"
    if tokens.numel() == 0 or tokens.is_meta:
        raise validate.fail(label, tokens, "at least one token, with data (not on the meta device)")
    n_ctx = getattr(cfg, "n_ctx", None)
    if isinstance(n_ctx, int) and tokens.shape[-1] > n_ctx:
        raise validate.fail(label, tokens, f"at most n_ctx={n_ctx} positions, the model's context")
    d_vocab = getattr(cfg, "d_vocab", None)
    low, high = int(tokens.min()), int(tokens.max())
    if low < 0 or (isinstance(d_vocab, int) and high >= d_vocab):
        bound = f"[0, {d_vocab})" if isinstance(d_vocab, int) else "[0, d_vocab)"
        raise validate.fail(label, tokens, f"token ids in {bound}", f"It holds ids from {low} to {high}.")


def text(name: str, value: Any) -> str:
    """``value`` if it is a ``str`` (titles, labels)."""
    if not isinstance(value, str):
        raise validate.fail(name, value, "a str")
    return value


def optional_real(name: str, value: Any) -> float | None:
    """``None`` or a finite real number (:func:`validate.real`)."""
    return None if value is None else validate.real(name, value)
