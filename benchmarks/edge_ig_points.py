"""Edge attribution's integration points, one pass each (before) against stacked as copies of the batch in one pass
(after, as head attribution and a task's EAP-IG run theirs): seconds, resident memory, and the estimates compared
(one process tree, two children).

    python benchmarks/edge_ig_points.py --model DIR|bundled --old-src OLD/src [--steps 8] [--json out.json]

``OLD`` is a checkout before the change (``git worktree add OLD REV``); each child imports circuitkit from its own
``src``. Each child loads the model (``bundled``: the bundled known-answer model), builds one batch of repeated
random tokens (the default spec: 16 sequences, blocks of 20), then runs ``edge_attribution`` at ``steps`` points
with the loss and with the induction score, each under :func:`_common.rss_growth` (its seconds and how far the
process's resident memory rose), best of two calls. Printed and written as JSON: each child's figures and the
largest difference between the two children's estimates.
"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def child(model_dir: str, steps: str) -> dict:
    sys.path.insert(0, str(HERE))
    import torch
    from _common import rss_growth

    import circuitkit as ck
    from circuitkit import zoo
    from circuitkit.detect.session import open_session
    from circuitkit.models.loading import load_model

    model = zoo.load() if model_dir == "bundled" else load_model(model_dir)
    out: dict = {"torch": torch.__version__, "threads": torch.get_num_threads()}
    for metric in ("loss", "induction"):
        best = None
        for _ in range(2):
            session = open_session(model, ck.RepeatedTokens())  # a fresh session: nothing measured before
            session.weights(embeddings=False)
            result, seconds, grown = rss_growth(lambda s=session, m=metric: ck.edge_attribution(s, metric=m,
                                                                                                 steps=int(steps)))
            if best is None or seconds < best["seconds"]:
                best = {"seconds": seconds, "rss_growth_bytes": grown,
                        "scores": result.scores.flatten().nan_to_num(0.0).tolist()}
        out[metric] = best
    return out


def main() -> None:
    sys.path.insert(0, str(HERE))
    from _common import format_bytes, old_and_new_cli, write_json_atomic

    ran = old_and_new_cli(__file__, __doc__, child, [("--steps", {"default": "8"})])
    if ran is None:
        return
    args, results = ran
    summary = {"model": args.model, "steps": int(args.steps)}
    for metric in ("loss", "induction"):
        old, new = results["old"][metric], results["new"][metric]
        diff = max(abs(a - b) for a, b in zip(old["scores"], new["scores"], strict=True))
        largest = max(abs(v) for v in new["scores"])
        for name in ("old", "new"):
            r = results[name][metric]
            print(f"{metric}, {name}: {r['seconds']:.2f} s, resident memory rose {format_bytes(r['rss_growth_bytes'])}")
        print(f"{metric}: largest difference of the estimates {diff:.3g} (largest estimate {largest:.4g})")
        summary[metric] = {"difference": diff, "largest": largest,
                           **{name: {k: v for k, v in results[name][metric].items() if k != "scores"}
                              for name in ("old", "new")}}
    if args.json:
        write_json_atomic(Path(args.json), summary)


if __name__ == "__main__":
    main()
