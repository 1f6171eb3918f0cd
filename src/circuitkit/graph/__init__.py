"""The graph engine: every behaviour as a task (clean/corrupted pairs and a metric) run on one computational graph.

- :mod:`~circuitkit.graph.task`: :class:`Task` (the pairs, their tokens, the metric, the ablation) and
  :class:`TaskBatch` (what one pass reads);
- :mod:`~circuitkit.graph.metrics`: the task engine's view of the metric registry (:data:`METRICS`);
- :mod:`~circuitkit.graph.nodes`: node types as data (:class:`NodeType`: heads, MLPs, neuron groups, a user's);
- :mod:`~circuitkit.graph.runner`: :class:`TaskRunner`, the passes that measure nodes and edges (patching, EAP-IG);
- :mod:`~circuitkit.graph.edge_patch`: the one exact edge pass of both engines (one edge a stacked copy: the task
  runner's single-edge effects and the induction scan's path patching).

It stands below :mod:`circuitkit.circuits` and :mod:`circuitkit.tasks` (above :mod:`circuitkit.detect`, whose node
patching pass it shares), so that every scan's measurements can run on it. ``circuitkit.tasks`` holds what is built
on it: the built-in tasks, the circuit searches, the task scan, its record and its page.
"""

from __future__ import annotations

from circuitkit._lazy import lazy_exports

_LAZY = {
    "Pair": "circuitkit.graph.task",
    "Task": "circuitkit.graph.task",
    "TaskBatch": "circuitkit.graph.task",
    "METRICS": "circuitkit.graph.metrics",
    "NodeType": "circuitkit.graph.nodes",
    "TaskRunner": "circuitkit.graph.runner",
}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
__all__ = sorted(_LAZY)
