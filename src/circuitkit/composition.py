"""Q-, K- and V-composition scores between every pair of heads, exact, tiled under a memory budget.

Why: which earlier heads feed which later heads (Elhage et al. 2021) is read from the composition score

    score(a, b) = ||W_A W_B||_F / (||W_A||_F ||W_B||_F)

with ``W_A = W_V^a W_O^a`` the earlier head's OV circuit and ``W_B`` the later head's circuit, in row
convention (``x @ W``): Q-composition ``W_B = W_Q^b W_K^b.T``, K-composition ``W_B = W_K^b W_Q^b.T``,
V-composition ``W_B = W_V^b W_O^b``. (The Framework paper's column convention writes the transposes;
the Frobenius norms are the same.) TransformerLens broadcasts every pair into
``[L, H, L, H, d_model, d_head]`` tensors before reducing; at GPT-2-small shape that is ~9 GB.

Maths. Write ``W_A = V O`` and ``W_B = X Y.T`` with ``V, X, Y: [d_model, d_head]`` and
``O: [d_head, d_model]``. For any ``R`` with ``R.T R = G = F.T F`` (here the Cholesky factor of the
``d_head x d_head`` Gram matrix ``G``, or its eigendecomposition where ``G`` is singular; a thin-QR ``R``
would do too), ``||F Z||_F = ||R Z||_F``. Hence

    ||V O X Y.T||_F = ||R_V (O X) R_Y.T||_F = ||O'_a X'_b.T||_F,
    O'_a = R_V^a O_a  [d_head, d_model],   X'_b = R_Y^b X_b.T  [d_head, d_model],

and ``||W_A||_F = ||O'_a||_F``, ``||W_B||_F = ||X'_b||_F``. So every score comes from ONE product
``[L*H*d_head, d_model] @ [d_model, L*H*d_head]`` of the folded factors followed by block Frobenius norms,
and nothing larger than ``d_head``-sized per head is built. The product is computed one source layer at a
time against blocks of later layers only (pairs with src layer >= dst layer are never computed), with the
block size chosen so that the working set stays under ``memory_budget`` bytes. The denominators come from
Gram matrices: ``||V O||_F^2 = sum(V.T V * O O.T)``, ``||X Y.T||_F^2 = sum(X.T X * Y.T Y)``.

Grouped-query attention: the Gram matrices and their factors of key/value weights are computed once per
key/value group and indexed per query head. For K- and V-composition, where the destination's ``X`` is the
group's ``W_K`` / ``W_V``, the large product is taken once per group (``group_size`` times fewer columns) and
each group block is then multiplied by each query head's ``d_head x d_head`` factor. The result is always
per query head.

A head whose OV circuit (or destination circuit) is exactly zero gets score 0 with every partner.

Scale. The score is homogeneous of degree zero in each of ``V, O, X, Y`` separately, so every factor matrix is
first divided by its largest absolute entry and then by its Frobenius norm (per layer and head or group). The
squared norms of the tiled product stay of order one whatever the weights' scale: scores agree to rounding for
weights scaled anywhere in 1e-8 .. 1e8 (float32 products of the raw factors would overflow at ~1e5 and lose
precision at ~1e-6). A non-finite result raises :class:`CircuitkitError`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import torch
from jaxtyping import Float
from torch import Tensor

from circuitkit import validate
from circuitkit.errors import CircuitkitError
from circuitkit.random_baseline import MODES, CompositionBaseline, Mode, check_mode, composition_baseline
from circuitkit.ranking import top_indices, unravel
from circuitkit.results import Edge as ResultEdge
from circuitkit.weights import HeadWeights, as_head_weights

__all__ = [
    "MODES",
    "CompositionBaseline",
    "Edge",
    "check_mode",
    "composition_baseline",
    "composition_scores",
    "top_edges",
]

Baseline = Literal["subtract", "zscore"]
Precision = Literal["highest", "high", "medium"]
PRECISIONS = ("highest", "high", "medium")
"""How the float32 products run, in torch's own words (``torch.set_float32_matmul_precision``): ``"highest"``
(float32, exact to rounding: the default), ``"high"`` (TF32 on GPUs that have it: 10-bit mantissa inputs, float32
sums) or ``"medium"`` (bfloat16 inputs, float32 sums). On a CPU the three are the same computation."""

ZSCORE_MIN_STD = 1e-6
"""A random baseline whose spread is below this is rounding noise, not spread: scores lie in [0, 1] and the
baseline is computed in float64, so at shapes where every random pair scores the same (``d_model == 1``, where
all circuits are scalars and every score is 1) the measured std is ~1e-16 and a z-score would be ~1e15."""


DEFAULT_MEMORY_BUDGET = 256 * 2**20
"""Bytes the tiled product's working set aims to stay under (the result tensor itself is not counted)."""


