"""The GPU suite: every public entry point on CUDA equals its CPU run (``pytest -m cuda``).

Each test runs one entry point on a CPU model twice: on the CPU, and with ``device="cuda"`` (the model moved there
for the call, then moved back, as :func:`circuitkit.model_state.place` promises) or on a copy living on the GPU. Both
behaviours are covered: the induction scan (repeated random tokens) and a task of clean/corrupted pairs, in float32
and in bfloat16. Results are compared figure by figure through ``to_json()`` (every number a scan reports), so a
figure that moves on the GPU is named by its path.

Without CUDA the whole module is skipped with the reason; ``tests/test_device_guard.py`` is what a CPU-only machine
runs instead to find mixed-device bugs before they reach a GPU.
"""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch

import circuitkit as ck
from circuitkit import zoo
from circuitkit.circuits import circuit_evidence, edge_attribution, find_circuit, path_patching
from circuitkit.composition import composition_scores
from circuitkit.detect import RepeatedTokens, ablation_effects, attribution_effects, head_scores
from circuitkit.tasks import Task, scan_task
from circuitkit.weights import HeadWeights
from tests.conftest import gqa_bridge
from tests.test_tasks import toy_pairs

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run `pytest -m cuda` on one)"),
]

FLOAT32 = dict(atol=2e-4, rtol=2e-3)
"""CUDA against CPU in float32: the same operations, summed in another order (and cuBLAS kernels), so each figure
moves by float32 rounding amplified through a few layers; 2e-4 absolute leaves room for that on figures of order 1
and still fails any real disagreement (a wrong head, a wrong device's stale weight)."""

HALF = 0.05
"""bfloat16 on CUDA against float32 on the CPU: bfloat16 keeps 8 bits of mantissa (about 4e-3 relative per
rounding), compounded through the layers; figures of the bundled model are of order 1."""

TASK_FLOAT32 = dict(atol=1e-3, rtol=5e-3)
"""Task figures are logit differences of order 1-10 and EAP-IG sums over every position: a little more room."""

IGNORED = ("settings.device",)
"""Paths whose values say where the run was, not what it measured."""


def figures(document, path: str = "") -> dict[str, object]:
    """Every leaf of a JSON document by its dotted path."""
    if isinstance(document, dict):
        return {k: v for key, value in document.items() for k, v in figures(value, f"{path}.{key}".lstrip(".")).items()}
    if isinstance(document, list):
        return {k: v for i, value in enumerate(document) for k, v in figures(value, f"{path}[{i}]").items()}
    return {path: document}


def assert_same_figures(got: dict, want: dict, *, atol: float, rtol: float, skip: tuple[str, ...] = IGNORED) -> int:
    """Every figure of ``want`` is in ``got``, numbers within ``atol + rtol * |want|``, everything else equal; the
    number of figures compared."""
    got, want = figures(got), figures(want)
    assert sorted(got) == sorted(want), sorted(set(got) ^ set(want))[:10]
    bad = []
    for path, expected in want.items():
        if any(path.startswith(s) for s in skip) or "seconds" in path:
            continue
        actual = got[path]
        if isinstance(expected, (int, float)) and not isinstance(expected, bool) and expected is not None:
            if actual is None or abs(actual - expected) > atol + rtol * abs(expected):
                bad.append(f"{path}: cuda {actual!r}, cpu {expected!r}")
        elif actual != expected:
            bad.append(f"{path}: cuda {actual!r}, cpu {expected!r}")
    assert not bad, f"{len(bad)} figures differ:\n" + "\n".join(bad[:20])
    return len(want)


def on_cpu(model) -> bool:
    return all(p.device.type == "cpu" for p in model.parameters())


# ------------------------------------------------------------------------------------------ the induction scan
def test_scan_on_cuda_equals_cpu_and_the_model_goes_back():
    model = zoo.load()
    cpu = ck.scan(model)
    gpu = ck.scan(model, device="cuda")
    assert on_cpu(model) and str(model.cfg.device) == "cpu"  # moved for the call, moved back
    n = assert_same_figures(json.loads(json.dumps(gpu.to_json())), json.loads(json.dumps(cpu.to_json())),
                            **FLOAT32)
    assert n > 500
    for name, values in gpu.head_scores.items():  # results come back on the CPU
        assert values.device.type == "cpu", name


def test_scan_of_a_model_living_on_cuda_equals_cpu():
    model = gqa_bridge()
    cpu = ck.scan(model, stability=2, random_sets=2)
    gpu_model = gqa_bridge().to("cuda")
    gpu = ck.scan(gpu_model, stability=2, random_sets=2)
    assert all(p.device.type == "cuda" for p in gpu_model.parameters())
    assert_same_figures(gpu.to_json(), cpu.to_json(), **FLOAT32)


def test_bfloat16_scan_on_cuda_agrees_with_float32():
    reference = ck.scan(zoo.load())
    half = ck.scan(zoo.load().to(torch.bfloat16), device="cuda")
    assert half.induction_heads == reference.induction_heads
    for name, values in reference.head_scores.items():
        torch.testing.assert_close(half.head_scores[name].float(), values.float(), atol=HALF, rtol=0)


