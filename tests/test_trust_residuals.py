"""The older API's residual bad inputs, one clear line each (the fuzz matrix, tests/fuzz_cases.py, now also tries
an int beyond float64 for every real argument, float32-max and float64 x 1e160 for every tensor): here the cases
with an exact answer to check, not only a refusal."""

from __future__ import annotations

import math

import pytest
import torch

from circuitkit import CircuitkitError, validate
from circuitkit.detect.scores import pattern_scores
from circuitkit.theory import layernorm_output_norm, linear_attention_gd, multi_head_attention, rope


@pytest.mark.parametrize("scale", [1e160, 1e-300, 1.0], ids=["huge", "tiny", "plain"])
def test_layernorm_output_norm_is_exact_at_any_scale(scale):
    """The closed form ``|gamma| sqrt(d)`` at every scale: layer norm (eps 0) is invariant to a row's scale, so a
    row of 1e160 (whose variance overflows float64) is no longer NaN."""
    x = torch.randn(3, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * scale
    torch.testing.assert_close(layernorm_output_norm(x, gamma=-2.5, beta=0.3),
                               torch.full((3,), 2.5 * math.sqrt(16), dtype=torch.float64))


def test_overflowing_results_are_refused():
    X = torch.full((4, 3), 3e38)
    with pytest.raises(CircuitkitError, match="linear_attention_gd.*NaN or infinite.*too large for torch.float32"):
        linear_attention_gd(X, torch.ones(4, 2), torch.ones(2, 3))
    with pytest.raises(CircuitkitError, match="layernorm_output_norm.*beyond float64"):
        layernorm_output_norm(torch.randn(2, 4), gamma=1e308)
    with pytest.raises(CircuitkitError, match="rope.*exceeds the range of torch.float32"):
        rope(torch.full((1, 3, 4), 3e38))
    x = torch.ones(1, 2, 4)
    W = torch.ones(2, 4, 2)
    with pytest.raises(CircuitkitError, match="multi_head_attention.*NaN or infinite"):
        multi_head_attention(x, W, W, W, torch.full((2, 2, 4), 3e38))


@pytest.mark.parametrize("value", [10**400, -(10**400)], ids=["plus", "minus"])
def test_an_int_beyond_float64_is_a_clear_line(value):
    with pytest.raises(CircuitkitError, match="x: given int .*expected a finite real number"):
        validate.real("x", value)


def test_pattern_scores_refuses_what_is_not_attention():
    tokens = torch.tensor([[1, 2, 3, 1, 2, 3]])
    patterns = torch.full((1, 2, 6, 6), 1 / 6).tril()
    assert set(pattern_scores(patterns, tokens))
    with pytest.raises(CircuitkitError, match="attention weights in \\[0, 1\\]"):
        pattern_scores(patterns * 3e38, tokens)
    with pytest.raises(CircuitkitError, match="attention weights in \\[0, 1\\]"):
        pattern_scores(-patterns, tokens)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32], ids=str)
def test_toy_model_reads_small_integer_token_ids_as_ids(dtype):
    """A uint8 tensor indexes as a mask in torch and an int8 one not at all: the toy model reads both as ids."""
    from circuitkit.models.toy import AttentionOnlyModel
    from tests.conftest import random_weights

    model = AttentionOnlyModel(random_weights(d_vocab=20))
    tokens = torch.randint(0, 20, (2, 6), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(model(tokens.to(dtype)), model(tokens))


def test_toy_model_refuses_a_non_finite_residual_to_resume_from():
    from circuitkit.models.toy import AttentionOnlyModel
    from tests.conftest import random_weights

    weights = random_weights(d_vocab=20)
    model = AttentionOnlyModel(weights)
    resid = torch.full((1, 4, weights.d_model), math.nan)
    with pytest.raises(CircuitkitError, match="residual stream with NaN/inf"):
        model.run_with_hooks(resid, start_at_layer=1)


@pytest.mark.parametrize("name", [[1], {"a": 1}, None, 3, "missing"], ids=["list", "dict", "None", "int", "missing"])
def test_residual_layout_lookup_is_one_line(name):
    """An unhashable name raised a bare TypeError; every name that is not the layout's is one CircuitkitError."""
    from circuitkit.handbuilt import ResidualLayout

    with pytest.raises(CircuitkitError, match="ResidualLayout: given .*expected one of \\['a', 'b'\\]"):
        ResidualLayout.stack(a=2, b=3)[name]


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int32], ids=str)
def test_a_token_batch_of_small_integer_ids_scores_as_int64(dtype):
    """induction_loss read uint8 targets out of bounds (IndexError); every score equals the int64 batch's."""
    import circuitkit as ck
    from circuitkit.detect import TokenBatch
    from circuitkit.models.toy import AttentionOnlyModel
    from tests.conftest import random_weights

    model = AttentionOnlyModel(random_weights(d_vocab=16), n_ctx=32)
    batch = ck.RepeatedTokens(batch=2, block_len=4).build(model)
    small = TokenBatch(batch.tokens.to(dtype), batch.block_len, batch.n_repeats, batch.bos)
    torch.testing.assert_close(ck.induction_loss(model, small).per_position,
                               ck.induction_loss(model, batch).per_position)
    assert all(torch.equal(a, b) for a, b in zip(ck.head_scores(model, small).values(),
                                                  ck.head_scores(model, batch).values(), strict=True))
