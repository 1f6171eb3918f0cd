"""Numerical safety of the spectra and composition scores: huge, tiny, half-precision and oddly strided weights
give finite answers that agree with a float64 dense oracle; bad arguments raise CircuitkitError."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import circuitkit as ck
from circuitkit import CircuitkitError, HeadWeights
from circuitkit.composition import ZSCORE_MIN_STD, composition_scores
from circuitkit.factored import effective_rank, numerical_rank, ov_eigenvalues, singular_values, stable_eigvals
from tests.conftest import random_weights

SPECTRUM_RTOL = 1e-4
"""float32 QR of unit-scale factors then float64 core: relative error ~ d_model * 2**-24, well under 1e-4."""
SCALE_INVARIANCE_ATOL = 1e-5
"""The brief's bound for composition scores of weights scaled by c: normalising a scaled factor differs by an ulp."""

SCALES = [1e-30, 1e-8, 1e10, 1e30]


def _scaled(weights: HeadWeights, c: float, dtype=torch.float32) -> HeadWeights:
    """Every tensor of ``weights`` times ``c`` (computed in float64, then cast: finite for c up to 1e30)."""
    return HeadWeights(**{name: (t.double() * c).to(dtype) for name, t in weights.tensors().items()})


def _dense_oracle_sigma(w: HeadWeights, circuit: str) -> torch.Tensor:
    """Singular values of the dense d_model x d_model circuits in float64 (the independent oracle)."""
    w = w.double()
    dense = w.W_Q @ w.W_K.mT if circuit == "QK" else w.W_V @ w.W_O
    return torch.linalg.svdvals(dense)[..., : w.d_head]


@pytest.mark.parametrize("scale", SCALES, ids=lambda c: f"x{c:g}")
@pytest.mark.parametrize("circuit", ["QK", "OV"])
def test_singular_values_at_extreme_scales_match_the_dense_oracle(scale, circuit):
    base = random_weights(2, 3, 16, 4, seed=11)
    w = _scaled(base, scale)
    sigma = singular_values(w, circuit)
    assert sigma.shape == (2, 3, 4) and bool(torch.isfinite(sigma).all())
    expected = _dense_oracle_sigma(base, circuit) * scale**2  # two factors, each scaled by c
    torch.testing.assert_close(sigma.double(), expected, rtol=SPECTRUM_RTOL, atol=0)
    # float32 holds ~1e-38 .. 3e38: the x1e30 (1e60) and x1e-30 (1e-60) circuits come back in float64
    outside = expected.max() > torch.finfo(torch.float32).max or expected.min() < torch.finfo(torch.float32).tiny
    assert sigma.dtype == (torch.float64 if outside else torch.float32)
    torch.testing.assert_close(effective_rank(w, circuit), effective_rank(base, circuit), rtol=1e-4, atol=1e-4)
    assert numerical_rank(w, circuit).tolist() == numerical_rank(base, circuit).tolist()


@pytest.mark.parametrize("scale", SCALES, ids=lambda c: f"x{c:g}")
def test_full_ov_eigenvalues_at_extreme_scales(scale):
    base = random_weights(2, 3, 16, 4, d_vocab=12, seed=12)
    w = _scaled(base, scale)
    values = ov_eigenvalues(w, full=True)
    assert values.shape == (2, 3, 4) and bool(torch.isfinite(values).all())
    # oracle: eigenvalues of the d_head core W_O W_U W_E W_V in float64, times c**4 (four factors)
    b = base.double()
    core = b.W_O @ (b.W_U @ b.W_E) @ b.W_V
    expected = torch.linalg.eigvals(core) * scale**4
    ours = values.to(torch.complex128)
    for got, want in zip(ours.reshape(-1, 4), expected.reshape(-1, 4), strict=True):
        # match each expected eigenvalue to the nearest computed one (order is not part of the contract)
        distance = (got[:, None] - want[None, :]).abs().amin(0)
        assert bool((distance <= SPECTRUM_RTOL * want.abs().max()).all())


