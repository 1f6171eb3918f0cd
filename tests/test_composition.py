"""Composition scores: against TransformerLens, a dense reference, invariances, tiling, bad input."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformer_lens.FactoredMatrix import FactoredMatrix
from transformer_lens.utilities.matrix import composition_scores as tl_composition_scores

from circuitkit import CircuitkitError, HeadWeights
from circuitkit.composition import Edge, composition_scores, top_edges
from tests.conftest import random_weights

TL_ATOL = 1e-5
"""The issue's fp32 agreement target with TransformerLens (both sides compute in float32)."""

DENSE_ATOL = 2e-6
"""float32 scores against a float64 dense reference: a few float32 ulps of values in [0, 1]."""

TILING_ATOL = 1e-6
"""The same maths on the same float32 factors, only indexed differently."""

INVARIANCE_ATOL = 1e-5
"""A change of basis with condition number <= 4 amplifies float32 rounding a little."""

MODES = ("Q", "K", "V")


# ---------------------------------------------------------------------------------------------- references
def tl_reference(w: HeadWeights, mode: str) -> torch.Tensor:
    """TransformerLens's scores, built the way ``TransformerBridge.all_composition_scores`` builds them."""
    W_K, W_V = w.per_query_head("W_K"), w.per_query_head("W_V")
    left = FactoredMatrix(W_V, w.W_O)
    right = {
        "Q": lambda: FactoredMatrix(w.W_Q, W_K.transpose(-2, -1)),
        "K": lambda: FactoredMatrix(w.W_Q, W_K.transpose(-2, -1)).T,
        "V": lambda: left,
    }[mode]()
    scores = tl_composition_scores(left, right, broadcast_dims=True)
    layers = torch.arange(w.n_layers)
    mask = layers[:, None, None, None] < layers[None, None, :, None]
    return torch.where(mask, scores, torch.zeros_like(scores))


def dense_reference(w: HeadWeights, mode: str) -> torch.Tensor:
    """Every pair scored from dense d_model x d_model matrices in float64, one layer pair at a time."""
    w = w.double()
    W_K, W_V = w.per_query_head("W_K"), w.per_query_head("W_V")
    ov = W_V @ w.W_O
    qk = w.W_Q @ W_K.mT
    right = {"Q": qk, "K": qk.mT, "V": ov}[mode]
    L, H = w.n_layers, w.n_heads
    out = torch.zeros(L, H, L, H, dtype=torch.float64)
    for a in range(L):
        for b in range(a + 1, L):
            A, B = ov[a][:, None], right[b][None, :]  # [H, 1, d_model, d_model], [1, H, d_model, d_model]
            norm = torch.linalg.matrix_norm
            out[a, :, b, :] = norm(A @ B) / (norm(A) * norm(B))
    return out


SHAPES = {
    "3L-4H-d16-h4": dict(n_layers=3, n_heads=4, d_model=16, d_head=4),
    "3L-4H-d16-h4-gqa2": dict(n_layers=3, n_heads=4, d_model=16, d_head=4, n_kv_heads=2),
    "4L-6H-d48-h8-mqa": dict(n_layers=4, n_heads=6, d_model=48, d_head=8, n_kv_heads=1),
    # d_head^2 large against d_model: composition_scores takes the Gram route (as at Gemma-3's 256 against 640)
    "6L-4H-d32-h24": dict(n_layers=6, n_heads=4, d_model=32, d_head=24),
    "6L-4H-d32-h24-gqa2": dict(n_layers=6, n_heads=4, d_model=32, d_head=24, n_kv_heads=2),
    "6L-4H-d32-h24-mqa": dict(n_layers=6, n_heads=4, d_model=32, d_head=24, n_kv_heads=1),
}
GRAM_SHAPES = [name for name in SHAPES if "-h24" in name]


