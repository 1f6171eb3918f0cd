"""Composition scores for every head pair: circuitkit vs TransformerLens, side by side in one run.

Usage::

    python benchmarks/composition.py                      # GPT-2 small / medium / XL shapes, mode Q
    python benchmarks/composition.py --shapes small --modes Q,K,V
    python benchmarks/composition.py --shapes xl --skip-reference
    python benchmarks/composition.py --shapes llama2-7b,llama3-8b --modes Q,K,V --device cuda --skip-reference

Random Gaussian weights at real model shapes (no downloads). Each contender runs in its own child
process, which reports its own time and peak memory (``benchmarks/_common.py``):

- ``circuitkit``: :func:`circuitkit.composition_scores` (best of ``--repeat`` calls);
- ``TransformerLens``: ``transformer_lens.utilities.matrix.composition_scores`` on ``FactoredMatrix``
  circuits, built as ``TransformerBridge.all_composition_scores`` builds them (one call; it is slow and
  large). It is run only where its estimated memory fits this machine: its broadcasting ``matmul``
  expands both collapsed factors to ``[L, H, L, H, d_model, d_head]`` (two copies) plus the
  ``[L, H, L, H, d_head, d_head]`` product, so ~``(L H)^2 (2 d_model d_head + d_head^2) 4`` bytes;
- lower bound: the same machine's time for one ``[L*H*d_head, d_model] @ [d_model, L*H*d_head]`` product
  (all heads' inner products; timed on a row slab and scaled where the full output would not fit), and
  the share of it that the ``src_layer < dst_layer`` pairs need, ``(L-1)/(2L)`` of it. It is timed in
  circuitkit's child, alternating with circuitkit's calls, so both see the same load on a shared CPU.

Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import (  # noqa: E402
    CHILD_FLAG,
    child_main,
    format_bytes,
    format_seconds,
    memory_now,
    memory_report,
    print_json,
    print_table,
    run_child,
    time_call,
)

# name: (layers, heads, d_model, d_head, kv_heads or None)
SHAPES: dict[str, tuple[int, int, int, int, int | None]] = {
    "tiny": (4, 4, 64, 16, None),
    "small": (12, 12, 768, 64, None),
    "small-gqa": (12, 12, 768, 64, 4),  # GPT-2-small shape with 4 key/value groups of 3 query heads
    "medium": (24, 16, 1024, 64, None),
    "xl": (48, 25, 1600, 64, None),
    "llama2-7b": (32, 32, 4096, 128, None),  # Llama-2-7B: multi-head attention
    "llama3-8b": (32, 32, 4096, 128, 8),  # Llama-3-8B: 8 key/value groups of 4 query heads
}
TARGETS = {
    "small": "TL/ours >= 10x time, ours <= 1/5 TL peak",
    "medium": "ours peak < 4 GB (TL cannot)",
    "xl": "ours peak < 2 GB",
    "llama2-7b": "< 5 s per mode on a GPU",
    "llama3-8b": "< 5 s per mode on a GPU",
}
SAMPLE_PAIRS = 32
"""Pairs checked against a dense float64 reference in every circuitkit child (chosen with a seeded generator)."""
MACHINE_MEMORY_BYTES = 24 * 2**30
REFERENCE_MEMORY_LIMIT = 16 * 2**30
"""Run TransformerLens only if its estimated peak is below this (others share the 24 GB machine)."""
LOWER_BOUND_OUTPUT_CAP = 2 * 2**30
"""Largest lower-bound product output materialised; beyond it a row slab is timed and scaled."""


def _build_weights(shape: str, device: str, seed: int = 0):
    import torch

    from circuitkit import HeadWeights

    L, H, d_model, d_head, G = SHAPES[shape]
    G = G or H
    generator = torch.Generator(device=device).manual_seed(seed)

    def randn(*size):
        return torch.randn(*size, generator=generator, device=device).mul_(d_model**-0.5)

    return HeadWeights(
        W_Q=randn(L, H, d_model, d_head),
        W_K=randn(L, G, d_model, d_head),
        W_V=randn(L, G, d_model, d_head),
        W_O=randn(L, H, d_head, d_model),
    )


def tl_memory_estimate(shape: str) -> int:
    """Bytes TransformerLens's broadcast needs at ``shape`` (see the module docstring)."""
    L, H, d_model, d_head, _ = SHAPES[shape]
    pairs = (L * H) ** 2
    return pairs * (2 * d_model * d_head + d_head * d_head) * 4


