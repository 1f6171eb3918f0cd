"""Shared benchmark helpers: timing, peak memory of a child process, and table + JSON output.

Every benchmark measures each contender in its own child process (``run_child``), so that one contender's
peak memory cannot hide inside another's: the child reports its own ``ru_maxrss`` (the peak resident set
of that process alone) and its resident set just before the measured call (weights built, nothing run),
so ``peak - before`` is the working memory of the call itself. The peak counter is reset (Linux
``/proc/self/clear_refs``) just before the call, so building the inputs does not count. On CUDA the child reports
``torch.cuda.max_memory_allocated`` instead.

A benchmark script calls :func:`child_main` when started with ``--child <json>``; the JSON names a
function of that script and its keyword arguments, and the function's returned dict is printed as the
child's last output line.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

CHILD_FLAG = "--child"
_RESULT_PREFIX = "BENCHMARK-RESULT "


# ---------------------------------------------------------------------------------------------- memory
def current_rss_bytes() -> int:
    """This process's resident set size now (Linux ``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def rss_growth(fn: Callable[[], Any]) -> tuple[Any, float, int]:
    """``(fn(), seconds, bytes)``: what ``fn`` returns, how long it took and how far the process's resident memory
    rose above where it stood when the call began (sampled every 2 ms from ``/proc/self/status`` on a thread)."""
    import threading

    peak, base, done = [0], current_rss_bytes(), threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], current_rss_bytes())
            time.sleep(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.perf_counter()
    try:
        result = fn()
    finally:
        done.set()
        sampler.join()
    return result, time.perf_counter() - start, max(0, peak[0] - base)


def peak_rss_bytes() -> int:
    """This process's peak resident set size (``VmHWM``) since start or since :func:`reset_peak_rss`."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def reset_peak_rss() -> bool:
    """Reset the peak resident set size to the current one (Linux: write 5 to ``/proc/self/clear_refs``).

    Without it the peak would include what happened before the measured call (building the inputs, with
    their validation temporaries). Returns False where the kernel does not allow it.
    """
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def format_bytes(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, scale in (("GB", 2**30), ("MB", 2**20), ("kB", 2**10)):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value:.0f} B"


def format_seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f} s" if value < 10 else f"{value:.1f} s"


# ---------------------------------------------------------------------------------------------- timing
def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def time_call(fn: Callable[[], Any], *, repeat: int = 3, device: str = "cpu") -> dict[str, float]:
    """Wall-clock seconds of ``repeat`` calls of ``fn`` (device synchronised): best, median, first."""
    times = []
    for _ in range(repeat):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return {"best_s": min(times), "median_s": statistics.median(times), "first_s": times[0]}


# ---------------------------------------------------------------------------------------------- children
def run_child(script: str, function: str, timeout: float | None = None, **kwargs: Any) -> dict[str, Any]:
    """Run ``function(**kwargs)`` of ``script`` in a fresh Python process; return its result dict.

    A failure (non-zero exit, e.g. killed for memory, or a timeout) comes back as ``{"error": ...}``.
    """
    payload = json.dumps({"function": function, "kwargs": kwargs})
    try:
        done = subprocess.run(
            [sys.executable, script, CHILD_FLAG, payload], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(_RESULT_PREFIX):
            return json.loads(line[len(_RESULT_PREFIX) :])
    tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
    return {"error": f"exit status {done.returncode}: {' | '.join(tail)}"}


def old_and_new(script: str, old_src: str, child_args: Sequence[str],
                own_args: Callable[[str], Sequence[str]] | None = None) -> dict[str, dict[str, Any]]:
    """``{"old": ..., "new": ...}``: ``script --child CHILD_ARGS`` run in a child process twice, importing
    circuitkit from ``old_src`` (the ``src`` of a checkout before a change), then from this checkout's ``src``; each
    child prints its result as JSON on its last line. ``own_args(name)``: arguments of that child alone (e.g. where
    it writes a file of its own)."""
    results = {}
    for name, src in (("old", Path(old_src).resolve()), ("new", Path(__file__).resolve().parent.parent / "src")):
        env = dict(os.environ, PYTHONPATH=str(src))
        own = [] if own_args is None else list(own_args(name))
        out = subprocess.run([sys.executable, script, "--child", *child_args, *own], env=env, check=True,
                             capture_output=True, text=True).stdout
        results[name] = json.loads(out.strip().splitlines()[-1])
    return results


def old_and_new_cli(script: str, doc: str, child: Callable[..., dict[str, Any]],
                    options: Sequence[tuple[str, dict[str, Any]]] = ()) -> tuple[Any, dict[str, dict[str, Any]]] | None:
    """The command line of a benchmark that runs ``child`` under the code before a change and after it:
    ``--model DIR --old-src OLD/src [--json FILE]`` and ``options`` (``(flag, argparse keywords)``, each passed on
    to both children and to ``child`` by its name). In a child (``--child``): prints ``child(model, *options)`` as
    JSON and returns None. Else ``(args, {"old": ..., "new": ...})`` (:func:`old_and_new`)."""
    import argparse

    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--old-src", help="the src folder of a checkout before the change")
    for flag, keywords in options:
        parser.add_argument(flag, **keywords)
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    names = [flag.lstrip("-").replace("-", "_") for flag, _ in options]
    if args.child:
        print(json.dumps(child(args.model, *(getattr(args, name) for name in names))))
        return None
    if not args.old_src:
        parser.error("--old-src is required")
    forwarded = ["--model", args.model, *(x for flag, name in zip((f for f, _ in options), names, strict=True)
                                          for x in (flag, str(getattr(args, name))))]
    return args, old_and_new(script, args.old_src, forwarded)


def child_main(functions: dict[str, Callable[..., dict[str, Any]]]) -> None:
    """Entry point of a child process: run the named function and print its result as the last line."""
    request = json.loads(sys.argv[sys.argv.index(CHILD_FLAG) + 1])
    result = functions[request["function"]](**request["kwargs"])
    print(_RESULT_PREFIX + json.dumps(result), flush=True)


def memory_report(before: int, device: str) -> dict[str, int]:
    """Peak memory of this (child) process: total, and above ``before`` (bytes)."""
    if device.startswith("cuda"):
        import torch

        peak = torch.cuda.max_memory_allocated()
        return {"peak_bytes": peak, "peak_above_inputs_bytes": peak - before, "memory_kind": "cuda allocated"}
    peak = peak_rss_bytes()
    kind = "process RSS peak since inputs were built" if _PEAK_RESET[0] else "process RSS peak (lifetime)"
    return {"peak_bytes": peak, "peak_above_inputs_bytes": peak - before, "memory_kind": kind}


_PEAK_RESET = [False]


def memory_now(device: str) -> int:
    """Memory in use now, with the peak counter reset to it: call just before the measured work."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    _PEAK_RESET[0] = reset_peak_rss()
    return current_rss_bytes()


# ---------------------------------------------------------------------------------------------- output
def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]], title: str = "") -> None:
    """A plain-text table: ``columns`` are ``(key, header)`` pairs; values are printed with ``str``."""
    cells = [[str(row.get(key, "-")) for key, _ in columns] for row in rows]
    widths = [max(len(header), *(len(c[i]) for c in cells)) if cells else len(header)
              for i, (_, header) in enumerate(columns)]
    if title:
        print(title)
    print("  ".join(header.ljust(width) for (_, header), width in zip(columns, widths, strict=True)))
    print("  ".join("-" * width for width in widths))
    for row in cells:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))


