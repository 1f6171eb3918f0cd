"""Which head estimate ranks heads as exact ablation does, over every head of a real model, at what cost.

Contenders (every one an estimate of each head's mean-ablation effect on the repeated-copies loss, nats):

- ``first order``: :func:`circuitkit.attribution_effects` at ``steps=1`` (AtP; the scan's table; one gradient pass);
- ``IG layer path, 2 steps``: integrated gradients along each layer's own path (``steps=2, path="layer"``);
- ``IG inputs path, 5 steps``: integrated gradients along the input embeddings, EAP-IG's path and step count;
- ``QK fix``, ``GradDrop``, ``AtP*``: :mod:`circuitkit.detect.atp` (the attention-saturation fix for queries and keys,
  GradDrop, and both together; one computation gives all three);
- ``joint path``: minus each head's share of the all-ablated -> clean change along the joint path (the ranking the
  circuit search computes, :func:`circuitkit.circuits.faithfulness.joint_attribution`, 2 midpoints).

Exact: mean ablation of **every** head, one head per batch copy, stacked per pass and resumed at the head's layer.
Reported per contender: Spearman over all heads (with its percentile bootstrap interval over the heads, 1000
resamples, seed 0), Spearman of the magnitudes, how many of the exact top 10 by |effect| are in the estimate's top
10, the largest miss, the cost in forward passes (a gradient pass is 3; a pass resumed at layer ``l`` counts
``(L - l) / L``) and seconds. Every head's values go to the JSON, so other comparisons need no rerun.

Run: ``nice python benchmarks/estimates.py MODEL [--batch 8] [--block-len N] [--json out.json]`` with ``MODEL`` a
zoo name (default: the bundled model) or a local Hugging Face directory. The exact effects are measured first; the JSON
(every row so far) is rewritten after each estimate.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import circuitkit as ck  # noqa: E402
from circuitkit.circuits.faithfulness import Ablator, joint_attribution  # noqa: E402
from circuitkit.detect.ablation import ablate  # noqa: E402
from circuitkit.detect.agreement import spearman, spearman_rows  # noqa: E402
from circuitkit.detect.atp import atp_estimates  # noqa: E402
from circuitkit.detect.attribution import attribute  # noqa: E402
from circuitkit.detect.effects import HeadEffects  # noqa: E402
from circuitkit.detect.tokens import RepeatedTokens  # noqa: E402
from circuitkit.models.adapters import adapt  # noqa: E402
from circuitkit.uncertainty import resample_counts  # noqa: E402

GRADIENT_PASS = 3.0
TOP = 10


def layer_path_passes(steps: int, n_layers: int) -> float:
    return GRADIENT_PASS * (1 + (steps - 1) * sum((n_layers - layer) / n_layers for layer in range(n_layers)))


def spearman_interval(estimate: torch.Tensor, exact: torch.Tensor, n_resamples: int = 1000) -> list[float] | None:
    """Percentile interval of the Spearman correlation over the heads resampled with replacement (all resamples
    ranked at once, average ranks for ties)."""
    n = exact.numel()
    if n < 4:
        return None
    index = torch.cat([torch.repeat_interleave(torch.arange(n), row.long())[None]
                       for row in resample_counts(n, n_resamples, 0)])  # [R, n]
    rho = spearman_rows(estimate.double()[index], exact.double()[index])
    rho = rho[torch.isfinite(rho)]
    q = torch.quantile(rho, torch.tensor([0.025, 0.975], dtype=torch.float64))
    return [float(q[0]), float(q[1])]


def top_overlap(estimate: torch.Tensor, exact: torch.Tensor, k: int = TOP) -> int:
    top_exact = set(exact.abs().argsort(descending=True)[:k].tolist())
    return len(top_exact & set(estimate.abs().argsort(descending=True)[:k].tolist()))


def wait_for_exact(path: str, log: Any, limit_s: float = 3600.0) -> dict[str, Any]:
    """The JSON at ``path`` once it holds the exact effects (polled every 20 s, at most ``limit_s``)."""
    start = time.perf_counter()
    while time.perf_counter() - start < limit_s:
        try:
            with open(path) as f:
                saved = json.load(f)
            if "exact" in saved:
                return saved
        except (OSError, ValueError):
            pass
        log(f"waiting for the exact effects in {path}")
        time.sleep(20)
    raise SystemExit(f"no exact effects in {path} after {limit_s:.0f} s")


def write(out: dict[str, Any], path: str | None) -> None:
    if not path:
        return
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(out, f, indent=1)
    os.replace(tmp, path)


def table(out: dict[str, Any], rows: dict[str, dict[str, Any]], exact: torch.Tensor, H: int) -> list[str]:
    """The table's rows of every estimate measured so far against ``exact`` (also stored in ``out["rows"]``)."""
    truth = exact.reshape(-1).double()
    lines = []
    for name, row in rows.items():
        estimate = row["effect"].reshape(-1).double()
        rho = spearman(estimate, truth)
        rho_abs = spearman(estimate.abs(), truth.abs())
        interval = spearman_interval(estimate, truth)
        overlap = top_overlap(estimate, truth)
        miss = int((estimate - truth).abs().argmax())
        miss_head = divmod(miss, H)
        out["rows"][name] = {"spearman": rho, "interval": interval, "spearman_magnitude": rho_abs,
                             "top_overlap": overlap, "passes": row["passes"], "seconds": row["seconds"],
                             "largest_miss": [list(miss_head), float(truth[miss]), float(estimate[miss])]}
        band = "" if interval is None else f" [{interval[0]:.2f}, {interval[1]:.2f}]"
        lines.append(f"| {name} | {rho:.3f}{band} | {rho_abs:.3f} | {overlap} | {row['passes']:.1f} | "
                     f"{row['seconds']:.0f} | {miss_head[0]}.{miss_head[1]}: {float(truth[miss]):+.3f}, "
                     f"{float(estimate[miss]):+.3f} |")
    return lines


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", nargs="?", default=None)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--block-len", type=int, default=None)
    parser.add_argument("--json", default=None)
    parser.add_argument("--exact-from", default=None,
                        help="a JSON this script wrote on the same model and batch: its exact effects are read from "
                        "it (waiting until it holds them) instead of ablating every head here")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    model = ck.load_model(args.model) if args.model else ck.zoo.load()
    adapter = adapt(model)
    spec = adapter.spec
    L, H = spec.n_layers, spec.n_heads
    batch = RepeatedTokens(batch=args.batch, block_len=args.block_len).build(adapter)
    log = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    out: dict[str, Any] = {"model": args.model or ck.zoo.DEFAULT, "n_layers": L, "n_heads": H, "batch": args.batch,
                           "seq_len": int(batch.tokens.shape[1]), "threads": torch.get_num_threads(),
                           "estimates": {}, "rows": {}}
    rows: dict[str, dict[str, Any]] = {}
    exact_effect: list[torch.Tensor] = []

    def record(name: str, effect: torch.Tensor, passes: float, seconds: float) -> None:
        rows[name] = {"effect": effect.float(), "passes": passes, "seconds": seconds}
        out["estimates"][name] = {"passes": passes, "seconds": seconds, "effect": effect.float().tolist()}
        log(f"{name}: {seconds:.1f} s")
        if exact_effect:
            table(out, rows, exact_effect[0], H)
        write(out, args.json)

    # the exact effects first (the ground truth every row needs), then the estimates, cheapest first
    start = time.perf_counter()
    first, run = attribute(adapter, batch, "mean", resid_layers=range(1, L))
    first_seconds = time.perf_counter() - start
    heads = [(layer, head) for layer in range(L) for head in range(H)]
    if args.exact_from is None:
        start = time.perf_counter()
        exact = ablate(adapter, run, heads, "mean", resume=adapter.can_resume)
        exact_seconds = time.perf_counter() - start
        exact_passes = sum((L - layer) / L if adapter.can_resume and layer > 0 else 1.0 for layer, _ in heads)
        log(f"exact ablation of {len(heads)} heads: {exact_seconds:.1f} s")
        exact_effect.append(exact.effect)
        out.update(n_exact=len(heads), exact_passes=exact_passes, exact_seconds=exact_seconds,
                   clean_loss=exact.clean_loss, exact=exact.effect.tolist())
    record("first order (AtP)", first.effect, 1 + GRADIENT_PASS, first_seconds)

    start = time.perf_counter()
    est = atp_estimates(adapter, batch, "mean")
    seconds = time.perf_counter() - start
    out["atp_first_order_gap"] = float((est.first_order.effect - first.effect).abs().max())
    for name, effects in (("AtP* QK fix", est.qk_fix), ("AtP* GradDrop", est.graddrop), ("AtP* (QK fix + GradDrop)",
                                                                                         est.atp_star)):
        record(name, effects.effect, est.passes, seconds)

    start = time.perf_counter()
    inputs5, _ = attribute(adapter, batch, "mean", steps=5, path="inputs")
    record("IG inputs path (EAP-IG), 5 steps", inputs5.effect, 1 + 5 * GRADIENT_PASS, time.perf_counter() - start)

    start = time.perf_counter()
    layer2, _ = attribute(adapter, batch, "mean", steps=2, path="layer")
    record("IG layer path, 2 steps", layer2.effect, 1 + layer_path_passes(2, L), time.perf_counter() - start)

    start = time.perf_counter()
    ablator = Ablator(adapter, batch, dict(run.z_means))
    share = joint_attribution(ablator, 2)
    record("joint path (circuit search)", -share, float(ablator.passes), time.perf_counter() - start)

    if args.exact_from is not None:
        saved = wait_for_exact(args.exact_from, log)
        if saved["seq_len"] != out["seq_len"] or saved["batch"] != args.batch:
            raise SystemExit(f"{args.exact_from} was measured on another batch")
        out["first_order_gap_to_exact_run"] = float(
            (torch.tensor(saved["estimates"]["first order (AtP)"]["effect"]) - first.effect).abs().max())
        exact_passes, exact_seconds = saved["exact_passes"], saved["exact_seconds"]
        out.update({key: saved[key] for key in ("n_exact", "exact_passes", "exact_seconds", "clean_loss", "exact")},
                   exact_from=args.exact_from)
        exact = HeadEffects("ablation", "mean", saved["clean_loss"], torch.tensor(saved["exact"]),
                            torch.ones(L, H, dtype=torch.bool))
    top = exact.top(1)[0]
    print(f"\n{out['model']}: {L} x {H} heads, batch {args.batch} x {batch.tokens.shape[1]}; every head ablated "
          f"exactly ({exact_passes:.1f} passes, {exact_seconds:.0f} s); largest exact: {top[0][0]}.{top[0][1]} "
          f"{top[1]:+.3f}")
    print(f"| estimate | Spearman over all {len(heads)} heads [95% interval] | Spearman of magnitudes | "
          f"exact top {TOP} in its top {TOP} | forward passes | seconds | largest miss (head: exact, estimate) |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(table(out, rows, exact.effect, H)))
    write(out, args.json)
    return out


if __name__ == "__main__":
    main()
