"""The same scan from Python and from the CLI, idle or beside a busy process: does library use get the CLI's thread
behaviour?

    python benchmarks/python_vs_cli.py [--model DIR] [--quick] [--busy N] [--runs R] [--json out.json]

Each setting runs in a fresh process (OpenMP reads its wait policy when torch loads it), ``R`` times (median
kept). Settings:

- ``cli``: ``python -m circuitkit.cli scan [DIR] [--quick]``;
- ``python, circuitkit first``: ``import circuitkit`` then ``import torch``, then ``circuitkit.scan(...)``;
- ``python, torch first``: ``import torch`` then ``import circuitkit`` (a notebook's usual order), then the scan;
- ``python, torch first, threads = free cores``: the same, with ``torch.set_num_threads`` set from
  ``circuitkit.cpu_threads.free_cores()`` before the scan;
- ``python, OMP_WAIT_POLICY=PASSIVE``: the user set the variable before Python started.

Each reports the whole process's seconds and the scan's passes' seconds (the ``scan: done, N passes in X s`` line
both print: loading and writing excluded). "Busy": ``N`` other processes running torch matrix products on every
core for the whole measurement (``scan.BUSY_LOOP``). Results: benchmarks/README.md, "Python against the CLI".
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import emit_json  # benchmarks/ is on sys.path when a script here runs
from scan import beside_busy

SRC = str(Path(__file__).resolve().parents[1] / "src")

PYTHON = """
import sys, time
{imports}
{threads}
model = sys.argv[1] if sys.argv[1] != "-" else None
options = dict(ablate="none", circuit=False) if sys.argv[2] == "quick" else {{}}
loaded = circuitkit.load_model(model) if model else circuitkit.zoo.load()
circuitkit.scan(loaded, progress="lines", **options)
print("THREADS", torch.get_num_threads())
"""

SETTINGS = {
    "cli": None,
    "python, circuitkit first": ("import circuitkit, circuitkit.zoo\nimport torch", ""),
    "python, torch first": ("import torch\nimport circuitkit, circuitkit.zoo", ""),
    "python, torch first, threads = free cores": (
        "import torch\nimport circuitkit, circuitkit.zoo\nfrom circuitkit.cpu_threads import free_cores",
        "torch.set_num_threads(min(torch.get_num_threads(), free_cores()))"),
    "python, OMP_WAIT_POLICY=PASSIVE": ("import torch\nimport circuitkit, circuitkit.zoo", ""),
}


def run_once(label: str, model: str | None, quick: bool, out: str) -> tuple[float, float, int]:
    """``(whole process seconds, scan seconds, torch threads)`` of one fresh process."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env["PYTHONPATH"] = SRC
    if label.endswith("PASSIVE"):
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    if SETTINGS[label] is None:
        command = [sys.executable, "-m", "circuitkit.cli", "scan", *([model] if model else []), "--out", out,
                   *(["--quick"] if quick else [])]
    else:
        imports, threads = SETTINGS[label]
        command = [sys.executable, "-c", PYTHON.format(imports=imports, threads=threads), model or "-",
                   "quick" if quick else "full"]
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    whole = time.perf_counter() - start
    scan_seconds = float(re.search(r"scan: done, \d+ passes in ([\d.]+) s", done.stderr).group(1))
    threads = re.search(r"THREADS (\d+)", done.stdout)
    return whole, scan_seconds, int(threads.group(1)) if threads else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="a model directory (default: the bundled model)")
    parser.add_argument("--quick", action="store_true", help="scores only (--quick; Python: ablate none, no circuit)")
    parser.add_argument("--busy", type=int, default=1, help="busy processes beside the scan (0: idle)")
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per setting (median kept)")
    parser.add_argument("--only", default=None, help="setting labels to run, separated by semicolons (default: all)")
    parser.add_argument("--json", default=None, help="also write the JSON here")
    args = parser.parse_args()
    labels = [label for label in SETTINGS if args.only is None or label in args.only.split(";")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp, beside_busy(args.busy):
        load = os.getloadavg()[0]
        for label in labels:
            runs = [run_once(label, args.model, args.quick, str(Path(tmp) / "out")) for _ in range(args.runs)]
            whole = statistics.median(r[0] for r in runs)
            scan_s = statistics.median(r[1] for r in runs)
            rows.append({"setting": label, "whole_s": whole, "scan_s": scan_s, "threads": runs[-1][2] or None,
                         "runs": args.runs})
            print(f"{label:<45} whole {whole:7.2f} s   scan {scan_s:7.2f} s   threads {runs[-1][2] or '-'}",
                  flush=True)
    print(f"busy processes: {args.busy}; 1-minute load average at the start: {load:.2f}; cores: {os.cpu_count()}")
    emit_json({"model": args.model or "induction-2l", "quick": args.quick, "busy": args.busy, "load": load,
               "rows": rows}, args.json)


if __name__ == "__main__":
    main()
