"""The head table of a scan as rows (``Scan.table()``) or a pandas DataFrame (``Scan.to_pandas()``).

One row per head, ranked like the CLI's table: ``head`` (``"layer.head"``), ``layer``, ``index``, every head score
by its full name, then ``attribution`` (estimated) and ``ablation`` (exact) loss rises in nats where the scan
computed them (None for heads not ablated exactly: NaN in the DataFrame). pandas is optional: only
:func:`to_pandas` needs it.
"""

from __future__ import annotations

import math
from typing import Any

from circuitkit import validate
from circuitkit.errors import CircuitkitError

EFFECTS = ("attribution", "ablation")


def head_table(scan: Any, sort: str | None = None) -> list[dict[str, Any]]:
    """Every head of ``scan`` as a dict (see the module docstring), largest ``sort`` value first, missing last.
    ``sort``: a head score's name, ``"attribution"`` or ``"ablation"`` (default: ``"induction"``, else the first
    score)."""
    scores = scan.head_scores
    names = list(scores)
    effects = [kind for kind in EFFECTS if getattr(scan, kind) is not None]
    columns = names + effects
    if sort is None:
        sort = "induction" if "induction" in names else names[0]
    if sort not in columns:
        raise validate.fail("Scan.table: sort", sort, f"a column of this scan: {', '.join(columns)}")
    n_layers, n_heads = scores[names[0]].shape
    rows = []
    for layer in range(n_layers):
        for head in range(n_heads):
            row: dict[str, Any] = {"head": f"{layer}.{head}", "layer": layer, "index": head}
            for name in names:
                row[name] = float(scores[name][layer, head])
            for kind in effects:
                value = float(getattr(scan, kind).effect[layer, head])
                row[kind] = None if math.isnan(value) else value
            rows.append(row)
    missing = [r for r in rows if r[sort] is None or math.isnan(r[sort])]
    return sorted((r for r in rows if r not in missing), key=lambda r: -r[sort]) + missing


def to_pandas(scan: Any, sort: str | None = None) -> Any:
    """:func:`head_table` as a ``pandas.DataFrame`` indexed by ``head``."""
    return data_frame(head_table(scan, sort), "Scan")


def data_frame(rows: list[dict[str, Any]], owner: str) -> Any:
    """Table ``rows`` (each with a ``head``) as a ``pandas.DataFrame`` indexed by ``head``; ``owner``
    (``"Scan"``, ``"TaskScan"``) names the class in the error where pandas is not installed."""
    try:
        import pandas
    except ImportError:
        raise CircuitkitError(f"{owner}.to_pandas: needs pandas, which is not installed here; expected pandas "
                              f"importable. Install it (pip install pandas) or use {owner}.table(), a list of "
                              "dicts.") from None
    return pandas.DataFrame(rows).set_index("head")
