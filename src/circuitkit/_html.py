"""The two escapes every page circuitkit writes relies on, in one place.

Why one home: the report's sections, figures and summary and the attention views each escaped text on their own,
and the report and the views each had a ``script_json`` with a different set of escaped characters (one missed the
JavaScript line separators U+2028/U+2029). A fix to one copy did not reach the others.

- :func:`escape`: text for HTML element content and attribute values (``&``, ``<``, ``>``, ``"``, ``'``).
- :func:`script_json`: JSON to embed in a ``<script>`` element: strict (no NaN/Infinity), compact, ASCII only (so
  it reads the same whatever charset the page is decoded with: a CircuitsVis view declares none), and with
  ``<``, ``>``, ``&``, U+2028 and U+2029 written as ``\\uXXXX`` escapes, which ``JSON.parse`` and JavaScript read
  back unchanged, so no value can close the script (``</script>``), open a comment (``<!--``) or end a
  JavaScript string literal.
"""

from __future__ import annotations

import html
import json
from typing import Any

SCRIPT_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
"""Characters that must not appear literally in JSON inside ``<script>``, and their JSON escapes."""

__all__ = ["SCRIPT_ESCAPES", "escape", "script_json"]


def escape(text: Any) -> str:
    """``str(text)`` escaped for HTML text and attribute values (quotes included)."""
    return html.escape(str(text), quote=True)


def script_json(value: Any) -> str:
    """``value`` as compact strict JSON that is safe inside an HTML ``<script>`` (see the module docstring)."""
    text = json.dumps(value, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
    for char, escaped in SCRIPT_ESCAPES.items():
        text = text.replace(char, escaped)
    return text
