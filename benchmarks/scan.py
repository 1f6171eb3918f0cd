"""End-to-end ``circuitkit.scan`` wall time in units of one forward pass of the scan's own default batch, and how
well attribution predicted exact ablation, on real model shapes with random weights.

Models (the two Hugging Face checkpoints are saved by this script into a temporary directory, random weights):

- ``zoo induction-2l``: the bundled known-answer model (2 x 4 heads);
- (a) GPT-2-small shape: 12 layers x 12 heads, d_model 768, vocab 50257, n_ctx 1024;
- (b) SmolLM-135M shape (Llama, grouped-query): 30 layers x 9 query heads in 3 key/value groups, d_model 576,
  d_head 64, MLP 1536, vocab 49152;
- (c) Gemma-3-270M shape (multi-query, large vocabulary): 18 layers x 4 query heads sharing one key/value head,
  d_model 640, d_head 256, MLP 2048, vocab 262144, sliding windows of 512 keys in five of every six layers. Gemma 3
  puts a norm after each attention output, so the scan runs no edge stage there (heads do not add into the
  residual stream as they are); the unembedding is 63% of a forward pass's weights.

For each: one forward pass over the scan's default batch (``RepeatedTokens()``, no gradients), then
``scan(model)`` (the default: exact ablation of the top ``DEFAULT_ABLATE_TOP`` heads by |attribution| joined
with the called induction / previous-token heads, the circuit search, edge evidence), the CLI's ``--quick`` scan
(``ablate="none", circuit=False``) and ``scan(model, ablate="all")``, side by side in this one process.
Ratio = scan seconds / forward seconds. Targets: the default scan <= 30x, ``--quick`` <= 5x.
The agreement columns are the scan result's own ``agreement`` (Spearman rank correlation of attribution vs exact
over the exactly ablated heads, and the largest miss |estimate - exact|).

Stage breakdown: for the ``ablate="top"`` scan, each stage (``scores, ablate, circuit, weights, edges``) in forward
passes three ways: *counted* (the scan's own count, as its progress bar shows it: every run of the batch one pass,
resumed or not, a forward + backward three), *work* (the same with a resumed pass as the fraction of layers it runs,
read off the adapter while the scan runs: :func:`work_meter`) and *timed* (the stage's wall seconds / one forward
pass). The circuit found by faithfulness (its size, share of the
heads, faithfulness, necessity) is listed too. On random weights there is no induction circuit: the circuit is the
set of heads that carries the loss of a random model, and the figures measure cost, not discovery.

Real models: ``--model-dir DIR`` (repeatable) scans a local Hugging Face directory too, e.g. the pretrained
Qwen2.5-Coder-0.5B that ``shared/models/qwen25_coder_05b.py DIR`` writes (``--models ""`` to skip the random shapes).
``--beside-busy N`` runs the whole benchmark beside N other processes that keep the cores busy (each a torch matmul
loop on every core), to measure how the scan degrades on a shared machine relative to a plain forward pass measured
beside the same load.

Run: ``python benchmarks/scan.py [--json out.json] [--quick] [--no-all] [--no-quick-scan] [--threads N]
[--models a,b,c] [--model-dir DIR] [--beside-busy N] [--checkpoints DIR]`` (``--checkpoints`` keeps the saved random
checkpoints there between runs). Prints a table, then the same numbers as JSON. Forward timings are medians of
``--repeats`` runs (half before, half after the scans, so load from other processes falls on both); each scan
runs once after a warm-up scan of the zoo model.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from _common import emit_json  # benchmarks/ is on sys.path when a script here runs

TARGET_RATIO = 30.0
QUICK_TARGET_RATIO = 5.0


def save_gpt2_small_shape(path: Path) -> str:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=12, n_head=12, n_embd=768, vocab_size=50257, n_positions=1024)
    GPT2LMHeadModel(config).save_pretrained(path)
    return "(a) gpt2-small shape"


def save_smollm_shape(path: Path) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576, head_dim=64,
        intermediate_size=1536, vocab_size=49152, max_position_embeddings=2048, tie_word_embeddings=True,
        bos_token_id=0, eos_token_id=0, pad_token_id=None,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    return "(b) smollm-135m shape (GQA)"


def save_gemma3_270m_shape(path: Path) -> str:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    config = Gemma3TextConfig(
        num_hidden_layers=18, num_attention_heads=4, num_key_value_heads=1, hidden_size=640, head_dim=256,
        intermediate_size=2048, vocab_size=262144, max_position_embeddings=32768, sliding_window=512,
        query_pre_attn_scalar=256, tie_word_embeddings=True, bos_token_id=2, eos_token_id=1, pad_token_id=0,
    )
    Gemma3ForCausalLM(config).save_pretrained(path)
    return "(c) gemma-3-270m shape (MQA)"


SHAPES = {"a": save_gpt2_small_shape, "b": save_smollm_shape, "c": save_gemma3_270m_shape}
LABELS = {"a": "(a) gpt2-small shape", "b": "(b) smollm-135m shape (GQA)", "c": "(c) gemma-3-270m shape (MQA)"}


def forward_seconds(model: Any, repeats: int) -> list[float]:
    from circuitkit.detect.tokens import as_batch
    from circuitkit.models.adapters import adapt

    adapter = adapt(model)
    tokens = as_batch(None, adapter).tokens
    times = []
    with torch.no_grad():
        adapter.run(tokens)  # warm-up
        for _ in range(repeats):
            start = time.perf_counter()
            adapter.run(tokens)
            times.append(time.perf_counter() - start)
    return times


def scan_seconds(model: Any, ablate: str, circuit: bool = True) -> tuple[float, Any]:
    import circuitkit

    start = time.perf_counter()
    result = circuitkit.scan(model, ablate=ablate, circuit=circuit)
    seconds = time.perf_counter() - start
    print(f"[scan ablate={ablate!r} circuit={circuit}: {seconds:.1f} s]", file=sys.stderr, flush=True)
    return seconds, result


def agreement_row(result: Any) -> dict[str, Any]:
    a = result.agreement
    if a is None:
        return {"n_exact": 0, "spearman": None, "largest_miss": None}
    miss = None
    if a.largest_miss is not None:
        (layer, head), exact, estimate = a.largest_miss
        miss = {"head": f"{layer}.{head}", "exact": exact, "estimate": estimate, "abs": abs(estimate - exact)}
    return {"n_exact": a.n_exact, "spearman": a.spearman, "largest_miss": miss}


BUSY_LOOP = ("import torch\n"
             "a = torch.randn(384, 384)\n"
             "while True:\n"
             "    a = torch.tanh(a @ a)\n")
"""What each ``--beside-busy`` process runs: matrix products on torch's default threads (every core), forever."""