# ---------------------------------------------------------------------------------------------- children
def child_ours(shape: str, mode: str, device: str, repeat: int, memory_budget: int, save: str | None) -> dict:
    """Time and peak memory of circuitkit, then its time interleaved with the lower-bound product.

    The first call gives the peak memory (nothing else has run in this process yet); the following calls
    alternate with the lower-bound product so that both see the same machine load (the CPU is shared).
    """
    import torch

    from circuitkit import composition_scores

    weights = _build_weights(shape, device)
    before = memory_now(device)
    result: dict[str, Any] = {}

    def call():
        result["scores"] = composition_scores(weights, mode, memory_budget=memory_budget)

    first = time_call(call, repeat=1, device=device)["best_s"]
    report = {"first_s": first, **memory_report(before, device), "inputs_bytes": before}
    report["float64_sample_max_diff"] = _sample_check(weights, mode, result["scores"])
    if save:
        torch.save(result["scores"].cpu(), save)
    result.clear()
    bound_call, bound_scale = _lower_bound_call(shape, device)
    ours_times, bound_times = [first], []
    for _ in range(repeat):
        bound_times.append(time_call(bound_call, repeat=1, device=device)["best_s"])
        if len(ours_times) < repeat:
            ours_times.append(time_call(call, repeat=1, device=device)["best_s"])
    L = SHAPES[shape][0]
    full = min(bound_times) * bound_scale
    report.update(best_s=min(ours_times), times_s=ours_times,
                  lower_bound={"full_product_s": full, "forward_pairs_s": full * (L - 1) / (2 * L)})
    return report


def _sample_check(weights, mode: str, scores) -> float:
    """Largest |circuitkit - dense float64| over :data:`SAMPLE_PAIRS` random pairs with src layer < dst layer:
    ``||W_A W_B||_F / (||W_A||_F ||W_B||_F)`` built densely (d_model x d_model) per pair, in float64."""
    import torch

    L, H = weights.n_layers, weights.n_heads
    if L < 2:
        return 0.0
    g = torch.Generator().manual_seed(1)
    worst = 0.0
    for _ in range(SAMPLE_PAIRS):
        l1 = int(torch.randint(0, L - 1, (1,), generator=g))
        l2 = int(torch.randint(l1 + 1, L, (1,), generator=g))
        h1, h2 = (int(torch.randint(0, H, (1,), generator=g)) for _ in range(2))

        def w(name, layer, head):
            return weights.per_query_head(name)[layer, head] if name in ("W_K", "W_V") else getattr(weights, name)[
                layer, head]

        left = w("W_V", l1, h1).double() @ w("W_O", l1, h1).double()
        q, k, v, o = (w(n, l2, h2).double() for n in ("W_Q", "W_K", "W_V", "W_O"))
        right = {"Q": q @ k.T, "K": k @ q.T, "V": v @ o}[mode]
        dense = float((left @ right).norm() / (left.norm() * right.norm()))
        worst = max(worst, abs(dense - float(scores[l1, h1, l2, h2])))
    return worst


