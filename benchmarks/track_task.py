"""A task over the bundled model's training (``ck.track(series, task=...)``): the task's gap, node circuit and its
held-out faithfulness at every checkpoint, where the gap rises against where the in-context learning score does,
and the cost of the task per checkpoint.

Series: the first 800 steps of the bundled run (``circuitkit.zoo.train.train_series``, a checkpoint every 50 steps;
the in-context learning phase change of that run lies between steps 500 and 700). Task: 32 copy-next pairs in token
ids, written here: ``[BOS, a, b, c, d, e, f, x]`` with ``x`` one of ``b, c, d`` and the answer the token after its
first occurrence (the wrong answer: ``a``); corrupted: that first occurrence replaced by an unused token.

Timing: ``ck.track`` of the series without and with the task (one thread each, the same batch), seconds per
checkpoint (loading included).

Run: ``python benchmarks/track_task.py [--pairs 32] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from _common import emit_json, print_table  # benchmarks/ is on sys.path when a script here runs


def copy_task(n: int, seed: int = 0):
    import torch

    from circuitkit.tasks import Task

    g = torch.Generator().manual_seed(seed)
    pairs = []
    for _ in range(n):
        tokens = (torch.randperm(63, generator=g)[:7] + 1).tolist()  # ids 1..63: 0 is the BOS
        prompt, spare = tokens[:6], tokens[6]
        i = int(torch.randint(1, 4, (1,), generator=g))
        clean = [0, *prompt, prompt[i]]
        corrupted = list(clean)
        corrupted[1 + i] = spare
        pairs.append((clean, corrupted, [prompt[i + 1]], [prompt[0]]))
    return Task.from_pairs(pairs, name="copy-next")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=32)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    import torch

    import circuitkit as ck
    from circuitkit.zoo import train

    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="track-task-"))
    started = time.perf_counter()
    series = train.train_series(root / "series")
    trained = time.perf_counter() - started
    tokens = ck.RepeatedTokens()
    started = time.perf_counter()
    ck.track(series, tokens=tokens, out=root / "plain", progress=False)
    plain_s = time.perf_counter() - started
    started = time.perf_counter()
    tracked = ck.track(series, tokens=tokens, task=copy_task(args.pairs), out=root / "task", progress=False)
    task_s = time.perf_counter() - started
    rows = []
    for r in tracked.checkpoints:
        t, c = r["task"], r["task"]["circuit"]
        rows.append({"step": r["step"], "icl": r["icl_score"], "clean": t["clean"], "corrupted": t["corrupted"],
                     "gap": t["gap"], "circuit": None if c is None else f"{c['size']}/{c['n_nodes']}",
                     "heads": None if c is None else ",".join(c["heads"]),
                     "faithfulness": None if c is None else c["faithfulness"],
                     "held_out": None if c is None or c["evaluation"] is None else c["evaluation"]["faithfulness"]})
    print_table(rows, [(k, k) for k in rows[0]])
    change = tracked.phase_change
    n = len(series)
    summary = {"checkpoints": n, "pairs": args.pairs, "train_s": round(trained, 1),
               "seconds_per_checkpoint": {"track": round(plain_s / n, 2), "track with task": round(task_s / n, 2)},
               "icl_change": {k: change[k] for k in ("step", "interval", "share")},
               "task_change": {k: change["task"][k] for k in ("step", "interval", "share", "circuit_from")},
               "rows": rows}
    emit_json(summary, args.json)


if __name__ == "__main__":
    main()
