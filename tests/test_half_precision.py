"""A half-precision (float16 / bfloat16) model scans, stage by stage, like its float32 self: DESIGN computes
half-precision weights in float32, so the activations a stage mixes with the float32 weights are brought up
first (path patching's sender difference ``(z_corrupt - z) @ W_O`` used to mix the two and raise)."""

from __future__ import annotations

import pytest
import torch

import circuitkit as ck
from circuitkit import zoo

HALF_TOLERANCE = 0.02
"""Absolute agreement, in nats or score units, of a half-precision scan with the float32 scan of the same
bundled model: bfloat16 keeps 8 bits of mantissa (relative error about 4e-3 per rounding), and the bundled
model's largest effects are about 1.3 nats."""

DTYPES = [torch.float16, torch.bfloat16]


@pytest.fixture(scope="module")
def reference():
    return ck.scan(zoo.load())


@pytest.fixture(scope="module", params=DTYPES, ids=["float16", "bfloat16"])
def half_scan(request):
    model = zoo.load().to(request.param)
    result = ck.scan(model)
    return request.param, model, result


def test_scores_stage_agrees_with_float32(half_scan, reference):
    _, _, result = half_scan
    for name, values in reference.head_scores.items():
        torch.testing.assert_close(result.head_scores[name].float(), values.float(), atol=HALF_TOLERANCE, rtol=0)
    torch.testing.assert_close(result.attribution.effect, reference.attribution.effect, atol=HALF_TOLERANCE, rtol=0)
    assert result.induction_heads == reference.induction_heads
    assert result.previous_token_heads == reference.previous_token_heads


def test_ablate_stage_agrees_with_float32(half_scan, reference):
    _, _, result = half_scan
    torch.testing.assert_close(result.ablation.effect, reference.ablation.effect, atol=HALF_TOLERANCE, rtol=0)


def test_circuit_stage_finds_the_float32_circuit(half_scan, reference):
    _, _, result = half_scan
    assert result.verified is not None, result.verified_error
    assert set(result.verified.heads) == set(reference.verified.heads)


def test_edges_stage_path_patches_like_float32(half_scan, reference):
    _, _, result = half_scan
    half = {(e.src, e.dst, e.channel): e for e in result.circuit.rows}
    full = {(e.src, e.dst, e.channel): e for e in reference.circuit.rows}
    assert half.keys() == full.keys()
    patched = [key for key, e in full.items() if e.patched is not None]
    assert patched, "the float32 scan path-patched no edge"
    for key in patched:
        assert half[key].patched is not None
        assert abs(half[key].patched - full[key].patched) < HALF_TOLERANCE, key


def test_the_model_keeps_its_half_precision(half_scan):
    dtype, model, _ = half_scan
    assert {p.dtype for p in model.parameters()} == {dtype}


@pytest.mark.parametrize("dtype", DTYPES, ids=["float16", "bfloat16"])
def test_path_patching_of_a_half_precision_model(dtype):
    from circuitkit.circuits import path_patching

    full = path_patching(zoo.load(), [((0, 1), (1, 3), "k")])
    half = path_patching(zoo.load().to(dtype), [((0, 1), (1, 3), "k")])
    assert abs(half.edges[0].effect - full.edges[0].effect) < HALF_TOLERANCE
    assert abs(full.edges[0].effect) > 0.05  # the edge carries something to compare
