"""Mixed-device bugs, found on a machine without a GPU.

Two rules make circuitkit run on a GPU as it runs on the CPU, and both are checked here, where CI runs:

1. **Every tensor circuitkit makes names its device.** :class:`tests.device_guard.DeviceGuard` records every tensor
   constructor called from circuitkit's source without ``device=``; each public entry point runs under it, on both
   behaviours (the induction scan and a pair task), in float32 and bfloat16, and must record none. A constructor
   without a device makes a CPU tensor, which on a GPU meets CUDA tensors and raises: the bug the first GPU run
   found in the bootstrap's intervals. The tests below put such a constructor back into the code and see the guard
   name it.
2. **``device=`` moves the model there for the call.** A CPU model given ``device="cuda"`` used to keep its weights
   on the CPU while its tokens moved (edge attribution, IG attribution, the task graph's ``W_O``). Here, with CUDA
   made to look available and the move intercepted, every entry point must ask to move the model before it runs a
   pass; put the old behaviour back (no move) and the test fails.
"""

from __future__ import annotations

import inspect
import sys
import textwrap

import pytest
import torch

import circuitkit as ck
from circuitkit import zoo
from circuitkit.circuits import circuit_evidence, edge_attribution, find_circuit, path_patching
from circuitkit.detect import RepeatedTokens, ablation_effects, attribution_effects, head_scores
from circuitkit.detect.tokens import TokenBatch
from circuitkit.tasks import Task, UserMetric, repeated_tokens, scan_task
from tests.conftest import gqa_bridge
from tests.device_guard import DeviceGuard
from tests.test_tasks import toy_pairs

EDGES = ["input->1.g0:k", "0.1->m0", "0.2->2.3:q", "m1->logits", "1.0->logits"]
"""Task edges into every receiver type of the GQA bridge (a key/value group, an MLP, a query, the logits)."""
PER_QUERY_HEAD_EDGES = ["input->1.1:k", "0.3->2.2:v", "1.0->logits"]
"""With per-query-head key/value receivers: one query head's own key and value (its group's others put back)."""


def batch_for(model):
    return RepeatedTokens(block_len=6, batch=3, bos=False).build(model)


def _every_position(logits, batch):
    """A metric of every position: the answer's mean log-probability over each prompt's real positions."""
    picked = logits.log_softmax(-1).gather(-1, batch.answers[:, None, :1].expand(-1, logits.shape[1], 1))[..., 0]
    return (picked * batch.real).sum(-1) / batch.real.sum(-1)


def _local_attribution(model):
    """The task runner's EAP-IG of each receiver's own induction score (``attribute(local=...)``)."""
    from circuitkit.circuits.metrics import InductionReader
    from circuitkit.graph.runner import TaskRunner
    from circuitkit.models.adapters import adapt

    adapter = adapt(model)
    task = repeated_tokens(model, 4, block_len=6)
    runner = TaskRunner(adapter, task.tokenize(adapter), task.metric, mlps=False, ablation=task.ablation)
    tokens = runner.batch.clean
    return runner.attribute(2, "right", local=InductionReader(TokenBatch(tokens, 6, 2, None), torch.float32))


ENTRY_POINTS = {
    "scan": lambda m: ck.scan(m, stability=2, random_sets=2),
    "scan-task": lambda m: ck.scan(m, task=Task.from_pairs(toy_pairs(6), name="toy")),
    "scan_task-no-mlps": lambda m: scan_task(m, Task.from_pairs(toy_pairs(6), name="toy"), mlps=False),
    "scan-induction-task": lambda m: ck.scan(m, task=repeated_tokens(m, 4, block_len=6)),
    "head_scores": lambda m: head_scores(m, batch_for(m)),
    "attribution-ig": lambda m: [attribution_effects(m, batch_for(m), steps=2, path=p) for p in ("inputs", "layer")],
    "ablation": lambda m: ablation_effects(m, batch_for(m)),
    "attribution-atp*": lambda m: attribution_effects(m, batch_for(m), estimator="atp*"),
    "find_circuit": lambda m: find_circuit(m, batch_for(m), stability=2, random_sets=2),
    "searches": lambda m: [scan_task(m, Task.from_pairs(toy_pairs(6), name="toy"), edges=False, search=s,
                                     search_options={"steps": 2} if s == "masks" else None)
                           for s in ("refined", "masks")] + [find_circuit(m, batch_for(m), search="masks",
                                                                          search_options={"steps": 2})],
    "circuit_evidence": lambda m: circuit_evidence(m, tokens=batch_for(m), top_k=3),
    "edge_attribution": lambda m: edge_attribution(m, tokens=batch_for(m), steps=2),
    "inputs-path-mean": lambda m: [edge_attribution(m, tokens=batch_for(m), steps=2, corrupt="mean"),
                                   attribution_effects(m, batch_for(m), steps=2, path="inputs", corrupt="mean")],
    "scan-task-every-position": lambda m: ck.scan(m, task=Task.from_pairs(toy_pairs(6), name="toy"), edges=False,
                                                  metric=UserMetric(_every_position, reads="all")),
    "attribute-local": lambda m: _local_attribution(m),
    "path_patching": lambda m: path_patching(m, [((0, 0), (1, 0), "k"), ((0, 1), (2, 1), "v")], tokens=batch_for(m)),
    "edge_effects": lambda m: [ck.tasks.edge_effects(m, Task.from_pairs(toy_pairs(6), name="toy"), edges, kv_edges=kv)
                               for kv, edges in (("grouped", EDGES), ("per-query-head", PER_QUERY_HEAD_EDGES))],
}


