"""Time to the first answer of ``circuitkit scan`` on the bundled model: the whole command, its parts side by
side, and the first line on stderr.

    python benchmarks/startup.py [--runs N] [--busy N] [--json]

- **whole**: seconds from starting ``circuitkit scan --out DIR`` (bundled model; ``python -m circuitkit._entry``,
  the console script's code) to its exit, imports included; beside it ``python -m circuitkit.cli``, the same
  command with Python's ordinary exit (the interpreter's teardown);
- **parts**: the same work in one fresh process, timed step by step (:data:`PARTS`): the interpreter and the CLI
  module, ``import torch``, building the bundled model as the CLI does (``zoo.load(bridge=False)``: circuitkit's
  attention-only model, neither transformers nor TransformerLens imported), importing the scan pipeline, the
  scan's passes and their setup, writing report.html and scores.json;
- **first line**: seconds until the first stderr line (the progress line before the model loads, the one-line
  error for a mistyped name, a missing path, a bad argument).

Each case is spawned ``RUNS + 1`` times (the first not counted: file-system caches); the table gives the median and
the range. ``--busy N``: N other processes run torch matrix products on every core meanwhile (``scan.BUSY_LOOP``).
Results: benchmarks/README.md, "Start-up of the CLI".
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scan import beside_busy  # benchmarks/ is on sys.path when a script here runs

RUNS = 5
SRC = str(Path(__file__).resolve().parents[1] / "src")

PARTS = """
import time
start = time.perf_counter()
laps = []
def lap(name):
    global start
    now = time.perf_counter()
    laps.append((name, now - start))
    start = now
import circuitkit.cli
lap("import circuitkit.cli")
import torch
lap("import torch")
from circuitkit import zoo
model = zoo.load(bridge=False)
lap("build the bundled model (attention-only, no bridge)")
import circuitkit.pipeline
lap("import the scan pipeline")
scan = circuitkit.pipeline.scan(model, name="induction-2l")
lap("scan: its passes and their setup")
import sys
scan.save(sys.argv[1])
lap("write report.html + scores.json")
print("LAPS", repr(laps))
"""
"""The CLI's work for the bundled model, step by step in one process (the order its imports happen in)."""


def first_line_seconds(args: list[str], env: dict[str, str]) -> tuple[float, str]:
    """Seconds until ``circuitkit scan ARGS`` writes its first stderr line, and the line (the process is then
    stopped: only the start-up is timed)."""
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "circuitkit._entry", "scan", *args], stderr=subprocess.PIPE,
                               stdout=subprocess.DEVNULL, env=env, text=True)
    line = process.stderr.readline()
    seconds = time.perf_counter() - started
    process.kill()
    process.wait()
    return seconds, line.strip()


def whole_seconds(args: list[str], env: dict[str, str], module: str = "circuitkit._entry") -> float:
    """Seconds from starting ``python -m MODULE scan ARGS`` to its exit."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", module, "scan", *args], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def part_seconds(out: str, env: dict[str, str]) -> dict[str, float]:
    """Each step of :data:`PARTS` in one fresh process, in seconds."""
    done = subprocess.run([sys.executable, "-c", PARTS, out], env=env, check=True, capture_output=True, text=True)
    laps = ast.literal_eval(done.stdout.split("LAPS", 1)[1].strip())
    return {name.split("; ")[-1]: seconds for name, seconds in laps}


def _summary(times: list[float]) -> dict[str, float]:
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times)}


def whole_and_parts(env: dict[str, str], out: str, runs: int) -> dict:
    """The whole command's seconds (the console script's exit, and Python's ordinary exit: ``python -m
    circuitkit.cli``) and its parts', taken in turn (whole, ordinary, parts; ``runs`` times after one round not
    counted) so that a load that moves touches all three alike."""
    whole, ordinary, parts = [], [], {}
    for _ in range(runs + 1):
        whole.append(whole_seconds(["--out", out], env))
        ordinary.append(whole_seconds(["--out", out], env, module="circuitkit.cli"))
        for name, seconds in part_seconds(out, env).items():
            parts.setdefault(name, []).append(seconds)
    return {"whole": _summary(whole[1:]), "whole_ordinary_exit": _summary(ordinary[1:]),
            "parts": {name: _summary(times[1:]) for name, times in parts.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=RUNS, help="counted runs per case (median and range)")
    parser.add_argument("--busy", type=int, default=0, help="busy processes beside the command (0: idle)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, beside_busy(args.busy):
        env = {**os.environ, "PYTHONPATH": SRC, "HF_HUB_CACHE": str(Path(tmp) / "empty-cache")}
        out = str(Path(tmp) / "out")
        cases = {"first progress line (bundled model)": ["--out", out],
                 "mistyped model name": ["smol-randm", "--out", out],
                 "missing model directory": ["./models/nope", "--out", out],
                 "bad argument (--batch x)": ["--batch", "x"]}
        rows = {}
        for label, case_args in cases.items():
            times, line = [], ""
            for _ in range(args.runs + 1):
                seconds, line = first_line_seconds(case_args, env)
                times.append(seconds)
            rows[label] = {**_summary(times[1:]), "line": line}
        measured = whole_and_parts(env, out, args.runs)
        load = os.getloadavg()[0]
    if args.json:
        print(json.dumps({"busy": args.busy, "cores": os.cpu_count(), "load_1min_at_end": load, "first_line": rows,
                          **measured}, indent=2))
        return
    print(f"busy processes: {args.busy}; cores: {os.cpu_count()}; 1-minute load average at the end: {load:.2f}")
    whole = measured["whole"]
    print(f"{'whole command (circuitkit scan)':<44} {whole['median_s']:.2f} s "
          f"({whole['min_s']:.2f}-{whole['max_s']:.2f})")
    ordinary = measured["whole_ordinary_exit"]
    print(f"{'  the same with the ordinary exit (-m circuitkit.cli)':<44} {ordinary['median_s']:.2f} s "
          f"({ordinary['min_s']:.2f}-{ordinary['max_s']:.2f})")
    total = 0.0
    for name, part in measured["parts"].items():
        total += part["median_s"]
        print(f"  {name:<42} {part['median_s']:.2f} s ({part['min_s']:.2f}-{part['max_s']:.2f})")
    rest = whole["median_s"] - total
    print(f"  {'the rest (interpreter start-up, printing, exit)':<42} "
          + (f"{rest:.2f} s" if rest >= 0 else "n/a (the load moved between the whole runs and the parts' runs)"))
    for label, row in rows.items():
        print(f"{label:<44} {row['median_s']:.3f} s ({row['min_s']:.3f}-{row['max_s']:.3f})  {row['line'][:50]}")


if __name__ == "__main__":
    main()
