"""Attribution effects: against a closed-form gradient, finite differences, exact ablation in the linear limit,
the known circuits of the bundled and the hand-built model; agreement against Spearman's closed form."""

from __future__ import annotations

import pytest
import torch

from circuitkit import CircuitkitError, HeadWeights
from circuitkit.detect import RepeatedTokens, ablation_effects, agreement, attribution_effects
from circuitkit.detect.attribution import attribute
from circuitkit.detect.clean_run import clean_run
from circuitkit.detect.tokens import TokenBatch
from circuitkit.models import AttentionOnlyModel
from circuitkit.models.adapters import HOOKS, adapt
from circuitkit.scan_types import HeadEffects
from tests.conftest import boot_bridge, random_weights

GRAD_TOL = 1e-5
"""The closed form and finite differences run in float64; attribution's loss is float32 (token_losses casts
logits), so its gradient carries ~1e-7 relative error on effects of order 0.1-1 nats: 1e-5 leaves a wide margin."""

FD_EPS = 1e-4
"""Central-difference step in float64: truncation ~eps^2 * L''' ~ 1e-8, rounding ~1e-16 / eps ~ 1e-12."""

LINEAR_LIMIT_ORDER = 8.0
"""Shrinking a head's output 4x must shrink the miss |estimate - exact| ~16x (second order); ask for 8x."""

TOKENS = RepeatedTokens(block_len=6, batch=4, seed=1)


def toy(n_layers=1, n_heads=4, n_kv_heads=None, *, seed=0, d_vocab=20):
    weights = random_weights(
        n_layers, n_heads, d_model=16, d_head=4, n_kv_heads=n_kv_heads, d_vocab=d_vocab, seed=seed,
        dtype=torch.float64,
    )
    # sharper attention (x2 on Q, K) and a read-out (x4 on W_U) that makes losses move by 0.01-0.3 nats per head
    weights = HeadWeights(
        W_Q=weights.W_Q * 2, W_K=weights.W_K * 2, W_V=weights.W_V, W_O=weights.W_O, W_E=weights.W_E,
        W_U=weights.W_U * 4,
    )
    return AttentionOnlyModel(weights, n_ctx=32)


def repeated_ce(logits, batch: TokenBatch):
    """Mean float64 cross-entropy over the repeated copies, written out (not token_losses)."""
    tokens = batch.tokens
    logprobs = logits[:, :-1].double().log_softmax(-1)
    ce = -logprobs.gather(-1, tokens[:, 1:, None])[..., 0]
    return ce[:, batch.repeated_copies].mean()


def clean_z(model, batch):
    _, cache = model.run_with_cache(batch.tokens)
    return {layer: cache[HOOKS.z(layer)].detach() for layer in range(model.cfg.n_layers)}


def replacement(z, method):
    return z.mean(dim=(0, 1)) if method == "mean" else torch.zeros_like(z[0, 0])


# ---------------------------------------------------------------------- independent oracles
@pytest.mark.parametrize("method", ["mean", "zero"])
@pytest.mark.parametrize("kv", [None, 2], ids=["multi-head", "grouped-query"])
def test_one_layer_equals_closed_form_gradient(method, kv):
    """One attention-only layer: logits = (resid0 + sum_h z_h W_O[h]) W_U are linear in z, so
    dL/dz_h = dL/dlogits W_U^T W_O[h]^T with dL/dlogits = (softmax - onehot) / N on the repeated copies."""
    model = toy(n_kv_heads=kv)
    batch = TOKENS.build(model)
    z = clean_z(model, batch)[0]  # [batch, pos, head, d_head]
    logits = model(batch.tokens).double()
    w = model.head_weights()
    tokens = batch.tokens
    d_logits = torch.zeros_like(logits)
    mask = batch.repeated_copies
    n = tokens.shape[0] * int(mask.sum())
    probs = logits[:, :-1].softmax(-1)
    onehot = torch.nn.functional.one_hot(tokens[:, 1:], logits.shape[-1]).double()
    d_logits[:, :-1] = (probs - onehot) * mask[None, :, None] / n
    d_resid = d_logits @ w.W_U.T  # [batch, pos, d_model]
    d_z = torch.einsum("bpm,hdm->bphd", d_resid, w.W_O[0])
    expected = ((replacement(z, method) - z) * d_z).sum(dim=(0, 1, 3))

    got = attribution_effects(model, batch, method=method)
    assert got.kind == "attribution" and got.method == method and got.exact is None
    torch.testing.assert_close(got.effect[0].double(), expected, atol=GRAD_TOL, rtol=GRAD_TOL)


