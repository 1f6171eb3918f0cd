"""Integrated-gradient attribution against exact measurements: which path, how many steps, at what cost.

Heads: for every head, exact mean ablation (:func:`circuitkit.ablation_effects`) against
:func:`circuitkit.attribution_effects` with ``steps`` in ``--steps`` on each path:

- ``inputs/resample``: the input embeddings interpolated between a resampled batch and the clean one (EAP-IG-inputs);
- ``inputs/mean``: the same from the clean embeddings' batch mean at each position;
- ``layer``: each layer's ``z`` interpolated between its mean-ablated and clean value (all heads of the layer at
  once, every other layer clean).

Reported: Spearman rank correlation over all heads, the largest miss ``|estimate - exact|`` (head, exact,
estimate), the cost in gradient passes (one forward + one backward over the batch; a resumed pass from layer ``l``
counts ``(L - l) / L``) and the measured wall time in units of one forward pass of the same batch.

Edges (``--edges``, the zoo model only: all its edges are path-patched exactly): :func:`circuitkit.edge_attribution`
on the inputs path against :func:`circuitkit.path_patching` of every edge, per metric and corruption: Spearman,
relative error ``||est - exact|| / ||exact||``, how many of the exact top :data:`TOP_EDGES` edges the estimate's own top
:data:`TOP_EDGES` holds (the edges a scan would path-patch), and the largest-effect edge's estimate.

Models: the bundled ``induction-2l`` (trained), and Hugging Face checkpoints of the GPT-2-small shape (12 x 12) and
the SmolLM-135M shape (Llama, 30 layers x 9 query heads in 3 key/value groups) with RANDOM weights (no pretrained
weights can be downloaded here): on random weights attention is not saturated, so they measure cost and the
no-saturation case, not the real-model failure IG is for.

Run: ``python benchmarks/ig.py [--json out.json] [--models zoo gpt2 smollm] [--batch N] [--steps 1 2 4 8]
[--large-steps 1 2 4] [--large-paths inputs/resample layer]`` (the large shapes cost minutes per gradient pass
configuration on 2 CPU cores: fewer steps and paths there by default).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from _common import emit_json  # benchmarks/ is on sys.path when a script here runs
from scan import save_gpt2_small_shape, save_smollm_shape

TOP_EDGES = 5

PATHS: tuple[tuple[str, str, str], ...] = (
    ("inputs/resample", "inputs", "resample"),
    ("inputs/mean", "inputs", "mean"),
    ("layer", "layer", "resample"),
)


def gradient_passes(path: str, steps: int, n_layers: int, can_resume: bool) -> float:
    """Cost in gradient passes (forward + backward over the batch) of head attribution with ``steps``."""
    if steps == 1:
        return 1.0
    if path == "inputs":
        return float(steps)
    per_point = sum((n_layers - layer) / n_layers for layer in range(n_layers)) if can_resume else n_layers
    return 1.0 + (steps - 1) * per_point


def forward_seconds(adapter: Any, tokens: torch.Tensor, repeats: int = 5) -> float:
    with torch.no_grad():
        adapter.run(tokens)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            adapter.run(tokens)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def miss(estimate: torch.Tensor, exact: torch.Tensor, n_heads: int) -> dict[str, Any]:
    error = (estimate - exact).abs()
    index = int(error.argmax())
    return {"head": f"{index // n_heads}.{index % n_heads}", "exact": float(exact[index]),
            "estimate": float(estimate[index]), "abs": float(error[index])}


def bench_heads(label: str, model: Any, tokens: Any, steps_list: list[int], paths: list[str]) -> dict[str, Any]:
    import circuitkit as ck
    from circuitkit.detect.agreement import spearman
    from circuitkit.detect.tokens import as_batch
    from circuitkit.models.adapters import adapt

    adapter = adapt(model)
    spec = adapter.spec
    batch = as_batch(tokens, adapter)
    forward = forward_seconds(adapter, batch.tokens)
    start = time.perf_counter()
    exact = ck.ablation_effects(model, batch, method="mean", progress=False).effect.flatten()
    exact_s = time.perf_counter() - start
    rows = []
    for name, path, corrupt in PATHS:
        if name not in paths:
            continue
        for steps in steps_list:
            if steps == 1 and name != paths[0]:
                continue  # steps=1 is the same first-order estimate on every path
            start = time.perf_counter()
            estimate = ck.attribution_effects(model, batch, method="mean", steps=steps, path=path,
                                              corrupt=corrupt).effect.flatten()
            seconds = time.perf_counter() - start
            rows.append({
                "path": "first-order" if steps == 1 else name, "steps": steps,
                "spearman": spearman(estimate, exact), "largest_miss": miss(estimate, exact, spec.n_heads),
                "gradient_passes": gradient_passes(path, steps, spec.n_layers, adapter.can_resume),
                "seconds": seconds, "forward_ratio": seconds / forward,
            })
            print(f"[{label}: {rows[-1]['path']} steps={steps}: rho {rows[-1]['spearman']:.3f}, "
                  f"{seconds:.1f} s]", flush=True)
    top = int(exact.abs().argmax())
    return {
        "model": label,
        "shape": f"{spec.n_layers}L x {spec.n_heads}H ({spec.n_kv_heads} kv), d_model {spec.d_model}",
        "batch": list(batch.tokens.shape), "forward_s": forward,
        "exact_all_heads_s": exact_s, "exact_forward_ratio": exact_s / forward,
        "largest_exact": {"head": f"{top // spec.n_heads}.{top % spec.n_heads}", "effect": float(exact[top])},
        "rows": rows,
    }


def bench_edges(model: Any, steps_list: list[int]) -> list[dict[str, Any]]:
    import circuitkit as ck
    from circuitkit.detect.agreement import spearman
    from circuitkit.models.adapters import adapt

    spec = adapt(model).spec
    L, H = spec.n_layers, spec.n_heads
    keys = [((l1, h1), (l2, h2), c) for l1 in range(L) for h1 in range(H) for l2 in range(l1 + 1, L)
            for h2 in range(H) for c in "qkv"]
    out = []
    for metric in ("loss", "induction"):
        for corrupt in ("resample", "mean"):
            exact = torch.tensor([e.effect for e in ck.path_patching(model, keys, metric=metric,
                                                                      corrupt=corrupt).edges])
            top = int(exact.abs().argmax())
            exact_top = set(exact.abs().argsort(descending=True)[:TOP_EDGES].tolist())
            for steps in steps_list:
                scores = ck.edge_attribution(model, metric=metric, corrupt=corrupt, steps=steps)
                estimate = torch.tensor([scores.value(*key) for key in keys])
                out.append({
                    "metric": metric, "corrupt": corrupt, "steps": steps, "n_edges": len(keys),
                    "spearman": spearman(estimate, exact),
                    "relative_error": float((estimate - exact).norm() / exact.norm()),
                    "top_overlap": len(exact_top & set(estimate.abs().argsort(descending=True)[:TOP_EDGES].tolist())),
                    "top_edge": f"{keys[top][0][0]}.{keys[top][0][1]} -> {keys[top][1][0]}.{keys[top][1][1]} "
                    f"({keys[top][2]})",
                    "top_exact": float(exact[top]), "top_estimate": float(estimate[top]),
                })
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=str, default=None, help="also write the JSON here")
    parser.add_argument("--models", nargs="+", default=["zoo", "gpt2", "smollm"], choices=["zoo", "gpt2", "smollm"])
    parser.add_argument("--batch", type=int, default=8, help="sequences in the batch of the large shapes")
    parser.add_argument("--steps", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--large-steps", type=int, nargs="+", default=[1, 2, 4], help="steps on the large shapes")
    parser.add_argument("--large-paths", nargs="+", default=["inputs/resample", "layer"],
                        choices=[p[0] for p in PATHS], help="paths measured on the large shapes")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from circuitkit import zoo
    from circuitkit.detect.tokens import RepeatedTokens
    from circuitkit.models import load_model

    heads, edges = [], []
    if "zoo" in args.models:
        heads.append(bench_heads("zoo induction-2l", zoo.load(), RepeatedTokens(), args.steps, [p[0] for p in PATHS]))
        edges = bench_edges(zoo.load(), args.steps)
    saves = {"gpt2": save_gpt2_small_shape, "smollm": save_smollm_shape}
    large = [saves[key] for key in args.models if key in saves]
    with tempfile.TemporaryDirectory(prefix="circuitkit-bench-") as root:
        for save in large:
            path = Path(root) / save.__name__
            label = save(path)
            model = load_model(path)
            heads.append(bench_heads(label + " (random)", model, RepeatedTokens(batch=args.batch), args.large_steps,
                                     args.large_paths))
            del model

    for h in heads:
        print(f"\n{h['model']}  {h['shape']}  batch {tuple(h['batch'])}  forward {h['forward_s'] * 1e3:.0f} ms; "
              f"exact ablation of every head {h['exact_forward_ratio']:.0f}x; largest exact "
              f"{h['largest_exact']['head']} {h['largest_exact']['effect']:+.3f}")
        print(f"  {'path':<16} {'steps':>5} {'rho':>6} {'grad passes':>11} {'time':>7}  largest miss")
        for r in h["rows"]:
            m = r["largest_miss"]
            print(f"  {r['path']:<16} {r['steps']:>5} {r['spearman']:>6.3f} {r['gradient_passes']:>11.1f} "
                  f"{r['forward_ratio']:>6.0f}x  {m['head']}: exact {m['exact']:+.3f}, est {m['estimate']:+.3f}")
    print("\nzoo edges, inputs path, against exact path patching of every edge")
    print(f"  {'metric':<10} {'corrupt':<9} {'steps':>5} {'rho':>6} {'rel err':>7} {'top' + str(TOP_EDGES):>5}  "
          "largest edge: exact, estimate")
    for e in edges:
        print(f"  {e['metric']:<10} {e['corrupt']:<9} {e['steps']:>5} {e['spearman']:>6.3f} "
              f"{e['relative_error']:>7.3f} {e['top_overlap']:>5}  {e['top_edge']}: {e['top_exact']:+.3f}, "
              f"{e['top_estimate']:+.3f}")
    emit_json({"torch_threads": torch.get_num_threads(), "heads": heads, "edges": edges}, args.json)


if __name__ == "__main__":
    main()
