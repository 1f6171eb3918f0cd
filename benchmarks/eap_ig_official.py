"""circuitkit against the official EAP-IG code (hannamw/EAP-IG, the code behind MIB's circuit track): the same
pairs as token ids, the same metric, the same per-query-head graph, on a real grouped-query model.

    OMP_NUM_THREADS=1 python benchmarks/eap_ig_official.py --model /work/models/qwen \\
        --eap-python /work/eapvenv/bin/python [--pairs 16] [--steps 5] [--target 0.8] \\
        [--json benchmarks/results/eap_ig_official_qwen.json]

One process tree, one model run at a time. This process (circuitkit's environment) builds IOI
(``tasks.ioi(model, n, seed=0)``), tokenizes it with the model's own tokenizer and writes the token ids (clean,
corrupted, each pair's last position, answer and wrong ids) and its model's logits at every real position to a
scratch folder. Then, in order:

1. **EAP-IG** (``--eap-python``: an environment with TransformerLens 2.x and EAP-IG installed; the ``eap`` package
   is imported at run time, none of its code is here): ``this_file --half eap --exchange DIR`` loads the same local
   weights into TransformerLens' ``HookedTransformer`` (config and weights through TransformerLens' own Qwen2
   converter; ``use_split_qkv_input``, ``use_attn_result``, ``use_hook_mlp_in``,
   ``ungroup_grouped_query_attention`` set as EAP-IG's README asks), compares its logits with circuitkit's, and runs
   EAP-IG's ``Graph.from_model``, ``attribute(method="EAP")`` and ``attribute(method="EAP-IG-inputs",
   ig_steps=steps)`` with the metric of EAP-IG's IOI notebook (``logit_diff``: answer minus wrong logit at each
   pair's last position, negated for attribution as the notebook does), all pairs in one batch. Its circuit: the
   smallest ``n`` whose ``graph.apply_topn(n, absolute=True)`` (pruned, as the notebook) reaches ``--target`` in
   EAP-IG's own ``evaluate_graph`` against ``evaluate_baseline``: MIB's sizes (top ``int(x E)`` edges at MIB's
   fractions, ranked by absolute and by signed score: the curves of MIB's CMD and CPR, computed here with
   ``tasks.circuit.mib_areas``), then bisection to within 1/64 of n, as circuitkit searches.
2. **circuitkit** (``TaskRunner`` with ``kv_edges="per-query-head"``, EAP-IG's graph): plain EAP (the gradient at
   the clean run, ``steps=1, points="right"``), EAP-IG (``--steps`` points at EAP-IG's own places,
   ``points="left"``), the edge circuit of the EAP-IG scores (``tasks.circuit.edge_circuit``), and EAP-IG's circuit
   (as ranked, and as pruned) measured in circuitkit's edge pass.
3. circuitkit's circuit in EAP-IG's evaluator (``--half eap-eval``: its edges put on top of a ranking, then
   ``apply_topn`` and ``evaluate_graph`` as for any circuit).

``--grouped`` (after a run): only circuitkit's circuit on its default grouped graph, for reference: its size in
grouped edges and in EAP-IG's (:func:`expand_grouped`), its faithfulness in both evaluators; added to the JSON.

Three things are adapted at run time in the EAP-IG half, none changing what it computes: its ``tokenize_plus`` (which
tokenizes strings, BOS first) is replaced by one returning circuitkit's token ids with the attention mask and
lengths its own helper returns (right padding); its score matrices, allocated with ``device='cuda'``, go to the
CPU; the pairs are given as one batch.

Scores are compared edge by edge under the name mapping ``a{l}.h{h} <-> l.h``, ``a{l}.h{h}<q|k|v> <-> l.h:q|k|v``
(``m{l}``, ``input``, ``logits`` the same): the ratio of the two (EAP-IG divides its summed scores by the pairs once
more than circuitkit: its scores are circuitkit's over the batch size), the largest difference after that scale
relative to the largest score, Spearman over all edges, the overlap of the top 100 by absolute score.

Writes the JSON atomically; prints a summary. The seconds are wall time on shared cores, one half at a time.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESOLUTION = 1 / 64  # circuitkit's EDGE_RESOLUTION, repeated here: the EAP-IG half cannot import circuitkit
FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)  # MIB's, as tasks.circuit.EDGE_FRACTIONS


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------- names
def ck_to_eap(name: str) -> str:
    """circuitkit's ``sender->receiver`` (``input``, ``l.h``, ``m{l}``; ``l.h:q|k|v``, ``m{l}``, ``logits``) as
    EAP-IG's edge name (``a{l}.h{h}``; ``a{l}.h{h}<q|k|v>``)."""
    sender, receiver = name.split("->")

    def node(x: str) -> str:
        if x in ("input", "logits") or x.startswith("m"):
            return x
        layer, head = x.split(".")
        return f"a{layer}.h{head}"

    if ":" in receiver:
        where, channel = receiver.split(":")
        return f"{node(sender)}->{node(where)}<{channel}>"
    return f"{node(sender)}->{node(receiver)}"