def finite_difference(model, batch, z, layer, head, method):
    """(L(z + eps d) - L(z - eps d)) / 2 eps with d = z_abl - z on one head, through a hook, in float64."""
    z_abl = replacement(z[layer][:, :, head], method)

    def loss_at(t):
        def push(z, hook):
            z = z.clone()
            z[:, :, head] += t * (z_abl - z[:, :, head])
            return z

        with torch.no_grad():
            return float(repeated_ce(model.run_with_hooks(batch.tokens, fwd_hooks=[(HOOKS.z(layer), push)]), batch))

    return (loss_at(FD_EPS) - loss_at(-FD_EPS)) / (2 * FD_EPS)


@pytest.mark.parametrize("method", ["mean", "zero"])
@pytest.mark.parametrize(
    "make",
    [
        lambda: toy(n_layers=3, seed=2),
        lambda: toy(n_layers=2, n_heads=4, n_kv_heads=2, seed=3),
        lambda: boot_bridge(n_layers=2, n_heads=4, attn_only=False, seed=4).to(torch.float64),
        lambda: boot_bridge(n_layers=2, n_heads=4, n_key_value_heads=2, seed=5).to(torch.float64),
    ],
    ids=["toy-3-layers", "toy-gqa", "bridge-with-mlp", "bridge-gqa"],
)
def test_equals_finite_difference_directional_derivative(make, method):
    """Any model: the estimate is the derivative of the loss along the ablation, through every later layer."""
    model = make()
    batch = TOKENS.build(model)
    got = attribution_effects(model, batch, method=method)
    n_layers, n_heads = got.effect.shape
    z = clean_z(model, batch)
    for layer in range(n_layers):
        for head in range(n_heads):
            expected = finite_difference(model, batch, z, layer, head, method)
            assert float(got.effect[layer, head]) == pytest.approx(expected, abs=GRAD_TOL, rel=GRAD_TOL), (
                f"head {layer}.{head}"
            )


def test_approaches_exact_ablation_in_the_linear_limit():
    """Scaling one head's output by s makes the loss linear in it as s -> 0: the miss is O(s^2) while the effect
    is O(s), so exact ablation and the estimate agree to first order."""
    base = toy(n_layers=2, seed=6)
    w = base.head_weights()
    misses = []
    for s in (0.2, 0.05):
        W_O = w.W_O.clone()
        W_O[0, 1] *= s
        model = AttentionOnlyModel(
            HeadWeights(W_Q=w.W_Q, W_K=w.W_K, W_V=w.W_V, W_O=W_O, W_E=w.W_E, W_U=w.W_U), n_ctx=32
        )
        estimate = float(attribution_effects(model, TOKENS, method="zero").effect[0, 1])
        exact = float(ablation_effects(model, TOKENS, method="zero", heads=[(0, 1)]).effect[0, 1])
        assert abs(estimate) > 0 and estimate * exact > 0
        misses.append(abs(estimate - exact))
    assert misses[1] < misses[0] / LINEAR_LIMIT_ORDER, misses


# ---------------------------------------------------------------------- known circuits
@pytest.mark.parametrize("method", ["mean", "zero"])
def test_ranks_the_bundled_models_circuit_first(method):
    """The bundled model's six documented heads (induction 1.0-1.3, previous-token 0.0, 0.1) are the six largest
    by |estimate|; the two others (0.2, 0.3) are last."""
    from circuitkit import zoo

    entry = zoo.info()
    effects = attribution_effects(zoo.load(), method=method)
    top = {head for head, _ in effects.top(6, absolute=True)}
    assert top == set(entry.induction_heads) | set(entry.previous_token_heads)


def with_distractors(circuit, n_extra=2, seed=0):
    """The hand-built circuit's weights with ``n_extra`` random heads added to each layer, writing anywhere in the
    residual stream, and noise on the read-out, so the distractors move the loss too (by up to ~0.3 nats)."""
    w = circuit.model.head_weights()
    g = torch.Generator().manual_seed(seed)
    L, _, d_model, d_head = w.W_Q.shape

    def extra(*shape, scale):
        return torch.randn(*shape, generator=g, dtype=w.W_Q.dtype) * scale

    def cat(old, new):
        return torch.cat([old, new], dim=1)

    return AttentionOnlyModel(
        HeadWeights(
            W_Q=cat(w.W_Q, extra(L, n_extra, d_model, d_head, scale=1.0)),
            W_K=cat(w.W_K, extra(L, n_extra, d_model, d_head, scale=1.0)),
            W_V=cat(w.W_V, extra(L, n_extra, d_model, d_head, scale=0.1)),
            W_O=cat(w.W_O, extra(L, n_extra, d_head, d_model, scale=0.1)),
            b_Q=cat(w.b_Q, torch.zeros(L, n_extra, d_head, dtype=w.W_Q.dtype)),
            W_E=w.W_E, W_U=w.W_U + extra(*w.W_U.shape, scale=0.3), W_pos=w.W_pos,
        ),
        n_ctx=circuit.model.cfg.n_ctx,
    )


