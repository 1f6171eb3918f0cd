"""Rank collapse in a pure-attention stack (seed 000 task 2.3 and ex. 1.7; Dong et al. 2021).

Without residual connections or MLPs, every layer multiplies the token matrix on the left by a row-stochastic
attention matrix, which averages tokens together. Repeated averaging drives ``H`` towards ``1 v^T`` (every
token the same vector): all singular values but the first vanish relative to it, doubly exponentially in depth.

Row convention: ``H^(l) [n_tokens, d_model]``,
``H^(l+1) = concat_h softmax(H W_Q^h (H W_K^h)^T / sqrt(d_head)) H W_V^h @ W_O`` with Gaussian weights of
variance ``1 / d_model`` (``1 / (n_heads d_head)`` for ``W_O``). Everything is float64.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float
from torch import Tensor

from circuitkit import validate
from circuitkit.theory._validate import MAX_LAYERS, positive_int, size
from circuitkit.theory.attention import sdpa_torch

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = ["DEFAULT_PLOT_LAYERS", "RankCollapse", "rank_collapse"]

DEFAULT_PLOT_LAYERS = (1, 10, 25, 50)
"""Layers plotted by default (those that exist), the depths the exercise asks about."""


@dataclass(frozen=True)
class RankCollapse:
    """Singular values of the activations of every layer (index 0 = the input) and a figure of them.

    ``singular_values[l]`` are those of ``H^(l)``, descending. ``residual[l] = ||H - 1 mean(H)||_F / ||H||_F``,
    the relative distance of layer ``l`` from the nearest rank-one "all tokens equal" matrix.
    ``figure`` plots ``sigma_i / sigma_1`` on a log axis for the layers in ``plot_layers``.
    """

    singular_values: Float[Tensor, "layer_plus_one k"]
    residual: Float[Tensor, " layer_plus_one"]
    plot_layers: tuple[int, ...]
    figure: go.Figure

    @property
    def normalized(self) -> Float[Tensor, "layer_plus_one k"]:
        """``sigma_i / sigma_1`` per layer (0 for a layer whose activations are all zero)."""
        return _ratios(self.singular_values)

    def second_to_first(self, layer: int) -> float:
        """``sigma_2 / sigma_1`` at ``layer`` (0 for a rank-one matrix)."""
        return float(self.normalized[layer, 1]) if self.singular_values.shape[1] > 1 else 0.0


def _ratios(sv: Tensor) -> Tensor:
    top = sv[:, :1]
    return torch.where(top > 0, sv / top.where(top > 0, 1.0), 0.0)


def _forward(h: Tensor, n_layers: int, n_heads: int, d_head: int, g: torch.Generator) -> list[Tensor]:
    d_model = h.shape[1]
    acts = [h]
    for _ in range(n_layers):
        W_Q, W_K, W_V = (torch.randn(n_heads, d_model, d_head, generator=g, dtype=torch.float64) for _ in range(3))
        W_O = torch.randn(n_heads * d_head, d_model, generator=g, dtype=torch.float64)
        W_Q, W_K, W_V = (w / math.sqrt(d_model) for w in (W_Q, W_K, W_V))
        W_O = W_O / math.sqrt(n_heads * d_head)
        z = sdpa_torch(h @ W_Q, h @ W_K, h @ W_V)  # [head, n, d_head]
        h = z.transpose(0, 1).reshape(h.shape[0], n_heads * d_head) @ W_O  # no residual, no MLP
        acts.append(h)
    return acts


def _figure(normalized: Tensor, plot_layers: Sequence[int]) -> go.Figure:
    import plotly.graph_objects as go

    fig = go.Figure()
    index = list(range(1, normalized.shape[1] + 1))
    for layer in plot_layers:
        # floor at 1e-300 so exact zeros stay on a log axis
        values = normalized[layer].clamp_min(1e-300).tolist()
        fig.add_trace(go.Scatter(x=index, y=values, mode="lines+markers", name=f"layer {layer}"))
    fig.update_layout(
        title="Rank collapse: singular values of a pure-attention stack, relative to the largest",
        xaxis_title="singular value index i",
        yaxis_title="sigma_i / sigma_1",
        yaxis_type="log",
        template="plotly_white",
    )
    return fig


def rank_collapse(
    n_layers: int = 50,
    *,
    n_tokens: int = 32,
    d_model: int = 32,
    n_heads: int = 4,
    d_head: int = 8,
    plot_layers: Sequence[int] | None = None,
    seed: int = 0,
) -> RankCollapse:
    """Push a random ``[n_tokens, d_model]`` input through ``n_layers`` random attention-only layers.

    Returns the singular values per layer (``torch.linalg.svdvals``) and a figure; writes no files.
    ``plot_layers`` (indices in ``0..n_layers``, 0 = the input) defaults to layers 1, 10, 25, 50 of those that
    exist, and to ``n_layers`` itself when that is not among them (``rank_collapse(10)`` plots 1 and 10).
    A layer whose activations collapsed to exactly zero has ``normalized`` values 0 (not 0/0). ``n_layers`` is
    at most ``MAX_LAYERS``, the other sizes at most ``MAX_SIZE`` (:mod:`circuitkit.theory._validate`).
    """
    n_layers = positive_int("n_layers", n_layers, maximum=MAX_LAYERS)
    n_tokens = size("n_tokens", n_tokens, minimum=2)
    d_model = size("d_model", d_model, minimum=2)
    n_heads = size("n_heads", n_heads)
    d_head = size("d_head", d_head)
    if plot_layers is None:
        plot_layers = tuple(sorted({layer for layer in DEFAULT_PLOT_LAYERS if layer <= n_layers} | {n_layers}))
    if isinstance(plot_layers, (str, bytes)) or not isinstance(plot_layers, Sequence):
        raise validate.fail("plot_layers", plot_layers, f"a sequence of layer indices in 0..{n_layers} (0 = input)")
    plot_layers = tuple(
        validate.integer("plot_layers", layer, minimum=0, maximum=n_layers, why="0 = input") for layer in plot_layers
    )
    seed = validate.seed("seed", seed)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        h0 = torch.randn(n_tokens, d_model, generator=g, dtype=torch.float64)
        acts = torch.stack(_forward(h0, n_layers, n_heads, d_head, g))  # [layer + 1, n, d_model]
        sv = torch.linalg.svdvals(acts)
        centred = acts - acts.mean(dim=1, keepdim=True)
        residual = torch.linalg.matrix_norm(centred) / torch.linalg.matrix_norm(acts)
        norms = torch.linalg.matrix_norm(acts)
        residual = torch.where(norms > 0, residual, 0.0)
    return RankCollapse(sv, residual, plot_layers, _figure(_ratios(sv), plot_layers))
