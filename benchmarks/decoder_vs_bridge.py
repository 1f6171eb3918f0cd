"""circuitkit's own decoder against the TransformerBridge on a real checkpoint: loading time, the logits of the
scan's batch, and every figure of the default scan.

    python benchmarks/decoder_vs_bridge.py /work/models/qwen --json results/decoder_vs_bridge.json

Both scans run in this process, one after the other, on the same batch; figures are compared leaf by leaf through
``to_json()`` (numbers: the largest absolute and relative difference and where; everything else: equal or not).
Before them, single passes of the two models taking turns (:func:`interleaved_passes`): the fair timing where the
machine's load changes during the run.
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


def interleaved_passes(own, bridge, tokens, repeats: int = 2) -> dict[str, list[float]]:
    """Seconds of one forward pass of the scan's batch with a hook on every ``hook_z``, and of a forward + backward
    pass with a zero leaf added to every ``z`` and a loss read at the second half's positions (the attribution's
    pass), the two models taking turns so that the machine's load falls on both alike."""
    import time

    import torch

    from circuitkit.models.adapters import HOOKS, adapt

    adapters = {"decoder": adapt(own), "bridge": adapt(bridge)}
    layers = adapters["decoder"].spec.n_layers
    at = torch.arange(tokens.shape[1] // 2, tokens.shape[1])
    seconds: dict[str, list[float]] = {}
    for _ in range(repeats):
        for label, adapter in adapters.items():
            with torch.no_grad():
                start = time.perf_counter()
                adapter.run(tokens, [(HOOKS.z(layer), lambda z, hook: None) for layer in range(layers)])
                seconds.setdefault(f"{label} forward", []).append(time.perf_counter() - start)
            leaves: list[torch.Tensor] = []

            def add_leaf(z, hook, leaves=leaves):
                leaves.append(torch.zeros_like(z, requires_grad=True))
                return z + leaves[-1]

            start = time.perf_counter()
            with torch.enable_grad():
                logits = adapter.run(tokens, [(HOOKS.z(layer), add_leaf) for layer in range(layers)],
                                     graph_positions=at)
                logits[:, at].float().logsumexp(-1).sum().backward()
            seconds.setdefault(f"{label} forward+backward", []).append(time.perf_counter() - start)
    return seconds


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
    out["passes"] = interleaved_passes(own, bridge, tokens)
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
