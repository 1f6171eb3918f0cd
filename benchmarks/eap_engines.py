"""Edge attribution of both engines on a real model: the induction engine's against the task runner's EAP-IG

    python benchmarks/eap_engines.py --model DIR [--steps 1 2 4] [--batch 4] [--block-len 10] [--json out.json]
                                     [--old-src OLD/src]

One process, on repeated random tokens (``batch`` sequences, a block of ``block_len`` tokens repeated once, seed 0)
and their resampled corruption (seed 1), the repeated-copies loss, for each number of ``steps``:

- ``circuitkit.edge_attribution(model, steps=...)``: the induction engine (the clean run and one pass per further
  point of the inputs path, ``alpha = k / steps`` for ``k = 1 .. steps``), every head-to-head edge per query head;
- ``TaskRunner.attribute(steps, "right")`` on ``tasks.repeated_tokens`` (the same sequences and corruption, the
  metric minus the loss, key/value receivers per query head): the task engine's EAP-IG, the same points stacked.

Printed and written as JSON: per number of steps the largest difference over the head-to-head edges against the
largest score, how many of each engine's 20 strongest edges the other ranks in its 20 strongest, and each call's
seconds and growth of resident memory (the reference runs the runner needs counted in its call). The two engines
define the same estimate (``tests/test_one_engine_edges.py`` checks it on a tiny model): this measures it where
the model is a real one, with grouped-query attention, RMSNorm and 24 layers.

With ``--old-src`` (the ``src`` of a checkout before a change, e.g. ``git worktree add OLD 8d0f3c1``) the same
measurement runs twice, in a child process importing each version, and each engine's scores of the two versions are
compared edge by edge (their times as a ratio, their memory growth side by side).
"""
import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def measure(model_dir: str, steps_list: list[int], batch: int, block_len: int, save: str | None) -> list[dict]:
    """One row per number of steps (module docstring); ``save``: where to write the runner's head-edge scores of
    each (``torch.save``, ``{steps: [edges] float64}``)."""
    import torch
    from _common import rss_growth

    from circuitkit.circuits import edge_attribution
    from circuitkit.detect import RepeatedTokens
    from circuitkit.detect.tokens import as_batch
    from circuitkit.graph.runner import TaskRunner
    from circuitkit.models.adapters import adapt
    from circuitkit.models.loading import load_model
    from circuitkit.tasks import repeated_tokens

    torch.manual_seed(0)
    model = load_model(model_dir)
    adapter = adapt(model)
    spec = adapter.spec
    L, H = spec.n_layers, spec.n_heads
    tokens = RepeatedTokens(block_len=block_len, batch=batch, seed=0)
    task = repeated_tokens(model, batch, seed=0, block_len=block_len, corrupt_seed=1, ablation="corrupted")
    edges = [(l1, h1, l2, h2, c) for l1 in range(L) for h1 in range(H) for l2 in range(l1 + 1, L)
             for h2 in range(H) for c in range(3)]
    rows, kept = [], {}
    for steps in steps_list:
        ours, ours_s, ours_mem = rss_growth(lambda steps=steps: edge_attribution(model, tokens=tokens, steps=steps,
                                                                               corrupt_seed=1).scores)

        def runner_scores(steps=steps):
            runner = TaskRunner(adapter, task.tokenize(adapter), task.metric, mlps=False, ablation=task.ablation,
                                kv_edges="per-query-head")
            runner.direct = False  # no direct logit attribution: the scan's roles only
            assert torch.equal(runner.batch.clean.cpu(), as_batch(tokens, adapter).tokens.cpu())  # the same sequences
            return runner, runner.attribute(steps, "right")[0]

        (runner, theirs), theirs_s, theirs_mem = rss_growth(runner_scores)
        graph = runner.graph
        senders = torch.tensor([graph.sender_index(l1, h1) for l1, h1, _, _, _ in edges])
        receivers = torch.tensor([graph.receivers.index(f"{l2}.{h2}:{'qkv'[c]}") for _, _, l2, h2, c in edges])
        a = ours[tuple(torch.tensor(edges).T)].double()
        b = theirs[senders, receivers].double()
        kept[steps] = b
        kept[f"edge_attribution_{steps}"] = a
        top_a = set(a.abs().topk(20).indices.tolist())
        top_b = set(b.abs().topk(20).indices.tolist())
        rows.append({"steps": steps, "edges": len(edges), "largest_difference": float((a - b).abs().max()),
                     "largest_score": float(a.abs().max()), "top20_shared": len(top_a & top_b),
                     "edge_attribution_seconds": ours_s, "runner_seconds": theirs_s,
                     "edge_attribution_rss_mib": ours_mem / 2**20, "runner_rss_mib": theirs_mem / 2**20,
                     "runner_passes": runner.passes})
    if save:
        torch.save(kept, save)
    return rows


