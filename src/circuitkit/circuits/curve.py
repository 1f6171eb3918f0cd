"""Faithfulness, the rule for when there is nothing to explain, and a point of a faithfulness curve: one definition
for the induction scan and for task circuits.

Both engines measure a set ``C`` of nodes (or edges) kept while everything else is ablated, on a figure ``m`` read
the same way on three runs: ``m_clean`` (nothing ablated), ``m_ablated`` (everything ablated or patched) and
``m_C``::

    faithfulness(C) = (m_C - m_ablated) / (m_clean - m_ablated)      1.0: C alone does what the whole model does

The ratio is the same whichever way ``m`` points: for a task's metric (higher on the clean prompts) and for the
induction scan's repeated-copies loss ``L`` (lower on the clean run) it reads ``(L_all - L_C) / (L_all - L_clean)``
with both signs flipped, which floating point does exactly.

Below some gap ``|m_clean - m_ablated|`` the ratio divides noise by noise; each engine names its smallest gap in its
figure's units (the induction scan's :data:`~circuitkit.circuits.faithfulness.MIN_GAP` nats, a task's
:data:`~circuitkit.tasks.circuit.MIN_TASK_GAP` in its metric's units) and :func:`check_gap` raises
:class:`NoBehaviour` with the engine's own words there, never a NaN.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from circuitkit.errors import CircuitkitError


def faithfulness_of(kept: float, clean: float, ablated: float) -> float:
    """``(kept - ablated) / (clean - ablated)`` (module docstring); the caller has checked the gap
    (:func:`check_gap`)."""
    return (kept - ablated) / (clean - ablated)


def has_gap(clean: float, ablated: float, minimum: float) -> bool:
    """Whether ``|clean - ablated|`` is finite and at least ``minimum``: whether faithfulness is defined."""
    gap = clean - ablated
    return math.isfinite(gap) and abs(gap) >= minimum


class NoBehaviour(CircuitkitError):
    """Ablating everything does not move the figure: there is no behaviour for a circuit to explain (a scan reports
    it instead of a circuit)."""


def check_gap(clean: float, ablated: float, minimum: float, says: Callable[[float], str]) -> None:
    """Raise :class:`NoBehaviour` with ``says(clean - ablated)`` where the gap is below ``minimum`` (or not
    finite)."""
    if not has_gap(clean, ablated, minimum):
        raise NoBehaviour(says(clean - ablated))


@dataclass(frozen=True)
class CurvePoint:
    """The top ``size`` nodes (heads, a task's nodes) or edges kept: their ``faithfulness`` and the figure ``value``
    measured with them kept (the induction scan's loss in nats, a task's mean metric in its units).

    Each scan's ``scores.json`` names the two numbers in its own words (:meth:`to_json`'s ``size_key`` and
    ``value_key``: ``n_heads`` / ``loss`` for the induction circuit, ``size`` / ``metric`` for a task's)."""

    size: int
    faithfulness: float
    value: float

    def to_json(self, size_key: str = "size", value_key: str = "metric") -> dict[str, Any]:
        return {size_key: self.size, "faithfulness": self.faithfulness, value_key: self.value}


__all__ = ["CurvePoint", "NoBehaviour", "check_gap", "faithfulness_of", "has_gap"]
