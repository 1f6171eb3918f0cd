"""The induction circuit on held-out sequences: the scan's discovery faithfulness beside the same heads' on a fresh
batch of the same spec (``circuit.evaluation``, :mod:`circuitkit.circuits.heldout`), for several discovery seeds.

For each seed ``s`` the scan searches on ``RepeatedTokens(batch=B, seed=s)`` and measures its heads on seed
``s + 1``; the row also gives the held-out figure recomputed independently with ``circuitkit.circuits.faithfulness``
on that batch (it must agree) and the circuit stage's passes (search + held-out).

Run: ``python benchmarks/induction_heldout.py [--seeds 0,1,2,3,4] [--batch 16] [--model-dir DIR] [--json out.json]``
(default: the bundled model).
"""

from __future__ import annotations

import argparse
import time

from _common import emit_json, print_table  # benchmarks/ is on sys.path when a script here runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--model-dir", default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    import circuitkit as ck
    from circuitkit.circuits.faithfulness import faithfulness
    from circuitkit.models.loading import load_model

    model = load_model(args.model_dir) if args.model_dir else ck.zoo.load()
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        started = time.perf_counter()
        scan = ck.scan(model, tokens=ck.RepeatedTokens(batch=args.batch, seed=seed), ablate="none")
        seconds = time.perf_counter() - started
        v = scan.verified
        if v is None:
            rows.append({"seed": seed, "circuit": None, "error": scan.verified_error})
            continue
        held = v.evaluation
        again = faithfulness(model, v.heads, ck.RepeatedTokens(batch=args.batch, seed=held["seed"]),
                             method=v.method)
        stage = next(s for s in scan.stages if s.name == "circuit")
        rows.append({"seed": seed, "heads": len(v.heads), "discovery": round(v.faithfulness, 4),
                     "held_out": None if held["faithfulness"] is None else round(held["faithfulness"], 4),
                     "recomputed": round(again, 4), "necessity_discovery": round(v.necessity, 3),
                     "necessity_held_out": round(held["necessity"], 3),
                     "passes": f"{v.passes} + {held['passes']} = {stage.passes}", "seconds": round(seconds, 1)})
    print_table(rows, [(k, k) for k in ("seed", "heads", "discovery", "held_out", "recomputed", "necessity_discovery",
                                          "necessity_held_out", "passes", "seconds", "error")])
    emit_json({"model": args.model_dir or "bundled", "batch": args.batch, "rows": rows}, args.json)


if __name__ == "__main__":
    main()
