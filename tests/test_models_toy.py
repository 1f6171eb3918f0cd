"""The attention-only toy model against an independent reference (torch's scaled_dot_product_attention),
its TransformerLens hook names and shapes, hook replacement, hard attention, causality and bad input."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from circuitkit import CircuitkitError, HeadWeights
from circuitkit.models import AttentionOnlyModel, ToyConfig
from tests.conftest import random_weights

FLOAT32_TOL = 1e-5  # float32 forward passes through 2-3 layers of d_model 16 agree to ~1e-6
SOFT_TO_HARD_TOL = 1e-6  # softmax(beta * scores), beta * (smallest top-2 gap) = 40, is one-hot up to exp(-40)


def _weights(*, n_kv_heads=None, with_bias=True, seed=0, n_ctx=12, d_vocab=11) -> HeadWeights:
    w = random_weights(3, 4, 16, 4, n_kv_heads=n_kv_heads, d_vocab=d_vocab, seed=seed)
    g = torch.Generator().manual_seed(seed + 100)
    L, H, G = w.n_layers, w.n_heads, w.n_kv_heads
    extra = {"W_pos": torch.randn(n_ctx, 16, generator=g) / 4}
    if with_bias:
        extra |= {
            "b_Q": torch.randn(L, H, 4, generator=g) / 4,
            "b_K": torch.randn(L, G, 4, generator=g) / 4,
            "b_V": torch.randn(L, G, 4, generator=g) / 4,
            "b_O": torch.randn(L, 16, generator=g) / 4,
        }
    return HeadWeights(**(w.tensors() | extra))


def _reference_logits(w: HeadWeights, tokens: torch.Tensor) -> torch.Tensor:
    """The same transformer written with torch's fused causal attention, one layer at a time."""
    resid = w.W_E[tokens] + w.W_pos[: tokens.shape[1]]
    for layer in range(w.n_layers):
        q = torch.einsum("bpm,hmd->bhpd", resid, w.W_Q[layer]) + w.b_Q[layer][None, :, None]
        k = torch.einsum("bpm,hmd->bhpd", resid, w.per_query_head("W_K")[layer]) + w.per_query_head("b_K")[layer][
            None, :, None
        ]
        v = torch.einsum("bpm,hmd->bhpd", resid, w.per_query_head("W_V")[layer]) + w.per_query_head("b_V")[layer][
            None, :, None
        ]
        z = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [batch, head, pos, d_head]
        resid = resid + torch.einsum("bhpd,hdm->bpm", z, w.W_O[layer]) + w.b_O[layer]
    return resid @ w.W_U


@pytest.mark.parametrize("n_kv_heads", [None, 2], ids=["mha", "gqa-2-groups"])
def test_soft_forward_matches_torch_scaled_dot_product_attention(n_kv_heads):
    w = _weights(n_kv_heads=n_kv_heads)
    tokens = torch.randint(0, 11, (3, 12), generator=torch.Generator().manual_seed(1))
    got = AttentionOnlyModel(w)(tokens)
    torch.testing.assert_close(got, _reference_logits(w, tokens), atol=FLOAT32_TOL, rtol=FLOAT32_TOL)


def test_config_mirrors_weights():
    model = AttentionOnlyModel(_weights(n_kv_heads=2))
    assert model.cfg == ToyConfig(
        n_layers=3, n_heads=4, d_model=16, d_head=4, d_vocab=11, n_ctx=12, n_key_value_heads=2
    )
    assert model.cfg.scale == 2.0
    assert model.head_weights().n_kv_heads == 2
    assert HeadWeights.from_model(model) is model.head_weights()
    assert model.W_K.shape == (3, 2, 16, 4) and model.W_Q.shape == (3, 4, 16, 4)


