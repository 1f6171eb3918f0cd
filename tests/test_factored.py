"""QK/OV analysis on factors: agreement with TransformerLens's FactoredMatrix and with dense torch.linalg."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import circuitkit as ck
from circuitkit import CircuitkitError, Factored, HeadWeights
from tests.conftest import random_weights

# float32 SVD/eig of small, well-conditioned matrices agrees to a few ulps times the matrix size.
FP32_ATOL = 2e-5
# float64 references: agreement limited only by accumulated rounding.
FP64_ATOL = 1e-10


def _sorted_complex(values: torch.Tensor) -> torch.Tensor:
    """Eigenvalues in a canonical order (by real part, then imaginary part) for multiset comparison."""
    values = values.to(torch.complex128)
    key = values.real * 1e6 + values.imag
    return torch.gather(values, -1, key.argsort(dim=-1))


# ---------------------------------------------------------------------- TransformerLens oracle
@pytest.mark.parametrize("circuit", ["QK", "OV"])
def test_singular_values_match_transformer_lens(tiny_bridge, circuit):
    weights = HeadWeights.from_model(tiny_bridge)
    ours = ck.singular_values(weights, circuit)
    theirs = getattr(tiny_bridge, circuit).S.detach()
    assert ours.shape == (2, 4, 8)
    torch.testing.assert_close(ours, theirs, atol=FP32_ATOL, rtol=0)


@pytest.mark.parametrize("circuit", ["QK", "OV"])
def test_gqa_singular_values_match_transformer_lens(tiny_gqa_bridge, circuit):
    weights = HeadWeights.from_model(tiny_gqa_bridge)
    assert (weights.n_heads, weights.n_kv_heads) == (4, 2)
    ours = ck.singular_values(weights, circuit)
    theirs = getattr(tiny_gqa_bridge, circuit).S.detach()
    torch.testing.assert_close(ours, theirs, atol=FP32_ATOL, rtol=0)


def test_ov_eigenvalues_match_transformer_lens(tiny_bridge):
    ours = _sorted_complex(ck.ov_eigenvalues(tiny_bridge))
    theirs = _sorted_complex(tiny_bridge.OV.eigenvalues.detach())
    torch.testing.assert_close(ours, theirs, atol=FP32_ATOL, rtol=0)


def test_frobenius_norm_matches_transformer_lens(tiny_bridge):
    for circuit in ("QK", "OV"):
        ours = ck.frobenius_norm(tiny_bridge, circuit)
        theirs = getattr(tiny_bridge, circuit).norm().detach()
        torch.testing.assert_close(ours, theirs, atol=FP32_ATOL, rtol=1e-5)


def test_full_ov_circuit_matches_transformer_lens(tiny_bridge):
    full_tl = tiny_bridge.W_E @ tiny_bridge.OV @ tiny_bridge.W_U  # TransformerLens FactoredMatrix algebra
    ours = ck.full_ov_circuit(tiny_bridge)
    assert tuple(ours.shape) == (2, 4, 50, 50)
    torch.testing.assert_close(ours.singular_values(), full_tl.S.detach(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(
        _sorted_complex(ours.eigenvalues()), _sorted_complex(full_tl.eigenvalues.detach()), atol=1e-4, rtol=1e-4
    )


# ---------------------------------------------------------------------- dense reference
def _dense_reference(weights: HeadWeights, circuit: str) -> torch.Tensor:
    if circuit == "QK":
        return weights.W_Q @ weights.per_query_head("W_K").transpose(-1, -2)
    return weights.per_query_head("W_V") @ weights.W_O


@pytest.mark.parametrize("circuit", ["QK", "OV"])
@pytest.mark.parametrize(
    "shape",
    [(2, 3, 16, 4), (1, 2, 4, 8), (2, 4, 12, 12)],
    ids=["d_head<d_model", "d_head>d_model", "d_head=d_model"],
)
def test_spectra_match_dense_linalg(shape, circuit):
    weights = random_weights(*shape, seed=1, dtype=torch.float64)
    dense = _dense_reference(weights, circuit)
    sigma = ck.singular_values(weights, circuit)
    k = min(shape[2], shape[3])
    torch.testing.assert_close(sigma[..., :k], torch.linalg.svdvals(dense)[..., :k], atol=FP64_ATOL, rtol=0)
    norms = ck.frobenius_norm(weights, circuit)
    torch.testing.assert_close(norms, torch.linalg.matrix_norm(dense), atol=FP64_ATOL, rtol=0)
    assert torch.equal(ck.numerical_rank(weights, circuit), torch.linalg.matrix_rank(dense))


def test_ov_eigenvalues_are_the_nonzero_eigenvalues_of_the_dense_circuit():
    weights = random_weights(2, 3, 16, 4, seed=2, dtype=torch.float64)
    ours = _sorted_complex(ck.ov_eigenvalues(weights))
    dense_eigs = torch.linalg.eigvals(_dense_reference(weights, "OV"))
    # keep the d_head eigenvalues of largest modulus: the other d_model - d_head are exactly zero in theory
    top = torch.gather(dense_eigs, -1, dense_eigs.abs().argsort(dim=-1, descending=True)[..., :4])
    torch.testing.assert_close(ours, _sorted_complex(top), atol=1e-9, rtol=0)


@settings(max_examples=25, deadline=None)
@given(
    m=st.integers(1, 12),
    r=st.integers(1, 12),
    n=st.integers(1, 12),
    seed=st.integers(0, 2**16),
)
def test_factored_singular_values_equal_dense_for_any_shape(m, r, n, seed):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(3, m, r, generator=g, dtype=torch.float64)
    B = torch.randn(3, r, n, generator=g, dtype=torch.float64)
    factored = Factored(A, B)
    k = min(m, r, n)
    sigma = factored.singular_values()
    assert sigma.shape == (3, k)
    torch.testing.assert_close(sigma, torch.linalg.svdvals(A @ B)[..., :k], atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(factored.norm(), torch.linalg.matrix_norm(A @ B), atol=1e-9, rtol=1e-9)


# ---------------------------------------------------------------------- identities
@pytest.mark.parametrize("d_model,d_head", [(16, 4), (4, 8), (32, 32)])
def test_rank_is_at_most_min_of_d_model_and_d_head(d_model, d_head):
    """Seed 000, exercise 1.3: rank(W_Q W_K^T) <= min(d_model, d_head) (and the same for OV)."""
    weights = random_weights(2, 2, d_model, d_head, seed=3)
    for circuit in ("QK", "OV"):
        ranks = ck.numerical_rank(weights, circuit)
        assert int(ranks.max()) <= min(d_model, d_head)
        assert int(ranks.min()) == min(d_model, d_head)  # Gaussian factors have full rank almost surely


def test_rank_of_a_deliberately_low_rank_head():
    weights = random_weights(1, 2, 16, 4, seed=4)
    W_V = weights.W_V.clone()
    W_V[0, 1, :, 2:] = 0  # head 1 reads only 2 directions
    low = HeadWeights(W_Q=weights.W_Q, W_K=weights.W_K, W_V=W_V, W_O=weights.W_O)
    assert ck.numerical_rank(low, "OV").tolist() == [[4, 2]]


def test_ov_spectrum_invariant_under_change_of_basis_inside_the_head():
    """W_V -> W_V R, W_O -> R^-1 W_O leaves W_V W_O, hence its spectrum, unchanged."""
    weights = random_weights(2, 3, 16, 4, seed=5, dtype=torch.float64)
    g = torch.Generator().manual_seed(6)
    R = torch.randn(2, 3, 4, 4, generator=g, dtype=torch.float64) + 3 * torch.eye(4, dtype=torch.float64)
    changed = HeadWeights(
        W_Q=weights.W_Q @ R,
        W_K=weights.W_K @ torch.linalg.inv(R).transpose(-1, -2),
        W_V=weights.W_V @ R,
        W_O=torch.linalg.inv(R) @ weights.W_O,
    )
    for circuit in ("QK", "OV"):
        torch.testing.assert_close(
            ck.singular_values(changed, circuit), ck.singular_values(weights, circuit), atol=1e-9, rtol=1e-9
        )
    torch.testing.assert_close(
        _sorted_complex(ck.ov_eigenvalues(changed)), _sorted_complex(ck.ov_eigenvalues(weights)), atol=1e-9, rtol=0
    )


@pytest.mark.parametrize("scale", [-3.0, 0.5, 10.0])
def test_scaling_behaviour(scale):
    """Scaling W_O by c scales singular values and the norm by |c|, eigenvalues by c; ranks are unchanged."""
    weights = random_weights(1, 2, 16, 4, seed=7, dtype=torch.float64)
    scaled = HeadWeights(W_Q=weights.W_Q, W_K=weights.W_K, W_V=weights.W_V, W_O=scale * weights.W_O)
    torch.testing.assert_close(ck.singular_values(scaled), abs(scale) * ck.singular_values(weights))
    torch.testing.assert_close(ck.frobenius_norm(scaled), abs(scale) * ck.frobenius_norm(weights))
    torch.testing.assert_close(
        _sorted_complex(ck.ov_eigenvalues(scaled)), _sorted_complex(scale * ck.ov_eigenvalues(weights))
    )
    torch.testing.assert_close(ck.effective_rank(scaled), ck.effective_rank(weights))
    assert torch.equal(ck.numerical_rank(scaled), ck.numerical_rank(weights))


def test_effective_rank_closed_forms():
    eye = torch.eye(4, dtype=torch.float64)
    flat = Factored(eye[None], eye[None])  # identity: flat spectrum of 4 -> effective rank 4
    one = Factored(eye[None, :, :1], eye[None, :1, :])  # rank one -> 1
    diag = torch.diag(torch.tensor([3.0, 1.0], dtype=torch.float64))
    skew = Factored(diag[None], torch.eye(2, dtype=torch.float64)[None])
    p = torch.tensor([0.75, 0.25], dtype=torch.float64)
    assert flat.effective_rank().item() == pytest.approx(4.0)
    assert one.effective_rank().item() == pytest.approx(1.0)
    assert skew.effective_rank().item() == pytest.approx(torch.exp(-(p * p.log()).sum()).item())
    zero = Factored(torch.zeros(1, 3, 2, dtype=torch.float64), torch.zeros(1, 2, 3, dtype=torch.float64))
    assert zero.effective_rank().item() == 0.0


def test_full_qk_circuit_matches_dense():
    weights = random_weights(1, 2, 16, 4, d_vocab=10, seed=8, dtype=torch.float64)
    dense = weights.W_E @ weights.W_Q @ weights.W_K.transpose(-1, -2) @ weights.W_E.T
    full = ck.full_qk_circuit(weights)
    torch.testing.assert_close(full.dense(), dense)
    torch.testing.assert_close(ck.singular_values(weights, "full_QK"), torch.linalg.svdvals(dense)[..., :4])


def test_factored_algebra_matches_dense():
    g = torch.Generator().manual_seed(9)
    A, B = torch.randn(2, 5, 3, generator=g), torch.randn(2, 3, 6, generator=g)
    C, D = torch.randn(2, 6, 2, generator=g), torch.randn(2, 2, 4, generator=g)
    left, right = Factored(A, B), Factored(C, D)
    torch.testing.assert_close((left @ right).dense(), A @ B @ C @ D)
    torch.testing.assert_close(left.T.dense(), (A @ B).transpose(-1, -2))
    torch.testing.assert_close(left[1].dense(), A[1] @ B[1])
    X = torch.randn(7, 5, generator=g)
    torch.testing.assert_close((X @ left).dense(), X @ A @ B)


# ---------------------------------------------------------------------- bad input
def test_factored_rejects_mismatched_factors():
    with pytest.raises(CircuitkitError, match=r"A of shape \(2, 5, 3\) and B of shape \(2, 4, 6\)"):
        Factored(torch.zeros(2, 5, 3), torch.zeros(2, 4, 6))


def test_eigenvalues_of_a_non_square_circuit_are_refused():
    with pytest.raises(CircuitkitError, match="square"):
        Factored(torch.zeros(5, 3), torch.zeros(3, 6)).eigenvalues()


def test_unknown_circuit_name():
    with pytest.raises(CircuitkitError, match=r"circuit: given str 'XY'; expected one of"):
        ck.singular_values(random_weights(1, 1, 4, 2), "XY")


def test_full_circuit_without_embedding_says_what_is_missing():
    with pytest.raises(CircuitkitError, match="no W_E"):
        ck.full_ov_circuit(random_weights(1, 1, 4, 2))
