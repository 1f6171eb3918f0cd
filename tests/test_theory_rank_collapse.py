"""Rank collapse in a pure-attention stack: measured singular values, an independent forward pass, the figure."""

from __future__ import annotations

import math

import plotly.graph_objects as go
import pytest
import torch

from circuitkit import CircuitkitError
from circuitkit.theory import rank_collapse

# float64 machine epsilon is 2.2e-16; a collapsed stack sits at that floor, so 1e-12 means "rank one".
COLLAPSED = 1e-12
FLOAT64_TOL = 1e-10  # same maths, different op order, amplified through a few layers of softmax


@pytest.fixture(scope="module")
def small():
    return rank_collapse(12, n_tokens=10, d_model=12, n_heads=2, d_head=4, plot_layers=(1, 3, 12), seed=0)


def test_singular_values_per_layer_shapes_and_order(small):
    assert small.singular_values.shape == (13, 10)  # index 0 = input, min(n_tokens, d_model) values
    assert (small.singular_values[:, :-1] >= small.singular_values[:, 1:]).all()


def test_input_is_full_rank_and_deep_layers_collapse_to_rank_one(small):
    assert small.second_to_first(0) > 0.3
    assert small.residual[0] > 0.5
    assert small.second_to_first(12) < COLLAPSED
    assert small.residual[12] < COLLAPSED
    ranks = [int(torch.linalg.matrix_rank(torch.diag(s), rtol=COLLAPSED)) for s in small.singular_values]
    assert ranks[0] == 10 and ranks[-1] == 1


def test_residual_shrinks_layer_after_layer_until_the_floor(small):
    r = small.residual
    above_floor = r > 1e-14
    assert (r[1:][above_floor[1:]] < r[:-1][above_floor[1:]]).all()


def test_singular_values_match_an_independent_forward_pass():
    """Re-draw the same weights in the same order and run the stack with plain torch ops."""
    result = rank_collapse(3, n_tokens=6, d_model=8, n_heads=2, d_head=3, plot_layers=(1, 3), seed=7)
    g = torch.Generator().manual_seed(7)
    h = torch.randn(6, 8, generator=g, dtype=torch.float64)
    sv = [torch.linalg.svdvals(h)]
    for _ in range(3):
        W_Q, W_K, W_V = (torch.randn(2, 8, 3, generator=g, dtype=torch.float64) / math.sqrt(8) for _ in range(3))
        W_O = torch.randn(6, 8, generator=g, dtype=torch.float64) / math.sqrt(6)
        heads = []
        for i in range(2):
            scores = (h @ W_Q[i]) @ (h @ W_K[i]).T / math.sqrt(3)
            heads.append(torch.softmax(scores, dim=-1) @ (h @ W_V[i]))
        h = torch.cat(heads, dim=1) @ W_O
        sv.append(torch.linalg.svdvals(h))
    torch.testing.assert_close(result.singular_values, torch.stack(sv), atol=FLOAT64_TOL, rtol=FLOAT64_TOL)


def test_figure_has_one_trace_per_plotted_layer(small):
    fig = small.figure
    assert isinstance(fig, go.Figure)
    assert [t.name for t in fig.data] == ["layer 1", "layer 3", "layer 12"]
    assert fig.layout.yaxis.type == "log"
    assert list(fig.data[0].y) == pytest.approx(small.normalized[1].tolist(), rel=1e-12)


def test_default_plots_layers_1_10_25_50():
    result = rank_collapse(n_tokens=8, d_model=8, n_heads=1, d_head=8)
    assert result.singular_values.shape[0] == 51
    assert [t.name for t in result.figure.data] == ["layer 1", "layer 10", "layer 25", "layer 50"]
    assert result.second_to_first(50) < COLLAPSED


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        pytest.param({"n_layers": 0}, "n_layers", id="zero-layers"),
        pytest.param({"n_layers": 5, "plot_layers": (1, 10)}, "plot_layers", id="plot-layer-beyond-depth"),
        pytest.param({"n_layers": 5, "plot_layers": (1,), "n_tokens": -3}, "n_tokens", id="negative-tokens"),
        pytest.param({"n_layers": 5, "plot_layers": (1,), "seed": -1}, "seed", id="negative-seed"),
    ],
)
def test_bad_input_raises(kwargs, match):
    with pytest.raises(CircuitkitError, match=match):
        rank_collapse(**kwargs)
