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
from circuitkit.models.adapters import adapt
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


@pytest.mark.parametrize("norm", ["LN", "RMS"])
def test_each_estimate_is_the_derivative_of_a_hand_patched_receiver_input(norm):
    """Independent oracle through the model's own norm module and autograd: for edge (s, r, c) add
    ``(ln1(resid + eps * delta_s) - ln1(resid)) @ W_c[r]`` to receiver r's channel c with a hook and take
    ``d metric / d eps`` at 0; the attribution is exactly that derivative (LayerNorm and RMSNorm, MLPs)."""
    from circuitkit.circuits.corrupt import resampled_batch
    from circuitkit.models.adapters import HOOKS, adapt

    model = boot_bridge(n_layers=3, attn_only=False, normalization_type=norm, seed=3)
    metric = _linear_metric(50)
    batch = RepeatedTokens(block_len=6, batch=2, bos=False).build(model)
    corrupted = resampled_batch(batch)
    attribution = edge_attribution(model, metric=metric, tokens=batch, corrupt=corrupted)
    w = adapt(model).weights()
    with torch.no_grad():
        _, cache = model.run_with_cache(batch.tokens)
        _, corrupt_cache = model.run_with_cache(corrupted.tokens)
    edges = [(src, dst, c) for src, dst in [((0, 1), (2, 0)), ((1, 3), (2, 2)), ((0, 2), (1, 1))] for c in "qkv"]
    got, want = [], []
    for (l1, h1), (l2, h2), c in edges:
        delta = (corrupt_cache[HOOKS.z(l1)] - cache[HOOKS.z(l1)])[:, :, h1] @ w.W_O[l1, h1]
        resid = cache[HOOKS.resid_pre(l2)]
        W = {"q": w.W_Q, "k": w.W_K, "v": w.W_V}[c][l2, h2]
        eps = torch.zeros((), requires_grad=True)
        with torch.enable_grad():
            shift = (model.blocks[l2].ln1(resid + eps * delta) - model.blocks[l2].ln1(resid)) @ W

            def add(act, hook, shift=shift, h2=h2):
                act = act.clone()
                act[:, :, h2] = act[:, :, h2] + shift
                return act

            logits = model.run_with_hooks(batch.tokens, fwd_hooks=[(getattr(HOOKS, c)(l2), add)])
            (derivative,) = torch.autograd.grad(metric(logits, batch), eps)
        want.append(float(derivative))
        got.append(attribution.value((l1, h1), (l2, h2), c))
    want, got = torch.tensor(want, dtype=torch.float64), torch.tensor(got, dtype=torch.float64)
    scale = float(want.abs().max())
    assert scale > 1e-3
    torch.testing.assert_close(got, want, atol=LINEAR_TOL * scale, rtol=LINEAR_TOL)


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
    # the behaviour lost, exact and estimated: the receiver's induction score falls with its K edge patched
    assert best.patched > 0 and best.attribution > 0
    # each patched edge's record carries the estimate beside the exact effect, as a task scan's edges do
    for e in evidence.patching.edges:
        assert e.score == evidence.attribution.value(e.src, e.dst, e.channel) and e.effect is not None
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
"""float32 contractions over d_model = 32 terms, closed form against autograd: ~5e-7 apart (relative)."""


class _LyingLayerNorm(torch.nn.LayerNorm):
    """Reports ``eps`` and ``weight`` like a LayerNorm but computes twice a LayerNorm: a closed form read from
    the attributes would be wrong, so the check against autograd must send it to the generic pullback."""

    def forward(self, x):
        return 2 * super().forward(x)


