"""How stable a task circuit is as the pairs it is found on grow: 16, 32, 64, 96 IOI pairs on a real model.

    nice python benchmarks/pair_counts.py --model DIR [--counts 16,32,64,96] [--part 16] [--held-out 32]
        [--ig-points left|right] [--json benchmarks/results/pair_counts_qwen.json]

``circuitkit.tasks.ioi(model, n=max(counts) + held_out, seed=0)`` writes the pairs (the generator draws them in
order, so the first 96 are ``ioi(model, n=96)``'s); the last ``--held-out`` pairs are set aside. For each count
``n`` the node circuit is the one ``scan_task(model, <first n pairs>, holdout=0, target=0.8, edges=False)`` finds:
heads ranked by EAP-IG node score (the scan's default steps and points, ranked by absolute score, MLPs recomputed),
the smallest top-k set reaching the target by :func:`circuitkit.tasks.circuit.node_circuit`. It is then measured
on the held-out pairs: the same heads kept, every other head patched from the corrupted prompt, faithfulness
``(m_C - m_all) / (m_clean - m_all)`` there. Reported per count: the circuit's size, its faithfulness on its own
pairs and on the held-out ones, and the Jaccard index of its heads with the circuit found on the most pairs.

**In parts.** A scan holds every pair at once, and on a shared 24 GB machine the memory plan refuses more than
about 20 IOI pairs of this model with 3 EAP-IG steps. Both figures the search reads are means over pairs, so they
are computed in parts of ``--part`` pairs and averaged, which is exact: a head's EAP-IG score on ``n`` pairs
(the gradient of the mean metric) is the mean of its scores on equal parts, and the mean metric of a patched run
is the mean of the parts' means. Each part's runner keeps only what node patching reads (the heads' and MLPs'
values, the input embeddings); every part's EAP-IG runs once and serves every count. The run records
``scan_task``'s own circuit on the first part as a check that the parts give the same answer.
Results are written after every count (atomically), so a run stopped early keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from _common import write_json_atomic  # benchmarks/ is on sys.path when a script here runs


def _jaccard(a: set, b: set) -> float | None:
    return len(a & b) / len(a | b) if a | b else None


def _counts(text: str) -> list[int]:
    return sorted({int(x) for x in text.split(",") if x.strip()})


class Parts:
    """Consecutive runners of equal parts of the pairs, read as one runner by ``node_circuit`` (its metric per
    pair, node patching per pair, the pass count)."""

    def __init__(self, runners: list) -> None:
        import torch

        self.runners = runners
        first = runners[0]
        self.graph, self.spec, self.metric_name = first.graph, first.spec, first.metric_name
        self.node_types = first.node_types
        self.clean = {"metric": torch.cat([r.clean["metric"] for r in runners])}
        self.corrupted = {"metric": torch.cat([r.corrupted["metric"] for r in runners])}
        self.batch = SimpleNamespace(n_pairs=sum(r.batch.n_pairs for r in runners))
        self._counted = 0.0  # passes counted on the parts as a whole (the coarse search's share of a pass)

    @property
    def passes(self) -> float:
        return sum(r.passes for r in self.runners) + self._counted

    @passes.setter
    def passes(self, value: float) -> None:
        self._counted += value - self.passes

    def all_patched_metric(self, names: tuple[str, ...], then: Any) -> Any:
        import torch

        return torch.cat([r.all_patched_metric(names, then) for r in self.runners])

    def first_pairs(self, k: int) -> "Parts":
        """The first ``k`` pairs (the coarse search's subset): whole parts, then the first pairs of the next."""
        taken, left = [], k
        for runner in self.runners:
            if left <= 0:
                break
            n = runner.batch.n_pairs
            taken.append(runner if left >= n else runner.first_pairs(left))
            left -= n
        return Parts(taken)

    def node_metric(self, heads: Any, mlps: Any, *, per_pair: bool = False) -> Any:
        import torch

        values = torch.cat([r.node_metric(heads, mlps, per_pair=True) for r in self.runners], dim=-1)
        return values if per_pair else values.mean(-1)

    def patched_metric(self, patched: Any, *, per_pair: bool = False) -> Any:
        import torch

        values = torch.cat([r.patched_metric(patched, per_pair=True) for r in self.runners], dim=-1)
        return values if per_pair else values.mean(-1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--counts", type=_counts, default=[16, 32, 64, 96])
    parser.add_argument("--part", type=int, default=16)
    parser.add_argument("--held-out", type=int, default=32)
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--ig-points", choices=("left", "right"), default=None,
                        help="EAP-IG's points (default: the scan's default)")
    parser.add_argument("--json", default="benchmarks/results/pair_counts_qwen.json")
    args = parser.parse_args(argv)
    if not Path(args.model).is_dir():
        sys.exit(f"{args.model}: no such directory")
    if any(n % args.part for n in args.counts) or args.held_out % args.part:
        sys.exit(f"every count and --held-out must be a multiple of --part {args.part}")
    import torch

    from circuitkit.graph.runner import DEFAULT_IG_POINTS, TaskRunner
    from circuitkit.models.adapters import adapt
    from circuitkit.models.loading import load_model
    from circuitkit.tasks import ioi
    from circuitkit.tasks.circuit import node_circuit
    from circuitkit.tasks.scan import DEFAULT_IG_STEPS

    torch.set_num_threads(2)
    started = time.perf_counter()
    bridge = load_model(args.model)
    adapter = adapt(bridge)
    most = max(args.counts)
    task = ioi(bridge, n=most + args.held_out, seed=0)
    batch = task.tokenize(adapter)
    L, H = adapter.spec.n_layers, adapter.spec.n_heads
    steps, points = DEFAULT_IG_STEPS, args.ig_points or DEFAULT_IG_POINTS

    def part(start: int) -> Any:
        """A runner of ``--part`` pairs from ``start`` and its EAP-IG node scores (a run keeps its heads' ``z``, not
        their outputs, so nothing needs trimming for memory)."""
        runner = TaskRunner(adapter, batch.subset(torch.arange(start, start + args.part)), task.metric, mlps=True,
                            ablation="corrupted")
        scores = runner.node_gradients(steps, points) if start < most else None
        return runner, scores

    held = Parts([part(most + s)[0] for s in range(0, args.held_out, args.part)])
    held_clean = float(held.clean["metric"].mean())
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    out: dict = {"model": args.model, "task": "ioi", "seed": 0, "target": args.target, "commit": commit,
                 "ig_steps": steps, "ig_points": points, "rank": "abs", "part": args.part,
                 "held_out_pairs": args.held_out, "held_out_clean": held_clean, "counts": {}}
    path = Path(args.json)
    runners: list = []
    part_scores: list = []
    heads_of: dict[int, set] = {}
    for n in args.counts:
        while len(runners) * args.part < n:
            runner, scores = part(len(runners) * args.part)
            runners.append(runner)
            part_scores.append(scores)
        found = Parts(runners[: n // args.part])
        node_scores = torch.stack(part_scores[: n // args.part]).mean(0)
        before = found.passes
        circuit = node_circuit(found, node_scores, args.target, "abs")
        heads, faith, curve = circuit.heads, circuit.faithfulness, circuit.curve
        heads_of[n] = set(heads)
        mask = torch.ones(2, L, H, dtype=torch.bool)  # True: patched; set 0 every head, set 1 all but the circuit
        for layer, h in heads:
            mask[1, layer, h] = False
        held_all, held_kept = held.node_metric(mask, None).tolist()
        row = {"pairs": n, "heads": [f"{a}.{b}" for a, b in heads], "faithfulness": faith,
               "curve": [[p.size, p.faithfulness] for p in curve],
               "held_out_faithfulness": (held_kept - held_all) / (held_clean - held_all),
               "held_out_all_patched": held_all, "search_passes_of_a_part": found.passes - before,
               "seconds_so_far": round(time.perf_counter() - started, 1)}
        out["counts"][str(n)] = row
        top = max(heads_of)
        out["jaccard_reference_pairs"] = top
        for m, hs in heads_of.items():
            out["counts"][str(m)]["jaccard_heads"] = _jaccard(hs, heads_of[top])
        print(f"{n} pairs: {len(heads)} heads, faithfulness {faith:.3f} (held out "
              f"{row['held_out_faithfulness']:.3f}), {row['seconds_so_far']:.0f} s so far", flush=True)
        write_json_atomic(path, out)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
