"""An edge into the logits, patched alone: resumed past the last layer against resumed at it (one run, one process)

    python benchmarks/logits_edges.py --model DIR --scores SCAN/scores.json [--json out.json]

``SCAN`` is a ``circuitkit scan DIR --task ioi`` output (its 32 IOI pairs, seed 0, split 16 / 16). For the scan's
eight strongest edges (``circuit.edge_effects``), on its discovery pairs, this measures each edge's exact effect
(the mean metric lost with that edge alone patched from the corrupted prompt, every other edge clean) three ways:

- ``past``: as the task scan does, an edge into the logits from the clean run's final residual stream plus that
  edge's delta, running no layer (:meth:`TaskRunner.final_layer`), the others resumed at their receiver's layer;
- ``at_last``: every edge into the logits resumed at the last layer instead (what the scan did before);
- ``full``: every edge in a full edge pass with that edge alone missing (the definition, no resumption);

with the passes each of the first two counted. Printed and written as JSON."""
import argparse
import json

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--scores", required=True, help="scores.json of `circuitkit scan DIR --task ioi`")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    from _common import ioi_discovery

    from circuitkit.graph.runner import TaskRunner

    with open(args.scores, encoding="utf-8") as f:
        effects = json.load(f)["circuit"]["edge_effects"]
    _, _, runner = ioi_discovery(args.model)
    graph = runner.graph
    index = torch.tensor([[graph.senders.index(e["edge"].split("->")[0]),
                           graph.receivers.index(e["edge"].split("->")[1])] for e in effects])
    clean = float(runner.clean["metric"].mean())
    _ = runner.corrupted

    def measured(how: str) -> tuple[list[float], float]:
        before = runner.passes
        if how == "full":
            kept = graph.allowed[None].repeat(len(index), 1, 1)
            kept[torch.arange(len(index)), index[:, 0], index[:, 1]] = False
            values = runner.edge_metric(kept)
        else:
            values = runner.single_edge_metric(index)
        return [clean - float(v) for v in values], runner.passes - before

    past, past_passes = measured("past")
    final_layer = TaskRunner.final_layer
    TaskRunner.final_layer = lambda self: self.resume_layer(self.spec.n_layers - 1)
    try:
        at_last, at_last_passes = measured("at_last")
    finally:
        TaskRunner.final_layer = final_layer
    full, full_passes = measured("full")
    rows = [{"edge": e["edge"], "scan": e["effect"], "past": p, "at_last": a, "full": f}
            for e, p, a, f in zip(effects, past, at_last, full, strict=True)]
    passes = {"past": past_passes, "at_last": at_last_passes, "full": full_passes}
    out = {"model": args.model, "pairs": runner.batch.n_pairs, "passes": passes,
           "bit_identical": all(r["past"] == r["at_last"] == r["full"] for r in rows), "edges": rows}
    for r in rows:
        print(f"{r['edge']:>16}  past {r['past']:+.7f}  at last layer {r['at_last']:+.7f}  full {r['full']:+.7f}")
    print(f"passes: past {past_passes:.4f}, at the last layer {at_last_passes:.4f}, full {full_passes:.4f}; "
          f"bit-identical: {out['bit_identical']}")
    if args.json:  # through a temporary file and one rename: a stopped run leaves no half file
        from _common import write_json_atomic

        write_json_atomic(args.json, out)


if __name__ == "__main__":
    main()
