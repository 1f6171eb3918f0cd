"""The IOI task scan's counted passes and figures on a real model, stage by stage (one run).

    python benchmarks/task_passes.py --model /work/models/qwen --pairs 16 --json out.json

``circuitkit.tasks.scan_task(model, ioi(model, n=16, seed=0), target=0.8)`` with its defaults (8 discovery pairs, 8
held out, EAP-IG with 3 points, node and edge circuits). Reported: every stage's counted passes and seconds, the
node circuit (heads, faithfulness, necessity, the curve's sizes), the edge circuit (edges, faithfulness, CPR/CMD),
the held-out figures.
"""

from __future__ import annotations

import argparse
import json
import time


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--holdout", type=float, default=0.5)
    parser.add_argument("--json", default=None, metavar="FILE")
    args = parser.parse_args(argv)
    from circuitkit import tasks
    from circuitkit.models.loading import load_model
    from circuitkit.ranking import head_name

    model = load_model(args.model)
    task = tasks.get_task("ioi", model, n=args.pairs, seed=args.seed)
    start = time.perf_counter()
    result = tasks.scan_task(model, task, target=0.8, holdout=args.holdout)
    seconds = time.perf_counter() - start
    c = result.circuit
    out = {"pairs": task.n_pairs, "holdout": args.holdout, "seconds": seconds, "passes": result.passes,
           "stages": [{"name": s.name, "passes": s.passes, "seconds": round(s.seconds, 2)} for s in result.stages],
           "clean": float(result.clean.mean()), "corrupted": float(result.corrupted.mean()),
           "error": result.circuit_error}
    if c is not None:
        out.update(heads=[head_name(h) for h in c.heads], faithfulness=c.faithfulness, necessity=c.necessity,
                   node_curve=[(p.size, round(p.faithfulness, 4)) for p in c.curve], edges=len(c.edges),
                   edges_total=c.n_edges_total, edge_faithfulness=c.edge_faithfulness, cpr=c.cpr, cmd=c.cmd,
                   edge_curve=[(p.size, round(p.faithfulness, 4)) for p in c.edge_curve],
                   effects=[e.to_json() for e in c.edge_effects],
                   held_out={k: v for k, v in (c.other_set or {}).items() if k != "curve"})
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
