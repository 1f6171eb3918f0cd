"""Named edges' exact effects on a task, with their intervals (``ck.tasks.edge_effects``), against the scan's own

    python benchmarks/edge_effects.py --model DIR [--json out.json]

On the default IOI scan's 16 discovery pairs (the built-in IOI task, 32 pairs, seed 0, split 16 / 16) this measures
the scan's eight strongest edges (``results/logits_edges_effects_qwen.json``, whose ``scan`` field is the effect the
default ``circuitkit scan DIR --task ioi`` wrote) with ``ck.tasks.edge_effects``, then the same edges on all 32
pairs, and prints each effect with its 95% interval over the pairs, the seconds and the passes counted. Written as
JSON."""
import argparse
import json
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    from dataclasses import replace

    import circuitkit as ck
    from circuitkit.models.loading import load_model
    from circuitkit.tasks.scan import split_pairs

    recorded = json.loads((HERE / "results" / "logits_edges_effects_qwen.json").read_text())["edges"]
    names = [e["edge"] for e in recorded]
    model = load_model(args.model)
    task = ck.tasks.ioi(model)
    discovery, _ = split_pairs(task.n_pairs, 0.5, 0)
    keep = discovery.tolist()
    searched = replace(task, pairs=tuple(task.pairs[i] for i in keep),
                       marks=tuple(task.marks[i] for i in keep) if task.marks else (),
                       scored=tuple(task.scored[i] for i in keep) if task.scored else ())
    out = {"model": args.model, "edges": names}
    for label, on in (("discovery", searched), ("all", task)):
        start = time.perf_counter()
        effects = ck.tasks.edge_effects(model, on, names)
        seconds = time.perf_counter() - start
        out[label] = {"pairs": on.n_pairs, "seconds": seconds,
                      "effects": [{"edge": e.name, "effect": e.effect, "ci": list(e.interval)} for e in effects]}
        print(f"{label} ({on.n_pairs} pairs, {seconds:.1f} s):")
        for e, r in zip(effects, recorded, strict=True):
            scan = f"  (the scan: {r['scan']:+.7f})" if label == "discovery" else ""
            print(f"  {e.name:>16}  {e.effect:+.7f}  [{e.interval[0]:+.3f}, {e.interval[1]:+.3f}]{scan}")
    out["largest_difference_from_the_scan"] = max(abs(e["effect"] - r["scan"]) for e, r in zip(
        out["discovery"]["effects"], recorded, strict=True))
    print(f"largest difference from the scan's effects: {out['largest_difference_from_the_scan']:.3g}")
    if args.json:  # through a temporary file and one rename: a stopped run leaves no half file
        from _common import write_json_atomic

        write_json_atomic(args.json, out)


if __name__ == "__main__":
    main()
