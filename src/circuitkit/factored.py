"""QK and OV circuits kept as low-rank factors, and the exact spectra computed from the factors.

Why: a head's QK circuit ``W_Q @ W_K.T`` and OV circuit ``W_V @ W_O`` are ``d_model x d_model`` matrices of
rank at most ``d_head``; the full circuits through the embeddings are ``d_vocab x d_vocab``. Building them
costs ``O(d_model^2)`` (or ``O(d_vocab^2)``) memory per head for information that lives in ``d_head``
dimensions. :class:`Factored` holds ``M = A @ B`` with ``A: [..., m, r]`` and ``B: [..., r, n]`` and answers
every question about ``M`` from ``r x r`` matrices:

- singular values: with ``A = Q_A R_A`` and ``B.T = Q_B R_B`` (``R`` a root of the Gram matrix,
  ``R.T R = A.T A``: a Cholesky factor, or a thin QR's), ``M = Q_A (R_A R_B.T) Q_B.T`` and the ``Q`` factors
  have orthonormal columns, so ``svdvals(M) = svdvals(R_A @ R_B.T)`` (``r x r``), every head at once;
- Frobenius norm: ``||A B||_F^2 = trace(A.T A B B.T) = sum((A.T A) * (B B.T))`` (two ``r x r`` Gram matrices);
- eigenvalues (square ``M``): the non-zero eigenvalues of ``A B`` are those of ``B A`` (``r x r``).

Convention: row vectors, as TransformerLens. ``QK = W_Q @ W_K.T`` scores ``x_dst @ QK @ x_src.T``;
``OV = W_V @ W_O`` maps a source residual row ``x_src @ OV`` into the destination. The Framework paper's
column-convention ``W_QK = W_Q^T W_K`` and ``W_OV = W_O W_V`` are these matrices transposed, with the same
singular values and eigenvalues.

Numerical safety. LAPACK's eigenvalue and SVD routines can crash the process (not raise) on finite inputs near
the dtype's range, and float32 products of large factors overflow. Every spectrum is therefore computed from
factors divided by their own largest absolute entry (per matrix), in float64 for the ``r x r`` core, and the scale
is multiplied back afterwards: singular values and eigenvalues are homogeneous of degree one in each factor
(``sigma(cA B) = |c| sigma(AB)``, ``lambda(cA B) = c lambda(AB)``). Results keep the weights' dtype unless float32
cannot hold them (values beyond ~3e38 or below ~1e-38), in which case they are returned in float64.
:func:`stable_eigvals` is the same treatment for dense square matrices.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from numbers import Integral
from typing import Any, Literal

import torch
from jaxtyping import Complex, Float
from torch import Tensor

from circuitkit import validate
from circuitkit.errors import CircuitkitError, describe
from circuitkit.weights import HeadWeights, as_head_weights

CircuitName = Literal["QK", "OV"]

__all__ = [
    "Factored",
    "effective_rank",
    "frobenius_norm",
    "full_ov_circuit",
    "full_qk_circuit",
    "numerical_rank",
    "ov_circuit",
    "ov_eigenvalues",
    "qk_circuit",
    "singular_values",
    "stable_eigvals",
]

_FLOAT32_HEADROOM = 2.0**-8
"""A float32 product is built in float64 when its bound ``max|a| max|b| k`` exceeds this fraction of float32's
largest value: the margin leaves room for the sums inside later Gram matrices."""


# ---------------------------------------------------------------------- scale-safe linear algebra
def _unit_scale(x: Tensor) -> tuple[Tensor, Tensor]:
    """``(x / s, s)`` with ``s [..., 1, 1]`` the largest absolute entry of each matrix (1 for a zero matrix).

    Dividing by ``s`` puts every entry in ``[-1, 1]``: LAPACK then never sees values near the dtype's range.
    """
    scale = x.detach().abs().amax(dim=(-2, -1), keepdim=True)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return x / scale, scale


def _in_dtype(value: Tensor, dtype: torch.dtype, name: str) -> Tensor:
    """``value`` (float64/complex128) cast to the working ``dtype``'s precision if float32 holds it: no overflow
    to inf and no non-zero value flushed below float32's smallest normal number; else ``value`` stays float64."""
    validate.finite_result(name, value)
    target = dtype
    if value.is_complex():
        target = torch.complex128 if dtype == torch.float64 else torch.complex64
    elif dtype != torch.float64:
        target = torch.float32
    if target in (torch.float64, torch.complex128):
        return value
    cast = value.to(target)
    flushed = (value != 0) & (cast.abs() < torch.finfo(torch.float32).tiny)
    return cast if bool(torch.isfinite(cast).all()) and not bool(flushed.any()) else value


