"""How torch's CPU threads wait, measured on a real model: one forward and one forward + backward pass (the scan's
attribution pass) of the scan's default batch, idle and beside a busy process, with 2 or 1 threads and OpenMP's
default (idle threads spin) or ``OMP_WAIT_POLICY=PASSIVE`` (they sleep).

    python benchmarks/threads.py DIR [--json out.json]

Each setting runs in a fresh process (OpenMP reads its wait policy when torch loads it): the model loaded, one
warm-up pass, then 3 of each pass, the median kept. "Busy": one other process running torch matrix products on
every core for the whole measurement (``scan.BUSY_LOOP``). Results: benchmarks/README.md, "Real models at real
speed".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from _common import emit_json  # benchmarks/ is on sys.path when a script here runs

MEASURE = """
import json, statistics, sys, time
import torch
torch.set_num_threads(int(sys.argv[2]))
from circuitkit.detect.attribution import attribute
from circuitkit.detect.tokens import as_batch
from circuitkit.models import load_model
from circuitkit.models.adapters import adapt
adapter = adapt(load_model(sys.argv[1]))
batch = as_batch(None, adapter)
with torch.no_grad():
    adapter.run(batch.tokens)
forward, both = [], []
for _ in range(3):
    start = time.perf_counter()
    with torch.no_grad():
        adapter.run(batch.tokens)
    forward.append(time.perf_counter() - start)
    start = time.perf_counter()
    attribute(adapter, batch, "mean", resid_layers=range(1, adapter.spec.n_layers))
    both.append(time.perf_counter() - start)
print(json.dumps({"forward": statistics.median(forward), "forward_backward": statistics.median(both)}))
"""


def measure(model_dir: str, threads: int, policy: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
    out = subprocess.run([sys.executable, "-c", MEASURE, model_dir, str(threads)], env=env, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    from scan import beside_busy

    rows = []
    for busy in (0, 1):
        with beside_busy(busy):
            for threads in (2, 1):
                for policy in (None, "PASSIVE"):
                    started = time.perf_counter()
                    row = {"busy": bool(busy), "threads": threads, "policy": policy or "default (spin)",
                           **measure(str(Path(args.model_dir)), threads, policy)}
                    row["seconds"] = time.perf_counter() - started
                    rows.append(row)
                    print(f"{'busy' if busy else 'idle':<5} threads {threads} {row['policy']:<15} forward "
                          f"{row['forward']:6.2f} s  forward+backward {row['forward_backward']:6.2f} s", flush=True)
    emit_json({"rows": rows}, args.json)


if __name__ == "__main__":
    main()
