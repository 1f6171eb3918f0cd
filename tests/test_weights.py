"""HeadWeights: construction from models and tensors, validation, grouped-query views, dtype handling."""

from __future__ import annotations

import types

import pytest
import torch
from safetensors.torch import load_file, save_file

from circuitkit import CircuitkitError, HeadWeights
from tests.conftest import boot_bridge, random_weights


def _shapes(L=2, H=4, G=4, d_model=16, d_head=4):
    return {
        "W_Q": torch.randn(L, H, d_model, d_head),
        "W_K": torch.randn(L, G, d_model, d_head),
        "W_V": torch.randn(L, G, d_model, d_head),
        "W_O": torch.randn(L, H, d_head, d_model),
    }


# ---------------------------------------------------------------------- from models
def test_from_model_round_trip_bridge(tiny_bridge):
    weights = HeadWeights.from_model(tiny_bridge)
    for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O", "W_E", "W_U", "W_pos"):
        assert torch.equal(getattr(weights, name), getattr(tiny_bridge, name).detach()), name
    assert (weights.n_layers, weights.n_heads, weights.d_model, weights.d_head) == (2, 4, 32, 8)
    assert weights.d_vocab == 50
    assert not any(t.requires_grad for t in weights.tensors().values())


def test_from_model_without_embeddings(tiny_bridge):
    weights = HeadWeights.from_model(tiny_bridge, embeddings=False)
    assert weights.W_E is None and weights.W_U is None and weights.W_pos is None
    full = HeadWeights.from_model(tiny_bridge)
    for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"):
        assert torch.equal(getattr(weights, name), getattr(full, name)), name
    stripped = HeadWeights.from_model(full, embeddings=False)
    assert stripped.W_E is None and torch.equal(stripped.W_Q, full.W_Q)


def test_from_model_keeps_key_value_groups(tiny_gqa_bridge):
    weights = HeadWeights.from_model(tiny_gqa_bridge)
    assert weights.W_K.shape == (2, 2, 32, 8)  # stored once per group, not duplicated
    assert weights.group_size == 2
    assert weights.kv_index.tolist() == [0, 0, 1, 1]
    per_head = weights.per_query_head("W_K")
    assert per_head.shape == (2, 4, 32, 8)
    assert torch.equal(per_head[:, 1], weights.W_K[:, 0]) and torch.equal(per_head[:, 2], weights.W_K[:, 1])


def test_from_model_duck_typed_hooked_transformer_like():
    """Any object with W_Q/W_K/W_V/W_O and cfg.n_layers/n_heads works (e.g. TransformerLens 3.x HookedTransformer)."""
    tensors = _shapes()
    model = types.SimpleNamespace(cfg=types.SimpleNamespace(n_layers=2, n_heads=4), **tensors)
    weights = HeadWeights.from_model(model)
    assert torch.equal(weights.W_O, tensors["W_O"])
    assert weights.W_E is None


def test_from_model_checks_cfg_against_weights():
    model = types.SimpleNamespace(cfg=types.SimpleNamespace(n_layers=3, n_heads=4), **_shapes())
    with pytest.raises(CircuitkitError, match="cfg.n_layers is 3 but W_Q has 2 layers"):
        HeadWeights.from_model(model)


def test_model_with_no_attention_is_refused():
    with pytest.raises(CircuitkitError, match=r"Linear with no W_Q, W_K, W_V, W_O.*no attention"):
        HeadWeights.from_model(torch.nn.Linear(4, 4))


def test_tensors_and_safetensors_round_trip(tmp_path):
    weights = random_weights(2, 4, 16, 4, d_vocab=11, seed=0)
    path = tmp_path / "heads.safetensors"
    save_file({k: v.contiguous() for k, v in weights.tensors().items()}, str(path))
    loaded = HeadWeights.from_tensors(load_file(str(path)))
    for name, value in weights.tensors().items():
        assert torch.equal(getattr(loaded, name), value)


def test_from_tensors_rejects_unknown_keys():
    with pytest.raises(CircuitkitError, match=r"unknown keys \['W_X'\]"):
        HeadWeights.from_tensors({**_shapes(), "W_X": torch.zeros(1)})


