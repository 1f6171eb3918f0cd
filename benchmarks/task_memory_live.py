"""What a task scan holds on the GPU when its first pass starts: every live CUDA tensor above 16 MiB, grouped by
shape and dtype (one run per point; the weights loaded before the scan listed apart).

    python benchmarks/task_memory_live.py --json out.json [--shape 8b] [--dtype bfloat16]

A diagnosis of the memory plan's resident part (``circuitkit.tasks.memory``): the first clean reference pass of
``ck.scan(model, task=task)`` is interrupted and the tensors reachable then are listed."""
import argparse
import gc
import json
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu  # noqa: E402


class Stop(Exception):
    pass


def live(device: str) -> dict[int, tuple]:
    found = {}
    for o in gc.get_objects():
        try:
            if isinstance(o, torch.Tensor) and o.device.type == torch.device(device).type:
                s = o.untyped_storage()
                found[s.data_ptr()] = (s.nbytes(), tuple(o.shape), str(o.dtype).removeprefix("torch."))
        except Exception:  # noqa: BLE001 - objects that are not plain tensors
            pass
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--shape", default="8b")
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    import circuitkit as ck
    import circuitkit.graph.runner as graph

    hf, bridge = gpu.llama(args.shape, getattr(torch, args.dtype))
    task = gpu.pair_task(16, gpu.SHAPES[args.shape]["vocab_size"])
    gc.collect()
    before = live(gpu.device())
    seen: dict = {}

    def stop(self, *a, **k):
        gc.collect()
        seen.update(live(gpu.device()))
        raise Stop

    graph.TaskRunner._reference = stop
    try:
        ck.scan(bridge, task=task, device=gpu.device())
    except Stop:
        pass
    new = {p: v for p, v in seen.items() if p not in before}
    groups = Counter()
    count = Counter()
    for size, shape, dtype in new.values():
        if size >= 16 * 2**20:
            groups[(shape, dtype)] += size
            count[(shape, dtype)] += 1
    out = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
           "before_gib": sum(v[0] for v in before.values()) / 2**30,
           "new_gib": sum(v[0] for v in new.values()) / 2**30,
           "allocated_gib": torch.cuda.memory_allocated() / 2**30 if torch.cuda.is_available() else None,
           "groups": [{"shape": list(s), "dtype": d, "count": count[(s, d)], "gib": n / 2**30}
                      for (s, d), n in groups.most_common(20)]}
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
