"""AtP* (QK fix, GradDrop) for heads: the QK fix equal to the pattern change computed by hand times the pattern's
gradient (and closer to exact ablation than first order where a softmax saturates), GradDrop equal to first order
on one layer and to the direct path's estimate where it drops the only later layer, on the toy model and a
TransformerBridge; every estimate finite; bad options one clear error each."""

from __future__ import annotations

import pytest
import torch

from circuitkit import CircuitkitError, HeadWeights
from circuitkit.detect import RepeatedTokens, ablation_effects, attribution_effects
from circuitkit.detect.atp import ATP_ESTIMATORS, atp_effects, atp_estimates
from circuitkit.models import AttentionOnlyModel
from circuitkit.models.adapters import HOOKS, adapt
from tests.conftest import boot_bridge, gqa_bridge, random_weights

TOKENS = RepeatedTokens(block_len=6, batch=4, seed=1)

ORACLE_TOL = 1e-5
"""The oracles run the float64 toy model in float64; circuitkit's loss is float32 (token_losses casts the logits), so
its gradients carry ~1e-7 relative error: 1e-5 of the effect's scale fails any wrong term, sign or head."""

BRIDGE_TOL = 1e-4
"""float32 TransformerBridge (LayerNorm, MLPs) against autograd through the same model: sums of ~10^3 float32 terms
differ by ~1e-6 relative; 1e-4 as the other bridge attribution tests."""


def toy(n_layers=2, n_heads=4, *, seed=0, blind=None, gain=1.0):
    """A float64 attention-only model with sharp attention (x3 on Q, K). ``blind=(layer, head)``: that head's
    output is made invisible to every later value input and to the unembedding (both projected off the row space
    of its ``W_O``), so its ablation acts on the loss only through later layers' queries and keys; its ``W_O``
    times ``gain``."""
    w = random_weights(n_layers, n_heads, d_model=16, d_head=4, d_vocab=20, seed=seed, dtype=torch.float64)
    W_V, W_U, W_O = w.W_V.clone(), w.W_U * 4, w.W_O.clone()
    if blind is not None:
        layer, head = blind
        W_O[layer, head] *= gain
        basis, _ = torch.linalg.qr(w.W_O[layer, head].T)  # [d_model, d_head]: the head's write space
        off = torch.eye(16, dtype=torch.float64) - basis @ basis.T
        W_V[layer + 1 :] = torch.einsum("mn,lgnd->lgmd", off, W_V[layer + 1 :])
        W_U = off @ W_U
    w = HeadWeights(W_Q=w.W_Q * 3, W_K=w.W_K * 3, W_V=W_V, W_O=W_O, W_E=w.W_E, W_U=W_U)
    return AttentionOnlyModel(w, n_ctx=32)


def repeated_ce(logits, batch):
    logprobs = logits[:, :-1].double().log_softmax(-1)
    ce = -logprobs.gather(-1, batch.tokens[:, 1:, None])[..., 0]
    return ce[:, batch.repeated_copies].mean()


def manual_layer(w, layer, resid, pattern=None):
    """One attention layer written out: ``(pattern, resid after)``; ``pattern`` given replaces the softmax."""
    q = torch.einsum("bpm,hmd->bphd", resid, w.W_Q[layer])
    k = torch.einsum("bpm,hmd->bphd", resid, w.W_K[layer])
    v = torch.einsum("bpm,hmd->bphd", resid, w.W_V[layer])
    P = resid.shape[1]
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / w.d_head**0.5
    scores = scores.masked_fill(torch.triu(torch.ones(P, P, dtype=torch.bool), 1), float("-inf"))
    if pattern is None:
        pattern = scores.softmax(-1)
    z = torch.einsum("bhqk,bkhd->bqhd", pattern, v)
    return pattern, z, resid + torch.einsum("bqhd,hdm->bqm", z, w.W_O[layer])


def test_qk_fix_is_the_exact_pattern_change_times_the_pattern_gradient():
    """Head 0.0 reaches the loss only through layer 1's queries and keys. By hand: its ablation's exact layer-1
    pattern A' (recomputed from resid + delta), the gradient dL/dA at the clean pattern, and the QK-fixed estimate
    must be sum dL/dA * (A' - A); exact ablation is L(A') - L(A), which the fix approaches better than first order."""
    model = toy(blind=(0, 0), seed=4, gain=4.0)  # first order 0.008, exact 0.039
    w = model.head_weights()
    batch = TOKENS.build(model)
    resid0 = w.W_E[batch.tokens]
    _, z0, resid1 = manual_layer(w, 0, resid0)
    A, _, _ = manual_layer(w, 1, resid1)
    leaf = A.clone().requires_grad_(True)
    with torch.enable_grad():
        _, _, out = manual_layer(w, 1, resid1, pattern=leaf)
        loss = repeated_ce(out @ w.W_U, batch)
        (G,) = torch.autograd.grad(loss, leaf)
    delta = (z0[:, :, 0].mean(dim=(0, 1)) - z0[:, :, 0]) @ w.W_O[0, 0]
    patched, _, _ = manual_layer(w, 1, resid1 + delta)
    want = float((G * (patched - A)).sum())
    _, _, out = manual_layer(w, 1, resid1, pattern=patched)
    exact_by_hand = float(repeated_ce(out @ w.W_U, batch) - loss.detach())

    est = atp_estimates(adapt(model), batch, "mean")
    exact = float(ablation_effects(model, batch, heads=[(0, 0)]).effect[0, 0])
    assert exact == pytest.approx(exact_by_hand, abs=1e-6)  # the construction: only the pattern path is left
    assert float(est.qk_fix.effect[0, 0]) == pytest.approx(want, abs=ORACLE_TOL * max(1.0, abs(want)))
    first = float(est.first_order.effect[0, 0])
    assert abs(first - want) > 0.5 * abs(want)  # the softmax is far from linear here: the fix changes the number
    assert abs(float(est.qk_fix.effect[0, 0]) - exact) < abs(first - exact)
    # per-sequence values average to the estimate; heads of the last layer have no later pattern to fix
    assert torch.allclose(est.qk_fix.per_sequence.mean(dim=0), est.qk_fix.effect, atol=1e-6)
    assert torch.equal(est.qk_fix.effect[1], est.first_order.effect[1])


