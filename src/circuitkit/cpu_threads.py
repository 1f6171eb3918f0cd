"""How torch's CPU threads wait: sleep, not spin, on a machine shared with other work.

Why: torch runs its CPU operations on OpenMP threads, and OpenMP's default is to keep an idle thread spinning for
a while before it sleeps. Beside another busy process those spinning threads take turns with the other process's
threads at every operation, and the scan's passes slow down far more than the cores they lose. Measured on a
2-core machine with Qwen2.5-Coder-0.5B (benchmarks/README.md, "Real models at real speed"): beside one process that
keeps both cores busy, a forward pass of the scan's batch took 16.8 s with spinning threads and 7.0 s with
``OMP_WAIT_POLICY=PASSIVE`` (3.3 s on the idle machine either way, so nothing is lost there).

OpenMP reads the policy once, when torch loads it: the CLI sets it before torch is imported
(:func:`prefer_passive_waiting`); in Python, set ``OMP_WAIT_POLICY=PASSIVE`` in the environment before
``import torch``. A policy the user set is never changed.
"""

from __future__ import annotations

import os
import sys

WAIT_POLICY = "PASSIVE"


def prefer_passive_waiting() -> bool:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` where it can still take effect (torch not imported yet) and the user did not
    choose a policy; True where it was set here."""
    if "torch" in sys.modules or "OMP_WAIT_POLICY" in os.environ:
        return False
    os.environ["OMP_WAIT_POLICY"] = WAIT_POLICY
    return True
