"""A model whose layers are offloaded (accelerate, through load_model's device_map) scores like the same model
loaded whole: head scores, attribution, exact ablation, composition, edge attribution and path patching, and the
whole scan.

The machine has no GPU, so "sharded" here means some decoder layers offloaded to disk (their parameters sit on the
meta device and accelerate's hooks bring them in for each forward), the rest on the CPU: the path a model larger
than its device takes. Tiny random GPT-2 and Llama (grouped-query) checkpoints are saved with ``save_pretrained``.
"""

from __future__ import annotations

import pytest
import torch

from circuitkit.composition import composition_scores
from circuitkit.detect import RepeatedTokens, ablation_effects, attribution_effects, head_scores
from circuitkit.models import load_model

SHARD_TOL = 1e-6
"""Both models run the same float32 operations on the same weights; only where the weights wait between
forwards differs. Measured differences are 0; 1e-6 allows a different kernel order on another platform."""

TOKENS = RepeatedTokens(block_len=6, batch=3, seed=4)


def save_gpt2(path):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=3, n_head=4, n_embd=32, vocab_size=60, n_positions=64, bos_token_id=0, eos_token_id=0
    )
    GPT2LMHeadModel(config).save_pretrained(path)
    layers = {f"transformer.h.{i}": device for i, device in enumerate(["cpu", "disk", "disk"])}
    return {"transformer.wte": "cpu", "transformer.wpe": "cpu", **layers, "transformer.ln_f": "cpu", "lm_head": "cpu"}


