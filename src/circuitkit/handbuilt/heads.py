"""Attention heads from explicit matrices: copy these dims to those, attend by position, attend by match.

A head is two independent bilinear maps (row convention, as TransformerLens):

- its QK part scores query residual ``x_i`` against key residual ``x_j``:
  ``score(i, j) = (x_i @ W_Q + b_Q) . (x_j @ W_K)``, i.e. ``x_i @ (W_Q @ W_K.T) @ x_j.T`` plus the bias term;
- its OV part moves what the head attends to: ``x_j @ W_V @ W_O`` is added to the destination.

:class:`QK` holds ``W_Q, W_K: [d_model, r]`` (and an optional query bias ``b_Q: [r]``), :class:`OV` holds
``W_V: [d_model, r]`` and ``W_O: [r, d_model]``; ``r`` is the rank the part needs, at most the model's
``d_head`` (:func:`circuitkit.handbuilt.assembly` pads to ``d_head``). The Framework paper's column-convention
matrices are the transposes: ``W_QK = W_Q^T W_K``, ``W_OV = W_O W_V``.

Parts add: ``qk_a + qk_b`` scores with the sum of the two bilinear forms (the factors are concatenated, so
the ranks add), and likewise for :class:`OV`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from circuitkit import validate
from circuitkit.errors import CircuitkitError, describe
from circuitkit.handbuilt import limits
from circuitkit.handbuilt.subspace import Subspace, check_disjoint


def _matrix(name: str, value: Tensor, rows: int | None = None) -> Tensor:
    if not isinstance(value, Tensor) or value.ndim != 2 or not value.is_floating_point():
        raise CircuitkitError(f"{name}: given {describe(value)}; expected a 2-d float tensor.")
    validate.dense(name, value)
    if value.numel() == 0:
        raise CircuitkitError(f"{name}: given {describe(value)}; expected a non-empty matrix (rank r >= 1).")
    if rows is not None and value.shape[0] != rows:
        raise CircuitkitError(f"{name}: given {describe(value)}; expected {rows} rows.")
    if not bool(torch.isfinite(value).all()):
        raise CircuitkitError(f"{name}: given a matrix with NaN/inf; expected finite values.")
    return value.detach()


@dataclass(frozen=True)
class QK:
    """``score(i, j) = (x_i @ W_Q + b_Q) . (x_j @ W_K)`` with ``W_Q, W_K: [d_model, r]``, ``b_Q: [r]``."""

    W_Q: Float[Tensor, "d_model r"]
    W_K: Float[Tensor, "d_model r"]
    b_Q: Float[Tensor, " r"] | None = None

    def __post_init__(self) -> None:
        W_Q = _matrix("QK.W_Q", self.W_Q)
        W_K = _matrix("QK.W_K", self.W_K)
        if W_Q.shape != W_K.shape:
            raise CircuitkitError(
                f"QK: given W_Q {tuple(W_Q.shape)} and W_K {tuple(W_K.shape)}; expected the same [d_model, r]."
            )
        object.__setattr__(self, "W_Q", W_Q)
        object.__setattr__(self, "W_K", W_K)
        if self.b_Q is not None:
            b_Q = validate.tensor("QK.b_Q", self.b_Q, shape=(W_Q.shape[1],), floating=True, finite=True)
            object.__setattr__(self, "b_Q", b_Q.detach())

    @property
    def rank(self) -> int:
        """``r``, the head dimensions this part uses."""
        return self.W_Q.shape[1]

    @property
    def d_model(self) -> int:
        return self.W_Q.shape[0]

    def bias(self) -> Tensor:
        return torch.zeros(self.rank, dtype=self.W_Q.dtype) if self.b_Q is None else self.b_Q

    def __add__(self, other: QK) -> QK:
        if not isinstance(other, QK):
            raise validate.fail("QK + other", other, "a QK (heads' QK parts add to a QK of the summed rank)")
        _same_width(self.d_model, other.d_model, "QK + QK")
        b_Q = None
        if self.b_Q is not None or other.b_Q is not None:
            b_Q = torch.cat([self.bias(), other.bias()])
        return QK(torch.cat([self.W_Q, other.W_Q], 1), torch.cat([self.W_K, other.W_K], 1), b_Q)


@dataclass(frozen=True)
class OV:
    """``x_j @ W_V @ W_O`` is written to the destination; ``W_V: [d_model, r]``, ``W_O: [r, d_model]``."""

    W_V: Float[Tensor, "d_model r"]
    W_O: Float[Tensor, "r d_model"]

    def __post_init__(self) -> None:
        W_V = _matrix("OV.W_V", self.W_V)
        W_O = _matrix("OV.W_O", self.W_O)
        if W_V.shape[1] != W_O.shape[0] or W_V.shape[0] != W_O.shape[1]:
            raise CircuitkitError(
                f"OV: given W_V {tuple(W_V.shape)} and W_O {tuple(W_O.shape)}; expected [d_model, r] and [r, d_model]."
            )
        object.__setattr__(self, "W_V", W_V)
        object.__setattr__(self, "W_O", W_O)

    @property
    def rank(self) -> int:
        return self.W_V.shape[1]

    @property
    def d_model(self) -> int:
        return self.W_V.shape[0]

    def __add__(self, other: OV) -> OV:
        if not isinstance(other, OV):
            raise validate.fail("OV + other", other, "an OV (heads' OV parts add to an OV of the summed rank)")
        _same_width(self.d_model, other.d_model, "OV + OV")
        return OV(torch.cat([self.W_V, other.W_V], 1), torch.cat([self.W_O, other.W_O], 0))


@dataclass(frozen=True)
class HeadSpec:
    """One head: a :class:`QK` part (``None``: all scores 0, uniform attention) and an :class:`OV` part
    (``None``: the head writes nothing)."""

    qk: QK | None = None
    ov: OV | None = None
    name: str = ""

    def __post_init__(self) -> None:
        limits.text("HeadSpec: name", self.name)
        if self.qk is not None and not isinstance(self.qk, QK):
            raise validate.fail("HeadSpec: qk", self.qk, "a QK (e.g. match_qk(...)) or None")
        if self.ov is not None and not isinstance(self.ov, OV):
            raise validate.fail("HeadSpec: ov", self.ov, "an OV (e.g. copy_ov(...)) or None")
        if self.qk is not None and self.ov is not None:
            _same_width(self.qk.d_model, self.ov.d_model, f"head {self.name!r}")

    @property
    def rank(self) -> int:
        """The ``d_head`` this head needs: the larger of its QK and OV ranks."""
        return max(self.qk.rank if self.qk is not None else 0, self.ov.rank if self.ov is not None else 0)

    @property
    def d_model(self) -> int | None:
        part = self.qk if self.qk is not None else self.ov
        return None if part is None else part.d_model


def _float_dtype(name: str, dtype: object) -> None:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise validate.fail(name, dtype, "a floating torch.dtype such as torch.float32")


def _same_width(a: int, b: int, what: str) -> None:
    if a != b:
        raise CircuitkitError(f"{what}: given parts on residual widths {a} and {b}; expected one d_model.")


def _subspace(name: str, value: object) -> Subspace:
    if not isinstance(value, Subspace):
        raise validate.fail(name, value, "a Subspace (e.g. layout['tok'])")
    return value


def _check_d_head(rank: int, d_head: int | None, what: str) -> None:
    d_head = limits.optional_width(f"{what}: d_head", d_head)
    if d_head is not None and rank > d_head:
        raise CircuitkitError(
            f"{what}: needs {rank} head dimensions but d_head={d_head}; expected d_head >= {rank}. "
            "Use a larger d_head or copy fewer dimensions."
        )


# ---------------------------------------------------------------------- OV constructors
def copy_ov(src: Subspace, dst: Subspace, *, scale: float = 1.0, d_head: int | None = None) -> OV:
    """Copy ``src``'s dims onto ``dst``'s, in order: ``W_V = src.basis.T`` [d_model, k], ``W_O = scale * dst.basis``.

    ``src`` and ``dst`` must have the same size ``k <= d_head`` and not overlap (a head writing into what it
    reads would add, not copy).
    """
    src = _subspace("copy_ov: src", src)
    dst = _subspace("copy_ov: dst", dst)
    scale = validate.real("copy_ov: scale", scale)
    if src.size != dst.size:
        raise CircuitkitError(
            f"copy_ov: given {src!r} ({src.size} dims) and {dst!r} ({dst.size} dims); expected equal sizes."
        )
    check_disjoint([src, dst])
    _check_d_head(src.size, d_head, f"copy_ov {src.name} -> {dst.name}")
    return OV(src.basis().T.contiguous(), scale * dst.basis())


# ---------------------------------------------------------------------- QK constructors
def match_qk(query: Subspace, key: Subspace, *, scale: float = 1.0, d_head: int | None = None) -> QK:
    """Attend to keys whose ``key`` coordinates match the query's ``query`` coordinates.

    ``score(i, j) = scale * <x_i[query], x_j[key]>``: with one-hot codes in both subspaces, ``scale`` for a
    match and 0 otherwise. ``W_Q = scale * query.basis.T``, ``W_K = key.basis.T`` (both ``[d_model, k]``).
    """
    query = _subspace("match_qk: query", query)
    key = _subspace("match_qk: key", key)
    scale = validate.real("match_qk: scale", scale)
    if query.size != key.size:
        raise CircuitkitError(
            f"match_qk: given {query!r} and {key!r}; expected subspaces of equal size to compare."
        )
    _same_width(query.d_model, key.d_model, "match_qk")
    _check_d_head(query.size, d_head, f"match_qk {query.name} ~ {key.name}")
    return QK(scale * query.basis().T, key.basis().T.contiguous())


def key_bias_qk(key: Subspace, bias: float) -> QK:
    """Add ``bias * x_j[key]`` to every score: a query-independent push towards (``bias > 0``) or away from keys.

    Rank ``key.size``; the query side is a bias ``b_Q`` alone (``W_Q = 0``), so the QK matrix ``W_Q W_K^T``
    is unchanged and only the biased score moves.
    """
    key = _subspace("key_bias_qk: key", key)
    bias = validate.real("key_bias_qk: bias", bias)
    zeros = torch.zeros(key.d_model, key.size)
    return QK(zeros, key.basis().T.contiguous(), torch.full((key.size,), float(bias)))


@dataclass(frozen=True)
class PositionCode:
    """A positional code for ``n_ctx`` positions under which "attend ``offset`` back" is one linear map.

    Frequencies ``w_b = pi / 2**b`` for ``b = 0 .. B-1``, ``2**B >= n_ctx``; position ``i`` is coded as
    ``[cos(i pi), cos(i w_1), sin(i w_1), ..., cos(i w_{B-1}), sin(i w_{B-1})]`` (``dim = 2B - 1``: ``sin(i pi)``
    is always 0). Rotating each pair by ``-offset * w_b`` (:meth:`shift`) maps the code of ``i`` to that of
    ``i - offset``, so ``score(i, j) = code[i] @ shift @ code[j] = sum_b cos((i - offset - j) w_b)``:
    ``B`` at ``j = i - offset`` and at most ``B - 2`` elsewhere, because every ``d != 0`` with ``|d| < 2**B``
    is ``2**b`` times an odd number, and for that ``b``, ``cos(d w_b) = -1``. The margin is 2, whatever ``n_ctx``.
    """

    n_ctx: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "n_ctx", limits.positions("PositionCode: n_ctx", self.n_ctx))

    @property
    def n_freqs(self) -> int:
        return max(1, math.ceil(math.log2(self.n_ctx)))

    @property
    def dim(self) -> int:
        return 2 * self.n_freqs - 1

    margin = 2.0
    """Score at the target minus the best score elsewhere (before any scale)."""

    def _omegas(self) -> Tensor:
        return math.pi / 2.0 ** torch.arange(self.n_freqs, dtype=torch.float64)

    def codes(self, dtype: torch.dtype = torch.float32) -> Float[Tensor, "n_ctx dim"]:
        _float_dtype("PositionCode.codes: dtype", dtype)
        angles = torch.arange(self.n_ctx, dtype=torch.float64)[:, None] * self._omegas()  # [n_ctx, B]
        cols = [angles[:, 0].cos()]
        for b in range(1, self.n_freqs):
            cols += [angles[:, b].cos(), angles[:, b].sin()]
        return torch.stack(cols, dim=1).to(dtype)

    def shift(self, offset: int = 1, dtype: torch.dtype = torch.float32) -> Float[Tensor, "dim dim"]:
        """``[dim, dim]`` block rotation with ``codes()[i] @ shift(offset) == codes()[i - offset]`` (row convention)."""
        _float_dtype("PositionCode.shift: dtype", dtype)
        if not isinstance(offset, int) or isinstance(offset, bool) or not 0 <= offset < self.n_ctx:
            raise CircuitkitError(
                f"PositionCode.shift: given offset={offset!r}; expected an int in [0, {self.n_ctx})."
            )
        omegas = self._omegas() * offset
        out = torch.zeros(self.dim, self.dim, dtype=torch.float64)
        out[0, 0] = omegas[0].cos()
        for b in range(1, self.n_freqs):
            c, s = omegas[b].cos(), omegas[b].sin()
            i = 2 * b - 1
            # [cos, sin] @ [[c, -s], [s, c]] = [cos(a - o), sin(a - o)]
            out[i, i], out[i, i + 1], out[i + 1, i], out[i + 1, i + 1] = c, -s, s, c
        return out.to(dtype)


def previous_token_qk(
    positions: Subspace, code: PositionCode, *, offset: int = 1, scale: float = 1.0, d_head: int | None = None
) -> QK:
    """Attend ``offset`` positions back through the positional subspace holding ``code``.

    ``W_Q = positions.basis.T @ shift(offset) * scale``, ``W_K = positions.basis.T`` (``[d_model, code.dim]``):
    ``score(i, j) = scale * sum_b cos((i - offset - j) w_b)``, highest at ``j = i - offset`` by
    ``scale * code.margin`` (see :class:`PositionCode`). Position ``i < offset`` has no such key.
    ``offset`` is an int in ``[1, code.n_ctx)``.
    """
    positions = _subspace("previous_token_qk: positions", positions)
    if not isinstance(code, PositionCode):
        raise validate.fail("previous_token_qk: code", code, "a PositionCode (e.g. PositionCode(n_ctx))")
    offset = validate.integer("previous_token_qk: offset", offset, minimum=1, maximum=code.n_ctx - 1)
    scale = validate.real("previous_token_qk: scale", scale)
    if positions.size != code.dim:
        raise CircuitkitError(
            f"previous_token_qk: given {positions!r} with {positions.size} dims for a PositionCode of dim "
            f"{code.dim}; expected equal sizes."
        )
    _check_d_head(code.dim, d_head, "previous_token_qk")
    basis_t = positions.basis().T  # [d_model, dim]
    return QK(scale * basis_t @ code.shift(offset), basis_t.contiguous())