@contextlib.contextmanager
def beside_busy(n: int):
    """``n`` busy processes for the duration of the block (killed at its end)."""
    import subprocess

    procs = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(n)]
    try:
        if procs:
            time.sleep(3.0)  # let them start spinning
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def work_meter(batch_rows: int):
    """Per stage, the model's work in passes of the batch, resumed passes as the fraction of layers they run:
    every ``run`` of ``r`` rows counts ``r / batch_rows``, a ``run_from(layer)`` ``(L - layer) / L`` of that,
    and a pass run with gradients enabled three times (its backward counts two, as the progress bar counts it).
    Read off the adapter's own entry points while the scan runs (the bar counts a resumed pass as one)."""
    import circuitkit.pipeline as pipeline
    from circuitkit.models.adapters import BridgeAdapter

    work: dict[str, float] = {}
    stage = {"name": "setup"}
    run, run_from, start = BridgeAdapter.run, BridgeAdapter.run_from, pipeline.Progress.start

    def add(rows: int, fraction: float) -> None:
        factor = 3.0 if torch.is_grad_enabled() else 1.0
        work[stage["name"]] = work.get(stage["name"], 0.0) + factor * fraction * rows / batch_rows

    def metered_run(self, tokens, *args, **kwargs):
        add(tokens.shape[0], 1.0)
        return run(self, tokens, *args, **kwargs)

    def metered_run_from(self, resid, start_at_layer, *args, **kwargs):
        L = self.spec.n_layers
        add(resid.shape[0], (L - start_at_layer) / L)
        return run_from(self, resid, start_at_layer, *args, **kwargs)

    def metered_start(self, name):
        stage["name"] = name
        return start(self, name)

    BridgeAdapter.run, BridgeAdapter.run_from, pipeline.Progress.start = metered_run, metered_run_from, metered_start
    try:
        yield work
    finally:
        BridgeAdapter.run, BridgeAdapter.run_from, pipeline.Progress.start = run, run_from, start


