"""The task graph's figures do not move when its construction changes: every number a pair-task scan reports on two
tiny models with MLPs (multi-head with MLP nodes; grouped-query with heads only), equal to the figures recorded
before the graph's node types became data (``golden_task_graph.json``, written by this module run as a script).

Equality is exact (to the nine significant digits ``scores.json`` keeps) on a machine that rounds float32 as the
recording machine did: the rebuilt graph must run the same operations in the same order, not only close ones.
Processors differ in how their float32 kernels sum (vector width, blocking), so the same code gives figures a few
units in the seventh digit apart on another processor; the recording names its machine by :func:`float_fingerprint`
and elsewhere every figure must agree to :data:`REL` (relative) or :data:`ABS` (absolute), every count, name and
flag exactly."""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path

import pytest
import torch

GOLDEN = Path(__file__).with_name("golden_task_graph.json")
CASES = {"mha-mlp-nodes": dict(kv=None, mlp_nodes=True), "gqa-heads": dict(kv=2, mlp_nodes=False)}
REL, ABS = 1e-3, 1e-5
"""Agreement on a machine that rounds otherwise: measured between two processors on the same code, the figures
differ by at most 1.9e-4 relative (a bootstrap interval's end, where a replicate moves past another) or 3.2e-6
absolute (a faithfulness near 0)."""


def _model(case: str):
    from tests.conftest import boot_bridge

    return boot_bridge(attn_only=False, n_layers=3, n_key_value_heads=CASES[case]["kv"], d_vocab=50, seed=3)


def figures(case: str) -> dict:
    """The scan's ``scores.json`` figures on ``case`` (the timings and the model summary left out)."""
    from circuitkit.models.adapters import adapt
    from circuitkit.tasks import Task, scan_task
    from tests.test_tasks import toy_pairs

    task = Task.from_pairs(toy_pairs(12), name="toy")
    scan = scan_task(adapt(_model(case)), task, mlp_nodes=CASES[case]["mlp_nodes"], target=0.8, n_resamples=200)
    data = scan.to_json()
    data.pop("model")
    data.pop("settings")  # the options as given (a new option adds a key); the figures are what is pinned
    data.pop("units")  # words about the figures (a loaded scan writes this version's), not figures
    for stage in data["stages"]:
        stage.pop("seconds")
    return json.loads(json.dumps(data))


def float_fingerprint() -> str:
    """How this machine rounds the scans' float32 arithmetic: a hash of both models' logits and gradients on fixed
    tokens and of matrix products of the runner's kinds of shape (odd sizes, batched, einsum)."""
    digest = hashlib.sha256()
    tokens = torch.arange(2 * 17).remainder(50).view(2, 17)
    for case in sorted(CASES):
        model = _model(case)
        logits = model(tokens)
        params = [p for p in model.parameters() if p.requires_grad]
        grads = torch.autograd.grad(logits.log_softmax(-1)[..., 0].sum(), params, allow_unused=True)
        for t in (logits, *(g for g in grads if g is not None)):
            digest.update(t.detach().float().contiguous().numpy().tobytes())
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(7, 13, 97, generator=gen), torch.randn(97, 33, generator=gen)
    for t in (a @ b, torch.einsum("bpm,mh->hb", a, b), (a @ b).softmax(-1), torch.nn.functional.layer_norm(a, (97,))):
        digest.update(t.contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def _agree(got, want, path: str, loose: bool, wrong: list[str]) -> None:
    if isinstance(want, dict) and isinstance(got, dict) and got.keys() == want.keys():
        for key in want:
            _agree(got[key], want[key], f"{path}/{key}", loose, wrong)
    elif isinstance(want, list) and isinstance(got, list) and len(got) == len(want):
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _agree(g, w, f"{path}[{i}]", loose, wrong)
    elif loose and isinstance(want, float) and isinstance(got, float):
        if not math.isclose(got, want, rel_tol=REL, abs_tol=ABS):
            wrong.append(f"{path}: {got!r}, recorded {want!r}")
    elif got != want or type(got) is not type(want):
        wrong.append(f"{path}: {str(got)[:120]}, recorded {str(want)[:120]}")


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_figure_equals_the_recorded_one(case):
    golden = json.loads(GOLDEN.read_text())
    exact = golden["machine"] == float_fingerprint()
    wrong: list[str] = []
    _agree(figures(case), golden["cases"][case], "", not exact, wrong)
    assert not wrong, f"{len(wrong)} figures moved ({'exact' if exact else 'to the tolerances'}): " + "; ".join(
        wrong[:12])


def test_the_comparison_on_another_machine_still_catches_a_moved_figure():
    """The loose comparison is a check: a figure 0.2% off, a count off by one, an edge renamed each fail it."""
    want = {"faithfulness": 0.8, "passes": 12, "edges": ["0.1->logits"], "ci": [0.7, 0.9]}
    for moved in ({"faithfulness": 0.8016}, {"passes": 13}, {"edges": ["0.2->logits"]}, {"ci": [0.7, 0.92]},
                  {"passes": 12.0}):
        wrong: list[str] = []
        _agree({**want, **moved}, want, "", True, wrong)
        assert len(wrong) == 1, moved
    wrong = []
    _agree({**want, "faithfulness": 0.8 + 1e-7}, want, "", True, wrong)
    assert wrong == []
    _agree({**want, "faithfulness": 0.8 + 1e-7}, want, "", False, wrong)
    assert len(wrong) == 1


if __name__ == "__main__":  # record the figures (only where the graph is meant to change them)
    GOLDEN.write_text(json.dumps({"machine": float_fingerprint(),
                                  "cases": {case: figures(case) for case in sorted(CASES)}},
                                 indent=1, sort_keys=True) + "\n")
    sys.exit(0)
