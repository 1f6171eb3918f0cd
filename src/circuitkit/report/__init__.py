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
- :mod:`~circuitkit.report.reload`: a saved scan read back (:func:`load_scan`, ``Scan.load``), checked by
  :mod:`~circuitkit.report.scores_check` first;
- :mod:`~circuitkit.report.table`: the head table as rows or a DataFrame (``Scan.table``, ``Scan.to_pandas``);
- :mod:`~circuitkit.report.png`: PNG export with headless Chromium (:func:`export_pngs`).
"""

from __future__ import annotations

from circuitkit._lazy import lazy_exports

# public name -> module that defines it (imported on first use: the CLI checks --out before torch loads)
_LAZY = {
    "page_data": "circuitkit.report.data",
    "scan_json": "circuitkit.report.data",
    "GZIP_MIME": "circuitkit.report.page",
    "MAX_REPORT_BYTES": "circuitkit.report.page",
    "build_report": "circuitkit.report.page",
    "summary_html": "circuitkit.report.page",
    "CHROMIUM_FLAGS": "circuitkit.report.png",
    "export_pngs": "circuitkit.report.png",
    "find_chromium": "circuitkit.report.png",
    "save": "circuitkit.report.saving",
    "load_scan": "circuitkit.report.reload",
    "scan_from_json": "circuitkit.report.reload",
    "head_table": "circuitkit.report.table",
    "to_pandas": "circuitkit.report.table",
    "SECTIONS": "circuitkit.report.sections",
    "Section": "circuitkit.report.sections",
}
__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
