"""Each check in circuitkit.theory.checks against its closed form or a torch reference."""

from __future__ import annotations

import decimal
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from circuitkit import CircuitkitError
from circuitkit.theory import (
    attention_rank,
    dot_product_variance,
    layernorm_output_norm,
    linear_attention_gap,
    linear_attention_gd,
    linear_attention_linear,
    linear_attention_quadratic,
    permutation_equivariance_error,
    self_attention,
    sinusoidal_encoding,
    softmax_jacobian,
    softmax_saturation,
)

# float64 identities that hold exactly in real arithmetic: rounding alone, a few hundred ulps at most.
FLOAT64_TOL = 1e-12
# Monte-Carlo estimates: accept within 5 standard errors (a false failure has probability ~6e-7 per check).
MC_SIGMAS = 5.0
# tiny entries (1e-89 .. 1e-42) are products of float64 softmax weights: relative error a few ulps.
SATURATED_RTOL = 1e-13
FAST = settings(max_examples=25, deadline=None)


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _single_head(d_model: int = 6, d_k: int = 4, d_v: int = 3, seed: int = 0):
    return _randn(d_model, d_k, seed=seed), _randn(d_model, d_k, seed=seed + 1), _randn(d_model, d_v, seed=seed + 2)


# ------------------------------------------------------------------------------- permutation equivariance
@FAST
@given(seed=st.integers(0, 10_000), perm=st.permutations(range(7)))
def test_self_attention_is_permutation_equivariant(seed, perm):
    x = _randn(7, 6, seed=seed)
    assert permutation_equivariance_error(x, *_single_head(seed=seed + 1), perm) < FLOAT64_TOL


def test_causal_mask_breaks_permutation_equivariance():
    x = _randn(7, 6, seed=1)
    reverse = list(range(6, -1, -1))
    assert permutation_equivariance_error(x, *_single_head(), reverse, causal=True) > 1e-2


def test_positional_encoding_breaks_permutation_equivariance():
    """With PE added after the permutation, position 0 keeps PE[0] whichever token sits there."""
    x, pe = _randn(7, 6, seed=2), sinusoidal_encoding(7, 6)
    W = _single_head()
    reverse = torch.arange(6, -1, -1)
    out, out_perm = self_attention(x + pe, *W), self_attention(x[reverse] + pe, *W)
    assert (out_perm - out[reverse]).abs().max() > 1e-2


@pytest.mark.parametrize(
    "perm", [pytest.param([0, 1, 1], id="repeated-index"), pytest.param([0, 1], id="too-short"),
             pytest.param([0.0, 1.0, 2.0], id="float-indices")]
)
def test_permutation_must_be_a_permutation(perm):
    with pytest.raises(CircuitkitError, match="permutation"):
        permutation_equivariance_error(_randn(3, 6), *_single_head(), perm)


# ------------------------------------------------------------------------------------ variance, softmax
@pytest.mark.parametrize("d_k", [1, 8, 64])
def test_dot_product_variance_is_d_k(d_k):
    stats = dot_product_variance(d_k, n_samples=50_000, seed=d_k)
    assert stats.closed_form_variance == d_k
    assert abs(stats.variance / d_k - 1) < MC_SIGMAS * stats.relative_standard_error
    assert abs(stats.mean) < MC_SIGMAS * math.sqrt(d_k / stats.n_samples)


def test_dot_product_variance_in_small_chunks_is_still_d_k(monkeypatch):
    """Memory is bounded by drawing in chunks; 7 rows per chunk (with a remainder) still measures d_k."""
    import circuitkit.theory.checks as checks

    monkeypatch.setattr(checks, "_CHUNK_ELEMENTS", 8 * 7)
    stats = dot_product_variance(8, n_samples=20_001, seed=3)
    assert abs(stats.variance / 8 - 1) < MC_SIGMAS * stats.relative_standard_error


@pytest.mark.parametrize("d_k", [1, 8, 64])
def test_scaling_by_inverse_sqrt_d_k_gives_unit_variance(d_k):
    stats = dot_product_variance(d_k, n_samples=50_000, scaled=True, seed=100 + d_k)
    assert stats.closed_form_variance == 1.0
    assert abs(stats.variance - 1) < MC_SIGMAS * stats.relative_standard_error