def stable_eigvals(matrix: Any, *, name: str = "stable_eigvals: matrix") -> Tensor:
    """Eigenvalues of a batch of square real matrices ``[..., n, n]`` -> complex ``[..., n]``, never crashing.

    ``matrix`` must be a finite floating tensor (:class:`CircuitkitError` naming ``name`` otherwise). Each matrix
    is divided by its largest absolute entry ``s``, its eigenvalues are computed in float64 and multiplied by
    ``s`` (``lambda(M) = s lambda(M / s)``). The result is complex64 for float16/bfloat16/float32 input
    (complex128 where complex64 cannot hold the values) and complex128 for float64 input; order as
    ``torch.linalg.eigvals``. This is the routine behind the copying score and :func:`ov_eigenvalues`.
    """
    matrix = validate.tensor(name, matrix, floating=True, finite=True)
    if matrix.ndim < 2 or matrix.shape[-1] != matrix.shape[-2]:
        raise validate.fail(name, matrix, "a batch of square matrices [..., n, n]")
    with torch.no_grad():
        unit, scale = _unit_scale(matrix.detach().double())
        values = _eigvals(unit) * scale[..., 0]
    return _in_dtype(values, matrix.dtype, name)


PARALLEL_EIG_MIN_SIZE = 64
"""From this matrix size on, a batch of eigenvalue problems is shared among torch's threads."""

CPU_EIG_MAX_SIZE = 512
"""Up to this matrix size a batch on a GPU is solved on the CPU: CUDA's general eigensolver runs one matrix at a time
with a host round trip each (the copying score's 512 heads of ``d_head`` 64 in float64: 1.6 s on an H200, against
much less on its CPU: benchmarks/gpu.py), and the copy is a few MB."""


def _eigvals(matrices: Tensor) -> Tensor:
    """``torch.linalg.eigvals`` of a batch (see :func:`_shared`)."""
    return _shared(torch.linalg.eigvals, matrices)


def _shared(solve: Callable[[Tensor], Tensor], matrices: Tensor) -> Tensor:
    """``solve`` (a batched LAPACK routine returning ``[..., n]``) of a batch of ``[..., n, n]`` matrices, the batch
    shared among ``torch.get_num_threads()`` worker threads on the CPU: LAPACK solves a batch one matrix after
    another (the copying score's eigenvalues of 72 heads of ``d_head`` 256 took 1.9 s on two cores, 1.1 s shared
    between two threads). Each matrix's result is the same however the batch is split."""
    if matrices.device.type != "cpu":
        if matrices.shape[-1] > CPU_EIG_MAX_SIZE:
            return solve(matrices)
        # small problems: the CPU's LAPACK, then back (see CPU_EIG_MAX_SIZE)
        return _shared(solve, matrices.cpu()).to(matrices.device)
    workers = min(torch.get_num_threads(), matrices[..., 0, 0].numel())
    if workers < 2 or matrices.shape[-1] < PARALLEL_EIG_MIN_SIZE:
        return solve(matrices)
    from concurrent.futures import ThreadPoolExecutor

    flat = matrices.reshape(-1, *matrices.shape[-2:])
    with ThreadPoolExecutor(workers) as pool:
        parts = list(pool.map(solve, flat.chunk(workers)))
    return torch.cat(parts).reshape(matrices.shape[:-1])