HALF_ENTRIES = ("scan", "scan-task", "scan-induction-task", "circuit_evidence", "edge_effects")
"""bfloat16 takes the paths that bring activations up to float32: the two behaviours and the edge measurements."""


@pytest.mark.parametrize(("entry", "dtype"), [(e, torch.float32) for e in sorted(ENTRY_POINTS)]
                         + [(e, torch.bfloat16) for e in HALF_ENTRIES],
                         ids=[*sorted(ENTRY_POINTS), *(f"{e}-bfloat16" for e in HALF_ENTRIES)])
def test_every_entry_point_names_the_device_of_every_tensor_it_makes(entry, dtype):
    model = gqa_bridge(dtype)
    guard = DeviceGuard()
    with guard:
        ENTRY_POINTS[entry](model)
    guard.check()


def test_the_bundled_scan_and_the_cli_name_every_device(tmp_path):
    from circuitkit.cli import main

    guard = DeviceGuard()
    with guard:
        ck.scan(zoo.load())
        assert main(["scan", "--out", str(tmp_path), "--json"]) == 0
    guard.check()


def test_the_decoder_scan_of_a_directory_names_every_device(tmp_path):
    """circuitkit's own Llama decoder (the CLI's model for such a directory): loading, every pass, the files."""
    from circuitkit.cli import main
    from tests.test_decoder_model import _save

    _save(tmp_path / "model", "llama")
    guard = DeviceGuard()
    with guard:
        assert main(["scan", str(tmp_path / "model"), "--out", str(tmp_path / "out"), "--batch", "4",
                     "--block-len", "6", "--json"]) == 0
    guard.check()


# ---------------------------------------------------------------- the guard catches each bug when put back
def reintroduce(monkeypatch, owner, function_name: str, old: str, new: str) -> None:
    """Replace ``owner.function_name`` (a module's function or a class's method) by its own source with ``old`` ->
    ``new``, compiled under its module's file name (so the guard sees circuitkit's file, as it would see the bug in
    the code)."""
    function = getattr(owner, function_name)
    module = sys.modules[function.__module__]
    source = textwrap.dedent(inspect.getsource(function))
    assert old in source, f"{function_name} no longer contains {old!r}: update this test"
    namespace = dict(module.__dict__)
    exec(compile(source.replace(old, new), module.__file__, "exec"), namespace)  # noqa: S102
    monkeypatch.setattr(owner, function_name, namespace[function_name])


def test_the_guard_names_the_bootstraps_cpu_tensor_put_back(monkeypatch):
    """The first GPU run's crash: an interval stacked a CPU tensor made without a device with CUDA values."""
    from circuitkit import scan_intervals

    reintroduce(monkeypatch, scan_intervals, "effect_intervals",
                'lo = torch.full(measured.shape, float("nan"), dtype=torch.float64, device="cpu")',
                'lo = torch.full(measured.shape, float("nan"), dtype=torch.float64)')
    guard = DeviceGuard()
    with guard:
        ck.scan(zoo.load())
    with pytest.raises(AssertionError, match=r"scan_intervals\.py:\d+ calls torch\.full without device="):
        guard.check()


