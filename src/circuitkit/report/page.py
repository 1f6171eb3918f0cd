"""The HTML page: one self-contained file that opens with the network off (:func:`build_report`), and the
notebook summary (:func:`summary_html`).

Layout of the file:

- ``<head>``: the stylesheet (``assets/report.css``) inline;
- the sections of :data:`circuitkit.report.sections.SECTIONS` in a main column, and a sticky side panel
  (``#ck-detail``) that shows the selected head: its attention pattern on the repeated sequence, QK/OV
  singular values, strongest incoming/outgoing composition edges;
- the page data as ``<script type="application/json" id="ck-data">`` and each binary blob (patterns,
  composition, spectra; see :mod:`circuitkit.report.data`) as a
  ``<script type="application/x-circuitkit-gzip-base64" id="ck-blob-NAME">`` (gzip, then base64; unpacked in
  the browser with ``DecompressionStream``: Chromium >= 80, Firefox >= 113, Safari >= 16.4);
  ``compress=False`` stores plain base64 (``application/x-circuitkit-base64``) instead;
- the CircuitsVis JavaScript bundle once, packed like a blob
  (``<script type="application/x-circuitkit-gzip-base64" id="ck-lib-circuitsvis">``): taken from a rendered view's
  offline ``local_src`` (:func:`circuitsvis_bundle`), so no network URL; the page script unpacks it, runs it
  and draws every attention pattern with ``CircuitsVis.render`` (the clicked head's ``AttentionPattern`` in the
  panel, the circuit's ``AttentionHeads`` near the top); if it fails to load, a plain canvas draws the panel's
  pattern and the page status says so;
- the page script (``assets/report.js``) inline, once. No network URL.

Escaping: every string from the model or the user (token strings, names) is HTML-escaped in markup, and
``<``/``>``/``&`` are written ``\\u003c``... inside JSON, so no token can close a script or inject markup;
the script writes strings with ``textContent`` only. Tokens handed to CircuitsVis are made inert first in the
page script (a zero-width WORD JOINER after each ``<`` and ``&``), as :mod:`circuitkit.viz.attention` does (some
CircuitsVis elements write tokens with ``innerHTML``; its canvases draw them as text).
The output is a pure function of the scan (no timestamps,
fixed ids, ``gzip`` with ``mtime=0``): the same scan gives the same bytes.
"""

from __future__ import annotations

import base64
import gzip
import math
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING

from circuitkit import validate
from circuitkit._html import script_json
from circuitkit.ranking import top_heads
from circuitkit.report import data, summary
from circuitkit.report.sections import SECTIONS, Section, esc

if TYPE_CHECKING:
    from circuitkit.scan_record import ScanRecord as Scan

GZIP_MIME = "application/x-circuitkit-gzip-base64"
BASE64_MIME = "application/x-circuitkit-base64"
GZIP_LEVEL = 6
"""zlib's default: level 9 takes three times as long on the composition blocks for under 1% less."""
MAX_REPORT_BYTES = 10 * 2**20
"""The size budget of report.html (a 48 x 25-head scan stays below it)."""


@cache
def asset(name: str) -> str:
    """The text of ``circuitkit/report/assets/<name>`` (shipped inside the package)."""
    return resources.files("circuitkit.report").joinpath("assets", name).read_text(encoding="utf-8")


CIRCUITSVIS_ID = "ck-lib-circuitsvis"


@cache
def circuitsvis_bundle() -> str:
    """The CircuitsVis JavaScript bundle (an IIFE defining the global ``CircuitsVis``), from the offline
    ``local_src`` of a one-token view, without its ``sourceMappingURL`` comment (a file the page cannot load)."""
    import torch

    from circuitkit.viz.attention import attention_heads, parse_rendered

    bundle = parse_rendered(attention_heads(torch.ones(1, 1, 1, device="cpu"), ["t"])).bundle
    return "\n".join(line for line in bundle.splitlines() if not line.startswith("//# sourceMappingURL"))


@cache
def packed_circuitsvis(compress: bool) -> tuple[str, str]:
    """:func:`circuitsvis_bundle` packed (MIME type, base64 text); the same bytes every time."""
    return pack(circuitsvis_bundle().encode("utf-8"), compress=compress)


def script_code(code: str) -> str:
    """JavaScript safe inside ``<script>``: ``</script`` and ``<!--`` cannot occur."""
    return code.replace("<!--", "<\\!--").replace("</script", "<\\/script").replace("</SCRIPT", "<\\/SCRIPT")


def pack(blob: bytes, *, compress: bool) -> tuple[str, str]:
    """(MIME type, base64 text) of a binary blob, gzip-compressed first when ``compress``."""
    if compress:
        return GZIP_MIME, base64.b64encode(gzip.compress(blob, compresslevel=GZIP_LEVEL, mtime=0)).decode("ascii")
    return BASE64_MIME, base64.b64encode(blob).decode("ascii")