def spearman(a: Any, b: Any) -> float:
    """Spearman's rank correlation of two 1-D float tensors (ties broken by position: scores here are continuous)."""
    import torch

    def ranks(x: Any) -> Any:
        r = torch.empty_like(x, dtype=torch.float64)
        r[torch.argsort(x)] = torch.arange(x.numel(), dtype=torch.float64)
        return r

    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / (ra.norm() * rb.norm()))


def compare_scores(ck: Any, eap: Any, top: int = 100) -> dict[str, Any]:
    """``ck`` / ``eap``: the same edges' scores (1-D float tensors, float64). The least-squares scale of EAP-IG's to
    circuitkit's, the largest ``|ck - scale * eap|`` relative to ``max |ck|``, Spearman, the top-``top`` overlap by
    absolute score, and both signs' agreement."""
    import torch

    scale = float((ck * eap).sum() / (eap * eap).sum())
    diff = (ck - scale * eap).abs()
    top_ck = set(torch.argsort(-ck.abs())[:top].tolist())
    top_eap = set(torch.argsort(-eap.abs())[:top].tolist())
    return {"edges": int(ck.numel()), "scale_ck_over_eap": scale,
            "max_abs_difference_over_max_score": float(diff.max() / ck.abs().max()),
            "spearman": spearman(ck, eap), "spearman_abs": spearman(ck.abs(), eap.abs()),
            f"top{top}_overlap": len(top_ck & top_eap), "same_sign": float(((ck > 0) == (eap > 0)).double().mean())}


def mib_sizes(n_edges: int) -> list[int]:
    return [int(x * n_edges) for x in FRACTIONS]


def smallest(evaluate: Any, measured: dict[int, float], sizes: list[int], total: int, target: float) -> int:
    """The smallest ``n`` reaching ``target`` to within ``RESOLUTION`` of ``n``: the first of ``sizes`` (already in
    ``measured``) reaching it, then bisection from the last size below it (as ``circuits.faithfulness.smallest``)."""
    reached = [n for n in sorted(measured) if measured[n] >= target]
    if not reached:
        return total
    high = reached[0]
    low = max([n for n in measured if n < high], default=0)
    while high - low > max(1, int(RESOLUTION * high)):
        mid = (low + high) // 2
        if mid not in measured:
            measured[mid] = evaluate(mid)
        if measured[mid] >= target:
            high = mid
        else:
            low = mid
    return high


