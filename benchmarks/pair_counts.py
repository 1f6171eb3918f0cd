"""How stable a task circuit is as the pairs it is found on grow: 16, 32, 64, 96 IOI pairs on a real model.

    nice python benchmarks/pair_counts.py --model DIR [--counts 16,32,64,96] [--held-out 32] [--edges 16,32]
        [--json benchmarks/results/pair_counts_qwen.json]

``circuitkit.tasks.ioi(model, n=max(counts) + held_out, seed=0)`` writes the pairs (the generator draws them in
order, so the first 96 are ``ioi(model, n=96)``'s); the last ``--held-out`` pairs are set aside. For each count
``n`` the circuit is found on the first ``n`` pairs by ``scan_task(..., holdout=0, target=0.8)`` (EAP-IG with the
scan's default points and steps; nodes = heads, MLPs recomputed), then measured on the held-out pairs: the same
heads kept, every other head patched from the corrupted prompt, faithfulness ``(m_C - m_all) / (m_clean - m_all)``
there. Reported per count: the circuit's size, its faithfulness on its own pairs and on the held-out ones, and the
Jaccard index of its heads with the circuit found on the most pairs (the largest count that gave one: a count the
memory plan refuses on this machine is recorded with its reason). ``--edges``: the counts at which the edge
circuit is found too (much dearer: every edge pass holds every sender's output), measured the same way.
Results are written after every count (atomically), so a run stopped early keeps what it measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def _jaccard(a: set, b: set) -> float | None:
    return len(a & b) / len(a | b) if a | b else None


def _write(path: Path, data: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _counts(text: str) -> list[int]:
    return sorted({int(x) for x in text.split(",") if x.strip()})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--counts", type=_counts, default=[16, 32, 64, 96])
    parser.add_argument("--held-out", type=int, default=32)
    parser.add_argument("--edges", type=_counts, default=[])
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--json", default="benchmarks/results/pair_counts_qwen.json")
    args = parser.parse_args(argv)
    if not Path(args.model).is_dir():
        sys.exit(f"{args.model}: no such directory")
    import torch

    from circuitkit import CircuitkitError
    from circuitkit.models.adapters import adapt
    from circuitkit.models.loading import load_model
    from circuitkit.tasks import ioi, scan_task
    from circuitkit.tasks.graph import TaskRunner

    torch.set_num_threads(2)
    bridge = load_model(args.model)
    adapter = adapt(bridge)
    most = max(args.counts)
    task = ioi(bridge, n=most + args.held_out, seed=0)

    def first(n: int, start: int = 0):
        return dataclasses.replace(task, pairs=task.pairs[start:start + n], marks=task.marks[start:start + n])

    held_task = first(args.held_out, most)
    held = TaskRunner(adapter, held_task.tokenize(adapter), task.metric, mlps=True, ablation="corrupted")
    held_clean = float(held.clean["metric"].mean())
    L, H = adapter.spec.n_layers, adapter.spec.n_heads
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    out: dict = {"model": args.model, "task": "ioi", "seed": 0, "target": args.target, "commit": commit,
                 "held_out_pairs": args.held_out, "held_out_clean": held_clean,
                 "held_out_corrupted": float(held.corrupted["metric"].mean()), "counts": {}}
    path = Path(args.json)
    heads_of: dict[int, set] = {}
    edges_of: dict[int, set] = {}
    for n in args.counts:
        started = time.perf_counter()
        edges = n in args.edges
        try:
            result = scan_task(bridge, first(n), target=args.target, holdout=0, edges=edges, n_resamples=200)
        except CircuitkitError as exc:  # e.g. the memory plan refuses this many pairs here: said, not hidden
            out["counts"][str(n)] = {"pairs": n, "error": str(exc)}
            print(f"{n} pairs: {exc}", flush=True)
            _write(path, out)
            continue
        seconds = time.perf_counter() - started
        c = result.circuit
        if c is None:
            out["counts"][str(n)] = {"error": result.circuit_error}
            _write(path, out)
            continue
        heads_of[n] = set(c.heads)
        mask = torch.ones(2, L, H, dtype=torch.bool)  # True: patched; set 0 every head, set 1 all but the circuit
        for layer, h in c.heads:
            mask[1, layer, h] = False
        all_patched, kept = held.node_metric(mask, None).tolist()
        row = {"pairs": n, "seconds": round(seconds, 1), "passes": result.passes,
               "settings": {k: result.settings[k] for k in ("ig_steps", "ig_points", "rank")},
               "heads": [f"{a}.{b}" for a, b in c.heads], "faithfulness": c.faithfulness,
               "held_out_faithfulness": (kept - all_patched) / (held_clean - all_patched),
               "held_out_all_patched": all_patched}
        if edges and c.edges:
            edges_of[n] = set(c.edges)
            graph = held.graph
            index = graph.allowed.nonzero()
            where = {name: i for i, name in enumerate(graph.edge_names(index))}
            kept_mask = torch.zeros_like(graph.allowed)
            chosen = index[[where[e] for e in c.edges]]
            kept_mask[chosen[:, 0], chosen[:, 1]] = True
            m_edges = float(held.edge_metric(kept_mask[None])[0])
            row.update({"edges": len(c.edges), "edges_total": c.n_edges_total, "edge_faithfulness": c.edge_faithfulness,
                        "held_out_edge_faithfulness": (m_edges - out["held_out_corrupted"])
                        / (held_clean - out["held_out_corrupted"]),
                        "cpr": c.to_json().get("cpr"), "cmd": c.to_json().get("cmd")})
        out["counts"][str(n)] = row
        print(f"{n} pairs: {len(c.heads)} heads, faithfulness {c.faithfulness:.3f} (held out "
              f"{row['held_out_faithfulness']:.3f}), {seconds:.0f} s"
              + (f"; {row['edges']} edges, {row['edge_faithfulness']:.3f} (held out "
                 f"{row['held_out_edge_faithfulness']:.3f})" if "edges" in row else ""), flush=True)
        _write(path, out)
    if heads_of:  # against the circuit found on the most pairs (the largest count that gave one)
        top = max(heads_of)
        out["jaccard_reference_pairs"] = top
        for n, heads in heads_of.items():
            out["counts"][str(n)]["jaccard_heads"] = _jaccard(heads, heads_of[top])
    for n, edges in edges_of.items():
        top = max(edges_of)
        out["counts"][str(n)]["jaccard_edges_with"] = {"pairs": top, "jaccard": _jaccard(edges, edges_of[top])}
    _write(path, out)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
