"""Edge attribution: equal to exact path patching where the metric is linear in the patched input, the
induction metric ignores V edges, no gradients left on the model, GQA, LayerNorm, and the evidence table."""

from __future__ import annotations

import json
import math

import pytest
import torch

from circuitkit import CircuitkitError, zoo
from circuitkit.circuits import circuit_evidence, edge_attribution, path_patching
from circuitkit.detect import RepeatedTokens
from circuitkit.models import AttentionOnlyModel
from tests.conftest import boot_bridge, random_weights

LINEAR_TOL = 1e-4  # relative: the first-order estimate is exact here, float32 sums over ~10^3 terms differ ~1e-6


def _linear_metric(d_vocab: int):
    readout = torch.randn(d_vocab, generator=torch.Generator().manual_seed(5))

    def metric(logits, batch):
        return (logits @ readout.to(logits.dtype)).mean()

    return metric


MODELS = {
    "toy": lambda: AttentionOnlyModel(random_weights(3, 4, 16, 4, d_vocab=13, seed=1)),
    "toy-gqa": lambda: AttentionOnlyModel(random_weights(3, 4, 16, 4, n_kv_heads=2, d_vocab=13, seed=2)),
    "bridge": lambda: boot_bridge(n_layers=3, normalization_type=None, d_vocab=13),
    "bridge-gqa": lambda: boot_bridge(n_layers=3, normalization_type=None, n_key_value_heads=2, d_vocab=13),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_v_edges_into_the_last_layer_equal_exact_patching_with_a_linear_metric(name):
    model = MODELS[name]()
    metric = _linear_metric(13)
    batch = RepeatedTokens(block_len=5, batch=3, bos=False).build(model)
    attribution = edge_attribution(model, metric=metric, tokens=batch)
    edges = [((l1, h1), (2, h2)) for l1 in range(2) for h1 in range(4) for h2 in range(4)]
    exact = path_patching(model, edges, input="v", metric=metric, tokens=batch)
    got = torch.tensor([attribution.value(e.src, e.dst, "v") for e in exact.edges], dtype=torch.float64)
    scale = exact.effects.abs().max()
    assert scale > 1e-3
    torch.testing.assert_close(got, exact.effects, atol=LINEAR_TOL * float(scale), rtol=0)


def test_layernorm_first_order_agrees_for_small_corruptions():
    """With LayerNorm the estimate is first order: the mean corruption of a nearly constant sender is small."""
    model = boot_bridge(n_layers=2, attn_only=False, normalization_type="LN", d_vocab=13)
    metric = _linear_metric(13)
    batch = RepeatedTokens(block_len=5, batch=3, bos=False).build(model)
    attribution = edge_attribution(model, metric=metric, tokens=batch, corrupt="mean")
    edges = [((0, h1), (1, h2)) for h1 in range(4) for h2 in range(4)]
    exact = path_patching(model, edges, input="v", metric=metric, tokens=batch, corrupt="mean")
    got = torch.tensor([attribution.value(e.src, e.dst, "v") for e in exact.edges], dtype=torch.float64)
    correlation = torch.corrcoef(torch.stack([got, exact.effects]))[0, 1]
    assert correlation > 0.9


@pytest.fixture(scope="module")
def bundled():
    return zoo.load()


def test_bundled_model_k_edges_from_previous_token_heads_rank_first(bundled):
    entry = zoo.info()
    attribution = edge_attribution(bundled, metric="loss")
    top = attribution.top(4)  # first order: beyond the strongest edges the ranking is noisy (0.3 -> 1.1 k is 8th)
    assert {e.channel for e in top} == {"k"}
    assert {e.src for e in top} <= set(entry.previous_token_heads)
    assert {e.dst for e in top} <= set(entry.induction_heads)


def test_induction_metric_gives_v_edges_exactly_zero_and_non_edges_nan(bundled):
    attribution = edge_attribution(bundled, metric="induction")
    assert bool((attribution.channel("v")[0, :, 1] == 0).all())
    assert bool(attribution.scores[1, :, 1].isnan().all()) and bool(attribution.scores[:, :, 0].isnan().all())
    assert attribution.top(1)[0].channel == "k"
    data = attribution.to_json()
    json.dumps(data)
    assert data["scores"][1][0][0][0][0] is None


def test_no_gradients_are_left_on_the_model(bundled):
    flags = [p.requires_grad for p in bundled.parameters()]
    edge_attribution(bundled, metric="loss")
    assert [p.requires_grad for p in bundled.parameters()] == flags
    assert all(p.grad is None for p in bundled.parameters())


def test_gqa_k_attribution_is_per_query_head_and_sums_to_the_group():
    """Per query head, the K gradient parts add up to the group's gradient: the group edge (both heads reading the
    patched keys) equals, to first order, the sum over its query heads."""
    model = MODELS["toy-gqa"]()
    batch = RepeatedTokens(block_len=5, batch=3, bos=False).build(model)
    metric = _linear_metric(13)
    attribution = edge_attribution(model, metric=metric, tokens=batch, corrupt="mean")
    k = attribution.channel("k")
    assert not torch.allclose(k[0, 1, 2, 0], k[0, 1, 2, 1])  # the two query heads of group 0 differ
    exact = path_patching(model, [((0, 1), (2, 0))], input="k", metric=metric, tokens=batch, corrupt="mean")
    assert math.copysign(1, exact.edges[0].effect) == math.copysign(1, float(k[0, 1, 2, 0]))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"metric": "accuracy"}, "metric"), ({"corrupt": "zero"}, "corrupt"), ({"corrupt_seed": -1}, "corrupt_seed"),
     ({"tokens": "abc"}, "tokens")],
)
def test_bad_input_raises_one_clear_error(bundled, kwargs, match):
    with pytest.raises(CircuitkitError, match=match):
        edge_attribution(bundled, **kwargs)


