"""One record of an exactly patched edge, for both engines.

Path patching (:func:`circuitkit.path_patching`, the induction scan's patched edges) and a task's exact edge effects
(:func:`circuitkit.tasks.edge_effects`, a task scan's strongest edges) run the one exact edge pass
(:mod:`circuitkit.graph.edge_patch`) and give each edge as an :class:`EdgeEffect`:

- ``name``: the edge as the task graph names it, ``"sender->receiver"`` (``"0.1->1.3:k"``, ``"input->0.0:v"``,
  ``"m1->logits"``, ``"0.2->1.g0:k"``); :attr:`EdgeEffect.label` writes an edge between two heads as the induction
  scan's tables do (``"0.1 -> 1.3 (k)"``), and :attr:`~EdgeEffect.src`, :attr:`~EdgeEffect.dst` and
  :attr:`~EdgeEffect.channel` read its heads and input.
- ``clean``, ``patched``: the metric's mean on the clean run and with only this edge patched, as the metric reads.
- ``effect``: **the behaviour lost** when only this edge is patched, every other edge clean: positive for an edge
  that carries the behaviour. For a metric that falls as the behaviour does (a task's metrics, oriented so that more
  behaviour scores higher; the receiver's induction score) it is ``clean - patched``; for one that rises (the
  repeated-copies loss, and a callable of path patching, read as a loss) ``patched - clean``.
- ``score``: the estimate of the same quantity where one was taken (a task scan's EAP-IG score, the edge attribution
  of :func:`circuitkit.circuit_evidence` and of the induction scan's patched edges), else None.
- ``each``: each sequence's or pair's effect ``[n]`` (their mean is ``effect``, to float rounding), where the metric
  keeps one (not written); ``interval``: the effect's percentile bootstrap interval over them
  (:func:`circuitkit.uncertainty.mean_intervals`, one draw for every edge), None with fewer than two.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from circuitkit.ranking import Head
from circuitkit.results import edge_name, graph_edge_name, plain

_HEAD = re.compile(r"(\d+)\.(\d+)")
"""A node of the task graph that is a head (``"1.3"``); the input, an MLP (``"m1"``), the logits and a key/value
group (``"1.g0"``) are not."""


def _head(node: str) -> Head | None:
    found = _HEAD.fullmatch(node)
    return None if found is None else (int(found.group(1)), int(found.group(2)))


@dataclass(frozen=True)
class EdgeEffect:
    """One exactly patched edge (module docstring): ``name`` (the task graph's spelling), ``score`` (the estimate,
    or None), ``effect`` (the behaviour lost), ``interval`` (its bootstrap interval, or None), ``each`` (per
    sequence or pair, not compared), ``clean`` / ``patched`` (the metric's means; None in a record saved before they
    were kept), ``patched_each`` (each sequence's patched metric, path patching's loss only; not compared)."""

    name: str
    score: float | None
    effect: float
    interval: tuple[float, float] | None = None
    each: Tensor | None = field(default=None, compare=False, repr=False)
    clean: float | None = None
    patched: float | None = None
    patched_each: Tensor | None = field(default=None, compare=False, repr=False)

    @classmethod
    def between_heads(cls, src: Sequence[int], dst: Sequence[int], channel: str, *, clean: float, patched: float,
                      effect: float, **more: Any) -> EdgeEffect:
        """The record of the edge ``src -> dst`` through the receiver's ``channel`` (heads ``(layer, head)``)."""
        return cls(graph_edge_name(tuple(src), tuple(dst), channel), more.pop("score", None), effect,
                   clean=clean, patched=patched, **more)

    def _ends(self) -> tuple[str, str, str | None]:
        """The sender's and the receiver's node names and the receiver's input (None where the name gives none)."""
        sender, _, receiver = self.name.partition("->")
        node, _, channel = receiver.partition(":")
        return sender, node, channel or None

    @property
    def src(self) -> Head | None:
        """The sender head ``(layer, head)``; None where the sender is the input or an MLP."""
        return _head(self._ends()[0])

    @property
    def dst(self) -> Head | None:
        """The receiver head ``(layer, head)``; None where the receiver is an MLP, the logits or a key/value group."""
        return _head(self._ends()[1])

    @property
    def channel(self) -> str | None:
        """The receiver's input the edge is read through (``"q"``, ``"k"``, ``"v"``, ``"all"``); None for a
        receiver read whole (an MLP, the logits)."""
        return self._ends()[2]

    @property
    def input(self) -> str | None:
        """The same as :attr:`channel`."""
        return self.channel

    @property
    def key(self) -> tuple[Head | None, Head | None, str | None]:
        """``(src, dst, channel)``: what identifies an edge between two heads in the induction scan's tables."""
        return self.src, self.dst, self.channel

    @property
    def label(self) -> str:
        """``"0.1 -> 1.3 (k)"`` for an edge between two heads (the induction scan's tables), else :attr:`name`."""
        src, dst = self.src, self.dst
        return self.name if src is None or dst is None else edge_name(src, dst, self.channel)

    def to_json(self) -> dict[str, Any]:
        """``edge``, ``score``, ``clean``, ``patched``, ``effect``, ``ci`` (``clean`` and ``patched`` left out of a
        record read from a file that had neither, so that it writes the file it was read from)."""
        means = {} if self.clean is None and self.patched is None else {"clean": plain(self.clean),
                                                                         "patched": plain(self.patched)}
        return {"edge": self.name, "score": plain(self.score), **means, "effect": plain(self.effect),
                "ci": None if self.interval is None else [float(self.interval[0]), float(self.interval[1])]}


__all__ = ["EdgeEffect"]