def test_the_guard_names_the_task_graphs_cpu_tensor_put_back(monkeypatch):
    """A tensor the task engine makes beside the model's activations, put back without its device."""
    from circuitkit.graph import runner as graph

    reintroduce(monkeypatch, graph.TaskRunner, "_pulled_back",
                "return grad.float().reshape(steps, -1).sum(0).reshape(1, -1)",
                "return grad.float().reshape(steps, -1).sum(0).reshape(1, -1) + torch.zeros(1)")
    guard = DeviceGuard()
    with guard:
        scan_task(gqa_bridge(), Task.from_pairs(toy_pairs(6), name="toy"), edges=True)
    with pytest.raises(AssertionError, match=r"graph/runner\.py:\d+ calls torch\.zeros without device="):
        guard.check()


# ------------------------------------------------------------------------ device= moves the model for the call
class Moved(Exception):
    """Raised instead of moving the model: the entry point asked for the move before any pass."""


@pytest.fixture
def cuda_looks_available(monkeypatch):
    """``device="cuda"`` passes validation on this CPU-only machine; moving a module raises :class:`Moved`."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)

    def refuse(self, *args, **kwargs):
        target = kwargs.get("device", args[0] if args else None)
        raise Moved(str(target))

    monkeypatch.setattr(torch.nn.Module, "to", refuse)
    from transformer_lens.model_bridge import TransformerBridge

    monkeypatch.setattr(TransformerBridge, "to", refuse)


MOVING = {
    "scan": lambda m: ck.scan(m, device="cuda"),
    "scan-task": lambda m: ck.scan(m, task=Task.from_pairs(toy_pairs(6), name="toy"), device="cuda"),
    "scan_task": lambda m: scan_task(m, Task.from_pairs(toy_pairs(6), name="toy"), device="cuda"),
    "head_scores": lambda m: head_scores(m, device="cuda"),
    "attribution": lambda m: attribution_effects(m, steps=2, device="cuda"),
    "ablation": lambda m: ablation_effects(m, device="cuda"),
    "find_circuit": lambda m: find_circuit(m, device="cuda"),
    "circuit_evidence": lambda m: circuit_evidence(m, device="cuda"),
    "edge_attribution": lambda m: edge_attribution(m, device="cuda"),
    "path_patching": lambda m: path_patching(m, [((0, 0), (1, 0), "k")], device="cuda"),
    "edge_effects": lambda m: ck.tasks.edge_effects(m, Task.from_pairs(toy_pairs(6), name="toy"), EDGES,
                                                    device="cuda"),
}


@pytest.mark.parametrize("entry", sorted(MOVING))
def test_device_moves_a_cpu_model_before_any_pass(entry, cuda_looks_available):
    model = gqa_bridge()
    with pytest.raises(Moved, match="cuda:0"):
        MOVING[entry](model)
    assert all(p.device.type == "cpu" for p in model.parameters())


def test_the_model_goes_back_with_its_config_after_the_call():
    """The way back: :func:`circuitkit.model_state.caller_state` restores ``cfg.device`` too, which
    ``TransformerBridge.to()`` rewrites when it moves a model (and TransformerLens reads to place its tensors)."""
    from circuitkit.model_state import caller_state

    model = gqa_bridge()
    with caller_state(model):
        model.cfg.device = "cuda:0"
    assert str(model.cfg.device) == "cpu"


def test_buffers_moved_by_module_to_are_put_back_in_their_slots():
    """``Module.to()`` moves a parameter in place but gives each buffer a new tensor (the first GPU run left a
    bridge's causal masks on CUDA after a call with ``device="cuda"``). Simulated here by what ``.to()`` does to a
    slot, with the meta device standing in for another device."""
    from circuitkit.model_state import caller_state

    model = gqa_bridge()
    slots = [(m, name, buffer) for m in model.modules() for name, buffer in m._buffers.items() if buffer is not None]
    assert slots, "the model has buffers (the causal masks)"
    with caller_state(model):
        for m, name, buffer in slots:
            m._buffers[name] = buffer.to("meta")
    for m, name, buffer in slots:
        assert m._buffers[name] is buffer and buffer.device.type == "cpu"
    batch = batch_for(model)
    head_scores(model, batch)  # runs: no mask left elsewhere


def test_a_model_spread_over_devices_is_refused_in_one_line():
    from types import SimpleNamespace

    from circuitkit.model_state import place

    class Spread(torch.nn.Module):  # a model placed by a device map: its weights on two devices
        def parameters(self, recurse: bool = True):
            return iter([SimpleNamespace(device=torch.device("cpu")), SimpleNamespace(device=torch.device("meta"))])

        def buffers(self, recurse: bool = True):
            return iter([])

    with pytest.raises(ck.CircuitkitError, match="spread over cpu, meta") as error:
        place(Spread(), torch.device("cpu"), "scan")
    assert "\n" not in str(error.value)
