"""Heatmaps of per-head and per-head-pair numbers, as plotly figures (nothing is written to disk).

- :func:`head_score_heatmap`: one ``[layer, head]`` score tensor as a layer x head grid (rows = layers,
  columns = heads, so ``figure.data[0].z[layer][head]`` is the score of head ``(layer, head)``).
- :func:`head_score_heatmaps`: one such figure per score of a :class:`~circuitkit.detect.HeadScores`-like
  mapping.
- :func:`composition_heatmap`: a ``[src_layer, src_head, dst_layer, dst_head]`` composition tensor flattened
  to a ``(src head) x (dst head)`` grid. Composition scores of random matrices are not 0, so the colour scale
  is diverging and centred on the random baseline: a neutral cell means "as composed as random weights",
  red above, blue below. Pairs that cannot compose (``src_layer >= dst_layer``) are left empty (NaN).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import plotly.colors
import plotly.graph_objects as go
from jaxtyping import Float
from torch import Tensor

from circuitkit import validate
from circuitkit.errors import CircuitkitError
from circuitkit.ranking import head_name
from circuitkit.viz._checks import as_float_array, optional_real, text

SEQUENTIAL = "Viridis"
DIVERGING = "RdBu_r"
COMPOSITION_MODES = ("", "Q", "K", "V")
"""``mode`` of :func:`composition_heatmap`: the composition kind named in the title (``""``: none)."""


def _colorscale(caller: str, value: Any) -> str:
    """A plotly named colour scale (any case, ``_r`` reverses it), e.g. ``"Viridis"``, ``"RdBu_r"``."""
    if isinstance(value, str):
        base = value.lower().removesuffix("_r")
        if base in plotly.colors.named_colorscales():
            return value
    raise validate.fail(
        f"{caller}: colorscale", value, "a plotly colour scale name such as 'Viridis' or 'RdBu_r'",
        "See plotly.colors.named_colorscales().",
    )


def head_score_heatmap(
    scores: Float[Tensor, "layer head"],
    *,
    title: str = "head score",
    zmin: float | None = None,
    zmax: float | None = None,
    colorscale: str = SEQUENTIAL,
    zmid: float | None = None,
    allow_nan: bool = False,
) -> go.Figure:
    """A layer x head heatmap of ``scores`` (row = layer, column = head).

    ``z`` holds the scores exactly (float64 copies); hovering a cell shows ``layer.head`` and the score.
    ``scores`` is a non-empty floating ``[layer, head]`` tensor (or array). NaN is refused unless ``allow_nan``:
    then it marks a score undefined for a head (e.g. the heads an ``ablation_effects(heads=...)`` left out) and
    is drawn as an empty cell. Infinities are always refused. ``zmin``, ``zmax``, ``zmid`` are finite numbers or
    ``None`` (``zmin < zmax`` when both are given); ``zmid`` centres a diverging ``colorscale`` (e.g. 0 for
    ablation loss changes); ``colorscale`` is a plotly colour scale name; ``title`` a str.
    """
    caller = "head_score_heatmap"
    allow_nan = validate.boolean(f"{caller}: allow_nan", allow_nan)
    z = as_float_array(scores, name="scores", caller=caller, ndim=2, allow_nan=allow_nan)
    title = text(f"{caller}: title", title)
    zmin = optional_real(f"{caller}: zmin", zmin)
    zmax = optional_real(f"{caller}: zmax", zmax)
    zmid = optional_real(f"{caller}: zmid", zmid)
    if zmin is not None and zmax is not None and not zmin < zmax:
        raise validate.fail(f"{caller}: zmax", zmax, f"a number above zmin={zmin}")
    colorscale = _colorscale(caller, colorscale)
    n_layers, n_heads = z.shape
    names = np.array([[head_name((layer, head)) for head in range(n_heads)] for layer in range(n_layers)])
    figure = go.Figure(
        go.Heatmap(
            z=z,
            x=list(range(n_heads)),
            y=list(range(n_layers)),
            text=names,
            colorscale=colorscale,
            zmin=zmin,
            zmax=zmax,
            zmid=zmid,
            hovertemplate="head %{text}<br>score %{z:.4f}<extra></extra>",
            colorbar={"title": {"text": title}},
        )
    )
    figure.update_layout(
        title={"text": title},
        xaxis={"title": {"text": "head"}, "dtick": 1},
        yaxis={"title": {"text": "layer"}, "dtick": 1, "autorange": "reversed"},
        width=max(360, 60 + 36 * n_heads),
        height=max(260, 120 + 36 * n_layers),
        margin={"l": 60, "r": 20, "t": 80, "b": 50},
    )
    return figure


def head_score_heatmaps(scores: Mapping[str, Float[Tensor, "layer head"]], **kwargs: Any) -> dict[str, go.Figure]:
    """One :func:`head_score_heatmap` per entry of ``scores`` (e.g. a ``HeadScores``), titled by its key."""
    if not isinstance(scores, Mapping) or not scores:
        raise CircuitkitError(
            f"head_score_heatmaps: given {type(scores).__name__}; expected a non-empty mapping "
            "score name -> [layer, head] tensor (e.g. circuitkit.head_scores(model))."
        )
    return {name: head_score_heatmap(value, title=name, **kwargs) for name, value in scores.items()}


def composition_heatmap(
    scores: Float[Tensor, "src_layer src_head dst_layer dst_head"],
    *,
    baseline: float | Any | None = None,
    mode: str = "",
) -> go.Figure:
    """Composition scores as a (source head) x (destination head) heatmap centred on the random baseline.

    Row ``l_s * n_heads + h_s`` is source head ``(l_s, h_s)``, column ``l_d * n_heads + h_d`` destination head
    ``(l_d, h_d)``; ``z[row][col] = scores[l_s, h_s, l_d, h_d]`` where ``l_s < l_d`` and NaN elsewhere.

    ``baseline``: the score random matrices of the same shapes get — a float or a
    :class:`~circuitkit.composition.CompositionBaseline` (its ``mean`` is used). It becomes the colour scale's
    neutral midpoint (``zmid``). Without it the scale is sequential. ``mode`` is one of
    :data:`COMPOSITION_MODES` (``""``, ``"Q"``, ``"K"``, ``"V"``), named in the title.
    """
    array = as_float_array(scores, name="scores", caller="composition_heatmap", ndim=4)
    mode = validate.option("composition_heatmap: mode", mode, COMPOSITION_MODES)
    n_layers, n_heads, dst_layers, dst_heads = array.shape
    if (dst_layers, dst_heads) != (n_layers, n_heads):
        raise CircuitkitError(
            f"composition_heatmap: given scores of shape {array.shape}; expected "
            "[src_layer, src_head, dst_layer, dst_head] with the same layers and heads on both sides."
        )
    mid = _baseline_value(baseline)
    src_layer = np.arange(n_layers)[:, None, None, None]
    dst_layer = np.arange(n_layers)[None, None, :, None]
    valid = np.broadcast_to(src_layer < dst_layer, array.shape)
    # float32 halves the report size; composition scores are float32 to begin with
    z = np.where(valid, array, np.nan).reshape(n_layers * n_heads, n_layers * n_heads).astype(np.float32)
    names = [head_name((layer, head)) for layer in range(n_layers) for head in range(n_heads)]
    label = f"{mode}-composition" if mode else "composition"
    title = label if mid is None else f"{label} (random baseline {mid:.3f} = white)"
    figure = go.Figure(
        go.Heatmap(
            z=z,
            x=names,
            y=names,
            colorscale=SEQUENTIAL if mid is None else DIVERGING,
            zmid=mid,
            hoverongaps=False,
            hovertemplate="%{y} -> %{x}<br>score %{z:.4f}<extra></extra>",
            colorbar={"title": {"text": "score"}},
        )
    )
    side = max(360, 120 + 14 * n_layers * n_heads)
    figure.update_layout(
        title={"text": title},
        xaxis={"title": {"text": "destination head (layer.head)"}, "type": "category"},
        yaxis={"title": {"text": "source head (layer.head)"}, "type": "category", "autorange": "reversed"},
        width=min(side + 80, 1100),
        height=min(side, 1000),
        margin={"l": 80, "r": 20, "t": 80, "b": 80},
    )
    return figure


def _baseline_value(baseline: float | Any | None) -> float | None:
    if baseline is None:
        return None
    value = getattr(baseline, "mean", baseline)
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):  # not a number, or an int beyond float64 (10**400)
        number = math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)) or not math.isfinite(
        number
    ):
        raise CircuitkitError(
            f"composition_heatmap: given baseline {baseline!r}; expected a finite float or a "
            "CompositionBaseline (circuitkit.composition_baseline(weights, mode))."
        )
    return number

