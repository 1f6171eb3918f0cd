"""The exact single-edge pass, before and after it became path patching's (one process tree, two children)

    python benchmarks/single_edge_pass.py --model DIR --old-src OLD/src [--json out.json]

``OLD`` is a checkout of circuitkit before the change (e.g. ``git worktree add OLD 62813d5``); each child imports
circuitkit from its own ``src`` (the new one from this checkout). On the default IOI scan's discovery pairs (the
built-in IOI task, 32 pairs, seed 0, split 16 / 16, MLPs as nodes), each child runs the clean and corrupted runs,
then ``TaskRunner.single_edge_metric`` of the IOI scan's eight strongest edges
(``results/logits_edges_effects_qwen.json``), and reports each edge's metric, the seconds of that call and the
growth of the process's resident memory during it (sampled every 2 ms from ``/proc/self/status``, above what the
process held when the call began). Each child then path-patches twelve head-to-head edges of the same model on a
batch of repeated random tokens (every channel and the three at once, grouped-query key/value receivers among
them) under the repeated-copies loss and under the receiver's induction score. Printed and written as JSON: both
children's figures, and whether every value is bit-identical. (Since path patching's effects became the behaviour
lost, an ``OLD`` before that change gives the induction score's effects with the opposite sign.)"""
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
EDGES = HERE / "results" / "logits_edges_effects_qwen.json"
HEAD_EDGES = [((0, 0), (1, 0), "q"), ((0, 3), (1, 7), "k"), ((0, 5), (1, 13), "v"), ((2, 1), (5, 4), "all"),
              ((4, 8), (9, 2), "k"), ((6, 11), (12, 6), "v"), ((8, 3), (14, 0), "q"), ((10, 9), (16, 12), "all"),
              ((12, 2), (18, 5), "k"), ((15, 6), (20, 9), "v"), ((18, 13), (22, 1), "q"), ((20, 4), (23, 10), "all")]


def child(model: str) -> dict:
    sys.path.insert(0, str(HERE))
    import torch
    from _common import ioi_discovery, rss_growth

    names = [e["edge"] for e in json.loads(EDGES.read_text())["edges"]]
    _, _, runner = ioi_discovery(model)
    graph = runner.graph
    index = torch.tensor([[graph.senders.index(n.split("->")[0]), graph.receivers.index(n.split("->")[1])]
                          for n in names])
    _ = runner.corrupted
    before = runner.passes
    values, seconds, growth = rss_growth(lambda: runner.single_edge_metric(index))
    from circuitkit.circuits import path_patching
    from circuitkit.detect import RepeatedTokens

    tokens = RepeatedTokens(block_len=12, batch=4, seed=0)
    start = time.perf_counter()
    patched = {metric: [e.effect for e in path_patching(runner.adapter.model, HEAD_EDGES, metric=metric,
                                                        tokens=tokens).edges] for metric in ("loss", "induction")}
    return {"edges": names, "metric": [float(v) for v in values], "seconds": seconds,
            "rss_growth_mib": growth / 2**20, "passes": runner.passes - before,
            "path_patching": patched, "path_patching_seconds": time.perf_counter() - start}


def main() -> None:
    sys.path.insert(0, str(HERE))
    from _common import old_and_new_cli

    ran = old_and_new_cli(__file__, __doc__, child)
    if ran is None:
        return
    args, results = ran
    for name, r in results.items():
        print(f"{name}: {r['seconds']:.2f} s, resident memory +{r['rss_growth_mib']:.0f} MiB, {r['passes']:.4f} passes")
    old, new = results["old"], results["new"]
    same = old["metric"] == new["metric"] and old["path_patching"] == new["path_patching"]
    values = [(a, b) for key in ("loss", "induction") for a, b in zip(old["path_patching"][key],
                                                                       new["path_patching"][key], strict=True)]
    diff = max(abs(a - b) for a, b in [*zip(old["metric"], new["metric"], strict=True), *values])
    for n, a, b in zip(new["edges"], old["metric"], new["metric"], strict=True):
        print(f"{n:>16}  old {a:+.7f}  new {b:+.7f}")
    for key in ("loss", "induction"):
        print(f"path patching, {key}: old {old['path_patching'][key][:3]}..., new {new['path_patching'][key][:3]}...; "
              f"{old['path_patching_seconds']:.1f} s old, {new['path_patching_seconds']:.1f} s new (both metrics)")
    print(f"bit-identical: {same} (largest difference {diff:.3g}); time new/old {new['seconds'] / old['seconds']:.2f}")
    if args.json:  # through a temporary file and one rename: a stopped run leaves no half file
        from _common import write_json_atomic

        write_json_atomic(args.json, {"model": args.model, "bit_identical": same, "largest_difference": diff,
                                      **results})


if __name__ == "__main__":
    main()
