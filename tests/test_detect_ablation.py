"""Exact ablation: resumed passes equal full passes, a head subset, an independent removal of the head's output,
the hand-built circuit, bad input."""

from __future__ import annotations

import math

import pytest
import torch

from circuitkit import CircuitkitError
from circuitkit.detect import RepeatedTokens, ablation_effects, induction_loss
from circuitkit.detect import ablation as ablation_module
from circuitkit.models import AttentionOnlyModel
from tests.conftest import boot_bridge, random_weights

RESUME_TOL = 1e-5
"""Resumed and full passes run the same float32 operations on the same residual stream; only the batch copies'
layout differs, which can change summation order (~1e-7 on losses of a few nats). 1e-5 is a wide margin."""

LOSS_TOL = 1e-4
"""float32 log-softmax over tens of logits, averaged: ~1e-6 differences between two equivalent hook paths."""

TOKENS = RepeatedTokens(block_len=6, batch=3, seed=2)


def toy(n_kv_heads=None, seed=0):
    return AttentionOnlyModel(
        random_weights(3, 4, d_model=16, d_head=4, n_kv_heads=n_kv_heads, d_vocab=20, seed=seed), n_ctx=32
    )


MODELS = {
    "bridge": lambda: boot_bridge(n_layers=3, seed=1),
    "bridge-with-mlp": lambda: boot_bridge(n_layers=3, attn_only=False, seed=2),
    "bridge-gqa": lambda: boot_bridge(n_layers=3, n_key_value_heads=2, seed=3),
    "toy": lambda: toy(seed=4),
    "toy-gqa": lambda: toy(n_kv_heads=2, seed=5),
}


@pytest.fixture(scope="module")
def bridge():
    return boot_bridge(n_layers=2, n_heads=4, d_model=32, d_head=8, d_vocab=50, n_ctx=64, seed=3)


# ---------------------------------------------------------------------- resuming from the clean residual stream
@pytest.mark.parametrize("method", ["mean", "zero"])
@pytest.mark.parametrize("name", list(MODELS))
def test_resumed_ablation_equals_full_passes(name, method):
    """Every head, layer 0 included: ablating from blocks.{l}.hook_resid_pre of the clean run equals recomputing
    layers 0..l-1."""
    model = MODELS[name]()
    resumed = ablation_effects(model, TOKENS, method=method)
    full = ablation_effects(model, TOKENS, method=method, resume=False)
    assert bool(resumed.exact.all()) and bool(full.exact.all())
    assert resumed.clean_loss == full.clean_loss
    torch.testing.assert_close(resumed.effect, full.effect, atol=RESUME_TOL, rtol=0)
    assert float(resumed.effect.abs().max()) > 100 * RESUME_TOL  # the heads matter: the comparison is not 0 == 0


def test_resume_really_skips_the_earlier_layers():
    """The pass for a layer-2 head starts at layer 2 when resuming, at the tokens otherwise."""
    model = toy(seed=6)
    starts = []
    run_with_hooks = model.run_with_hooks

    def recording(tokens, fwd_hooks=(), *, start_at_layer=None):
        starts.append(start_at_layer)
        return run_with_hooks(tokens, fwd_hooks, start_at_layer=start_at_layer)

    model.run_with_hooks = recording
    ablation_effects(model, TOKENS, heads=[(2, 1)])
    assert starts == [None, 2]  # the clean pass, then the ablation from layer 2
    starts.clear()
    ablation_effects(model, TOKENS, heads=[(2, 1)], resume=False)
    assert starts == [None, None]


def test_batches_split_over_several_forwards_give_the_same_effects(monkeypatch):
    model = MODELS["bridge"]()
    whole = ablation_effects(model, TOKENS)
    monkeypatch.setattr(ablation_module, "MAX_SEQUENCES_PER_FORWARD", 2 * TOKENS.batch)  # 2 heads per forward
    split = ablation_effects(model, TOKENS)
    torch.testing.assert_close(split.effect, whole.effect, atol=RESUME_TOL, rtol=0)


# ---------------------------------------------------------------------- a subset of heads
def test_heads_subset_is_nan_elsewhere_and_marked_exact():
    model = MODELS["bridge-gqa"]()
    every = ablation_effects(model, TOKENS)
    subset = [(2, 3), (0, 1), (0, 1), [1, 0]]  # duplicates and lists are fine
    some = ablation_effects(model, TOKENS, heads=subset)
    expected = torch.zeros(3, 4, dtype=torch.bool)
    for layer, head in [(2, 3), (0, 1), (1, 0)]:
        expected[layer, head] = True
    assert torch.equal(some.exact, expected)
    assert bool(some.effect[~expected].isnan().all())
    torch.testing.assert_close(some.effect[expected], every.effect[expected], atol=RESUME_TOL, rtol=0)
    assert some.top(3) == sorted(some.top(3), key=lambda item: -item[1])  # NaN never ranks
    nothing = ablation_effects(model, TOKENS, heads=[])
    assert not bool(nothing.exact.any()) and bool(nothing.effect.isnan().all())
    assert nothing.clean_loss == every.clean_loss


