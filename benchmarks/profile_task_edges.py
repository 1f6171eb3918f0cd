"""Where a task scan's edge stage spends its time (cProfile, one warm run), on whatever device is there.

    python benchmarks/profile_task_edges.py [--shape 1b|smoke] [--out FILE]

The Llama-3.2-1B shape of ``benchmarks/gpu.py`` (random weights), its pair task of 16 pairs; the scan runs once to
warm up, then once under cProfile; printed: the stages' passes and seconds, and the 30 functions with the most
time of their own."""
import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="1b")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    import circuitkit as ck

    hf, bridge = gpu.llama(args.shape, torch.float32)
    model = gpu.decoder_of(hf, torch.float32)
    task = gpu.pair_task(16, gpu.SHAPES[args.shape]["vocab_size"])
    ck.scan(model, task=task, device=gpu.device())
    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.enable()
    result = ck.scan(model, task=task, device=gpu.device())
    gpu.sync()
    profile.disable()
    text = io.StringIO()
    print(f"total {time.perf_counter() - start:.2f} s, stages "
          f"{ {s.name: (round(s.passes, 2), round(s.seconds, 2)) for s in result.stages} }", file=text)
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(30)
    print(text.getvalue())
    if args.out:
        Path(args.out).write_text(text.getvalue())


if __name__ == "__main__":
    main()
