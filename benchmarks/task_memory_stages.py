"""A task scan's peak GPU memory by measurement, against the memory plan's estimate of each (one run per point).

    python benchmarks/task_memory_stages.py --json out.json [--smoke]

For the Llama-3.2-1B shape (float32, bfloat16) and the Llama-3.1-8B shape (bfloat16) of ``benchmarks/gpu.py``
(random weights, its pair task of 16 pairs, the default held-out split): ``ck.scan(model, task=task)`` with the
sender budget the plan chooses on this device and again with the floor (``SENDER_BUDGET``). Each ``TaskRunner``
method that runs passes is wrapped: the allocator's peak is reset before the call and read after it, less what was
allocated before the scan (the weights), so every row says which measurement reached which peak; beside them the
plan's estimate (:func:`circuitkit.tasks.memory.check_task_memory`'s return, captured) with its parts."""
import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu  # noqa: E402

METHODS = ("_reference", "attribute", "patched_metric", "record_all_patched", "edge_metric", "single_edge_metric")


def measure(model, task, floor: bool) -> dict:
    import circuitkit as ck
    import circuitkit.graph.runner as graph
    import circuitkit.tasks.memory as memory
    import circuitkit.tasks.scan as scan_module

    cuda = torch.cuda.is_available()
    allocated = (lambda: torch.cuda.memory_allocated()) if cuda else (lambda: 0)
    peak = (lambda: torch.cuda.max_memory_allocated()) if cuda else (lambda: 0)
    base = allocated()
    peaks: dict[str, float] = {}
    saved = {name: getattr(graph.TaskRunner, name) for name in METHODS}
    estimate: dict = {}
    check = scan_module.check_task_memory
    budget = memory.sender_budget

    def wrap(name):
        inner = saved[name]

        def timed(self, *args, **kwargs):
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            try:
                return inner(self, *args, **kwargs)
            finally:
                peaks[name] = max(peaks.get(name, 0.0), (peak() - base) / 2**30)

        return timed

    def captured(*args, **kwargs):
        found = check(*args, **kwargs)
        estimate.update(total=found.total / 2**30, stage=found.stage, budget=found.budget / 2**30,
                        stages={k: v / 2**30 for k, v in found.stages.items()},
                        resident={k: v / 2**30 for k, v in found.resident.items()})
        return found

    for name in METHODS:
        setattr(graph.TaskRunner, name, wrap(name))
    scan_module.check_task_memory = captured
    if floor:
        memory.sender_budget = lambda device, available: graph.SENDER_BUDGET
    try:
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        result = ck.scan(model, task=task, device=gpu.device())
        # each wrapped call resets the peak: the scan's is the largest of theirs and what ran after the last
        whole = max([(peak() - base) / 2**30, *peaks.values()])
    finally:
        for name, fn in saved.items():
            setattr(graph.TaskRunner, name, fn)
        scan_module.check_task_memory = check
        memory.sender_budget = budget
    return {"measured_gib": whole, "by_method_gib": peaks, "estimate": estimate, "passes": result.passes,
            "seconds": {s.name: round(s.seconds, 2) for s in result.stages},
            "ratio": estimate.get("total", 0) / whole if whole else None}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    points = [("1b", torch.float32), ("1b", torch.bfloat16), ("8b", torch.bfloat16)]
    if args.smoke:
        points = [("smoke", torch.float32)]
    out = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"}
    for shape, dtype in points:
        hf, bridge = gpu.llama(shape, dtype)
        task = gpu.pair_task(16, gpu.SHAPES[shape]["vocab_size"])
        name = f"{shape} {str(dtype).removeprefix('torch.')}"
        out[name] = {"plan's budget": measure(bridge, task, floor=False), "floor": measure(bridge, task, floor=True)}
        print(name, json.dumps(out[name], indent=1), flush=True)
        del hf, bridge
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
