"""A task's EAP-IG with the induction scan's normalisation pullback, before and after (one process tree, two children)

    python benchmarks/eap_pullback.py --model DIR --old-src OLD/src [--steps 3] [--repeats 3] [--json out.json]

``OLD`` is a checkout of circuitkit before the change (e.g. ``git worktree add OLD 85492ba``); each child imports
circuitkit from its own ``src`` (the new one from this checkout). The task runner pulled each receiver's gradient
back through its attention norm by autograd on the norm's input repeated once per receiver; it now takes the closed
form the induction scan's edge attribution uses (``graph/pullback.py``). On the default IOI scan's discovery pairs
(the built-in IOI task, 32 pairs, seed 0, split 16 / 16, MLPs as nodes) each child runs the clean and corrupted
runs, then ``TaskRunner.attribute(steps)`` ``repeats`` times (a fresh runner each time, the reference runs kept),
and reports the seconds of each call, the seconds spent in the pullback, the growth of resident memory during the
call (sampled every 2 ms) and the edge and node scores. Printed and written as JSON: the times side by side, the
largest score difference against the scores' scale, and whether the strongest edges are the same in the same order.
"""
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def child(model: str, steps: int, repeats: int) -> dict:
    sys.path.insert(0, str(HERE))
    import torch
    from _common import current_rss_bytes, ioi_discovery

    from circuitkit.graph.runner import TaskRunner

    adapter, task, runner = ioi_discovery(model)
    clean, corrupted = runner.clean, runner.corrupted
    pulled = [0.0]
    original = TaskRunner._pulled_back

    def timed(self, *args, **kwargs):
        start = time.perf_counter()
        out = original(self, *args, **kwargs)
        pulled[0] += time.perf_counter() - start
        return out

    TaskRunner._pulled_back = timed
    seconds, pullback, growth = [], [], []
    for _ in range(repeats):
        fresh = TaskRunner(runner.session, runner.batch, task.metric, mlps=True, ablation=task.ablation)
        fresh._clean, fresh._corrupt = clean, corrupted
        peak, base, done = [0], current_rss_bytes(), threading.Event()

        def sample(peak=peak, done=done) -> None:
            while not done.is_set():
                peak[0] = max(peak[0], current_rss_bytes())
                time.sleep(0.002)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        pulled[0] = 0.0
        start = time.perf_counter()
        edges, nodes, _ = fresh.attribute(steps)
        seconds.append(time.perf_counter() - start)
        done.set()
        sampler.join()
        pullback.append(pulled[0])
        growth.append(max(0, peak[0] - base) / 2**20)
    allowed = fresh.graph.allowed.cpu()
    flat = torch.where(allowed, edges.cpu(), torch.zeros_like(edges.cpu())).flatten()
    top = torch.argsort(flat.abs(), descending=True, stable=True)[:100]
    return {"seconds": seconds, "pullback_seconds": pullback, "rss_growth_mib": growth,
            "edges": flat.tolist(), "nodes": nodes.cpu().flatten().tolist(), "top100": top.tolist()}


def main() -> None:
    sys.path.insert(0, str(HERE))
    from _common import old_and_new_cli

    ran = old_and_new_cli(__file__, __doc__, child, [
        ("--steps", {"type": int, "default": 3, "help": "EAP-IG's points (the task scan's default: 3)"}),
        ("--repeats", {"type": int, "default": 3})])
    if ran is None:
        return
    args, results = ran
    for name, r in results.items():
        median = sorted(r["seconds"])[len(r["seconds"]) // 2]
        print(f"{name}: attribute({args.steps}) {min(r['seconds']):.1f} / {median:.1f} / {max(r['seconds']):.1f} s "
              f"(min / median / max), of it the pullback "
              f"{sorted(r['pullback_seconds'])[len(r['pullback_seconds']) // 2]:.1f} s (median); resident memory "
              f"+{max(r['rss_growth_mib']):.0f} MiB")
    old, new = results["old"], results["new"]
    scale = max(abs(v) for v in old["edges"])
    edge_diff = max(abs(a - b) for a, b in zip(old["edges"], new["edges"], strict=True))
    node_diff = max(abs(a - b) for a, b in zip(old["nodes"], new["nodes"], strict=True))
    same_top = old["top100"] == new["top100"]
    ratio = sorted(new["seconds"])[len(new["seconds"]) // 2] / sorted(old["seconds"])[len(old["seconds"]) // 2]
    print(f"edge scores: largest difference {edge_diff:.3g} (scale {scale:.3g}: {edge_diff / scale:.2g} of it); node "
          f"scores: {node_diff:.3g}; the 100 strongest edges the same, in the same order: {same_top}; time new/old "
          f"{ratio:.2f} (medians)")
    if args.json:  # through a temporary file and one rename: a stopped run leaves no half file
        from _common import write_json_atomic

        for r in results.values():
            r.pop("edges")
            r.pop("nodes")
        write_json_atomic(args.json, {"model": args.model, "steps": args.steps, "edge_difference": edge_diff,
                                      "edge_scale": scale, "node_difference": node_diff, "same_top100": same_top,
                                      "time_ratio": ratio, **results})


if __name__ == "__main__":
    main()