# ---------------------------------------------------------------------- independent references
@pytest.mark.parametrize("method", ["zero", "mean"])
def test_ablation_matches_removing_the_head_output(bridge, method):
    """Independent path: subtract the head's own contribution (z_h - replacement) @ W_O[h] from attn_out."""
    tokens = RepeatedTokens(block_len=6, batch=3, bos=0)
    effects = ablation_effects(bridge, tokens, method=method)
    ids = tokens.build(bridge).tokens
    _, cache = bridge.run_with_cache(ids)
    repeated = torch.zeros(ids.shape[1] - 1, dtype=torch.bool)
    repeated[7:12] = True  # BOS, copy 1 at 1..6, copy 2 at 7..12; each copy's first token is unpredictable
    for layer, head in [(0, 1), (1, 3)]:
        z = cache[f"blocks.{layer}.attn.hook_z"][:, :, head].detach()
        replacement = z.mean(dim=(0, 1)) if method == "mean" else torch.zeros_like(z[0, 0])
        delta = (z - replacement) @ bridge.W_O[layer, head].detach()

        def remove(attn_out, hook, delta=delta):
            return attn_out - delta

        logits = bridge.run_with_hooks(ids, fwd_hooks=[(f"blocks.{layer}.hook_attn_out", remove)]).detach()
        ce = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
        assert float(effects.loss[layer, head]) == pytest.approx(float(ce[:, repeated].mean()), abs=LOSS_TOL)
    torch.testing.assert_close(effects.delta, effects.loss - effects.clean_loss)


def test_planted_circuit_loss_and_ablation():
    from circuitkit.handbuilt import induction_circuit

    circuit = induction_circuit(d_vocab=12, n_ctx=32)
    tokens = RepeatedTokens(block_len=10, batch=8)
    loss = induction_loss(circuit.model, tokens)
    assert loss.repeated_copies < 0.01 < math.log(12) * 0.8 < loss.first_copy
    effects = ablation_effects(circuit.model, tokens, method="zero")
    assert effects.kind == "ablation" and effects.method == "zero"
    assert effects.clean_loss == pytest.approx(loss.repeated_copies, abs=LOSS_TOL)
    assert {head for head, _ in effects.top(2)} == {circuit.induction_head, circuit.previous_token_head}
    assert float(effects.effect.min()) > math.log(12) * 0.5  # removing either head breaks the copying


def test_bundled_model_circuit_heads_matter_most():
    """The bundled model's previous-token heads 0.0, 0.1 and induction heads 1.0-1.3 are the six largest ablation
    effects; 0.2 and 0.3 barely matter."""
    from circuitkit import zoo

    entry = zoo.info()
    effects = ablation_effects(zoo.load())
    assert {head for head, _ in effects.top(6)} == set(entry.induction_heads) | set(entry.previous_token_heads)


# ---------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "heads, match",
    [
        ([(3, 0)], "layer"),
        ([(0, 4)], "head"),
        ([(-1, 0)], "layer"),
        ([(0, 1.0)], "head"),
        ([(True, 0)], "layer"),
        ([(0,)], "pair"),
        (["0.1"], "pair"),
        ("0.1", "iterable"),
        (5, "iterable"),
        ([None], "pair"),
    ],
    ids=["layer-out-of-range", "head-out-of-range", "negative-layer", "float-head", "bool-layer", "one-number",
         "string-pair", "string", "int", "none-pair"],
)
def test_bad_heads_raise(heads, match):
    model = MODELS["bridge"]()
    with pytest.raises(CircuitkitError, match=match):
        ablation_effects(model, TOKENS, heads=heads)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(method="resample"), "method"),
        (dict(method=0), "method"),
        (dict(resume="yes"), "resume"),
        (dict(progress=1), "progress"),
        (dict(tokens="A B A B"), "tokens"),
        (dict(device="cuda:7"), "device"),
    ],
    ids=["unknown-method", "int-method", "string-resume", "int-progress", "string-tokens", "missing-device"],
)
def test_bad_options_raise(bridge, kwargs, match):
    tokens = kwargs.pop("tokens", None)
    with pytest.raises(CircuitkitError, match=match):
        ablation_effects(bridge, tokens, **kwargs)
