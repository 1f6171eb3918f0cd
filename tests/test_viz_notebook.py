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
    import logging

    before = pio.renderers.default
    pipe = logging.getLogger(notebook.PIPE_LOGGER)
    filters = list(pipe.filters)
    yield
    pio.renderers.default = before
    pipe.filters = filters


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


def test_the_pipes_skipped_partial_read_leaves_no_traceback_under_a_figure(monkeypatch, caplog):
    """kaleido's pipe logs a message it could not decode and skipped (a read that ended inside it) as an
    exception; with PNGs on, that one record is dropped (it would print a traceback under a figure drawn whole),
    every other record of the pipe passes, and asking twice adds one filter."""
    import logging

    logger = logging.getLogger(notebook.PIPE_LOGGER)
    monkeypatch.setattr(logger, "filters", [f for f in logger.filters if not isinstance(f, notebook._PartialReads)])
    monkeypatch.setattr(notebook, "_png_browser", lambda: "/usr/bin/chromium")
    caplog.set_level(logging.DEBUG, logger=notebook.PIPE_LOGGER)

    def logged() -> list[str]:
        try:
            raise ValueError("Unterminated string starting at: line 1 column 40")
        except ValueError:
            logger.exception("JSONError decoding message. Ignoring")
        logger.error("Error in trying to decode JSON off our read.")
        return [r.getMessage() for r in caplog.records if r.name == notebook.PIPE_LOGGER]

    assert logged() == ["JSONError decoding message. Ignoring", "Error in trying to decode JSON off our read."]
    caplog.clear()
    notebook_figures()
    notebook_figures()
    assert sum(isinstance(f, notebook._PartialReads) for f in logger.filters) == 1
    assert logged() == ["Error in trying to decode JSON off our read."]