def test_ranks_the_hand_built_circuit_first():
    """With unsaturated attention (gap 4 logits), the two circuit heads lead both estimate and exact ablation
    among four random distractor heads."""
    from circuitkit.handbuilt import induction_circuit

    circuit = induction_circuit(d_vocab=12, n_ctx=32, gap=4.0, logit_scale=3.0)
    model = with_distractors(circuit)
    tokens = RepeatedTokens(block_len=10, batch=8)
    planted = {circuit.previous_token_head, circuit.induction_head}
    estimate = attribution_effects(model, tokens)
    exact = ablation_effects(model, tokens)
    assert {head for head, _ in exact.top(2)} == planted  # the reference agrees on what the circuit is
    assert {head for head, _ in estimate.top(2, absolute=True)} == planted


def test_saturated_attention_hides_the_previous_token_head_and_agreement_says_so():
    """The default circuit's attention is saturated (gap 20 logits: d softmax ~ e^-20), so the previous-token
    head, which acts only through the induction head's attention, gets an estimate of ~0 while ablating it costs
    nats. That is the limit of a linear estimate; agreement must point at it."""
    from circuitkit.handbuilt import induction_circuit

    circuit = induction_circuit(d_vocab=12, n_ctx=32)
    tokens = RepeatedTokens(block_len=10, batch=8)
    estimate = attribution_effects(circuit.model, tokens)
    exact = ablation_effects(circuit.model, tokens)
    head = circuit.previous_token_head
    assert abs(float(estimate.effect[head])) < 1e-6 < 1.0 < float(exact.effect[head])
    result = agreement(estimate, exact)
    assert result.n_exact == 2 and result.spearman is None
    assert result.largest_miss[0] == head
    assert result.largest_miss[1:] == (pytest.approx(float(exact.effect[head])), float(estimate.effect[head]))


# ---------------------------------------------------------------------- contract
def test_one_pass_fills_the_same_clean_run_as_clean_run():
    """The attribution pass doubles as the clean pass: its losses, mean z and residual streams equal clean_run's."""
    model = boot_bridge(n_layers=3, seed=7)
    adapter = adapt(model)
    batch = TOKENS.build(model)
    effects, run = attribute(adapter, batch, "mean", resid_layers=[1, 2])
    reference = clean_run(adapter, batch, z_means=True, resid_layers=[1, 2])
    torch.testing.assert_close(run.losses, reference.losses)
    assert effects.clean_loss == pytest.approx(reference.repeated_loss)
    for layer in range(3):
        torch.testing.assert_close(run.z_means[layer], reference.z_means[layer])
    for layer in (1, 2):
        torch.testing.assert_close(run.resid_pre[layer], reference.resid_pre[layer])
    seen = []
    attribute(adapter, batch, "zero", observers=[(HOOKS.pattern(0), lambda p, hook: seen.append(p.requires_grad))])
    assert seen == [False]  # observers get detached activations


def test_leaves_no_gradients_and_restores_requires_grad():
    model = boot_bridge(seed=8)
    params = list(model.parameters())
    frozen = params[0]
    frozen.requires_grad_(False)
    before = [p.requires_grad for p in params]
    assert any(before)
    attribution_effects(model, TOKENS)
    assert [p.requires_grad for p in params] == before
    assert all(p.grad is None for p in params)
    with torch.no_grad():  # the caller's grad mode is restored after the pass
        attribution_effects(model, TOKENS)
        assert not torch.is_grad_enabled()


def test_result_is_finite_float32_on_cpu_with_the_clean_loss():
    model = boot_bridge(seed=9)
    effects = attribution_effects(model, TOKENS, method="zero")
    assert isinstance(effects, HeadEffects)
    assert effects.effect.shape == (2, 4) and effects.effect.dtype == torch.float32
    assert effects.effect.device.type == "cpu" and bool(torch.isfinite(effects.effect).all())
    assert effects.clean_loss == pytest.approx(ablation_effects(model, TOKENS, heads=[]).clean_loss)


