"""Circuit searches on a real model: ranked vs refined vs learned masks, circuit sizes at the same target.

    nice python benchmarks/search.py --model /work/models/qwen [--pairs 16] [--target 0.8] [--parts P,..] [--json F]

IOI (``--parts ioi``; ``circuitkit.tasks.generators.ioi``, ``--pairs`` pairs, seed 0, half held out as
``scan_task`` splits them): heads ranked by EAP-IG node score on the discovery pairs (``--ig-steps`` points, MLPs in
the graph as the task scan has them, node circuits of heads), the ranked node circuit sized there
(``node_circuit``), then each search (:mod:`circuitkit.circuits.search`, run as ``scan_task(search=...)`` runs it:
``tasks.search.search_node_circuit``) from it; every circuit's faithfulness measured exactly on the discovery pairs
and on the evaluation pairs (``tasks.search.held_out``).

IOI edges (``--parts ioi-edges``): the same pairs and split; the ranked edge circuit of ``edge_circuit`` (MIB's
curve under both rankings, CPR and CMD, the smallest top-k edge set reaching the target), then
``tasks.search.search_edge_circuit("refined")`` from it (dangling edges pruned, block rounds within
``--edge-passes`` passes); each edge set measured on the evaluation pairs by one edge pass.

Induction (``--parts induction``; repeated random tokens, ``--induction-batch`` sequences of a block of
``--block-len`` tokens twice, mean ablation, the repeated-copies loss): the ranked circuit of ``find_circuit``
(joint-path ranking) on the discovery batch (seed 0), then each search on it (``circuits.search.induction_problem``;
``masks+refined``: the refined search from the masks' circuit), every circuit measured on the discovery batch and
on a batch drawn with seed 1 (its own mean ablation values).

Passes: forward passes of the batch (a stacked copy one each, a backward two), as the library counts them; the
searches' passes are their own (the ranked search's are the ranking and the sizing). Writes the JSON (atomically)
after every search (a later run of one part or search joins those already there) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from _common import write_json_atomic  # benchmarks/ is on sys.path when a script here runs

SEARCHES = ["ranked", "refined", "masks", "masks+refined"]  # --searches may run fewer (a later run adds the others)
ORDER = ["ranked", "refined", "masks", "masks+refined", "edges ranked", "edges refined"]


def _ioi_runners(bridge: Any, pairs: int) -> tuple[Any, Any, Any, Any, Any]:
    """The IOI task of ``pairs`` pairs for the model's tokenizer (seed 0), split half and half (seed 0), and a
    task runner on each half (MLPs as nodes): ``(task, discovery, evaluation, runner, held)``."""
    from circuitkit import tasks
    from circuitkit.graph.runner import TaskRunner
    from circuitkit.models.adapters import adapt
    from circuitkit.tasks.scan import split_pairs

    adapter = adapt(bridge)
    task = tasks.get_task("ioi", bridge, n=pairs, seed=0)
    batch = task.tokenize(adapter, None)
    discovery, evaluation = split_pairs(task.n_pairs, 0.5, 0)
    runner = TaskRunner(adapter, batch.subset(discovery), task.metric, mlps=True, ablation=task.ablation)
    held = TaskRunner(adapter, batch.subset(evaluation), task.metric, mlps=True, ablation=task.ablation)
    return task, discovery, evaluation, runner, held


def _ioi_scores(runner: Any, held: Any, ig_steps: int, log: Any, label: str) -> tuple[Any, Any, float]:
    """Both halves' clean and corrupted runs and the discovery half's EAP-IG: ``(edge scores, node scores, passes
    so far)``, logged with their seconds."""
    started = time.perf_counter()
    _ = runner.clean, runner.corrupted, held.clean, held.corrupted
    edge_scores, node_scores = runner.edge_gradients(ig_steps)
    log(f"{label}: clean/corrupted/attribution {runner.passes:.0f} passes, {time.perf_counter() - started:.0f} s")
    return edge_scores, node_scores, runner.passes


def ioi_part(bridge: Any, pairs: int, target: float, ig_steps: int, mask_options: dict, log: Any,
             store: Any) -> dict:
    import torch

    from circuitkit.ranking import head_name
    from circuitkit.tasks.circuit import node_circuit
    from circuitkit.tasks.search import held_out, search_node_circuit

    task, discovery, evaluation, runner, held = _ioi_runners(bridge, pairs)
    _, node_scores, ranking_passes = _ioi_scores(runner, held, ig_steps, log, "ioi")
    t0, p0 = time.perf_counter(), runner.passes
    found = node_circuit(runner, node_scores, target, "abs")
    ranked_seconds, ranked_passes = time.perf_counter() - t0, runner.passes - p0
    log(f"ioi: ranked {len(found[0])} heads at {found[2]:.3f}, {ranked_passes:.0f} passes, {ranked_seconds:.0f} s")
    out: dict[str, Any] = {"pairs": task.n_pairs, "discovery_pairs": int(len(discovery)),
                           "evaluation_pairs": int(len(evaluation)), "metric": task.metric, "ig_steps": ig_steps,
                           "clean": float(runner.clean["metric"].mean()), "all_patched": found[5],
                           "ranking_passes": ranking_passes, "n_heads_total": runner.spec.n_layers *
                           runner.spec.n_heads, "searches": {}}
    for name in SEARCHES:
        t0, p0 = time.perf_counter(), runner.passes
        searched, options = (("masks", {**mask_options, "refine": True}) if name == "masks+refined"
                             else (name, mask_options if name == "masks" else {}))
        circuit, result = search_node_circuit(searched, runner, node_scores, found, target, "abs", options=options)
        seconds, passes = time.perf_counter() - t0, runner.passes - p0
        if name == "ranked":
            seconds, passes = ranked_seconds, ranked_passes
        other = held_out(held, circuit[0], circuit[1], False)
        out["searches"][name] = {
            "heads": [head_name(h) for h in circuit[0]], "size": len(circuit[0]) + len(circuit[1]),
            "faithfulness": circuit[2], "necessity": circuit[3], "evaluation_faithfulness": other.get("faithfulness"),
            "evaluation_necessity": other["necessity"], "passes": passes, "seconds": round(seconds, 1),
            "trace": result.to_json()["trace"], "settings": result.settings}
        log(f"ioi: {name} {out['searches'][name]['size']} heads, faithfulness {circuit[2]:.3f} / "
            f"{other.get('faithfulness', float('nan')):.3f}, {passes:.0f} passes, {seconds:.0f} s")
        store(out)
    del torch
    return out


def ioi_edges_part(bridge: Any, pairs: int, target: float, ig_steps: int, max_passes: float, log: Any,
                   store: Any) -> dict:
    """The IOI edge circuit: ranked (``edge_circuit``: MIB's curve under both rankings, CPR/CMD, the smallest top-k
    reaching the target), then ``search_edge_circuit("refined")`` from it (dangling edges pruned, block rounds,
    ``max_passes``), each set measured on the evaluation pairs by one edge pass."""
    import torch

    from circuitkit.tasks.circuit import edge_circuit
    from circuitkit.tasks.search import search_edge_circuit

    task, discovery, evaluation, runner, held = _ioi_runners(bridge, pairs)
    scores, _, ranking_passes = _ioi_scores(runner, held, ig_steps, log, "ioi edges")
    t0, p0 = time.perf_counter(), runner.passes
    edges, faith, curve, cpr, cmd, _, n_edges, areas = edge_circuit(runner, scores, target, "abs")
    ranked_seconds, ranked_passes = time.perf_counter() - t0, runner.passes - p0
    log(f"ioi edges: ranked {len(edges)} of {n_edges} edges at {faith:.3f}, {ranked_passes:.0f} passes, "
        f"{ranked_seconds:.0f} s")
    graph = runner.graph
    position = {name: i for i, name in enumerate(graph.edge_names(graph.allowed.nonzero()))}
    index = graph.allowed.nonzero()
    clean, corrupted = float(held.clean["metric"].mean()), float(held.corrupted["metric"].mean())

    def evaluate(names: tuple[str, ...]) -> float:
        mask = torch.zeros(1, *graph.allowed.shape, dtype=torch.bool)
        chosen = index[[position[n] for n in names]]
        mask[0, chosen[:, 0], chosen[:, 1]] = True
        return (float(held.edge_metric(mask)[0]) - corrupted) / (clean - corrupted)

    out: dict[str, Any] = {"pairs": task.n_pairs, "discovery_pairs": int(len(discovery)),
                           "evaluation_pairs": int(len(evaluation)), "ig_steps": ig_steps, "n_edges_total": n_edges,
                           "ranking_passes": ranking_passes, "cpr": cpr, "cmd": cmd, "areas": areas,
                           "curve": [[p.size, p.faithfulness] for p in curve], "searches": {}}
    out["searches"]["edges ranked"] = {
        "size": len(edges), "faithfulness": faith, "evaluation_faithfulness": evaluate(edges),
        "passes": ranked_passes, "seconds": round(ranked_seconds, 1), "trace": [], "settings": {}}
    store(out)
    t0, p0 = time.perf_counter(), runner.passes
    names, f, result = search_edge_circuit("refined", runner, scores, edges, target, "abs", faith,
                                           options={"max_passes": max_passes})
    seconds, passes = time.perf_counter() - t0, runner.passes - p0
    out["searches"]["edges refined"] = {
        "size": len(names), "faithfulness": f, "evaluation_faithfulness": evaluate(names), "passes": passes,
        "seconds": round(seconds, 1), "trace": result.to_json()["trace"], "settings": result.settings}
    log(f"ioi edges: refined {len(names)} edges at {f:.3f} (pruned {result.settings['pruned']}), {passes:.0f} "
        f"passes, {seconds:.0f} s")
    store(out)
    return out


def induction_part(bridge: Any, batch_size: int, block_len: int, target: float, mask_options: dict, log: Any,
                   store: Any) -> dict:
    import torch

    from circuitkit.circuits.faithfulness import Ablator, ablation_values, search_batch
    from circuitkit.circuits.search import induction_problem, run_search
    from circuitkit.detect.loss import loss_positions, token_losses
    from circuitkit.detect.tokens import RepeatedTokens
    from circuitkit.models.adapters import adapt
    from circuitkit.ranking import head_name

    adapter = adapt(bridge)
    spec = adapter.spec
    L, H = spec.n_layers, spec.n_heads
    batch = RepeatedTokens(block_len=block_len, batch=batch_size, seed=0).build(adapter)
    other_batch = RepeatedTokens(block_len=block_len, batch=batch_size, seed=1).build(adapter)
    t0 = time.perf_counter()
    circuit = search_batch(adapter, batch, target, "mean", None, necessity=False, rank="joint")
    ranked_seconds = time.perf_counter() - t0
    log(f"induction: ranked {circuit.n_heads} heads at {circuit.faithfulness:.3f}, {circuit.passes} passes "
        f"(+3 for the attribution), {ranked_seconds:.0f} s")
    values, _ = ablation_values(adapter, batch, "mean")
    ablator = Ablator(adapter, batch, values)
    order = list(circuit.ranking)
    scores = torch.zeros(L, H)
    for i, (layer, h) in enumerate(order):
        scores[layer, h] = float(len(order) - i)  # the ranking as a score: first = highest
    problem = induction_problem(ablator, circuit.clean_loss, circuit.all_ablated_loss, scores)
    start = [layer * H + h for layer, h in circuit.heads]

    other_values, _ = ablation_values(adapter, other_batch, "mean")
    other = Ablator(adapter, other_batch, other_values)
    with torch.no_grad():
        logits = adapter.run(other_batch.tokens, positions=loss_positions(other_batch))
        other_clean = float(token_losses(logits, other_batch.tokens, other_batch.repeated_copies).mean())
    other_all = other.losses(torch.ones(1, L, H, dtype=torch.bool))[0]

    def evaluate(kept: tuple[int, ...]) -> tuple[float, float]:
        mask = torch.ones(1, L, H, dtype=torch.bool)
        for i in kept:
            mask[0, i // H, i % H] = False
        loss = other.losses(mask)[0]
        necessity = ablator.losses(~mask)[0] - circuit.clean_loss
        return (other_all - loss) / (other_all - other_clean), necessity

    out: dict[str, Any] = {"batch": batch_size, "block_len": block_len, "method": "mean",
                           "clean_loss": circuit.clean_loss, "all_ablated_loss": circuit.all_ablated_loss,
                           "evaluation_clean_loss": other_clean, "evaluation_all_ablated_loss": other_all,
                           "n_heads_total": L * H, "searches": {}}
    done: dict[str, Any] = {}
    for name in SEARCHES:
        t0, p0 = time.perf_counter(), ablator.passes
        if name == "masks+refined":  # the refined search from the masks' circuit (run here unless it ran above)
            first = done.get("masks") or run_search("masks", problem, start, target,
                                                    start_faithfulness=circuit.faithfulness, **mask_options)
            then = run_search("refined", problem, list(first.kept), target, start_faithfulness=first.faithfulness)
            result = replace(then, search=name, passes=first.passes + then.passes, start=first.start,
                             trace=first.trace + then.trace[1:])
        else:
            options = mask_options if name == "masks" else {}
            result = run_search(name, problem, start, target, start_faithfulness=circuit.faithfulness, **options)
        done[name] = result
        seconds = time.perf_counter() - t0 if name != "ranked" else ranked_seconds
        passes = result.passes if name != "ranked" else circuit.passes + 3
        held, necessity = evaluate(result.kept)
        out["searches"][name] = {
            "heads": [head_name(divmod(i, H)) for i in result.kept], "size": result.size,
            "faithfulness": result.faithfulness, "necessity": necessity, "evaluation_faithfulness": held,
            "passes": passes, "seconds": round(seconds, 1), "trace": result.to_json()["trace"],
            "settings": result.settings}
        log(f"induction: {name} {result.size} heads, faithfulness {result.faithfulness:.3f} / {held:.3f}, "
            f"{passes:.0f} passes, {seconds:.0f} s")
        store(out)
        del p0
    return out


def induction_subsets(bridge: Any, batch_size: int, block_len: int, target: float, part: dict, sizes: list[int],
                      pool_limit: int, log: Any) -> dict:
    """Every subset of the given sizes of a pool of heads, measured exactly on the discovery batch: the pool is the
    union of the circuits the searches found (the induction part's JSON, ``part``), smallest first, each joining
    where the union stays within ``pool_limit`` heads. Returns the best set of each size and how many reached the
    target."""
    import itertools
    import math

    import torch

    from circuitkit.circuits.faithfulness import Ablator, ablation_values
    from circuitkit.circuits.search import induction_problem
    from circuitkit.detect.tokens import RepeatedTokens
    from circuitkit.models.adapters import adapt
    from circuitkit.ranking import head_name

    adapter = adapt(bridge)
    L, H = adapter.spec.n_layers, adapter.spec.n_heads
    batch = RepeatedTokens(block_len=block_len, batch=batch_size, seed=0).build(adapter)
    values, _ = ablation_values(adapter, batch, "mean")
    ablator = Ablator(adapter, batch, values)
    problem = induction_problem(ablator, part["clean_loss"], part["all_ablated_loss"])
    names = [head_name((layer, h)) for layer in range(L) for h in range(H)]
    chosen: set[int] = set()
    joined = []
    for name, s in sorted(part["searches"].items(), key=lambda kv: (kv[1]["size"], kv[0])):  # smallest first
        heads = {names.index(n) for n in s["heads"]}
        if len(chosen | heads) <= pool_limit:
            chosen |= heads
            joined.append(name)
    pool = sorted(chosen)
    out: dict[str, Any] = {"pool": [names[i] for i in pool], "circuits_joined": joined, "sizes": {}}
    for k in sizes:
        t0 = time.perf_counter()
        sets = [list(c) for c in itertools.combinations(pool, k)]
        measured = problem.measure(sets)
        best = max(range(len(sets)), key=lambda i: measured[i])
        out["sizes"][str(k)] = {"subsets": len(sets), "reaching_target": sum(v >= target for v in measured),
                                "best": [names[i] for i in sets[best]], "best_faithfulness": measured[best],
                                "seconds": round(time.perf_counter() - t0, 1)}
        log(f"induction subsets: all {math.comb(len(pool), k)} sets of {k} of {len(pool)} heads, "
            f"{out['sizes'][str(k)]['reaching_target']} reach {target}, best {measured[best]:.3f}")
    del torch
    return out


def table(results: dict) -> str:
    lines = ["| task | search | size | faithfulness (discovery) | faithfulness (evaluation) | passes | seconds |",
             "|---|---|---|---|---|---|---|"]
    for task, part in results.get("tasks", {}).items():
        for name, s in sorted(part["searches"].items(), key=lambda kv: ORDER.index(kv[0])):
            ev = s["evaluation_faithfulness"]
            lines.append(f"| {task} | {name} | {s['size']} | {s['faithfulness']:.3f} | "
                         f"{'-' if ev is None else f'{ev:.3f}'} | {s['passes']:.0f} | {s['seconds']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--ig-steps", type=int, default=3)
    parser.add_argument("--induction-batch", type=int, default=4)
    parser.add_argument("--block-len", type=int, default=16)
    parser.add_argument("--mask-steps", type=int, default=60)
    parser.add_argument("--mask-lr", type=float, default=0.3)
    parser.add_argument("--mask-rate", type=float, default=3.0)
    parser.add_argument("--mask-begin", default="start")
    parser.add_argument("--sparsity", type=float, default=0.003)
    parser.add_argument("--parts", default="induction,ioi,ioi-edges")
    parser.add_argument("--subset-sizes", default="7,8")
    parser.add_argument("--pool-limit", type=int, default=12)
    parser.add_argument("--edge-passes", type=float, default=60.0, help="the edge refinement's pass budget")
    parser.add_argument("--searches", default="ranked,refined,masks,masks+refined")
    parser.add_argument("--json", default="benchmarks/results/search_qwen.json")
    args = parser.parse_args(argv)
    if not Path(args.model).is_dir():
        sys.exit(f"{args.model}: no such directory")
    import torch

    from circuitkit.models.loading import load_model

    torch.set_num_threads(2)
    started = time.perf_counter()

    def log(text: str) -> None:
        print(f"[{time.perf_counter() - started:7.0f} s] {text}", flush=True)

    bridge = load_model(args.model)
    mask_options = {"steps": args.mask_steps, "lr": args.mask_lr, "sparsity": args.sparsity, "rate": args.mask_rate,
                    "begin": args.mask_begin, "seed": 0}
    results: dict[str, Any] = {"model": args.model, "target": args.target, "mask_options": mask_options,
                               "tasks": {}}
    SEARCHES[:] = [name for name in args.searches.split(",") if name]
    path = Path(args.json)
    if path.is_file():  # a part or search run on its own joins those already there
        results["tasks"] = json.loads(path.read_text()).get("tasks", {})

    def store(part: str) -> Any:
        def keep(out: dict) -> None:  # after every search: a long run keeps what it measured
            before = results["tasks"].get(part, {}).get("searches", {})
            results["tasks"][part] = {**out, "searches": {**before, **out["searches"]}}
            results["seconds"] = round(time.perf_counter() - started, 1)
            write_json_atomic(path, results)
        return keep

    for part in args.parts.split(","):
        if part == "ioi":
            ioi_part(bridge, args.pairs, args.target, args.ig_steps, mask_options, log, store("ioi"))
        elif part == "ioi-edges":
            ioi_edges_part(bridge, args.pairs, args.target, args.ig_steps, args.edge_passes, log,
                           store("ioi-edges"))
        elif part == "induction-subsets":  # after the induction part: its circuits' union, every subset
            found = results["tasks"]["induction"]
            found["subsets"] = induction_subsets(bridge, args.induction_batch, args.block_len, args.target, found,
                                                 [int(k) for k in args.subset_sizes.split(",")], args.pool_limit,
                                                 log)
            write_json_atomic(path, results)
        elif part == "induction":
            induction_part(bridge, args.induction_batch, args.block_len, args.target, mask_options, log,
                           store("induction"))
        else:
            sys.exit(f"--parts: unknown part {part!r} (ioi, ioi-edges, induction, induction-subsets)")
    print(table(results))


if __name__ == "__main__":
    main()