@pytest.mark.parametrize("kind", ["LN", "LNPre", "RMS", "RMSPre", "unknown", "lying"])
def test_receiver_contraction_equals_autograd(kind):
    """``sum_n delta[s, n] . J_norm(x_n)^T (W_k grad[k, n])`` for every sender s and receiver channel k, as the
    attribution computes it (closed form for LayerNorm / RMSNorm, autograd for any other norm or one whose
    attributes do not describe it), equals autograd through the norm on an expanded input, cotangent by
    cotangent; and summing over chunks of positions equals the whole."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from circuitkit.graph.pullback import ReceiverGradients, closed_form

    g = torch.Generator().manual_seed(0)
    d_model, d_head, k, n, senders = 32, 4, 6, 20, 5
    if kind.startswith("LN"):
        norm = torch.nn.LayerNorm(d_model, elementwise_affine=kind == "LN")
    elif kind.startswith("RMS"):
        norm = LlamaRMSNorm(d_model, eps=1e-6)
    elif kind == "lying":
        norm = _LyingLayerNorm(d_model)
    else:
        norm = torch.nn.Tanh()  # any differentiable per-position map: only the generic path applies
    if kind in ("LN", "RMS", "lying"):
        norm.weight.data = torch.randn(d_model, generator=g)
    x = torch.randn(n, d_model, generator=g)
    grad = torch.randn(k, n, d_head, generator=g)
    W = torch.randn(k, d_head, d_model, generator=g)
    deltas = torch.randn(senders, n, d_model, generator=g)

    cot = torch.matmul(grad, W)  # [k, n, d_model]
    expanded = x[None].expand(k, n, d_model).detach().requires_grad_(True)
    (pulled,) = torch.autograd.grad(norm(expanded), expanded, grad_outputs=cot)
    reference = deltas.flatten(1) @ pulled.flatten(1).T  # [senders, k]

    form = closed_form(norm, {"lying": "LN", "unknown": None}.get(kind, kind), x)
    assert (form is not None) == (kind not in ("unknown", "lying"))  # the closed form where it applies
    receiver = ReceiverGradients.from_parts(grad, W, norm, x, form)
    torch.testing.assert_close(receiver.pulled(), pulled, atol=NORM_VJP_TOL * float(pulled.abs().max()),
                               rtol=NORM_VJP_TOL)
    got = deltas.flatten(1) @ receiver.pulled().flatten(1).T
    torch.testing.assert_close(got, reference, atol=NORM_VJP_TOL * float(reference.abs().max()), rtol=NORM_VJP_TOL)
    chunked = sum(deltas[:, part].flatten(1)
                  @ ReceiverGradients.from_parts(grad[:, part], W, norm, x[part], form).pulled().flatten(1).T
                  for part in (slice(0, 7), slice(7, n)))
    torch.testing.assert_close(chunked, got, atol=NORM_VJP_TOL * float(reference.abs().max()), rtol=NORM_VJP_TOL)


def test_pairs_in_blocks_give_the_same_attribution(monkeypatch):
    """The sum over the sequences taken a few at a time (the senders' deltas held within the runner's budget: bounded
    memory) equals the one-block sum, the clean point from the tap included; the runner's every node score and each
    pair's term too, with the corrupted run read from the pass (EAP-IG's own points)."""
    from circuitkit.circuits import attribution as module
    from circuitkit.graph.runner import TaskRunner
    from circuitkit.tasks import repeated_tokens

    model = boot_bridge(n_layers=3, attn_only=False, normalization_type="LN", seed=4)
    batch = RepeatedTokens(block_len=6, batch=3, bos=False).build(model)
    whole = edge_attribution(model, metric="loss", tokens=batch, steps=2)

    class OnePairABlock(TaskRunner):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.budget = 1  # the deltas of one pair a block

    monkeypatch.setattr(module, "TaskRunner", OnePairABlock)
    chunked = edge_attribution(model, metric="loss", tokens=batch, steps=2)
    torch.testing.assert_close(chunked.scores, whole.scores, equal_nan=True, atol=1e-6, rtol=1e-5)
    assert float(whole.scores.nan_to_num().abs().max()) > 1e-3

    adapter = adapt(model)
    task = repeated_tokens(model, 3, block_len=6, ablation="corrupted")
    runs = []
    for runner_type in (TaskRunner, OnePairABlock):
        runner = runner_type(adapter, task.tokenize(adapter), task.metric, mlps=True, ablation="corrupted")
        runner.keep_node_pairs = True
        runs.append((runner.attribute(2, "left"), runner.node_pairs))
    ((one, one_nodes, _), one_pairs), ((blocks, block_nodes, _), block_pairs) = runs
    torch.testing.assert_close(blocks, one, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(block_nodes, one_nodes, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(block_pairs, one_pairs, atol=1e-6, rtol=1e-5)
    assert float(one.abs().max()) > 1e-3


@pytest.mark.parametrize("metric", ["loss", "induction"])
def test_passes_ended_early_leave_no_hooks_behind(metric):
    """The corrupted pass (and the induction metric's clean pass) end at the last activation they need by
    raising from a hook; the model's hooks are all removed and a later plain run is unchanged."""
    model = boot_bridge(n_layers=3, attn_only=False, normalization_type="LN", seed=5)
    batch = RepeatedTokens(block_len=6, batch=2, bos=False).build(model)

    def hook_count():
        return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())

    before, count = model(batch.tokens).detach(), hook_count()
    edge_attribution(model, metric=metric, tokens=batch)
    assert hook_count() == count
    torch.testing.assert_close(model(batch.tokens), before, atol=0, rtol=0)