# ---------------------------------------------------------------------------------------------- factors
@dataclass(frozen=True)
class _DestinationFactors:
    """``W_B = X Y.T`` for every destination head, as ``Xt = X.T`` and the Gram ``G_Y = Y.T Y``.

    ``Xt: [layer, x_heads, d_head, d_model]`` and ``G_Y: [layer, y_heads, d_head, d_head]``, where each of
    ``x_heads`` / ``y_heads`` is either the query heads or the key/value groups (``*_grouped`` says which).
    """

    Xt: Tensor
    G_Y: Tensor
    x_grouped: bool
    y_grouped: bool


def _q_factors(w: HeadWeights) -> _DestinationFactors:
    # W_B = W_Q W_K.T: X = W_Q (per query head), Y = W_K (per group)
    return _DestinationFactors(w.W_Q.mT, _gram_cols(w.W_K), x_grouped=False, y_grouped=True)


def _k_factors(w: HeadWeights) -> _DestinationFactors:
    # W_B = W_K W_Q.T: X = W_K (per group), Y = W_Q (per query head)
    return _DestinationFactors(w.W_K.mT, _gram_cols(w.W_Q), x_grouped=True, y_grouped=False)


def _v_factors(w: HeadWeights) -> _DestinationFactors:
    # W_B = W_V W_O: X = W_V (per group), Y = W_O.T (per query head), so G_Y = W_O W_O.T
    return _DestinationFactors(w.W_V.mT, _gram_rows(w.W_O), x_grouped=True, y_grouped=False)


_DESTINATION: dict[str, Callable[[HeadWeights], _DestinationFactors]] = {
    "Q": _q_factors,
    "K": _k_factors,
    "V": _v_factors,
}


def _gram_cols(F: Float[Tensor, "*b d_model d_head"]) -> Float[Tensor, "*b d_head d_head"]:
    return F.mT @ F  # batched matmul reads the transposed view in place: no copy of F


def _gram_rows(F: Float[Tensor, "*b d_head d_model"]) -> Float[Tensor, "*b d_head d_head"]:
    return F @ F.mT


def _unit_factor(F: Float[Tensor, "*b m n"]) -> Float[Tensor, "*b m n"]:
    """``F`` divided per matrix by its largest absolute entry, then by its Frobenius norm (zero matrices stay 0).

    Two steps so that neither the norm of a huge ``F`` overflows nor that of a tiny one underflows.
    """
    scale = F.abs().amax(dim=(-2, -1), keepdim=True)
    F = F / torch.where(scale > 0, scale, torch.ones_like(scale))
    norm = torch.linalg.matrix_norm(F).unsqueeze(-1).unsqueeze(-1)
    return F / torch.where(norm > 0, norm, torch.ones_like(norm))


def _unit_heads(w: HeadWeights) -> HeadWeights:
    """``w`` with each head's (or group's) ``W_Q, W_K, W_V, W_O`` at unit Frobenius norm: scores do not change."""
    return HeadWeights(
        W_Q=_unit_factor(w.W_Q), W_K=_unit_factor(w.W_K), W_V=_unit_factor(w.W_V), W_O=_unit_factor(w.W_O)
    )


def _gram_root(G: Float[Tensor, "*b d_head d_head"]) -> Float[Tensor, "*b d_head d_head"]:
    """An ``R`` with ``R.T @ R == G`` for symmetric PSD ``G``, in float64.

    Cholesky ``G = C C.T`` gives ``R = C.T``; where ``G`` is singular (a head of rank < d_head, or
    ``d_head > d_model``) the eigendecomposition ``G = U diag(s) U.T`` gives ``R = diag(sqrt(s)) U.T``.
    """
    G64 = G.double()
    factor, info = torch.linalg.cholesky_ex(G64)
    root = factor.mT.contiguous()
    singular = info != 0
    if bool(singular.any()):
        values, vectors = torch.linalg.eigh(G64[singular])
        root[singular] = values.clamp_min(0).sqrt().unsqueeze(-1) * vectors.mT
    return root.to(G.dtype)


