"""to_bridge: TransformerLens's own forward and cache on the bridge agree with the toy model, both ways round."""

from __future__ import annotations

import pytest
import torch

from circuitkit import CircuitkitError, HeadWeights
from circuitkit.models import AttentionOnlyModel, to_bridge
from tests.conftest import boot_bridge, random_weights

FLOAT32_TOL = 1e-5  # two float32 implementations of the same 2-3 layer forward pass

# hook_attn_scores is left out: TransformerLens 4.3's native bridge caches the pattern under that name.
COMPARED_HOOKS = ("hook_resid_pre", "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_pattern",
                  "attn.hook_z", "hook_attn_out", "hook_resid_post")


def _toy(n_kv_heads=None, seed=0) -> AttentionOnlyModel:
    w = random_weights(2, 4, 16, 4, n_kv_heads=n_kv_heads, d_vocab=13, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    G = w.n_kv_heads
    extra = {
        "W_pos": torch.randn(10, 16, generator=g) / 4,
        "b_Q": torch.randn(2, 4, 4, generator=g) / 4,
        "b_K": torch.randn(2, G, 4, generator=g) / 4,
        "b_V": torch.randn(2, G, 4, generator=g) / 4,
        "b_O": torch.randn(2, 16, generator=g) / 4,
    }
    return AttentionOnlyModel(HeadWeights(**(w.tensors() | extra)))


@pytest.mark.parametrize("n_kv_heads", [None, 2], ids=["mha", "gqa-2-groups"])
def test_bridge_forward_and_cache_match_the_toy_model(n_kv_heads):
    toy = _toy(n_kv_heads)
    bridge = to_bridge(toy)
    tokens = torch.randint(0, 13, (3, 10), generator=torch.Generator().manual_seed(2))
    toy_logits, toy_cache = toy.run_with_cache(tokens)
    with torch.no_grad():
        bridge_logits, bridge_cache = bridge.run_with_cache(tokens)
    torch.testing.assert_close(bridge_logits, toy_logits, atol=FLOAT32_TOL, rtol=FLOAT32_TOL)
    for layer in range(2):
        for hook in COMPARED_HOOKS:
            name = f"blocks.{layer}.{hook}"
            torch.testing.assert_close(bridge_cache[name], toy_cache[name], atol=FLOAT32_TOL, rtol=FLOAT32_TOL)


def test_bridge_weights_read_back_as_the_toy_weights():
    toy = _toy(n_kv_heads=2)
    back = HeadWeights.from_model(to_bridge(toy))
    for name, value in toy.head_weights().tensors().items():
        torch.testing.assert_close(getattr(back, name), value, atol=0, rtol=0, msg=name)


def test_toy_model_runs_weights_read_from_a_transformer_lens_bridge():
    bridge = boot_bridge(n_layers=2, n_heads=2, d_model=16, d_head=8, d_vocab=20, n_ctx=12,
                         normalization_type=None, seed=3)
    toy = AttentionOnlyModel(bridge)
    tokens = torch.randint(0, 20, (2, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected, cache = bridge.run_with_cache(tokens)
    got, toy_cache = toy.run_with_cache(tokens)
    torch.testing.assert_close(got, expected, atol=FLOAT32_TOL, rtol=FLOAT32_TOL)
    torch.testing.assert_close(toy_cache["pattern", 1], cache["blocks.1.attn.hook_pattern"],
                               atol=FLOAT32_TOL, rtol=FLOAT32_TOL)


def test_custom_attention_scale_is_carried_over():
    toy = AttentionOnlyModel(_toy().head_weights(), attn_scale=0.5)
    tokens = torch.arange(8)[None]
    with torch.no_grad():
        torch.testing.assert_close(to_bridge(toy)(tokens), toy(tokens), atol=FLOAT32_TOL, rtol=FLOAT32_TOL)
    assert not torch.allclose(toy(tokens), _toy()(tokens), atol=1e-3)


def test_hard_attention_and_missing_embeddings_are_refused():
    with pytest.raises(CircuitkitError, match="hard"):
        to_bridge(_toy().with_attention("hard"))
    with pytest.raises(CircuitkitError, match="no W_E and W_U"):
        to_bridge(random_weights(1, 2, 8, 4))
