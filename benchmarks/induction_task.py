"""The induction scan and the induction task (``repeated-tokens`` on the task engine), side by side on the bundled
model: the circuit, its faithfulness, the curve, the ranking and the top edges, and each cause of a difference
measured by changing one setting of the task scan at a time.

    python benchmarks/induction_task.py [--json benchmarks/results/induction_task.json]

Both read the same 16 sequences of repeated random tokens (seed 0), the same loss on the repeated copies (the task's
metric is its negative: ``next_token_logprob``, per sequence) and the same clean mean ablation. The task engine
measures the induction scan's own circuit too (``node_metric`` with every other head patched), which isolates the
search (ranking, split) from the measurement.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import emit_json, print_table  # noqa: E402


def _names(heads: Any) -> list[str]:
    return [f"{layer}.{head}" for layer, head in heads]


def _edge(e: Any) -> str:
    return f"{e.src[0]}.{e.src[1]}->{e.dst[0]}.{e.dst[1]}:{e.channel}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", default=None, help="write the figures here too")
    args = parser.parse_args(argv)
    import circuitkit as ck
    from circuitkit import zoo
    from circuitkit.circuits.curve import faithfulness_of
    from circuitkit.graph.runner import TaskRunner
    from circuitkit.models.adapters import adapt
    from circuitkit.tasks import repeated_tokens, scan_task

    scan = ck.scan()
    v = scan.verified
    model = zoo.load()
    out: dict[str, Any] = {"induction_scan": {
        "heads": _names(v.heads), "faithfulness": v.faithfulness, "necessity_nats": v.necessity,
        "clean_loss": v.clean_loss, "all_ablated_loss": v.all_ablated_loss, "ranking": _names(v.ranking),
        "curve": [[p.size, p.faithfulness] for p in v.curve], "passes": v.passes,
        "top_edges": [[_edge(e), e.effect] for e in sorted(v.edges.edges, key=lambda e: -abs(e.effect))[:5]]}}
    runs = {"task (default: holdout 0.5)": dict(), "task, holdout 0": dict(holdout=0.0),
            "task, holdout 0, corrupted mean": dict(holdout=0.0, ablation="mean"),
            "task, holdout 0, counterfactual": dict(holdout=0.0, ablation="corrupted")}
    rows = [{"run": "induction scan", "heads": ", ".join(_names(v.heads)), "faith": f"{v.faithfulness:.3f}",
             "clean": f"{-v.clean_loss:.4f}", "all": f"{-v.all_ablated_loss:.3f}"}]
    for label, options in runs.items():
        ablation = options.pop("ablation", "clean_mean")
        task = repeated_tokens(model, 16, ablation=ablation)
        result = scan_task(model, task, **options)
        c = result.circuit
        out[label] = {"heads": _names(c.heads), "faithfulness": c.faithfulness, "necessity_nats": c.necessity,
                      "clean": c.clean, "all_patched": c.node_corrupted, "corrupted": c.corrupted,
                      "curve": [[p.size, p.faithfulness] for p in c.curve], "edges": len(c.edges),
                      "edge_faithfulness": c.edge_faithfulness, "cpr": c.cpr, "cmd": c.cmd,
                      "top_edges": [[e.name, e.effect, e.score] for e in c.edge_effects[:5]]}
        rows.append({"run": label, "heads": ", ".join(_names(c.heads)), "faith": f"{c.faithfulness:.3f}",
                     "clean": f"{c.clean:.4f}", "all": f"{c.node_corrupted:.3f}"})
    # the induction scan's own circuit measured by the task engine, on all 16 sequences
    adapter = adapt(model)
    task = repeated_tokens(model, 16)
    runner = TaskRunner(adapter, task.tokenize(adapter), task.metric, mlps=False, ablation=task.ablation)
    L, H = adapter.spec.n_layers, adapter.spec.n_heads
    patched = torch.ones(3, L, H, dtype=torch.bool)
    patched[0] = False
    for layer, head in v.heads:
        patched[1, layer, head] = False
    metric = runner.node_metric(patched, None)
    same = faithfulness_of(float(metric[1]), float(metric[0]), float(metric[2]))
    out["induction circuit on the task engine"] = {"clean": float(metric[0]), "circuit": float(metric[1]),
                                                   "all_patched": float(metric[2]), "faithfulness": same}
    rows.append({"run": "its circuit, task engine", "heads": ", ".join(_names(v.heads)), "faith": f"{same:.3f}",
                 "clean": f"{float(metric[0]):.4f}", "all": f"{float(metric[2]):.3f}"})
    # the induction scan's path-patched edges, each patched alone on the task engine's edge graph
    graph = runner.graph
    kept = graph.allowed[None].repeat(len(v.edges.edges), 1, 1)
    for i, e in enumerate(v.edges.edges):
        receiver = graph.receivers.index(f"{e.dst[0]}.{e.dst[1]}:{e.channel}")
        kept[i, graph.sender_index(*e.src), receiver] = False
    patched_edges = runner.edge_metric(kept)
    out["induction edges on the task engine"] = [
        {"edge": _edge(e), "induction_scan": e.effect,
         "task_engine": float(metric[0]) - float(patched_edges[i])} for i, e in enumerate(v.edges.edges)]
    print_table(rows, [("run", "run"), ("heads", "circuit"), ("faith", "faithfulness"),
                       ("clean", "clean (-loss)"), ("all", "all patched (-loss)")])
    emit_json(out, args.json)


if __name__ == "__main__":
    main()
