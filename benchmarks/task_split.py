"""A task circuit's faithfulness on the pairs it was found on and on held-out pairs, side by side.

    python benchmarks/task_split.py --model DIR [--tasks ioi,greater-than] [--pairs 32] [--json out.json]

Each built-in task writes ``--pairs`` pairs (seed 0); ``scan_task`` splits them in half (``holdout=0.5``, split seed
0), ranks heads by EAP-IG on the discovery half, sizes the node circuit there (target 0.8, ``edges=False``) and
measures the same top-n head sets on the evaluation half. Prints, per task, the node curve on both halves and the
circuit's figures, then the JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--tasks", default="ioi,greater-than")
    parser.add_argument("--pairs", type=int, default=32)
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if not Path(args.model).is_dir():
        sys.exit(f"{args.model}: no such directory")
    import torch

    from circuitkit import tasks
    from circuitkit.models.loading import load_model

    torch.set_num_threads(2)
    bridge = load_model(args.model)
    out = {}
    for name in args.tasks.split(","):
        task = tasks.get_task(name, bridge, n=args.pairs, seed=0)
        started = time.perf_counter()
        result = tasks.scan_task(bridge, task, target=args.target, edges=False, n_resamples=200)
        seconds = time.perf_counter() - started
        c = result.circuit
        if c is None:
            print(f"{name}: no circuit ({result.circuit_error})")
            out[name] = {"error": result.circuit_error}
            continue
        other = c.other_set
        held = {p["size"]: p["faithfulness"] for p in other["curve"]}
        print(f"\n{name}: {task.n_pairs} pairs ({result.settings['split']['discovery_pairs']} discovery, "
              f"{other['pairs']} evaluation), metric {task.metric}, {seconds:.0f} s, {result.passes:.0f} passes")
        print(f"  clean {other['clean']:+.3f} / corrupted {other['corrupted']:+.3f} on the evaluation pairs; "
              f"{c.clean:+.3f} / {c.corrupted:+.3f} on the discovery pairs")
        print(f"  {'heads kept':>10} {'discovery':>10} {'evaluation':>11}")
        for point in c.curve:
            print(f"  {point.size:>10} {point.faithfulness:>10.3f} {held.get(point.size, float('nan')):>11.3f}")
        n = len(c.heads)
        lo, hi = c.intervals.get("faithfulness", (float("nan"), float("nan")))
        print(f"  circuit: {n} heads; faithfulness {c.faithfulness:.3f} [{lo:.3f}, {hi:.3f}] on discovery, "
              f"{other['faithfulness']:.3f} on evaluation; necessity {c.necessity:+.3f} / {other['necessity']:+.3f}")
        out[name] = {"pairs": task.n_pairs, "metric": task.metric, "seconds": round(seconds, 1),
                     "passes": result.passes, "heads": [f"{a}.{b}" for a, b in c.heads],
                     "discovery": {"faithfulness": c.faithfulness, "necessity": c.necessity, "clean": c.clean,
                                   "corrupted": c.corrupted, "ci": list(c.intervals.get("faithfulness", ())),
                                   "curve": [[p.size, p.faithfulness] for p in c.curve]},
                     "evaluation": {k: other[k] for k in ("pairs", "faithfulness", "necessity", "clean", "corrupted")}
                     | {"curve": [[p["size"], p["faithfulness"]] for p in other["curve"]]}}
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
