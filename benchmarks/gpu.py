"""circuitkit on one GPU: CUDA against the CPU, half precision, the cost of real shapes, and the bridge's overhead.

Sections (``--sections``, comma-separated; each runs on its own, a failure is recorded and the next one runs):

- ``agreement``: the bundled model's default scan on the CPU and with ``device="cuda"``, every figure of
  ``to_json()`` compared (count, largest difference, the circuit); then the same model in bfloat16 on CUDA against
  float32 (head scores, the circuit, faithfulness).
- ``shape1b``: a Llama-3.2-1B-shaped model (16 layers x 32 heads, 8 key/value heads, d_model 2048, MLP 8192,
  vocabulary 128,256; random weights, built on the GPU): one forward pass of the scan's batch through plain Hugging
  Face, through circuitkit's adapter with the hooks a scan's first pass installs (the bridge's overhead) and through
  circuitkit's own decoder of the same weights (its overhead, and its logits against Hugging Face's), the
  default scan in float32 and in bfloat16, and a task scan of 16 pairs with node and edge circuits; seconds,
  counted passes and peak GPU memory (``torch.cuda.max_memory_allocated``).
- ``cli``: the whole ``circuitkit scan DIR --device cuda`` command (a new Python process: imports, loading the
  saved 1B-shaped checkpoint into circuitkit's own decoder, the scan, the report) timed three times, in bfloat16 and
  with ``--quick``; beside it the same scan through the TransformerBridge as a new process (what the command ran
  before), and the floor: importing torch and making its first CUDA tensor.
- ``shape8b``: a Llama-3.1-8B-shaped model (32 x 32 heads, 8 key/value heads, d_model 4096, MLP 14,336, vocabulary
  128,256) in bfloat16: a task scan of 16 pairs with node and edge circuits, its seconds and peak memory.
- ``composition70b``: composition scores of a Llama-3-70B shape (80 layers x 64 heads, 8 key/value heads,
  d_model 8192, d_head 128; random weights on the GPU), all pairs, modes Q, K and V, with TF32 products
  (``precision="high"``); the TF32 error measured against float32 on the first 8 layers.

Random weights have no circuits: these figures are costs, not discoveries. Run on the GPU machine
(``../shared/gpu/README.md``): ``bash .whl/run.sh python3 benchmarks/gpu.py --json $OUT/gpu.json``. ``--smoke``
runs every section at toy sizes on whatever device is there (the CPU here), to check the script itself.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests/ helpers (the toy pairs) when run from a checkout

SHAPES = {
    "1b": dict(num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, hidden_size=2048,
               intermediate_size=8192, vocab_size=128256, head_dim=64),
    "8b": dict(num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, hidden_size=4096,
               intermediate_size=14336, vocab_size=128256, head_dim=128),
    "smoke": dict(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, hidden_size=64,
                  intermediate_size=128, vocab_size=300, head_dim=16),
}
COMPOSITION = {"70b": (80, 64, 8, 8192, 128), "smoke": (6, 8, 2, 64, 16)}
"""(layers, query heads, key/value heads, d_model, d_head)."""


def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn) -> tuple[float, Any]:
    sync()
    start = time.perf_counter()
    out = fn()
    sync()
    return time.perf_counter() - start, out


def peak_gib() -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None


def reset_peak() -> None:
    gc.collect()  # a bridge's hooks hold reference cycles: free the last section's model first
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def llama(shape: str, dtype: torch.dtype):
    """A random Llama-shaped Hugging Face model built on the device in ``dtype``, and its TransformerBridge."""
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import LlamaConfig, LlamaForCausalLM

    from circuitkit.models.tokenizer import word_tokenizer

    config = LlamaConfig(**SHAPES[shape], max_position_embeddings=2048, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device()):
            hf = LlamaForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(previous)
    tokenizer = word_tokenizer(config.vocab_size, 1)
    bridge = TransformerBridge.boot_transformers(f"random-llama-{shape}", hf_model=hf, tokenizer=tokenizer,
                                                 dtype=dtype)
    bridge.eval()
    return hf, bridge


def decoder_of(hf, dtype: torch.dtype):
    """circuitkit's :class:`DecoderModel` sharing the Hugging Face model's weights (no copy)."""
    from circuitkit.models.decoder import DecoderModel
    from circuitkit.models.decoder_files import _read_config, expected_shapes

    cfg, refusal = _read_config(Path("random-llama"), hf.config.to_dict())
    assert refusal is None, refusal
    cfg.device, cfg.dtype = next(hf.parameters()).device, dtype
    # the bridge wraps Hugging Face's modules in place: their names gain "_original_component" segments
    state = {key.replace("._original_component", ""): value for key, value in hf.state_dict().items()}
    wanted = set(expected_shapes(cfg))
    return DecoderModel({key: value for key, value in state.items() if key in wanted}, cfg)


def pair_task(n: int, d_vocab: int, length: int = 16, seed: int = 0):
    """Random prompts; the corruption changes token 1; answer: token 1, wrong: its replacement (a task with a
    measurable behaviour on any weights: the clean and corrupted prompts differ)."""
    from circuitkit.tasks import Task

    g = torch.Generator(device="cpu").manual_seed(seed)
    pairs = []
    for _ in range(n):
        clean = torch.randint(3, d_vocab, (length,), generator=g, device="cpu").tolist()
        corrupted = list(clean)
        corrupted[1] = 3 + (clean[1] + 7) % (d_vocab - 3)
        pairs.append((clean, corrupted, [clean[1]], [corrupted[1]]))
    return Task.from_pairs(pairs, name="random-pairs")


# ---------------------------------------------------------------------------------------------------- sections
def compare(a: dict, b: dict) -> dict[str, Any]:
    """How far the figures of document ``a`` are from ``b``'s (the GPU suite's flattening of ``to_json()``)."""
    from tests.test_gpu import figures

    fa, fb = figures(a), figures(b)
    numbers = [(p, fa[p], fb[p]) for p in fb if p in fa and isinstance(fb[p], (int, float))
               and not isinstance(fb[p], bool) and isinstance(fa[p], (int, float)) and "seconds" not in p]
    worst = max(numbers, key=lambda t: abs(t[1] - t[2]), default=(None, 0, 0))
    other = [p for p in fb if p in fa and not isinstance(fb[p], (int, float)) and fa[p] != fb[p]
             and p != "settings.device"]
    return {"figures": len(fb), "numbers": len(numbers), "max_abs_diff": abs(worst[1] - worst[2]),
            "worst": worst[0], "non_numbers_differing": other[:5], "same_keys": sorted(fa) == sorted(fb)}


def section_agreement(args) -> dict[str, Any]:
    import circuitkit as ck
    from circuitkit import zoo

    model = zoo.load()
    cpu_s, cpu = timed(lambda: ck.scan(model))
    gpu_s, gpu = timed(lambda: ck.scan(model, device=device()))
    gpu_s2, gpu = timed(lambda: ck.scan(model, device=device()))  # warm
    out = {"cpu_seconds": cpu_s, "cuda_seconds_first": gpu_s, "cuda_seconds_warm": gpu_s2,
           "model_back_on_cpu": all(p.device.type == "cpu" for p in model.parameters()),
           **compare(gpu.to_json(), cpu.to_json()),
           "circuit_cpu": list(map(list, cpu.verified.heads)) if cpu.verified else None,
           "circuit_cuda": list(map(list, gpu.verified.heads)) if gpu.verified else None,
           "faithfulness_cpu": cpu.verified.faithfulness if cpu.verified else None,
           "faithfulness_cuda": gpu.verified.faithfulness if gpu.verified else None}
    half = ck.scan(zoo.load().to(torch.bfloat16), device=device())
    diffs = [float((half.head_scores[k].float() - v.float()).abs().max()) for k, v in cpu.head_scores.items()]
    out["bf16"] = {"head_scores_max_abs_diff": max(diffs),
                   "attribution_max_abs_diff": float((half.attribution.effect - cpu.attribution.effect).abs().max()),
                   "circuit": list(map(list, half.verified.heads)) if half.verified else None,
                   "faithfulness": half.verified.faithfulness if half.verified else None}
    return out


def section_shape(args, shape: str, *, scan: bool, task_pairs: int, dtype: torch.dtype) -> dict[str, Any]:
    import circuitkit as ck
    from circuitkit.detect import RepeatedTokens
    from circuitkit.detect.session import open_session
    from circuitkit.models.adapters import HOOKS

    reset_peak()
    build_s, (hf, bridge) = timed(lambda: llama(shape, dtype))
    out: dict[str, Any] = {"dtype": str(dtype).removeprefix("torch."), "build_seconds": build_s,
                           "weights_gib": peak_gib()}
    session = open_session(bridge, RepeatedTokens())
    tokens = session.batch.tokens
    with torch.no_grad():
        for _ in range(2):
            hf(tokens)
        plain = min(timed(lambda: hf(tokens))[0] for _ in range(5))
        hooks = [(HOOKS.z(layer), lambda z, hook: None) for layer in range(session.spec.n_layers)]
        for _ in range(2):
            session.adapter.run(tokens, hooks)
        hooked = min(timed(lambda: session.adapter.run(tokens, hooks))[0] for _ in range(5))
    out["forward"] = {"batch": list(tokens.shape), "hf_seconds": plain, "circuitkit_seconds": hooked,
                      "overhead": hooked / plain}
    own = decoder_of(hf, dtype)  # circuitkit's own decoder of the same weights: the scan's model for a directory
    own_session = open_session(own, RepeatedTokens())
    with torch.no_grad():
        for _ in range(2):
            own_session.adapter.run(tokens, hooks)
        own_s = min(timed(lambda: own_session.adapter.run(tokens, hooks))[0] for _ in range(5))
        same = float((own_session.adapter.run(tokens, []) - hf(tokens).logits).abs().max())
    out["forward"].update(decoder_seconds=own_s, decoder_overhead=own_s / plain, decoder_logits_max_diff=same)
    if scan:
        reset_peak()
        seconds, result = timed(lambda: ck.scan(bridge))
        out["scan"] = {"seconds": seconds, "passes": sum(s.passes for s in result.stages),
                       "peak_gib": peak_gib(), "ratio_to_forward": seconds / hooked,
                       "circuit_heads": len(result.verified.heads) if result.verified else None}
    if task_pairs:
        reset_peak()
        task = pair_task(task_pairs, SHAPES[shape]["vocab_size"])
        # what the scan's memory plan sees (its sender budget); the CPU of a smoke run has no such figure
        free_at_start = torch.cuda.mem_get_info()[0] / 2**30 if torch.cuda.is_available() else None
        seconds, result = timed(lambda: ck.scan(bridge, task=task))
        c = result.circuit
        out["task_scan"] = {"pairs": task_pairs, "seconds": seconds, "passes": result.passes,
                            "peak_gib": peak_gib(), "free_gib_at_start": free_at_start,
                            "stages": {s.name: [round(s.passes, 2), round(s.seconds, 2)] for s in result.stages},
                            "node_circuit": len(c.heads) if c else None,
                            "edge_circuit": len(c.edges) if c and c.edges is not None else None,
                            "circuit_error": result.circuit_error}
    reset_peak()
    return out


def section_cli(args) -> dict[str, Any]:
    from transformers import LlamaConfig, LlamaForCausalLM

    directory = Path(tempfile.mkdtemp(prefix="ck-gpu-1b-"))
    shape = "smoke" if args.smoke else "1b"
    config = LlamaConfig(**SHAPES[shape], max_position_embeddings=2048, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    with torch.device(device()):
        LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(directory)
    command = [sys.executable, "-c", "import sys; from circuitkit.cli import main; sys.exit(main())", "scan",
               str(directory), "--device", device(), "--out", str(directory / "report")]
    # the same scan through the TransformerBridge (what the command ran before circuitkit's own decoder), as one
    # new process too: imports, loading, the scan, the files
    bridged = [sys.executable, "-c", "import sys, circuitkit as ck; from circuitkit.models import load_model; "
               "m = load_model(sys.argv[1], device=sys.argv[2]); r = ck.scan(m, name='1b'); r.save(sys.argv[3])",
               str(directory), device(), str(directory / "bridge-report")]
    runs = {}
    for label, code in (("import torch", "import torch"),
                        ("import torch + first CUDA tensor", f"import torch; torch.zeros(1, device={device()!r})")):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        runs[label] = {"seconds": time.perf_counter() - start}
    for label in ("bridge float32 warm",):
        start = time.perf_counter()
        done = subprocess.run(bridged, capture_output=True, text=True, env={**os.environ})
        runs[label] = {"seconds": time.perf_counter() - start, "exit": done.returncode,
                       "tail": (done.stdout + done.stderr).strip().splitlines()[-25:]}
    for label, extra in (("float32 warm", []), ("float32 warm 2", []), ("float32 warm 3", []),
                         ("bfloat16 warm", ["--dtype", "bfloat16"]), ("quick warm", ["--quick"])):
        start = time.perf_counter()
        done = subprocess.run(command + extra, capture_output=True, text=True, env={**os.environ})
        runs[label] = {"seconds": time.perf_counter() - start, "exit": done.returncode,
                       "loaded": [line for line in done.stderr.splitlines() if "loaded" in line][-1:],
                       "tail": (done.stdout + done.stderr).strip().splitlines()[-25:]}
    return {"model": shape, "runs": runs}


def section_composition(args) -> dict[str, Any]:
    from circuitkit.composition import composition_scores
    from circuitkit.weights import HeadWeights

    L, H, G, d, h = COMPOSITION["smoke" if args.smoke else "70b"]
    reset_peak()
    g = torch.Generator(device=device()).manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=device()) / math.sqrt(shape[-2])

    w = HeadWeights(W_Q=randn(L, H, d, h), W_K=randn(L, G, d, h), W_V=randn(L, G, d, h),
                    W_O=randn(L, H, h, d))
    out: dict[str, Any] = {"shape": [L, H, G, d, h], "weights_gib": peak_gib()}
    for mode in ("Q", "K", "V"):
        reset_peak()
        seconds, scores = timed(lambda mode=mode: composition_scores(w, mode, precision="high"))
        out[mode] = {"seconds": seconds, "peak_gib": peak_gib()}
        del scores
    out["all_three_seconds"] = sum(out[m]["seconds"] for m in "QKV")
    few = HeadWeights(W_Q=w.W_Q[:8], W_K=w.W_K[:8], W_V=w.W_V[:8], W_O=w.W_O[:8])
    for mode in ("Q", "K", "V"):
        exact_s, exact = timed(lambda mode=mode: composition_scores(few, mode))
        tf32 = composition_scores(few, mode, precision="high")
        pairs = exact > 0
        rel = ((tf32 - exact).abs()[pairs] / exact[pairs]).max()
        out[f"{mode}_tf32_error_8_layers"] = {"max_abs": float((tf32 - exact).abs().max()),
                                              "max_rel": float(rel), "float32_seconds": exact_s}
    return out


SECTIONS = {
    "agreement": section_agreement,
    "shape1b": lambda a: {
        "float32": section_shape(a, "smoke" if a.smoke else "1b", scan=True, task_pairs=16, dtype=torch.float32),
        "bfloat16": section_shape(a, "smoke" if a.smoke else "1b", scan=True, task_pairs=16, dtype=torch.bfloat16)},
    "cli": section_cli,
    "shape8b": lambda a: section_shape(a, "smoke" if a.smoke else "8b", scan=False, task_pairs=16,
                                       dtype=torch.bfloat16),
    "composition70b": section_composition,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--json", default=None, help="write the results here (rewritten after each section)")
    parser.add_argument("--smoke", action="store_true", help="toy sizes, any device: checks the script")
    args = parser.parse_args()
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
    }
    for name in args.sections.split(","):
        start = time.perf_counter()
        try:
            results[name] = SECTIONS[name](args)
        except Exception as error:  # a section that fails is recorded; the others still run
            results[name] = {"error": f"{type(error).__name__}: {error}"[:2000],
                             "traceback": traceback.format_exc()[-3000:]}
        results[name + "_wall_seconds"] = time.perf_counter() - start
        print(f"== {name} ({results[name + '_wall_seconds']:.1f} s)\n{json.dumps(results[name], indent=1)}",
              flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
