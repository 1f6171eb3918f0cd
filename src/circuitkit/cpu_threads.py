"""How torch's CPU threads wait: sleep, not spin, on a machine shared with other work.

Why: torch runs its CPU operations on OpenMP threads, and OpenMP's default is to keep an idle thread spinning for
a while before it sleeps. Beside another busy process those spinning threads take turns with the other process's
threads at every operation, and the scan's passes slow down far more than the cores they lose. Measured on a
2-core machine with Qwen2.5-Coder-0.5B (benchmarks/README.md, "Real models at real speed"): beside one process that
keeps both cores busy, a forward pass of the scan's batch took 16.8 s with spinning threads and 7.0 s with
``OMP_WAIT_POLICY=PASSIVE`` (3.3 s on the idle machine either way, so nothing is lost there).

OpenMP reads the policy once, when torch loads it. So the policy is set (:func:`prefer_passive_waiting`) where it can
still take effect: by ``import circuitkit`` when circuitkit is imported before torch, and by the CLI before it
imports torch. A policy the user set is never changed. Where torch was loaded first with no policy set, the policy
cannot change any more: :func:`warn_if_threads_spin` (called as a scan starts) then says so in one line, with the
fix, where other work keeps cores busy; :func:`free_cores` gives the thread count the cores left free allow (a single
thread does not spin against anyone). Measured: benchmarks/README.md, "Python against the CLI".
"""

from __future__ import annotations

import os
import sys
import time
import warnings

WAIT_POLICY = "PASSIVE"

def prefer_passive_waiting() -> bool:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` where it can still take effect (torch not imported yet) and the user did not
    choose a policy; True where it was set here."""
    if "torch" in sys.modules or "OMP_WAIT_POLICY" in os.environ:
        return False
    os.environ["OMP_WAIT_POLICY"] = WAIT_POLICY
    return True


def threads_may_spin() -> bool:
    """True where torch's idle OpenMP threads may be spinning: torch is loaded and no wait policy was in the
    environment for it (a policy the user chose, ``ACTIVE`` included, is the user's choice and counts as set)."""
    return "torch" in sys.modules and "OMP_WAIT_POLICY" not in os.environ


def _machine_busy_seconds() -> float | None:
    """CPU seconds every CPU of the machine spent busy since boot (Linux ``/proc/stat``: all but idle and iowait),
    None where that cannot be read."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields) - idle) / ticks


def _own_cpu_seconds() -> float:
    """CPU seconds this process has used (user + system, all its threads)."""
    times = os.times()
    return times.user + times.system


def available_cores() -> int:
    """The CPUs this process may run on (its affinity mask where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def busy_elsewhere(interval: float = 0.1) -> float:
    """Cores' worth of work other processes do now: the machine's busy CPU time over the next ``interval``
    seconds minus this process's own, divided by the time that passed. Where the machine's CPU time cannot be
    read, the 1-minute load average (which counts this process too, and lags)."""
    machine_before, own_before, start = _machine_busy_seconds(), _own_cpu_seconds(), time.monotonic()
    if machine_before is None:
        try:
            return float(os.getloadavg()[0])
        except (AttributeError, OSError):
            return 0.0
    time.sleep(interval)
    machine_after, own_after, elapsed = _machine_busy_seconds(), _own_cpu_seconds(), time.monotonic() - start
    if machine_after is None or elapsed <= 0:
        return 0.0
    return max(0.0, ((machine_after - machine_before) - (own_after - own_before)) / elapsed)


def free_cores(interval: float = 0.1) -> int:
    """The cores other work leaves free now, at least 1: :func:`available_cores` minus :func:`busy_elsewhere`,
    rounded. A thread count for ``torch.set_num_threads`` where idle threads spin (one thread never spins)."""
    cores = available_cores()
    return max(1, min(cores, round(cores - busy_elsewhere(interval))))


class SpinningThreadsWarning(RuntimeWarning):
    """torch's idle CPU threads spin beside other work (see :func:`warn_if_threads_spin`)."""


CHECK_EVERY_S = 60.0
"""At most one look at the machine's load (a 0.1 s sample) per this many seconds, and one warning per process."""
_last_check: float | None = None
_warned = False


def spinning_message(threads: int, free: int, busy: float, cores: int) -> str:
    """The one-line warning with its fix."""
    return (f"torch's idle CPU threads spin while they wait (torch was imported before circuitkit and "
            f"OMP_WAIT_POLICY is not set) and other work keeps {busy:.1f} of {cores} cores busy, so this can run "
            f"several times slower. Fix: torch.set_num_threads({free}) now, or set OMP_WAIT_POLICY=PASSIVE in the "
            "environment before Python starts (or import circuitkit before torch).")


def warn_if_threads_spin() -> bool:
    """Warn once (:class:`SpinningThreadsWarning`) where torch's idle threads may spin (:func:`threads_may_spin`)
    and other work leaves fewer cores free than torch has threads; True where it warned.

    Why a warning and not ``torch.set_num_threads``: results computed with another thread count may differ in
    their last digits (sums split differently), so changing it from the machine's load of the moment would make
    the same scan's files depend on what else ran. The user chooses; the message names the call."""
    global _last_check, _warned
    if _warned or not threads_may_spin():
        return False
    now = time.monotonic()
    if _last_check is not None and now - _last_check < CHECK_EVERY_S:
        return False
    _last_check = now
    threads = sys.modules["torch"].get_num_threads()
    if threads <= 1:
        return False
    cores, busy = available_cores(), busy_elsewhere()
    free = max(1, min(cores, round(cores - busy)))
    if threads <= free:
        return False
    _warned = True
    warnings.warn(spinning_message(threads, free, busy, cores), SpinningThreadsWarning, stacklevel=_caller_level())
    return True


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside circuitkit, counted from the function that calls this one (so
    the warning names the user's line, through decorators and entry points)."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    return level
