"""circuitkit.theory.attention against torch's own attention (F.scaled_dot_product_attention, nn.MultiheadAttention)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from circuitkit import CircuitkitError
from circuitkit.theory import (
    decode_with_kv_cache,
    kv_cache_bytes,
    merge_heads,
    multi_head_attention,
    pattern_numpy,
    pattern_torch,
    sdpa_numpy,
    sdpa_torch,
    split_heads,
)

# float64 everywhere: two exact implementations differ only by summation order, ~1e-15 relative.
FLOAT64_TOL = 1e-12


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _padding(batch: int, n_k: int, lengths: list[int]) -> torch.Tensor:
    """True marks padding: the keys at positions >= length of each sequence."""
    return torch.arange(n_k)[None, :] >= torch.tensor(lengths)[:, None]


MASK_CASES = [
    pytest.param(False, None, id="no-mask"),
    pytest.param(True, None, id="causal"),
    pytest.param(False, [5, 3], id="key-padding"),
    pytest.param(True, [6, 4], id="causal+key-padding"),
]


@pytest.mark.parametrize(("causal", "lengths"), MASK_CASES)
def test_sdpa_torch_matches_torch_reference(causal, lengths):
    q, k, v = _randn(2, 3, 6, 8, seed=1), _randn(2, 3, 6, 8, seed=2), _randn(2, 3, 6, 5, seed=3)
    pad = None if lengths is None else _padding(2, 6, lengths)[:, None, :]  # broadcast over heads
    ours = sdpa_torch(q, k, v, causal=causal, key_padding_mask=pad)
    attn_mask = None
    if pad is not None:
        attn_mask = ~pad[..., None, :]  # torch: True = may attend
        if causal:
            attn_mask = attn_mask & torch.ones(6, 6, dtype=torch.bool).tril()
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=causal and pad is None)
    torch.testing.assert_close(ours, ref, atol=FLOAT64_TOL, rtol=FLOAT64_TOL)


@pytest.mark.parametrize(("causal", "lengths"), MASK_CASES)
def test_sdpa_numpy_matches_torch_reference(causal, lengths):
    q, k, v = _randn(2, 6, 4, seed=4), _randn(2, 6, 4, seed=5), _randn(2, 6, 3, seed=6)
    pad = None if lengths is None else _padding(2, 6, lengths)
    ours = sdpa_numpy(
        q.numpy(), k.numpy(), v.numpy(), causal=causal, key_padding_mask=None if pad is None else pad.numpy()
    )
    ref = sdpa_torch(q, k, v, causal=causal, key_padding_mask=pad)
    np.testing.assert_allclose(ours, ref.numpy(), atol=FLOAT64_TOL, rtol=FLOAT64_TOL)
    if pad is None:
        sdpa_ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        np.testing.assert_allclose(ours, sdpa_ref.numpy(), atol=FLOAT64_TOL, rtol=FLOAT64_TOL)


def test_cross_attention_with_different_lengths_and_custom_scale():
    q, k, v = _randn(3, 4, seed=7), _randn(7, 4, seed=8), _randn(7, 2, seed=9)
    ref = F.scaled_dot_product_attention(q[None], k[None], v[None], scale=0.3)[0]
    torch.testing.assert_close(sdpa_torch(q, k, v, scale=0.3), ref, atol=FLOAT64_TOL, rtol=FLOAT64_TOL)


def test_causal_cross_attention_is_top_left_aligned_like_torch():
    q, k, v = _randn(4, 3, seed=14), _randn(6, 3, seed=15), _randn(6, 2, seed=16)
    ref = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True)[0]
    torch.testing.assert_close(sdpa_torch(q, k, v, causal=True), ref, atol=FLOAT64_TOL, rtol=FLOAT64_TOL)


def test_float32_inputs_match_torch_reference():
    q, k, v = (_randn(2, 5, 4, seed=s).float() for s in (17, 18, 19))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(sdpa_torch(q, k, v, causal=True), ref)  # float32 default tolerances


def test_pattern_rows_sum_to_one_and_masked_entries_are_exactly_zero():
    q, k = _randn(2, 5, 4, seed=10), _randn(2, 5, 4, seed=11)
    pad = _padding(2, 5, [5, 2])
    a = pattern_torch(q, k, causal=True, key_padding_mask=pad)
    torch.testing.assert_close(a.sum(-1), torch.ones(2, 5, dtype=torch.float64), atol=FLOAT64_TOL, rtol=0)
    assert (a.triu(1) == 0).all()  # causal: nothing above the diagonal
    assert (a[1, :, 2:] == 0).all()  # the padded keys of sequence 1
    a_np = pattern_numpy(q.numpy(), k.numpy(), causal=True, key_padding_mask=pad.numpy())
    assert (a_np[1, :, 2:] == 0).all()


def test_seed_002_ex_13_11_identity_inputs():
    """Q = K = V = I_2, d_k = 2: each row is softmax((1, 0) / sqrt 2) in its own order."""
    eye = torch.eye(2, dtype=torch.float64)
    e = np.exp(1 / np.sqrt(2))
    big, small = e / (e + 1), 1 / (e + 1)  # 0.6698, 0.3302
    expected = torch.tensor([[big, small], [small, big]], dtype=torch.float64)
    torch.testing.assert_close(sdpa_torch(eye, eye, eye), expected, atol=FLOAT64_TOL, rtol=0)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        pytest.param(lambda: sdpa_torch(_randn(3, 4), _randn(3, 5), _randn(3, 2)), "d_k", id="d_k-mismatch"),
        pytest.param(lambda: sdpa_torch(_randn(3, 4), _randn(3, 4), _randn(5, 2)), "n_k", id="n_k-mismatch"),
        pytest.param(lambda: sdpa_numpy(np.ones((3, 4)), np.ones((3, 5)), np.ones((3, 2))), "d_k", id="numpy-d_k"),
        pytest.param(
            lambda: sdpa_torch(torch.ones(3, 4, dtype=torch.int64), _randn(3, 4), _randn(3, 2)),
            "floating-point",
            id="int-dtype",
        ),
        pytest.param(
            lambda: sdpa_torch(_randn(3, 4).float(), _randn(3, 4), _randn(3, 2)), "dtypes differ", id="dtype-mix"
        ),
        pytest.param(
            lambda: multi_head_attention(_randn(1, 3, 8).float(), *_weights(2, 2, 8, 4)),
            "dtypes differ",
            id="mha-dtype-mix",
        ),
        pytest.param(
            lambda: sdpa_torch(torch.full((3, 4), float("nan")), _randn(3, 4).float(), _randn(3, 2).float()),
            "NaN",
            id="nan-input",
        ),
        pytest.param(
            lambda: sdpa_torch(_randn(3, 4), _randn(3, 4), _randn(3, 2), key_padding_mask=torch.ones(3)),
            "boolean",
            id="float-padding-mask",
        ),
        pytest.param(
            lambda: sdpa_torch(_randn(3, 4), _randn(3, 4), _randn(3, 2), key_padding_mask=torch.ones(3).bool()),
            "every key masked",
            id="fully-masked-row",
        ),
        pytest.param(
            lambda: sdpa_numpy(np.ones((3, 4)), np.ones((3, 4)), np.ones((3, 2)), key_padding_mask=np.ones(3, bool)),
            "every key masked",
            id="numpy-fully-masked-row",
        ),
    ],
)
def test_bad_input_raises(make, match):
    with pytest.raises(CircuitkitError, match=match):
        make()


# ------------------------------------------------------------------------------------------ multi-head
def _weights(n_heads: int, n_kv: int, d_model: int, d_head: int, seed: int = 0):
    return (
        _randn(n_heads, d_model, d_head, seed=seed) / d_model**0.5,
        _randn(n_kv, d_model, d_head, seed=seed + 1) / d_model**0.5,
        _randn(n_kv, d_model, d_head, seed=seed + 2) / d_model**0.5,
        _randn(n_heads, d_head, d_model, seed=seed + 3) / (n_heads * d_head) ** 0.5,
    )


def _torch_mha(W_Q, W_K, W_V, W_O) -> torch.nn.MultiheadAttention:
    """nn.MultiheadAttention (column convention: y = x @ W.T) carrying our per-head weights; K/V groups are
    expanded to one copy per query head (head h reads group h // group_size)."""
    n_heads, d_model, d_head = W_Q.shape
    group = n_heads // W_K.shape[0]
    W_K, W_V = W_K.repeat_interleave(group, dim=0), W_V.repeat_interleave(group, dim=0)
    mha = torch.nn.MultiheadAttention(d_model, n_heads, bias=False, batch_first=True).double()

    def packed(w):  # [head, d_model, d_head] -> [(head d_head), d_model]
        return w.permute(0, 2, 1).reshape(n_heads * d_head, d_model)

    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([packed(W_Q), packed(W_K), packed(W_V)]))
        mha.out_proj.weight.copy_(W_O.reshape(n_heads * d_head, d_model).T)
    return mha


