"""The task scan's memory plan (``circuitkit.tasks.memory``) against measured peaks.

    python benchmarks/task_memory.py [--json out.json]

CPU: for a few small random shapes, a task scan (node and edge circuits, default EAP-IG steps) in a child process
of its own; reported: the rise of the peak resident set during the scan (``benchmarks/_common.py``: the child's
``VmHWM`` reset just before the call, after a warm-up scan of 2 pairs on the same model has done its one-time
imports), the peak of live tensor bytes the PyTorch profiler saw (the CPU's counterpart of
``torch.cuda.max_memory_allocated``), and the estimate, with estimate / measured.

GPU: the figures ``benchmarks/gpu.py`` measured (``--gpu-results``, default ``benchmarks/results/gpu-h200.json``:
``max_memory_allocated`` during the task scan minus the weights) against the estimate for the same shapes, built
here on the ``meta`` device (no memory, no GPU needed) with the sender budget the scan had there
(:func:`circuitkit.graph.runner.sender_budget` of the memory free as it started: recorded by ``gpu.py`` as
``free_gib_at_start``; for a file from before that, the device's capacity in :data:`DEVICE_GIB` less the
weights) and, with ``--gpu-split``, the default held-out split the scan ran with since ``gpu.py`` scans through
``ck.scan`` (the older files' runs had none).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from _common import child_main, emit_json, memory_now, memory_report, print_table, run_child  # noqa: E402

CPU_POINTS = {
    # name: (builder, shape, dtype, pairs, tokens)
    "native-mha-4x8": ("native", dict(n_layers=4, n_heads=8, d_model=128, d_head=16, d_vocab=5000, n_ctx=64,
                                      attn_only=False), "float32", 32, 16),
    "llama-gqa-4x8-f32": ("llama", dict(num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                                        hidden_size=512, intermediate_size=2048, vocab_size=16000, head_dim=64),
                          "float32", 16, 16),
    "llama-gqa-4x8-bf16": ("llama", dict(num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                                         hidden_size=512, intermediate_size=2048, vocab_size=16000, head_dim=64),
                           "bfloat16", 16, 16),
}
DEVICE_GIB = {"NVIDIA H200": 139.8, "NVIDIA H100 80GB HBM3": 79.2}
"""Memory of the devices the GPU results name, GiB (for files that did not record the memory free)."""
GPU_POINTS = {  # name: (gpu.py shape, dtype, section path in gpu-h200.json)
    "Llama-3.2-1B shape, float32": ("1b", "float32", ("shape1b", "float32")),
    "Llama-3.2-1B shape, bfloat16": ("1b", "bfloat16", ("shape1b", "bfloat16")),
    "Llama-3.1-8B shape, bfloat16": ("8b", "bfloat16", ("shape8b",)),
}


def llama(shape: dict, dtype: torch.dtype, device: str = "cpu"):
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import LlamaConfig, LlamaForCausalLM

    from circuitkit.models.tokenizer import word_tokenizer

    config = LlamaConfig(**shape, max_position_embeddings=2048, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            hf = LlamaForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(previous)
    return TransformerBridge.boot_transformers("random-llama", hf_model=hf,
                                               tokenizer=word_tokenizer(config.vocab_size, 1), dtype=dtype).eval()


def build(name: str):
    kind, shape, dtype, pairs, tokens = CPU_POINTS[name]
    if kind == "native":
        from tests.conftest import boot_bridge

        model, d_vocab = boot_bridge(**shape), shape["d_vocab"]
    else:
        model, d_vocab = llama(shape, getattr(torch, dtype)), shape["vocab_size"]
    from gpu import pair_task

    return model, pair_task(pairs, d_vocab, tokens), pair_task(2, d_vocab, tokens, seed=1)


def estimate_of(model, task, *, split: bool = True, budget: int | None = None) -> Any:
    """The estimate for ``ck.scan(model, task=task)``: its default held-out split (``split``), logits where the
    model computes them, ``budget`` the sender budget (None: the CPU's)."""
    from circuitkit.models.adapters import adapt
    from circuitkit.tasks.memory import estimate_task_memory, logit_positions
    from circuitkit.tasks.scan import DEFAULT_HOLDOUT, split_pairs

    adapter = adapt(model, place_model=False)
    batch = task.tokenize(adapter)
    # on the meta device the ids have no values: gpu.pair_task's prompts all end at the last position
    last = torch.full((batch.n_pairs,), batch.pos - 1) if batch.last.is_meta else batch.last
    held = split_pairs(batch.n_pairs, DEFAULT_HOLDOUT, 0)[1] if split else None
    return estimate_task_memory(adapter, batch.n_pairs, batch.pos, steps=3, mlps=not adapter.attn_only, edges=True,
                                evaluation_pairs=0 if held is None else len(held),
                                logit_positions=logit_positions(adapter, last, batch.pos),
                                **({} if budget is None else {"budget": budget}))


def child_rss(name: str) -> dict[str, Any]:
    import circuitkit as ck

    model, task, warm = build(name)
    ck.scan(model, task=warm, n_resamples=10)  # one-time imports and thread pools, not the scan's memory
    gc.collect()
    before = memory_now("cpu")
    result = ck.scan(model, task=task)
    report = memory_report(before, "cpu")
    est = estimate_of(model, task)
    return {"rss_rise": report["peak_above_inputs_bytes"], "memory_kind": report["memory_kind"],
            "estimate": est.total, "stage": est.stage, "passes": result.passes}


def child_tensors(name: str) -> dict[str, Any]:
    """The peak of live tensor bytes during the scan, from the profiler's allocation events."""
    from torch.profiler import ProfilerActivity, profile

    import circuitkit as ck

    model, task, warm = build(name)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        ck.scan(model, task=task)
    allocations, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if type(node.extra_fields).__name__ == "_ExtraFields_Allocation":
            allocations.append((node.start_time_ns, node.extra_fields.alloc_size))
        stack.extend(node.children)
    live = peak = 0
    for _, size in sorted(allocations):
        live += size
        peak = max(peak, live)
    return {"tensor_peak": peak}


def gpu_rows(path: Path, split: bool = False) -> list[dict[str, Any]]:
    import gpu

    from circuitkit.graph.runner import sender_budget

    document = json.loads(path.read_text())
    rows = []
    for name, (shape, dtype, keys) in GPU_POINTS.items():
        section = document
        for key in keys:
            section = section[key]
        model = llama(gpu.SHAPES[shape], getattr(torch, dtype), device="meta")  # shapes only: nothing allocated
        task = gpu.pair_task(section["task_scan"]["pairs"], gpu.SHAPES[shape]["vocab_size"])
        free = section["task_scan"].get("free_gib_at_start")
        if free is None and document["device"] in DEVICE_GIB:
            free = DEVICE_GIB[document["device"]] - section["weights_gib"]
        budget = None if free is None else sender_budget("cuda", int(free * 2**30))
        est = estimate_of(model, task, split=split, budget=budget)
        measured = (section["task_scan"]["peak_gib"] - section["weights_gib"]) * 2**30
        rows.append({"point": name, "measured": measured, "estimate": est.total, "stage": est.stage,
                     "ratio": est.total / measured, "kind": f"{document['device']}: max_memory_allocated - weights"})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None)
    parser.add_argument("--gpu-results", default=str(HERE / "results" / "gpu-h200.json"))
    parser.add_argument("--gpu-split", action="store_true",
                        help="the GPU runs had the default held-out split (gpu.py's task scans since ck.scan took one)")
    parser.add_argument("--gpu-only", action="store_true", help="the GPU rows alone (no CPU child runs)")
    args = parser.parse_args()
    rows = gpu_rows(Path(args.gpu_results), args.gpu_split) if Path(args.gpu_results).exists() else []
    for name in () if args.gpu_only else CPU_POINTS:
        rss = run_child(__file__, "child_rss", timeout=1800, name=name)
        tensors = run_child(__file__, "child_tensors", timeout=1800, name=name)
        if "error" in rss or "error" in tensors:
            rows.append({"point": name, "error": rss.get("error") or tensors.get("error")})
            continue
        for measured, kind in ((rss["rss_rise"], "CPU: peak RSS rise"), (tensors["tensor_peak"], "CPU: live tensors")):
            rows.append({"point": name, "measured": measured, "estimate": rss["estimate"], "stage": rss["stage"],
                         "ratio": rss["estimate"] / measured, "kind": kind})
    for row in rows:
        for key in ("measured", "estimate"):
            if key in row:
                row[key + "_mib"] = round(row[key] / 2**20, 1)
        if "ratio" in row:
            row["ratio"] = round(row["ratio"], 2)
    print_table(rows, [("point", "point"), ("kind", "measured as"), ("measured_mib", "measured MiB"),
                       ("estimate_mib", "estimate MiB"), ("ratio", "estimate / measured"), ("stage", "peak stage")])
    emit_json({"rows": rows}, args.json)


if __name__ == "__main__":
    if "--child" in sys.argv:
        child_main({"child_rss": child_rss, "child_tensors": child_tensors})
    else:
        main()
