"""Seconds from starting ``circuitkit scan`` to its first line on stderr: the progress line before the model
loads (bundled model) and the one-line error for a mistyped name and for a missing path.

Each case is spawned ``RUNS + 1`` times (the first not counted: file-system caches); the table gives the median
and the range. ``python benchmarks/startup.py [--json]``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNS = 5
SRC = str(Path(__file__).resolve().parents[1] / "src")


def first_line_seconds(args: list[str], env: dict[str, str]) -> tuple[float, str]:
    """Seconds until ``circuitkit scan ARGS`` writes its first stderr line, and the line (the process is then
    stopped: only the start-up is timed)."""
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "circuitkit.cli", "scan", *args], stderr=subprocess.PIPE,
                               stdout=subprocess.DEVNULL, env=env, text=True)
    line = process.stderr.readline()
    seconds = time.perf_counter() - started
    process.kill()
    process.wait()
    return seconds, line.strip()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONPATH": SRC, "HF_HUB_CACHE": str(Path(tmp) / "empty-cache")}
        out = str(Path(tmp) / "out")
        cases = {"first progress line (bundled model)": ["--out", out],
                 "mistyped model name": ["smol-randm", "--out", out],
                 "missing model directory": ["./models/nope", "--out", out],
                 "bad argument (--batch x)": ["--batch", "x"]}
        rows = {}
        for label, args in cases.items():
            times, line = [], ""
            for _ in range(RUNS + 1):
                seconds, line = first_line_seconds(args, env)
                times.append(seconds)
            times = times[1:]
            rows[label] = {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
                           "line": line}
    if "--json" in sys.argv:
        print(json.dumps(rows, indent=2))
        return
    for label, row in rows.items():
        print(f"{label:<38} {row['median_s']:.3f} s ({row['min_s']:.3f}-{row['max_s']:.3f})  {row['line'][:60]}")


if __name__ == "__main__":
    main()