NO_SCRIPT_STATUS = ("Without JavaScript the answer and the table of all heads read as plain text; the figures, the "
                    "attention patterns and sorting need JavaScript.")
"""The page's status line as written; the page script replaces it (drawing, then nothing or what failed)."""


def title(scan: Scan) -> str:
    return f"circuitkit report: {scan.model.name}"


def render_section(section: Section) -> str:
    png = f' data-png="{esc(section.id)}"' if section.png else ""
    note = f'<p class="note">{esc(section.note)}</p>' if section.note else ""
    return (f'<section id="ck-sec-{esc(section.id)}" class="ck-section"{png}><h2>{esc(section.title)}</h2>'
            f"{note}{section.body}</section>")


def build_report(scan: Scan, *, compress: bool = True) -> str:
    """The report of ``scan`` as one HTML string (see the module docstring for its layout)."""
    from circuitkit import __version__

    data.check_scan("build_report: scan", scan)
    compress = validate.boolean("build_report: compress", compress)
    sections = [s for s in (builder(scan) for builder in SECTIONS) if s is not None]
    nav = "".join(f'<a href="#ck-sec-{esc(s.id)}">{esc(s.title)}</a>' for s in sections)
    page_data, blobs = data.page_data(scan)
    packed = []
    for name, blob in blobs.items():
        mime, text = pack(blob, compress=compress)
        packed.append(f'<script type="{mime}" id="ck-blob-{esc(name)}">{text}</script>')
    lib_mime, lib_text = packed_circuitsvis(compress)
    packed.append(f'<script type="{lib_mime}" id="{CIRCUITSVIS_ID}">{lib_text}</script>')
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title(scan))}</title><style>{asset('report.css')}</style></head><body>\n"
        '<div class="ck-layout"><main class="ck-main">'
        f'<header><h1>{esc(title(scan))}</h1><p class="ck-model">{summary.model_line(scan)}</p>'
        f'<nav>{nav}</nav><p id="ck-status" class="note">{NO_SCRIPT_STATUS}</p></header>\n'
        + "\n".join(render_section(s) for s in sections)
        + f'\n<footer class="note">circuitkit {esc(__version__)}</footer></main>\n'
        '<aside id="ck-detail" class="ck-detail" aria-live="polite"><p class="note">Click a head (a table row, a '
        "heatmap cell, a graph node) to see its attention pattern, QK/OV spectra and strongest edges.</p></aside>"
        "</div>\n"
        f'<script type="application/json" id="ck-data">{script_json(page_data)}</script>\n'
        + "\n".join(packed)
        + f"\n<script>{script_code(asset('report.js'))}</script>\n</body></html>\n"
    )


_SUMMARY_STYLE = (
    ".ck-nb{font-family:system-ui,sans-serif;font-size:13px;line-height:1.4;max-width:900px}"
    ".ck-nb .ck-answer{display:flex;gap:16px;flex-wrap:wrap;align-items:flex-start}"
    ".ck-nb .ck-answer-text{flex:1 1 380px}.ck-nb p{margin:.3em 0}"
    ".ck-nb table{border-collapse:collapse;font-size:12px}.ck-nb td,.ck-nb th{border:1px solid #ddd;padding:1px 6px}"
)


def summary_html(scan: Scan) -> str:
    """A compact summary for notebooks (``Scan._repr_html_``): the model, the answer (sentences + diagram) and
    the top heads per score. Escaped HTML, no script, no network."""
    data.check_scan("summary_html: scan", scan)
    k = min(scan.settings.heads_per_score, 5)
    columns = data.columns(scan)
    header = "".join(f"<th>{esc(c.short)}</th>" for c in columns)
    body = []
    ranked = [[(h, v) for h, v in top_heads(c.values, k) if not math.isnan(v)] for c in columns]
    for rank in range(k):
        cells = []
        for best in ranked:
            if rank < len(best):
                (layer, head), value = best[rank]
                cells.append(f"<td>{layer}.{head} ({data.number(value, 3)})</td>")
            else:
                cells.append("<td></td>")
        body.append(f"<tr><th>{rank + 1}</th>{''.join(cells)}</tr>")
    table = f"<table><tr><th>rank</th>{header}</tr>{''.join(body)}</table>"
    return (
        f'<div class="ck-nb"><style>{_SUMMARY_STYLE}</style><p>{summary.model_line(scan)}</p>'
        f"{summary.story_html(scan)}<p><b>Top heads per score</b></p>{table}"
        "<p style=\"color:#666\">scan.save(dir) writes the full report (report.html) and scores.json.</p></div>"
    )


__all__ = [
    "BASE64_MIME",
    "CIRCUITSVIS_ID",
    "GZIP_MIME",
    "MAX_REPORT_BYTES",
    "build_report",
    "circuitsvis_bundle",
    "script_json",
    "summary_html",
]
