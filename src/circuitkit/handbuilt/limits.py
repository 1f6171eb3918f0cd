"""Size limits of hand-built circuits, and the argument checks every ``build`` constructor shares.

Why limits: hand-built circuits are dense and small (one-hot blocks, unit bases). A width or a context length
far beyond what a person writes by hand is a typo (``2**70``), and passed on it would overflow torch's int64
sizes or try to allocate terabytes; it is refused at once with a :class:`~circuitkit.CircuitkitError` instead.
"""

from __future__ import annotations

from typing import Any

from circuitkit import validate

MAX_WIDTH = 2**14
"""Largest ``d_model``, ``d_head``, ``d_vocab`` or subspace dimension index: a full-width unit basis
``[d_model, d_model]`` is then at most 1 GiB in float32."""

MAX_POSITIONS = 2**14
"""Largest ``n_ctx`` / ``n_pos``: the dense ``[pos, pos]`` previous-token pattern is then at most 1 GiB."""

MAX_BATCH = 2**16
"""Largest batch of :func:`~circuitkit.handbuilt.repeated_tokens` (one random permutation is drawn per row)."""


def width(name: str, value: Any, *, minimum: int = 1) -> int:
    """``value`` as an int in ``[minimum, MAX_WIDTH]``."""
    return validate.integer(name, value, minimum=minimum, maximum=MAX_WIDTH, why="a hand-built circuit's width")


def optional_width(name: str, value: Any) -> int | None:
    """``None`` or :func:`width`."""
    return None if value is None else width(name, value)


def positions(name: str, value: Any, *, minimum: int = 1) -> int:
    """``value`` as an int in ``[minimum, MAX_POSITIONS]``."""
    return validate.integer(name, value, minimum=minimum, maximum=MAX_POSITIONS, why="a hand-built context length")


def text(name: str, value: Any) -> str:
    """``value`` if it is a ``str`` (names of subspaces and heads)."""
    if not isinstance(value, str):
        raise validate.fail(name, value, "a str")
    return value
