"""Exact path patching: against an independent dense implementation (the patched receiver input written by hand),
on the hand-built induction circuit, on the bundled model, on a LayerNorm TransformerBridge, GQA, and bad input."""

from __future__ import annotations

import json
import math

import pytest
import torch

from circuitkit import CircuitkitError, HeadWeights, zoo
from circuitkit.circuits import path_patching, resampled_batch
from circuitkit.detect import RepeatedTokens
from circuitkit.handbuilt import induction_circuit
from circuitkit.models import AttentionOnlyModel
from circuitkit.models.adapters import HOOKS, adapt
from tests.conftest import boot_bridge, random_weights

FLOAT32_TOL = 2e-5  # float32 forward passes of 3 layers at d_model 16: the two implementations agree to ~1e-6


# ---------------------------------------------------------------------------------------------- reference
def _dense(w: HeadWeights, tokens, patch=None):
    """The toy model written out densely (no hooks). ``patch = (layer, head, channel, delta [b, p, d_model])``
    gives that query head's ``channel`` input ``resid + delta``; for GQA only that query head reads the patched
    keys/values. Returns ``(logits, z per layer)``."""
    resid = w.W_E[tokens]
    zs = []
    W = {"q": w.W_Q, "k": w.per_query_head("W_K"), "v": w.per_query_head("W_V")}
    for layer in range(w.n_layers):
        qkv = {c: torch.einsum("bpm,hmd->bphd", resid, W[c][layer]).clone() for c in W}
        if patch is not None and patch[0] == layer:
            _, head, channels, delta = patch
            for c in ("q", "k", "v") if channels == "all" else (channels,):
                qkv[c][:, :, head] = (resid + delta) @ W[c][layer, head]
        scores = torch.einsum("bqhd,bkhd->bhqk", qkv["q"], qkv["k"]) / math.sqrt(w.d_head)
        pos = tokens.shape[1]
        scores = scores.masked_fill(torch.ones(pos, pos, dtype=torch.bool).triu(1), float("-inf"))
        z = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), qkv["v"])
        zs.append(z)
        resid = resid + torch.einsum("bphd,hdm->bpm", z, w.W_O[layer])
    return resid @ w.W_U, zs


def _repeated_loss(logits, batch):
    mask = batch.repeated_copies
    losses = -logits[:, :-1].log_softmax(-1).gather(-1, batch.tokens[:, 1:, None])[..., 0]
    return losses[:, mask].mean()


def _reference_effect(w, batch, corrupted, src, dst, channel, metric):
    clean_logits, z = _dense(w, batch.tokens)
    _, z_corrupt = _dense(w, corrupted.tokens)
    delta = (z_corrupt[src[0]][:, :, src[1]] - z[src[0]][:, :, src[1]]) @ w.W_O[src[0], src[1]]
    patched_logits, _ = _dense(w, batch.tokens, (dst[0], dst[1], channel, delta))
    return float(metric(patched_logits, batch) - metric(clean_logits, batch))


@pytest.fixture(scope="module", params=[None, 2], ids=["mha", "gqa-2-groups"])
def toy(request):
    w = random_weights(3, 4, 16, 4, n_kv_heads=request.param, d_vocab=13, seed=3)
    w = HeadWeights(**(w.tensors() | {k: v * 3 for k, v in w.tensors().items() if k in ("W_Q", "W_K")}))
    return AttentionOnlyModel(w)


@pytest.mark.parametrize("channel", ["q", "k", "v", "all"])
def test_equals_an_independent_dense_implementation(toy, channel):
    batch = RepeatedTokens(block_len=5, batch=3, bos=False).build(toy)
    corrupted = resampled_batch(batch, seed=7)
    edges = [((0, 1), (2, 3)), ((1, 0), (2, 1)), ((0, 2), (1, 0)), ((1, 3), (2, 2))]
    result = path_patching(toy, edges, input=channel, metric=_repeated_loss, tokens=batch, corrupt=corrupted,
                           edges_per_pass=3)
    w = toy.head_weights()
    for (src, dst), got in zip(edges, result.edges, strict=True):
        want = _reference_effect(w, batch, corrupted, src, dst, channel, _repeated_loss)
        assert got.effect == pytest.approx(want, abs=FLOAT32_TOL)
    assert max(abs(e.effect) for e in result.edges) > 100 * FLOAT32_TOL  # the comparison is not 0 == 0


