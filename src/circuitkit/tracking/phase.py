"""Where the in-context learning phase change is along a track, and which heads form with it.

**The phase change** (definition used here): with checkpoints at steps ``t_0 < ... < t_{n-1}`` and in-context
learning (ICL) scores ``s_i``, the *rise* of interval ``i`` is ``s_{i+1} - s_i`` and the *total rise* is
``max(s) - s_0``. The phase change is the interval with the largest rise; its ``step`` is the interval's end
``t_{i+1}`` (the first checkpoint that shows the jump), its ``interval`` is ``[t_i, t_{i+1}]`` and its ``share``
is its rise over the total rise (near 1: abrupt; near ``1 / (n - 1)``: a steady slope).

Limits: the step is only as precise as the checkpoint spacing (the change happened somewhere in the interval);
with unequal spacing a long interval collects more rise than a short one at the same rate (Pythia's early
checkpoints are log-spaced: compare ``share`` with the spacing); fewer than 3 checkpoints, or a total rise below
:data:`MIN_TOTAL_RISE`, locate nothing (``step`` is ``None`` and ``reason`` says why).

**Formation of a head** (for the heads called induction / previous-token heads at the last checkpoint, by the
scan's rule :func:`circuitkit.pipeline.called_heads`):

- ``called_at``: the first step from which the head stays called (its score crosses the scan's threshold and
  never falls back below it) — the threshold crossing;
- ``rise_at``: the first step from which the head's score stays at or above its first value plus
  :data:`RISE_FRACTION` of its total change (first to last checkpoint) — when it starts to form, independent of
  where its final score ends (a previous-token head that ends at 0.4 and an induction head that ends at 0.9 are
  compared fairly). A fifth of the rise rather than half: on the bundled run both kinds rise together over
  ~150 steps, and the halfway points fall either side of one checkpoint depending on the token batch, while
  the onsets agree on every batch tried.

The heads named at the phase change (``heads``) are the induction heads whose ``called_at`` lies within one
checkpoint of the phase-change interval (from ``t_{i-1}`` to ``t_{i+2}``). ``order`` compares the earliest
``rise_at`` of the previous-token heads with that of the induction heads.

**The task's change** (a track measured with a task, :mod:`circuitkit.tracking.task_figures`): the same definition
on the task's metric gap ``g_i`` (mean clean minus mean corrupted metric, in the metric's units) in place of the ICL
score: ``task.step`` ends the interval with the largest rise of the gap, ``share`` is that rise over ``max(g) -
g_0``, nothing is located below :data:`MIN_GAP_RISE`; ``circuit_from`` is the first step from which every
checkpoint has both a gap of at least :data:`MIN_GAP_RISE` and a node circuit at the target. (A task scan finds a
"circuit" wherever patching every node moves the metric by 0.001; with no gap to explain, its faithfulness is a
ratio of noise, so such checkpoints do not count.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

MIN_TOTAL_RISE = 0.1
"""nats: a total ICL-score rise below this is noise on a batch of repeated random tokens, not a phase change."""
MIN_CHECKPOINTS = 3
MIN_GAP_RISE = 0.1
"""In the task metric's units (a tenth of a logit for a logit difference): a smaller total rise of the task's gap
locates no change."""
RISE_FRACTION = 0.2
"""A head has started to form once its score stays this fraction of its total change above its first value."""


def _stays(values: Sequence[bool]) -> int | None:
    """The first index from which every value is true, or None."""
    first = None
    for index, value in enumerate(values):
        if not value:
            first = None
        elif first is None:
            first = index
    return first


def formation(records: Sequence[dict[str, Any]], score: str) -> dict[str, dict[str, int | None]]:
    """``head name -> {"called_at": step, "rise_at": step}`` for the heads called ``score`` heads at the
    last checkpoint (see the module docstring)."""
    steps = [r["step"] for r in records]
    final = records[-1]["called"].get(score, [])
    out: dict[str, dict[str, int | None]] = {}
    for name in final:
        layer, head = (int(part) for part in name.split("."))
        values = [r["scores"][score][layer][head] for r in records]
        called = _stays([name in r["called"].get(score, []) for r in records])
        start, end = values[0], values[-1]
        level = None if start is None or end is None else start + RISE_FRACTION * (end - start)
        rise = _stays([v is not None and level is not None and v >= level for v in values])
        out[name] = {"called_at": steps[called] if called is not None else None,
                     "rise_at": steps[rise] if rise is not None else None}
    return out


def locate(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The ``phase_change`` entry of ``track.json`` for ``records`` sorted by step (see the module docstring)."""
    steps = [r["step"] for r in records]
    icl = [r["icl_score"] for r in records]
    induction = formation(records, "induction") if records else {}
    previous = formation(records, "previous_token") if records else {}
    entry: dict[str, Any] = {
        "step": None, "interval": None, "rise": None, "share": None, "total_rise": None, "heads": [],
        "formation": {"induction": induction, "previous_token": previous}, "order": _order(previous, induction),
        "reason": None,
    }
    if records and "task" in records[0]:
        entry["task"] = locate_task(records)
    entry.update(_largest_rise(steps, icl, MIN_TOTAL_RISE, "the in-context learning score", unit=" nats",
                               change="phase change"))
    if entry["interval"] is not None:  # the induction heads called from one checkpoint before to one after it
        best = steps.index(entry["interval"][0])
        low, high = steps[max(best - 1, 0)], steps[min(best + 2, len(steps) - 1)]
        entry["heads"] = [name for name, when in induction.items()
                          if when["called_at"] is not None and low <= when["called_at"] <= high]
    return entry