def print_json(name: str, payload: Any) -> None:
    """One JSON line, ``{"benchmark": name, ...payload}``, for machines to read."""
    print(json.dumps({"benchmark": name, **payload}, sort_keys=True))


def interleaved_medians(fns: list[Callable[[], object]], repeats: int) -> list[float]:
    """Median seconds of each function after one warm-up call each, run in alternation so that load from other
    processes on a shared machine falls on all of them alike."""
    for fn in fns:
        fn()  # warm-up
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, bucket in zip(fns, times, strict=True):
            start = time.perf_counter()
            fn()
            bucket.append(time.perf_counter() - start)
    return [statistics.median(bucket) for bucket in times]


def emit_json(payload: dict[str, Any], path: str | None) -> None:
    """Print ``payload`` as indented JSON and also write it to ``path`` when given."""
    print(json.dumps(payload, indent=1))
    if path:
        with open(path, "w") as f:
            json.dump(payload, f, indent=1)


def write_json_atomic(path: Path, data: Any) -> None:
    """``data`` as indented JSON (keys sorted) into ``path``, through a temporary file beside it and one rename, so
    a run stopped midway leaves the previous file whole."""
    import tempfile

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def ioi_discovery(model_dir: str) -> tuple[Any, Any, Any]:
    """``(adapter, task, runner)`` of the default IOI scan's discovery pairs on the model in ``model_dir``: the
    built-in IOI task (32 pairs, seed 0), split as ``scan_task`` splits it (half held out, split seed 0), a
    :class:`~circuitkit.graph.runner.TaskRunner` over the searched half with MLPs as nodes, nothing run yet."""
    from circuitkit.graph.runner import TaskRunner
    from circuitkit.models.adapters import adapt
    from circuitkit.models.loading import load_model
    from circuitkit.tasks.generators import ioi
    from circuitkit.tasks.scan import split_pairs

    model = load_model(model_dir)
    adapter = adapt(model)
    task = ioi(model)
    discovery, _ = split_pairs(task.n_pairs, 0.5, 0)
    batch = task.tokenize(adapter).subset(discovery)
    return adapter, task, TaskRunner(adapter, batch, task.metric, mlps=True, ablation=task.ablation)
