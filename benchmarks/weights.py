"""The scan's weight-only work (QK/OV spectra, Q/K/V composition scores) in units of one forward pass of the scan's
default batch, on the SmolLM-135M shape of ``benchmarks/scan.py`` (random weights, a Hugging Face checkpoint this
script saves into a temporary directory).

Run: ``python benchmarks/weights.py [--repeats N] [--json out.json]``. Each measurement is interleaved with a
forward pass (so load from other processes falls on both) and reported as the median ratio.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from _common import emit_json  # benchmarks/ is on sys.path when a script here runs
from scan import forward_seconds, save_smollm_shape


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds (median reported)")
    parser.add_argument("--json", type=str, default=None, help="also write the JSON here")
    args = parser.parse_args()

    from circuitkit.composition import composition_scores
    from circuitkit.factored import singular_values
    from circuitkit.models import load_model
    from circuitkit.weights import HeadWeights

    with tempfile.TemporaryDirectory(prefix="circuitkit-bench-") as root:
        path = Path(root) / "smollm"
        label = save_smollm_shape(path)
        model = load_model(path)
        weights = HeadWeights.from_model(model)
        work = {
            "spectra QK+OV": lambda: [singular_values(weights, circuit) for circuit in ("QK", "OV")],
            "composition Q+K+V": lambda: [composition_scores(weights, mode) for mode in "QKV"],
        }
        for fn in work.values():
            fn()  # warm-up
        ratios: dict[str, list[float]] = {name: [] for name in work}
        forwards = []
        for _ in range(args.repeats):
            for name, fn in work.items():
                forward = statistics.median(forward_seconds(model, 1))
                start = time.perf_counter()
                fn()
                ratios[name].append((time.perf_counter() - start) / forward)
                forwards.append(forward)
    rows = {name: statistics.median(values) for name, values in ratios.items()}
    print(f"{label}: one forward pass {statistics.median(forwards) * 1e3:.0f} ms (median)")
    for name, ratio in rows.items():
        print(f"  {name:<20} {ratio:6.3f} forward passes")
    emit_json({"model": label, "forward_s": statistics.median(forwards), "forward_passes": rows}, args.json)


if __name__ == "__main__":
    main()