def test_stable_eigvals_matches_eigvals_and_survives_huge_matrices():
    g = torch.Generator().manual_seed(3)
    m = torch.randn(5, 6, 6, generator=g, dtype=torch.float64)
    torch.testing.assert_close(stable_eigvals(m).abs().sort().values, torch.linalg.eigvals(m).abs().sort().values)
    for scale in (1e30, 1e-30):
        big = (m * scale).float()
        values = stable_eigvals(big)
        assert values.shape == (5, 6) and bool(torch.isfinite(values).all())
        torch.testing.assert_close(
            (values.to(torch.complex128) / scale).abs().sort().values,
            torch.linalg.eigvals(m).abs().sort().values,
            rtol=SPECTRUM_RTOL,
            atol=0,
        )
    assert stable_eigvals(torch.zeros(2, 3, 3)).abs().max() == 0


@pytest.mark.parametrize(
    "bad, match",
    [
        (torch.tensor([[1.0, float("nan")], [0.0, 1.0]]), "my_matrix: .*NaN or infinite"),
        (torch.tensor([[1.0, float("inf")], [0.0, 1.0]]), "my_matrix: .*NaN or infinite"),
        (torch.ones(2, 3), "square matrices"),
        (torch.ones(3), "square matrices"),
        (torch.ones(2, 2, dtype=torch.int64), "floating-point"),
        (torch.ones(2, 2, dtype=torch.complex64), "floating-point"),
        ([[1.0, 0.0], [0.0, 1.0]], "torch.Tensor"),
    ],
    ids=["nan", "inf", "not-square", "vector", "int", "complex", "list"],
)
def test_stable_eigvals_rejects_bad_input(bad, match):
    with pytest.raises(CircuitkitError, match=match):
        stable_eigvals(bad, name="my_matrix")


@pytest.mark.parametrize(
    "call",
    [
        lambda w: singular_values(w, ["QK"]),
        lambda w: singular_values(w, None),
        lambda w: numerical_rank(w, rtol=float("nan")),
        lambda w: numerical_rank(w, rtol=-1.0),
        lambda w: numerical_rank(w, rtol="0.1"),
        lambda w: ov_eigenvalues(w, full="yes"),
        lambda w: singular_values(torch.zeros(1, 1, 4, 4)),
        lambda w: singular_values(None),
        lambda w: ov_eigenvalues(w, full=True),  # no W_E / W_U
    ],
    ids=["circuit-list", "circuit-none", "rtol-nan", "rtol-negative", "rtol-str", "full-str", "tensor", "none",
         "full-without-embeddings"],
)
def test_spectrum_functions_reject_bad_arguments(call):
    with pytest.raises(CircuitkitError):
        call(random_weights(1, 2, 8, 2))


# ---------------------------------------------------------------------------------------------- composition
@settings(max_examples=25, deadline=None)
@given(log_scale=st.floats(min_value=-8, max_value=8), mode=st.sampled_from(["Q", "K", "V"]))
def test_composition_scores_are_scale_free(log_scale, mode):
    base = random_weights(3, 2, 8, 4, n_kv_heads=1, seed=21)
    reference = composition_scores(base, mode)
    scores = composition_scores(_scaled(base, 10.0**log_scale), mode)
    assert bool(torch.isfinite(scores).all())
    torch.testing.assert_close(scores, reference, atol=SCALE_INVARIANCE_ATOL, rtol=0)


@pytest.mark.parametrize("scale", [1e-30, 1e-8, 1e5, 1e8, 1e30], ids=lambda c: f"x{c:g}")
def test_composition_scores_scale_each_factor_separately(scale):
    """Scaling one factor of one head (here W_O of every head) leaves every score unchanged."""
    base = random_weights(2, 3, 16, 4, seed=22)
    tensors = base.tensors()
    tensors["W_O"] = (tensors["W_O"].double() * scale).float()
    for mode in "QKV":
        torch.testing.assert_close(
            composition_scores(HeadWeights(**tensors), mode), composition_scores(base, mode),
            atol=SCALE_INVARIANCE_ATOL, rtol=0,
        )


def test_zscore_refuses_a_degenerate_baseline_and_subtract_still_works():
    # d_model = 1: every circuit is a scalar, so every random pair scores exactly 1 (std ~ 1e-16)
    w = random_weights(2, 2, 1, 1, seed=23)
    assert ck.composition_baseline(w, "Q").std < ZSCORE_MIN_STD
    with pytest.raises(CircuitkitError, match=r"zscore.*d_model=1.*baseline='subtract'"):
        composition_scores(w, "Q", baseline="zscore")
    subtracted = composition_scores(w, "Q", baseline="subtract")
    assert bool(torch.isfinite(subtracted).all())
    assert subtracted.abs().max() < 1e-6  # every real pair also scores 1