def _lower_bound_call(shape: str, device: str):
    """The lower-bound product (or a row slab of it) and the factor that scales its time to the whole."""
    import torch

    L, H, d_model, d_head, _ = SHAPES[shape]
    n = L * H * d_head
    rows = min(n, max(1, LOWER_BOUND_OUTPUT_CAP // (4 * n)))
    generator = torch.Generator(device=device).manual_seed(1)
    left = torch.randn(rows, d_model, generator=generator, device=device)
    right = torch.randn(d_model, n, generator=generator, device=device)
    left @ right  # warm-up: first-call allocation and thread start-up are not part of the bound
    return (lambda: left @ right), n / rows


def child_reference(shape: str, mode: str, save: str | None) -> dict:
    import torch
    from transformer_lens.FactoredMatrix import FactoredMatrix
    from transformer_lens.utilities.matrix import composition_scores as tl_scores

    weights = _build_weights(shape, "cpu")
    before = memory_now("cpu")
    out: dict[str, Any] = {}

    def call():
        with torch.no_grad():
            W_K, W_V = weights.per_query_head("W_K"), weights.per_query_head("W_V")
            left = FactoredMatrix(W_V, weights.W_O)
            qk = FactoredMatrix(weights.W_Q, W_K.transpose(-2, -1))
            right = {"Q": qk, "K": qk.T, "V": left}[mode]
            scores = tl_scores(left, right, broadcast_dims=True)
            layers = torch.arange(weights.n_layers)
            mask = layers[:, None, None, None] < layers[None, None, :, None]
            out["scores"] = torch.where(mask, scores, torch.zeros_like(scores))

    timing = time_call(call, repeat=1)
    report = {**timing, **memory_report(before, "cpu"), "inputs_bytes": before}
    if save:
        torch.save(out["scores"], save)
    return report


# ---------------------------------------------------------------------------------------------- parent
def _compare(ours_path: str, reference_path: str) -> float:
    import torch

    ours, reference = torch.load(ours_path, weights_only=True), torch.load(reference_path, weights_only=True)
    return float((ours - reference.float()).abs().max())


def bench_shape(shape: str, mode: str, args: argparse.Namespace, tmp: str) -> dict[str, Any]:
    L, H, d_model, d_head, G = SHAPES[shape]
    script = os.path.abspath(__file__)
    row: dict[str, Any] = {"shape": shape, "mode": mode, "layers_x_heads": f"{L}x{H}" + (f" kv{G}" if G else ""),
                           "d_model": d_model, "d_head": d_head, "device": args.device}
    repeat = args.repeat if L * H <= 400 else 1
    estimate = tl_memory_estimate(shape)
    row["tl_estimate_bytes"] = estimate
    run_reference = not args.skip_reference and args.device == "cpu" and estimate <= REFERENCE_MEMORY_LIMIT
    ours_path = os.path.join(tmp, f"ours-{shape}-{mode}.pt") if run_reference else None
    ours = run_child(script, "ours", shape=shape, mode=mode, device=args.device, repeat=repeat,
                     memory_budget=args.memory_budget, save=ours_path)
    row["ours"] = ours
    row["lower_bound"] = ours.pop("lower_bound", {"error": "not measured"})
    if run_reference:
        reference_path = os.path.join(tmp, f"tl-{shape}-{mode}.pt")
        reference = run_child(script, "reference", shape=shape, mode=mode, save=reference_path)
        row["reference"] = reference
        if "error" not in reference and "error" not in ours:
            row["max_abs_diff"] = _compare(ours_path, reference_path)
    elif estimate > MACHINE_MEMORY_BYTES:
        row["reference"] = {"error": f"TL cannot: needs > 24 GB (estimated {format_bytes(estimate)})"}
    else:
        row["reference"] = {"error": "skipped"}
    return row


def _display(row: dict[str, Any]) -> dict[str, str]:
    ours, ref, bound = row["ours"], row["reference"], row["lower_bound"]
    shown = {key: str(row[key]) for key in ("shape", "mode", "layers_x_heads", "d_model", "d_head")}
    if "error" in ours:
        shown["ours_s"] = ours["error"]
        return shown
    shown["ours_s"] = format_seconds(ours["best_s"])
    shown["ours_peak"] = format_bytes(ours["peak_bytes"])
    shown["ours_work"] = format_bytes(ours["peak_above_inputs_bytes"])
    shown["f64_diff"] = f"{ours.get('float64_sample_max_diff', float('nan')):.1e}"
    shown["tl_s"] = format_seconds(ref.get("best_s")) if "error" not in ref else ref["error"]
    shown["tl_peak"] = format_bytes(ref.get("peak_bytes")) if "error" not in ref else "-"
    if "error" not in ref:
        shown["speedup"] = f"{ref['best_s'] / ours['best_s']:.1f}x"
        shown["mem_ratio"] = f"1/{ref['peak_bytes'] / ours['peak_bytes']:.1f}"
        shown["max_diff"] = f"{row.get('max_abs_diff', float('nan')):.1e}"
    if "error" not in bound:
        shown["lb_full_s"] = format_seconds(bound["full_product_s"])
        shown["lb_pairs_s"] = format_seconds(bound["forward_pairs_s"])
        shown["ours/lb_pairs"] = f"{ours['best_s'] / bound['forward_pairs_s']:.2f}x"
        shown["ours/lb_full"] = f"{ours['best_s'] / bound['full_product_s']:.2f}x"
    return shown


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="small,medium,xl", help=f"comma list from {', '.join(SHAPES)}")
    parser.add_argument("--modes", default="Q", help="comma list from Q,K,V")
    parser.add_argument("--skip-reference", action="store_true", help="do not run TransformerLens")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (TransformerLens runs on cpu only)")
    parser.add_argument("--repeat", type=int, default=3, help="calls timed per measurement (best is reported)")
    parser.add_argument("--memory-budget", type=int, default=256 * 2**20, help="composition_scores budget, bytes")
    args = parser.parse_args(argv)
    shapes = [s for s in args.shapes.split(",") if s]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        parser.error(f"unknown shapes {unknown}; choose from {list(SHAPES)}")
    modes = [m for m in args.modes.split(",") if m]

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for shape in shapes:
            for mode in modes:
                rows.append(bench_shape(shape, mode, args, tmp))
                print(f"done {shape} {mode}", file=sys.stderr, flush=True)
    columns = [("shape", "shape"), ("mode", "mode"), ("layers_x_heads", "LxH"), ("d_model", "d_model"),
               ("tl_s", "TL time"), ("tl_peak", "TL peak"), ("ours_s", "ours time"), ("ours_peak", "ours peak"),
               ("ours_work", "ours above weights"), ("speedup", "speedup"), ("mem_ratio", "mem vs TL"),
               ("max_diff", "max |diff|"), ("f64_diff", "vs float64 sample"),
               ("lb_full_s", "LB full product"), ("lb_pairs_s", "LB src<dst share"),
               ("ours/lb_pairs", "ours/LB share"), ("ours/lb_full", "ours/LB full")]
    print_table([_display(row) for row in rows], columns,
                title=f"composition scores, device {args.device}, {os.cpu_count()} CPUs (targets: {TARGETS})")
    print_json("composition", {"device": args.device, "rows": rows})


if __name__ == "__main__":
    if CHILD_FLAG in sys.argv:
        child_main({"ours": child_ours, "reference": child_reference})
    else:
        main()