# ---------------------------------------------------------------------------------------------- the EAP-IG half
def eap_setup(folder: Path) -> dict[str, Any]:
    """Runs under the EAP-IG environment: the model in ``HookedTransformer``, EAP-IG's modules adapted (module
    docstring), the pairs as one batch, the metric, the baselines; a dict of all of them."""
    import types
    from importlib import metadata

    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    data = torch.load(folder / "pairs.pt", weights_only=True)
    request = json.loads((folder / "request.json").read_text())
    started = time.perf_counter()

    import eap.attribute
    import eap.evaluate
    import transformer_lens.loading_from_pretrained as loading
    from eap.evaluate import evaluate_baseline
    from transformer_lens import HookedTransformer
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path = request["model"]
    raw = json.loads((Path(path) / "config.json").read_text())
    hf_config = AutoConfig.from_pretrained(path)
    # a transformers-5 config keeps rope_theta under rope_parameters, which transformers 4 does not read
    theta = raw.get("rope_theta", raw.get("rope_parameters", {}).get("rope_theta"))
    if theta is not None:
        hf_config.rope_theta = theta
    hf_model = AutoModelForCausalLM.from_pretrained(path, config=hf_config, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path)
    cfg = loading.get_pretrained_model_config(path, hf_cfg=hf_config.to_dict(), fold_ln=False, device="cpu",
                                              dtype=torch.float32)
    state = loading.get_pretrained_state_dict(path, cfg, hf_model, dtype=torch.float32)
    model = HookedTransformer(cfg, tokenizer, move_to_device=False)
    # as EAP-IG's notebooks load a model: no folding, no centring
    model.load_and_process_state_dict(state, fold_ln=False, center_writing_weights=False, center_unembed=False)
    del hf_model, state
    model.cfg.use_split_qkv_input = True
    model.cfg.use_attn_result = True
    model.cfg.use_hook_mlp_in = True
    model.cfg.ungroup_grouped_query_attention = True
    model.eval()
    info: dict[str, Any] = {"load_seconds": time.perf_counter() - started, "torch": torch.__version__,
                            "transformer_lens": metadata.version("transformer-lens"),
                            "transformers": metadata.version("transformers"),
                            "rotary_base": cfg.rotary_base}
    log(f"EAP-IG half: HookedTransformer loaded in {info['load_seconds']:.0f} s")

    clean, corrupted, last = data["clean"], data["corrupted"], data["last"]
    labels = torch.stack([data["answer"], data["wrong"]], 1)
    n, pos = clean.shape
    mask = (torch.arange(pos)[None, :] <= last[:, None]).long()
    tokens = {"clean": clean, "corrupted": corrupted}

    def tokenize_plus(model: Any, inputs: list[str], max_length: Any = None) -> tuple:
        """EAP-IG's helper's return (tokens, attention mask, lengths, positions) for keys ``"clean:i"``."""
        kind = inputs[0].split(":")[0]
        index = torch.tensor([int(x.split(":")[1]) for x in inputs])
        return tokens[kind][index], mask[index], mask[index].sum(1), pos

    eap.attribute.tokenize_plus = tokenize_plus
    eap.evaluate.tokenize_plus = tokenize_plus

    def zeros(*shape: Any, **kw: Any) -> Any:
        if kw.get("device") == "cuda":
            kw["device"] = "cpu"
        return torch.zeros(*shape, **kw)

    cpu_torch = types.SimpleNamespace(**{k: getattr(torch, k) for k in dir(torch) if not k.startswith("__")})
    cpu_torch.zeros = zeros
    eap.attribute.torch = cpu_torch

    batches = [([f"clean:{i}" for i in range(n)], [f"corrupted:{i}" for i in range(n)], labels)]

    def logit_diff(logits: Any, clean_logits: Any, input_length: Any, labels: Any, mean: bool = True,
                   loss: bool = False) -> Any:
        """EAP-IG's IOI notebook's metric: answer minus wrong logit at each row's last position."""
        at = logits[torch.arange(logits.size(0)), input_length - 1]
        good_bad = torch.gather(at, -1, labels.to(logits.device))
        results = good_bad[:, 0] - good_bad[:, 1]
        if loss:
            results = -results
        return results.mean() if mean else results

    def metric(*a: Any) -> Any:
        return logit_diff(*a, mean=False, loss=False)

    t0 = time.perf_counter()
    clean_m = evaluate_baseline(model, batches, metric, quiet=True)
    corrupt_m = evaluate_baseline(model, batches, metric, run_corrupted=True, quiet=True)
    info["baseline_seconds"] = time.perf_counter() - t0
    info["clean"], info["corrupted"] = float(clean_m.mean()), float(corrupt_m.mean())
    info["clean_per_pair"], info["corrupted_per_pair"] = clean_m.tolist(), corrupt_m.tolist()
    log(f"EAP-IG half: metric clean {info['clean']:.4f}, corrupted {info['corrupted']:.4f}")
    return {"model": model, "batches": batches, "logit_diff": logit_diff, "metric": metric, "mask": mask,
            "clean_tokens": clean, "info": info, "request": request}