def test_named_loss_metric_equals_the_callable_and_passes_do_not_matter(toy):
    batch = RepeatedTokens(block_len=5, batch=3, bos=False).build(toy)
    edges = [((0, h), (2, g)) for h in range(4) for g in range(4)]
    named = path_patching(toy, edges, input="k", metric="loss", tokens=batch)
    callable_ = path_patching(toy, edges, input="k", metric=_repeated_loss, tokens=batch, edges_per_pass=1)
    torch.testing.assert_close(named.effects, callable_.effects, atol=FLOAT32_TOL, rtol=0)


# ---------------------------------------------------------------------------------------------- known answers
def _accuracy(logits, batch):
    mask = batch.repeated_copies
    right = logits[:, :-1].argmax(-1) == batch.tokens[:, 1:]
    return right[:, mask].float().mean()


def test_induction_circuit_only_the_k_path_carries_the_induction():
    circuit = induction_circuit(d_vocab=8, n_ctx=16)
    batch = RepeatedTokens(block_len=6, batch=8, bos=False).build(circuit.model)
    result = path_patching(circuit.model, [((0, 0), (1, 0), c) for c in "qkv"], metric=_accuracy, tokens=batch)
    by_channel = {e.channel: e for e in result.edges}
    assert by_channel["k"].clean == pytest.approx(1.0)
    assert by_channel["k"].patched < 0.3  # chance is 1/8; the induction is gone
    assert by_channel["q"].effect == 0.0 and by_channel["v"].effect == 0.0  # W_Q, W_V never read the prev block
    assert result.top(1)[0].channel == "k"


@pytest.fixture(scope="module")
def bundled():
    return zoo.load()


@pytest.mark.parametrize("metric", ["loss", "induction"])
def test_bundled_model_k_edges_from_previous_token_heads_carry_the_effect(bundled, metric):
    entry = zoo.info()
    edges = [(p, i, c) for p in entry.previous_token_heads for i in entry.induction_heads for c in "qkv"]
    result = path_patching(bundled, edges, metric=metric)
    k = [abs(e.effect) for e in result.edges if e.channel == "k"]
    other = [abs(e.effect) for e in result.edges if e.channel != "k"]
    assert min(k) > 3 * max(other)
    # corrupting the K-path raises the loss and lowers the induction score: behaviour lost either way
    assert all(e.effect > 0 for e in result.edges if e.channel == "k")
    rises = 1 if metric == "loss" else -1
    assert all(e.effect == rises * (e.patched - e.clean) for e in result.edges)


def test_induction_metric_ignores_v_edges_exactly(bundled):
    result = path_patching(bundled, [((0, 1), (1, 3))], input="v", metric="induction", corrupt="mean")
    assert result.edges[0].effect == 0.0


# ---------------------------------------------------------------------------------------------- LayerNorm bridge
RELATIVE_TOL = 1e-4  # the bridge's batched and unbatched float32 matmuls differ by ~1e-6 relative


def _logit_energy(logits, batch):
    return (logits.double() ** 2).sum().float()


def test_layernorm_bridge_equals_a_hand_patched_receiver_input():
    model = boot_bridge(n_layers=3, attn_only=False, normalization_type="LN", seed=1)
    adapter = adapt(model)
    batch = RepeatedTokens(block_len=6, batch=2, bos=False).build(model)
    corrupted = resampled_batch(batch)
    src, dst = (0, 2), (2, 1)
    result = path_patching(model, [(src, dst)], input="q", metric=_logit_energy, tokens=batch, corrupt=corrupted)
    w = adapter.weights()
    with torch.no_grad():
        clean_logits, cache = model.run_with_cache(batch.tokens)
        _, corrupt_cache = model.run_with_cache(corrupted.tokens)
        z, zc = cache[HOOKS.z(src[0])], corrupt_cache[HOOKS.z(src[0])]
        delta = (zc[:, :, src[1]] - z[:, :, src[1]]) @ w.W_O[src[0], src[1]]
        x = model.blocks[dst[0]].ln1(cache[HOOKS.resid_pre(dst[0])] + delta)
        q_new = x @ w.W_Q[dst[0], dst[1]] + w.b_Q[dst[0], dst[1]]

        def swap(q, hook):
            q = q.clone()
            q[:, :, dst[1]] = q_new
            return q

        patched = model.run_with_hooks(batch.tokens, fwd_hooks=[(HOOKS.q(dst[0]), swap)])
    want = float(_logit_energy(patched, batch) - _logit_energy(clean_logits, batch))
    assert result.edges[0].effect == pytest.approx(want, rel=RELATIVE_TOL)
    assert abs(want) > 1e-2


