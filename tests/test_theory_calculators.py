"""Calculators reproduce the seeds' worked answers; torch modules and FLOP counters serve as oracles."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from circuitkit import CircuitkitError
from circuitkit.theory import (
    chinchilla_optimal,
    inference_flops_per_token,
    jl_min_dim,
    kv_cache_bytes,
    kv_cache_saving,
    mha_param_count,
    multi_head_attention,
    multi_head_complexity,
    param_count,
    rank_collapse_max_rate,
    receptive_field,
    self_attention_counts,
    training_flops,
)

# closed-form float arithmetic (a sqrt and a few products): relative error ~1e-16.
REL_TOL = 1e-12


def test_chinchilla_seed_000_ex_1_5():
    n, d = chinchilla_optimal(1.2e24)
    assert n == pytest.approx(1e11, rel=REL_TOL)  # 100 billion parameters
    assert d == pytest.approx(2e12, rel=REL_TOL)  # 2 trillion tokens


def test_chinchilla_seed_002_ex_13_18_satisfies_both_rules():
    result = chinchilla_optimal(1e22)
    assert result.n_params == pytest.approx(math.sqrt(1e22 / 120), rel=REL_TOL)  # ~9.13e9
    assert 6 * result.n_params * result.n_tokens == pytest.approx(1e22, rel=REL_TOL)
    assert result.n_tokens == pytest.approx(20 * result.n_params, rel=REL_TOL)


def test_param_count_seed_002_ex_13_12_and_13_17():
    assert param_count(24, 1024, 50_000) == 12 * 24 * 1024**2 + 2 * 50_000 * 1024 == 404_389_888  # ~404M
    assert param_count(32, 4096, 32_000) == 6_704_594_944  # ~6.7B, a "7B" model to within 5%
    assert abs(param_count(32, 4096, 32_000) / 7e9 - 1) < 0.05


@pytest.mark.parametrize("n_heads", [1, 8, 64])
def test_mha_params_are_4_d_squared_for_any_head_count(n_heads):
    """Seed 002 ex. 13.30; oracle: the parameter count of torch's bias-free nn.MultiheadAttention."""
    mha = torch.nn.MultiheadAttention(512, n_heads, bias=False)
    assert mha_param_count(512, n_heads) == 4 * 512**2 == sum(p.numel() for p in mha.parameters())


def test_training_and_inference_flops_seed_002_ex_13_13_and_13_29():
    assert training_flops(13e9, 2e12) == pytest.approx(1.56e23, rel=REL_TOL)
    assert inference_flops_per_token(13e9) == pytest.approx(2.6e10, rel=REL_TOL)


def test_kv_cache_seed_002_ex_13_14():
    per_token = kv_cache_bytes(80, 64, 128, 1, 2)
    assert per_token == 2_621_440  # 2.5 MiB (2.62 MB) per token in fp16
    assert kv_cache_bytes(80, 64, 128, 32_768, 2) == 80 * 2**30  # 80 GiB for a 32K context


def test_multi_query_saving_seed_002_ex_13_23():
    """12 layers, 12 heads: MQA keeps one K/V head instead of 12, saving 11/12 at any context length."""
    assert kv_cache_saving(12, 1) == pytest.approx(11 / 12, rel=REL_TOL)
    mha, mqa = kv_cache_bytes(12, 12, 64, 1024), kv_cache_bytes(12, 1, 64, 1024)
    assert 1 - mqa / mha == pytest.approx(kv_cache_saving(12, 1), rel=REL_TOL)
    assert kv_cache_saving(32, 8) == pytest.approx(0.75, rel=REL_TOL)  # GQA with 8 groups


def test_jl_min_dim_seed_000_ex_1_9():
    assert jl_min_dim(1e12, 0.1) == math.ceil(8 * math.log(1e12) / 0.01) == 22_105


def test_receptive_field_seed_004_part_2a():
    assert [receptive_field(n, 1) for n in range(5)] == [2**n for n in range(5)]  # single head: 2^n
    assert receptive_field(4, 2) == 3**4  # two heads: 3^n
    assert receptive_field(3, 7) == 8**3  # k heads: (k + 1)^n


def test_rank_collapse_rate_seed_000_ex_1_7():
    rate = rank_collapse_max_rate(0.1, 12)
    assert rate == pytest.approx(math.log(10) / 12, rel=REL_TOL)  # 0.1919
    assert math.exp(-rate * 12) == pytest.approx(0.1, rel=REL_TOL)