def save_llama(path):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    config = LlamaConfig(
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, hidden_size=32, intermediate_size=64,
        vocab_size=60, max_position_embeddings=64, bos_token_id=0, eos_token_id=0, pad_token_id=None,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    layers = {f"model.layers.{i}": device for i, device in enumerate(["disk", "cpu", "disk"])}
    return {"model.embed_tokens": "cpu", **layers, "model.norm": "cpu", "lm_head": "cpu"}


@pytest.fixture(scope="module", params=[save_gpt2, save_llama], ids=["gpt2", "llama-gqa"])
def pair(request, tmp_path_factory):
    """(the model loaded whole, the same checkpoint with layers offloaded to disk)."""
    root = tmp_path_factory.mktemp(request.param.__name__)
    device_map = request.param(root / "model")
    whole = load_model(root / "model")
    sharded = load_model(root / "model", device_map=device_map, offload_folder=str(root / "offload"))
    devices = {p.device.type for p in sharded.parameters()}
    assert devices == {"cpu", "meta"}, devices  # some layers really are offloaded
    return whole, sharded


def test_pattern_scores_equal(pair):
    whole, sharded = pair
    a, b = head_scores(whole, TOKENS), head_scores(sharded, TOKENS)
    assert torch.equal(a.tokens, b.tokens)
    patterns = [name for name in a if a.definitions[name].kind == "pattern"]
    assert len(patterns) >= 5
    for name in patterns:
        torch.testing.assert_close(b[name], a[name], atol=SHARD_TOL, rtol=0, equal_nan=True, msg=name)
    torch.testing.assert_close(b.patterns, a.patterns, atol=SHARD_TOL, rtol=0)


@pytest.mark.parametrize("method", ["mean", "zero"])
def test_attribution_equal_and_no_gradients_left(pair, method):
    whole, sharded = pair
    a, b = attribution_effects(whole, TOKENS, method=method), attribution_effects(sharded, TOKENS, method=method)
    assert b.clean_loss == pytest.approx(a.clean_loss, abs=SHARD_TOL)
    torch.testing.assert_close(b.effect, a.effect, atol=SHARD_TOL, rtol=0)
    assert float(a.effect.abs().max()) > 100 * SHARD_TOL
    assert all(p.grad is None for p in sharded.parameters())


@pytest.mark.parametrize("resume", [True, False], ids=["resumed", "full-passes"])
def test_ablation_equal(pair, resume):
    whole, sharded = pair
    a = ablation_effects(whole, TOKENS, resume=resume)
    b = ablation_effects(sharded, TOKENS, resume=resume)
    assert torch.equal(a.exact, b.exact) and bool(a.exact.all())
    torch.testing.assert_close(b.effect, a.effect, atol=SHARD_TOL, rtol=0)



@pytest.mark.parametrize("metric", ["loss", "induction"])
def test_edge_attribution_and_path_patching_equal(pair, metric):
    """The edge engine reads each receiver's ln1 (weight, eps, and calls it) outside the block's forward: on an
    offloaded layer that must bring the norm's weights in too."""
    from circuitkit.circuits import circuit_evidence

    whole, sharded = pair
    a = circuit_evidence(whole, metric=metric, tokens=TOKENS, top_k=4)
    b = circuit_evidence(sharded, metric=metric, tokens=TOKENS, top_k=4)
    # relative to each result's scale: the induction effects of a random tiny GPT-2 are ~1e-5
    scale = float(a.attribution.scores.nan_to_num().abs().max())
    assert scale > 0
    torch.testing.assert_close(b.attribution.scores, a.attribution.scores, atol=SHARD_TOL * scale, rtol=SHARD_TOL,
                               equal_nan=True)
    assert [e.name for e in b.patching.edges] == [e.name for e in a.patching.edges]
    scale = float(a.patching.effects.abs().max())
    assert scale > 0
    torch.testing.assert_close(b.patching.effects, a.patching.effects, atol=SHARD_TOL * scale, rtol=SHARD_TOL)
    assert all(p.grad is None for p in sharded.parameters())


def test_scan_equal(pair):
    """The whole pipeline on the offloaded model (edge evidence where a circuit is found). Every head is ablated:
    the top-k by |attribution| of a random model has near-ties that float rounding may order either way, and what is
    compared here is each head's exact effect, not which heads the estimate picks."""
    from circuitkit import scan

    whole, sharded = pair
    a = scan(whole, tokens=TOKENS, ablate="all", progress=False)
    b = scan(sharded, tokens=TOKENS, ablate="all", progress=False)
    torch.testing.assert_close(b.ablation.effect, a.ablation.effect, atol=SHARD_TOL, rtol=0)
    # edge evidence serves the circuit: a random tiny model has none, so both skip it (the evidence itself is
    # compared on the offloaded model above)
    assert (a.verified is None) == (b.verified is None) and (a.circuit is None) == (a.verified is None)
    if a.circuit is not None:
        assert [r.name for r in b.circuit.rows] == [r.name for r in a.circuit.rows] and a.circuit.rows
        torch.testing.assert_close(torch.tensor([r.attribution for r in b.circuit.rows]),
                                   torch.tensor([r.attribution for r in a.circuit.rows]), atol=SHARD_TOL,
                                   rtol=SHARD_TOL)


def test_weight_scores_equal(pair):
    whole, sharded = pair
    a, b = head_scores(whole, TOKENS), head_scores(sharded, TOKENS)
    assert list(b) == list(a)
    torch.testing.assert_close(b["copying"], a["copying"], atol=SHARD_TOL, rtol=0)


@pytest.mark.parametrize("mode", ["Q", "K", "V"])
def test_composition_equal(pair, mode):
    whole, sharded = pair
    torch.testing.assert_close(
        composition_scores(sharded, mode), composition_scores(whole, mode), atol=SHARD_TOL, rtol=0
    )


def test_auto_map_under_a_memory_cap_offloads_and_scores_the_same(tmp_path):
    """``device_map="auto"`` with a CPU cap smaller than the model puts the remaining layers on disk."""
    save_gpt2(tmp_path / "model")
    whole = load_model(tmp_path / "model")
    sharded = load_model(
        tmp_path / "model", device_map="auto", max_memory={"cpu": "60KB"}, offload_folder=str(tmp_path / "offload")
    )
    assert "meta" in {p.device.type for p in sharded.parameters()}
    torch.testing.assert_close(
        attribution_effects(sharded, TOKENS).effect, attribution_effects(whole, TOKENS).effect, atol=SHARD_TOL, rtol=0
    )
    torch.testing.assert_close(
        head_scores(sharded, TOKENS)["induction"], head_scores(whole, TOKENS)["induction"], atol=SHARD_TOL, rtol=0
    )


def test_task_scan_equal(pair):
    """A task's scan on the offloaded model: its EAP-IG reads each receiver's norm weight and pulls gradients back
    through the norm outside the block's forward pass, which on an offloaded layer must bring the weights in."""
    from circuitkit.tasks import Task, scan_task
    from tests.test_tasks import toy_pairs

    whole, sharded = pair
    task = Task.from_pairs(toy_pairs(8), name="toy")
    a = scan_task(whole, task, target=0.8, n_resamples=50, progress=False)
    b = scan_task(sharded, task, target=0.8, n_resamples=50, progress=False)
    torch.testing.assert_close(b.scores, a.scores, atol=SHARD_TOL, rtol=SHARD_TOL)  # EAP-IG's node scores
    assert b.circuit.heads == a.circuit.heads and b.circuit.edges == a.circuit.edges and a.circuit.edges
    assert b.circuit.faithfulness == pytest.approx(a.circuit.faithfulness, abs=SHARD_TOL)
    assert all(p.grad is None for p in sharded.parameters())