@pytest.mark.parametrize("metric", ["loss", "induction"])
def test_circuit_evidence_reuses_the_attribution_runs(metric):
    """circuit_evidence patches with the clean activations and corrupted z the attribution's two passes left:
    its patched effects equal a separate path_patching call, and only those two passes embed tokens (every
    patched pass resumes at the receiver's layer). GQA with LayerNorm and MLPs covers the restored group heads."""
    model = boot_bridge(n_layers=3, attn_only=False, normalization_type="LN", n_key_value_heads=2, seed=6)
    batch = RepeatedTokens(block_len=6, batch=2, bos=False).build(model)
    embedded = []
    handle = model.embed.register_forward_hook(lambda *args: embedded.append(1))
    try:
        evidence = circuit_evidence(model, metric=metric, tokens=batch, top_k=4)
    finally:
        handle.remove()
    assert len(embedded) == 2
    edges = [(e.src, e.dst, e.channel) for e in evidence.patching.edges]
    alone = path_patching(model, edges, metric=metric, tokens=batch)
    torch.testing.assert_close(evidence.patching.effects, alone.effects, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(torch.tensor([e.clean for e in evidence.patching.edges]),
                               torch.tensor([e.clean for e in alone.edges]), atol=1e-6, rtol=1e-5)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on the GPU machine)")
def test_cuda_evidence_equals_cpu():
    """Edge attribution and path patching on the GPU equal the CPU run (GQA, LayerNorm, MLPs)."""
    cpu_model = boot_bridge(n_layers=3, attn_only=False, normalization_type="LN", n_key_value_heads=2, seed=8)
    batch = RepeatedTokens(block_len=6, batch=2, bos=False).build(cpu_model)
    cpu = circuit_evidence(cpu_model, tokens=batch, top_k=4)
    gpu_model = boot_bridge(n_layers=3, attn_only=False, normalization_type="LN", n_key_value_heads=2, seed=8)
    gpu = circuit_evidence(gpu_model, tokens=batch, top_k=4, device="cuda")
    scale = float(cpu.attribution.scores.nan_to_num().abs().max())
    torch.testing.assert_close(gpu.attribution.scores, cpu.attribution.scores, equal_nan=True,
                               atol=1e-4 * scale, rtol=1e-3)
    assert [e.name for e in gpu.patching.edges] == [e.name for e in cpu.patching.edges]
    torch.testing.assert_close(gpu.patching.effects, cpu.patching.effects, atol=1e-4, rtol=1e-3)


def test_a_model_that_never_calls_its_query_hooks_is_one_clear_error(monkeypatch):
    model = boot_bridge(n_layers=2)
    run_with_hooks = model.run_with_hooks

    def without_q(tokens, fwd_hooks=(), **kwargs):
        return run_with_hooks(tokens, fwd_hooks=[(n, f) for n, f in fwd_hooks if not str(n).endswith("hook_q")],
                              **kwargs)

    monkeypatch.setattr(model, "run_with_hooks", without_q)
    with pytest.raises(CircuitkitError, match="without calling the hooks for q of layer 1.*hook_q"):
        edge_attribution(model, tokens=RepeatedTokens(block_len=5, batch=2, bos=False))


@pytest.mark.parametrize("kv", [None, 2], ids=["mha", "gqa"])
def test_the_task_runner_pulls_back_through_the_same_closed_form(kv):
    """A task's EAP-IG pulls each receiver's gradient back through its attention norm with the induction scan's
    closed form (graph/pullback.py), not by autograd on the norm's input repeated per receiver: the form is found
    for every layer, and the result equals that autograd pullback for each channel."""
    from circuitkit.graph.runner import TaskRunner
    from circuitkit.models.adapters import adapt
    from circuitkit.tasks import Task
    from tests.conftest import boot_bridge
    from tests.test_tasks import toy_pairs

    adapter = adapt(boot_bridge(attn_only=False, n_layers=2, n_key_value_heads=kv, seed=4))
    runner = TaskRunner(adapter, Task.from_pairs(toy_pairs(6)).tokenize(adapter), "logit_diff", mlps=True,
                        ablation="corrupted", kv_edges="per-query-head")
    g = torch.Generator().manual_seed(0)
    steps = 2
    N, P = steps * runner.batch.n_pairs, runner.batch.pos
    resid = {1: torch.randn(N, P, adapter.spec.d_model, generator=g)}
    for channel in ("q", "k", "v"):
        R = adapter.spec.n_heads  # keys and values too: a group's gradient arrives split by query head g * Q + j
        grad = torch.randn(N, P, R, adapter.spec.d_head, generator=g)
        got = runner._pulled_back((channel, 1), grad, resid, steps)
        cot = torch.einsum("npre,rme->rnpm", grad, runner._receiver_weights(channel, 1))
        x = resid[1][None].expand(R, N, P, -1).reshape(R * N, P, -1).requires_grad_(True)
        (want,) = torch.autograd.grad(runner.norms[1](x), x, cot.reshape(R * N, P, -1))
        want = want.reshape(R, steps, -1).sum(1)
        torch.testing.assert_close(got, want, atol=NORM_VJP_TOL * float(want.abs().max()), rtol=NORM_VJP_TOL)
    assert runner._norm_forms[1] is not None  # the closed form, not the autograd fallback
