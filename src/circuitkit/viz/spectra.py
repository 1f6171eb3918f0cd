"""Singular-value spectra of every head's QK or OV circuit, as a plotly figure.

A head's OV circuit ``W_V @ W_O`` (row convention) and QK circuit ``W_Q @ W_K.T`` have rank at most
``d_head``; their singular values (from :func:`circuitkit.singular_values`, computed on the factors) show
how many directions a head really uses: a copying or induction head often has a few large values.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import plotly.graph_objects as go
from jaxtyping import Float
from torch import Tensor

from circuitkit.ranking import head_name
from circuitkit.viz._checks import as_float_array

Scale = Literal["linear", "log"]
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
            "#bcbd22", "#17becf")


def singular_value_spectra(
    source: Float[Tensor, "layer head k"] | Any,
    circuit: Literal["QK", "OV"] = "OV",
    *,
    scale: Scale = "log",
) -> go.Figure:
    """One line per head: its circuit's singular values ``sigma_1 >= sigma_2 >= ...`` against their index.

    ``source`` is either a ``[layer, head, k]`` tensor of singular values or anything
    :func:`circuitkit.singular_values` accepts (``HeadWeights`` or a model), for which ``circuit`` is computed.
    Trace ``layer * n_heads + head`` is named ``"layer.head"`` and its ``y`` equals that head's values;
    heads of one layer share a colour and a legend group.
    """
    from circuitkit.errors import CircuitkitError

    if scale not in ("linear", "log"):
        raise CircuitkitError(f"singular_value_spectra: given scale {scale!r}; expected 'linear' or 'log'.")
    if isinstance(source, Tensor) or isinstance(source, np.ndarray):
        sigma = as_float_array(source, name="singular values", caller="singular_value_spectra", ndim=3)
    else:
        from circuitkit.factored import singular_values

        sigma = as_float_array(
            singular_values(source, circuit), name="singular values", caller="singular_value_spectra", ndim=3
        )
    if (sigma < 0).any():
        raise CircuitkitError(
            f"singular_value_spectra: given {int((sigma < 0).sum())} negative singular values; expected values "
            ">= 0 (pass circuitkit.singular_values(weights), not eigenvalues)."
        )
    n_layers, n_heads, k = sigma.shape
    index = np.arange(1, k + 1)
    figure = go.Figure()
    for layer in range(n_layers):
        colour = _PALETTE[layer % len(_PALETTE)]
        for head in range(n_heads):
            figure.add_trace(
                go.Scatter(
                    x=index,
                    y=sigma[layer, head],
                    mode="lines+markers",
                    name=head_name((layer, head)),
                    legendgroup=f"layer {layer}",
                    legendgrouptitle={"text": f"layer {layer}"} if head == 0 else None,
                    line={"color": colour, "width": 1.5},
                    marker={"size": 4},
                    hovertemplate=f"head {head_name((layer, head))}<br>sigma_%{{x}} = %{{y:.4g}}<extra></extra>",
                )
            )
    # a log axis cannot show exact zeros (rank-deficient heads); they drop off the plot, as they should
    figure.update_layout(
        title={"text": f"{circuit} circuit singular values per head"},
        xaxis={"title": {"text": "index i"}, "dtick": 1 if k <= 16 else None},
        yaxis={"title": {"text": "sigma_i"}, "type": scale},
        width=720,
        height=420,
        margin={"l": 60, "r": 20, "t": 80, "b": 50},
    )
    return figure