# ---------------------------------------------------------------------------------------------- agreement
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", list(SHAPES), ids=list(SHAPES))
def test_matches_transformerlens(shape, mode):
    w = random_weights(**SHAPES[shape], seed=1)
    ours = composition_scores(w, mode)
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, tl_reference(w, mode), atol=TL_ATOL, rtol=0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("bridge", ["tiny_bridge", "tiny_gqa_bridge"])
def test_model_input_matches_bridge_all_composition_scores(request, bridge, mode):
    model = request.getfixturevalue(bridge)
    expected = model.all_composition_scores(mode).scores.detach()
    torch.testing.assert_close(composition_scores(model, mode), expected.float(), atol=TL_ATOL, rtol=0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", list(SHAPES), ids=list(SHAPES))
def test_matches_dense_reference(shape, mode):
    w = random_weights(**SHAPES[shape], seed=2)
    expected = dense_reference(w, mode).float()
    torch.testing.assert_close(composition_scores(w, mode), expected, atol=DENSE_ATOL, rtol=0)


@settings(max_examples=20, deadline=None, derandomize=True)
@given(
    n_layers=st.integers(2, 3),
    n_heads=st.sampled_from([1, 2, 4]),
    d_model=st.integers(2, 12),
    d_head=st.integers(1, 6),
    grouped=st.booleans(),
    mode=st.sampled_from(MODES),
    seed=st.integers(0, 2**16),
)
def test_dense_reference_on_random_tiny_shapes(n_layers, n_heads, d_model, d_head, grouped, mode, seed):
    # d_head > d_model makes every Gram matrix rank-deficient: the factor roots must still be exact.
    n_kv = 1 if grouped else n_heads
    w = random_weights(n_layers, n_heads, d_model, d_head, n_kv_heads=n_kv, seed=seed)
    expected = dense_reference(w, mode).float()
    torch.testing.assert_close(composition_scores(w, mode), expected, atol=DENSE_ATOL, rtol=0)


def test_float64_weights_give_float32_scores_equal_to_dense():
    w = random_weights(3, 4, 16, 4, seed=3, dtype=torch.float64)
    scores = composition_scores(w, "Q")
    assert scores.dtype == torch.float32
    torch.testing.assert_close(scores, dense_reference(w, "Q").float(), atol=DENSE_ATOL, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_half_precision_weights_are_scored_in_float32(dtype):
    w = random_weights(3, 4, 16, 4, seed=12, dtype=dtype)
    scores = composition_scores(w, "V")
    assert scores.dtype == torch.float32
    torch.testing.assert_close(scores, dense_reference(w, "V").float(), atol=DENSE_ATOL, rtol=0)


# ---------------------------------------------------------------------------------------------- structure
@pytest.mark.parametrize("mode", MODES)
def test_scores_in_unit_interval_and_zero_off_the_forward_pairs(mode):
    w = random_weights(4, 3, 16, 4, seed=4)
    scores = composition_scores(w, mode)
    assert scores.shape == (4, 3, 4, 3)
    assert bool((scores >= 0).all()) and bool((scores <= 1).all())
    for src in range(4):
        for dst in range(4):
            block = scores[src, :, dst, :]
            if src >= dst:
                assert bool((block == 0).all()), (src, dst)
            else:
                assert bool((block > 0).all()), (src, dst)
    assert not scores.requires_grad


def test_zero_head_scores_zero_not_nan():
    w = random_weights(3, 2, 16, 4, seed=5)
    W_O = w.W_O.clone()
    W_O[0, 1] = 0
    w = HeadWeights(W_Q=w.W_Q, W_K=w.W_K, W_V=w.W_V, W_O=W_O)
    for mode in MODES:
        scores = composition_scores(w, mode)
        assert bool(torch.isfinite(scores).all())
        assert bool((scores[0, 1] == 0).all())


def _well_conditioned(d: int, generator: torch.Generator) -> torch.Tensor:
    """An invertible d x d matrix with singular values in [0.5, 2] (condition number <= 4)."""
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=generator, dtype=torch.float64))
    scales = 0.5 + 1.5 * torch.rand(d, generator=generator, dtype=torch.float64)
    return q * scales


@pytest.mark.parametrize("mode", MODES)
def test_invariant_under_change_of_basis_inside_each_head(mode):
    w = random_weights(3, 4, 16, 4, seed=6, dtype=torch.float64)
    g = torch.Generator().manual_seed(7)
    L, H, d = w.n_layers, w.n_heads, w.d_head
    R_ov = torch.stack([torch.stack([_well_conditioned(d, g) for _ in range(H)]) for _ in range(L)])
    R_qk = torch.stack([torch.stack([_well_conditioned(d, g) for _ in range(H)]) for _ in range(L)])
    changed = HeadWeights(
        W_V=w.W_V @ R_ov,  # W_V R, R^-1 W_O: same OV circuit
        W_O=torch.linalg.solve(R_ov, w.W_O),
        W_Q=w.W_Q @ R_qk,  # W_Q R, W_K R^-T: same QK circuit
        W_K=w.W_K @ torch.linalg.inv(R_qk).mT,
    )
    assert not torch.allclose(changed.W_V, w.W_V)
    torch.testing.assert_close(
        composition_scores(changed.float(), mode), composition_scores(w.float(), mode), atol=INVARIANCE_ATOL, rtol=0
    )