def _largest_rise(steps: Sequence[int], values: Sequence[float], minimum: float, what: str, *, unit: str = "",
                  change: str = "change") -> dict[str, Any]:
    """``{step, interval, rise, share, total_rise, reason}`` of the interval where ``values`` rise most (a rise of
    at least ``minimum`` in total; ``what``, ``unit`` and ``change`` word the reason where there is none)."""
    entry: dict[str, Any] = {"step": None, "interval": None, "rise": None, "share": None, "total_rise": None,
                             "reason": None}
    if len(values) < MIN_CHECKPOINTS:
        entry["reason"] = f"{len(values)} checkpoint(s); locating a {change} needs at least {MIN_CHECKPOINTS}"
        return entry
    total = max(values) - values[0]
    rises = [b - a for a, b in zip(values, values[1:], strict=False)]
    best = max(range(len(rises)), key=lambda i: (rises[i], -i))  # the largest rise; ties: the earliest
    entry["total_rise"] = round(total, 6)
    if total < minimum or rises[best] <= 0:
        entry["reason"] = f"{what} rises by {total:.3f}{unit} in total; a {change} needs at least {minimum}"
        return entry
    entry.update(step=steps[best + 1], interval=[steps[best], steps[best + 1]], rise=round(rises[best], 6),
                 share=round(rises[best] / total, 6))
    return entry


def locate_task(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The ``phase_change["task"]`` entry: where the task's metric gap rises most (module docstring)."""
    steps = [r["step"] for r in records]
    entry = _largest_rise(steps, [r["task"]["gap"] for r in records], MIN_GAP_RISE, "the task's metric gap")
    found = _stays([r["task"]["circuit"] is not None and r["task"]["gap"] >= MIN_GAP_RISE for r in records])
    entry["circuit_from"] = steps[found] if found is not None else None
    entry["min_gap"] = MIN_GAP_RISE
    return entry


def _order(previous: dict[str, dict], induction: dict[str, dict]) -> str | None:
    """``"previous-token first"``, ``"together"`` or ``"induction first"`` by earliest ``rise_at``; None if either
    kind has no formed head."""
    first_prev = min((w["rise_at"] for w in previous.values() if w["rise_at"] is not None), default=None)
    first_ind = min((w["rise_at"] for w in induction.values() if w["rise_at"] is not None), default=None)
    if first_prev is None or first_ind is None:
        return None
    if first_prev < first_ind:
        return "previous-token first"
    return "together" if first_prev == first_ind else "induction first"


__all__ = ["MIN_CHECKPOINTS", "MIN_GAP_RISE", "MIN_TOTAL_RISE", "RISE_FRACTION", "formation", "locate", "locate_task"]