def show(name: str, rows: list[dict]) -> None:
    for row in rows:
        print(f"{name}steps {row['steps']}: {row['edges']} head edges, largest difference "
              f"{row['largest_difference']:.3g} (largest |score| {row['largest_score']:.3g}), top 20 shared "
              f"{row['top20_shared']}/20; edge_attribution {row['edge_attribution_seconds']:.1f} s "
              f"+{row['edge_attribution_rss_mib']:.0f} MiB, runner {row['runner_seconds']:.1f} s "
              f"+{row['runner_rss_mib']:.0f} MiB ({row['runner_passes']:.0f} passes)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--steps", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--block-len", type=int, default=10)
    parser.add_argument("--json", default=None)
    parser.add_argument("--old-src", default=None, help="the src folder of a checkout before a change")
    parser.add_argument("--save", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    import json

    from _common import write_json_atomic

    if args.child:
        print(json.dumps(measure(args.model, args.steps, args.batch, args.block_len, args.save)))
        return
    if not args.old_src:
        rows = measure(args.model, args.steps, args.batch, args.block_len, None)
        show("", rows)
        result = {"model": args.model, "batch": args.batch, "block_len": args.block_len, "rows": rows}
    else:
        import tempfile

        import torch
        from _common import old_and_new

        common = ["--model", args.model, "--batch", str(args.batch), "--block-len", str(args.block_len),
                  "--steps", *map(str, args.steps)]
        result = {"model": args.model, "batch": args.batch, "block_len": args.block_len}
        with tempfile.TemporaryDirectory() as tmp:
            result.update(old_and_new(__file__, args.old_src, common, lambda name: ["--save", f"{tmp}/{name}.pt"]))
            for name in ("old", "new"):
                show(f"{name}: ", result[name])
            old, new = (torch.load(f"{tmp}/{name}.pt", weights_only=True) for name in ("old", "new"))
        for row_old, row_new in zip(result["old"], result["new"], strict=True):
            steps = row_new["steps"]
            diff = float((old[steps] - new[steps]).abs().max())
            row_new["runner_difference_to_old"] = diff
            row_new["runner_time_new_over_old"] = row_new["runner_seconds"] / row_old["runner_seconds"]
            print(f"steps {steps}: the runner's scores, new against old: largest difference {diff:.3g}; time "
                  f"new/old {row_new['runner_time_new_over_old']:.2f} ({row_new['runner_passes']:.0f} passes "
                  f"against {row_old['runner_passes']:.0f})")
            key = f"edge_attribution_{steps}"
            if key in old and key in new:
                diff = float((old[key] - new[key]).abs().max())
                row_new["edge_attribution_difference_to_old"] = diff
                row_new["edge_attribution_time_new_over_old"] = (row_new["edge_attribution_seconds"]
                                                                 / row_old["edge_attribution_seconds"])
                row_new["edge_attribution_rss_new_minus_old_mib"] = (row_new["edge_attribution_rss_mib"]
                                                                     - row_old["edge_attribution_rss_mib"])
                print(f"steps {steps}: edge_attribution, new against old: largest difference {diff:.3g}; time "
                      f"new/old {row_new['edge_attribution_time_new_over_old']:.2f}; resident memory grown "
                      f"{row_new['edge_attribution_rss_mib']:.0f} MiB against "
                      f"{row_old['edge_attribution_rss_mib']:.0f}")
    if args.json:
        write_json_atomic(Path(args.json), result)


if __name__ == "__main__":
    main()