# ---------------------------------------------------------------------------------------------- edge cases
def _cast(weights: HeadWeights, dtype: torch.dtype) -> HeadWeights:
    return HeadWeights(**{name: t.to(dtype) for name, t in weights.tensors().items()})


def _edge_cases() -> dict[str, HeadWeights]:
    g = torch.Generator().manual_seed(31)

    def rand(*shape):
        return torch.randn(*shape, generator=g)

    wide = rand(2, 2, 8, 8)  # d_head = d_model
    strided = {  # non-contiguous views: transposes of differently laid out storage
        "W_Q": rand(2, 3, 4, 16).mT,
        "W_K": rand(2, 3, 4, 16).mT,
        "W_V": rand(16, 4, 3, 2).permute(3, 2, 0, 1),
        "W_O": rand(2, 3, 16, 4).mT,
    }
    assert not strided["W_Q"].is_contiguous()
    return {
        "one-layer": random_weights(1, 2, 8, 2, seed=1),
        "one-head": random_weights(2, 1, 8, 2, seed=2),
        "d_head-equals-d_model": HeadWeights(
            W_Q=wide, W_K=rand(*wide.shape), W_V=rand(*wide.shape), W_O=rand(*wide.shape)
        ),
        "float16": _cast(random_weights(2, 2, 8, 2, seed=3), torch.float16),
        "bfloat16": _cast(random_weights(2, 2, 8, 2, seed=4), torch.bfloat16),
        "non-contiguous": HeadWeights(**strided),
    }


@pytest.mark.parametrize("case", list(_edge_cases()))
def test_valid_edge_cases_give_finite_right_shaped_results(case):
    w = _edge_cases()[case]
    L, H, d_head = w.n_layers, w.n_heads, w.d_head
    for circuit in ("QK", "OV"):
        sigma = singular_values(w, circuit)
        assert sigma.shape == (L, H, min(d_head, w.d_model)) and bool(torch.isfinite(sigma).all())
        torch.testing.assert_close(sigma.double(), _dense_oracle_sigma(w, circuit), rtol=SPECTRUM_RTOL, atol=1e-5)
        assert numerical_rank(w, circuit).shape == (L, H)
        assert bool(torch.isfinite(effective_rank(w, circuit)).all())
    assert ov_eigenvalues(w).shape == (L, H, d_head)
    for mode in "QKV":
        for baseline in (None, "subtract", "zscore"):
            scores = composition_scores(w, mode, baseline=baseline)
            assert scores.shape == (L, H, L, H) and scores.dtype == torch.float32
            assert bool(torch.isfinite(scores).all())


def test_non_contiguous_weights_score_like_their_contiguous_copies():
    w = _edge_cases()["non-contiguous"]
    contiguous = HeadWeights(**{k: v.clone(memory_format=torch.contiguous_format) for k, v in w.tensors().items()})
    for mode in "QKV":
        torch.testing.assert_close(composition_scores(w, mode), composition_scores(contiguous, mode))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_weights_near_the_dtype_limit_give_finite_copying_eigenvalues(dtype):
    top = torch.finfo(dtype).max ** 0.5  # the products of two such factors overflow the dtype
    w = _scaled(random_weights(1, 2, 8, 2, d_vocab=6, seed=5), top / 4, dtype=dtype)
    values = ov_eigenvalues(w, full=True)
    assert bool(torch.isfinite(values).all())
    assert math.isfinite(float(singular_values(w, "full_OV").max()))


def test_a_spectrum_beyond_float64_raises_instead_of_returning_inf():
    # four factors of ~1e153 each: the eigenvalues (~1e614) exceed even float64, so the answer is an error
    w = _scaled(random_weights(1, 2, 8, 2, d_vocab=6, seed=5), 1e153, dtype=torch.float64)
    with pytest.raises(CircuitkitError, match="NaN or infinite"):
        ov_eigenvalues(w, full=True)
