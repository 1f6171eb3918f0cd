"""Views of circuitkit results: plotly figures and CircuitsVis HTML. Every function returns an object;
none writes files (the report, :mod:`circuitkit.report`, does that).

- :func:`head_score_heatmap`, :func:`head_score_heatmaps`: layer x head score grids.
- :func:`composition_heatmap`: head-pair composition scores, coloured around the random baseline.
- :func:`singular_value_spectra`: QK/OV singular values per head.
- :func:`composition_graph`: a layered graph of the top composition edges.
- :func:`attention_heads`, :func:`attention_patterns`: CircuitsVis attention views;
  :func:`model_patterns`, :func:`token_strings` get their inputs from a model.
- :func:`notebook_figures`: plotly's renderer for a notebook (interactive, and a PNG of each figure where a
  Chromium can draw it).
"""

from __future__ import annotations

from circuitkit._lazy import lazy_exports

_LAZY = {
    "head_score_heatmap": "circuitkit.viz.heatmaps",
    "head_score_heatmaps": "circuitkit.viz.heatmaps",
    "composition_heatmap": "circuitkit.viz.heatmaps",
    "singular_value_spectra": "circuitkit.viz.spectra",
    "composition_graph": "circuitkit.viz.graph",
    "attention_heads": "circuitkit.viz.attention",
    "attention_patterns": "circuitkit.viz.attention",
    "model_patterns": "circuitkit.viz.attention",
    "token_strings": "circuitkit.viz.attention",
    "view_props": "circuitkit.viz.attention",
    "parse_rendered": "circuitkit.viz.attention",
    "CircuitsVisView": "circuitkit.viz.attention",
    "notebook_figures": "circuitkit.viz.notebook",
}
__all__ = sorted(_LAZY)


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