@pytest.mark.parametrize(
    ("n_heads", "n_kv"), [pytest.param(4, 4, id="MHA"), pytest.param(4, 2, id="GQA"), pytest.param(4, 1, id="MQA")]
)
@pytest.mark.parametrize(("causal", "lengths"), MASK_CASES)
def test_multi_head_attention_matches_nn_multihead_attention(n_heads, n_kv, causal, lengths):
    d_model, d_head, pos = 16, 4, 6
    W_Q, W_K, W_V, W_O = _weights(n_heads, n_kv, d_model, d_head)
    x = _randn(2, pos, d_model, seed=20)
    pad = None if lengths is None else _padding(2, pos, lengths)
    ours = multi_head_attention(x, W_Q, W_K, W_V, W_O, causal=causal, key_padding_mask=pad)
    attn_mask = torch.ones(pos, pos, dtype=torch.bool).triu(1) if causal else None  # nn.MHA: True = blocked
    with torch.no_grad():
        ref, _ = _torch_mha(W_Q, W_K, W_V, W_O)(x, x, x, key_padding_mask=pad, attn_mask=attn_mask, need_weights=False)
    torch.testing.assert_close(ours, ref, atol=FLOAT64_TOL, rtol=FLOAT64_TOL)


def test_grouped_query_attention_matches_sdpa_enable_gqa():
    W_Q, W_K, W_V, W_O = _weights(6, 2, 12, 4, seed=3)
    x = _randn(1, 5, 12, seed=21)
    q = torch.einsum("bpm,hmd->bhpd", x, W_Q)
    k = torch.einsum("bpm,gmd->bgpd", x, W_K)
    v = torch.einsum("bpm,gmd->bgpd", x, W_V)
    z = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    ref = torch.einsum("bhpd,hdm->bpm", z, W_O)
    torch.testing.assert_close(multi_head_attention(x, W_Q, W_K, W_V, W_O, causal=True), ref, atol=FLOAT64_TOL, rtol=0)