# ------------------------------------------------------------------------------------------------ a pair task
def test_task_scan_on_cuda_equals_cpu():
    task = Task.from_pairs(toy_pairs(8), name="toy")
    model = gqa_bridge()
    cpu = scan_task(model, task)
    gpu = scan_task(model, task, device="cuda")
    assert on_cpu(model)
    assert gpu.circuit is not None and cpu.circuit is not None
    assert gpu.circuit.heads == cpu.circuit.heads
    assert_same_figures(gpu.to_json(), cpu.to_json(), **TASK_FLOAT32)


def test_task_scan_through_scan_on_cuda_and_in_bfloat16():
    task = Task.from_pairs(toy_pairs(8), name="toy")
    cpu = ck.scan(gqa_bridge(), task=task)
    gpu = ck.scan(gqa_bridge().to("cuda"), task=task)
    assert_same_figures(gpu.to_json(), cpu.to_json(), **TASK_FLOAT32)
    half = ck.scan(gqa_bridge().to(torch.bfloat16), task=task, device="cuda")
    assert half.circuit is not None
    gap = float(cpu.clean.mean() - cpu.corrupted.mean())
    assert abs(float(half.clean.mean() - half.corrupted.mean()) - gap) <= HALF * max(1.0, abs(gap)) * 4


def test_the_induction_task_on_cuda_equals_cpu_and_runs_in_bfloat16():
    from circuitkit.tasks import repeated_tokens

    model = zoo.load()
    task = repeated_tokens(model, 8)
    cpu = scan_task(model, task)
    gpu = scan_task(model, task, device="cuda")
    assert on_cpu(model)
    assert gpu.circuit is not None and gpu.circuit.heads == cpu.circuit.heads
    assert_same_figures(gpu.to_json(), cpu.to_json(), **TASK_FLOAT32)
    half = ck.scan(zoo.load().to(torch.bfloat16), task=task, device="cuda")
    assert half.circuit is not None
    gap = float(cpu.clean.mean() - cpu.corrupted.mean())
    assert abs(float(half.clean.mean() - half.corrupted.mean()) - gap) <= HALF * max(1.0, abs(gap)) * 4


def test_named_task_edges_on_cuda_equal_cpu():
    """``ck.tasks.edge_effects``: the one edge pass on CUDA, into every receiver type and with per-query-head
    key/value receivers (the group's other query heads' clean z put back), against the CPU."""
    task = Task.from_pairs(toy_pairs(8), name="toy")
    model = gqa_bridge()
    for kv, edges in (("grouped", ["input->1.g0:k", "0.1->m0", "0.2->2.3:q", "m1->logits", "1.0->logits"]),
                      ("per-query-head", ["input->1.1:k", "0.3->2.2:v"])):
        cpu = ck.tasks.edge_effects(model, task, edges, kv_edges=kv)
        gpu = ck.tasks.edge_effects(model, task, edges, kv_edges=kv, device="cuda")
        torch.testing.assert_close(torch.tensor([e.effect for e in gpu]), torch.tensor([e.effect for e in cpu]),
                                   **FLOAT32)
        torch.testing.assert_close(torch.tensor([e.interval for e in gpu]), torch.tensor([e.interval for e in cpu]),
                                   **FLOAT32)
    assert on_cpu(model)


# ------------------------------------------------------------------------------------- the measurements alone
def test_head_measurements_on_cuda_equal_cpu():
    model = gqa_bridge()
    batch = RepeatedTokens(block_len=6, batch=4, bos=False).build(model)
    want = head_scores(model, batch)
    got = head_scores(model, batch, device="cuda")
    for name in want:
        torch.testing.assert_close(got[name].cpu(), want[name].cpu(), **FLOAT32, equal_nan=True)
    for path in ("inputs", "layer"):
        cpu = attribution_effects(model, batch, steps=3, path=path).effect
        gpu = attribution_effects(model, batch, steps=3, path=path, device="cuda").effect
        torch.testing.assert_close(gpu.cpu(), cpu, **FLOAT32)
    cpu = ablation_effects(model, batch).effect
    gpu = ablation_effects(model, batch, device="cuda").effect
    torch.testing.assert_close(gpu.cpu(), cpu, **FLOAT32, equal_nan=True)
    assert on_cpu(model)


