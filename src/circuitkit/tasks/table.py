"""A task scan's head table as rows (``TaskScan.table()``), a pandas DataFrame (``TaskScan.to_pandas()``) and the
notebook view (``TaskScan._repr_html_``).

One row per head: ``head`` (``"layer.head"``), ``layer``, ``index``, then the task's own columns: ``score`` (the
head's EAP-IG node score, in the metric's units), ``exact`` (the metric lost with the head alone patched, where
``ablate`` asked for it; None for a head not patched), ``joint`` (its share along the joint path, where that ordered
the nodes), ``dla`` (direct logit attribution, logits:
:func:`~circuitkit.graph.metrics.dla_meaning`; absent where the scan has none),
each of the task's own head scores (IOI's ``io_attention``), each registered pattern score measured on the task's
prompts, and ``in_circuit`` (the head is in the node circuit). Rows are ranked by the absolute value of the
``sort`` column (default: the column that ranked the circuit, ``joint`` or ``score``; a head that works strongly
against the behaviour ranks high too), heads without a value last. pandas is optional: only :func:`to_pandas` needs it.
"""

from __future__ import annotations

import math
from typing import Any

from circuitkit import validate
from circuitkit._html import escape

FIXED = ("head", "layer", "index")
NOTEBOOK_ROWS = 10
"""Heads the notebook view lists (the whole table is ``table()`` and the report)."""


def columns(scan: Any) -> list[tuple[str, Any]]:
    """``(name, [layer, head] tensor)`` of every numeric column, in the table's order."""
    out: list[tuple[str, Any]] = [("score", scan.scores)]
    if getattr(scan, "single_heads", None) is not None:  # each head patched alone, beside the score it checks
        out.append(("exact", scan.single_heads.exact))
    if getattr(scan, "ranking", None) is not None:
        out.append(("joint", scan.ranking["heads"]))
    if scan.dla is not None:
        out.append(("dla", scan.dla))
    out += list(scan.head_scores.items())
    out += [(name, values) for name, values in scan.pattern_scores.items() if name not in scan.head_scores]
    return out


def ranking_column(scan: Any) -> str:
    """The column that ranked the node circuit, the table's default order: ``joint`` (the joint path's shares)
    where the scan saved them, else ``score`` (EAP-IG, which ranks the nodes otherwise)."""
    return "joint" if getattr(scan, "ranking", None) is not None else "score"


def ranking_scores(scan: Any) -> tuple[Any, Any]:
    """The values of :func:`ranking_column`, ``(heads [layer, head], mlps [layer] or None)``: the joint path's
    shares where they ranked the circuit, else the EAP-IG node scores."""
    ranking = getattr(scan, "ranking", None)
    return (scan.scores, scan.scores_mlp) if ranking is None else (ranking["heads"], ranking["mlps"])


def task_table(scan: Any, sort: str | None = None) -> list[dict[str, Any]]:
    """Every head of ``scan`` as a dict (see the module docstring), largest ``|sort|`` first (by default the column
    that ranked the circuit, :func:`ranking_column`), missing last."""
    numeric = columns(scan)
    names = [name for name, _ in numeric]
    sort = ranking_column(scan) if sort is None else sort
    if sort not in names:
        raise validate.fail("TaskScan.table: sort", sort, f"a column of this scan: {', '.join(names)}")
    circuit = set(scan.circuit.heads) if scan.circuit is not None else set()
    n_layers, n_heads = scan.scores.shape
    rows = []
    for layer in range(n_layers):
        for head in range(n_heads):
            row: dict[str, Any] = {"head": f"{layer}.{head}", "layer": layer, "index": head}
            for name, values in numeric:
                value = float(values[layer, head])
                row[name] = None if math.isnan(value) else value
            row["in_circuit"] = (layer, head) in circuit
            rows.append(row)
    missing = [r for r in rows if r[sort] is None]
    return sorted((r for r in rows if r[sort] is not None), key=lambda r: -abs(r[sort])) + missing


def to_pandas(scan: Any, sort: str | None = None) -> Any:
    """:func:`task_table` as a ``pandas.DataFrame`` indexed by ``head``."""
    from circuitkit.report.table import data_frame

    return data_frame(task_table(scan, sort), "TaskScan")


def cell(value: Any) -> str:
    """A table value as the page and the notebook show it: 3 decimals, yes/blank for a flag, blank for None."""
    if isinstance(value, bool):
        return "yes" if value else ""
    if value is None:
        return ""
    return f"{value:+.3f}" if isinstance(value, float) else str(value)


def summary_html(scan: Any, rows: int = NOTEBOOK_ROWS) -> str:
    """The notebook view: the answer first (escaped plain text), then the first ``rows`` heads of :func:`task_table`.
    No script, no network."""
    table = task_table(scan)
    by = "joint" if ranking_column(scan) == "joint" else "EAP-IG score"
    keys = [k for k in table[0] if k not in ("layer", "index")]
    head = "".join(f"<th>{escape(k)}</th>" for k in keys)
    body = "".join("<tr>" + "".join(f"<td>{escape(cell(r[k]))}</td>" for k in keys) + "</tr>" for r in table[:rows])
    return ('<div class="ck-nb" style="font-family:system-ui,sans-serif;font-size:13px;max-width:1000px">'
            f'<pre style="white-space:pre-wrap">{escape(scan.answer())}</pre>'
            f"<p><b>Heads by |{by}|</b> (the first {min(rows, len(table))} of {len(table)}; "
            "scan.table() has them all)</p>"
            '<table style="border-collapse:collapse;font-size:12px">'
            f"<tr>{head}</tr>{body}</table>"
            '<p style="color:#666">scan.save(dir) writes the full report (report.html) and scores.json.</p></div>')


__all__ = ["columns", "ranking_column", "ranking_scores", "summary_html", "task_table", "to_pandas"]