def test_unscaled_softmax_tends_to_one_hot_and_scaled_softmax_does_not_depend_on_d_k():
    unscaled = [softmax_saturation(d, scaled=False, n_samples=1000, seed=d) for d in (1, 16, 256)]
    scaled = [softmax_saturation(d, scaled=True, n_samples=1000, seed=d) for d in (1, 16, 256)]
    assert unscaled[0] < unscaled[1] < unscaled[2]
    assert unscaled[2] > 0.9
    # the max weight lies in [0, 1], so its std is <= 1/2; difference of two means of 1000 samples:
    tol = MC_SIGMAS * math.sqrt(2) * 0.5 / math.sqrt(1000)
    assert abs(scaled[0] - scaled[2]) < tol


def test_softmax_jacobian_matches_autograd():
    z = _randn(6, seed=3) * 3
    autograd = torch.func.jacrev(lambda t: t.softmax(dim=0))(z)
    torch.testing.assert_close(softmax_jacobian(z), autograd, atol=FLOAT64_TOL, rtol=0)


def test_softmax_jacobian_rows_sum_to_zero_and_it_is_symmetric():
    J = softmax_jacobian(_randn(5, seed=4))
    torch.testing.assert_close(J.sum(dim=1), torch.zeros(5, dtype=torch.float64), atol=FLOAT64_TOL, rtol=0)
    torch.testing.assert_close(J, J.T, atol=0, rtol=0)


def _softmax_jacobian_decimal(z: list[float], digits: int = 80) -> list[list[float]]:
    """Oracle in 80-digit decimal arithmetic (stdlib), immune to float64 cancellation."""
    with decimal.localcontext() as ctx:
        ctx.prec = digits
        e = [decimal.Decimal(v).exp() for v in z]
        total = sum(e)
        a = [x / total for x in e]
        return [[float(a[i] * ((1 if i == j else 0) - a[j])) for j in range(len(z))] for i in range(len(z))]


def test_softmax_saturates_for_seed_003_problem_12_4():
    """z = (-3, 1, 100, 5, -1): every one of the 25 derivatives is essentially 0 (largest ~e^-95 ~ 5.5e-42)."""
    z = [-3.0, 1.0, 100.0, 5.0, -1.0]
    J = softmax_jacobian(z)
    oracle = torch.tensor(_softmax_jacobian_decimal(z), dtype=torch.float64)
    torch.testing.assert_close(J, oracle, atol=0, rtol=SATURATED_RTOL)
    assert J.abs().max() < 1e-40
    assert J[2, 2] > 0  # the dominant entry's y(1 - y), which a_i - a_i^2 would round to 0
    a = torch.tensor(z, dtype=torch.float64).softmax(dim=0)
    eps = float(a[torch.arange(5) != 2].sum())  # = 1 - a_max, computed without cancellation
    assert float(torch.linalg.matrix_norm(J)) <= 5 * eps  # seed 004's bound ||J||_F <= n eps


def test_softmax_jacobian_rejects_nan():
    with pytest.raises(CircuitkitError, match="NaN"):
        softmax_jacobian([0.0, float("nan")])


# ------------------------------------------------------------------------------------------------ rank
@pytest.mark.parametrize(
    ("n", "d_k", "d_v"),
    [pytest.param(8, 1, 8, id="d_k=1"), pytest.param(8, 3, 2, id="d_v-smallest"),
     pytest.param(4, 6, 6, id="n-smallest")],
)
def test_attention_rank_bounds(n, d_k, d_v):
    r = attention_rank(n, d_k, d_v, n_heads=3, seed=n + d_k)
    assert r.linear == r.linear_bound == min(n, d_k, d_v)  # the seed's bound, attained generically
    assert r.softmax == r.softmax_bound == min(n, d_v)
    assert r.multi_head == r.multi_head_bound == min(n, 3 * d_v)


def test_softmax_attention_rank_exceeds_d_k():
    """The seed's min(n, d_k, d_v) fails for softmax: exp of a rank-1 score matrix is full rank."""
    r = attention_rank(8, 1, 8)
    assert r.softmax == 8 > r.linear == 1


def test_multi_head_rank_limited_by_d_model():
    r = attention_rank(16, 4, 4, n_heads=4, d_model=5, seed=1)
    assert r.multi_head == r.multi_head_bound == 5


# ----------------------------------------------------------------------------- linear attention as GD
def test_linear_attention_is_one_gradient_step_with_lr_one():
    X, Y, x_test = _randn(10, 4, seed=5), _randn(10, 3, seed=6), _randn(2, 4, seed=7)
    result = linear_attention_gd(X, Y, x_test, lr=1.0)
    # oracle: autograd gradient of L(W) = 1/2 ||X W - Y||^2 at W = 0
    grad = torch.func.grad(lambda W: 0.5 * ((X @ W - Y) ** 2).sum())(torch.zeros(4, 3, dtype=torch.float64))
    torch.testing.assert_close(result.W_1, -grad, atol=FLOAT64_TOL, rtol=0)
    assert result.max_abs_diff < FLOAT64_TOL


