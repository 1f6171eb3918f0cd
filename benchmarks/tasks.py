"""Task circuits on a real pretrained model: the metric, the node and edge circuits, their faithfulness, and cost.

    python ../shared/models/qwen25_coder_05b.py /tmp/qwen          # once: the real model as a local directory
    python benchmarks/tasks.py --model /tmp/qwen --tasks ioi,docstring,greater-than --pairs 16

For each task: one plain forward pass of the task's clean prompts (the unit of cost), then
``circuitkit.tasks.scan_task`` at target 0.8. Reported: the mean metric on clean and corrupted prompts, the node
circuit (heads and MLPs, its share of the heads, faithfulness, necessity), the edge circuit (edges, share of all
edges, faithfulness), CPR / CMD of the edge curve at MIB's sizes, whether the heads with the task's own largest head
score are in the circuit, and each stage's cost in counted forward passes and seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def forward_seconds(model, task, repeats: int = 2) -> float:
    """Median seconds of one plain forward pass of the task's clean prompts (logits at every position)."""
    from circuitkit.models.adapters import adapt

    adapter = adapt(model)
    batch = task.tokenize(adapter)
    times = []
    with torch.no_grad():
        for _ in range(repeats):
            start = time.perf_counter()
            adapter.run(batch.clean)
            times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def measure(model, name: str, pairs: int, seed: int, target: float) -> dict:
    from circuitkit import tasks
    from circuitkit.ranking import head_name, top_heads

    task = tasks.get_task(name, model, n=pairs, seed=seed)
    forward = forward_seconds(model, task)
    start = time.perf_counter()
    result = tasks.scan_task(model, task, target=target)
    seconds = time.perf_counter() - start
    out = {"task": name, "pairs": task.n_pairs, "metric": task.metric, "forward_s": forward, "scan_s": seconds,
           "passes": result.passes, "clean": float(result.clean.mean()), "corrupted": float(result.corrupted.mean()),
           "stages": [{"name": s.name, "passes": s.passes, "seconds": s.seconds} for s in result.stages],
           "error": result.circuit_error}
    c = result.circuit
    if c is not None:
        n_heads = result.model.n_layers * result.model.n_heads
        out.update(heads=[head_name(h) for h in c.heads], mlps=list(c.mlps), heads_total=n_heads,
                   head_share=len(c.heads) / n_heads,
                   faithfulness=c.faithfulness, necessity=c.necessity, node_curve=[p.to_json() for p in c.curve],
                   edges=len(c.edges), edges_total=c.n_edges_total, edge_share=len(c.edges) / c.n_edges_total,
                   edge_faithfulness=c.edge_faithfulness, cpr=c.cpr, cmd=c.cmd,
                   edge_curve=[p.to_json() for p in c.edge_curve],
                   strongest=[e.to_json() for e in c.edge_effects])
        for score, values in result.head_scores.items():
            best = [h for h, _ in top_heads(values, 3)]
            out[f"top_{score}"] = {head_name(h): h in c.heads for h in best}
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="a local Hugging Face directory (see the module docstring)")
    parser.add_argument("--tasks", default="ioi,docstring,greater-than")
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--json", default=None, metavar="FILE")
    args = parser.parse_args(argv)
    from circuitkit.models.loading import load_model

    if not Path(args.model).is_dir():
        sys.exit(f"{args.model}: no such directory (python ../shared/models/qwen25_coder_05b.py {args.model})")
    model = load_model(args.model)
    rows = []
    for name in args.tasks.split(","):
        row = measure(model, name, args.pairs, args.seed, args.target)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("\n| task | clean -> corrupted | node circuit (share of heads) | faithfulness | edges (share) | edge faith. "
          "| CPR / CMD | passes | seconds (x forward) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r.get("error"):
            print(f"| {r['task']} | {r['clean']:+.2f} -> {r['corrupted']:+.2f} | no circuit: {r['error'][:60]} |")
            continue
        print(f"| {r['task']} | {r['clean']:+.2f} -> {r['corrupted']:+.2f} | {len(r['heads'])} heads + "
              f"{len(r['mlps'])} MLPs ({r['head_share']:.1%}) | {r['faithfulness']:.2f} | {r['edges']} "
              f"({r['edge_share']:.2%}) | {r['edge_faithfulness']:.2f} | {r['cpr']:.2f} / {r['cmd']:.2f} | "
              f"{r['passes']:.0f} | {r['scan_s']:.0f} ({r['scan_s'] / r['forward_s']:.0f}x) |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
