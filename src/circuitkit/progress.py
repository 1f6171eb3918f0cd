"""A scan's progress over its declared stages, planned in passes before the first pass: the induction scan's
(:mod:`circuitkit.pipeline`) and a task scan's (:mod:`circuitkit.tasks.scan`).

A pass is one run of the scan's batch (or pairs) through the model; a backward pass counts two. The induction
scan's passes are integers; a task scan's coarse circuit search runs stacked copies of a quarter of the pairs, each
counted as the share of a pass it is, so its counts may have a fraction (shown to two decimals).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any

from circuitkit import validate
from circuitkit.errors import CircuitkitError
from circuitkit.scan_record import StageRecord


def passes_text(value: float) -> str:
    """A count of passes as printed: an integer as itself, a fraction to two decimals."""
    return str(int(value)) if float(value).is_integer() else f"{value:.2f}"


@dataclass(frozen=True)
class Revision:
    """A change of the plan: ``stage``'s passes went from ``before`` to ``after`` (0: skipped), ``why`` in words."""

    stage: str
    before: float
    after: float
    why: str


class Progress:
    """The scan's progress over its stages, in passes of the batch.

    ``plan``: ``(stage, passes)`` for each stage the scan will run, fixed before the first pass: the bar's total
    is their sum. The plan changes only through :meth:`revise` (a stage whose size became known, grew, shrank or
    is skipped), and each change is said in words (:attr:`revisions`; the bar's text, or a line). ``mode``:
    ``"bar"`` (tqdm, for a terminal), ``"lines"`` (one line per stage on ``stream``: a log or a pipe; the plan
    first), or ``"off"``. ``label``: what the lines and the bar start with (``"scan"``; a task scan adds its task's
    name, escaped for the terminal by its caller). :attr:`ran`: each stage as it ran, its own passes and seconds."""

    def __init__(self, mode: str, plan: list[tuple[str, float]], stream: Any = None, label: str = "scan") -> None:
        self.mode = mode
        self.label = label
        self.plan = [name for name, _ in plan]
        self.estimates = {name: passes for name, passes in plan}
        self.planned = dict(self.estimates)  # the plan as made before the first pass
        self.planned_total = self._total()
        self.revisions: list[Revision] = []
        self.ran: list[StageRecord] = []
        self.stream = stream if stream is not None else sys.stderr
        self.current: str | None = None
        self.done: float = 0
        self.stage_passes: float = 0
        self.bar = None
        self.started = time.perf_counter()
        if mode == "bar":
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.planned_total, desc=label, unit="pass", file=self.stream,
                            bar_format="{desc:<16}{percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} passes "
                            "[{elapsed}<{remaining}]")
        elif mode == "lines":
            stages = ", ".join(f"{name} {passes_text(passes)}" for name, passes in self.estimates.items())
            self._line(f"{label}: {len(self.plan)} stages, {passes_text(self.planned_total)} passes planned "
                       f"({stages})")

    def _line(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def _total(self) -> float:
        return sum(self.estimates.values())

    def revise(self, name: str, passes: float, why: str) -> None:
        """Change ``name``'s planned passes to ``passes`` (0 with a skipped stage), saying ``why``."""
        before = self.estimates.get(name, 0)
        if abs(passes - before) < 1e-9:
            return
        old_total = self._total()
        self.estimates[name] = passes
        self.revisions.append(Revision(name, before, passes, why))
        line = (f"{self.label}: plan {passes_text(old_total)} -> {passes_text(self._total())} passes: {name} "
                f"{passes_text(before)} -> {passes_text(passes)} ({why})")
        if self.bar is not None:  # the reason as a line above the bar (a postfix would squeeze the bar away)
            self.bar.total = self._total()
            self.bar.write(line, file=self.stream)
            self.bar.refresh()
        elif self.mode == "lines":
            self._line(line)

    def skip(self, name: str, why: str) -> None:
        """``name`` will not run: its passes leave the plan, and the bar says ``why``."""
        self.revise(name, 0, f"skipped: {why}")
        if name in self.plan:
            self.plan.remove(name)

    def start(self, name: str) -> None:
        self.current, self.stage_passes, self.stage_started = name, 0, time.perf_counter()
        if self.bar is not None:
            self.bar.set_description_str(f"{self.label}: {name}")
            self.bar.refresh()

    def advance(self, passes: float) -> None:
        self.stage_passes += passes
        if self.bar is not None:
            self.bar.n = self.done + min(self.stage_passes, self.estimates[self.current])
            self.bar.refresh()

    def end(self, why: str | None = None) -> None:
        """End the current stage. Its cost is the passes advanced; where that differs from the plan, the plan is
        revised first, saying ``why`` (default: the measured count). Its seconds are its own (from :meth:`start`)."""
        name = self.current
        passes = self.stage_passes
        if abs(passes - self.estimates[name]) >= 1e-9:
            self.revise(name, passes, why or f"measured {passes_text(passes)} passes, planned "
                                             f"{passes_text(self.estimates[name])}")
        seconds = time.perf_counter() - self.stage_started
        self.done += passes
        self.ran.append(StageRecord(name, passes, seconds))
        if self.bar is not None:
            self.bar.n = self.done
            self.bar.refresh()
        elif self.mode == "lines":
            unit = "pass" if passes == 1 else "passes"
            self._line(f"{self.label} [{len(self.ran)}/{len(self.plan)}] {name:<8} {passes_text(passes):>4} "
                       f"{unit:<6} {seconds:7.2f} s")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.mode == "lines" and len(self.ran) == len(self.plan):
            total = sum(r.passes for r in self.ran)
            self._line(f"{self.label}: done, {passes_text(total)} passes in "
                       f"{time.perf_counter() - self.started:.2f} s")


def progress_mode(progress: Any, stream: Any = None) -> str:
    """``progress`` (True / False / None / ``"bar"`` / ``"lines"``) as a mode: True and None draw a bar on a
    terminal and print lines elsewhere (None: nothing elsewhere)."""
    if isinstance(progress, str):
        return validate.option("scan: progress", progress, ("bar", "lines", "off"))
    if progress is not None:
        try:
            progress = validate.boolean("scan: progress", progress)
        except CircuitkitError:
            raise validate.fail("scan: progress", progress, "True, False, None (a bar on a terminal, else nothing), "
                                                            "'bar', 'lines' or 'off'") from None
        if not progress:
            return "off"
    stream = stream if stream is not None else sys.stderr
    terminal = bool(getattr(stream, "isatty", lambda: False)())
    if terminal:
        return "bar"
    return "lines" if progress else "off"


__all__ = ["Progress", "Revision", "passes_text", "progress_mode"]