def test_other_learning_rates_scale_the_prediction():
    X, Y, x_test = _randn(10, 4, seed=5), _randn(10, 3, seed=6), _randn(2, 4, seed=7)
    result = linear_attention_gd(X, Y, x_test, lr=0.5)
    torch.testing.assert_close(result.gd_prediction, 0.5 * result.attention_output, atol=FLOAT64_TOL, rtol=0)
    assert result.max_abs_diff > 0.1


def test_linear_attention_gd_rejects_mismatched_shapes():
    with pytest.raises(CircuitkitError, match="row count"):
        linear_attention_gd(_randn(10, 4), _randn(9, 3), _randn(2, 4))
    with pytest.raises(CircuitkitError, match="lr"):
        linear_attention_gd(_randn(10, 4), _randn(10, 3), _randn(2, 4), lr=-1.0)


# --------------------------------------------------------------------------------------- layer norm
@pytest.mark.parametrize("gamma", [1.0, 2.5, -1.5])
@pytest.mark.parametrize("d", [2, 7, 64])
def test_layernorm_output_norm_is_gamma_sqrt_d(gamma, d):
    x = _randn(5, d, seed=d) * 4 + 3
    norms = layernorm_output_norm(x, gamma=gamma, beta=0.7)
    expected = torch.full((5,), abs(gamma) * math.sqrt(d), dtype=torch.float64)
    torch.testing.assert_close(norms, expected, atol=FLOAT64_TOL * d, rtol=FLOAT64_TOL)


def test_layernorm_rejects_constant_rows():
    with pytest.raises(CircuitkitError, match="constant row"):
        layernorm_output_norm(torch.ones(2, 4))


# ---------------------------------------------------------------------------------- linear attention
@pytest.mark.parametrize("feature_map", ["elu1", "softplus", "exp"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_linear_attention_in_linear_time_equals_quadratic_form(feature_map, causal):
    q, k, v = _randn(2, 9, 4, seed=8), _randn(2, 9, 4, seed=9), _randn(2, 9, 3, seed=10)
    assert linear_attention_gap(q, k, v, feature_map=feature_map, causal=causal) < FLOAT64_TOL


def test_quadratic_linear_attention_matches_the_seed_formula_elementwise():
    """a[n, m] = g(k_m).g(q_n) / sum_m' g(k_m').g(q_n), written out with loops."""
    q, k, v = _randn(4, 3, seed=11), _randn(5, 3, seed=12), _randn(5, 2, seed=13)

    def g(t):
        return torch.nn.functional.elu(t) + 1

    expected = torch.zeros(4, 2, dtype=torch.float64)
    for n in range(4):
        sims = torch.stack([g(k[m]) @ g(q[n]) for m in range(5)])
        for m in range(5):
            expected[n] += sims[m] / sims.sum() * v[m]
    torch.testing.assert_close(linear_attention_quadratic(q, k, v), expected, atol=FLOAT64_TOL, rtol=0)


def _matmul_flops(fn, n: int) -> int:
    q, k, v = _randn(n, 8, seed=14), _randn(n, 8, seed=15), _randn(n, 4, seed=16)
    with FlopCounterMode(display=False) as counter:
        fn(q, k, v)
    return counter.get_total_flops()


def test_linear_form_costs_grow_linearly_and_quadratic_form_quadratically():
    """Counted matmul FLOPs: O(N d_k d_v) against O(N^2 (d_k + d_v)); doubling N doubles or quadruples them."""
    n = 64
    lin = [_matmul_flops(linear_attention_linear, m) for m in (n, 2 * n)]
    quad = [_matmul_flops(linear_attention_quadratic, m) for m in (n, 2 * n)]
    assert lin[1] == 2 * lin[0]
    assert quad[1] == 4 * quad[0]
    assert quad[0] == 2 * (n * n * 8 + n * n * 4)  # g(q) g(k)^T and the weighted sum of v
    assert lin[0] == 2 * (n * 8 * 4 + n * 8 * 4 + n * 8)  # g(k)^T v, g(q) S and g(q) z


def test_unknown_feature_map_is_rejected():
    with pytest.raises(CircuitkitError, match="feature_map"):
        linear_attention_gap(_randn(3, 2), _randn(3, 2), _randn(3, 2), feature_map="relu")
