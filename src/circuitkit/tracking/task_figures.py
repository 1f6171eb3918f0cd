"""A task measured at one checkpoint: its metric, every head's EAP-IG node score and DLA, and its node circuit.

``circuitkit.track(checkpoints, task=FILE)`` adds to every checkpoint's record a ``task`` entry::

    clean, corrupted      the task's mean metric over all its pairs on the clean / corrupted prompts
    gap                   clean - corrupted (the behaviour the corruption removes; the phase change can read it)
    units                 the metric's units
    scores                [layer][head] each head's EAP-IG node score (the ranking of the task scan's node circuit)
    dla                   [layer][head] each head's direct logit attribution, or null where the scan gives none
    circuit               the node circuit at ``target`` on the discovery pairs: heads ["layer.head"], mlps,
                          size, n_nodes, faithfulness, necessity, and ``evaluation`` (the same node set's
                          faithfulness and necessity on the held-out pairs, null where none are held out); or null
    circuit_error         why there is no circuit (the corrupted prompts do not change the metric), or null

**Which path, and why.** Every figure comes from :func:`circuitkit.tasks.scan_task` itself with ``edges=False``, so
a checkpoint's task figures are exactly those of a task scan of that checkpoint with the same settings (the ranking
of the node circuit is the scan's, whichever EAP-IG pass the family allows). ``edges=False`` skips what is costly
in a task scan, the edge circuit (MIB's sizes in stacked copies, the bisection and the exact edge effects); what
remains per checkpoint, in copies of the discovery pairs (a backward counts two; the task scan's own count): the
clean run (3), the corrupted run (1), EAP-IG (``3 * ig_steps``), the node circuit (a geometric search and a
bisection, about ``2 log2(heads) + 2``), and on the held-out pairs one stacked pass of a copy per size of the node
curve plus one (the bundled model, 8 heads, 12 pairs: 3 + 1 + 9 + 7 on the discovery half, 12 on the held-out
half). The node circuit is kept because it is the task's answer ("which heads, how faithful") and its size over
training is what a track asks.

A task file is read (and refused if bad) before any checkpoint loads; the task's pairs, metric and ablation are
fingerprinted into the track's settings, so a rerun resumes only records measured on the same task.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any

from circuitkit import validate
from circuitkit.errors import CircuitkitError
from circuitkit.graph.metrics import metric_label, metric_units
from circuitkit.ranking import head_name
from circuitkit.tasks import Task, load_task, scan_task
from circuitkit.tasks.scan import DEFAULT_HOLDOUT, DEFAULT_IG_STEPS

DIGITS = 6
"""Decimals kept (as :data:`circuitkit.tracking.measure.DIGITS`)."""
DEFAULT_TASK_TARGET = 0.8
"""The node circuit's faithfulness target (the task scan's default)."""


@dataclass(frozen=True)
class TrackedTask:
    """The task a track measures and how: ``target`` (node circuit), ``holdout`` / ``split_seed`` (the scan's
    discovery / evaluation split) and ``ig_steps`` (EAP-IG points)."""

    task: Task
    target: float = DEFAULT_TASK_TARGET
    holdout: float = DEFAULT_HOLDOUT
    split_seed: int = 0
    ig_steps: int = DEFAULT_IG_STEPS

    @property
    def settings(self) -> dict[str, Any]:
        """What the track's settings record of the task (a rerun resumes only where they are equal)."""
        task = self.task
        return {"name": task.name, "pairs": task.n_pairs, "metric": metric_label(task.metric),
                "ablation": task.ablation, "sha256": task_sha256(task), "target": self.target,
                "holdout": self.holdout, "split_seed": self.split_seed, "ig_steps": self.ig_steps, "edges": False}