def _safe_product(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b``, in float64 where the float32 product could overflow (see ``_FLOAT32_HEADROOM``) or lose its
    precision to underflow (entries of the product near float32's subnormal range)."""
    if a.dtype != torch.float64:
        info = torch.finfo(a.dtype)
        top = float(a.abs().amax()) * float(b.abs().amax())
        bound = top * a.shape[-1]
        if not math.isfinite(bound) or bound > info.max * _FLOAT32_HEADROOM or 0 < top < info.tiny / info.eps:
            return a.double() @ b.double()
    return a @ b


def _same_dtype(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """Both in float64 if either had to be built in float64 (``_safe_product``)."""
    if a.dtype != b.dtype:
        return a.double(), b.double()
    return a, b


@dataclass(frozen=True)
class Factored:
    """A batch of matrices ``M = A @ B`` stored as factors; nothing ``m x n`` is ever built (but :meth:`dense`).

    ``A: [..., m, r]``, ``B: [..., r, n]`` with the same leading (batch) shape, e.g. ``[layer, head]``.
    Properties are computed on demand from ``r``-sized matrices; see the module docstring for the maths.
    """

    A: Float[Tensor, "*batch m r"]
    B: Float[Tensor, "*batch r n"]

    def __post_init__(self) -> None:
        A, B = self.A, self.B
        if not isinstance(A, Tensor) or not isinstance(B, Tensor):
            raise CircuitkitError(
                f"Factored: given A={describe(A)}, B={describe(B)}; expected two tensors."
            )
        if A.ndim < 2 or B.ndim < 2 or A.shape[-1] != B.shape[-2] or A.shape[:-2] != B.shape[:-2]:
            raise CircuitkitError(
                f"Factored: given A of shape {tuple(A.shape)} and B of shape {tuple(B.shape)}; expected "
                "A [..., m, r] and B [..., r, n] with the same leading shape and A's last axis equal to B's "
                "second-last."
            )
        if not A.is_floating_point() or A.dtype != B.dtype:
            raise CircuitkitError(
                f"Factored: given dtypes {A.dtype} and {B.dtype}; expected one floating dtype."
            )
        validate.tensor("Factored: A", A, finite=True)
        validate.tensor("Factored: B", B, finite=True)
        if A.numel() == 0 or B.numel() == 0:
            raise validate.fail("Factored", validate.given(f"A {tuple(A.shape)} and B {tuple(B.shape)}"),
                                "non-empty factors")

    # ------------------------------------------------------------------ shape
    @property
    def shape(self) -> torch.Size:
        return torch.Size((*self.A.shape[:-1], self.B.shape[-1]))

    @property
    def batch_shape(self) -> torch.Size:
        return self.A.shape[:-2]

    @property
    def inner_dim(self) -> int:
        """``r``: the rank bound of every matrix in the batch."""
        return self.A.shape[-1]

    @property
    def T(self) -> Factored:
        """The transposes ``M.T = B.T @ A.T``, still factored."""
        return Factored(self.B.transpose(-1, -2), self.A.transpose(-1, -2))

    def __getitem__(self, index) -> Factored:
        """Index the batch axes only, e.g. ``circuit[layer, head]``."""
        if not isinstance(index, tuple):
            index = (index,)
        if len(index) > len(self.batch_shape):
            raise CircuitkitError(
                f"Factored[...]: given {len(index)} indices; expected at most {len(self.batch_shape)} "
                f"(the batch axes of shape {tuple(self.batch_shape)})."
            )
        _check_batch_index(index, self.batch_shape)
        try:
            A, B = self.A[index], self.B[index]
        except (IndexError, RuntimeError, TypeError, ValueError) as error:
            raise validate.fail("Factored[...]", validate.given(f"index {_index_text(index)}"),
                                f"indices of the batch axes of shape {tuple(self.batch_shape)} ({error})") from None
        return Factored(A, B)

    __array_ufunc__ = None  # numpy defers ``array @ factored`` to __rmatmul__ (its checks) instead of failing inside

    def __matmul__(self, other: Tensor | Factored) -> Factored:
        """``self @ other``: a dense right factor is absorbed into ``B``; a factored one keeps the smaller inner."""
        _check_operand(self, other, right=True)
        if isinstance(other, Factored):
            middle = self.B @ other.A
            if self.inner_dim <= other.inner_dim:
                return Factored(self.A, middle @ other.B)
            return Factored(self.A @ middle, other.B)
        return Factored(self.A, self.B @ other)

    def __rmatmul__(self, other: Tensor) -> Factored:
        _check_operand(self, other, right=False)
        return Factored(other @ self.A, self.B)

    def dense(self) -> Tensor:
        """The full matrices ``A @ B``. Only for small shapes and tests: costs ``m x n`` per batch entry."""
        return self.A @ self.B

    # ------------------------------------------------------------------ spectra
    def _scaled(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(A / s_A, B / s_B, s_A s_B [..., 1])``: unit-scale factors and the scale of their product (float64)."""
        A, scale_A = _unit_scale(self.A)
        B, scale_B = _unit_scale(self.B)
        return A, B, (scale_A.double() * scale_B.double())[..., 0]

    def _unit_sigma(self) -> tuple[Tensor, Tensor]:
        """``(sigma / scale, scale)``: the ``k = min(m, r, n)`` singular values of ``A @ B`` (float64, descending)
        of the unit-scale factors, and the scale ``[..., 1]`` to multiply back; every matrix of the batch at once.

        Float64 factors: ``svdvals(R_A @ R_B.T)`` with thin-QR ``R`` factors (float64-accurate, also for tiny
        singular values). Other dtypes: ``sigma^2 = eigvalsh(R_B (A.T A) R_B.T)`` with ``A.T A`` formed in float64
        and ``R_B`` its Cholesky-type root (:func:`_gram_root`): ``R_B (A.T A) R_B.T`` is the Gram matrix of
        ``A @ R_B.T``, which has the singular values of ``A @ B``. A symmetric ``r x r`` eigenvalue problem costs a
        fraction of an SVD; its rounding (``eps64 * sigma_max^2`` in ``sigma^2``) is the Gram matrix's own, far
        below float32's. Where ``k < r`` the core has ``r - k`` more values, zero up to rounding: dropped.
        """
        A, B, scale = self._scaled()
        k = min(self.A.shape[-2], self.inner_dim, self.B.shape[-1])
        if A.dtype == torch.float64:
            R_A = torch.linalg.qr(A, mode="r")[1]
            R_B = torch.linalg.qr(B.transpose(-1, -2), mode="r")[1]
            return torch.linalg.svdvals(R_A @ R_B.transpose(-1, -2))[..., :k], scale
        A64 = A.double()
        R_B = _gram_root(B.transpose(-1, -2))
        core = R_B @ (A64.transpose(-1, -2) @ A64) @ R_B.transpose(-1, -2)
        squares = _shared(torch.linalg.eigvalsh, core).flip(-1)[..., :k]
        return squares.clamp_min(0).sqrt(), scale

    def singular_values(self) -> Float[Tensor, "*batch k"]:
        """Singular values of each ``A @ B``, descending; ``k = min(m, r, n)``."""
        sigma, scale = self._unit_sigma()
        return _in_dtype(sigma * scale, self.A.dtype, "Factored.singular_values")

    def norm(self) -> Float[Tensor, "*batch"]:
        """Frobenius norms ``||A @ B||_F`` from the two ``r x r`` Gram matrices."""
        A, B, scale = self._scaled()
        A, B = A.double(), B.double()
        gram_A = A.transpose(-1, -2) @ A
        gram_B = B @ B.transpose(-1, -2)
        norm = (gram_A * gram_B).sum(dim=(-1, -2)).clamp_min(0).sqrt() * scale[..., 0]
        return _in_dtype(norm, self.A.dtype, "Factored.norm")

    def eigenvalues(self) -> Complex[Tensor, "*batch r"]:
        """Eigenvalues of square ``A @ B``: those of ``B @ A`` (``r x r``), the non-zero ones of ``A @ B``.

        ``A @ B`` also has ``m - r`` zero eigenvalues that are not returned. Computed by :func:`stable_eigvals`
        on the unit-scale factors' core, then multiplied by the factors' scales.
        """
        if self.A.shape[-2] != self.B.shape[-1]:
            raise CircuitkitError(
                f"Factored.eigenvalues: given matrices of shape {tuple(self.shape[-2:])}; expected square ones."
            )
        A, B, scale = self._scaled()
        core = B.double() @ A.double()
        values = stable_eigvals(core, name="Factored.eigenvalues: B @ A") * scale
        return _in_dtype(values, self.A.dtype, "Factored.eigenvalues")

    def numerical_rank(self, rtol: float | None = None) -> Tensor:
        """Number of singular values above ``rtol * sigma_max`` (default ``max(m, n) * eps`` of the factors'
        dtype, as ``torch.linalg.matrix_rank``). ``rtol`` must be a finite number >= 0."""
        if rtol is None:
            rtol = max(self.shape[-2], self.shape[-1]) * torch.finfo(self.A.dtype).eps
        rtol = validate.real("numerical_rank: rtol", rtol, minimum=0.0)
        return _rank_from_sigma(self.singular_values(), rtol)

    def effective_rank(self) -> Float[Tensor, "*batch"]:
        """Roy & Vetterli's effective rank ``exp(H(p))``, ``p = sigma / sum(sigma)``, ``H`` the Shannon entropy.

        Between 1 (one direction carries everything) and the numerical rank (a flat spectrum); 0 for a zero
        matrix. Scale-free: computed from the unit-scale core.
        """
        sigma, _ = self._unit_sigma()
        rank = _effective_rank_from_sigma(sigma)
        return _in_dtype(rank, self.A.dtype, "Factored.effective_rank")

    def __repr__(self) -> str:
        return f"Factored(shape={tuple(self.shape)}, inner_dim={self.inner_dim}, dtype={self.A.dtype})"


def _gram_root(F: Float[Tensor, "*batch m r"]) -> Float[Tensor, "*batch r r"]:
    """``R`` (float64) with ``R.T @ R == F.T @ F``, every matrix of the batch at once: ``F = U R`` for some ``U``
    with orthonormal columns on ``R``'s row space, so ``R`` stands in for ``F`` in singular values.

    The Cholesky factor of the ``r x r`` Gram matrix formed in float64 (products of float32 numbers are exact in
    float64); a singular Gram (a head of rank < r, or ``r > m``) takes ``diag(sqrt(s)) U.T`` from its
    eigendecomposition ``U diag(s) U.T`` instead. One batched ``r x r`` Cholesky costs a fraction of a batch of
    Householder QRs of the tall ``m x r`` matrices.
    """
    F64 = F.double()
    gram = F64.transpose(-1, -2) @ F64
    factor, info = torch.linalg.cholesky_ex(gram)
    root = factor.transpose(-1, -2).contiguous()
    singular = info != 0
    if bool(singular.any()):
        values, vectors = torch.linalg.eigh(gram[singular])
        root[singular] = values.clamp_min(0).sqrt().unsqueeze(-1) * vectors.transpose(-1, -2)
    return root


def _index_text(index: tuple) -> str:
    return "[" + ", ".join(describe(i) if isinstance(i, Tensor) else repr(i)[:40] for i in index) + "]"


def _check_batch_index(index: tuple, batch_shape: torch.Size) -> None:
    """Each index is an int within its batch axis, a slice of ints that keeps something, ``...``, or an integer
    or boolean tensor (checked by torch); ``None`` (a new axis), floats and strings are refused."""
    expected = f"ints, slices or index tensors for the batch axes of shape {tuple(batch_shape)}"
    for axis, item in enumerate(index):
        if item is Ellipsis or isinstance(item, Tensor) and (item.dtype == torch.bool or not (
                item.is_floating_point() or item.is_complex())):
            continue
        if isinstance(item, Integral) and not isinstance(item, bool):
            size = batch_shape[axis]
            if not -size <= int(item) < size:
                raise validate.fail("Factored[...]", validate.given(f"index {int(item)} for batch axis {axis}"),
                                    f"an index in [-{size}, {size}) (axis {axis} of the batch shape "
                                    f"{tuple(batch_shape)})")
            continue
        if isinstance(item, slice) and all(p is None or isinstance(p, Integral) and not isinstance(p, bool)
                                           for p in (item.start, item.stop, item.step)) and item.step != 0:
            if len(range(*item.indices(batch_shape[axis]))) == 0:
                raise validate.fail("Factored[...]", validate.given(f"slice {item.start}:{item.stop} for batch axis "
                                    f"{axis}"), f"a slice that keeps at least one of its {batch_shape[axis]} "
                                    "entries")
            continue
        raise validate.fail("Factored[...]", item, expected)


def _check_operand(self: Factored, other: Any, *, right: bool) -> None:
    """``self @ other`` (``right``) or ``other @ self``: ``other`` a Factored or a floating tensor of self's dtype
    whose matrix axis matches, with no batch shape or self's."""
    where = "Factored @ other" if right else "other @ Factored"
    if not isinstance(other, (Factored, Tensor)):
        raise validate.fail(where, other, "a torch.Tensor or a Factored", "Convert with torch.as_tensor(...).")
    shape = other.shape
    if len(shape) < 2:
        raise validate.fail(where, other if isinstance(other, Tensor) else validate.given(f"shape {tuple(shape)}"),
                            "a matrix or a batch of matrices (at least 2 axes)")
    if isinstance(other, Tensor):
        validate.dense(where, other)
        if other.dtype != self.A.dtype:
            raise validate.fail(where, other, f"dtype {self.A.dtype}, the factors' dtype", "Cast with .to(...).")
    size, need = (shape[-2], self.shape[-1]) if right else (shape[-1], self.shape[-2])
    if size != need:
        axis = "rows" if right else "columns"
        raise validate.fail(where, validate.given(f"shape {tuple(shape)}"),
                            f"{need} {axis} to match the factored shape {tuple(self.shape)}")
    batch = tuple(shape[:-2])
    if batch and batch != tuple(self.batch_shape):
        raise validate.fail(where, validate.given(f"batch shape {batch}"),
                            f"no batch axes or the factored batch shape {tuple(self.batch_shape)}")


def _rank_from_sigma(sigma: Tensor, rtol: float) -> Tensor:
    threshold = sigma[..., :1] * rtol
    return (sigma > threshold).sum(dim=-1)


def _effective_rank_from_sigma(sigma: Tensor) -> Tensor:
    total = sigma.sum(dim=-1, keepdim=True)
    p = sigma / total.clamp_min(torch.finfo(sigma.dtype).tiny)
    entropy = -(p * torch.log(p.clamp_min(torch.finfo(sigma.dtype).tiny))).sum(dim=-1)
    return torch.where(total.squeeze(-1) > 0, entropy.exp(), torch.zeros_like(entropy))


# ---------------------------------------------------------------------- circuits of HeadWeights
def _weights(w: Any, caller: str = "circuit") -> HeadWeights:
    return as_head_weights(w, caller)


def qk_circuit(weights) -> Factored:
    """Every head's QK circuit ``W_Q @ W_K.T`` (row convention), factored: ``[layer, head, d_model, d_model]``.

    ``A = W_Q [layer, head, d_model, d_head]``, ``B = W_K.T [layer, head, d_head, d_model]`` (key/value
    groups repeated per query head). Accepts :class:`HeadWeights` or a model.
    """
    w = _weights(weights, "qk_circuit")
    with torch.no_grad():
        return Factored(w.W_Q, w.per_query_head("W_K").transpose(-1, -2))


def ov_circuit(weights) -> Factored:
    """Every head's OV circuit ``W_V @ W_O`` (row convention), factored: ``[layer, head, d_model, d_model]``."""
    w = _weights(weights, "ov_circuit")
    with torch.no_grad():
        return Factored(w.per_query_head("W_V"), w.W_O)


def full_ov_circuit(weights) -> Factored:
    """``W_E @ W_V @ W_O @ W_U`` per head, factored as ``(W_E W_V) (W_O W_U)``: ``[layer, head, d_vocab, d_vocab]``.

    Entry ``[s, t]`` is how much attending to token ``s`` raises the logit of token ``t``.
    """
    w = _weights(weights, "full_ov_circuit")
    _require(w, "W_E", "full_ov_circuit")
    _require(w, "W_U", "full_ov_circuit")
    with torch.no_grad():
        left = _safe_product(w.W_E, w.per_query_head("W_V"))
        return Factored(*_same_dtype(left, _safe_product(w.W_O, w.W_U)))


def full_qk_circuit(weights) -> Factored:
    """``W_E @ W_Q @ W_K.T @ W_E.T`` per head, factored: ``[layer, head, d_vocab, d_vocab]``.

    Entry ``[q, k]`` is the attention score a query token ``q`` gives a key token ``k`` (embeddings only).
    """
    w = _weights(weights, "full_qk_circuit")
    _require(w, "W_E", "full_qk_circuit")
    with torch.no_grad():
        left = _safe_product(w.W_E, w.W_Q)
        return Factored(*_same_dtype(left, _safe_product(w.W_E, w.per_query_head("W_K")).transpose(-1, -2)))


def _require(w: HeadWeights, name: str, caller: str) -> None:
    if getattr(w, name) is None:
        raise CircuitkitError(
            f"{caller}: these HeadWeights have no {name}; expected weights that carry it. Build them with "
            f"HeadWeights(..., {name}=...) or from a model that has an embedding/unembedding."
        )


def _circuit(weights: Any, which: Any, caller: str) -> Factored:
    builders = {"QK": qk_circuit, "OV": ov_circuit, "full_QK": full_qk_circuit, "full_OV": full_ov_circuit}
    which = validate.option(f"{caller}: circuit", which, tuple(builders))
    return builders[which](_weights(weights, caller))


def singular_values(weights, circuit: CircuitName = "OV") -> Float[Tensor, "layer head d_head"]:
    """Singular values of every head's ``"QK"`` or ``"OV"`` circuit, descending: ``[layer, head, d_head]``.

    (``"full_QK"`` / ``"full_OV"`` give the spectra of the circuits through the embeddings.)
    """
    which = validate.option("singular_values: circuit", circuit, ("QK", "OV", "full_QK", "full_OV"))
    w = _weights(weights, "singular_values")
    with torch.no_grad():
        if which in ("QK", "OV") and w.dtype != torch.float64:
            return _head_singular_values(w, which)
        return _circuit(w, which, "singular_values").singular_values()


def _head_singular_values(w: HeadWeights, which: str) -> Tensor:
    """:meth:`Factored.singular_values` of :func:`qk_circuit` / :func:`ov_circuit` (float32 and half weights),
    with the key/value side's Gram matrices and roots computed once per group instead of once per query head
    (no repeated copy of ``W_K`` / ``W_V``). Same maths and scale handling as :meth:`Factored._unit_sigma`:
    ``QK = W_Q W_K.T`` has ``A = W_Q`` (per head), ``B.T = W_K`` (per group); ``OV = W_V W_O`` has ``A = W_V``
    (per group), ``B.T = W_O.T`` (per head)."""
    if which == "QK":
        A, Bt, a_grouped = w.W_Q, w.W_K, False
    else:
        A, Bt, a_grouped = w.W_V, w.W_O.transpose(-1, -2), True
    validate.tensor(f"singular_values: {which} factor", A, finite=True)
    validate.tensor(f"singular_values: {which} factor", Bt, finite=True)
    kv = w.kv_index
    a_index = kv if a_grouped else slice(None)
    b_index = slice(None) if a_grouped else kv
    A, scale_A = _unit_scale(A)
    Bt, scale_B = _unit_scale(Bt)
    A64 = A.double()
    gram_A = (A64.transpose(-1, -2) @ A64)[:, a_index]
    R_B = _gram_root(Bt)[:, b_index]
    core = R_B @ gram_A @ R_B.transpose(-1, -2)
    k = min(w.d_model, w.d_head)
    squares = _shared(torch.linalg.eigvalsh, core).flip(-1)[..., :k]
    scale = (scale_A.double()[:, a_index] * scale_B.double()[:, b_index])[..., 0]
    return _in_dtype(squares.clamp_min(0).sqrt() * scale, w.dtype, "Factored.singular_values")


def numerical_rank(weights, circuit: CircuitName = "OV", rtol: float | None = None) -> Tensor:
    """``[layer, head]`` numerical rank (count of ``sigma > rtol * sigma_max``); always ``<= min(d_model, d_head)``."""
    if rtol is not None:
        rtol = validate.real("numerical_rank: rtol", rtol, minimum=0.0)
    with torch.no_grad():
        return _circuit(weights, circuit, "numerical_rank").numerical_rank(rtol)


def effective_rank(weights, circuit: CircuitName = "OV") -> Float[Tensor, "layer head"]:
    """``[layer, head]`` effective rank ``exp(entropy(sigma / sum sigma))`` of each circuit."""
    with torch.no_grad():
        return _circuit(weights, circuit, "effective_rank").effective_rank()


def frobenius_norm(weights, circuit: CircuitName = "OV") -> Float[Tensor, "layer head"]:
    """``[layer, head]`` Frobenius norm of each circuit, from ``d_head x d_head`` Gram matrices."""
    with torch.no_grad():
        return _circuit(weights, circuit, "frobenius_norm").norm()


def ov_eigenvalues(weights, full: bool = False) -> Complex[Tensor, "layer head d_head"]:
    """Eigenvalues of every OV circuit via the ``d_head x d_head`` core ``W_O @ W_V``.

    With ``full=True``, of the full OV circuit ``W_E W_V W_O W_U`` via ``W_O W_U W_E W_V`` — the quantity
    behind the copying score (positive real eigenvalues: the head copies tokens). Scale-safe: see
    :func:`stable_eigvals`.
    """
    full = validate.boolean("ov_eigenvalues: full", full)
    with torch.no_grad():
        return _circuit(weights, "full_OV" if full else "OV", "ov_eigenvalues").eigenvalues()
