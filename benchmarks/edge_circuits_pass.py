"""A task's edge-circuit pass (``TaskRunner.edge_metric``) before and after a change (one process tree, two children)

    python benchmarks/edge_circuits_pass.py --model DIR --old-src OLD/src [--repeats 3] [--json out.json]

``OLD`` is a checkout of circuitkit before the change (e.g. ``git worktree add OLD bfe3906``); each child imports
circuitkit from its own ``src`` (the new one from this checkout). On the default IOI scan's discovery pairs (the
built-in IOI task, 32 pairs, seed 0, split 16 / 16, MLPs as nodes) each child runs the clean and corrupted runs,
then measures six edge circuits in one call, ``repeats`` times: the top 0.1%, 1%, 5%, 10%, 30% and 60% of the
graph's edges by a seeded random score (the sizes a faithfulness curve visits). Printed and written as JSON: each
child's seconds (min / median / max), how far each call raised the process's resident memory (sampled every 2 ms),
the mean metric per circuit, and the largest difference between them.

The change it was written for: a receiver's patch is the sum of its missing edges' deltas, or the total minus its
kept ones where that is fewer senders; the kept senders were gathered into a new tensor however many they were
(344 of 361 in one call), where the missing ones, once more than half the senders recorded, are read as a view of
them all with zero weights elsewhere. Both now take the view above half. A later change: the senders gathered (at
most half) are copied into one buffer the pass reuses, where each gather was a new tensor paged in anew, and each
layer's summed q/k/v patch is dropped at its ``z``, where every layer's was held to the end of the pass."""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
FRACTIONS = (0.001, 0.01, 0.05, 0.1, 0.3, 0.6)


def child(model: str, repeats: int) -> dict:
    sys.path.insert(0, str(HERE))
    import torch
    from _common import ioi_discovery, rss_growth

    _, _, runner = ioi_discovery(model)
    _ = runner.clean, runner.corrupted
    allowed = runner.graph.allowed
    scores = (torch.rand(allowed.shape, generator=torch.Generator().manual_seed(0)) * allowed).flatten()
    order = torch.argsort(scores, descending=True)
    masks = []
    for fraction in FRACTIONS:
        mask = torch.zeros_like(scores, dtype=torch.bool)
        mask[order[: int(fraction * int(allowed.sum()))]] = True
        masks.append(mask.view_as(allowed) & allowed)
    kept = torch.stack(masks)
    seconds, growth, values = [], [], None
    for _ in range(repeats):
        values, took, grew = rss_growth(lambda: runner.edge_metric(kept))
        seconds.append(took)
        growth.append(grew / 2**20)
    return {"seconds": seconds, "rss_growth_mib": growth, "metric": [float(v) for v in values.flatten()]}


def main() -> None:
    sys.path.insert(0, str(HERE))
    from _common import old_and_new_cli

    ran = old_and_new_cli(__file__, __doc__, child, [("--repeats", {"type": int, "default": 3})])
    if ran is None:
        return
    args, results = ran
    for name, r in results.items():
        s = sorted(r["seconds"])
        print(f"{name}: edge_metric of {len(FRACTIONS)} circuits {s[0]:.2f} / {s[len(s) // 2]:.2f} / {s[-1]:.2f} s "
              f"(min / median / max), resident memory +{max(r.get('rss_growth_mib', [0])):.0f} MiB at most")
    old, new = results["old"], results["new"]
    diff = max(abs(a - b) for a, b in zip(old["metric"], new["metric"], strict=True))
    ratio = sorted(new["seconds"])[len(new["seconds"]) // 2] / sorted(old["seconds"])[len(old["seconds"]) // 2]
    for fraction, a, b in zip(FRACTIONS, old["metric"], new["metric"], strict=True):
        print(f"top {fraction:>6.1%} of the edges: old {a:+.7f}  new {b:+.7f}")
    same = old["metric"] == new["metric"]
    print(f"bit-identical: {same} (largest difference {diff:.3g}); time new/old {ratio:.2f} (medians)")
    if args.json:  # through a temporary file and one rename: a stopped run leaves no half file
        from _common import write_json_atomic

        write_json_atomic(args.json, {"model": args.model, "fractions": list(FRACTIONS), "bit_identical": same,
                                      "largest_difference": diff,
                                      "time_ratio": ratio, **results})


if __name__ == "__main__":
    main()