def eap_evaluator(setup: dict[str, Any], graph: Any) -> tuple[Any, dict[str, Any]]:
    """``evaluate_top(k, absolute=True) -> faithfulness`` of ``graph``'s top ``k`` edges (``apply_topn``, pruned)
    in EAP-IG's ``evaluate_graph``; and its counter of evaluations and seconds."""
    from eap.evaluate import evaluate_graph

    info, real_edges = setup["info"], int(graph.real_edge_mask.sum())
    evaluations = {"count": 0, "seconds": 0.0}

    def evaluate_top(k: int, absolute: bool = True) -> float:
        if k == 0:
            return 0.0
        if k >= real_edges:
            return 1.0
        t = time.perf_counter()
        graph.apply_topn(k, absolute=absolute)
        m = float(evaluate_graph(setup["model"], graph, setup["batches"], setup["metric"], quiet=True).mean())
        evaluations["count"] += 1
        evaluations["seconds"] += time.perf_counter() - t
        return (m - info["corrupted"]) / (info["clean"] - info["corrupted"])

    return evaluate_top, evaluations


def eap_half(folder: Path) -> None:
    """EAP-IG's scores, circuit and curves on the pairs in ``folder`` (module docstring); writes ``eap_out.json``
    and ``eap_scores.pt`` there."""
    import torch
    from eap.attribute import attribute
    from eap.graph import Graph

    started = time.perf_counter()
    setup = eap_setup(folder)
    model, out = setup["model"], dict(setup["info"])
    with torch.inference_mode():  # the logits against circuitkit's, at every real position
        logits = model(setup["clean_tokens"], attention_mask=setup["mask"])
    ck_logits = torch.load(folder / "ck_logits.pt", weights_only=True)
    out["logits_max_abs_difference"] = float((logits[setup["mask"].bool()] - ck_logits).abs().max())
    out["logits_max_abs"] = float(ck_logits.abs().max())
    log(f"EAP-IG half: logits differ from circuitkit's by at most {out['logits_max_abs_difference']:.3g}")

    graph = Graph.from_model(model)
    real_edges = int(graph.real_edge_mask.sum())
    out["edges"] = real_edges
    names = list(graph.edges)
    where = torch.tensor([graph.edges[e].matrix_index for e in names])  # [E, 2]
    saved: dict[str, Any] = {"names": names}
    for method, steps in (("EAP", None), ("EAP-IG-inputs", setup["request"]["steps"])):
        t0 = time.perf_counter()
        attribute(model, graph, setup["batches"], lambda *a: setup["logit_diff"](*a, mean=True, loss=True),
                  method=method, ig_steps=steps, quiet=True)
        out[f"{method}_seconds"] = time.perf_counter() - t0
        saved[method] = graph.scores[where[:, 0], where[:, 1]].clone()
        log(f"EAP-IG half: {method} in {out[f'{method}_seconds']:.0f} s")
    torch.save(saved, folder / "eap_scores.pt")

    # EAP-IG's circuit on its EAP-IG scores (left in graph.scores by the last attribute call)
    evaluate_top, evaluations = eap_evaluator(setup, graph)
    sizes = mib_sizes(real_edges)
    curves: dict[str, list[float]] = {}
    t0 = time.perf_counter()
    for absolute, rank in ((True, "abs"), (False, "signed")):
        curves[rank] = [evaluate_top(k, absolute) for k in sizes]
        log(f"EAP-IG half: curve ({rank}) {[round(f, 3) for f in curves[rank]]}")
    out["curves_seconds"] = time.perf_counter() - t0
    measured = dict(zip(sizes, curves["abs"], strict=True))
    t0 = time.perf_counter()
    k = smallest(evaluate_top, measured, sizes, real_edges, setup["request"]["target"])
    graph.apply_topn(k, absolute=True)
    kept = [e for e in names if graph.edges[e].in_graph]
    graph.apply_topn(k, absolute=True, prune=False)
    ranked = [e for e in names if graph.edges[e].in_graph]
    out["circuit"] = {"top_n": k, "faithfulness": measured[k], "edges_after_pruning": len(kept),
                      "bisection_seconds": time.perf_counter() - t0,
                      "measured": {str(s): f for s, f in sorted(measured.items())}, "edges": kept,
                      "ranked_edges": ranked}
    out["curves"], out["sizes"], out["evaluations"] = curves, sizes, dict(evaluations)
    log(f"EAP-IG half: circuit top {k} ({len(kept)} after pruning), faithfulness {measured[k]:.3f}")
    out["seconds"] = time.perf_counter() - started
    (folder / "eap_out.json").write_text(json.dumps(out))


