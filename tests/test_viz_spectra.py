"""Spectra view: traces equal the singular values, checked against dense torch SVD of W_V W_O / W_Q W_K^T."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from circuitkit import CircuitkitError
from circuitkit.viz import singular_value_spectra
from tests.conftest import random_weights

# singular values from the factored route vs dense float64 SVD: float32 rounding, values are O(1)
SVD_ATOL = 1e-5


def test_traces_equal_the_given_singular_values_in_layer_head_order():
    sigma = torch.rand(2, 3, 4, generator=torch.Generator().manual_seed(0)).sort(-1, descending=True).values
    figure = singular_value_spectra(sigma, scale="linear")
    assert len(figure.data) == 6
    for layer in range(2):
        for head in range(3):
            trace = figure.data[layer * 3 + head]
            assert trace.name == f"{layer}.{head}"
            np.testing.assert_array_equal(np.asarray(trace.y), sigma[layer, head].double().numpy())
            assert list(trace.x) == [1, 2, 3, 4]
    assert figure.layout.yaxis.type == "linear"


@pytest.mark.parametrize("circuit", ["OV", "QK"])
def test_from_weights_matches_dense_svd(circuit):
    weights = random_weights(n_layers=2, n_heads=2, d_model=16, d_head=4, seed=3)
    figure = singular_value_spectra(weights, circuit)
    dense = (
        weights.W_V.double() @ weights.W_O.double()
        if circuit == "OV"
        else weights.W_Q.double() @ weights.W_K.double().transpose(-1, -2)
    )
    expected = torch.linalg.svdvals(dense)[..., :4]
    for layer in range(2):
        for head in range(2):
            np.testing.assert_allclose(
                np.asarray(figure.data[layer * 2 + head].y), expected[layer, head].numpy(), atol=SVD_ATOL
            )
    assert figure.layout.yaxis.type == "log"
    assert circuit in figure.layout.title.text


@pytest.mark.parametrize(
    "source, kwargs, message",
    [
        (torch.rand(2, 3), {}, "expected a tensor with 3 axes"),
        (-torch.rand(1, 1, 2), {}, "negative"),
        (torch.rand(1, 1, 2), {"scale": "ln"}, "linear' or 'log"),
    ],
    ids=["two-axes", "negative", "bad-scale"],
)
def test_rejects_bad_input(source, kwargs, message):
    with pytest.raises(CircuitkitError, match=message):
        singular_value_spectra(source, **kwargs)