def test_cache_has_every_transformer_lens_hook_with_its_shape():
    model = AttentionOnlyModel(_weights(n_kv_heads=2))
    tokens = torch.randint(0, 11, (2, 7), generator=torch.Generator().manual_seed(2))
    logits, cache = model.run_with_cache(tokens)
    assert logits.shape == (2, 7, 11)
    assert list(cache) == model.hook_names()
    b, p, H, G, d, m = 2, 7, 4, 2, 4, 16
    expected = {"hook_embed": (b, p, m), "hook_pos_embed": (b, p, m)}
    for layer in range(3):
        a = f"blocks.{layer}.attn."
        expected |= {
            f"blocks.{layer}.hook_resid_pre": (b, p, m),
            a + "hook_q": (b, p, H, d),
            a + "hook_k": (b, p, G, d),
            a + "hook_v": (b, p, G, d),
            a + "hook_attn_scores": (b, H, p, p),
            a + "hook_pattern": (b, H, p, p),
            a + "hook_z": (b, p, H, d),
            f"blocks.{layer}.hook_attn_out": (b, p, m),
            f"blocks.{layer}.hook_resid_post": (b, p, m),
        }
    assert {name: tuple(t.shape) for name, t in cache.items()} == expected
    torch.testing.assert_close(cache["pattern", 1], cache["blocks.1.attn.hook_pattern"])
    torch.testing.assert_close(cache["resid_post", 2] @ model.W_U, logits)


def test_patterns_are_causal_and_rows_sum_to_one():
    model = AttentionOnlyModel(_weights())
    _, cache = model.run_with_cache(torch.arange(10)[None], names_filter=lambda n: "attn" in n)
    for layer in range(3):
        pattern = cache["pattern", layer]
        scores = cache["attn_scores", layer]
        future = torch.triu(torch.ones(10, 10, dtype=torch.bool), diagonal=1)
        assert bool((pattern[..., future] == 0).all())
        assert bool(torch.isneginf(scores[..., future]).all())
        torch.testing.assert_close(pattern.sum(-1), torch.ones(1, 4, 10))


@pytest.mark.parametrize("attention", ["soft", "hard"])
def test_future_tokens_do_not_change_earlier_logits(attention):
    model = AttentionOnlyModel(_weights(), attention=attention)
    a = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    b = a.clone()
    b[0, 5:] = torch.tensor([0, 10, 9])
    torch.testing.assert_close(model(a)[:, :5], model(b)[:, :5])


def test_names_filter_forms_select_the_same_hooks():
    model = AttentionOnlyModel(_weights())
    tokens = torch.arange(5)[None]
    name = "blocks.2.attn.hook_z"
    for filt in (name, [name], lambda n: n == name):
        _, cache = model.run_with_cache(tokens, names_filter=filt)
        assert list(cache) == [name]


def test_zeroing_hook_z_of_a_head_equals_zeroing_its_output_weights():
    w = _weights(with_bias=False)
    tokens = torch.randint(0, 11, (2, 9), generator=torch.Generator().manual_seed(3))

    def ablate(z, hook):
        z = z.clone()
        z[:, :, 2] = 0
        return z

    hooked = AttentionOnlyModel(w).run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_z", ablate)])
    W_O = w.W_O.clone()
    W_O[1, 2] = 0
    edited = AttentionOnlyModel(HeadWeights(**(w.tensors() | {"W_O": W_O})))(tokens)
    torch.testing.assert_close(hooked, edited, atol=FLOAT32_TOL, rtol=FLOAT32_TOL)
    assert not torch.allclose(hooked, AttentionOnlyModel(w)(tokens))


def test_hook_receives_its_name_and_a_returned_tensor_replaces_the_activation():
    model = AttentionOnlyModel(_weights())
    seen = []

    def record(tensor, hook):
        seen.append(hook.name)

    def uniform(pattern, hook):
        causal = torch.tril(torch.ones(pattern.shape[-2:]))
        return (causal / causal.sum(-1, keepdim=True)).expand_as(pattern)

    model.run_with_hooks(torch.arange(4)[None], fwd_hooks=[(lambda n: n.endswith("hook_q"), record)])
    assert seen == [f"blocks.{i}.attn.hook_q" for i in range(3)]
    _, cache = model.run_with_cache(torch.arange(4)[None])
    zeroed = AttentionOnlyModel(HeadWeights(**(model.head_weights().tensors() | {
        "W_Q": torch.zeros(3, 4, 16, 4), "b_Q": torch.zeros(3, 4, 4)})))
    torch.testing.assert_close(
        model.run_with_hooks(torch.arange(4)[None], fwd_hooks=[(lambda n: n.endswith("hook_pattern"), uniform)]),
        zeroed(torch.arange(4)[None]),
        atol=FLOAT32_TOL, rtol=FLOAT32_TOL,
    )


