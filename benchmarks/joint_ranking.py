"""A task's node circuit ranked two ways on a real model: EAP-IG's node scores against the joint path's shares.

    python benchmarks/joint_ranking.py --model DIR [--tasks ioi greater-than docstring] [--json out.json]

For each task (the built-in one written for the model's tokenizer, its default 32 pairs, seed 0, the default split
16 / 16), ``scan_task(model, task, edges=False, node_ranking=R)`` for ``R`` in ``eap-ig`` (the default) and
``joint`` (every node's share of the metric's change along the joint path from every node patched to none, the
induction scan's ranking), one after the other in this process. Printed and written as JSON: each scan's node
circuit (size, heads, faithfulness and necessity with their intervals), the held-out figures, every stage's counted
passes and seconds. Nodes are heads (MLPs recomputed), as the default scan's node circuit.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RANKINGS = ("eap-ig", "joint")


def measure(model, task, ranking: str) -> dict:
    from circuitkit.ranking import head_name
    from circuitkit.tasks import scan_task

    start = time.perf_counter()
    scan = scan_task(model, task, edges=False, node_ranking=ranking)
    seconds = time.perf_counter() - start
    c = scan.circuit
    out = {"ranking": ranking, "seconds": round(seconds, 1), "passes": round(scan.passes, 2),
           "stages": {s.name: [round(s.passes, 2), round(s.seconds, 1)] for s in scan.stages},
           "clean": float(scan.clean.mean()), "corrupted": float(scan.corrupted.mean())}
    if c is not None:
        other = c.other_set or {}
        out.update(size=len(c.heads), heads=[head_name(h) for h in c.heads], faithfulness=c.faithfulness,
                   faithfulness_ci=c.intervals.get("faithfulness"), necessity=c.necessity,
                   necessity_ci=c.intervals.get("necessity"),
                   curve=[(p.size, round(p.faithfulness, 4)) for p in c.curve],
                   held_out={k: other.get(k) for k in ("pairs", "faithfulness", "necessity")})
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--tasks", nargs="+", default=["ioi", "greater-than", "docstring"])
    parser.add_argument("--json", default=None, metavar="FILE")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    from _common import emit_json

    from circuitkit import tasks
    from circuitkit.models.loading import load_model

    model = load_model(args.model)
    rows = []
    for name in args.tasks:
        task = tasks.get_task(name, model)
        for ranking in RANKINGS:
            row = {"task": name, **measure(model, task, ranking)}
            rows.append(row)
            print(f"{name:13s} {ranking:7s} {row.get('size', '-'):>4} heads  faithfulness "
                  f"{row.get('faithfulness', float('nan')):.3f}  held out "
                  f"{(row.get('held_out') or {}).get('faithfulness') or float('nan'):.3f}  "
                  f"passes {row['passes']:.2f}  {row['seconds']:.0f} s", flush=True)
    emit_json({"model": args.model, "rows": rows}, args.json)


if __name__ == "__main__":
    main()