def test_self_attention_counts_seed_003_problem_12_1_against_torch_layers():
    counts = self_attention_counts(n_tokens=5, d=3)
    qkv = torch.nn.Linear(3, 3 * 3)  # Omega_q, Omega_k, Omega_v stacked, with their biases
    dense = torch.nn.Linear(3 * 5, 3 * 5)
    assert (counts.qkv_weights, counts.qkv_biases) == (qkv.weight.numel(), qkv.bias.numel()) == (27, 9)
    assert counts.attention_weights == 25
    assert (counts.dense_weights, counts.dense_biases) == (dense.weight.numel(), dense.bias.numel())


def test_multi_head_complexity_matches_flop_counter():
    """Matmul FLOPs (2 per multiply-add) that torch counts in our multi-head attention equal the closed form."""
    n, d_head, n_heads = 10, 4, 3
    d_model = n_heads * d_head
    g = torch.Generator().manual_seed(0)
    W = [torch.randn(*s, generator=g) for s in ((3, 12, 4), (3, 12, 4), (3, 12, 4), (3, 4, 12))]
    x = torch.randn(1, n, d_model, generator=g)
    with FlopCounterMode(display=False) as counter:
        multi_head_attention(x, *W)
    cost = multi_head_complexity(n, n, d_head, n_heads)
    matmul_macs = cost.projections + 2 * n_heads * n * n * d_head  # softmax is not a matmul
    assert counter.get_total_flops() == 2 * matmul_macs


def test_multi_head_bottlenecks_seed_004_part_2d():
    assert multi_head_complexity(16, 16, 128, 32).bottleneck == "projections"  # large d_model, short sequence
    assert multi_head_complexity(65_536, 65_536, 16, 4).bottleneck == "attention"  # long sequence, small d_model


@pytest.mark.parametrize(
    ("make", "match"),
    [
        pytest.param(lambda: chinchilla_optimal(-1.0), "compute", id="negative-compute"),
        pytest.param(lambda: chinchilla_optimal(float("nan")), "compute", id="nan-compute"),
        pytest.param(lambda: param_count(-2, 1024, 50_000), "n_layers", id="negative-layers"),
        pytest.param(lambda: param_count(2, 10.5, 50_000), "d_model", id="float-d_model"),
        pytest.param(lambda: param_count(True, 8, 8), "n_layers", id="bool-layers"),
        pytest.param(lambda: training_flops(0, 1e9), "n_params", id="zero-params"),
        pytest.param(lambda: kv_cache_bytes(12, 0, 64, 1024), "n_kv_heads", id="zero-kv-heads"),
        pytest.param(lambda: kv_cache_bytes(12, 4, 64, -5), "n_tokens", id="negative-tokens"),
        pytest.param(lambda: kv_cache_saving(12, 5), "divide", id="kv-heads-not-divisor"),
        pytest.param(lambda: jl_min_dim(1e12, 0.0), r"\(0, 1\)", id="eps-zero"),
        pytest.param(lambda: jl_min_dim(1e12, 1.0), r"\(0, 1\)", id="eps-one"),
        pytest.param(lambda: jl_min_dim(1e12, 1.5), r"\(0, 1\)", id="eps-above-one"),
        pytest.param(lambda: jl_min_dim(1e12, -0.1), r"\(0, 1\)", id="eps-negative"),
        pytest.param(lambda: jl_min_dim(1, 0.1), "at least 2", id="one-point"),
        pytest.param(lambda: receptive_field(-1, 2), "n_layers", id="negative-layers-rf"),
        pytest.param(lambda: mha_param_count(512, 7), "divisible", id="heads-not-dividing"),
        pytest.param(lambda: rank_collapse_max_rate(1.2, 12), "retained_fraction", id="fraction-above-one"),
        pytest.param(lambda: multi_head_complexity(0, 4, 4, 4), "n_q", id="zero-query-length"),
    ],
)
def test_bad_input_names_the_value_and_range(make, match):
    with pytest.raises(CircuitkitError, match=match):
        make()


def test_error_message_names_given_value_and_expected_range():
    with pytest.raises(CircuitkitError) as info:
        jl_min_dim(1e6, 1.5)
    assert "1.5" in str(info.value) and "(0, 1)" in str(info.value)