def test_hard_attention_is_the_limit_of_sharpened_soft_attention():
    w = _weights(with_bias=False)
    tokens = torch.randint(0, 11, (2, 10), generator=torch.Generator().manual_seed(4))
    hard = AttentionOnlyModel(w, attention="hard")
    _, hard_cache = hard.run_with_cache(tokens)
    for layer in range(3):
        scores = hard_cache["attn_scores", layer].double()
        top2 = scores[..., 1:, :].topk(2, dim=-1).values  # rows with at least two allowed keys
        beta = 40.0 / float((top2[..., 0] - top2[..., 1]).min())  # exp(-40) ~ 4e-18 off the argmax
        sharp = torch.softmax(scores * beta, dim=-1).float()
        torch.testing.assert_close(hard_cache["pattern", layer], sharp, atol=SOFT_TO_HARD_TOL, rtol=0)
        assert set(hard_cache["pattern", layer].unique().tolist()) <= {0.0, 1.0}


def test_hard_attention_shares_exact_ties_equally():
    w = _weights(with_bias=False)
    flat = HeadWeights(**(w.tensors() | {"W_Q": torch.zeros_like(w.W_Q)}))  # every allowed key scores 0
    _, cache = AttentionOnlyModel(flat, attention="hard").run_with_cache(torch.arange(6)[None])
    expected = torch.tril(torch.ones(6, 6)) / torch.arange(1, 7)[:, None]
    torch.testing.assert_close(cache["pattern", 0][0, 0], expected)


def test_residual_inputs_without_embeddings_and_no_unembedding_return_the_residual():
    w = random_weights(2, 2, 8, 4, seed=5)
    model = AttentionOnlyModel(w, n_ctx=6)
    assert model.cfg.d_vocab is None and model.cfg.n_ctx == 6
    x = torch.randn(3, 6, 8, generator=torch.Generator().manual_seed(6))
    out, cache = model.run_with_cache(x)
    torch.testing.assert_close(out, cache["blocks.1.hook_resid_post"])
    torch.testing.assert_close(cache["hook_embed"], x)
    assert "hook_pos_embed" not in cache


@pytest.mark.parametrize(
    "make_input, match",
    [
        (lambda: torch.rand(1, 5), "integer token ids"),
        (lambda: torch.tensor([[0, 11]]), r"ids in \[0, 11\)"),
        (lambda: torch.tensor([[-1, 2]]), r"ids in \[0, 11\)"),
        (lambda: torch.zeros(1, 13, dtype=torch.long), "n_ctx=12"),
        (lambda: torch.zeros(1, 2, 3, dtype=torch.long), r"\[batch, pos\]"),
        (lambda: [[1, 2]], "torch.Tensor"),
    ],
    ids=["float-tokens", "id-too-large", "negative-id", "too-long", "3d-tokens", "list"],
)
def test_bad_token_input_raises(make_input, match):
    with pytest.raises(CircuitkitError, match=match):
        AttentionOnlyModel(_weights())(make_input())


def test_bad_residual_input_and_options_raise():
    model = AttentionOnlyModel(random_weights(1, 1, 8, 4))
    with pytest.raises(CircuitkitError, match=r"\[batch, pos, 8\]"):
        model(torch.zeros(1, 3, 7))
    with pytest.raises(CircuitkitError, match="NaN"):
        model(torch.full((1, 3, 8), float("nan")))
    with pytest.raises(CircuitkitError, match="float residual"):
        model(torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(CircuitkitError, match="argmax"):
        AttentionOnlyModel(random_weights(1, 1, 8, 4), attention="argmax")
    with pytest.raises(CircuitkitError, match="n_ctx=5 but W_pos has 12"):
        AttentionOnlyModel(_weights(), n_ctx=5)
    with pytest.raises(CircuitkitError, match="unknown hook names"):
        model.run_with_cache(torch.zeros(1, 3, 8), names_filter="blocks.0.hook_pattern")
    with pytest.raises(CircuitkitError, match="expected a tensor of shape"):
        model.run_with_hooks(torch.zeros(1, 3, 8), fwd_hooks=[("blocks.0.attn.hook_z", lambda t, h: t[:, :1])])
