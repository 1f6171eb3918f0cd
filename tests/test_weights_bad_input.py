"""HeadWeights, the build helpers and the theory functions named in issue 12: bad input raises CircuitkitError,
valid edge cases work."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from circuitkit import CircuitkitError, HeadWeights
from circuitkit.handbuilt import ResidualLayout, previous_token_pattern, repeated_tokens
from circuitkit.theory import pattern_numpy, pattern_torch, rank_collapse
from circuitkit.weights import as_head_weights
from tests.conftest import random_weights


def _tensors(**overrides):
    g = torch.Generator().manual_seed(0)
    base = {
        "W_Q": torch.randn(2, 2, 8, 4, generator=g),
        "W_K": torch.randn(2, 2, 8, 4, generator=g),
        "W_V": torch.randn(2, 2, 8, 4, generator=g),
        "W_O": torch.randn(2, 2, 4, 8, generator=g),
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


@pytest.mark.parametrize(
    "tensors, match",
    [
        (_tensors(W_O=None), r"missing W_O"),
        ({}, r"missing W_Q, W_K, W_V, W_O"),
        (_tensors(W_X=torch.ones(1)), r"unknown keys \['W_X'\]"),
        (_tensors(W_Q=torch.full((2, 2, 8, 4), float("nan"))), r"W_Q: .*non-finite"),
        (_tensors(W_V=torch.ones(2, 2, 8, 4, dtype=torch.int32)), r"W_V: given dtype torch.int32"),
        (_tensors(W_V=torch.ones(2, 2, 8, 4, dtype=torch.complex64)), r"W_V: given dtype torch.complex64"),
        (_tensors(W_V=torch.ones(2, 2, 8, 4, dtype=torch.bool)), r"W_V: given dtype torch.bool"),
        (_tensors(W_Q=torch.ones(2, 8, 4)), r"W_Q: .*expected 4 dimensions"),
        (_tensors(W_O=torch.ones(2, 2, 8, 4)), r"W_O: .*expected shape \(2, 2, 4, 8\)"),
        (_tensors(W_K="weights"), r"W_K: given str"),
    ],
    ids=["missing-key", "empty", "unknown-key", "nan", "int", "complex", "bool", "rank-3", "wrong-shape", "string"],
)
def test_from_tensors_rejects_bad_input(tensors, match):
    with pytest.raises(CircuitkitError, match=match):
        HeadWeights.from_tensors(tensors)


@pytest.mark.parametrize("bad", [None, 3, [1, 2], torch.ones(2)], ids=["none", "int", "list", "tensor"])
def test_from_tensors_wants_a_mapping(bad):
    with pytest.raises(CircuitkitError, match="from_tensors: tensors"):
        HeadWeights.from_tensors(bad)


def test_from_tensors_accepts_numpy_and_non_contiguous_tensors():
    tensors = _tensors()
    arrays = {name: t.numpy() for name, t in tensors.items()}
    from_numpy = HeadWeights.from_tensors(arrays)
    assert all(torch.equal(getattr(from_numpy, n), tensors[n]) for n in tensors)
    strided = HeadWeights.from_tensors({**tensors, "W_O": tensors["W_O"].mT.contiguous().mT})
    assert strided.W_O.is_contiguous() and torch.equal(strided.W_O, tensors["W_O"])


@pytest.mark.parametrize("bad", [None, torch.ones(2, 2), "gpt2", {"W_Q": torch.ones(1)}, 3.0])
def test_as_head_weights_refuses_what_is_not_weights_or_a_model(bad):
    with pytest.raises(CircuitkitError, match="caller: weights"):
        as_head_weights(bad, "caller")


@pytest.mark.parametrize("device", ["nonsense", "meta", 0, "cuda:99"])
def test_to_validates_the_device(device):
    with pytest.raises(CircuitkitError, match="HeadWeights.to: device"):
        random_weights(1, 1, 4, 2).to(device)


def test_to_refuses_a_non_float_dtype():
    with pytest.raises(CircuitkitError, match="HeadWeights.to: dtype"):
        random_weights(1, 1, 4, 2).to(dtype=torch.int64)


# ---------------------------------------------------------------------------------------------- build
def test_membership_in_a_residual_layout_never_raises():
    layout = ResidualLayout.stack(tok=3, pos=2)
    assert "tok" in layout and "x" not in layout and 3 not in layout and ["tok"] not in layout
    assert layout.get("x") is None and layout.get("tok") is layout["tok"]
    with pytest.raises(CircuitkitError, match="given 'x'"):
        layout["x"]


@pytest.mark.parametrize("n_pos", [0, -1, 2.0, True, None])
def test_previous_token_pattern_rejects_bad_sizes(n_pos):
    with pytest.raises(CircuitkitError, match="previous_token_pattern: n_pos"):
        previous_token_pattern(n_pos)


def test_previous_token_pattern_of_one_position_is_zero():
    assert torch.equal(previous_token_pattern(1), torch.zeros(1, 1))


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        ((10, -1), {}, "length"),
        ((10, 0), {}, "length"),
        ((0, 3), {}, "d_vocab"),
        ((10, 3), {"batch": 0}, "batch"),
        ((10, 3), {"seed": -1}, "seed"),
        ((10, 3), {"seed": 1.5}, "seed"),
        ((10, 3), {"distinct": "yes"}, "distinct"),
    ],
    ids=["negative-length", "zero-length", "zero-vocab", "zero-batch", "negative-seed", "float-seed", "str-flag"],
)
def test_repeated_tokens_rejects_bad_arguments(args, kwargs, match):
    with pytest.raises(CircuitkitError, match=f"repeated_tokens: {match}"):
        repeated_tokens(*args, **kwargs)


# ---------------------------------------------------------------------------------------------- theory
@pytest.mark.parametrize("scale", [float("nan"), float("inf"), "1", 1j])
def test_pattern_scale_must_be_a_finite_real(scale):
    q = torch.ones(2, 3)
    with pytest.raises(CircuitkitError, match="scale"):
        pattern_torch(q, q, scale=scale)
    with pytest.raises(CircuitkitError, match="scale"):
        pattern_numpy(q.numpy(), q.numpy(), scale=scale)


def test_pattern_torch_raises_instead_of_returning_nan():
    q = torch.full((2, 3), 1e30)
    with pytest.raises(CircuitkitError, match="NaN or infinite"):
        pattern_torch(q, q)


def test_rank_collapse_of_ten_layers_is_a_valid_call():
    result = rank_collapse(10, n_tokens=8, d_model=8, n_heads=2, d_head=4)
    assert result.plot_layers == (1, 10)
    assert result.singular_values.shape == (11, 8)
    assert bool(torch.isfinite(result.normalized).all()) and bool(torch.isfinite(result.residual).all())


@pytest.mark.parametrize("plot_layers, match", [((11,), "plot_layers"), ((1.0,), "plot_layers"), ("1", "plot_layers")])
def test_rank_collapse_rejects_layers_that_do_not_exist(plot_layers, match):
    with pytest.raises(CircuitkitError, match=match):
        rank_collapse(10, n_tokens=8, d_model=8, plot_layers=plot_layers)


def test_numpy_inputs_to_pattern_numpy_give_rows_that_sum_to_one():
    q = np.random.default_rng(0).standard_normal((3, 4))
    assert np.allclose(pattern_numpy(q, q).sum(-1), 1.0)


def test_all_finite_settles_by_the_sum_and_checks_entries_only_when_the_sum_overflows():
    """``validate.all_finite``: a NaN or inf anywhere makes it False; finite entries whose float32 sum overflows
    (3e38 twice) are still finite; half-precision sums in float32."""
    from circuitkit import validate

    x = torch.ones(1000)
    assert validate.all_finite(x) and validate.all_finite(torch.arange(3))
    for bad in (math.nan, math.inf, -math.inf):
        y = x.clone()
        y[517] = bad
        assert not validate.all_finite(y) and not validate.all_finite(y.half())
    assert validate.all_finite(torch.full((4,), 3e38)) and validate.all_finite(torch.full((100,), 60000.0).half())
    y = torch.full((4,), 3e38)
    y[2] = math.nan
    assert not validate.all_finite(y)