# ---------------------------------------------------------------------------------------------- result and input
def test_result_top_and_json(bundled):
    result = path_patching(bundled, [((0, 1), (1, 3), "k"), ((0, 2), (1, 0), "q")], metric="induction")
    best = result.top(1)[0]
    assert best.name == "0.1->1.3:k" and best.label == "0.1 -> 1.3 (k)"  # the task graph's name; the table's label
    assert (best.src, best.dst, best.channel) == ((0, 1), (1, 3), "k")
    assert result.effect((0, 1), (1, 3), "k") == result.edges[0].effect
    saved = json.loads(json.dumps(result.to_json()))
    assert saved["edges"][0] == {"edge": "0.1->1.3:k", "score": None, "clean": best.clean, "patched": best.patched,
                                 "effect": best.effect, "ci": None}  # the induction score keeps no interval
    assert "0.1 -> 1.3 (k): +" in repr(result)


def test_each_sequences_effect_and_the_interval_over_the_sequences(bundled):
    """With the loss, each edge keeps each sequence's effect (its patched loss minus its clean loss, the clean run's
    losses read by hand here) and the percentile bootstrap of the effect over the sequences; ``circuit_evidence``
    (its clean run from the edge attribution's pass) and the scan (its own clean run and bootstrap settings) give
    their patched edges the same. The induction score keeps neither."""
    import circuitkit as ck
    from circuitkit.detect.clean_run import clean_run
    from circuitkit.uncertainty import bootstrap_ci

    tokens = RepeatedTokens(batch=8)
    batch = tokens.build(bundled)
    edges = [((0, 1), (1, 3), "k"), ((0, 0), (1, 1), "k"), ((0, 2), (1, 0), "q")]
    result = path_patching(bundled, edges, tokens=batch, n_resamples=400, ci_level=0.9)
    clean = clean_run(adapt(bundled), batch).repeated_per_sequence.double()
    for e in result.edges:
        torch.testing.assert_close(e.each, e.patched_each.double() - clean, atol=1e-6, rtol=0)
        assert float(e.each.mean()) == pytest.approx(e.effect, abs=1e-5)
        lo, hi = bootstrap_ci(e.each, 400, 0.9, 0)
        assert e.interval == pytest.approx((float(lo), float(hi)), abs=1e-9)
        assert e.interval[0] <= e.effect <= e.interval[1]
        assert e.to_json()["ci"] == pytest.approx(list(e.interval))
    strongest = result.edges[0]
    assert strongest.interval[0] > 0.05  # 0.1 -> 1.3 through K carries the induction on every resample

    evidence = ck.circuit_evidence(bundled, tokens=batch, n_patch=3, n_resamples=400, ci_level=0.9)
    for e in evidence.patching.edges:
        alone = path_patching(bundled, [(e.src, e.dst, e.channel)], tokens=batch, n_resamples=400,
                              ci_level=0.9).edges[0]
        torch.testing.assert_close(e.each, alone.each, atol=1e-6, rtol=0)
        assert e.interval == pytest.approx(alone.interval, abs=1e-6)

    scan = ck.scan(bundled, tokens=tokens, n_resamples=300, ci_level=0.8)
    for e in scan.verified.edges.edges:
        assert e.interval == pytest.approx(scan.intervals["edges"][(e.src, e.dst, e.channel)], abs=1e-9)

    local = path_patching(bundled, edges[:1], tokens=batch, metric="induction").edges[0]
    assert local.each is None and local.interval is None and local.to_json()["ci"] is None
    one = path_patching(bundled, edges[:1], tokens=RepeatedTokens(batch=1)).edges[0]
    assert one.each.shape == (1,) and one.interval is None  # no interval from one sequence
    for bad in ({"n_resamples": 1}, {"ci_level": 1.0}, {"ci_level": "0.9"}):
        with pytest.raises(CircuitkitError, match="path_patching"):
            path_patching(bundled, edges[:1], tokens=batch, **bad)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"edges": [((1, 0), (1, 2))]}, "src layer < dst layer"),
        ({"edges": [((1, 0), (0, 2))]}, "src layer < dst layer"),
        ({"edges": [((0, 4), (1, 0))]}, "head"),
        ({"edges": [((0, 0), (2, 0))]}, "layer"),
        ({"edges": [((0, 0), (1, 0), "x")]}, "channel"),
        ({"edges": [((0, 0), (1, 0))], "input": "o"}, "input"),
        ({"edges": [((0, 0), (1, 0))], "metric": "accuracy"}, "metric"),
        ({"edges": [((0, 0), (1, 0))], "corrupt": "zero"}, "corrupt"),
        ({"edges": [((0, 0), (1, 0))], "edges_per_pass": 0}, "edges_per_pass"),
        ({"edges": "0.0->m1"}, "edges.*tasks.edge_effects measures it"),  # a name, but not of an edge of heads
        ({"edges": b"0.0->1.0"}, "edges"),
        ({"edges": ["0.0->1.0:o"]}, "edges"),
        ({"edges": []}, "at least one edge"),
        ({"edges": [((0, 0.5), (1, 0))]}, "head"),
        ({"edges": [(0, 1)]}, "src"),
    ],
)
def test_bad_input_raises_one_clear_error(bundled, kwargs, match):
    with pytest.raises(CircuitkitError, match=match):
        path_patching(bundled, **kwargs)


