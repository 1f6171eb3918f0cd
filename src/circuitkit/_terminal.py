"""Text from data, for the terminal: the one escape every line the command line prints from a scan goes through.

Why one home: the terminal library (rich) reads its input as markup, so a score, role, model or edge name holding
``[bold]`` or ``[/]`` would restyle the line or raise a MarkupError, and ``:v:`` would print as an emoji (an edge
``m0->23.g1:v:`` printed as ``m0->23.g1✌``); and any terminal obeys control characters, so a name holding
``ESC [ 2 J`` would clear the screen. :func:`plain` returns a ``rich.text.Text``, which rich prints as it is (no
markup, no emoji codes), with every control character written as a visible escape (``\\x1b``); :func:`labelled`
is a ``label: rest`` line with the label in bold; :func:`visible` is the same escape as a ``str`` for a plain
stream (a pipe, a file).
"""

from __future__ import annotations

import re
from typing import Any

CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
"""C0 and C1 control characters, DEL and the Unicode line separators: shown escaped, never sent to the terminal."""

__all__ = ["labelled", "plain", "visible"]


def visible(text: Any) -> str:
    """``str(text)`` with every control character written as an escape (``"\\x1b"``, ``"\\n"``), one line."""
    return CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(text))


def plain(text: Any) -> Any:
    """``text`` as a ``rich.text.Text`` that prints exactly as written (no markup, no emoji codes, no control
    characters)."""
    from rich.text import Text

    return Text(visible(text))


def labelled(label: Any, rest: Any = "") -> Any:
    """A ``label: rest`` line as a ``rich.text.Text``, the label in bold (just the label where ``rest`` is empty);
    both parts printed as written."""
    from rich.text import Text

    if not rest:
        return plain(label)
    return Text.assemble((f"{visible(label)}:", "bold"), " ", visible(rest))
