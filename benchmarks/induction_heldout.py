"""The induction circuit on held-out sequences: the scan's discovery faithfulness beside the same heads' on a fresh
batch of the same spec (``circuit.evaluation``, :mod:`circuitkit.circuits.heldout`), for several discovery seeds.

For each seed ``s`` the scan searches on ``RepeatedTokens(batch=B, seed=s)`` and measures its heads on seed
``s + 1``; the row also gives the held-out figure recomputed independently with ``circuitkit.circuits.faithfulness``
on that batch (it must agree) and the circuit stage's passes (search + held-out).

Run: ``python benchmarks/induction_heldout.py [--seeds 0,1,2,3,4] [--batch 16] [--model-dir DIR] [--search-only]
[--json out.json]`` (default: the bundled model). ``--search-only`` runs the scan's circuit stage alone
(``find_circuit`` with the scan's defaults, then :func:`circuitkit.circuits.heldout.held_out` on seed ``s + 1``),
not the whole scan: the same circuit where the scan ablates no head exactly (``ablate="none"``), without the
exact-ablation, weight and edge stages (for a slow machine).
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
    parser.add_argument("--search-only", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    import circuitkit as ck
    from circuitkit.circuits.faithfulness import faithfulness, find_circuit
    from circuitkit.circuits.heldout import evaluation_seed, held_out
    from circuitkit.models.adapters import adapt
    from circuitkit.models.loading import load_model

    model = load_model(args.model_dir) if args.model_dir else ck.zoo.load()
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        started = time.perf_counter()
        spec = ck.RepeatedTokens(batch=args.batch, seed=seed)
        if args.search_only:
            v = find_circuit(model, spec)
            held = held_out(adapt(model), ck.RepeatedTokens(batch=args.batch, seed=evaluation_seed(seed)), v.heads,
                            v.method)
            stage_passes = v.passes + held["passes"]
        else:
            scan = ck.scan(model, tokens=spec, ablate="none")
            v = scan.verified
            if v is None:
                rows.append({"seed": seed, "circuit": None, "error": scan.verified_error})
                continue
            held = v.evaluation
            stage_passes = next(s for s in scan.stages if s.name == "circuit").passes
        seconds = time.perf_counter() - started
        again = faithfulness(model, v.heads, ck.RepeatedTokens(batch=args.batch, seed=held["seed"]),
                             method=v.method)
        rows.append({"seed": seed, "heads": len(v.heads), "circuit": ",".join(f"{a}.{b}" for a, b in v.heads),
                     "discovery": round(v.faithfulness, 4),
                     "held_out": None if held["faithfulness"] is None else round(held["faithfulness"], 4),
                     "recomputed": round(again, 4), "necessity_discovery": round(v.necessity, 3),
                     "necessity_held_out": round(held["necessity"], 3),
                     "passes": f"{v.passes} + {held['passes']} = {stage_passes}", "seconds": round(seconds, 1)})
    print_table(rows, [(k, k) for k in ("seed", "heads", "discovery", "held_out", "recomputed", "necessity_discovery",
                                          "necessity_held_out", "passes", "seconds", "error")])
    emit_json({"model": args.model_dir or "bundled", "batch": args.batch, "rows": rows}, args.json)


if __name__ == "__main__":
    main()
