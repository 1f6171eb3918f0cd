"""Grouped vs per-query-head key/value edges on a real grouped-query model: graph sizes, edge circuits, MIB's areas.

    OMP_NUM_THREADS=1 nice python benchmarks/gqa_edges.py --model /work/models/qwen [--pairs 16] [--steps 3]
        [--target 0.8] [--json benchmarks/results/gqa_edges_qwen.json]

IOI (``circuitkit.tasks.generators.ioi``, ``--pairs`` pairs, seed 0, every pair searched on: no held-out split),
MLPs in the graph, edges ranked by absolute EAP-IG score (``--steps`` points, EAP-IG's own). For each graph
(``kv_edges="grouped"``: one key and one value receiver per key/value head; ``"per-query-head"``: one per query
head, EAP-IG's graph): the edge count, EAP-IG's scores (one attribution), the edge circuit at ``--target``
(``tasks.circuit.edge_circuit``: MIB's sizes under both rankings, bisection, the strongest edges' exact effects),
MIB's CPR and CMD, the wall time and passes of each step. A grouped key/value edge stands for as many of EAP-IG's
edges as its group has query heads: ``eap_ig_edges`` counts each circuit in EAP-IG's edges. The two runners share
the clean and corrupted runs (the same senders); ``identity`` is the largest difference between each grouped
key/value edge's score and the sum of its query heads' per-query-head scores (equal in exact arithmetic).

Writes the JSON atomically after each graph (a partial file names the graphs done) and prints a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from _common import write_json_atomic  # benchmarks/ is on sys.path when a script here runs

GRAPHS = ("grouped", "per-query-head")


def eap_ig_edges(names: Any, group: int) -> int:
    """EAP-IG's edges a circuit of edge ``names`` keeps: a grouped key/value edge (``->L.gG:k``) is ``group`` of
    them (one per query head of the group), every other edge one."""
    return sum(group if ".g" in name.split("->")[1] else 1 for name in names)


def identity(grouped: Any, per_head: Any, g_graph: Any, p_graph: Any, group: int) -> dict[str, float]:
    """The largest ``|grouped - sum over the group's query heads of per-query-head|`` over the key/value edges, and
    the largest grouped score, for scale; the same for the other receivers (equal)."""
    worst, scale, other = 0.0, 0.0, 0.0
    for layer in range(g_graph.n_layers):
        g_cols, p_cols = g_graph.receivers_of(layer), p_graph.receivers_of(layer)
        for channel in ("k", "v"):
            a = grouped[:, g_cols[channel]]
            b = per_head[:, p_cols[channel]].reshape(a.shape[0], a.shape[1], group).sum(-1)
            worst = max(worst, float((a - b).abs().max()))
            scale = max(scale, float(a.abs().max()))
        for channel in ("q", "mlp"):
            other = max(other, float((grouped[:, g_cols[channel]] - per_head[:, p_cols[channel]]).abs().max()))
    return {"kv_max_abs_difference": worst, "kv_max_abs_score": scale, "other_max_abs_difference": other}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--json", default="benchmarks/results/gqa_edges_qwen.json")
    args = parser.parse_args(argv)

    import torch

    from circuitkit import tasks
    from circuitkit.graph.runner import TaskRunner
    from circuitkit.models.adapters import adapt
    from circuitkit.models.loading import load_model
    from circuitkit.tasks.circuit import edge_circuit

    def log(text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)

    torch.manual_seed(0)
    started = time.perf_counter()
    model = load_model(args.model)
    adapter = adapt(model)
    spec = adapter.spec
    group = spec.n_heads // spec.n_kv_heads
    task = tasks.get_task("ioi", model, n=args.pairs, seed=0)
    batch = task.tokenize(adapter, None)
    log(f"loaded in {time.perf_counter() - started:.0f} s: {spec.n_layers} x {spec.n_heads} heads, "
        f"{spec.n_kv_heads} key/value heads; {batch.n_pairs} pairs of {batch.pos} tokens")
    out: dict[str, Any] = {
        "model": args.model, "layers": spec.n_layers, "heads": spec.n_heads, "kv_heads": spec.n_kv_heads,
        "task": "ioi", "pairs": batch.n_pairs, "tokens": batch.pos, "ig_steps": args.steps, "ig_points": "left",
        "target": args.target, "rank": "abs", "threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "graphs": {}}
    path = Path(args.json)
    shared = None
    scores_of: dict[str, Any] = {}
    graphs: dict[str, Any] = {}
    for kind in GRAPHS:
        runner = TaskRunner(adapter, batch, task.metric, mlps=True, ablation=task.ablation, kv_edges=kind)
        t0 = time.perf_counter()
        if shared is None:
            _ = runner.clean, runner.corrupted
            shared = runner
            reference_seconds = time.perf_counter() - t0
            out["reference_seconds"] = reference_seconds
            out["clean"] = float(runner.clean["metric"].mean())
            out["corrupted"] = float(runner.corrupted["metric"].mean())
        else:  # the same senders: the reference runs are shared
            runner._clean, runner._corrupt = shared._clean, shared._corrupt
        graph = runner.graph
        passes0 = runner.passes
        t0 = time.perf_counter()
        scores, _ = runner.edge_gradients(args.steps)
        attribute_seconds, attribute_passes = time.perf_counter() - t0, runner.passes - passes0
        log(f"{kind}: {graph.n_edges} edges; attribution {attribute_seconds:.0f} s")
        scores_of[kind], graphs[kind] = scores, graph
        t0, passes0 = time.perf_counter(), runner.passes
        names, faith, curve, cpr, cmd, effects, n_edges, areas = edge_circuit(runner, scores, args.target, "abs")
        circuit_seconds, circuit_passes = time.perf_counter() - t0, runner.passes - passes0
        log(f"{kind}: circuit of {len(names)} edges (faithfulness {faith:.3f}), CPR {cpr:.3f}, CMD {cmd:.3f}; "
            f"{circuit_seconds:.0f} s")
        out["graphs"][kind] = {
            "edges_total": n_edges, "receivers": len(graph.receivers), "kv_copies": graph.kv_copies,
            "circuit_edges": len(names), "circuit_eap_ig_edges": eap_ig_edges(names, group),
            "circuit_faithfulness": faith, "cpr": cpr, "cmd": cmd, "mib_areas": areas,
            "kv_edges_in_circuit": sum(1 for n in names if n.split("->")[1][-2:] in (":k", ":v")),
            "curve": [p.to_json() for p in curve],
            "strongest_edges": [e.to_json() for e in effects],
            "attribute_seconds": attribute_seconds, "attribute_passes": attribute_passes,
            "circuit_seconds": circuit_seconds, "circuit_passes": circuit_passes,
            "edges": list(names)}
        if len(scores_of) == 2:
            out["identity"] = identity(scores_of["grouped"], scores_of["per-query-head"], graphs["grouped"],
                                       graphs["per-query-head"], group)
        out["seconds"] = time.perf_counter() - started
        write_json_atomic(path, out)
    for kind, row in out["graphs"].items():
        print(f"{kind:15s} edges {row['edges_total']:7d}  circuit {row['circuit_edges']:6d} "
              f"({row['circuit_eap_ig_edges']} EAP-IG edges) faithfulness {row['circuit_faithfulness']:.3f}  "
              f"CPR {row['cpr']:.3f}  CMD {row['cmd']:.3f}  attribution {row['attribute_seconds']:.0f} s  "
              f"circuit {row['circuit_seconds']:.0f} s")
    print(json.dumps(out.get("identity"), indent=1))


if __name__ == "__main__":
    main()
