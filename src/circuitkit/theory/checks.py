"""The seed exercises' claims about attention, each as a function that returns the measured quantity.

Each function measures; the tests compare the measurement with the closed form or a torch reference at a
named tolerance. Everything runs in float64 on CPU unless the inputs say otherwise, with no gradients.

- ``permutation_equivariance_error``: Attn(P X) = P Attn(X) without positions or masks
  (000 ex. 1.1, 002 ex. 13.2, 003 problem 12.3).
- ``dot_product_variance``: Var(q.k) = d_k, and Var(q.k / sqrt(d_k)) = 1 (000 ex. 1.2, 002 ex. 13.3, 004 part 1a).
- ``softmax_saturation``: unscaled softmax tends to one-hot as d_k grows (002 ex. 13.28, 004 part 1a).
- ``softmax_jacobian``: d softmax(z)/dz = diag(a) - a a^T, ~0 when one input dominates (003 problem 12.4).
- ``attention_rank``: rank(Z) <= min(n, d_k, d_v), with the caveat in its docstring (000 ex. 1.3).
- ``linear_attention_gd``: (x K^T) V equals one GD step from W = 0 with lr = 1 (000 ex. 1.4).
- ``sinusoidal_offset_error``: PE[pos + k] = PE[pos] M_k (000 ex. 1.6, 002 ex. 13.26).
- ``rope_offset_error``: <R_m q, R_n k> depends only on n - m (002 ex. 13.16, 13.27).
- ``layernorm_output_norm``: ||LN(x) - beta 1|| = |gamma| sqrt(d) (004 part 3b).
- ``linear_attention_gap``: kernelised attention in O(N) equals the O(N^2) form (003 problem 12.10).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from circuitkit import validate
from circuitkit.errors import CircuitkitError
from circuitkit.theory._validate import (
    MAX_SAMPLES,
    MAX_SIZE,
    float_tensor,
    positive_real,
    promoted,
    same,
    size,
)
from circuitkit.theory.attention import (
    FeatureMap,
    linear_attention_linear,
    linear_attention_quadratic,
    sdpa_torch,
)
from circuitkit.theory.encodings import rope, sinusoidal_encoding, sinusoidal_offset_map

__all__ = [
    "self_attention",
    "permutation_equivariance_error",
    "DotProductStats",
    "dot_product_variance",
    "softmax_saturation",
    "softmax_jacobian",
    "AttentionRank",
    "attention_rank",
    "LinearAttentionGD",
    "linear_attention_gd",
    "sinusoidal_offset_error",
    "rope_score",
    "rope_offset_error",
    "layernorm_output_norm",
    "linear_attention_gap",
]


_CHUNK_ELEMENTS = 2**21  # 16 MiB of float64 per drawn tensor, whatever n_samples is


def _chunks(n_rows: int, row_size: int) -> list[int]:
    """Row counts that split ``n_rows`` rows of ``row_size`` numbers into bounded-memory chunks."""
    step = max(1, _CHUNK_ELEMENTS // row_size)
    return [min(step, n_rows - start) for start in range(0, n_rows, step)]


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(validate.seed("seed", seed))


def _samples(name: str, value: int, *, minimum: int = 1) -> int:
    return validate.integer(name, value, minimum=minimum, maximum=MAX_SAMPLES, why="Monte-Carlo samples")


# ------------------------------------------------------------------------------------- equivariance
def self_attention(
    x: Float[Tensor, "*batch n d_model"],
    W_Q: Float[Tensor, "d_model d_k"],
    W_K: Float[Tensor, "d_model d_k"],
    W_V: Float[Tensor, "d_model d_v"],
    *,
    causal: bool = False,
) -> Float[Tensor, "*batch n d_v"]:
    """Single-head self-attention ``softmax(x W_Q (x W_K)^T / sqrt(d_k)) x W_V`` (row vectors).

    Inputs of different floating dtypes are computed in their common dtype (float16 with float32: float32).
    """
    float_tensor("x", x, ndim_min=2)
    for name, w in (("W_Q", W_Q), ("W_K", W_K), ("W_V", W_V)):
        float_tensor(name, w, ndim=2)
        same("x", x.shape[-1], name, w.shape[0], "d_model (x's last axis vs the weight's first)")
    same("W_Q", W_Q.shape[1], "W_K", W_K.shape[1], "d_k")
    x, W_Q, W_K, W_V = promoted(x=x, W_Q=W_Q, W_K=W_K, W_V=W_V)
    return sdpa_torch(x @ W_Q, x @ W_K, x @ W_V, causal=causal)


def permutation_equivariance_error(
    x: Float[Tensor, "n d_model"],
    W_Q: Float[Tensor, "d_model d_k"],
    W_K: Float[Tensor, "d_model d_k"],
    W_V: Float[Tensor, "d_model d_v"],
    perm: Sequence[int] | Tensor,
    *,
    causal: bool = False,
) -> float:
    """``max |Attn(P x) - P Attn(x)|`` for the row permutation ``perm`` (``(P x)[i] = x[perm[i]]``).

    0 up to rounding for plain self-attention (the pattern becomes ``A[perm][:, perm]``); a causal mask
    (or positional information) breaks the symmetry, and then the error is of the order of the outputs.
    """
    float_tensor("x", x, ndim=2)
    n = x.shape[0]
    expected = f"a permutation of 0..{n - 1} (one index per row of x)"
    if isinstance(perm, Tensor):
        p = validate.tensor("perm", perm, ndim=1, integral=True)
    elif isinstance(perm, (str, bytes)) or not isinstance(perm, Sequence):
        raise validate.fail("perm", perm, expected)
    else:
        p = torch.tensor([
            validate.integer(f"perm[{j}]", i, minimum=0, maximum=max(n - 1, 0), why=f"an index of {expected}")
            for j, i in enumerate(perm)
        ], dtype=torch.long)
    if p.shape != (n,) or not torch.equal(p.sort().values.cpu(), torch.arange(n)):
        raise validate.fail("perm", perm, expected)
    p = p.long()
    with torch.no_grad():
        out = self_attention(x, W_Q, W_K, W_V, causal=causal)
        out_perm = self_attention(x[p], W_Q, W_K, W_V, causal=causal)
    return float((out_perm - out[p]).abs().max())


# --------------------------------------------------------------------------------- variance, softmax
@dataclass(frozen=True)
class DotProductStats:
    """Sample mean and variance of ``q . k`` (times ``1/sqrt(d_k)`` if scaled) over ``n_samples`` pairs with
    i.i.d. N(0, 1) entries; the closed forms are mean 0 and variance ``d_k`` (unscaled) or 1 (scaled)."""

    d_k: int
    scaled: bool
    n_samples: int
    mean: float
    variance: float

    @property
    def closed_form_variance(self) -> float:
        return 1.0 if self.scaled else float(self.d_k)

    @property
    def relative_standard_error(self) -> float:
        """Standard error of ``variance / closed_form``: ``sqrt((2 + 6/d_k) / n)``.

        ``s = q.k`` is a sum of ``d_k`` products with variance 1 and fourth moment 9, so
        ``E s^4 = 3 d_k^2 + 6 d_k`` and ``Var(s^2) = 2 d_k^2 + 6 d_k``.
        """
        return math.sqrt((2.0 + 6.0 / self.d_k) / self.n_samples)


def dot_product_variance(
    d_k: int, *, n_samples: int = 100_000, scaled: bool = False, seed: int = 0
) -> DotProductStats:
    """Measure the mean and variance of ``q . k`` (seed 000 ex. 1.2, 004 part 1a).

    ``d_k`` is an int in ``[1, MAX_SIZE]``, ``n_samples`` in ``[2, MAX_SAMPLES]``, ``scaled`` a bool."""
    d_k = size("d_k", d_k)
    n_samples = _samples("n_samples", n_samples, minimum=2)
    scaled = validate.boolean("scaled", scaled)
    g = _generator(seed)
    total = total_sq = 0.0
    for rows in _chunks(n_samples, d_k):
        q = torch.randn(rows, d_k, generator=g, dtype=torch.float64)
        k = torch.randn(rows, d_k, generator=g, dtype=torch.float64)
        s = (q * k).sum(dim=-1)
        if scaled:
            s = s / math.sqrt(d_k)
        total += float(s.sum())
        total_sq += float((s * s).sum())
    mean = total / n_samples
    variance = (total_sq - n_samples * mean * mean) / (n_samples - 1)  # mean ~ 0: no harmful cancellation
    return DotProductStats(d_k, scaled, n_samples, mean, variance)


def softmax_saturation(
    d_k: int, *, n_keys: int = 16, n_samples: int = 2000, scaled: bool = False, seed: int = 0
) -> float:
    """Mean over queries of the largest attention weight ``max_j softmax(q.k_j [/ sqrt d_k])``.

    Unscaled, the scores have standard deviation ``sqrt(d_k)`` and the softmax tends to one-hot (the value
    tends to 1, seed 002 ex. 13.28); scaled, the scores are N(0, 1) for every ``d_k`` and the value does not
    depend on ``d_k``. ``d_k`` and ``n_keys`` are ints up to ``MAX_SIZE``, ``n_samples`` up to ``MAX_SAMPLES``.
    """
    d_k = size("d_k", d_k)
    n_keys = size("n_keys", n_keys, minimum=2)
    n_samples = _samples("n_samples", n_samples)
    scaled = validate.boolean("scaled", scaled)
    g = _generator(seed)
    total = 0.0
    for rows in _chunks(n_samples, n_keys * d_k):
        q = torch.randn(rows, 1, d_k, generator=g, dtype=torch.float64)
        k = torch.randn(rows, n_keys, d_k, generator=g, dtype=torch.float64)
        scores = (q * k).sum(dim=-1)
        if scaled:
            scores = scores / math.sqrt(d_k)
        total += float(scores.softmax(dim=-1).max(dim=-1).values.sum())
    return total / n_samples


def softmax_jacobian(z: Float[Tensor, " n"] | Sequence[float]) -> Float[Tensor, "n n"]:
    """``J[i, j] = d softmax_i(z) / d z_j = a_i (delta_ij - a_j)``, i.e. ``diag(a) - a a^T`` (float64).

    For ``z = (-3, 1, 100, 5, -1)`` (seed 003 problem 12.4) every entry is below 1e-40: one input dominates,
    the softmax saturates and passes back (almost) no gradient. ``||J||_F <= n * eps`` when the largest weight
    is ``> 1 - eps`` (seed 004 part 1a). The diagonal uses ``a_i * sum_{j != i} a_j`` so the saturated entry
    stays accurate (``a_i - a_i^2`` and autograd both round it to 0). A tensor ``z`` must be floating; a
    sequence of numbers is read as float64.
    """
    if isinstance(z, Tensor):
        z = float_tensor("z", z, ndim=1).to(torch.float64)
    else:
        z = validate.tensor("z", z, ndim=1, convert=True)
        if z.is_complex() or z.dtype == torch.bool:
            raise validate.fail("z", z, "real numbers")
        z = float_tensor("z", z.to(torch.float64), ndim=1)
    a = z.softmax(dim=0)
    off_diagonal = ~torch.eye(len(a), dtype=torch.bool)
    # 1 - a_i as the sum of the other weights: no cancellation when a_i rounds to 1 (the saturated case)
    one_minus_a = (a[None, :] * off_diagonal).sum(dim=1)
    return torch.where(off_diagonal, -torch.outer(a, a), torch.diag(a * one_minus_a))


# ------------------------------------------------------------------------------------------------ rank
@dataclass(frozen=True)
class AttentionRank:
    """Measured ranks of attention outputs and their bounds.

    - ``softmax``: rank of ``softmax(Q K^T / sqrt d_k) V``; bound ``min(n, d_v)``. The seed's
      ``min(n, d_k, d_v)`` does **not** hold here: ``exp`` of a rank-``d_k`` score matrix is generically full
      rank (``exp(a_i b_j)`` is a generalised Vandermonde matrix even for ``d_k = 1``).
    - ``linear``: rank of the unnormalised ``(Q K^T) V``; bound ``min(n, d_k, d_v)``, the seed's claim.
    - ``multi_head``: rank of ``concat_h(Z_h) W_O`` with ``n_heads`` softmax heads; bound
      ``min(n, n_heads d_v, d_model)``.
    """

    softmax: int
    linear: int
    multi_head: int
    softmax_bound: int
    linear_bound: int
    multi_head_bound: int


def attention_rank(
    n: int, d_k: int, d_v: int, *, n_heads: int = 4, d_model: int | None = None, seed: int = 0
) -> AttentionRank:
    """Ranks of random attention outputs with ``n`` tokens (seed 000 ex. 1.3), via ``torch.linalg.matrix_rank``.

    Every size is an int in ``[1, MAX_SIZE]`` (``n_heads * d_v`` too)."""
    n, d_k, d_v, n_heads = (size(k, v) for k, v in (("n", n), ("d_k", d_k), ("d_v", d_v), ("n_heads", n_heads)))
    if n_heads * d_v > MAX_SIZE:
        raise validate.fail("n_heads * d_v", n_heads * d_v, f"at most MAX_SIZE = {MAX_SIZE} concatenated dims")
    d_model = n_heads * d_v if d_model is None else size("d_model", d_model)
    g = _generator(seed)

    def randn(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    Q, K, V = randn(n, d_k), randn(n, d_k), randn(n, d_v)
    z_softmax = sdpa_torch(Q, K, V)
    z_linear = (Q @ K.T) @ V
    Qh, Kh, Vh = randn(n_heads, n, d_k), randn(n_heads, n, d_k), randn(n_heads, n, d_v)
    z_heads = sdpa_torch(Qh, Kh, Vh).transpose(0, 1).reshape(n, n_heads * d_v)  # concat over heads
    z_multi = z_heads @ randn(n_heads * d_v, d_model)

    def rank(m: Tensor) -> int:
        return int(torch.linalg.matrix_rank(m))

    return AttentionRank(
        softmax=rank(z_softmax),
        linear=rank(z_linear),
        multi_head=rank(z_multi),
        softmax_bound=min(n, d_v),
        linear_bound=min(n, d_k, d_v),
        multi_head_bound=min(n, n_heads * d_v, d_model),
    )


# ----------------------------------------------------------------------------- linear attention as GD
@dataclass(frozen=True)
class LinearAttentionGD:
    """Linear attention ``(x_test X^T) Y`` next to the prediction ``x_test W_1`` after one gradient-descent step
    ``W_1 = W_0 - lr X^T (X W_0 - Y)`` from ``W_0 = 0`` on ``L(W) = 1/2 ||X W - Y||^2``.

    ``W_1 = lr X^T Y``, so ``gd_prediction = lr * attention_output``: they agree exactly when ``lr = 1``.
    """

    attention_output: Float[Tensor, "n_test d_out"]
    gd_prediction: Float[Tensor, "n_test d_out"]
    W_1: Float[Tensor, "d_in d_out"]

    @property
    def max_abs_diff(self) -> float:
        return float((self.attention_output - self.gd_prediction).abs().max())


def linear_attention_gd(
    X: Float[Tensor, "n d_in"],
    Y: Float[Tensor, "n d_out"],
    x_test: Float[Tensor, "n_test d_in"],
    *,
    lr: float = 1.0,
) -> LinearAttentionGD:
    """One step of gradient descent on least squares as linear attention with ``Q = x_test, K = X, V = Y``
    (seed 000 ex. 1.4). Inputs of different floating dtypes are computed in their common dtype."""
    for name, t in (("X", X), ("Y", Y), ("x_test", x_test)):
        float_tensor(name, t, ndim=2)
    same("X", X.shape[0], "Y", Y.shape[0], "row count n")
    same("X", X.shape[1], "x_test", x_test.shape[1], "feature count d_in")
    lr = positive_real("lr", lr)
    X, Y, x_test = promoted(X=X, Y=Y, x_test=x_test)
    with torch.no_grad():
        W_0 = X.new_zeros(X.shape[1], Y.shape[1])
        grad = X.T @ (X @ W_0 - Y)  # dL/dW of 1/2 ||X W - Y||_F^2
        W_1 = W_0 - lr * grad
        why = f"X, Y, x_test or lr too large for {X.dtype}"
        return LinearAttentionGD(validate.finite_result("linear_attention_gd: attention_output", (x_test @ X.T) @ Y,
                                                        why=why),
                                 validate.finite_result("linear_attention_gd: gd_prediction", x_test @ W_1, why=why),
                                 validate.finite_result("linear_attention_gd: W_1", W_1, why=why))


# ------------------------------------------------------------------------------------------ positions
def sinusoidal_offset_error(n_pos: int, d_model: int, offset: int, *, base: float = 10000.0) -> float:
    """``max_pos |PE[pos + k] - PE[pos] @ M_k|`` over ``pos = 0 .. n_pos - 1``, one ``M_k`` for all positions.

    ``n_pos``, ``offset`` and ``n_pos + offset`` (the rows of the table built) are at most ``MAX_SIZE``."""
    n_pos = size("n_pos", n_pos)
    offset = size("offset", offset, minimum=0)
    if n_pos + offset > MAX_SIZE:
        raise validate.fail("n_pos + offset", n_pos + offset, f"at most MAX_SIZE = {MAX_SIZE} positions")
    pe = sinusoidal_encoding(n_pos + offset, d_model, base=base)
    M = sinusoidal_offset_map(offset, d_model, base=base)
    return float((pe[offset:] - pe[:n_pos] @ M).abs().max())


def rope_score(
    q: Float[Tensor, " d"], k: Float[Tensor, " d"], m: float, n: float, *, base: float = 10000.0
) -> float:
    """``<R_m q, R_n k>``: the attention score of a query at position ``m`` and a key at position ``n``
    (finite real numbers)."""
    m = validate.real("m", m)
    n = validate.real("n", n)
    float_tensor("q", q, ndim=1)
    float_tensor("k", k, ndim=1)
    same("q", q.shape[0], "k", k.shape[0], "size")
    rq = rope(q[None].to(torch.float64), [m], base=base)[0]
    rk = rope(k[None].to(torch.float64), [n], base=base)[0]
    return float(rq @ rk)


def rope_offset_error(
    q: Float[Tensor, " d"], k: Float[Tensor, " d"], m: float, n: float, shift: float, *, base: float = 10000.0
) -> float:
    """``|<R_m q, R_n k> - <R_{m+s} q, R_{n+s} k>|``: 0 up to rounding, since the score depends on ``n - m``."""
    m, n, shift = (validate.real(name, value) for name, value in (("m", m), ("n", n), ("shift", shift)))
    return abs(rope_score(q, k, m, n, base=base) - rope_score(q, k, m + shift, n + shift, base=base))


# --------------------------------------------------------------------------------------- layer norm
def layernorm_output_norm(
    x: Float[Tensor, "*batch d"], gamma: float = 1.0, beta: float = 0.0
) -> Float[Tensor, "*batch"]:
    """``||y - beta 1||_2`` per row, ``y = gamma (x - mu) / sigma + beta`` with eps = 0 (seed 004 part 3b).

    Computed with ``torch.nn.functional.layer_norm``; the closed form is ``|gamma| sqrt(d)``. A constant row
    has ``sigma = 0`` and is rejected.
    """
    float_tensor("x", x, ndim_min=1)
    gamma, beta = (validate.real(name, val) for name, val in (("gamma", gamma), ("beta", beta)))
    xd = x.to(torch.float64)
    # layer norm with eps = 0 is invariant to a row's scale: each row divided by its largest |entry| first, so rows
    # of 1e160 (whose variance overflows float64) and of 1e-300 (whose variance underflows) give the exact result
    top = xd.abs().amax(dim=-1, keepdim=True)
    xd = xd / torch.where(top > 0, top, 1.0)
    if bool((xd.std(dim=-1, unbiased=False) == 0).any()):
        raise CircuitkitError("x has a constant row (standard deviation 0); expected rows with some spread.")
    d = x.shape[-1]
    weight = torch.full((d,), gamma, dtype=torch.float64)
    bias = torch.full((d,), beta, dtype=torch.float64)
    y = F.layer_norm(xd, (d,), weight, bias, eps=0.0)
    return validate.finite_result("layernorm_output_norm", torch.linalg.vector_norm(y - beta, dim=-1),
                                  why="|gamma| sqrt(d) is beyond float64")


def linear_attention_gap(
    q: Float[Tensor, "*batch n d_k"],
    k: Float[Tensor, "*batch n d_k"],
    v: Float[Tensor, "*batch n d_v"],
    *,
    feature_map: FeatureMap = "elu1",
    causal: bool = False,
) -> float:
    """``max |O(N^2) form - O(N) form|`` of kernelised attention (seed 003 problem 12.10)."""
    with torch.no_grad():
        a = linear_attention_quadratic(q, k, v, feature_map=feature_map, causal=causal)
        b = linear_attention_linear(q, k, v, feature_map=feature_map, causal=causal)
    return float((a - b).abs().max())
