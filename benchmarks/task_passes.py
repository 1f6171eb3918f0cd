"""The IOI task scan's counted passes and figures on a real model, stage by stage (one run).

    python benchmarks/task_passes.py --model /work/models/qwen --pairs 16 --json out.json

``circuitkit.tasks.scan_task(model, ioi(model, n=16, seed=0), target=0.8)`` with its defaults (8 discovery pairs, 8
held out, EAP-IG with 3 points, node and edge circuits). Reported: every stage's counted passes and seconds, the
node circuit (heads, faithfulness, necessity, the curve's sizes), the edge circuit (edges, faithfulness, CPR/CMD),
the held-out figures; and what direct logit attribution's backward adds to the clean run (:func:`clean_backward`)
and what EAP-IG's pass costs in forward passes (:func:`attribution_cost`).
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
    out["clean_backward"] = clean_backward(model, task, args.holdout, args.seed)
    out["attribution_cost"] = attribution_cost(model, task, args.holdout, args.seed)
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(text + "\n")


def clean_backward(model, task, holdout: float, seed: int, repeats: int = 3) -> dict:
    """What direct logit attribution's backward adds to the clean run (counted as one pass): the clean reference pass
    on the discovery pairs with and without it, timed alternately ``repeats`` times each (median seconds), and the
    autograd nodes the backward walks (the final norm and the unembedding, not the model's layers)."""
    import statistics

    import torch

    from circuitkit.graph.runner import TaskRunner
    from circuitkit.models.adapters import adapt
    from circuitkit.tasks.scan import split_pairs

    adapter = adapt(model)
    batch = task.tokenize(adapter)
    discovery, _ = split_pairs(task.n_pairs, holdout, seed)
    runner = TaskRunner(adapter, batch.subset(discovery), task.metric, mlps=not adapter.attn_only,
                        ablation=task.ablation)
    nodes: list[int] = []
    real_grad = torch.autograd.grad

    def counting(outputs, inputs, *args, **kwargs):
        seen, todo = set(), [outputs.grad_fn]
        while todo:
            node = todo.pop()
            if node is not None and node not in seen:
                seen.add(node)
                todo += [f for f, _ in node.next_functions]
        nodes.append(len(seen))
        return real_grad(outputs, inputs, *args, **kwargs)

    times: dict[bool, list[float]] = {True: [], False: []}
    torch.autograd.grad = counting
    try:
        for _ in range(repeats):
            for dla in (False, True):
                start = time.perf_counter()
                runner._reference(runner.batch.clean, dla=dla)
                times[dla].append(time.perf_counter() - start)
    finally:
        torch.autograd.grad = real_grad
    plain, with_dla = statistics.median(times[False]), statistics.median(times[True])
    return {"seconds_forward": plain, "seconds_with_dla": with_dla, "share_added": with_dla / plain - 1,
            "autograd_nodes": nodes[0] if nodes else None, "runs": {str(k): v for k, v in times.items()}}


def attribution_cost(model, task, holdout: float, seed: int, steps: int = 3, repeats: int = 2) -> dict:
    """What EAP-IG's stacked pass (counted ``3 * steps``: a backward counts two) costs in forward passes of the
    pairs, measured: ``runner.attribute(steps)`` against a plain forward of ``steps`` stacked copies of the discovery
    pairs, timed alternately ``repeats`` times each (median seconds). Informational: the count is not changed."""
    import statistics

    import torch

    from circuitkit.graph.runner import TaskRunner
    from circuitkit.models.adapters import adapt
    from circuitkit.tasks.scan import split_pairs

    adapter = adapt(model)
    batch = task.tokenize(adapter)
    discovery, _ = split_pairs(task.n_pairs, holdout, seed)
    runner = TaskRunner(adapter, batch.subset(discovery), task.metric, mlps=not adapter.attn_only,
                        ablation=task.ablation)
    _ = runner.clean, runner.corrupted
    times: dict[str, list[float]] = {"attribute": [], "forward": []}
    for _ in range(repeats):
        start = time.perf_counter()
        with torch.no_grad():
            adapter.run(runner.batch.clean.repeat(steps, 1), positions=runner.positions)
        times["forward"].append(time.perf_counter() - start)
        start = time.perf_counter()
        runner.attribute(steps)
        times["attribute"].append(time.perf_counter() - start)
    forward, attribute = statistics.median(times["forward"]), statistics.median(times["attribute"])
    return {"steps": steps, "seconds_forward": forward, "seconds_attribute": attribute,
            "forward_passes_per_point": attribute / forward, "counted_per_point": 3.0, "runs": times}


if __name__ == "__main__":
    main()
