"""``viz.notebook_figures``: a notebook asks for a PNG of each plotly figure only where kaleido can draw one, so a
machine without a Chromium shows interactive figures instead of failing at the first one."""

from __future__ import annotations

import plotly.graph_objects as go
import plotly.io as pio
import pytest

from circuitkit.errors import CircuitkitError
from circuitkit.viz import notebook, notebook_figures


@pytest.fixture(autouse=True)
def _renderer_kept():
    before = pio.renderers.default
    yield
    pio.renderers.default = before


def test_without_a_browser_figures_stay_interactive_and_say_so(monkeypatch, capsys):
    monkeypatch.setattr(notebook, "_png_browser", lambda: None)
    assert notebook_figures() == "plotly_mimetype" == pio.renderers.default
    assert "interactive only" in capsys.readouterr().out
    bundle = go.Figure(go.Bar(y=[1, 2]))._repr_mimebundle_()  # what Jupyter asks for: no PNG, no error
    assert "application/vnd.plotly.v1+json" in bundle and "image/png" not in bundle


def test_with_a_browser_each_figure_also_comes_as_a_png(monkeypatch, capsys):
    monkeypatch.setattr(notebook, "_png_browser", lambda: "/usr/bin/chromium")
    assert notebook_figures() == "plotly_mimetype+png" == pio.renderers.default
    assert capsys.readouterr().out == ""


def test_png_false_asks_for_none_and_says_nothing(monkeypatch, capsys):
    monkeypatch.setattr(notebook, "_png_browser", lambda: pytest.fail("no browser is looked for"))
    assert notebook_figures(png=False) == "plotly_mimetype"
    assert capsys.readouterr().out == ""


def test_the_browser_is_kaleidos_own_search(monkeypatch):
    """The search is choreographer's (kaleido's): a path it would find is the answer; none found is None."""
    from choreographer.browsers.chromium import Chromium

    monkeypatch.setattr(Chromium, "find_browser", classmethod(lambda cls, **kw: "/opt/chrome"))
    assert notebook._png_browser() == "/opt/chrome"
    monkeypatch.setattr(Chromium, "find_browser", classmethod(lambda cls, **kw: None))
    assert notebook._png_browser() is None


@pytest.mark.parametrize("png", [1, "yes", None])
def test_png_must_be_a_bool(png):
    with pytest.raises(CircuitkitError, match="notebook_figures: png"):
        notebook_figures(png)