def test_split_and_merge_heads_round_trip_and_order():
    x = _randn(2, 3, 12, seed=22)
    heads = split_heads(x, 4)
    assert heads.shape == (2, 4, 3, 3)
    torch.testing.assert_close(heads[:, 1], x[..., 3:6], atol=0, rtol=0)  # head 1 owns columns 3..5
    torch.testing.assert_close(merge_heads(heads), x, atol=0, rtol=0)
    with pytest.raises(CircuitkitError, match="not divisible"):
        split_heads(x, 5)


@pytest.mark.parametrize(
    ("n_heads", "n_kv"), [pytest.param(4, 4, id="MHA"), pytest.param(4, 2, id="GQA"), pytest.param(4, 1, id="MQA")]
)
def test_kv_cache_decoding_equals_causal_attention_and_cache_size_matches_formula(n_heads, n_kv):
    d_model, d_head, batch, pos = 16, 4, 2, 7
    W_Q, W_K, W_V, W_O = _weights(n_heads, n_kv, d_model, d_head, seed=5)
    x = _randn(batch, pos, d_model, seed=23)
    run = decode_with_kv_cache(x, W_Q, W_K, W_V, W_O)
    full = multi_head_attention(x, W_Q, W_K, W_V, W_O, causal=True)
    torch.testing.assert_close(run.output, full, atol=FLOAT64_TOL, rtol=0)
    assert run.cache_bytes == kv_cache_bytes(1, n_kv, d_head, pos, x.element_size(), batch=batch)


def test_multi_query_cache_is_n_heads_times_smaller():
    x = _randn(1, 5, 24, seed=24)
    mha = decode_with_kv_cache(x, *_weights(12, 12, 24, 2, seed=6))
    mqa = decode_with_kv_cache(x, *_weights(12, 1, 24, 2, seed=6))
    assert mha.cache_bytes == 12 * mqa.cache_bytes


@pytest.mark.parametrize(
    ("shapes", "match"),
    [
        pytest.param(((4, 16, 4), (3, 16, 4), (3, 16, 4), (4, 4, 16)), "divide", id="kv-heads-not-divisor"),
        pytest.param(((4, 16, 4), (2, 16, 4), (2, 16, 5), (4, 4, 16)), "W_K has shape", id="W_V-shape"),
        pytest.param(((4, 16, 4), (2, 16, 4), (2, 16, 4), (4, 4, 15)), "W_O has shape", id="W_O-shape"),
        pytest.param(((4, 15, 4), (2, 15, 4), (2, 15, 4), (4, 4, 15)), "d_model", id="x-d_model"),
    ],
)
def test_multi_head_attention_rejects_mismatched_weights(shapes, match):
    x = _randn(1, 3, 16)
    W = [_randn(*s, seed=i) for i, s in enumerate(shapes)]
    with pytest.raises(CircuitkitError, match=match):
        multi_head_attention(x, *W)