# ---------------------------------------------------------------------------------------------- scores
def composition_scores(
    weights: Any,
    mode: Mode,
    *,
    baseline: Baseline | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    precision: Precision = "highest",
) -> Float[Tensor, "src_layer src_head dst_layer dst_head"]:
    """Composition scores of every (earlier head, later head) pair.

    Args:
        weights: :class:`HeadWeights` or a model (TransformerBridge, toy model; read with ``from_model``).
            A 1-layer model has no pairs: its scores are all 0.
        mode: ``"Q"``, ``"K"`` or ``"V"`` composition (definitions in the module docstring, row convention).
        baseline: ``None`` for the raw scores in ``[0, 1]``; ``"subtract"`` subtracts the mean score of random
            heads of the same shapes (:func:`composition_baseline`); ``"zscore"`` also divides by their std.
            Where that std is below :data:`ZSCORE_MIN_STD` (``d_model == 1``: every random pair scores 1)
            ``"zscore"`` raises :class:`CircuitkitError` rather than dividing by rounding noise.
        memory_budget: bytes the tiled computation's working set aims to stay under. One source layer
            against one destination layer is the smallest tile, used even if it exceeds the budget.
        precision: how the float32 products run (:data:`PRECISIONS`): ``"highest"`` (default, float32);
            ``"high"`` (TF32 tensor cores, several times faster on a GPU at 70B shapes, at a measured error in
            ``benchmarks/README.md``) or ``"medium"`` (bfloat16 products). Float64 steps (the Gram roots, the
            Gram route) are unaffected.

    Returns:
        float32 ``[src_layer, src_head, dst_layer, dst_head]`` on the weights' device; exactly 0 wherever
        ``src_layer >= dst_layer`` (also with a baseline).
    """
    check_mode(mode, "composition_scores")
    if baseline is not None:
        validate.option("composition_scores: baseline", baseline, tuple(_BASELINES))
    memory_budget = validate.positive_int("composition_scores: memory_budget", memory_budget, why="bytes")
    validate.option("composition_scores: precision", precision, PRECISIONS)
    w = as_head_weights(weights, "composition_scores")
    if w.n_layers < 2:  # no pair has src layer < dst layer: all scores are 0 by definition
        return torch.zeros(w.n_layers, w.n_heads, w.n_layers, w.n_heads, device=w.device)
    with torch.no_grad(), _matmul_precision(precision):
        unit = _unit_heads(w)
        route = _gram_scores if _gram_is_cheaper(unit, mode, memory_budget) else _raw_scores
        scores = route(unit, mode, memory_budget)
        validate.finite_result("composition_scores", scores)
        if baseline is not None:
            reference = composition_baseline(w, mode)
            scores = _BASELINES[baseline](scores, reference, w)
            scores = torch.where(_pair_mask(w.n_layers, scores.device), scores, 0.0)
            validate.finite_result("composition_scores", scores, why=f"baseline={baseline!r}")
    return scores


