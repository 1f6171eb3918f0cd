"""Loading a real GGUF file: ``python benchmarks/gguf_load.py MODEL.gguf [HF_DIR]``.

Times ``circuitkit.load_model`` on the GGUF file (header check, transformers' dequantization to float32, the
TransformerLens bridge) and, with ``HF_DIR`` (the same model saved as safetensors, e.g. by
``../shared/models/qwen25_coder_05b.py``), on that directory; each in its own child process, which reports its wall
seconds and peak resident memory. Then both models' logits on the same repeated random tokens are compared (they
hold the same float32 weights when the directory was written from this GGUF). Prints a table, then JSON.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time

CHILD = "--child"


def child(path: str, logits_file: str) -> dict:
    import torch

    import circuitkit as ck

    started = time.perf_counter()
    model = ck.load_model(path)
    seconds = time.perf_counter() - started
    tokens = ck.RepeatedTokens(block_len=20, batch=2, seed=0).build(model).tokens
    with torch.no_grad():
        logits = model(tokens)
    torch.save(logits, logits_file)
    return {"path": path, "load_s": round(seconds, 2), "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            // 1024, "layers": model.cfg.n_layers, "heads": model.cfg.n_heads}


def main() -> None:
    if sys.argv[1] == CHILD:
        print("RESULT " + json.dumps(child(sys.argv[2], sys.argv[3])))
        return
    import tempfile
    from pathlib import Path

    scratch = Path(tempfile.mkdtemp(prefix="ck-gguf-bench-"))
    rows = []
    for index, path in enumerate(sys.argv[1:3]):
        logits_file = str(scratch / f"logits{index}.pt")
        done = subprocess.run([sys.executable, __file__, CHILD, path, logits_file], capture_output=True, text=True,
                              check=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1].removeprefix("RESULT ")))
        rows[-1]["logits_file"] = logits_file
    for row in rows:
        print(f"{row['path']:<50} load {row['load_s']:7.2f} s  peak {row['peak_mib']:6d} MiB  "
              f"{row['layers']} x {row['heads']} heads")
    out = {"loads": rows}
    if len(rows) == 2:
        import torch

        a, b = (torch.load(r["logits_file"], weights_only=True) for r in rows)
        out["max_abs_logit_diff"] = float((a - b).abs().max())
        print(f"max |logits(GGUF) - logits(safetensors)| = {out['max_abs_logit_diff']:.3g}")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
