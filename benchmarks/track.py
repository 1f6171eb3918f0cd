"""``circuitkit.track`` over a series of checkpoints: peak memory against one scan, and cost per checkpoint.

Checkpoints: ``N`` Hugging Face GPT-2-shaped models with random weights (seeds 0..N-1; 4 layers x 8 heads,
d_model 512, vocab 50257, ~38M parameters, ~150 MB each in float32), saved by this script as
``checkpoint-<k>/`` in a temporary directory.

Each measurement runs in a child process of its own (``_common.run_child``), its peak resident set reset just
before the measured call, so every figure includes loading the model(s) from disk:

- ``track N``: ``ck.track(dir)`` over the first ``N`` checkpoints (N = 1 and N = ``--n``);
- ``scan``: ``load_model`` of one checkpoint then ``ck.scan(model)`` (defaults).

Memory is bounded by one model when ``track N`` peaks about where ``track 1`` does (ratio ~1), not ``N`` times it.

Cost per checkpoint, in forward passes of the track's own batch (``RepeatedTokens()``): the median seconds of
``ck.track([model])`` on an already loaded model (measurement only) over the median seconds of one forward pass,
both in one child, interleaved; and the seconds to load a checkpoint.

Run: ``python benchmarks/track.py [--n 6] [--threads 2] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import (  # benchmarks/ is on sys.path when a script here runs
    child_main,
    emit_json,
    format_bytes,
    interleaved_medians,
    memory_now,
    memory_report,
    print_table,
    run_child,
)

SHAPE = dict(n_layer=4, n_head=8, n_embd=512, vocab_size=50257, n_positions=256)


def save_series(root: Path, n: int) -> list[str]:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    paths = []
    for k in range(n):
        torch.manual_seed(k)
        path = root / f"checkpoint-{k}"
        GPT2LMHeadModel(GPT2Config(**SHAPE)).save_pretrained(path)
        paths.append(str(path))
    return paths


def _threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def child_track(paths: list[str], threads: int) -> dict[str, Any]:
    import circuitkit as ck

    _threads(threads)
    before = memory_now("cpu")
    start = time.perf_counter()
    ck.track(paths, progress=False)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, **memory_report(before, "cpu")}


def child_scan(path: str, threads: int) -> dict[str, Any]:
    import circuitkit as ck
    from circuitkit.models.loading import load_model

    _threads(threads)
    before = memory_now("cpu")
    start = time.perf_counter()
    ck.scan(load_model(path), progress=False)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, **memory_report(before, "cpu")}


def child_cost(path: str, threads: int, repeats: int) -> dict[str, Any]:
    import torch

    import circuitkit as ck
    from circuitkit.detect.tokens import RepeatedTokens
    from circuitkit.models.adapters import adapt
    from circuitkit.models.loading import load_model

    _threads(threads)
    start = time.perf_counter()
    model = load_model(path)
    load_s = time.perf_counter() - start
    adapter = adapt(model)
    batch = RepeatedTokens().build(adapter)

    def forward() -> None:
        with torch.no_grad():
            adapter.run(batch.tokens)

    def measured() -> None:
        ck.track([model], steps=[0], tokens=batch, progress=False)

    def measured_no_edges() -> None:
        ck.track([model], steps=[0], tokens=batch, progress=False, top_k=0)

    forward_s, track_s, no_edges_s = interleaved_medians([forward, measured, measured_no_edges], repeats)
    return {"load_s": load_s, "forward_s": forward_s, "track_s": track_s, "track_no_edges_s": no_edges_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=6, help="checkpoints in the series (6)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ck-track-bench-") as tmp:
        paths = save_series(Path(tmp), args.n)
        rows = []
        for name, function, kwargs in (
            ("track 1", "track", {"paths": paths[:1]}),
            (f"track {args.n}", "track", {"paths": paths}),
            ("scan (1 model)", "scan", {"path": paths[0]}),
        ):
            result = run_child(__file__, function, threads=args.threads, **kwargs)
            rows.append({"call": name, **result})
        cost = run_child(__file__, "cost", path=paths[0], threads=args.threads, repeats=args.repeats)
    one = rows[0].get("peak_above_inputs_bytes")
    for row in rows:
        peak = row.get("peak_above_inputs_bytes")
        row["peak"] = format_bytes(peak)
        row["vs_track_1"] = f"{peak / one:.2f}x" if peak and one else "-"
        row["time"] = f"{row['seconds']:.1f} s" if "seconds" in row else row.get("error", "-")
    print_table(rows, [("call", "call"), ("peak", "peak memory (load + measure)"), ("vs_track_1", "vs track 1"),
                       ("time", "wall time")], title=f"circuitkit.track memory, {args.threads} threads")
    if "error" not in cost:
        cost["forward_passes_per_checkpoint"] = cost["track_s"] / cost["forward_s"]
        cost["forward_passes_per_checkpoint_no_edges"] = cost["track_no_edges_s"] / cost["forward_s"]
        passes, bare = cost["forward_passes_per_checkpoint"], cost["forward_passes_per_checkpoint_no_edges"]
        print(f"\none forward pass {cost['forward_s']:.3f} s; measuring a checkpoint {cost['track_s']:.3f} s = "
              f"{passes:.1f} forward passes ({bare:.1f} without composition edges); loading it {cost['load_s']:.1f} s")
    emit_json({"benchmark": "track", "shape": SHAPE, "n": args.n, "threads": args.threads, "memory": rows,
               "cost": cost}, args.json)


if __name__ == "__main__":
    if "--child" in sys.argv:
        child_main({"track": child_track, "scan": child_scan, "cost": child_cost})
    else:
        main()