def test_resampled_batch_keeps_layout_and_breaks_every_repeat(bundled):
    batch = RepeatedTokens(block_len=8, n_repeats=3, batch=4).build(bundled)
    corrupted = resampled_batch(batch)
    assert corrupted.tokens.shape == batch.tokens.shape and corrupted.bos == batch.bos == 0
    assert bool((corrupted.tokens[:, 0] == 0).all()) and bool((corrupted.tokens[:, 1:] != 0).all())
    copies = corrupted.tokens[:, 1:].reshape(4, 3, 8)
    assert not bool((copies[:, 0] == copies[:, 1]).all(-1).any())
    later = resampled_batch(batch, copies="later")
    assert torch.equal(later.tokens[:, :9], batch.tokens[:, :9])
    assert not torch.equal(later.tokens[:, 9:], batch.tokens[:, 9:])


def test_the_context_holds_key_value_weights_once_per_group(toy):
    """The edge measurements' context reads keys and values through the model's own grouped weights (no copy per
    query head); a layer's receivers in edge attribution's runner get each query head's matrix of its group."""
    from circuitkit.circuits._engine import context
    from circuitkit.circuits.attribution import attribute, edge_runner
    from circuitkit.circuits.metrics import resolve_metric

    ctx = context(toy, RepeatedTokens(block_len=5, batch=2, bos=False), "resample", 0, None, "test")
    w = toy.head_weights()
    assert tuple(ctx.W_in["k"].shape) == tuple(ctx.W_in["v"].shape) == tuple(w.W_K.shape)
    m = resolve_metric("loss", "test")
    attribute(ctx, m)
    runner = edge_runner(ctx, m)
    for layer in range(w.n_layers):
        want = torch.cat([w.W_Q[layer], w.per_query_head("W_K")[layer], w.per_query_head("W_V")[layer]])
        got = torch.cat([runner._receiver_weights(c, layer) for c in "qkv"])
        assert torch.equal(got, want)


def test_the_batch_mean_corruption_of_one_sequence_is_refused(bundled):
    """The mean of one sequence is that sequence: patched to it, every edge would change nothing (effect exactly 0,
    estimate exactly 0). Refused in words for both measurements; two sequences measure an effect."""
    from circuitkit.circuits import edge_attribution

    one = RepeatedTokens(batch=1)
    for call in (lambda: path_patching(bundled, [((0, 1), (1, 3), "k")], tokens=one, corrupt="mean"),
                 lambda: edge_attribution(bundled, tokens=one, corrupt="mean")):
        with pytest.raises(CircuitkitError, match="at least 2 sequences for corrupt='mean'"):
            call()
    two = path_patching(bundled, [((0, 1), (1, 3), "k")], tokens=RepeatedTokens(batch=2), corrupt="mean")
    assert two.edges[0].effect != 0.0
