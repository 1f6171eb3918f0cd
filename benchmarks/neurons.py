"""A task circuit of heads and MLP neuron groups (MIB's neuron level) beside the circuit of heads alone.

    python benchmarks/neurons.py --model DIR [--task ioi] [--pairs 32] [--groups 16] [--runs heads,heads+neurons]
        [--json out.json]

The task writes ``--pairs`` pairs (seed 0); ``scan_task`` holds half out (``holdout=0.5``, split seed 0), ranks the
nodes by EAP-IG (3 points) on the discovery half and sizes the node circuit there (target 0.8, ``edges=False``):
once with heads alone (every MLP recomputed), once with each MLP's hidden units in ``--groups`` contiguous groups as
nodes beside the heads (``neuron_groups``; a group outside the circuit has its activations replaced by the
corrupted prompt's); ``heads+mlps``: whole MLPs as nodes instead (``mlp_nodes``). Prints each circuit's size,
faithfulness on both halves, necessity and cost, then the JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def _figures(scan, seconds: float) -> dict:
    c = scan.circuit
    if c is None:
        return {"error": scan.circuit_error}
    other = c.other_set or {}
    groups = list(c.nodes.get("neurons", ()))
    layers = sorted({int(g[1:].split(".n")[0]) for g in groups})
    return {"heads": [f"{a}.{b}" for a, b in c.heads], "n_heads": len(c.heads), "neuron_groups": groups,
            "n_groups": len(groups), "group_layers": layers,
            "mlps": list(c.mlps), "n_mlps": len(c.mlps), "nodes_total": c.n_nodes_total,
            "faithfulness": c.faithfulness, "ci": list(c.intervals.get("faithfulness", ())),
            "necessity": c.necessity, "clean": c.clean, "corrupted": c.corrupted,
            "curve": [[p.size, p.faithfulness] for p in c.curve],
            "evaluation": {k: other.get(k) for k in ("pairs", "faithfulness", "necessity", "clean", "corrupted")},
            "passes": scan.passes, "stages": [[s.name, s.passes] for s in scan.stages], "seconds": round(seconds, 1)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--task", default="ioi")
    parser.add_argument("--pairs", type=int, default=32)
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--json", default=None)
    parser.add_argument("--runs", default="heads,heads+neurons",
                        help="which circuits: heads, heads+mlps (whole MLPs as nodes), heads+neurons")
    args = parser.parse_args(argv)
    if not Path(args.model).is_dir():
        sys.exit(f"{args.model}: no such directory")
    import torch

    from circuitkit import tasks
    from circuitkit.models.loading import load_model

    torch.set_num_threads(2)
    bridge = load_model(args.model)
    task = tasks.get_task(args.task, bridge, n=args.pairs, seed=0)
    out = {"task": args.task, "pairs": task.n_pairs, "groups_per_layer": args.groups, "target": args.target}
    from circuitkit.tasks import scan as scan_module

    search = scan_module.node_circuit

    def announced(*a, **k):  # the node circuit as soon as it is found (the held-out stage follows)
        found = search(*a, **k)
        groups = sum(len(m) for m in found.nodes.values())
        print(f"  node circuit: {len(found.heads)} heads + {groups} neuron groups of {found.n_nodes} nodes, "
              f"faithfulness {found.faithfulness:.4f}, necessity {found.necessity:+.3f}; {dict(found.nodes)}; "
              f"heads {list(found.heads)}; curve {[(p.size, round(p.faithfulness, 4)) for p in found.curve]}",
              flush=True)
        return found

    scan_module.node_circuit = announced
    settings = {"heads": {}, "heads+mlps": {"mlp_nodes": True}, "heads+neurons": {"neuron_groups": args.groups}}
    for key in args.runs.split(","):
        extra = settings[key]
        started = time.perf_counter()
        scan = tasks.scan_task(bridge, task, target=args.target, edges=False, n_resamples=200, **extra,
                               progress=lambda stage, passes, t=started: print(
                                   f"  {stage}: {passes:.0f} passes, {time.perf_counter() - t:.0f} s", flush=True))
        out[key] = figures = _figures(scan, time.perf_counter() - started)
        if "error" in figures:
            print(f"{key}: no circuit ({figures['error']})")
            continue
        held = figures["evaluation"]
        print(f"\n{key}: {figures['n_heads']} heads + {figures['n_mlps']} MLPs + {figures['n_groups']} neuron groups "
              f"of {figures['nodes_total']} "
              f"nodes; faithfulness {figures['faithfulness']:.3f} (discovery), {held['faithfulness']:.3f} "
              f"(evaluation); necessity {figures['necessity']:+.3f}; {figures['passes']:.0f} passes, "
              f"{figures['seconds']:.0f} s")
        print("  curve: " + "  ".join(f"{n}: {f:.3f}" for n, f in figures["curve"]))
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
