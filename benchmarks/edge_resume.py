"""Could the IOI edge curve's passes resume from a run already made? (one run; the answer on Qwen2.5-0.5B: no)

    python benchmarks/edge_resume.py --model DIR --json out.json

A patched pass with every edge into layers below ``l`` kept equals the clean run up to ``l`` (it could resume from the
clean residual stream there, as the single-edge effects do); one with every edge into layers below ``l`` missing
equals the corrupted run up to ``l`` (where MLPs are nodes too). For each of MIB's edge-curve sizes under both
rankings of the default IOI scan's EAP-IG scores (16 pairs, the 8 discovery pairs), this prints the lowest receiver
layer holding a kept edge and the lowest holding a missing one: a pass could start at the larger of the two."""
import argparse
import json

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    from circuitkit import tasks
    from circuitkit.graph.runner import TaskRunner
    from circuitkit.models.adapters import adapt
    from circuitkit.models.loading import load_model
    from circuitkit.tasks.circuit import _order, mib_sizes
    from circuitkit.tasks.scan import split_pairs

    model = load_model(args.model)
    task = tasks.get_task("ioi", model, n=16, seed=0)
    adapter = adapt(model)
    batch = task.tokenize(adapter)
    discovery, _ = split_pairs(task.n_pairs, 0.5, 0)
    runner = TaskRunner(adapter, batch.subset(discovery), task.metric, mlps=True, ablation=task.ablation)
    scores, _, _ = runner.attribute(3)
    graph = runner.graph
    layer_of = graph.receiver_layers
    index = graph.allowed.nonzero()
    flat = scores[index[:, 0], index[:, 1]]
    out = {"n_layers": graph.n_layers, "edges": index.shape[0]}
    for rank in ("abs", "signed"):
        order = _order(flat, rank)
        rows = []
        for k in sorted({k for k in mib_sizes(index.shape[0]) if 0 < k < index.shape[0]}):
            kept = torch.zeros(index.shape[0], dtype=torch.bool)
            kept[order[:k]] = True
            rows.append({"edges": k, "lowest_kept_layer": int(layer_of[index[kept, 1]].min()),
                         "lowest_missing_layer": int(layer_of[index[~kept, 1]].min())})
        out[rank] = rows
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
