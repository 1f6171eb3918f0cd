"""The typed result of a scan: :class:`Scan`, the record of :mod:`circuitkit.scan_record` with the views that call
the report (``save``, ``load``, ``to_json``, ``table``, ``to_pandas``, the notebook view).

Why two modules: the report reads a scan's record, and a scan's views call the report; with both in one module the
report and the record would import each other. The record and its parts (:class:`ModelSummary`,
:class:`ScanSettings`, :class:`StageRecord`, :class:`SavedReport`) stand below the report and are named here too.
"""

from __future__ import annotations

import os
from typing import Any

from circuitkit.detect.effects import Agreement, HeadEffects
from circuitkit.scan_record import (
    LISTING_SIZES,
    UNSAVED,
    ModelSummary,
    SavedReport,
    ScanRecord,
    ScanResult,
    ScanSettings,
    StageRecord,
    summarise_model,
)


class Scan(ScanRecord, ScanResult):
    """Everything a scan measured (:class:`circuitkit.scan_record.ScanRecord`: the fields), with its views. Build
    with :func:`circuitkit.scan`; save with :meth:`save`. A :class:`~circuitkit.scan_record.ScanResult`, as a task's
    :class:`~circuitkit.tasks.TaskScan` is: the same questions under the same names."""

    def to_json(self) -> dict[str, Any]:
        """The machine-readable scan (what ``scores.json`` holds): plain numbers, NaN as null, deterministic."""
        from circuitkit.report import scan_json

        return scan_json(self)

    def save(self, out_dir: str | os.PathLike, *, png: bool = False) -> SavedReport:
        """Write ``out_dir/report.html`` and ``out_dir/scores.json`` (replaced together or not at all), and
        with ``png`` every figure as ``out_dir/png/*.png`` (needs headless Chromium)."""
        from circuitkit.report import save

        return save(self, out_dir, png=png)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Any:
        """The scan :meth:`save` wrote into ``path`` (the directory, or its ``scores.json``), read back: every
        figure ``scores.json`` holds, so ``Scan.load(dir).to_json()`` equals the saved JSON. Not saved, so empty:
        ``tokens``, ``patterns``, the full composition and spectra tensors, ``stages``. A task scan's directory
        (``circuitkit.scan(model, task=...)``) gives its :class:`~circuitkit.tasks.TaskScan` back, equal in every
        figure (:meth:`TaskScan.load <circuitkit.tasks.TaskScan.load>`)."""
        from circuitkit.report.reload import scan_from_json
        from circuitkit.tasks.reload import TASK_PREFIX, read_scores, task_scan_from_json
        from circuitkit.tasks.scan import TaskScan

        file, data = read_scores(path, "Scan.load")
        where = f"Scan.load: {str(file)!r}"
        if isinstance(data, dict) and str(data.get("format", "")).startswith(TASK_PREFIX):
            return task_scan_from_json(data, where, TaskScan)
        return scan_from_json(data, where, cls)

    def table(self, sort: str | None = None) -> list[dict[str, Any]]:
        """The head table: one dict per head (``head``, ``layer``, ``index``, every score, ``attribution``,
        ``ablation`` where computed), largest ``sort`` first (default the induction score)."""
        from circuitkit.report import head_table

        return head_table(self, sort)

    def to_pandas(self, sort: str | None = None) -> Any:
        """:meth:`table` as a ``pandas.DataFrame`` indexed by head (needs pandas; a CircuitkitError without it)."""
        from circuitkit.report import to_pandas

        return to_pandas(self, sort)

    def answer(self) -> str:
        """The answer in a few lines of plain text, as the terminal prints it after a scan and the report's answer
        box says it: the circuit and its faithfulness, the roles, the strongest exact edge effects, the loss
        (:func:`circuitkit.report.summary.answer_lines`). A task scan answers the same way
        (:meth:`TaskScan.answer <circuitkit.tasks.TaskScan.answer>`)."""
        from circuitkit.report.summary import answer_lines

        return "\n".join(answer_lines(self))

    @property
    def passes(self) -> float:
        """Forward passes of the batch the scan's stages ran (stacked copies count one each; a stage run on part of
        the batch its share); 0 for a scan read back from ``scores.json``, which keeps no stages."""
        return float(sum(s.passes for s in self.stages))

    def _repr_html_(self) -> str:
        from circuitkit.report import summary_html

        return summary_html(self)



def __getattr__(name: str) -> object:
    """``Role`` lives with the calling policy in :mod:`circuitkit.detect.roles` (read from there on first use)."""
    if name == "Role":
        from circuitkit.detect.roles import Role

        return Role
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["LISTING_SIZES", "UNSAVED", "Agreement", "HeadEffects", "ModelSummary", "SavedReport", "Scan",
           "ScanRecord", "ScanResult", "ScanSettings", "StageRecord", "summarise_model"]
