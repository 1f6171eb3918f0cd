"""How well a task scan's head estimates rank each head patched alone, from a saved scan with ``--ablate all``.

    circuitkit scan MODEL --task ioi --ablate all --no-edges --out DIR
    python benchmarks/task_single_heads.py DIR/scores.json [--json out.json]

The scan patches every head alone exactly (``heads.exact``: the metric lost) beside its EAP-IG node score
(``heads.score``) and, where the joint path ranked the nodes, its joint-path share (``heads.joint``). Printed: the
Spearman correlation of each estimate with the exact effects over every head and over the top ``k`` heads by
``|EAP-IG score|`` (what ``--ablate top --ablate-top k`` would patch: the same exact values, read from this one
scan), the largest misses, and the stage's passes and seconds. Spearman as :func:`circuitkit.detect.agreement.spearman`
(average ranks for ties).
"""
import argparse
import json
import sys
from pathlib import Path

TOPS = (8, 20, 50, 100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("scores")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    import torch

    from circuitkit.detect.agreement import spearman

    data = json.loads(Path(args.scores).read_text())
    heads = data["heads"]
    if "exact" not in heads:
        sys.exit(f"{args.scores}: no heads.exact (scan with --ablate all)")

    def grid(name: str) -> torch.Tensor:
        return torch.tensor([[float("nan") if v is None else v for v in row] for row in heads[name]],
                            dtype=torch.float64).flatten()

    exact, score = grid("exact"), grid("score")
    estimates = {"EAP-IG node score": score, **({"joint-path share": grid("joint")} if "joint" in heads else {})}
    measured = ~exact.isnan()
    order = torch.sort(-score.abs(), stable=True).indices
    n_heads = len(heads["exact"][0])
    out: dict = {"scores": args.scores, "heads_patched": int(measured.sum()), "rows": []}
    for name, values in estimates.items():
        for k in (*[t for t in TOPS if t < int(measured.sum())], int(measured.sum())):
            chosen = order[:k]
            chosen = chosen[measured[chosen]]
            rho = spearman(values[chosen], exact[chosen])
            out["rows"].append({"estimate": name, "heads": int(len(chosen)), "spearman": rho})
            print(f"{name:>18} vs exact, top {len(chosen):>3} by |EAP-IG score|: Spearman "
                  f"{'n/a' if rho is None else f'{rho:.3f}'}")
    miss = (score - exact).abs().nan_to_num(-1.0)
    worst = torch.sort(-miss, stable=True).indices[:5]
    out["largest_misses"] = [{"head": f"{int(i) // n_heads}.{int(i) % n_heads}", "exact": float(exact[i]),
                              "estimate": float(score[i])} for i in worst]
    for m in out["largest_misses"]:
        print(f"  miss {m['head']}: exact {m['exact']:+.3f}, EAP-IG {m['estimate']:+.3f}")
    stage = next((s for s in data["stages"] if s["name"] == "ablate"), None)
    if stage is not None:
        out["stage"] = stage
        print(f"ablate stage: {stage['passes']:.2f} passes, {stage['seconds']:.1f} s")
    if args.json:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from _common import write_json_atomic

        write_json_atomic(Path(args.json), out)


if __name__ == "__main__":
    main()