@pytest.mark.parametrize("mode", MODES)
def test_every_tiling_gives_the_same_scores(mode):
    # budget 1: one layer pair per tile, destination refolded per tile; 120 kB: three destination layers per
    # tile, refolded; 2 MB: all destination factors folded once and cached.
    w = random_weights(6, 4, 64, 16, n_kv_heads=2, seed=8)
    reference = dense_reference(w, mode).float()
    for budget in (1, 120_000, 2 * 2**20):
        scores = composition_scores(w, mode, memory_budget=budget)
        torch.testing.assert_close(scores, reference, atol=DENSE_ATOL, rtol=0)


def test_grouped_query_scores_equal_expanded_multi_head_scores():
    w = random_weights(3, 4, 16, 4, n_kv_heads=2, seed=9)
    expanded = HeadWeights(W_Q=w.W_Q, W_K=w.per_query_head("W_K"), W_V=w.per_query_head("W_V"), W_O=w.W_O)
    for mode in MODES:
        grouped, ungrouped = composition_scores(w, mode), composition_scores(expanded, mode)
        torch.testing.assert_close(grouped, ungrouped, atol=TILING_ATOL, rtol=0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="hardware: no CUDA device on this machine")
def test_cuda_scores_stay_on_device_and_match_cpu():
    w = random_weights(3, 4, 16, 4, seed=10)
    scores = composition_scores(w.to("cuda"), "Q")
    assert scores.device.type == "cuda"
    torch.testing.assert_close(scores.cpu(), composition_scores(w, "Q"), atol=TL_ATOL, rtol=0)


# ---------------------------------------------------------------------------------------------- top edges
def test_top_edges_match_a_sorted_list_of_forward_pairs():
    w = random_weights(3, 4, 16, 4, seed=11)
    scores = composition_scores(w, "K")
    everything = sorted(
        (
            (float(scores[a, i, b, j]), (a, i), (b, j))
            for a in range(3)
            for b in range(a + 1, 3)
            for i in range(4)
            for j in range(4)
        ),
        key=lambda item: -item[0],
    )
    edges = top_edges(scores, k=5)
    assert [(e.src, e.dst) for e in edges] == [(src, dst) for _, src, dst in everything[:5]]
    assert [e.score for e in edges] == pytest.approx([s for s, _, _ in everything[:5]])
    assert len(top_edges(scores, k=1000)) == len(everything) == 3 * 16


def test_top_edges_skip_backward_pairs_even_when_they_are_largest():
    scores = torch.zeros(2, 2, 2, 2)
    scores[1, 0, 0, 1] = 5.0  # a backward pair: not an edge
    scores[0, 1, 1, 0] = 0.5
    scores[0, 0, 1, 1] = -0.5  # baseline-corrected scores can be negative
    edges = top_edges(scores, k=2)
    assert edges == [Edge((0, 1), (1, 0), 0.5), Edge((0, 0), (1, 0), 0.0)]


def test_edge_name_reads_layer_dot_head():
    assert Edge((0, 7), (1, 4), 0.3).name == "0.7 -> 1.4"
    assert Edge((10, 0), (11, 12), 0.3).name == "10.0 -> 11.12"


@pytest.mark.parametrize(
    "scores, k",
    [
        (torch.zeros(2, 3, 2), 3),
        (torch.zeros(2, 3, 3, 3), 3),
        (torch.zeros(2, 2, 2, 2), 0),
        (torch.full((2, 2, 2, 2), float("nan")), 3),
        ("scores", 3),
    ],
    ids=["three-axes", "layer-axes-differ", "k-zero", "nan-scores", "not-a-tensor"],
)
def test_top_edges_rejects_bad_input(scores, k):
    with pytest.raises(CircuitkitError):
        top_edges(scores, k)


# ---------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("mode", ["X", "q", "QK", None, 1], ids=["X", "lowercase-q", "QK", "None", "int"])
def test_unknown_mode_is_rejected(mode):
    with pytest.raises(CircuitkitError, match="expected one of 'Q'"):
        composition_scores(random_weights(), mode)


@pytest.mark.parametrize("baseline", [None, "subtract", "zscore"])
def test_one_layer_has_no_pairs_so_all_scores_are_zero(baseline):
    scores = composition_scores(random_weights(n_layers=1), "Q", baseline=baseline)
    assert scores.shape == (1, 4, 1, 4) and not scores.any()
    assert top_edges(scores) == []


