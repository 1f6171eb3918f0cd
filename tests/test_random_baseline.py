"""The random baseline of composition scores: its values, caching, seeding, and its use in composition_scores."""

from __future__ import annotations

import math

import pytest
import torch

from circuitkit import CircuitkitError
from circuitkit.composition import CompositionBaseline, composition_baseline, composition_scores
from tests.conftest import random_weights

SMALL_BASELINE_ATOL = 0.03
"""At d_model 16 / d_head 4 one score has std ~0.05; the mean of 32 samples has standard error ~0.01 (3 se)."""

GPT2_BASELINE_RTOL = 0.05
"""At d_model 768 / d_head 64 the ratio-of-expectations value 1/sqrt(768) is within ~1% of the mean (measured)."""

MODEL_MEAN_ATOL = 0.02
"""A random model's 3*8*... forward-pair scores average to the baseline within ~3 standard errors."""


def test_d16_h4_baseline_is_near_a_quarter():
    baseline = composition_baseline(random_weights(2, 2, 16, 4), "Q")
    assert isinstance(baseline, CompositionBaseline)
    assert baseline.mean == pytest.approx(0.25, abs=SMALL_BASELINE_ATOL)
    assert baseline.closed_form == pytest.approx(0.25)
    assert baseline.n_samples == 32
    assert 0 < baseline.std < 0.25


def test_gpt2_small_shape_baseline_is_near_one_over_sqrt_d_model():
    baseline = composition_baseline(random_weights(2, 1, 768, 64), "V")
    assert baseline.mean == pytest.approx(1 / math.sqrt(768), rel=GPT2_BASELINE_RTOL)
    assert baseline.closed_form == pytest.approx(1 / math.sqrt(768))


@pytest.mark.parametrize("mode", ["Q", "K", "V"])
def test_baseline_is_the_mean_score_of_a_random_model(mode):
    # An independent check of the sampler: composition_scores on a Gaussian model, averaged over its pairs.
    w = random_weights(3, 8, 16, 4, seed=21)
    scores = composition_scores(w, mode)
    forward = torch.cat([scores[a, :, b, :].reshape(-1) for a in range(3) for b in range(a + 1, 3)])
    baseline = composition_baseline(w, mode, n_samples=256)
    assert float(forward.mean()) == pytest.approx(baseline.mean, abs=MODEL_MEAN_ATOL)
    assert float(forward.std()) == pytest.approx(baseline.std, rel=0.3)


def test_closed_form_only_where_it_holds():
    assert composition_baseline(random_weights(2, 2, 16, 2), "Q").closed_form is None
    assert composition_baseline(random_weights(2, 2, 16, 4), "Q").closed_form is not None


def test_cached_per_shape_and_seeded():
    w = random_weights(2, 2, 16, 4)
    first = composition_baseline(w, "K", n_samples=8, seed=3)
    assert composition_baseline(random_weights(5, 3, 16, 4, seed=9), "K", n_samples=8, seed=3) is first
    assert composition_baseline(w, "K", n_samples=8, seed=4).mean != first.mean


@pytest.mark.parametrize("mode", ["Q", "K", "V"])
def test_subtract_and_zscore_shift_forward_pairs_and_keep_backward_pairs_zero(mode):
    w = random_weights(3, 4, 16, 4, seed=22)
    raw = composition_scores(w, mode)
    reference = composition_baseline(w, mode)
    layers = torch.arange(3)
    forward = (layers[:, None, None, None] < layers[None, None, :, None]).expand(3, 4, 3, 4)
    subtracted = composition_scores(w, mode, baseline="subtract")
    zscored = composition_scores(w, mode, baseline="zscore")
    torch.testing.assert_close(subtracted[forward], raw[forward] - reference.mean)
    torch.testing.assert_close(zscored[forward], (raw[forward] - reference.mean) / reference.std)
    assert bool((subtracted[~forward] == 0).all()) and bool((zscored[~forward] == 0).all())
    assert subtracted.dtype == zscored.dtype == torch.float32


@pytest.mark.parametrize(
    "mode, kwargs",
    [("X", {}), ("Q", dict(n_samples=1)), ("Q", dict(n_samples=2.0)), ("Q", dict(seed="0"))],
    ids=["bad-mode", "one-sample", "float-samples", "string-seed"],
)
def test_bad_input_is_rejected(mode, kwargs):
    with pytest.raises(CircuitkitError):
        composition_baseline(random_weights(), mode, **kwargs)


def test_public_name_stays_the_function_after_submodules_are_imported():
    """A submodule named like a public function would replace it on the package (``ck.x`` -> module)."""
    import importlib

    import circuitkit as ck

    for module in ("circuitkit.composition", "circuitkit.random_baseline", "circuitkit.detect"):
        importlib.import_module(module)
    for name in ck.__all__:
        value = getattr(ck, name)
        if name in ck._LAZY:
            assert not isinstance(value, type(ck)), f"circuitkit.{name} is a module, expected the function/class"
