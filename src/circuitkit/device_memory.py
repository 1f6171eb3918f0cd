"""Memory free on a device now, and byte counts as text: what the memory checks of scans compare their estimates to.

:func:`available_memory` reads CUDA's ``mem_get_info`` for a CUDA device; on the CPU, ``MemAvailable`` of
``/proc/meminfo`` bounded by any cgroup v2 limit (a container is killed at its limit, not at the machine's size).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

__all__ = ["available_memory", "size_text"]


def size_text(n: float) -> str:
    """``n`` bytes in the largest binary unit it reaches, one decimal (``"12.3 GiB"``)."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def _cgroup_free() -> int | None:
    """Room left under a cgroup v2 memory limit (containers are killed there, not at the machine's size)."""
    root = Path("/sys/fs/cgroup")
    try:
        limit = (root / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int((root / "memory.current").read_text().strip()))
    except (OSError, ValueError):
        return None


def _cpu_free() -> int | None:
    free = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        free = None
    if free is None:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            free = None
    cgroup = _cgroup_free()
    if cgroup is not None:
        free = cgroup if free is None else min(free, cgroup)
    return free


def available_memory(device: str | torch.device | None = None) -> int | None:
    """Bytes free now on ``device`` (CPU by default): ``torch.cuda.mem_get_info`` for a CUDA device; on the CPU
    ``MemAvailable`` (``/proc/meminfo``) bounded by a cgroup v2 limit. None where that cannot be read (then no
    check is made)."""
    device = torch.device("cpu") if device is None else torch.device(device)
    if device.type == "cuda":
        try:
            return int(torch.cuda.mem_get_info(device)[0])
        except (RuntimeError, AssertionError, ValueError):
            return None
    if device.type == "cpu":
        return _cpu_free()
    return None
