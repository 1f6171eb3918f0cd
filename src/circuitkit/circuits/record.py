"""The one record of a found circuit: what every circuit answers, whichever engine found it.

A circuit is a set ``C`` of nodes kept while every other node is ablated (the induction scan: attention heads, mean
ablated by default; a task: heads, MLPs and further node types, patched from the corrupted prompts), found as the
smallest prefix of a ranking whose faithfulness reaches ``target`` (:mod:`circuitkit.circuits.curve`)::

    faithfulness(C) = (m_C - m_ablated) / (m_clean - m_ablated)
    necessity(C)    = what is lost with only C ablated     (the induction loss's rise in nats; a task's metric lost)

:class:`CircuitRecord` holds what both engines measure of it, under one name each: ``heads`` (in the order they
were added), ``faithfulness``, ``necessity``, ``target``, ``curve`` (every measured size, as
:class:`~circuitkit.circuits.curve.CurvePoint`), ``intervals`` (bootstrap intervals by figure), ``ranked_by`` (what
ordered the nodes), ``search`` (the search beyond ranking that chose them), ``random_baseline`` (random sets of the
circuit's size) and ``stability`` (the search rerun on resampled batches or pairs). Each engine's record adds its
own figures: :class:`~circuitkit.circuits.faithfulness.Circuit` the induction scan's losses, ranking, passes and
path-patched edges; :class:`~circuitkit.tasks.circuit.TaskCircuit` a task's MLPs and further nodes, the edge circuit,
CPR/CMD and the figures on the other pairs. Each scan writes its record in its own ``scores.json`` layout.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from circuitkit.circuits.curve import CurvePoint
from circuitkit.ranking import Head, head_name


@dataclass(frozen=True, eq=False, kw_only=True)
class CircuitRecord:
    """A found circuit (module docstring): the figures both engines measure, under one name each.

    ``heads``: the circuit's attention heads ``(layer, head)``, in the order they joined it; ``faithfulness`` of the
    circuit (measured, never interpolated); ``necessity``: what is lost with only the circuit ablated (None where not
    measured); ``target``: the faithfulness the search had to reach; ``curve``: every measured size;
    ``intervals``: percentile bootstrap intervals by figure (``"faithfulness"``, ``"necessity"`` and each engine's
    own), ``(lo, hi)`` or None where undefined on some resample, empty where not computed; ``ranked_by``: what
    ordered the nodes (``"joint"``: the joint path; ``"effect"``: single-head effects; ``"eap-ig"``: a task's EAP-IG
    scores; None in a task scan saved before the record said); ``search``: the
    :class:`~circuitkit.circuits.search.SearchResult` of a search beyond ranking that chose the members (None for
    the ranked circuit); ``random_baseline``: :class:`~circuitkit.circuits.baseline.RandomBaseline`, random sets of
    the circuit's size (where asked for); ``stability``: :class:`~circuitkit.circuits.stability.Stability`, the
    search rerun on resampled batches or pairs (where asked for).
    """

    heads: tuple[Head, ...]
    faithfulness: float
    necessity: float | None
    target: float
    curve: tuple[CurvePoint, ...]
    intervals: Mapping[str, Any] = field(default_factory=dict)
    ranked_by: str | None = None
    search: Any = None
    random_baseline: Any = None
    stability: Any = None

    @property
    def n_heads(self) -> int:
        """How many attention heads the circuit holds."""
        return len(self.heads)

    @property
    def members(self) -> tuple[str, ...]:
        """Every member by name, in the order they joined: heads as ``"layer.head"`` (a task's record adds its MLPs
        and further node types)."""
        return tuple(head_name(h) for h in self.heads)

    @property
    def size(self) -> int:
        """How many nodes the circuit holds, of every type."""
        return len(self.members)

    def interval(self, figure: str) -> tuple[float, float] | None:
        """The bootstrap interval of ``figure`` (``"faithfulness"``, ``"necessity"``, or another key of
        :attr:`intervals` that holds one interval), or None where it was not computed or is undefined."""
        from circuitkit import validate

        single = tuple(k for k, v in self.intervals.items() if not isinstance(v, Mapping))
        figure = validate.option(f"{type(self).__name__}.interval: figure", figure,
                                 tuple(dict.fromkeys(("faithfulness", "necessity", *single))))
        value = self.intervals.get(figure)
        return None if value is None else (float(value[0]), float(value[1]))

    def __repr__(self) -> str:
        names = ", ".join(self.members[:12]) + (", ..." if self.size > 12 else "")
        noun = "heads" if self.size == self.n_heads else "nodes"
        return (f"{type(self).__name__}({self.size} {noun} [{names}], faithfulness {self.faithfulness:.3f} "
                f"(target {self.target}){self._repr_extra()})")

    def _repr_extra(self) -> str:
        """What an engine's record adds to :meth:`__repr__` after the faithfulness (starting with ``", "``)."""
        return ""


__all__ = ["CircuitRecord"]
