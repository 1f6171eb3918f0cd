"""How a notebook shows plotly figures: interactive in Jupyter, and also as a PNG where one can be drawn.

Why: a notebook viewer on the web (GitHub, nbviewer) draws no plotly JSON, so a committed notebook needs each figure
as a PNG too; plotly draws PNGs with kaleido, which drives a Chromium. On a machine without one, plotly's ``+png``
renderer raises at the first figure, so a notebook that asks for it fails there. :func:`notebook_figures` asks for
the PNG only where kaleido finds a Chromium, and otherwise says in one line how to get them.
"""

from __future__ import annotations

import logging

from circuitkit import validate

INTERACTIVE = "plotly_mimetype"
"""Plotly's renderer for Jupyter: the figure as its JSON, drawn by JupyterLab, VS Code and Colab."""

WITH_PNG = "plotly_mimetype+png"
"""The same figure and a PNG of it (drawn by kaleido in a headless Chromium)."""


def _png_browser() -> str | None:
    """The Chromium kaleido would draw PNGs with (its own download, ``$BROWSER_PATH`` or one on ``PATH``), or
    None without kaleido or a browser."""
    try:
        from choreographer.browsers.chromium import Chromium
    except ImportError:  # kaleido (and its choreographer) is an optional install: pip install circuitkit[notebooks]
        return None
    try:
        return Chromium.find_browser(skip_local=False)
    except (OSError, RuntimeError, ValueError):  # an unreadable download folder: no browser found
        return None


PIPE_LOGGER = "choreographer.channels.pipe"
"""The logger of the pipe between kaleido and its Chromium."""


class _PartialReads(logging.Filter):
    """Drops the pipe's record of a message it could not decode and skipped (``"JSONError decoding message.
    Ignoring"``, with its traceback): a read of the pipe can end inside a message, which the pipe logs and skips
    while the figure is drawn all the same, so the record would put a traceback under a figure that came out
    whole. Every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("JSONError decoding message")


def _quiet_partial_reads() -> None:
    """Put :class:`_PartialReads` on the pipe's logger, once."""
    logger = logging.getLogger(PIPE_LOGGER)
    if not any(isinstance(f, _PartialReads) for f in logger.filters):
        logger.addFilter(_PartialReads())


def notebook_figures(png: bool = True) -> str:
    """Set plotly's default renderer for this notebook and return it: figures interactive
    (:data:`INTERACTIVE`) and, with ``png`` where kaleido finds a Chromium, each also as a PNG (:data:`WITH_PNG`).
    Without a browser the figures stay interactive and one printed line says how to add the PNGs."""
    png = validate.boolean("notebook_figures: png", png)
    import plotly.io as pio

    renderer = INTERACTIVE
    if png and _png_browser() is not None:
        renderer = WITH_PNG
        _quiet_partial_reads()
    elif png:
        print("Figures are interactive only: a PNG of each needs kaleido and a Chromium "
              "(pip install 'circuitkit[notebooks]', then apt-get install chromium or run kaleido_get_chrome).")
    pio.renderers.default = renderer
    return renderer


__all__ = ["INTERACTIVE", "WITH_PNG", "notebook_figures"]