def test_mismatched_weights_are_rejected():
    w = random_weights()
    with pytest.raises(CircuitkitError, match="W_O"):
        composition_scores(HeadWeights(W_Q=w.W_Q, W_K=w.W_K, W_V=w.W_V, W_O=w.W_O[:, :, :, :8]), "Q")


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(memory_budget=0),
        dict(memory_budget=-5),
        dict(memory_budget=1.5),
        dict(baseline="divide"),
        dict(baseline=["subtract"]),
    ],
    ids=["budget-zero", "budget-negative", "budget-float", "unknown-baseline", "baseline-list"],
)
def test_bad_options_are_rejected(kwargs):
    with pytest.raises(CircuitkitError):
        composition_scores(random_weights(), "V", **kwargs)


def test_raw_tensor_instead_of_weights_is_rejected():
    with pytest.raises(CircuitkitError, match="HeadWeights"):
        composition_scores(torch.zeros(2, 2, 4, 4), "Q")


# ---------------------------------------------------------------------------------------------- the Gram route
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", GRAM_SHAPES, ids=GRAM_SHAPES)
def test_gram_route_where_d_head_is_large_equals_the_dense_reference_and_transformerlens(shape, mode):
    """Where ``d_head^2`` is large against ``d_model`` (Gemma-3's 256 against 640) the scores come from
    ``d_model``-sized Gram matrices: the same scores as the dense float64 reference and TransformerLens, however
    many rows of the Gram matrices are taken at a time."""
    from circuitkit.composition import _gram_is_cheaper, _gram_scores, _raw_scores, _unit_heads

    w = random_weights(**SHAPES[shape], seed=11)
    assert _gram_is_cheaper(w, mode, 2**28)
    scores = composition_scores(w, mode)
    torch.testing.assert_close(scores, dense_reference(w, mode).float(), atol=DENSE_ATOL, rtol=0)
    torch.testing.assert_close(scores, tl_reference(w, mode), atol=TL_ATOL, rtol=0)
    unit = _unit_heads(w)
    torch.testing.assert_close(scores, _raw_scores(unit, mode, 2**28), atol=TILING_ATOL, rtol=0)
    for budget in (1, 2**16):  # one row of the Gram matrices per step; a few
        torch.testing.assert_close(_gram_scores(unit, mode, budget), scores, atol=TILING_ATOL, rtol=0)


def test_gram_route_scores_heads_in_orthogonal_subspaces_zero():
    """Two heads that write and read disjoint coordinates compose with score 0 on both routes (the Gram route's
    inner product of Gram matrices cancels exactly in float64, where float32 would leave ~1e-4)."""
    from circuitkit.composition import _gram_scores, _raw_scores, _unit_heads

    L, H, d, h = 2, 1, 16, 12
    W = torch.zeros(L, H, d, h)
    W[0, 0, :4, :4] = torch.eye(4)  # layer 0 reads and writes coordinates 0..3
    W[1, 0, 8:12, :4] = torch.eye(4)  # layer 1 reads coordinates 8..11
    w = _unit_heads(HeadWeights(W_Q=W, W_K=W, W_V=W, W_O=W.mT.contiguous()))
    for mode in MODES:
        assert float(_gram_scores(w, mode, 2**20).abs().max()) == 0.0
        assert float(_raw_scores(w, mode, 2**20).abs().max()) == 0.0


@pytest.mark.parametrize("precision", ["highest", "high", "medium"])
def test_matmul_precision_is_set_for_the_call_and_put_back(precision, monkeypatch):
    """The precision option is torch's own setting, held for the call only (also when the call raises)."""
    w = random_weights(3, 4, 16, 4, seed=10)
    seen = []
    original = torch.matmul

    def spy(*args, **kwargs):
        seen.append(torch.get_float32_matmul_precision())
        return original(*args, **kwargs)

    monkeypatch.setattr(torch, "matmul", spy)
    torch.set_float32_matmul_precision("highest")
    composition_scores(w, "Q", precision=precision, memory_budget=1)  # the tiled route, which calls torch.matmul
    assert seen and set(seen) == {precision}
    assert torch.get_float32_matmul_precision() == "highest"
    monkeypatch.setattr(torch, "matmul", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        composition_scores(w, "Q", precision=precision, memory_budget=1)
    assert torch.get_float32_matmul_precision() == "highest"


def test_an_unknown_precision_is_one_clear_line():
    with pytest.raises(CircuitkitError, match="precision: given str 'fp8'; expected one of 'highest', 'high'"):
        composition_scores(random_weights(2, 2, 8, 4, seed=1), "Q", precision="fp8")
