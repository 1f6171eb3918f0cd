"""circuitkit's own decoder against the TransformerBridge on a real checkpoint: loading time, the logits of the
scan's batch, and every figure of the default scan.

    python benchmarks/decoder_vs_bridge.py /work/models/qwen --json results/decoder_vs_bridge.json

Both scans run in this process, one after the other, on the same batch; figures are compared leaf by leaf through
``to_json()`` (numbers: the largest absolute and relative difference and where; everything else: equal or not).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def leaves(document, path=""):
    if isinstance(document, dict):
        for key, value in document.items():
            yield from leaves(value, f"{path}.{key}".lstrip("."))
    elif isinstance(document, list):
        for i, value in enumerate(document):
            yield from leaves(value, f"{path}[{i}]")
    else:
        yield path, document


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    from circuitkit.cpu_threads import prefer_passive_waiting

    prefer_passive_waiting()  # before torch loads: its idle threads then sleep, not spin, beside other work
    import torch

    import circuitkit as ck
    from circuitkit.detect import RepeatedTokens
    from circuitkit.detect.session import open_session
    from circuitkit.models import load_model

    out = {"model": args.model}
    start = time.perf_counter()
    own = load_model(args.model, bridge=False)
    out["decoder_load_seconds"] = time.perf_counter() - start
    start = time.perf_counter()
    bridge = load_model(args.model)
    out["bridge_load_seconds"] = time.perf_counter() - start
    tokens = open_session(own, RepeatedTokens()).batch.tokens
    with torch.no_grad():
        a, b = own(tokens), bridge(tokens)
    out["logits_max_abs_diff"] = float((a - b).abs().max())
    out["logits_scale"] = float(b.abs().max())
    scans = {}
    for label, model in (("decoder", own), ("bridge", bridge)):
        start = time.perf_counter()
        scans[label] = ck.scan(model, name="qwen").to_json()
        out[f"{label}_scan_seconds"] = time.perf_counter() - start
    mine, theirs = dict(leaves(scans["decoder"])), dict(leaves(scans["bridge"]))
    numbers, others = [], []
    for path, value in theirs.items():
        got = mine.get(path, "<missing>")
        if isinstance(value, float) and isinstance(got, (int, float)):
            numbers.append((abs(got - value), abs(got - value) / max(abs(value), 1e-12), path))
        elif got != value and "family" not in path and "seconds" not in path:
            others.append(f"{path}: decoder {got!r}, bridge {value!r}")
    out["figures"] = len(theirs)
    out["keys_equal"] = sorted(mine) == sorted(theirs)
    worst = max(numbers) if numbers else None
    out["numbers_max_abs_diff"] = worst[0] if worst else None
    out["numbers_worst_path"] = worst[2] if worst else None
    out["non_numbers_differing"] = others[:20]
    out["circuit"] = {k: (scans[k].get("circuit") or {}).get("heads") for k in scans}
    out["faithfulness"] = {k: (scans[k].get("circuit") or {}).get("faithfulness") for k in scans}
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