# ---------------------------------------------------------------------- dtypes and devices
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_is_analysed_in_float32(dtype):
    tensors = {k: v.to(dtype) for k, v in _shapes().items()}
    weights = HeadWeights(**tensors)
    assert weights.dtype == torch.float32
    assert weights.source_dtype == dtype
    assert torch.equal(weights.W_Q, tensors["W_Q"].float())


def test_float64_is_kept():
    weights = HeadWeights(**{k: v.double() for k, v in _shapes().items()})
    assert weights.dtype == torch.float64


def test_to_moves_and_casts():
    weights = random_weights(1, 2, 8, 2)
    moved = weights.to("cpu", torch.float64)
    assert moved.dtype == torch.float64 and moved.device.type == "cpu"
    assert torch.equal(moved.W_O.float(), weights.W_O)
    assert weights.to("cpu") is weights and weights.to(dtype=torch.float32) is weights  # nothing to move or cast


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on the GPU machine)")
def test_to_cuda_round_trip():
    weights = random_weights(1, 2, 8, 2)
    on_gpu = weights.to("cuda")
    assert on_gpu.device.type == "cuda"
    assert torch.equal(on_gpu.to("cpu").W_Q, weights.W_Q)


def test_layers_selects_a_subset():
    weights = random_weights(3, 2, 8, 2)
    sub = weights.layers([0, 2])
    assert sub.n_layers == 2 and torch.equal(sub.W_Q[1], weights.W_Q[2])


def test_head_names_and_repr():
    weights = random_weights(2, 2, 8, 2, n_kv_heads=1)
    assert weights.head_names() == ["0.0", "0.1", "1.0", "1.1"]
    assert "kv_heads=1" in repr(weights)


# ---------------------------------------------------------------------- bad input
def test_mismatched_shapes_name_both_sides():
    tensors = _shapes()
    tensors["W_O"] = torch.randn(2, 4, 5, 16)
    expected = r"HeadWeights.W_O: given tensor of shape \(2, 4, 5, 16\).*expected shape \(2, 4, 4, 16\)"
    with pytest.raises(CircuitkitError, match=expected):
        HeadWeights(**tensors)


def test_wrong_rank_suggests_the_layer_axis():
    tensors = _shapes()
    tensors["W_Q"] = tensors["W_Q"][0]
    with pytest.raises(CircuitkitError, match=r"expected 4 dimensions.*W_Q\[None\]"):
        HeadWeights(**tensors)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_non_finite_weights_are_refused(bad):
    tensors = _shapes()
    tensors["W_V"][1, 2, 3, 0] = bad
    with pytest.raises(CircuitkitError, match=r"HeadWeights.W_V: .*1 non-finite.*first at index \[1, 2, 3, 0\]"):
        HeadWeights(**tensors)


def test_integer_weights_are_refused():
    tensors = _shapes()
    tensors["W_K"] = torch.ones(2, 4, 16, 4, dtype=torch.int64)
    with pytest.raises(CircuitkitError, match="W_K: given dtype torch.int64; expected a floating dtype"):
        HeadWeights(**tensors)


def test_query_heads_must_divide_into_groups():
    with pytest.raises(CircuitkitError, match="4 query heads and 3 key/value heads"):
        HeadWeights(**_shapes(G=3))


def test_bias_shape_is_checked():
    with pytest.raises(CircuitkitError, match=r"HeadWeights.b_O: .*expected shape \(2, 16\)"):
        HeadWeights(**_shapes(), b_O=torch.zeros(2, 4, 16))


def test_non_tensor_is_refused():
    tensors = _shapes()
    tensors["W_Q"] = tensors["W_Q"].tolist()
    with pytest.raises(CircuitkitError, match="expected a torch.Tensor"):
        HeadWeights(**tensors)


def test_embedding_width_must_match():
    with pytest.raises(CircuitkitError, match=r"W_E: .*expected shape \(d_vocab, 16\)"):
        HeadWeights(**_shapes(), W_E=torch.zeros(10, 8))


def test_per_query_head_rejects_other_names():
    with pytest.raises(CircuitkitError, match="given 'W_Q'"):
        random_weights(1, 2, 8, 2).per_query_head("W_Q")


def test_bridge_with_mlps_still_reads_heads():
    model = boot_bridge(attn_only=False, d_mlp=64, seed=3)
    weights = HeadWeights.from_model(model)
    assert weights.n_layers == 2 and torch.equal(weights.W_V, model.W_V.detach())
