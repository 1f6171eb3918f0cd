"""The batched QK/OV spectra (Gram roots and one symmetric eigenvalue problem per head, key/value groups read once)
against a dense float64 SVD of every head's circuit, on grouped-query shapes, rank-deficient heads, half precision
and float64 weights."""

from __future__ import annotations

import pytest
import torch

import circuitkit as ck
from circuitkit.factored import ov_circuit, qk_circuit

SIGMA_RTOL = 1e-5
"""float32 weights: the float64 core loses nothing beyond float32's rounding of the weights (~1e-7 relative to
sigma_max, times a few for accumulation over d_model); 1e-5 of sigma_max leaves room and still catches a wrong
group, a dropped head or a squared value."""


def _dense_sigma(w: ck.HeadWeights, circuit: str) -> torch.Tensor:
    W_K, W_V = w.per_query_head("W_K").double(), w.per_query_head("W_V").double()
    dense = w.W_Q.double() @ W_K.mT if circuit == "QK" else W_V @ w.W_O.double()
    k = min(w.d_model, w.d_head)
    return torch.linalg.svdvals(dense)[..., :k]


def _weights(layers=3, heads=6, groups=2, d_model=24, d_head=8, seed=0, dtype=torch.float32) -> ck.HeadWeights:
    g = torch.Generator().manual_seed(seed)
    return ck.HeadWeights(
        W_Q=torch.randn(layers, heads, d_model, d_head, generator=g).to(dtype),
        W_K=torch.randn(layers, groups, d_model, d_head, generator=g).to(dtype),
        W_V=torch.randn(layers, groups, d_model, d_head, generator=g).to(dtype),
        W_O=torch.randn(layers, heads, d_head, d_model, generator=g).to(dtype),
    )


@pytest.mark.parametrize("circuit", ["QK", "OV"])
@pytest.mark.parametrize("groups", [1, 2, 6])
def test_batched_spectra_match_a_dense_svd_for_every_head(circuit, groups):
    w = _weights(groups=groups, seed=groups)
    sigma = ck.singular_values(w, circuit)
    oracle = _dense_sigma(w, circuit)
    assert sigma.shape == oracle.shape == (3, 6, 8) and sigma.dtype == torch.float32
    assert bool(((sigma.double() - oracle).abs() <= SIGMA_RTOL * oracle[..., :1]).all())
    # the grouped fast path and the general factored path agree
    factored = (qk_circuit if circuit == "QK" else ov_circuit)(w).singular_values()
    assert bool(((sigma - factored).abs() <= SIGMA_RTOL * factored[..., :1]).all())


def test_each_query_head_reads_its_own_group():
    """Zeroing one key/value group zeroes the QK spectra of exactly its query heads."""
    w = _weights(groups=3)
    W_K = w.W_K.clone()
    W_K[1, 2] = 0
    sigma = ck.singular_values(ck.HeadWeights(W_Q=w.W_Q, W_K=W_K, W_V=w.W_V, W_O=w.W_O), "QK")
    zero = sigma.abs().amax(-1) == 0
    expected = torch.zeros(3, 6, dtype=torch.bool)
    expected[1, 4:6] = True  # group 2 of 3 serves query heads 4 and 5
    assert torch.equal(zero, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rank_deficient_heads_have_their_rank(dtype):
    w = _weights(groups=2, dtype=dtype)
    W_O = w.W_O.clone()
    W_O[0, 1, 3:] = 0  # head 0.1 writes through 3 of its 8 dimensions: OV rank 3
    W_O[2, 5] = torch.outer(torch.ones(8, dtype=dtype), W_O[2, 5, 0])  # rank 1
    w = ck.HeadWeights(W_Q=w.W_Q, W_K=w.W_K, W_V=w.W_V, W_O=W_O)
    rank = ck.numerical_rank(w, "OV")
    assert rank[0, 1] == 3 and rank[2, 5] == 1
    assert int((rank == 8).sum()) == 3 * 6 - 2
    oracle = torch.linalg.matrix_rank(w.per_query_head("W_V").double() @ W_O.double())
    assert torch.equal(rank, oracle)


def test_d_head_larger_than_d_model_gives_d_model_values():
    w = _weights(d_model=6, d_head=10, groups=3)
    for circuit in ("QK", "OV"):
        sigma = ck.singular_values(w, circuit)
        assert sigma.shape == (3, 6, 6)
        oracle = _dense_sigma(w, circuit)
        assert bool(((sigma.double() - oracle).abs() <= SIGMA_RTOL * oracle[..., :1]).all())


def test_half_precision_weights_are_analysed_in_higher_precision():
    w32 = _weights(groups=2)
    half = ck.HeadWeights(W_Q=w32.W_Q.half(), W_K=w32.W_K.half(), W_V=w32.W_V.half(), W_O=w32.W_O.half())
    oracle = torch.linalg.svdvals(half.W_Q.double() @ half.per_query_head("W_K").double().mT)[..., :8]
    sigma = ck.singular_values(half, "QK")
    assert bool(((sigma.double() - oracle).abs() <= SIGMA_RTOL * oracle[..., :1]).all())
