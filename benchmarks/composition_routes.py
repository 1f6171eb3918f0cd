"""The two routes of ``composition_scores`` side by side: the tiled product of folded ``d_head``-sized factors and
the ``d_model``-sized Gram matrices (float64), on the scan's three model shapes (random Gaussian weights), with
the route ``composition_scores`` picks and the largest difference between the routes.

Run: ``python benchmarks/composition_routes.py [--repeats N] [--json out.json]``. Times are the best of
``--repeats`` calls per route and mode.
"""

from __future__ import annotations

import argparse
import time

import torch
from _common import emit_json  # benchmarks/ is on sys.path when a script here runs

SHAPES = {
    # name: (layers, heads, d_model, d_head, key/value heads)
    "gpt2-small": (12, 12, 768, 64, 12),
    "smollm-135m": (30, 9, 576, 64, 3),
    "gemma-3-270m": (18, 4, 640, 256, 1),
}


def best(function, repeats: int) -> tuple[float, torch.Tensor]:
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = function()
        times.append(time.perf_counter() - start)
    return min(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="calls per route and mode (best reported)")
    parser.add_argument("--json", type=str, default=None, help="also write the JSON here")
    args = parser.parse_args()

    from circuitkit import HeadWeights
    from circuitkit.composition import DEFAULT_MEMORY_BUDGET, _gram_is_cheaper, _gram_scores, _raw_scores, _unit_heads

    rows = []
    for name, (L, H, d_model, d_head, G) in SHAPES.items():
        g = torch.Generator().manual_seed(0)
        w = _unit_heads(HeadWeights(
            W_Q=torch.randn(L, H, d_model, d_head, generator=g), W_K=torch.randn(L, G, d_model, d_head, generator=g),
            W_V=torch.randn(L, G, d_model, d_head, generator=g), W_O=torch.randn(L, H, d_head, d_model, generator=g),
        ))
        for mode in ("Q", "K", "V"):
            tiled_s, tiled = best(lambda w=w, mode=mode: _raw_scores(w, mode, DEFAULT_MEMORY_BUDGET), args.repeats)
            gram_s, gram = best(lambda w=w, mode=mode: _gram_scores(w, mode, DEFAULT_MEMORY_BUDGET), args.repeats)
            rows.append({"shape": name, "mode": mode, "tiled_s": tiled_s, "gram_s": gram_s,
                         "picked": "gram" if _gram_is_cheaper(w, mode, DEFAULT_MEMORY_BUDGET) else "tiled",
                         "max_difference": float((tiled - gram).abs().max())})
    print(f"{'shape':<14} {'mode':<4} {'tiled':>8} {'gram':>8} {'picked':>7} {'max |diff|':>11}")
    for r in rows:
        print(f"{r['shape']:<14} {r['mode']:<4} {r['tiled_s']:>7.2f}s {r['gram_s']:>7.2f}s {r['picked']:>7} "
              f"{r['max_difference']:>11.1e}")
    print(f"torch threads {torch.get_num_threads()}")
    emit_json({"torch_threads": torch.get_num_threads(), "rows": rows}, args.json)


if __name__ == "__main__":
    main()