def test_bad_top_and_channel_raise(bundled):
    attribution = edge_attribution(bundled, metric="induction", corrupt="mean")
    with pytest.raises(CircuitkitError, match="k"):
        attribution.top(0)
    with pytest.raises(CircuitkitError, match="channel"):
        attribution.channel("o")


# ---------------------------------------------------------------------------------------------- evidence
def test_circuit_evidence_on_the_bundled_model(bundled):
    evidence = circuit_evidence(bundled, top_k=6, metric="induction")
    entry = zoo.info()
    patched = [r for r in evidence.rows if r.patched is not None]
    assert len(patched) == 6
    best = patched[0]
    assert best.channel == "k" and best.src in entry.previous_token_heads and best.dst in entry.induction_heads
    assert all(r.composition is not None for r in evidence.rows)
    data = evidence.to_json()
    text = json.dumps(data)
    assert "NaN" not in text
    assert set(data["rows"][0]) >= {"src", "dst", "channel", "composition", "attribution", "patched"}


def test_circuit_evidence_flags_a_strong_weight_edge_that_carries_nothing(bundled):
    """Claim (falsely) that a never-used edge has the largest composition: it must come out weight-only."""
    L, H = 2, 4
    composition = torch.full((L, H, L, H, 3), 0.5)
    composition[0, 3, 1, 0, 0] = 1.0  # 0.3 -> 1.0 through Q: the bundled model does not use it
    composition[0, 1, 1, :, 1] = 0.0  # the real K edges from 0.1, claimed weakest in the weights
    evidence = circuit_evidence(bundled, composition, top_k=3, metric="induction", n_patch=3)
    flagged = {r.name for r in evidence.weight_only}
    assert "0.3 -> 1.0 (q)" in flagged
    assert any(r.name.endswith("(k)") for r in evidence.effect_only)


def test_circuit_evidence_bad_composition_raises(bundled):
    with pytest.raises(CircuitkitError, match="composition"):
        circuit_evidence(bundled, torch.zeros(2, 4, 2, 4))
    with pytest.raises(CircuitkitError, match="composition"):
        circuit_evidence(bundled, {"o": torch.zeros(2, 4, 2, 4)})


NORM_VJP_TOL = 1e-5
"""float32 pullbacks over d_model = 32 terms, closed form against autograd: ~5e-7 apart."""


@pytest.mark.parametrize("kind", ["LN", "LNPre", "RMS", "RMSPre", "unknown"])
def test_norm_pullback_equals_autograd(kind):
    """The closed-form LayerNorm / RMSNorm pullback (and the generic batched one for any other norm) equals
    autograd through the norm on an expanded input, cotangent by cotangent."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from circuitkit.circuits.attribution import _norm_vjp

    g = torch.Generator().manual_seed(0)
    if kind.startswith("LN"):
        norm = torch.nn.LayerNorm(32, elementwise_affine=kind == "LN")
    elif kind.startswith("RMS"):
        norm = LlamaRMSNorm(32, eps=1e-6)
    else:
        norm = torch.nn.Tanh()  # any differentiable per-position map: only the generic path applies
    if kind in ("LN", "RMS"):
        norm.weight.data = torch.randn(32, generator=g)
    x = torch.randn(4, 5, 32, generator=g)
    cot = torch.randn(4, 5, 3, 3, 32, generator=g)
    expanded = x[:, :, None, None, :].expand_as(cot).reshape(20, 9, 32).detach().requires_grad_(True)
    (reference,) = torch.autograd.grad(norm(expanded), expanded, grad_outputs=cot.reshape(20, 9, 32))
    got = _norm_vjp(norm, x, cot, None if kind == "unknown" else kind)
    torch.testing.assert_close(got, reference.reshape(4, 5, 3, 3, 32), atol=NORM_VJP_TOL, rtol=NORM_VJP_TOL)
