"""Where a scan's seconds go: cProfile of ``circuitkit scan`` in one new process, the first (cold) scan and a second
(warm) one, each written as a stats file and summarised (the functions with the most cumulative and own time).

    python benchmarks/profile_scan.py DIR --device cuda --out prof/      # DIR: a saved Hugging Face model
    python benchmarks/profile_scan.py --make-llama 1b --device cuda --out prof/

``--make-llama SHAPE`` first writes a random Llama-shaped checkpoint (``benchmarks/gpu.py``'s shapes, bfloat16 on
disk) to a temporary directory. On a GPU each CUDA call returns before its work is done, so time waiting for the
GPU lands on the first call that reads a result back (``.item()``, ``.cpu()``, ``float()``): read the cumulative
column with that in mind.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def make_llama(shape: str, device: str) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu import SHAPES

    directory = Path(tempfile.mkdtemp(prefix=f"ck-profile-{shape}-"))
    config = LlamaConfig(**SHAPES[shape], max_position_embeddings=2048, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    with torch.device(device):
        LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(directory)
    return directory


def summary(profile: cProfile.Profile, rows: int) -> str:
    text = io.StringIO()
    stats = pstats.Stats(profile, stream=text)
    stats.sort_stats("cumulative").print_stats(rows)
    stats.sort_stats("tottime").print_stats(rows)
    return text.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?")
    parser.add_argument("--make-llama", default=None, help="write a random checkpoint of this shape first")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default="profile")
    parser.add_argument("--rows", type=int, default=45)
    args = parser.parse_args()
    model = str(make_llama(args.make_llama, args.device)) if args.make_llama else args.model
    if model is None:
        parser.error("give a model directory or --make-llama SHAPE")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seconds = {}
    for run in ("cold", "warm"):  # the first run pays the imports and the device's first use
        started = time.perf_counter()
        profile = cProfile.Profile()
        profile.enable()
        from circuitkit.cli import main as cli

        cli(["scan", model, "--device", args.device, "--out", str(out / run)])
        profile.disable()
        seconds[run] = time.perf_counter() - started
        profile.dump_stats(out / f"{run}.prof")
        (out / f"{run}.txt").write_text(summary(profile, args.rows))
    print(f"cold (imports included) {seconds['cold']:.2f} s, warm {seconds['warm']:.2f} s; stats in {out}/")


if __name__ == "__main__":
    main()