def eap_evaluate_ck(folder: Path) -> None:
    """circuitkit's circuit (``ck_circuit.json``, EAP-IG's edge names) in EAP-IG's evaluator: its edges put on top
    of a ranking, then ``apply_topn`` as for any circuit; writes ``eap_ck.json``."""
    from eap.graph import Graph

    started = time.perf_counter()
    setup = eap_setup(folder)
    graph = Graph.from_model(setup["model"])
    ck_edges = json.loads((folder / "ck_circuit.json").read_text())["edges"]
    missing = [e for e in ck_edges if e not in graph.edges]
    if missing:
        raise SystemExit(f"circuitkit edges with no EAP-IG counterpart: {missing[:5]}")
    graph.scores.zero_()
    for e in ck_edges:
        graph.scores[graph.edges[e].matrix_index] = 1.0
    evaluate_top, _ = eap_evaluator(setup, graph)
    t0 = time.perf_counter()
    value = evaluate_top(len(ck_edges))
    out = {"edges": len(ck_edges), "faithfulness": value, "edges_after_pruning": int(graph.in_graph.sum()),
           "seconds": time.perf_counter() - t0, "clean": setup["info"]["clean"],
           "corrupted": setup["info"]["corrupted"], "process_seconds": time.perf_counter() - started}
    log(f"EAP-IG half: circuitkit's circuit of {len(ck_edges)} edges: faithfulness {value:.4f} in EAP-IG's evaluator")
    (folder / "eap_ck.json").write_text(json.dumps(out))


