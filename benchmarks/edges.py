"""Cost of edge attribution for all ``[L, H, L, H, 3]`` edges and of exact path patching of the top 32 edges,
each relative to one plain forward pass of the same batch, on a GPT-2-small-shaped random model (12 layers x
12 heads, d_model 768, vocabulary 50257, LayerNorm and MLPs; TransformerLens native boot, no download) and on
the bundled zoo model.

Targets: edge attribution <= 5x one forward pass; path patching of the top 32 edges <= 40x.
Memory (GPT-2-small shape, unless ``--quick``): the peak resident memory above the built model and batch of one
plain forward pass, of one forward + backward pass of the same loss (gradients of the activations only, as
attribution takes them), and of edge attribution, each in a child process of its own (``_common.run_child``).

With ``--medium``, also a GPT-2-medium shape (24 layers x 16 heads, d_model 1024): the contraction over all
sender x receiver pairs grows like ``L^2``, so its share of the cost grows with depth.

Run: ``python benchmarks/edges.py [--quick] [--medium] [--threads N] [--json out.json]``. Prints a table, then the same
numbers as JSON. Timings are medians of ``--repeats`` runs after a warm-up, interleaved in this one process.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from _common import (  # benchmarks/ is on sys.path when a script here runs
    CHILD_FLAG,
    child_main,
    current_rss_bytes,
    format_bytes,
    interleaved_medians,
    memory_report,
    reset_peak_rss,
    run_child,
)

from circuitkit.circuits import edge_attribution, path_patching
from circuitkit.circuits.metrics import repeated_loss
from circuitkit.detect import RepeatedTokens
from circuitkit.detect.attribution import frozen_parameters
from circuitkit.models.adapters import HOOKS, adapt

ATTRIBUTION_TARGET = 5.0
PATCHING_TARGET = 40.0
N_PATCH = 32


def gpt2_shape(n_layers: int = 12, n_heads: int = 12, d_model: int = 768):
    """A random GPT-2-shaped TransformerBridge (small by default; ``gpt2_shape(24, 16, 1024)`` is medium)."""
    from circuitkit.models.bridge import native_bridge

    return native_bridge(
        n_layers=n_layers, n_heads=n_heads, d_model=d_model, d_head=64, d_vocab=50257, n_ctx=1024, attn_only=False,
        normalization_type="LN", seed=0,
    )


def zoo_model():
    from circuitkit import zoo

    return zoo.load()


def bench(label: str, model, *, block_len: int, batch: int, repeats: int) -> dict:
    adapter = adapt(model)
    tokens = RepeatedTokens(block_len=block_len, batch=batch, bos=False).build(adapter)
    top = [(e.src, e.dst, e.channel) for e in edge_attribution(adapter, metric="loss", tokens=tokens).top(N_PATCH)]

    def forward():
        with torch.no_grad():
            adapter.run(tokens.tokens)

    def attribution():
        edge_attribution(adapter, metric="loss", tokens=tokens)

    def patching():
        path_patching(adapter, top, metric="loss", tokens=tokens)

    t_forward, t_attr = interleaved_medians([forward, attribution], repeats)
    (t_patch,) = interleaved_medians([patching], max(1, repeats // 2))
    spec = adapter.spec
    return {
        "model": label,
        "shape": f"{spec.n_layers}x{spec.n_heads} d{spec.d_model} V{spec.d_vocab}",
        "batch": f"{batch}x{tokens.tokens.shape[1]}",
        "edges": spec.n_heads**2 * spec.n_layers * (spec.n_layers - 1) // 2 * 3,
        "forward_s": round(t_forward, 4),
        "attribution_s": round(t_attr, 4),
        "attribution_x": round(t_attr / t_forward, 2),
        "patch_top32_s": round(t_patch, 3),
        "patch_top32_x": round(t_patch / t_forward, 2),
        "patched_edges": len(top),
    }


MEMORY_CALLS = ("forward", "forward+backward", "edge attribution")


def child_memory(call: str, threads: int | None) -> dict:
    """Peak memory above the built model and batch of one ``call`` (one of :data:`MEMORY_CALLS`)."""
    if threads:
        torch.set_num_threads(threads)
    adapter = adapt(gpt2_shape())
    tokens = RepeatedTokens(block_len=32, batch=8, bos=False).build(adapter)
    reset_peak_rss()
    before = current_rss_bytes()
    if call == "forward":
        with torch.no_grad():
            adapter.run(tokens.tokens)
    elif call == "forward+backward":
        with frozen_parameters(adapter.model), torch.enable_grad():
            embedded = []

            def leaf(x, hook):
                embedded.append(x.detach().requires_grad_(True))
                return embedded[0]

            loss = repeated_loss(adapter.run(tokens.tokens, [(HOOKS.resid_pre(0), leaf)]), tokens)
            torch.autograd.grad(loss, embedded)
    else:
        edge_attribution(adapter, metric="loss", tokens=tokens)
    return memory_report(before, "cpu")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the bundled zoo model")
    parser.add_argument("--medium", action="store_true",
                        help="also a GPT-2-medium shape (24 x 16 heads): how the O(L^2) contraction scales")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = [bench("zoo induction-2l", zoo_model(), block_len=20, batch=16, repeats=args.repeats)]
    if not args.quick:
        rows.append(bench("gpt2-small shape", gpt2_shape(), block_len=32, batch=8, repeats=args.repeats))
    if args.medium:
        rows.append(bench("gpt2-medium shape", gpt2_shape(24, 16, 1024), block_len=32, batch=8,
                          repeats=args.repeats))
    columns = ["model", "shape", "batch", "edges", "forward_s", "attribution_s", "attribution_x",
               "patch_top32_s", "patch_top32_x"]
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in columns]
    print(f"edge attribution (target <= {ATTRIBUTION_TARGET}x forward) and exact path patching of the top "
          f"{N_PATCH} edges (target <= {PATCHING_TARGET}x forward), metric: repeated-copies loss")
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(str(r[c]).ljust(w) for c, w in zip(columns, widths, strict=True)))
    memory = {}
    if not args.quick:
        memory = {call: run_child(__file__, "memory", call=call, threads=args.threads) for call in MEMORY_CALLS}
        print("peak memory above the built GPT-2-shape model and batch (child processes): " + ", ".join(
            f"{call} {format_bytes(m.get('peak_above_inputs_bytes'))}" for call, m in memory.items()))
    payload = {"benchmark": "edges", "threads": torch.get_num_threads(), "rows": rows, "memory": memory,
               "targets": {"attribution_x": ATTRIBUTION_TARGET, "patch_top32_x": PATCHING_TARGET}}
    print(json.dumps(payload, sort_keys=True))
    if args.json:
        args.json.write_text(json.dumps(payload, indent=1, sort_keys=True))


if __name__ == "__main__":
    if CHILD_FLAG in sys.argv:
        child_main({"memory": child_memory})
    else:
        main()