def test_clean_run_batch_is_reused():
    model = boot_bridge(seed=10)
    adapter = adapt(model)
    batch = TOKENS.build(model)
    run = clean_run(adapter, batch)
    torch.testing.assert_close(
        attribution_effects(model, clean=run).effect, attribution_effects(model, batch).effect
    )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(method="resample"), "method"),
        (dict(method=None), "method"),
        (dict(tokens="A B A B"), "tokens"),
        (dict(tokens=torch.zeros(2, 8, dtype=torch.long)), "tokens"),
        (dict(tokens=TokenBatch(torch.full((2, 8), 99), block_len=4, n_repeats=2, bos=None)), "vocabulary"),
        (dict(tokens=RepeatedTokens(block_len=40)), "n_ctx"),
        (dict(clean="run"), "clean"),
        (dict(clean="run", tokens=TOKENS), "clean|tokens"),
        (dict(device="cuda:7"), "device"),
    ],
    ids=["unknown-method", "method-none", "string-tokens", "raw-tensor", "ids-outside-vocab", "too-long",
         "clean-not-a-run", "clean-and-tokens", "missing-device"],
)
def test_bad_input_raises(kwargs, match):
    model = boot_bridge(seed=11)
    if kwargs.get("clean") == "run" and "tokens" in kwargs:
        kwargs["clean"] = clean_run(adapt(model), TOKENS.build(model))
    tokens = kwargs.pop("tokens", None)
    with pytest.raises(CircuitkitError, match=match):
        attribution_effects(model, tokens, **kwargs)


# ---------------------------------------------------------------------- agreement
def effects(kind, values, exact=None, method="mean"):
    tensor = torch.tensor(values, dtype=torch.float32)
    return HeadEffects(kind=kind, method=method, clean_loss=1.0, effect=tensor, exact=exact)


def test_agreement_spearman_matches_the_no_ties_closed_form():
    """Without ties rho = 1 - 6 sum d_i^2 / (n (n^2 - 1)), d_i the rank differences."""
    g = torch.Generator().manual_seed(12)
    exact_values = torch.randn(3, 4, generator=g)
    estimate_values = exact_values + 0.8 * torch.randn(3, 4, generator=g)
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[2, 1:] = False  # 9 heads ablated exactly, 3 not
    exact = HeadEffects("ablation", "mean", 1.0, torch.where(mask, exact_values, torch.nan), mask)
    estimate = HeadEffects("attribution", "mean", 1.0, estimate_values)
    a, b = estimate_values[mask], exact_values[mask]
    d = (a.argsort().argsort() - b.argsort().argsort()).double()
    n = len(a)
    rho = 1 - 6 * float((d**2).sum()) / (n * (n**2 - 1))
    result = agreement(estimate, exact)
    assert result.n_exact == 9 and result.spearman == pytest.approx(rho, abs=1e-12)
    i = int((a - b).abs().argmax())
    assert result.largest_miss == (tuple(mask.nonzero().tolist()[i]), float(b[i]), float(a[i]))


def test_agreement_with_ties_perfect_order_and_reverse_order():
    mask = torch.ones(1, 4, dtype=torch.bool)
    exact = effects("ablation", [[1.0, 2.0, 2.0, 3.0]], mask)
    assert agreement(effects("attribution", [[0.1, 0.2, 0.2, 0.3]]), exact).spearman == pytest.approx(1.0)
    assert agreement(effects("attribution", [[0.3, 0.2, 0.2, 0.1]]), exact).spearman == pytest.approx(-1.0)
    flat = agreement(effects("attribution", [[0.5, 0.5, 0.5, 0.5]]), exact)
    assert flat.spearman is None  # a constant estimate has no ranking


def test_agreement_needs_three_heads_for_a_rank_correlation():
    mask = torch.tensor([[True, True, False]])
    result = agreement(effects("attribution", [[0.1, 0.5, 9.0]]), effects("ablation", [[0.2, 0.1, 0.0]], mask))
    assert result.n_exact == 2 and result.spearman is None
    assert result.largest_miss == ((0, 1), pytest.approx(0.1), pytest.approx(0.5))
    none = agreement(effects("attribution", [[0.1]]), effects("ablation", [[float("nan")]], torch.tensor([[False]])))
    assert none == type(none)(n_exact=0, spearman=None, largest_miss=None)


@pytest.mark.parametrize(
    "attribution, ablation, match",
    [
        (effects("ablation", [[0.1]], torch.tensor([[True]])), effects("ablation", [[0.1]], torch.tensor([[True]])),
         "attribution"),
        (effects("attribution", [[0.1]]), effects("attribution", [[0.1]]), "ablation"),
        (effects("attribution", [[0.1]]), effects("ablation", [[0.1]]), "exact"),
        (effects("attribution", [[0.1, 0.2]]), effects("ablation", [[0.1]], torch.tensor([[True]])), "shape"),
        (effects("attribution", [[0.1]], method="zero"), effects("ablation", [[0.1]], torch.tensor([[True]])),
         "method"),
        ("estimate", effects("ablation", [[0.1]], torch.tensor([[True]])), "attribution"),
    ],
    ids=["attribution-is-ablation", "ablation-is-attribution", "no-exact-mask", "other-shape", "other-method",
         "not-effects"],
)
def test_agreement_bad_input(attribution, ablation, match):
    with pytest.raises(CircuitkitError, match=match):
        agreement(attribution, ablation)
