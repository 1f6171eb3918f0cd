"""The corrupted run read from EAP-IG's first point against the corrupted run made apart (one process)

    python benchmarks/folded_corrupted.py --model DIR [--json out.json]

On the default IOI scan's discovery pairs (32 pairs, seed 0, split 16 / 16), two runners: one runs the corrupted
prompts apart and then EAP-IG (3 points, the default ``"left"``: ``alpha = 0, 1/3, 2/3``); the other runs EAP-IG
alone and reads the corrupted run from its ``alpha = 0`` copy (:meth:`TaskRunner.folds_corrupted`). It prints
whether every kept activation (the input embeddings, each layer's ``z`` and MLP output), the metric, the last-token
log-probabilities and every EAP-IG score are the same bit for bit, the largest difference where not, and each way's
counted passes and seconds."""
import argparse
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    from _common import ioi_discovery

    from circuitkit.graph.runner import TaskRunner

    adapter, task, first = ioi_discovery(args.model)

    def runner() -> TaskRunner:
        made = TaskRunner(adapter, first.batch, task.metric, mlps=True, ablation=task.ablation)
        _ = made.clean
        return made

    out: dict = {"model": args.model, "pairs": first.batch.n_pairs}
    apart, folded = runner(), runner()
    for name, made in (("apart", apart), ("folded", folded)):
        before, started = made.passes, time.perf_counter()
        if name == "apart":
            _ = made.corrupted
        folds = made.folds_corrupted(3, "left")
        scores, _, _ = made.attribute(3, "left")
        out[name] = {"passes": made.passes - before, "seconds": time.perf_counter() - started, "folds": folds}
        out[name]["scores"] = scores
    a, f = apart._corrupt, folded._corrupt
    pairs = [("scores", out["apart"].pop("scores"), out["folded"].pop("scores"))]
    pairs += [(key, a[key], f[key]) for key in ("input", "metric", "logprobs")]
    pairs += [(f"{key}[{layer}]", a[key][layer], f[key][layer]) for key in ("z", "mlp") for layer in sorted(a[key])]
    differ = {name: float((x.float() - y.float()).abs().max()) for name, x, y in pairs if not torch.equal(x, y)}
    out.update(compared=len(pairs), bit_identical=not differ, differ=differ)
    print(f"{len(pairs)} tensors compared; bit-identical: {not differ}; differing: {differ or 'none'}")
    for name in ("apart", "folded"):
        print(f"{name}: {out[name]['passes']:.2f} passes, {out[name]['seconds']:.2f} s")
    if args.json:  # through a temporary file and one rename: a stopped run leaves no half file
        from _common import write_json_atomic

        write_json_atomic(args.json, out)


if __name__ == "__main__":
    main()