@contextmanager
def _matmul_precision(precision: str) -> Iterator[None]:
    """torch's float32 matmul precision set to ``precision`` for the block, then put back as it was."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def _subtract(scores: Tensor, reference: CompositionBaseline, w: HeadWeights) -> Tensor:
    return scores - reference.mean


def _zscore(scores: Tensor, reference: CompositionBaseline, w: HeadWeights) -> Tensor:
    if not reference.std >= ZSCORE_MIN_STD:
        raise CircuitkitError(
            f"composition_scores: baseline='zscore' at d_model={w.d_model}, d_head={w.d_head}: random heads of "
            f"these shapes all score {reference.mean:.6g} (std {reference.std:.3g} < {ZSCORE_MIN_STD:g}), so a "
            "z-score is undefined; expected shapes whose random baseline has a spread. Use baseline='subtract' "
            "or baseline=None."
        )
    return (scores - reference.mean) / reference.std


_BASELINES: dict[str, Callable[[Tensor, CompositionBaseline, HeadWeights], Tensor]] = {
    "subtract": _subtract,
    "zscore": _zscore,
}


def _pair_mask(n_layers: int, device: torch.device) -> Tensor:
    layers = torch.arange(n_layers, device=device)
    return (layers[:, None, None, None] < layers[None, None, :, None]).expand(n_layers, 1, n_layers, 1)


def _raw_scores(w: HeadWeights, mode: str, memory_budget: int) -> Tensor:
    """Squared-norm tiles of the folded product, then the ratio. See the module docstring.

    Two layouts of the destination side:

    - per query head (Q mode, or no grouping): columns ``X'_b = R_Y^b X_b.T``, so a tile is
      ``[H*d_head, n*H*d_head]`` and each ``d_head x d_head`` block's squared norm is a score numerator;
    - per key/value group (K and V modes with ``group_size > 1``, where ``X`` is the group's ``W_K``/``W_V``):
      columns ``X_g.T``, ``group_size`` times fewer, so the large product is ``group_size`` times cheaper;
      each block ``M = O'_a X_g`` is then multiplied by the ``R_Y^b.T`` of every query head ``b`` of group ``g``
      (``d_head``-sized products) before its squared norm is taken.
    """
    L, H, d_model, d_head = w.W_Q.shape
    G, group = w.n_kv_heads, w.group_size
    dtype, device = w.dtype, w.device
    kv = w.kv_index

    # Source side (same for every mode): W_A = W_V W_O, folded to O' = R_V O per query head.
    G_V = _gram_cols(w.W_V)  # [L, G, d_head, d_head]
    R_V = _gram_root(G_V)
    src_sq_norm = (G_V[:, kv] * _gram_rows(w.W_O)).sum((-2, -1))  # [L, H]

    dest = _DESTINATION[mode](w)
    x_index = kv if dest.x_grouped and group > 1 else slice(None)
    y_index = kv if dest.y_grouped and group > 1 else slice(None)
    R_Y = _gram_root(dest.G_Y)
    dst_sq_norm = (_gram_rows(dest.Xt)[:, x_index] * dest.G_Y[:, y_index]).sum((-2, -1))  # [L, H]
    by_group = dest.x_grouped and group > 1  # then R_Y is per query head (y_index is a full slice)

    rows = H * d_head  # product rows of one source layer
    cols = (G if by_group else H) * d_head  # product columns of one destination layer

    def fold_source(layer: int) -> Tensor:  # [H*d_head, d_model]
        return (R_V[layer, kv] @ w.W_O[layer]).reshape(rows, d_model)

    def fold_destination(start: int, stop: int, out: Tensor) -> Tensor:  # [(stop-start)*cols, d_model]
        # into a preallocated buffer; Xt is only ever sliced (x_index is needed only when by_group)
        view = out[: (stop - start) * cols].view(stop - start, cols // d_head, d_head, d_model)
        if by_group:
            view.copy_(dest.Xt[start:stop])
        else:
            torch.matmul(R_Y[start:stop, y_index], dest.Xt[start:stop], out=view)
        return out[: (stop - start) * cols]

    def roots_by_group(start: int, stop: int) -> Tensor:  # [n*G, d_head, group*d_head]: R_b.T side by side
        n = stop - start
        roots = R_Y[start:stop].view(n, G, group, d_head, d_head)  # [n, G, s, k, c]
        return roots.permute(0, 1, 4, 2, 3).reshape(n * G, d_head, group * d_head)

    itemsize = dtype.itemsize
    budget = memory_budget // itemsize  # in elements
    per_layer = cols * d_model  # one destination layer of (folded) factors
    cache_all = (L - 1) * per_layer <= budget // 2
    per_dest_layer = rows * cols + (rows * rows if by_group else 0)  # product tile (+ per-head expansion)
    if cache_all:
        budget -= (L - 1) * per_layer
    else:
        per_dest_layer += per_layer
    block = max(1, min(L - 1, (budget - rows * d_model) // per_dest_layer))

    if cache_all:
        cached = fold_destination(1, L, torch.empty((L - 1) * cols, d_model, dtype=dtype, device=device))
    else:
        buffer = torch.empty(block * cols, d_model, dtype=dtype, device=device)
    tile_buffer = torch.empty(rows * block * cols, dtype=dtype, device=device)
    if by_group:
        head_buffer = torch.empty(rows * block * rows, dtype=dtype, device=device)
    sq = torch.zeros(L, H, L, H, dtype=dtype, device=device)
    for src in range(L - 1):
        left = fold_source(src)
        for start in range(src + 1, L, block):
            stop = min(start + block, L)
            n = stop - start
            if cache_all:
                right = cached[(start - 1) * cols : (stop - 1) * cols]
            else:
                right = fold_destination(start, stop, buffer)
            tile = torch.matmul(left, right.T, out=tile_buffer[: rows * n * cols].view(rows, n * cols))
            if by_group:
                blocks = tile.view(rows, n * G, d_head).transpose(0, 1)  # [n*G, H*d_head, d_head]
                out = head_buffer[: n * G * rows * group * d_head].view(n * G, rows, group * d_head)
                tile = torch.matmul(blocks, roots_by_group(start, stop), out=out)
                tile.square_()
                per_head = tile.view(n, G, H, d_head, group, d_head).sum((3, 5))  # [n, G, H_src, group]
                block_sq = per_head.permute(2, 0, 1, 3).reshape(H, n, H)
            else:
                tile.square_()
                block_sq = tile.view(H, d_head, n * H, d_head).sum((1, 3)).view(H, n, H)
            sq[src, :, start:stop, :] = block_sq
    denominator = src_sq_norm[:, :, None, None] * dst_sq_norm[None, None, :, :]
    scores = torch.where(denominator > 0, sq / denominator.where(denominator > 0, 1.0), 0.0).sqrt_()
    return scores.to(torch.float32)


# ---------------------------------------------------------------------------------------------- Gram route
def _gram_is_cheaper(w: HeadWeights, mode: str, memory_budget: int) -> bool:
    """Whether :func:`_gram_scores` costs fewer float32-equivalent flops than :func:`_raw_scores` (float64 counted
    twice) and its folded factors fit in ``memory_budget``.

    With ``N`` heads, ``P`` pairs of layers, ``d = d_model``, ``h = d_head``, the tiled product costs ``2 P (H h)^2 d``
    (K and V composition with ``G`` key/value groups: ``2 P (H h)(G h) d + 2 P H^2 h^3``) and the Gram route
    ``2 (2 N h d^2 + N^2 d^2)`` in float64. Measured on two CPU cores, as the model says: the Gram route is 1.2x
    faster for SmolLM-135M's Q composition and 1.5-2.4x for all three at Gemma-3-270M's ``d_head`` 256, and slower
    for GPT-2's shape and SmolLM's K and V; at 7B shapes its folded factors are gigabytes and the tiled product
    runs."""
    L, H, d, h = w.W_Q.shape
    N = L * H
    pairs = L * (L - 1) / 2
    if mode != "Q" and w.group_size > 1:  # the destination's X is the group's: fewer columns, then per head
        direct = pairs * 2 * (H * h) * (w.n_kv_heads * h) * d + pairs * 2 * H * H * h**3
    else:
        direct = pairs * 2 * (H * h) ** 2 * d
    gram = 2 * 2 * (2 * N * h * d * d + N * N * d * d)
    folded = 8 * 2 * N * (h + 1) * d  # the two sides' folded factors and one row of each side's Gram matrices
    return gram < direct and folded <= memory_budget


def _gram_scores(w: HeadWeights, mode: str, memory_budget: int) -> Tensor:
    """The scores from ``d_model x d_model`` Gram matrices, in float64 (see :func:`_gram_is_cheaper` for when).

    With the folded factors ``O'_a = R_V O_a`` (source head ``a``) and ``X'_b = R_Y X_b.T`` (destination head
    ``b``; module docstring), ``P_a = O'_a.T O'_a`` and ``S_b = X'_b.T X'_b`` (``[d_model, d_model]``, symmetric)::

        ||O'_a X'_b.T||_F^2 = <P_a, S_b>_F,   ||W_A||_F^2 = ||O'_a||_F^2,   ||W_B||_F^2 = ||X'_b||_F^2,

    so all numerators are one product ``[heads, T] @ [T, heads]`` of the Gram matrices' upper triangles (``T =
    d_model (d_model + 1) / 2``, off-diagonal entries counted twice), every head against every head at once (the
    product's rows are all heads, so it runs at the machine's compute speed; pairs whose source layer is not before
    the destination's are computed and dropped). It is taken in blocks of rows of the Gram matrices, built as they
    are needed under ``memory_budget`` bytes. Float64 throughout: an inner product of two positive semi-definite
    matrices can cancel to far below its terms (heads in orthogonal subspaces score 0), where float32 rounding would
    show as scores of ~1e-4."""
    L, H, d_model, d_head = w.W_Q.shape
    N = L * H
    kv = w.kv_index
    f64 = torch.float64
    R_V = _gram_root(_gram_cols(w.W_V.to(f64)))  # [L, G, h, h]
    source = (R_V[:, kv] @ w.W_O.to(f64)).reshape(N, d_head, d_model)
    dest = _DESTINATION[mode](w)
    x_index = kv if dest.x_grouped and w.group_size > 1 else slice(None)
    y_index = kv if dest.y_grouped and w.group_size > 1 else slice(None)
    R_Y = _gram_root(dest.G_Y.to(f64))
    destination = (R_Y[:, y_index] @ dest.Xt.to(f64)[:, x_index]).reshape(N, d_head, d_model)
    source_sq = source.square().sum((-2, -1))
    destination_sq = destination.square().sum((-2, -1))

    spare = max(0, memory_budget - 8 * 2 * N * d_head * d_model)
    block = max(1, min(d_model, spare // (8 * 2 * N * d_model)))  # rows of P and S per step
    sq = torch.zeros(N, N, dtype=f64, device=w.device)
    for first in range(0, d_model, block):
        last = min(first + block, d_model)
        # rows first..last-1, columns first..d_model-1 of every P_a and S_b: the upper triangle, a block of rows at a
        # time; in the diagonal block the entries below it are weighted 0, the diagonal 1, the ones above it 2.
        P = source[:, :, first:last].mT @ source[:, :, first:]  # [N, rows, columns]
        S = destination[:, :, first:last].mT @ destination[:, :, first:]
        row = torch.arange(first, last, device=w.device)[:, None]
        column = torch.arange(first, d_model, device=w.device)[None, :]
        P.mul_(torch.where(column > row, 2.0, torch.where(column == row, 1.0, 0.0)).to(f64))
        sq += P.reshape(N, -1) @ S.reshape(N, -1).T
        del P, S
    denominator = source_sq[:, None] * destination_sq[None, :]
    scores = torch.where(denominator > 0, sq.clamp_min(0) / denominator.where(denominator > 0, 1.0), 0.0).sqrt_()
    scores = scores.view(L, H, L, H)
    return torch.where(_pair_mask(L, w.device), scores, 0.0).to(torch.float32)


# ---------------------------------------------------------------------------------------------- edges
class Edge(ResultEdge):
    """One composition edge: head ``src = (layer, head)`` feeds head ``dst`` with ``score``; an
    :class:`~circuitkit.results.Edge` holding the value ``"composition"`` and no channel (the mode's list it is
    in says which composition)."""

    def __init__(self, src: tuple[int, int], dst: tuple[int, int], score: float) -> None:
        super().__init__(tuple(src), tuple(dst), None, (("composition", score),))

    @property
    def score(self) -> float:
        """The composition score."""
        return self.values[0][1]

    def __repr__(self) -> str:
        return f"Edge(src={self.src!r}, dst={self.dst!r}, score={self.score!r})"


def top_edges(scores: Float[Tensor, "src_layer src_head dst_layer dst_head"], k: int = 10) -> list[Edge]:
    """The ``k`` highest-scoring pairs with ``src_layer < dst_layer``, strongest first.

    ``scores`` is the output of :func:`composition_scores` (raw or baseline-corrected). Ties keep
    ``(src_layer, src_head, dst_layer, dst_head)`` order. Fewer than ``k`` edges are returned if the model
    has fewer pairs.
    """
    scores = validate.tensor("top_edges: scores", scores, ndim=4, floating=True, finite=True)
    if scores.shape[0] != scores.shape[2] or scores.shape[1] != scores.shape[3]:
        raise validate.fail(
            "top_edges: scores",
            scores,
            "a [src_layer, src_head, dst_layer, dst_head] tensor from composition_scores (layer and head axes paired)",
        )
    k = validate.positive_int("top_edges: k", k)
    L, H = scores.shape[0], scores.shape[1]
    mask = _pair_mask(L, scores.device).expand(L, H, L, H).reshape(-1)
    flat_index = mask.nonzero().squeeze(1)
    values = scores.detach().reshape(-1)[flat_index].double().cpu()
    edges = []
    for position, _ in top_indices(values, k) if len(values) else []:
        index = int(flat_index[position])
        src_layer, src_head, dst_layer, dst_head = unravel(index, (L, H, L, H))
        edges.append(Edge((src_layer, src_head), (dst_layer, dst_head), float(values[position])))
    return edges