def bench(label: str, model: Any, *, repeats: int, run_all: bool, quick_scan: bool = True,
          save_dir: str | None = None) -> dict[str, Any]:
    from circuitkit.detect.tokens import as_batch
    from circuitkit.models.adapters import adapt

    adapter = adapt(model)
    spec = adapter.spec
    batch = as_batch(None, adapter)
    before = forward_seconds(model, max(1, repeats // 2))
    with work_meter(batch.tokens.shape[0]) as work:
        top_s, top = scan_seconds(model, "top")
    quick_s, quick = scan_seconds(model, "none", circuit=False) if quick_scan else (None, None)
    all_s, every = scan_seconds(model, "all") if run_all else (None, None)
    after = forward_seconds(model, max(1, repeats - repeats // 2))
    if save_dir is not None:
        top.save(Path(save_dir) / label.split()[0].strip("()"))
    forward = statistics.median(before + after)
    row = {
        "model": label,
        "shape": f"{spec.n_layers}L x {spec.n_heads}H ({spec.n_kv_heads} kv), d_model {spec.d_model}, "
        f"d_head {spec.d_head}, vocab {spec.d_vocab}",
        "batch": list(batch.tokens.shape),
        "forward_s": forward,
        "scan_top_s": top_s,
        "ratio_top": top_s / forward,
        "scan_quick_s": quick_s,
        "ratio_quick": None if quick is None else quick_s / forward,
        "quick_passes_counted": None if quick is None else sum(st.passes for st in quick.stages),
        "quick_meets_target": None if quick is None else quick_s / forward <= QUICK_TARGET_RATIO,
        "passes_counted": sum(st.passes for st in top.stages),
        "exact_heads_top": int(top.ablation.exact.sum()) if top.ablation is not None else 0,
        "agreement_top": agreement_row(top),
        "meets_target": top_s / forward <= TARGET_RATIO,
        "induction_heads": [f"{a}.{b}" for a, b in top.induction_heads],
        "previous_token_heads": [f"{a}.{b}" for a, b in top.previous_token_heads],
    }
    row["stages"] = [{"stage": st.name, "passes_counted": st.passes, "seconds": st.seconds,
                      "passes_timed": st.seconds / forward, "passes_work": work.get(st.name, 0.0)}
                     for st in top.stages]
    row["passes_work"] = sum(st["passes_work"] for st in row["stages"])
    row["circuit"] = circuit_row(top, spec.n_layers * spec.n_heads)
    if every is not None:
        row.update(scan_all_s=all_s, ratio_all=all_s / forward, agreement_all=agreement_row(every))
    return row


def circuit_row(result: Any, n_total: int) -> dict[str, Any]:
    v = result.verified
    if v is None:
        return {"n_heads": None, "error": result.verified_error}
    return {"n_heads": len(v.heads), "share": len(v.heads) / n_total, "faithfulness": v.faithfulness,
            "necessity": v.necessity, "target": v.target, "passes": v.passes,
            "curve": [(p.size, p.faithfulness) for p in v.curve],
            "edges_patched": 0 if v.edges is None else len(v.edges.edges)}


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=6, help="forward passes timed per model")
    parser.add_argument("--json", type=str, default=None, help="also write the JSON here")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    parser.add_argument("--quick", action="store_true", help="the zoo model only")
    parser.add_argument("--no-all", action="store_true", help="skip ablate='all' (the slow reference)")
    parser.add_argument("--models", type=str, default="zoo,a,b,c",
                        help="comma-separated: zoo and the shapes a, b, c (default: all)")
    parser.add_argument("--model-dir", action="append", default=[],
                        help="a local Hugging Face model directory to scan too (repeatable)")
    parser.add_argument("--beside-busy", type=int, default=0,
                        help="run beside this many busy processes (each a matmul loop on every core)")
    parser.add_argument("--no-quick-scan", action="store_true", help="skip the --quick scan")
    parser.add_argument("--save-dir", type=str, default=None,
                        help="save each model's default scan (report.html, scores.json) under DIR/<model>")
    parser.add_argument("--checkpoints", type=str, default=None,
                        help="keep the saved random checkpoints in this directory (default: a temporary one)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from circuitkit import zoo
    from circuitkit.models import load_model

    chosen = [name.strip() for name in args.models.split(",") if name.strip()]
    unknown = [name for name in chosen if name != "zoo" and name not in SHAPES]
    if unknown:
        parser.error(f"unknown models {unknown}; expected zoo, a, b, c")
    scan_seconds(zoo.load(), "top")  # warm-up: imports, first-call costs
    rows = []
    busy = contextlib.ExitStack()
    busy.enter_context(beside_busy(args.beside_busy))
    quick_scan = not args.no_quick_scan
    if "zoo" in chosen:
        rows.append(bench("zoo induction-2l", zoo.load(), repeats=args.repeats, run_all=not args.no_all,
                          quick_scan=quick_scan))
    for directory in args.model_dir:
        model = load_model(directory)
        rows.append(bench(Path(directory).name, model, repeats=args.repeats, run_all=not args.no_all,
                          quick_scan=quick_scan, save_dir=args.save_dir))
        del model
    if not args.quick:
        with contextlib.ExitStack() as stack:
            root = args.checkpoints or stack.enter_context(tempfile.TemporaryDirectory(prefix="circuitkit-bench-"))
            for key in [name for name in chosen if name in SHAPES]:
                path = Path(root) / SHAPES[key].__name__
                label = LABELS[key] if (path / "config.json").exists() else SHAPES[key](path)
                model = load_model(path)
                rows.append(bench(label, model, repeats=args.repeats, run_all=not args.no_all,
                                  quick_scan=quick_scan))
                del model
    busy.close()

    header = (f"{'model':<30} {'batch':>9} {'forward':>9} {'scan top':>9} {'ratio':>7} {'quick':>7} {'exact':>5} "
              f"{'scan all':>9} {'ratio':>7} {'rho top':>7} {'rho all':>7}  largest miss (all)")
    print(header)
    print("-" * len(header))
    for r in rows:
        agreement = r.get("agreement_all") or r["agreement_top"]
        miss = agreement["largest_miss"]
        miss_text = "-" if miss is None else f"{miss['head']}: exact {miss['exact']:.3f}, est {miss['estimate']:.3f}"
        print(
            f"{r['model']:<30} {str(tuple(r['batch'])):>9} {r['forward_s'] * 1e3:>7.0f}ms "
            f"{r['scan_top_s']:>8.1f}s {r['ratio_top']:>6.1f}x {fmt(r['ratio_quick'], '>6.1f')}x "
            f"{r['exact_heads_top']:>5} "
            f"{fmt(r.get('scan_all_s'), '>8.1f')}s {fmt(r.get('ratio_all'), '>6.1f')}x "
            f"{fmt(r['agreement_top']['spearman'], '>7.3f')} "
            f"{fmt((r.get('agreement_all') or {}).get('spearman'), '>7.3f')}  {miss_text}"
        )
    print()
    print(f"{'model':<30} {'stage':<8} {'counted':>8} {'work':>8} {'timed':>8} {'seconds':>8}")
    for r in rows:
        for st in r["stages"]:
            print(f"{r['model']:<30} {st['stage']:<8} {st['passes_counted']:>7.1f}x {st['passes_work']:>7.1f}x "
                  f"{st['passes_timed']:>7.1f}x {st['seconds']:>7.2f}s")
        c = r["circuit"]
        text = (f"circuit {c['n_heads']} heads ({100 * c['share']:.0f}%), faithfulness {c['faithfulness']:.3f}, "
                f"necessity {c['necessity']:+.2f} nats, {c['passes']} passes, {c['edges_patched']} edges patched"
                if c["n_heads"] is not None else f"no circuit: {c['error']}")
        print(f"{r['model']:<30} {text}")
    for r in rows:
        print(f"{r['model']:<30} counted passes: default {r['passes_counted']:.1f} (work {r['passes_work']:.1f}), "
              f"quick {fmt(r['quick_passes_counted'], '.1f')}")
    print(f"targets: scan() <= {TARGET_RATIO:.0f}x one forward pass of the scan's batch, --quick "
          f"(ablate='none', circuit=False) <= {QUICK_TARGET_RATIO:.0f}x; "
          f"torch threads {torch.get_num_threads()}")
    out = {"target_ratio": TARGET_RATIO, "quick_target_ratio": QUICK_TARGET_RATIO,
           "torch_threads": torch.get_num_threads(), "beside_busy": args.beside_busy,
           "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(unset: active spinning)"), "rows": rows}
    emit_json(out, args.json)


if __name__ == "__main__":
    main()
