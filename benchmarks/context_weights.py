"""Path patching and edge attribution on a grouped-query model, before and after their context held the key/value
weights once per key/value head rather than once per query head (one process tree, two children).

    python benchmarks/context_weights.py --model DIR --old-src OLD/src [--json out.json]

``OLD`` is a checkout before the change (``git worktree add OLD REV``); each child imports circuitkit from its own
``src``. Each child loads the model, builds one batch of repeated random tokens (4 sequences, blocks of 20, seed
0), then measures, each under :func:`_common.rss_growth` (how far the process's resident memory rose during the
call, and its seconds): ``edge_attribution`` (every head-to-head edge, 1 step), then ``path_patching`` of its 24
strongest key and value edges (one per key/value group and channel receiver, so the grouped weights are read for
every query head's own receiver). Printed and written as JSON: each child's seconds and resident growth per call,
and the largest difference between the two children's estimates and exact effects.
"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def child(model_dir: str) -> dict:
    sys.path.insert(0, str(HERE))
    import torch
    from _common import rss_growth

    import circuitkit as ck
    from circuitkit.detect.session import open_session
    from circuitkit.models.loading import load_model

    model = load_model(model_dir)
    tokens = ck.RepeatedTokens(block_len=20, n_repeats=2, batch=4, seed=0)
    session = open_session(model, tokens)
    session.weights(embeddings=False)  # read before either call: both children hold these
    attribution, a_seconds, a_bytes = rss_growth(lambda: ck.edge_attribution(session, steps=1))
    top = [e for e in attribution.top(400) if e.channel in ("k", "v")][:24]
    patched, p_seconds, p_bytes = rss_growth(lambda: ck.path_patching(session, top))
    return {"attribution": {"seconds": a_seconds, "rss_growth_bytes": a_bytes,
                            "scores": attribution.scores.flatten().nan_to_num(0.0).tolist()},
            "patching": {"seconds": p_seconds, "rss_growth_bytes": p_bytes, "edges": [e.name for e in top],
                         "effects": [e.effect for e in patched.edges]},
            "torch": torch.__version__}


def main() -> None:
    sys.path.insert(0, str(HERE))
    from _common import format_bytes, old_and_new_cli, write_json_atomic

    ran = old_and_new_cli(__file__, __doc__, child)
    if ran is None:
        return
    args, results = ran
    for name, r in results.items():
        for part in ("attribution", "patching"):
            print(f"{name}: {part} {r[part]['seconds']:.2f} s, resident memory rose "
                  f"{format_bytes(r[part]['rss_growth_bytes'])}")
    old, new = results["old"], results["new"]
    assert old["patching"]["edges"] == new["patching"]["edges"], "the two children patched different edges"
    score_diff = max(abs(a - b) for a, b in zip(old["attribution"]["scores"], new["attribution"]["scores"],
                                                strict=True))
    effect_diff = max(abs(a - b) for a, b in zip(old["patching"]["effects"], new["patching"]["effects"], strict=True))
    print(f"largest difference: estimates {score_diff:.3g}, exact effects {effect_diff:.3g} "
          f"(largest effect {max(abs(e) for e in new['patching']['effects']):.4g})")
    if args.json:  # the figures, not the 2 x 338,688 estimates behind the difference
        children = {name: {part: {k: v for k, v in r[part].items() if k != "scores"} for part in ("attribution",
                                                                                                   "patching")}
                    for name, r in results.items()}
        write_json_atomic(Path(args.json), {"model": args.model, "score_difference": score_diff,
                                            "effect_difference": effect_diff,
                                            "estimates_compared": len(new["attribution"]["scores"]), **children})


if __name__ == "__main__":
    main()