def task_sha256(task: Task) -> str:
    """A hash of the task's pairs (prompts, answers, wrong answers), metric and ablation. A user metric function
    enters by its name only (``custom:NAME``): change its name when you change what it computes."""
    text = json.dumps({"pairs": [p.to_json() for p in task.pairs], "metric": metric_label(task.metric),
                       "ablation": task.ablation}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def prepare_task(task: Any, *, target: float = DEFAULT_TASK_TARGET, holdout: float = DEFAULT_HOLDOUT,
                 split_seed: int = 0, ig_steps: int = DEFAULT_IG_STEPS) -> TrackedTask:
    """``task`` (a :class:`~circuitkit.tasks.Task` or a task file's path) read and checked with its settings, before
    any checkpoint loads: a bad file or setting is one :class:`CircuitkitError` here."""
    from circuitkit.circuits.faithfulness import check_target

    if isinstance(task, (str, os.PathLike)) and not isinstance(os.fspath(task), bytes):
        task = load_task(task)
    if not isinstance(task, Task):
        raise validate.fail("track: task", task, "a circuitkit.tasks.Task or the path of a task file "
                            "(.jsonl, .csv or .json)")
    target = check_target("track: target", target)
    if isinstance(holdout, bool) or not isinstance(holdout, (int, float)) or not 0 <= holdout < 1:
        raise validate.fail("track: holdout", holdout, "a share of the task's pairs in [0, 1) (0: no split)")
    split_seed = validate.seed("track: split_seed", split_seed)
    ig_steps = validate.integer("track: ig_steps", ig_steps, minimum=1, maximum=64)
    return TrackedTask(task, float(target), float(holdout), split_seed, ig_steps)


def _round(value: Any) -> float | None:
    value = float(value)
    return round(value, DIGITS) if value == value and abs(value) != float("inf") else None


def _grid(tensor: Any) -> list | None:
    return None if tensor is None else [[_round(v) for v in row] for row in tensor.tolist()]


def measure_task(model: Any, tracked: TrackedTask, *, device: Any = None) -> dict[str, Any]:
    """The ``task`` entry of one checkpoint's record (module docstring), from one :func:`scan_task` with
    ``edges=False``."""
    scan = scan_task(model, tracked.task, target=tracked.target, edges=False, device=device, steps=tracked.ig_steps,
                     holdout=tracked.holdout, split_seed=tracked.split_seed)
    return task_entry(scan)


def task_entry(scan: Any) -> dict[str, Any]:
    """The ``task`` entry of a record from a :class:`~circuitkit.tasks.TaskScan`."""
    clean, corrupted = float(scan.clean.mean()), float(scan.corrupted.mean())
    if _round(clean) is None or _round(corrupted) is None:
        raise CircuitkitError(f"track: task {scan.task.name!r} gives a non-finite mean metric (clean {clean}, "
                              f"corrupted {corrupted}); expected finite logits at every checkpoint.")
    c = scan.circuit
    circuit = None
    if c is not None:
        other = c.other_set
        evaluation = None
        if other is not None:
            evaluation = {"set": other["set"], "pairs": int(other["pairs"]),
                          "faithfulness": None if other.get("faithfulness") is None else _round(other["faithfulness"]),
                          "necessity": _round(other["necessity"])}
        circuit = {"heads": [head_name(h) for h in c.heads], "mlps": [int(m) for m in c.mlps],
                   "size": len(c.heads) + len(c.mlps), "n_nodes": int(c.n_nodes_total),
                   "faithfulness": _round(c.faithfulness), "necessity": _round(c.necessity),
                   "evaluation": evaluation}
    return {"clean": _round(clean), "corrupted": _round(corrupted), "gap": _round(clean - corrupted),
            "units": metric_units(scan.task.metric), "scores": _grid(scan.scores), "dla": _grid(scan.dla),
            "circuit": circuit, "circuit_error": scan.circuit_error}


__all__ = ["DEFAULT_TASK_TARGET", "TrackedTask", "measure_task", "prepare_task", "task_entry", "task_sha256"]
