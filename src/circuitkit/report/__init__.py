"""The report of a scan: ``report.html`` (one self-contained file that opens offline) and ``scores.json``.

Rooms:

- :mod:`~circuitkit.report.data`: the scan as plain data (``scores.json``, :func:`scan_json`) and the page's
  compact data (quantised blobs);
- :mod:`~circuitkit.report.summary`: the answer first (the circuit found, in sentences with the figures);
- :mod:`~circuitkit.report.figures`: report-only SVG figures (circuit diagram, head graphs, loss curve);
- :mod:`~circuitkit.report.sections`: the page's sections, a list of builders (:data:`SECTIONS`): a new
  section is one function appended there;
- :mod:`~circuitkit.report.page`: the HTML page and escaping (:func:`build_report`), the notebook summary
  (:func:`summary_html`); the page script and stylesheet are package assets (``assets/report.js``,
  ``assets/report.css``);
- :mod:`~circuitkit.report.saving`: writing report + scores together or not at all (:func:`save`);
- :mod:`~circuitkit.report.png`: PNG export with headless Chromium (:func:`export_pngs`).
"""

from __future__ import annotations

from circuitkit.report.data import page_data, scan_json
from circuitkit.report.page import GZIP_MIME, MAX_REPORT_BYTES, build_report, summary_html
from circuitkit.report.png import CHROMIUM_FLAGS, export_pngs, find_chromium
from circuitkit.report.saving import save
from circuitkit.report.sections import SECTIONS, Section

__all__ = [
    "CHROMIUM_FLAGS",
    "GZIP_MIME",
    "MAX_REPORT_BYTES",
    "SECTIONS",
    "Section",
    "build_report",
    "export_pngs",
    "find_chromium",
    "page_data",
    "save",
    "scan_json",
    "summary_html",
]
