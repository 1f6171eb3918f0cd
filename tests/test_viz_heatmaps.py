"""Heatmap views: the figure's data are exactly the scores shown, laid out as documented."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
import pytest
import torch

from circuitkit import CircuitkitError
from circuitkit.viz import composition_heatmap, head_score_heatmap, head_score_heatmaps


def _scores(n_layers: int = 3, n_heads: int = 4, seed: int = 0) -> torch.Tensor:
    return torch.rand(n_layers, n_heads, generator=torch.Generator().manual_seed(seed))


def test_head_score_heatmap_z_equals_scores_row_layer_column_head():
    scores = _scores()
    figure = head_score_heatmap(scores, title="induction")
    assert isinstance(figure, go.Figure)
    (trace,) = figure.data
    np.testing.assert_array_equal(np.asarray(trace.z), scores.double().numpy())
    assert list(trace.x) == [0, 1, 2, 3] and list(trace.y) == [0, 1, 2]
    assert np.asarray(trace.text)[2, 1] == "2.1"
    assert figure.layout.title.text == "induction"


def test_undefined_scores_are_empty_cells():
    scores = torch.tensor([[0.5, float("nan")], [0.25, 1.0]])
    z = np.asarray(head_score_heatmap(scores, allow_nan=True).data[0].z)
    assert np.isnan(z[0, 1]) and z[1, 0] == 0.25
    with pytest.raises(CircuitkitError, match=r"head_score_heatmap: scores: .*expected finite numbers"):
        head_score_heatmap(scores)  # NaN only where the caller says it means "undefined"


def test_head_score_heatmaps_one_figure_per_score_name():
    scores = {"induction": _scores(seed=1), "previous_token": _scores(seed=2)}
    figures = head_score_heatmaps(scores)
    assert list(figures) == ["induction", "previous_token"]
    for name, figure in figures.items():
        np.testing.assert_array_equal(np.asarray(figure.data[0].z), scores[name].double().numpy())


@pytest.mark.parametrize(
    "bad, message",
    [
        (torch.rand(2, 3, 4), "expected a tensor with 2 axes"),
        (torch.tensor([[0.1, float("inf")]]), "non-finite"),
        (torch.ones(2, 2, dtype=torch.complex64), "real"),
    ],
    ids=["three-axes", "infinite", "complex"],
)
def test_head_score_heatmap_rejects_bad_scores(bad, message):
    with pytest.raises(CircuitkitError, match=message):
        head_score_heatmap(bad)


def _composition(n_layers: int = 3, n_heads: int = 2, seed: int = 0) -> torch.Tensor:
    scores = torch.rand(n_layers, n_heads, n_layers, n_heads, generator=torch.Generator().manual_seed(seed))
    src = torch.arange(n_layers)[:, None, None, None]
    dst = torch.arange(n_layers)[None, None, :, None]
    return torch.where(src < dst, scores, torch.zeros(()))


def test_composition_heatmap_cells_equal_scores_and_invalid_pairs_are_empty():
    scores = _composition()
    figure = composition_heatmap(scores, baseline=0.25, mode="K")
    z = np.asarray(figure.data[0].z, dtype=np.float64)
    n_layers, n_heads = scores.shape[:2]
    for ls in range(n_layers):
        for hs in range(n_heads):
            for ld in range(n_layers):
                for hd in range(n_heads):
                    cell = z[ls * n_heads + hs, ld * n_heads + hd]
                    if ls < ld:
                        assert cell == scores[ls, hs, ld, hd].item()
                    else:
                        assert np.isnan(cell)
    assert list(figure.data[0].x)[3] == "1.1" and list(figure.data[0].y)[0] == "0.0"


def test_composition_heatmap_centres_diverging_scale_on_the_baseline():
    @dataclass(frozen=True)
    class Baseline:  # the shape of circuitkit.composition.CompositionBaseline
        mean: float
        std: float

    figure = composition_heatmap(_composition(), baseline=Baseline(mean=0.31, std=0.02), mode="Q")
    trace = figure.data[0]
    assert trace.zmid == pytest.approx(0.31)
    # the scale's midpoint colour is the neutral one: RdBu's middle is white-ish, not a hue
    middle = trace.colorscale[len(trace.colorscale) // 2][1]
    rgb = [int(c) for c in middle[middle.index("(") + 1 : -1].split(",")]
    assert min(rgb) > 230, middle
    assert "0.310" in figure.layout.title.text


def test_composition_heatmap_without_baseline_is_sequential():
    trace = composition_heatmap(_composition()).data[0]
    assert trace.zmid is None


@pytest.mark.parametrize(
    "scores, baseline, message",
    [
        (torch.rand(2, 3, 3, 3), 0.2, "same layers and heads"),
        (torch.rand(2, 3, 2), 0.2, "expected a tensor with 4 axes"),
        (torch.rand(2, 2, 2, 2), float("nan"), "finite float"),
        (torch.rand(2, 2, 2, 2), "0.2", "finite float"),
    ],
    ids=["mismatched-sides", "three-axes", "nan-baseline", "string-baseline"],
)
def test_composition_heatmap_rejects_bad_input(scores, baseline, message):
    with pytest.raises(CircuitkitError, match=message):
        composition_heatmap(scores, baseline=baseline)


def test_composition_heatmap_of_circuitkit_scores_and_baseline():
    from circuitkit.composition import composition_baseline, composition_scores
    from tests.conftest import random_weights

    weights = random_weights(n_layers=2, n_heads=3, d_model=16, d_head=4, seed=7)
    scores = composition_scores(weights, "V")
    baseline = composition_baseline(weights, "V")
    trace = composition_heatmap(scores, baseline=baseline, mode="V").data[0]
    z = np.asarray(trace.z, dtype=np.float32)
    np.testing.assert_array_equal(z[:3, 3:], scores[0, :, 1, :].numpy())
    assert np.isnan(z[3:, :]).all() and np.isnan(z[:3, :3]).all()
    assert trace.zmid == pytest.approx(baseline.mean)
