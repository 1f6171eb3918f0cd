"""Positional encodings and the two facts about them the exercises ask to show.

- Sinusoidal (Vaswani et al. 2017, interleaved): ``PE[pos, 2i] = sin(pos w_i)``, ``PE[pos, 2i+1] = cos(pos w_i)``
  with ``w_i = base^(-2i/d_model)``. For a fixed offset ``k``, ``PE[pos + k] = PE[pos] @ M_k`` (row vectors)
  with ``M_k`` block-diagonal, one 2x2 rotation by ``k w_i`` per pair, independent of ``pos``
  (seed 000 ex. 1.6, seed 002 ex. 13.26).
- RoPE (Su et al., RoFormer), interleaved pairs ``(2i, 2i+1)``, ``theta_i = base^(-2i/d)``: position ``m``
  rotates each pair by ``m theta_i``. In the paper's column convention ``x' = R_m x`` and
  ``R_m^T R_n = R_{n-m}``, so ``<R_m q, R_n k> = <q, R_{n-m} k>`` depends only on the offset ``n - m``
  (seed 002 ex. 13.16, 13.27).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from circuitkit import validate
from circuitkit.errors import CircuitkitError
from circuitkit.theory._validate import MAX_SIZE, float_tensor, size

__all__ = [
    "sinusoidal_frequencies",
    "sinusoidal_encoding",
    "sinusoidal_offset_map",
    "rope_rotation_matrix",
    "rope",
]


def _even(name: str, d: int) -> int:
    d = size(name, d, minimum=2)
    if d % 2:
        raise CircuitkitError(f"{name} = {d}; expected an even number (dimensions come in sin/cos pairs).")
    return d


def sinusoidal_frequencies(d_model: int, *, base: float = 10000.0) -> Tensor:
    """``w_i = base^(-2i/d_model)`` for ``i = 0 .. d_model/2 - 1``: shape ``[d_model/2]``, float64."""
    d_model = _even("d_model", d_model)
    base = _base(base)
    return base ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)


def sinusoidal_encoding(n_pos: int, d_model: int, *, base: float = 10000.0) -> Float[Tensor, "pos d_model"]:
    """The sinusoidal table ``PE [n_pos, d_model]`` (float64), sin on even and cos on odd columns; ``n_pos`` and
    ``d_model`` are at most ``MAX_SIZE``."""
    n_pos = size("n_pos", n_pos)
    w = sinusoidal_frequencies(d_model, base=base)
    angles = torch.arange(n_pos, dtype=torch.float64)[:, None] * w[None, :]  # [pos, pair]
    pe = torch.empty(n_pos, d_model, dtype=torch.float64)
    pe[:, 0::2] = angles.sin()
    pe[:, 1::2] = angles.cos()
    return pe


def sinusoidal_offset_map(offset: int, d_model: int, *, base: float = 10000.0) -> Float[Tensor, "d_model d_model"]:
    """``M_k`` with ``PE[pos + k] = PE[pos] @ M_k`` for every ``pos`` (row convention).

    Per pair ``(s, c) = (sin pw, cos pw)``: ``(s, c) @ [[cos kw, -sin kw], [sin kw, cos kw]]
    = (sin (p+k)w, cos (p+k)w)``. Negative offsets are allowed (``M_{-k} = M_k^T = M_k^-1``); ``|offset|`` is
    at most ``MAX_SIZE``.
    """
    offset = validate.integer("offset", offset, minimum=-MAX_SIZE, maximum=MAX_SIZE, why="a number of positions")
    w = sinusoidal_frequencies(d_model, base=base)
    c, s = torch.cos(offset * w), torch.sin(offset * w)
    M = torch.zeros(d_model, d_model, dtype=torch.float64)
    M[0::2, 0::2] = torch.diag(c)
    M[0::2, 1::2] = torch.diag(-s)
    M[1::2, 0::2] = torch.diag(s)
    M[1::2, 1::2] = torch.diag(c)
    return M


MAX_POSITION = 2**31
"""Largest |position| of the RoPE helpers: beyond it the float64 angles ``m * theta`` lose the precision that
relative positions need (and sin/cos of huge arguments return NaN)."""


def _base(base: object) -> float:
    """The frequency base: a finite real > 1 (at 1 every frequency is 1; below, they grow instead of decay)."""
    return validate.real("base", base, minimum=1.0, strict_minimum=True)


def _rope_angles(positions: Tensor, d: int, base: float) -> Tensor:
    if positions.is_floating_point() and not bool(torch.isfinite(positions).all()):
        raise validate.fail("positions", positions, "finite positions", "It holds NaN or infinite entries.")
    if positions.numel() and float(positions.abs().max()) > MAX_POSITION:
        raise validate.fail("positions", positions, f"positions of magnitude at most {MAX_POSITION}")
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # [pair]
    return positions.to(torch.float64)[..., None] * theta  # [..., pair]


def rope_rotation_matrix(position: float, d: int, *, base: float = 10000.0) -> Float[Tensor, "d d"]:
    """RoPE's ``R_m`` (column convention, ``x' = R_m x``), block-diagonal with 2x2 blocks
    ``[[cos m theta_i, -sin m theta_i], [sin m theta_i, cos m theta_i]]``. With ``d = 2``, ``theta_0 = 1``.
    """
    position = validate.real("position", position)
    d = _even("d", d)
    base = _base(base)
    angles = _rope_angles(torch.tensor(position), d, base)
    c, s = angles.cos(), angles.sin()
    R = torch.zeros(d, d, dtype=torch.float64)
    R[0::2, 0::2] = torch.diag(c)
    R[0::2, 1::2] = torch.diag(-s)
    R[1::2, 0::2] = torch.diag(s)
    R[1::2, 1::2] = torch.diag(c)
    return R


def rope(
    x: Float[Tensor, "*batch pos d"],
    positions: Sequence[float] | Tensor | None = None,
    *,
    base: float = 10000.0,
) -> Float[Tensor, "*batch pos d"]:
    """Rotate each row ``x[..., p, :]`` by ``R_{positions[p]}`` without building the matrices.

    ``positions`` defaults to ``0 .. pos-1``. Computed in float64 and cast back to ``x.dtype``.
    """
    float_tensor("x", x, ndim_min=2)
    d = _even("x.shape[-1]", x.shape[-1])
    base = _base(base)
    n_pos = x.shape[-2]
    try:
        pos = torch.arange(n_pos) if positions is None else torch.as_tensor(positions)
    except (TypeError, ValueError, RuntimeError):
        raise validate.fail("positions", positions, "a sequence or tensor of real positions") from None
    if pos.is_complex() or pos.dtype == torch.bool:
        raise validate.fail("positions", pos, "real positions")
    if pos.shape != (n_pos,):
        raise CircuitkitError(
            f"positions has shape {tuple(pos.shape)}; expected one position per row of x, i.e. ({n_pos},)."
        )
    angles = _rope_angles(pos, d, base).to(x.device)  # [pos, pair]
    c, s = angles.cos(), angles.sin()
    xd = x.to(torch.float64)
    even, odd = xd[..., 0::2], xd[..., 1::2]
    out = torch.empty_like(xd)
    out[..., 0::2] = even * c - odd * s
    out[..., 1::2] = even * s + odd * c
    return validate.finite_result("rope", out.to(x.dtype), why=f"a rotated row exceeds the range of {x.dtype}")
