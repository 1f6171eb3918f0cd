"""One stage of a scan, declared as data, and the loop that runs a scan's declared stages.

Both scans declare their stages as :class:`Stage` records: the induction scan's (:data:`circuitkit.pipeline.STAGES`)
and a task scan's (:data:`circuitkit.tasks.stages.TASK_STAGES`). A stage has a short ``name`` (it fits a progress
bar), says ``what`` it does, which fields of its scan's state it ``reads`` and ``writes``, whether it ``runs`` with
the scan's settings, its planned passes before the first pass (``estimate(settings, state)``: the settings and what
the state knows then, e.g. the model's size) and ``run(state, settings, bar)``, which starts and ends its part of
the :class:`~circuitkit.progress.Progress`: it revises the plan where its size became known, and skips the later
stages it leaves nothing for. :func:`plan_of` makes the plan; :func:`run_planned` runs the stages still in it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

State = TypeVar("State")
Settings = TypeVar("Settings")


def _always(settings: Any) -> bool:
    return True


@dataclass(frozen=True)
class Stage(Generic[State, Settings]):
    """One declared stage (see the module docstring)."""

    name: str
    what: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    estimate: Callable[[Settings, State], float]
    run: Callable[[State, Settings, Any], None]
    runs: Callable[[Settings], bool] = _always


def plan_of(stages: Sequence[Stage], settings: Any, state: Any) -> list[tuple[str, float]]:
    """``(name, planned passes)`` of each stage that runs with ``settings``, in order: the plan a
    :class:`~circuitkit.progress.Progress` is made with before the first pass."""
    return [(stage.name, stage.estimate(settings, state)) for stage in stages if stage.runs(settings)]


def run_planned(stages: Sequence[Stage], state: Any, settings: Any, bar: Any) -> None:
    """Run, in order, each of ``stages`` that is still in ``bar``'s plan (an earlier stage may have skipped it)."""
    for stage in stages:
        if stage.name in bar.plan:
            stage.run(state, settings, bar)


__all__ = ["Stage", "plan_of", "run_planned"]