def test_graddrop_on_one_layer_is_first_order():
    model = toy(n_layers=1)
    batch = TOKENS.build(model)
    first = attribution_effects(model, batch)
    est = atp_estimates(adapt(model), batch, "mean")
    for effects in (est.first_order, est.graddrop, est.atp_star, est.qk_fix):
        assert torch.allclose(effects.effect, first.effect, atol=1e-7, rtol=0)


def direct_path_estimate(model, batch, layer):
    """Each head of ``layer``'s ablation estimated with every later block skipped by the gradient: g = dL/d(final
    residual stream) by autograd at the last layer's resid_post, pulled back through ``layer``'s own block from its
    resid_post (its MLP included), dotted with (mean z - z)."""
    L = model.cfg.n_layers
    kept = {}

    def leaf_z(z, hook):
        kept["z"] = z.detach()
        kept["leaf"] = torch.zeros_like(z, requires_grad=True)
        return z + kept["leaf"]

    def keep_post(x, hook):
        kept["post"] = x

    def leaf_final(x, hook):
        kept["x"] = x = x.detach().requires_grad_(True)
        return x

    with torch.enable_grad():
        hooks = [(HOOKS.z(layer), leaf_z), (HOOKS.resid_post(layer), keep_post), (HOOKS.resid_post(L - 1), leaf_final)]
        logits = model.run_with_hooks(batch.tokens, fwd_hooks=hooks)
        (g,) = torch.autograd.grad(repeated_ce(logits, batch), kept["x"])
        (gz,) = torch.autograd.grad(kept["post"], kept["leaf"], grad_outputs=g.to(kept["post"].dtype))
    z = kept["z"].double()
    return ((z.mean(dim=(0, 1)) - z) * gz.double()).sum(dim=(0, 1, 3))


def test_graddrop_drops_the_later_layer_leaving_the_direct_path():
    """Two layers: for a layer-0 head the one drop that counts is layer 1's (1/(L-1) = 1), which leaves its direct
    path to the logits: GradDrop = sign(first order) * |direct-path estimate|. Layer-1 heads: nothing to drop."""
    model = toy(n_layers=2, seed=5)
    batch = TOKENS.build(model)
    est = atp_estimates(adapt(model), batch, "mean")
    direct = direct_path_estimate(model, batch, 0)
    want = est.first_order.effect[0].double().sign() * direct.abs()
    assert torch.allclose(est.graddrop.effect[0].double(), want, atol=ORACLE_TOL)
    assert not torch.allclose(est.graddrop.effect[0], est.first_order.effect[0], atol=1e-3)
    assert torch.equal(est.graddrop.effect[1], est.first_order.effect[1])


def test_bridge_first_order_graddrop_and_finite():
    """A TransformerBridge with LayerNorm, MLPs and grouped queries: the undropped estimate is first-order
    attribution; dropping the last layer leaves the direct path (the 2-layer closed form above, here through the
    final LayerNorm); every estimate finite."""
    model = boot_bridge(n_layers=2, attn_only=False, normalization_type="LN", n_key_value_heads=2, seed=4)
    batch = TOKENS.build(model)
    est = atp_estimates(adapt(model), batch, "mean")
    first = attribution_effects(model, batch)
    assert torch.allclose(est.first_order.effect, first.effect, atol=BRIDGE_TOL * float(first.effect.abs().max()))
    direct = direct_path_estimate(model, batch, 0)
    want = est.first_order.effect[0].double().sign() * direct.abs()
    scale = float(first.effect.abs().max())
    assert torch.allclose(est.graddrop.effect[0].double(), want, atol=BRIDGE_TOL * scale)
    for effects in (est.qk_fix, est.graddrop, est.atp_star):
        assert torch.isfinite(effects.effect).all()
    assert not torch.equal(est.qk_fix.effect[0], est.first_order.effect[0])


@pytest.mark.parametrize("estimator", ATP_ESTIMATORS)
def test_attribution_effects_selects_each_estimator(estimator):
    model = gqa_bridge()
    batch = TOKENS.build(model)
    got = attribution_effects(model, batch, estimator=estimator)
    want = atp_effects(model, batch, estimator=estimator)
    assert got.kind == "attribution" and got.effect.shape == (3, 4)
    assert torch.isfinite(got.effect).all()
    assert torch.equal(got.effect, want.effect)


@pytest.mark.parametrize(("call", "match"), [
    (lambda m: attribution_effects(m, TOKENS, estimator="atp"), "estimator: given str 'atp'"),
    (lambda m: attribution_effects(m, TOKENS, estimator="atp*", steps=2), "steps: given int 2; expected 1 with"),
    (lambda m: atp_effects(m, TOKENS, estimator="gradient"), "estimator: given str 'gradient'"),
    (lambda m: atp_effects(m, TOKENS, method="resample"), "method: given str 'resample'"),
    (lambda m: atp_effects(m, TOKENS, estimator=None), "estimator: given None"),
])
def test_bad_options_refused(call, match):
    with pytest.raises(CircuitkitError, match=match):
        call(toy())
