"""Which head estimate ranks heads as exact ablation does, at what cost: the table's estimate on a real model.

Contenders (every one an estimate of each head's mean-ablation effect on the repeated-copies loss, nats):

- ``first order``: :func:`circuitkit.attribution_effects` at ``steps=1`` (the scan's table today; one gradient pass);
- ``layer path, 2 steps``: integrated gradients along each layer's own path (``steps=2, path="layer"``);
- ``inputs path, 2 steps``: integrated gradients along the input embeddings (EAP-IG-inputs);
- ``joint path``: minus each head's share of the all-ablated -> clean change along the joint path, the ranking the
  circuit search already computes (:func:`circuitkit.circuits.faithfulness.joint_attribution`, 2 midpoints).

Exact: :func:`circuitkit.ablation_effects`-style mean ablation (resumed at the head's layer) of the union of each
contender's top ``--exact-top`` heads by ``|estimate|`` and the heads called induction / previous-token heads
(the scan ablates its own top 8 and the called heads). Reported per contender: Spearman over the exactly ablated
heads (with its percentile bootstrap interval over those heads, 1000 resamples, seed 0), the largest miss, the
cost in forward passes (a gradient pass is 3; a pass resumed at layer ``l`` counts ``(L - l) / L``) and seconds.

Run: ``python benchmarks/estimates.py MODEL [--batch 8] [--exact-top 12] [--json out.json]`` with ``MODEL`` a zoo
name (default: the bundled model) or a local Hugging Face directory.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit_json  # noqa: E402  (benchmarks/ on sys.path)

import circuitkit as ck  # noqa: E402
from circuitkit.circuits.faithfulness import Ablator, joint_attribution  # noqa: E402
from circuitkit.detect.ablation import ablate  # noqa: E402
from circuitkit.detect.agreement import spearman  # noqa: E402
from circuitkit.detect.attribution import attribute  # noqa: E402
from circuitkit.detect.scores import PatternCollector  # noqa: E402
from circuitkit.detect.tokens import RepeatedTokens  # noqa: E402
from circuitkit.models.adapters import adapt  # noqa: E402
from circuitkit.pipeline import called_heads  # noqa: E402
from circuitkit.uncertainty import resample_counts  # noqa: E402

GRADIENT_PASS = 3.0


def layer_path_passes(steps: int, n_layers: int) -> float:
    return GRADIENT_PASS * (1 + (steps - 1) * sum((n_layers - layer) / n_layers for layer in range(n_layers)))


def spearman_interval(estimate: torch.Tensor, exact: torch.Tensor, n_resamples: int = 1000) -> list[float] | None:
    """Percentile interval of the Spearman correlation over the heads resampled with replacement."""
    n = exact.numel()
    if n < 4:
        return None
    values = []
    for row in resample_counts(n, n_resamples, 0):
        index = torch.repeat_interleave(torch.arange(n), row.long())
        value = spearman(estimate[index], exact[index])
        if value is not None and value == value:
            values.append(value)
    q = torch.quantile(torch.tensor(values, dtype=torch.float64), torch.tensor([0.025, 0.975], dtype=torch.float64))
    return [float(q[0]), float(q[1])]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", nargs="?", default=None)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--exact-top", type=int, default=12)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    model = ck.load_model(args.model) if args.model else ck.zoo.load()
    adapter = adapt(model)
    spec = adapter.spec
    L = spec.n_layers
    batch = RepeatedTokens(batch=args.batch).build(adapter)
    log = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    rows: dict[str, dict[str, Any]] = {}

    collector = PatternCollector(adapter, batch)
    start = time.perf_counter()
    first, run = attribute(adapter, batch, "mean", resid_layers=range(1, L), observers=collector.hooks())
    rows["first order"] = {"effect": first.effect, "passes": 1 + GRADIENT_PASS,
                           "seconds": time.perf_counter() - start}
    scores = collector.result()
    log(f"first order: {rows['first order']['seconds']:.1f} s")

    start = time.perf_counter()
    layer2, _ = attribute(adapter, batch, "mean", steps=2, path="layer")
    rows["layer path, 2 steps"] = {"effect": layer2.effect, "passes": 1 + layer_path_passes(2, L),
                                   "seconds": time.perf_counter() - start}
    log(f"layer path: {rows['layer path, 2 steps']['seconds']:.1f} s")

    start = time.perf_counter()
    inputs2, _ = attribute(adapter, batch, "mean", steps=2, path="inputs")
    rows["inputs path, 2 steps"] = {"effect": inputs2.effect, "passes": 1 + 2 * GRADIENT_PASS,
                                    "seconds": time.perf_counter() - start}
    log(f"inputs path: {rows['inputs path, 2 steps']['seconds']:.1f} s")

    start = time.perf_counter()
    ablator = Ablator(adapter, batch, dict(run.z_means))
    share = joint_attribution(ablator, 2)
    rows["joint path (circuit search)"] = {"effect": -share, "passes": float(ablator.passes),
                                           "seconds": time.perf_counter() - start}
    log(f"joint path: {rows['joint path (circuit search)']['seconds']:.1f} s")

    chosen: set[tuple[int, int]] = set(called_heads(scores, "induction")) | set(called_heads(scores, "previous_token"))
    for row in rows.values():
        effect = row["effect"]
        for i in effect.abs().reshape(-1).argsort(descending=True)[: args.exact_top].tolist():
            chosen.add(divmod(int(i), spec.n_heads))
    heads = sorted(chosen)
    start = time.perf_counter()
    exact = ablate(adapter, run, heads, "mean", resume=adapter.can_resume)
    exact_seconds = time.perf_counter() - start
    exact_passes = sum((L - layer) / L if adapter.can_resume and layer > 0 else 1.0 for layer, _ in heads)
    log(f"exact ablation of {len(heads)} heads: {exact_seconds:.1f} s")
    mask = exact.exact
    truth = exact.effect[mask].double()
    out: dict[str, Any] = {"model": args.model or ck.zoo.DEFAULT, "n_layers": L, "n_heads": spec.n_heads,
                           "batch": args.batch, "n_exact": len(heads), "exact_passes": exact_passes,
                           "exact_seconds": exact_seconds, "rows": {}}
    top = exact.top(1)[0]
    print(f"\n{out['model']}: {L} x {spec.n_heads} heads, batch {args.batch} x {batch.tokens.shape[1]}; "
          f"{len(heads)} heads ablated exactly ({exact_passes:.1f} passes, {exact_seconds:.0f} s); "
          f"largest exact: {top[0][0]}.{top[0][1]} {top[1]:+.3f}")
    print("| estimate | Spearman over the exact heads [95% interval] | forward passes | seconds | largest miss "
          "(head: exact, estimate) | estimate of the largest exact head |")
    print("|---|---|---|---|---|---|")
    for name, row in rows.items():
        estimate = row["effect"][mask].double()
        rho = spearman(estimate, truth)
        interval = spearman_interval(estimate, truth)
        miss = int((estimate - truth).abs().argmax())
        miss_head = tuple(mask.nonzero()[miss].tolist())
        largest = float(row["effect"][top[0][0], top[0][1]])
        out["rows"][name] = {"spearman": rho, "interval": interval, "passes": row["passes"],
                             "seconds": row["seconds"], "largest_miss": [list(miss_head), float(truth[miss]),
                                                                          float(estimate[miss])],
                             "estimate_of_largest": largest}
        band = "" if interval is None else f" [{interval[0]:.2f}, {interval[1]:.2f}]"
        print(f"| {name} | {rho:.3f}{band} | {row['passes']:.1f} | {row['seconds']:.1f} | "
              f"{miss_head[0]}.{miss_head[1]}: {float(truth[miss]):+.3f}, {float(estimate[miss]):+.3f} | "
              f"{largest:+.3f} |")
    if args.json:
        emit_json(out, args.json)
    return out


if __name__ == "__main__":
    main()