# ---------------------------------------------------------------------------------------------- circuitkit's half
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="/work/models/qwen")
    parser.add_argument("--eap-python", default="/work/eapvenv/bin/python")
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--json", default="benchmarks/results/eap_ig_official_qwen.json")
    parser.add_argument("--grouped", action="store_true",
                        help="only add circuitkit's circuit on its default grouped graph (the same pairs and points) "
                             "to the JSON of an earlier run, measured in EAP-IG's evaluator too")
    parser.add_argument("--half", choices=("ck", "eap", "eap-eval"), default="ck", help=argparse.SUPPRESS)
    parser.add_argument("--exchange", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.half == "eap":
        eap_half(Path(args.exchange))
        return
    if args.half == "eap-eval":
        eap_evaluate_ck(Path(args.exchange))
        return

    import torch
    from _common import write_json_atomic  # benchmarks/ is on sys.path when a script here runs

    from circuitkit import tasks
    from circuitkit.circuits.curve import faithfulness_of
    from circuitkit.graph.runner import TaskRunner
    from circuitkit.models.adapters import adapt
    from circuitkit.models.loading import load_model
    from circuitkit.tasks.circuit import edge_circuit, mib_areas

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    started = time.perf_counter()
    model = load_model(args.model)
    adapter = adapt(model)
    spec = adapter.spec
    task = tasks.ioi(model, n=args.pairs, seed=0)
    batch = task.tokenize(adapter, None)
    load_seconds = time.perf_counter() - started
    log(f"circuitkit: loaded in {load_seconds:.0f} s; {batch.n_pairs} pairs of up to {batch.pos} tokens")
    out: dict[str, Any] = {
        "model": args.model, "layers": spec.n_layers, "heads": spec.n_heads, "kv_heads": spec.n_kv_heads,
        "task": "ioi", "pairs": batch.n_pairs, "tokens": batch.pos, "seed": 0, "ig_steps": args.steps,
        "target": args.target, "resolution": RESOLUTION, "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "threads": torch.get_num_threads()}
    scratch = Path(tempfile.mkdtemp(prefix="eap_ig_official_"))
    log(f"scratch folder {scratch}")
    pairs = {"clean": batch.clean.cpu(), "corrupted": batch.corrupted.cpu(), "last": batch.last.cpu(),
             "answer": batch.answers[:, 0].cpu(), "wrong": batch.wrongs[:, 0].cpu()}
    if bool((batch.answer_mask.sum(1) != 1).any() or (batch.wrong_mask.sum(1) != 1).any()):
        raise SystemExit("every IOI pair should list one answer and one wrong answer")
    torch.save(pairs, scratch / "pairs.pt")
    (scratch / "request.json").write_text(json.dumps({"model": args.model, "steps": args.steps,
                                                      "target": args.target}))
    out["token_ids"] = {k: v.tolist() for k, v in pairs.items()}
    with torch.no_grad():
        logits = model(batch.clean)
    torch.save(logits.cpu()[batch.real.cpu()].contiguous(), scratch / "ck_logits.pt")
    del logits
    path = Path(args.json)

    def eap(half: str, result: str) -> dict[str, Any]:
        """The EAP-IG half ``half`` in its own environment; its JSON ``result`` with the wall seconds added."""
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        t0 = time.perf_counter()
        done = subprocess.run([args.eap_python, str(Path(__file__).resolve()), "--half", half, "--exchange",
                               str(scratch)], env=env, check=False)
        if done.returncode != 0:
            raise SystemExit(f"the EAP-IG half {half!r} exited with {done.returncode}; what is done is in {path}")
        got = json.loads((scratch / result).read_text())
        got["wall_seconds"] = time.perf_counter() - t0
        return got

    if args.grouped:
        out["grouped"] = grouped_reference(runner_args=(adapter, batch, task), steps=args.steps, target=args.target,
                                           scratch=scratch, eap=eap)
        earlier = json.loads(path.read_text())
        earlier["grouped"] = out["grouped"]
        write_json_atomic(path, earlier)
        print(json.dumps({k: v for k, v in out["grouped"].items() if k != "edges"}, indent=1))
        shutil.rmtree(scratch)
        return

    # EAP-IG first (its scores, circuit, curves), then circuitkit on the same ids, each alone on the cores
    eap_out = eap("eap", "eap_out.json")
    out["eap_ig"] = {k: v for k, v in eap_out.items() if k not in ("edges", "ranked_edges")}
    write_json_atomic(path, out)

    runner = TaskRunner(adapter, batch, task.metric, mlps=True, ablation=task.ablation, kv_edges="per-query-head")
    t0 = time.perf_counter()
    m_clean, m_corr = float(runner.clean["metric"].mean()), float(runner.corrupted["metric"].mean())
    reference_seconds = time.perf_counter() - t0
    graph = runner.graph
    ck: dict[str, Any] = {"clean": m_clean, "corrupted": m_corr, "edges": graph.n_edges,
                          "load_seconds": load_seconds, "reference_seconds": reference_seconds,
                          "clean_per_pair": runner.clean["metric"].tolist(),
                          "corrupted_per_pair": runner.corrupted["metric"].tolist()}
    log(f"circuitkit: metric clean {m_clean:.4f}, corrupted {m_corr:.4f}; {graph.n_edges} edges")
    index = graph.allowed.nonzero()
    edge_names = graph.edge_names(index)
    scores: dict[str, Any] = {}
    for method, steps, points in (("EAP", 1, "right"), ("EAP-IG-inputs", args.steps, "left")):
        t0 = time.perf_counter()
        s, _ = runner.edge_gradients(steps, points)
        ck[f"{method}_seconds"] = time.perf_counter() - t0
        scores[method] = s
        log(f"circuitkit: {method} in {ck[f'{method}_seconds']:.0f} s")

    # scores, edge by edge
    eap_scores = torch.load(scratch / "eap_scores.pt", weights_only=True)
    position = {name: i for i, name in enumerate(eap_scores["names"])}
    mapped = [ck_to_eap(e) for e in edge_names]
    unmatched = [e for e in mapped if e not in position]
    if unmatched or len(mapped) != len(position):
        raise SystemExit(f"graphs differ: {len(mapped)} circuitkit edges, {len(position)} EAP-IG edges, "
                         f"unmatched {unmatched[:5]}")
    order = torch.tensor([position[e] for e in mapped])
    out["scores"] = {}
    for method in ("EAP", "EAP-IG-inputs"):
        out["scores"][method] = compare_scores(scores[method][index[:, 0], index[:, 1]].double(),
                                               eap_scores[method][order].double())
        log(f"scores {method}: {out['scores'][method]}")
    out["circuitkit"] = ck
    write_json_atomic(path, out)

    t0, passes0 = time.perf_counter(), runner.passes
    names, faith, curve, cpr, cmd, _, n_edges, areas = edge_circuit(runner, scores["EAP-IG-inputs"], args.target,
                                                                     "abs")
    ck["circuit"] = {"top_n": len(names), "faithfulness": faith, "cpr": cpr, "cmd": cmd, "mib_areas": areas,
                     "seconds": time.perf_counter() - t0, "passes": runner.passes - passes0,
                     "curve": [p.to_json() for p in curve], "edges": sorted(ck_to_eap(e) for e in names)}
    log(f"circuitkit: circuit of {len(names)} edges, faithfulness {faith:.4f}, CMD {cmd:.4f}, CPR {cpr:.4f}")

    # EAP-IG's circuit in circuitkit's edge pass (as ranked, and as pruned)
    back = {e: i for i, e in enumerate(mapped)}

    def kept_of(edges: list[str]) -> Any:
        mask = torch.zeros_like(graph.allowed)
        rows = index[torch.tensor([back[e] for e in edges])]
        mask[rows[:, 0], rows[:, 1]] = True
        return mask

    t0 = time.perf_counter()
    values = runner.edge_metric(torch.stack([kept_of(eap_out["circuit"]["ranked_edges"]),
                                             kept_of(eap_out["circuit"]["edges"])])).tolist()
    eap_out["circuit"]["in_circuitkit"] = {
        "ranked_faithfulness": faithfulness_of(values[0], m_clean, m_corr),
        "pruned_faithfulness": faithfulness_of(values[1], m_clean, m_corr), "seconds": time.perf_counter() - t0}
    log(f"EAP-IG's circuit in circuitkit's edge pass: {eap_out['circuit']['in_circuitkit']}")
    eap_out["mib_areas"] = mib_areas(eap_out["curves"], eap_out["sizes"])
    eap_out["circuit"]["edges"] = sorted(eap_out["circuit"]["edges"])
    del eap_out["circuit"]["ranked_edges"]
    out["eap_ig"] = eap_out
    write_json_atomic(path, out)

    # circuitkit's circuit in EAP-IG's evaluator
    (scratch / "ck_circuit.json").write_text(json.dumps({"edges": ck["circuit"]["edges"]}))
    ck["circuit"]["in_eap_ig"] = eap("eap-eval", "eap_ck.json")
    out["seconds"] = time.perf_counter() - started
    write_json_atomic(path, out)
    shutil.rmtree(scratch)  # kept where a step failed, to look at
    summary(out)


def expand_grouped(name: str, group: int) -> list[str]:
    """A grouped edge (circuitkit's name) as EAP-IG's edges: an edge into key/value group ``g``'s keys or values
    (``->L.gG:k``) is the edges into those of its ``group`` query heads ``g * group .. (g + 1) * group - 1``."""
    sender, receiver = name.split("->")
    if ".g" not in receiver:
        return [ck_to_eap(name)]
    layer, rest = receiver.split(".g")
    g, channel = rest.split(":")
    return [ck_to_eap(f"{sender}->{layer}.{h}:{channel}") for h in range(int(g) * group, (int(g) + 1) * group)]


def grouped_reference(runner_args: tuple, steps: int, target: float, scratch: Path, eap: Any) -> dict[str, Any]:
    """circuitkit's circuit on its default graph (``kv_edges="grouped"``): EAP-IG's scores at ``steps`` points, the
    edge circuit at ``target``, its size in EAP-IG's edges and its faithfulness in EAP-IG's evaluator."""
    from circuitkit.graph.runner import TaskRunner
    from circuitkit.tasks.circuit import edge_circuit

    adapter, batch, task = runner_args
    group = adapter.spec.n_heads // adapter.spec.n_kv_heads
    runner = TaskRunner(adapter, batch, task.metric, mlps=True, ablation=task.ablation, kv_edges="grouped")
    t0 = time.perf_counter()
    scores, _ = runner.edge_gradients(steps, "left")
    attribution = time.perf_counter() - t0
    t0, passes0 = time.perf_counter(), runner.passes
    names, faith, _, cpr, cmd, _, n_edges, _ = edge_circuit(runner, scores, target, "abs")
    seconds = time.perf_counter() - t0
    expanded = sorted({e for name in names for e in expand_grouped(name, group)})
    log(f"grouped: circuit of {len(names)} edges ({len(expanded)} of EAP-IG's), faithfulness {faith:.4f}")
    (scratch / "ck_circuit.json").write_text(json.dumps({"edges": expanded}))
    return {"edges_total": n_edges, "circuit_edges": len(names), "circuit_eap_ig_edges": len(expanded),
            "faithfulness": faith, "cmd": cmd, "cpr": cpr, "attribution_seconds": attribution,
            "circuit_seconds": seconds, "circuit_passes": runner.passes - passes0,
            "in_eap_ig": eap("eap-eval", "eap_ck.json"), "edges": sorted(names)}


def summary(out: dict[str, Any]) -> None:
    ck, ep = out["circuitkit"], out["eap_ig"]
    print(f"metric clean / corrupted: circuitkit {ck['clean']:.4f} / {ck['corrupted']:.4f}, "
          f"EAP-IG {ep['clean']:.4f} / {ep['corrupted']:.4f}; logits max |diff| {ep['logits_max_abs_difference']:.3g}")
    for method, row in out["scores"].items():
        print(f"{method:16s} scale {row['scale_ck_over_eap']:.4f}  "
              f"max diff/max {row['max_abs_difference_over_max_score']:.3g}  "
              f"spearman {row['spearman']:.5f}  top-100 {row['top100_overlap']}")
    c, e = ck["circuit"], ep["circuit"]
    print(f"circuitkit circuit: top {c['top_n']}, faithfulness {c['faithfulness']:.4f} (EAP-IG's evaluator "
          f"{c['in_eap_ig']['faithfulness']:.4f}), CMD {c['cmd']:.4f}, CPR {c['cpr']:.4f}")
    print(f"EAP-IG circuit:     top {e['top_n']} ({e['edges_after_pruning']} pruned), faithfulness "
          f"{e['faithfulness']:.4f} (circuitkit's edge pass {e['in_circuitkit']['ranked_faithfulness']:.4f}), "
          f"CMD {ep['mib_areas']['cmd']:.4f}, CPR {ep['mib_areas']['cpr']:.4f}")
    if not math.isfinite(c["faithfulness"]):
        print("circuitkit's faithfulness is not finite")


if __name__ == "__main__":
    main()