def test_edge_measurements_on_cuda_equal_cpu():
    model = gqa_bridge()
    batch = RepeatedTokens(block_len=6, batch=2, bos=False).build(model)
    cpu = circuit_evidence(model, tokens=batch, top_k=4)
    gpu = circuit_evidence(model, tokens=batch, top_k=4, device="cuda")
    scale = float(cpu.attribution.scores.nan_to_num().abs().max())
    torch.testing.assert_close(gpu.attribution.scores, cpu.attribution.scores, equal_nan=True,
                               atol=1e-4 * scale, rtol=1e-3)
    assert [e.name for e in gpu.patching.edges] == [e.name for e in cpu.patching.edges]
    torch.testing.assert_close(gpu.patching.effects, cpu.patching.effects, **FLOAT32)
    edges = [(e.src, e.dst, e.channel) for e in cpu.patching.edges]
    alone = path_patching(model, edges, tokens=batch, device="cuda")
    torch.testing.assert_close(alone.effects, cpu.patching.effects, **FLOAT32)
    for got, want in zip(alone.edges, cpu.patching.edges, strict=True):  # each sequence's effect and its interval
        torch.testing.assert_close(got.each.cpu(), want.each.cpu(), **FLOAT32)
        torch.testing.assert_close(torch.tensor(got.interval), torch.tensor(want.interval), **FLOAT32)
    # 8 points: the interior ones run as stacked copies of the batch in one pass
    cpu_ig = edge_attribution(model, tokens=batch, steps=8).scores
    gpu_ig = edge_attribution(model, tokens=batch, steps=8, device="cuda").scores
    torch.testing.assert_close(gpu_ig, cpu_ig, atol=1e-4 * float(cpu_ig.nan_to_num().abs().max()), rtol=1e-3,
                               equal_nan=True)
    assert on_cpu(model)


def test_circuit_search_on_cuda_equals_cpu():
    model = zoo.load()
    cpu = find_circuit(model, target=0.8)
    gpu = find_circuit(model, target=0.8, device="cuda")
    assert gpu.heads == cpu.heads
    assert math.isclose(gpu.faithfulness, cpu.faithfulness, abs_tol=FLOAT32["atol"])


def test_composition_on_cuda_equals_cpu():
    weights = HeadWeights.from_model(gqa_bridge())
    for mode in ("Q", "K", "V"):
        cpu = composition_scores(weights, mode)
        gpu = composition_scores(weights.to("cuda"), mode)
        assert gpu.device.type == "cuda"  # tensor functions follow their input, as torch's own do
        torch.testing.assert_close(gpu.cpu(), cpu, atol=1e-5, rtol=1e-4, equal_nan=True)


# ---------------------------------------------------------------------------------------- the command line
def test_cli_scan_on_cuda_writes_the_cpu_figures(tmp_path):
    from circuitkit.cli import main

    assert main(["scan", "--out", str(tmp_path / "cpu"), "--json"]) == 0
    assert main(["scan", "--out", str(tmp_path / "gpu"), "--device", "cuda", "--json"]) == 0
    cpu = json.loads((tmp_path / "cpu" / "scores.json").read_text())
    gpu = json.loads((tmp_path / "gpu" / "scores.json").read_text())
    assert_same_figures(gpu, cpu, **FLOAT32)
    assert main(["scan", "--out", str(tmp_path / "half"), "--device", "cuda", "--dtype", "bfloat16", "--json"]) == 0
    half = json.loads((tmp_path / "half" / "scores.json").read_text())
    assert half["circuit"]["heads"] == cpu["circuit"]["heads"]


def test_a_batch_that_cannot_fit_is_refused_in_one_line_with_one_that_fits():
    from circuitkit.memory import check_memory

    free, _ = torch.cuda.mem_get_info()
    model = gqa_bridge().to("cuda")
    with pytest.raises(ck.CircuitkitError) as error:  # far more sequences than the card holds
        check_memory(model, batch=10**9, block_len=20, device="cuda")
    message = str(error.value)
    assert "\n" not in message and "batch" in message, message
    print(f"free {free / 2**30:.1f} GiB: {message}", file=sys.stderr)


# ------------------------------------------------------------------------- circuitkit's own Llama-style decoder
def test_the_decoder_on_cuda_equals_cpu_in_the_cli_and_in_bfloat16(tmp_path):
    """``circuitkit scan DIR`` of a Llama directory runs circuitkit's decoder (no transformers): the same figures on
    CUDA as on the CPU, and bfloat16 on CUDA finds the same heads' scores within the half-precision tolerance."""
    from circuitkit.cli import main
    from tests.test_decoder_model import _save

    _save(tmp_path / "model", "llama")
    common = ["scan", str(tmp_path / "model"), "--batch", "8", "--block-len", "8", "--json"]
    assert main([*common, "--out", str(tmp_path / "cpu")]) == 0
    assert main([*common, "--out", str(tmp_path / "gpu"), "--device", "cuda"]) == 0
    cpu = json.loads((tmp_path / "cpu" / "scores.json").read_text())
    gpu = json.loads((tmp_path / "gpu" / "scores.json").read_text())
    assert gpu["model"]["family"] == "Llama (circuitkit decoder)"
    # random weights copy nothing: the circuit search stops with a message that quotes rounded losses
    assert (gpu["circuit_error"] is None) == (cpu["circuit_error"] is None)
    assert_same_figures(gpu, cpu, **FLOAT32, skip=(*IGNORED, "circuit_error"))
    model = ck.models.load_model(str(tmp_path / "model"), bridge=False, dtype="bfloat16", device="cuda")
    half = ck.scan(model, tokens=RepeatedTokens(block_len=8, batch=8))
    full = ck.scan(str(tmp_path / "model"), tokens=RepeatedTokens(block_len=8, batch=8))
    for name, values in full.head_scores.items():
        torch.testing.assert_close(half.head_scores[name].float(), values.float(), atol=HALF, rtol=0)
