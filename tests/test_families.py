"""The family matrix: every model family in :data:`circuitkit.models.families.FAMILIES`, built offline from its
transformers config (tiny, random weights, ``save_pretrained`` to a temporary directory) and loaded through
``circuitkit.load_model``, checked against independent oracles:

- the bridge's logits equal Hugging Face's (eager attention);
- the pattern scores from circuitkit's hooks equal the same scores computed here, by loops, from Hugging Face's
  own ``output_attentions``; the sliding windows the adapter reports are the ones Hugging Face applies;
- ``HeadWeights.from_model`` reproduces the hooks: ``q, k, v = norm(resid_pre) @ W + b`` and, where the family's
  heads add into the residual stream, ``attn_out = sum_h z_h @ W_O[h] + b_O`` (and where they do not, it differs,
  which is why edge evidence is refused there);
- composition scores equal TransformerLens's ``all_composition_scores``;
- a scan runs end to end (attribution, exact ablation of the top head, edge evidence where it applies).

The README's table of supported families is generated from the same list (:func:`table_rows`).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

import circuitkit as ck
from circuitkit import CircuitkitError, HeadWeights
from circuitkit.composition import composition_scores
from circuitkit.detect import RepeatedTokens, head_scores
from circuitkit.models import load_model
from circuitkit.models.adapters import HOOKS, adapt
from circuitkit.models.families import FAMILIES, README_END, README_START, table_rows
from tests.conftest import unembedding_split_results

LOGIT_TOL = 1e-5
"""The bridge runs Hugging Face's own modules: float32 agreement measured at <= 2e-7; margin for BLAS order."""
SCORE_TOL = 1e-5
"""Pattern scores are means of probabilities from the same modules: measured <= 1e-7."""
HOOK_TOL = 1e-5
"""x @ W + b against the model's own projection (fused or split): measured <= 1e-7."""
COMPOSITION_TOL = 1e-5
"""circuitkit's factored scores against TransformerLens's dense ones: measured <= 2e-7."""
NON_ADDITIVE_GAP = 0.1
"""Where a norm or a scale follows the attention, the sums differ by a fraction of their size (measured >= 0.3)."""

VOCAB = 96
WINDOW = 4
"""Sliding windows shorter than the test sequences, so that a window is visible in the patterns."""
BASE = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64)
GQA = dict(BASE, num_key_value_heads=2)
GPT2_LIKE = dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64)

CONFIGS = {
    # family name (as in FAMILIES): (config class, model class, tiny config: 2 layers, d_model 32, 4 heads)
    "GPT-2": ("GPT2Config", "GPT2LMHeadModel", GPT2_LIKE),
    "GPT-J": ("GPTJConfig", "GPTJForCausalLM", dict(GPT2_LIKE, rotary_dim=4)),
    "GPT-Neo": ("GPTNeoConfig", "GPTNeoForCausalLM", dict(
        vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4, max_position_embeddings=64,
        attention_types=[[["global", "local"], 1]], window_size=WINDOW)),
    "GPT-NeoX / Pythia": ("GPTNeoXConfig", "GPTNeoXForCausalLM", BASE),
    "OPT": ("OPTConfig", "OPTForCausalLM", dict(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=64,
        max_position_embeddings=64, word_embed_proj_dim=32)),
    "BLOOM": ("BloomConfig", "BloomForCausalLM", dict(vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4)),
    "Falcon": ("FalconConfig", "FalconForCausalLM", dict(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, multi_query=True, alibi=True,
        parallel_attn=True, new_decoder_architecture=False, bias=False)),
    "Llama": ("LlamaConfig", "LlamaForCausalLM", GQA),
    "Mistral": ("MistralConfig", "MistralForCausalLM", dict(GQA, sliding_window=WINDOW)),
    "Mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(GQA, num_local_experts=4, num_experts_per_tok=2)),
    "Qwen2": ("Qwen2Config", "Qwen2ForCausalLM", GQA),
    "Qwen2-MoE": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", dict(
        GQA, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)),
    "Qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(GQA, head_dim=8)),
    "Qwen3-MoE": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        GQA, head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)),
    "Gemma": ("GemmaConfig", "GemmaForCausalLM", dict(GQA, head_dim=8)),
    "Gemma 2": ("Gemma2Config", "Gemma2ForCausalLM", dict(
        GQA, head_dim=8, sliding_window=WINDOW, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
        query_pre_attn_scalar=8)),
    "Gemma 3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        GQA, head_dim=8, sliding_window=WINDOW, query_pre_attn_scalar=8,
        layer_types=["sliding_attention", "full_attention"])),
    "Phi": ("PhiConfig", "PhiForCausalLM", BASE),
    "Phi-3": ("Phi3Config", "Phi3ForCausalLM", dict(GQA, pad_token_id=0)),
    "OLMo": ("OlmoConfig", "OlmoForCausalLM", dict(GQA, pad_token_id=0)),
    "OLMo 2": ("Olmo2Config", "Olmo2ForCausalLM", dict(GQA, pad_token_id=0)),
    "OLMo 3": ("Olmo3Config", "Olmo3ForCausalLM", dict(GQA, pad_token_id=0, sliding_window=WINDOW)),
    "OLMoE": ("OlmoeConfig", "OlmoeForCausalLM", dict(GQA, num_experts=4, num_experts_per_tok=2, pad_token_id=0)),
    "StableLM": ("StableLmConfig", "StableLmForCausalLM", GQA),
    "GPT-BigCode / StarCoder": ("GPTBigCodeConfig", "GPTBigCodeForCausalLM", dict(GPT2_LIKE, multi_query=True)),
    "StarCoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", GQA),
    "CodeGen": ("CodeGenConfig", "CodeGenForCausalLM", dict(GPT2_LIKE, rotary_dim=4)),
    "MPT": ("MptConfig", "MptForCausalLM", dict(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, max_seq_len=64)),
    "XGLM": ("XGLMConfig", "XGLMForCausalLM", dict(
        vocab_size=VOCAB, d_model=32, num_layers=2, attention_heads=4, ffn_dim=64, max_position_embeddings=64)),
    "Granite": ("GraniteConfig", "GraniteForCausalLM", dict(GQA, residual_multiplier=0.5)),
    "Granite-MoE": ("GraniteMoeConfig", "GraniteMoeForCausalLM", dict(
        GQA, num_local_experts=4, num_experts_per_tok=2, residual_multiplier=0.5)),
    "Cohere": ("CohereConfig", "CohereForCausalLM", GQA),
    "Cohere 2": ("Cohere2Config", "Cohere2ForCausalLM", dict(
        GQA, sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"])),
    "EXAONE 4": ("Exaone4Config", "Exaone4ForCausalLM", dict(GQA, pad_token_id=0)),
    "Nemotron": ("NemotronConfig", "NemotronForCausalLM", GQA),
    "GLM": ("GlmConfig", "GlmForCausalLM", dict(GQA, head_dim=8, pad_token_id=0)),
    "SmolLM3": ("SmolLM3Config", "SmolLM3ForCausalLM", dict(GQA, pad_token_id=0)),
    "OpenAI GPT": ("OpenAIGPTConfig", "OpenAIGPTLMHeadModel", GPT2_LIKE),
    "BERT": ("BertConfig", "BertForMaskedLM", BASE),
    "RoBERTa": ("RobertaConfig", "RobertaForMaskedLM", dict(BASE, pad_token_id=1)),
}
NAMES = [family.name for family in FAMILIES]
BY_NAME = {family.name: family for family in FAMILIES}
TOKENS = RepeatedTokens(block_len=5, n_repeats=2, batch=2, seed=0, bos=False, token_range=(4, VOCAB))
"""Two sequences of a 5-token block repeated: 10 positions, longer than the sliding windows."""


def _family_id(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


@pytest.fixture(scope="module", params=NAMES, ids=[_family_id(n) for n in NAMES])
def built(request, tmp_path_factory):
    """(family, Hugging Face model in eager attention, bridge loaded by circuitkit from the saved directory)."""
    import transformers

    name = request.param
    config_class, model_class, sizes = CONFIGS[name]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**sizes)
    config._attn_implementation = "eager"  # as the bridge runs it (some families pick attention classes at init)
    hf = getattr(transformers, model_class)(config).eval()
    directory = tmp_path_factory.mktemp(_family_id(name))
    hf.save_pretrained(str(directory), safe_serialization=True)
    return BY_NAME[name], hf, load_model(str(directory))


def test_every_family_in_the_table_has_a_test_config():
    assert sorted(CONFIGS) == sorted(NAMES)
    assert len(NAMES) >= 25


def test_readme_table_is_generated_from_the_family_list():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    start, end = README_START, README_END
    assert start in readme and end in readme
    assert readme.split(start)[1].split(end)[0].strip() == table_rows().strip()
    assert readme.index("## Supported model families") < readme.index(start) < readme.index("## Conventions")


def test_logits_equal_hugging_face(built):
    family, hf, bridge = built
    tokens = TOKENS.build(bridge).tokens
    with torch.no_grad():
        torch.testing.assert_close(bridge(tokens), hf(tokens).logits, atol=LOGIT_TOL, rtol=0)
    assert adapt(bridge).spec.family == f"{family.name} (TransformerBridge)"


def _oracle_scores(attentions: list[torch.Tensor], tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """Induction and previous-token scores [layer, head] from attention probabilities, by loops over positions:
    induction: attention from query q to every key k (1 <= k <= q) whose previous token tokens[k-1] equals
    tokens[q], summed, averaged over the rows that have such a key; previous-token: attention to q-1, q >= 1."""
    batch, pos = tokens.shape
    induction = torch.zeros(len(attentions), attentions[0].shape[1], dtype=torch.float64)
    previous = torch.zeros_like(induction)
    rows = 0
    for b in range(batch):
        for q in range(pos):
            keys = [k for k in range(1, q + 1) if tokens[b, k - 1] == tokens[b, q]]
            if keys:
                rows += 1
                for layer, attention in enumerate(attentions):
                    induction[layer] += attention[b, :, q, keys].double().sum(-1)
            if q >= 1:
                for layer, attention in enumerate(attentions):
                    previous[layer] += attention[b, :, q, q - 1].double()
    return {"induction": induction / rows, "previous_token": previous / (batch * (pos - 1))}


def test_head_scores_equal_scores_from_hugging_face_attentions(built):
    family, hf, bridge = built
    scores = head_scores(bridge, TOKENS)
    with torch.no_grad():
        attentions = hf(scores.tokens, output_attentions=True).attentions
    expected = _oracle_scores(list(attentions), scores.tokens)
    for name, value in expected.items():
        torch.testing.assert_close(scores[name].double(), value, atol=SCORE_TOL, rtol=0)


def test_sliding_windows_are_the_ones_hugging_face_applies(built):
    """Per layer, the keys the last query sees in Hugging Face's own attention (a causal model) equal the
    adapter's window (all positions where it reports none)."""
    family, hf, bridge = built
    spec = adapt(bridge).spec
    tokens = TOKENS.build(bridge).tokens
    pos = tokens.shape[1]
    with torch.no_grad():
        attentions = hf(tokens, output_attentions=True).attentions
    for layer, attention in enumerate(attentions):
        seen = int((attention[0, :, -1] > 0).sum(-1).max())
        window = spec.visible_keys(layer)
        assert seen == (pos if window is None or spec.bidirectional else min(pos, window)), layer


@pytest.mark.parametrize("name", ["Mistral", "Gemma 2"])
def test_neutral_score_counts_only_the_keys_a_head_sees(name, tmp_path):
    """A head attending uniformly to what it sees scores, on previous-token, mean over q >= 1 of 1/min(q+1, w)
    in a window-w layer, 1/(q+1) elsewhere; the neutral value is that, averaged over the layers."""
    import transformers

    config_class, model_class, sizes = CONFIGS[name]
    torch.manual_seed(0)
    getattr(transformers, model_class)(getattr(transformers, config_class)(**sizes)).save_pretrained(str(tmp_path))
    bridge = load_model(str(tmp_path))
    spec = adapt(bridge).spec
    scores = head_scores(bridge, TOKENS)
    pos = scores.tokens.shape[1]
    per_layer = [sum(1 / min(q + 1, w or pos) for q in range(1, pos)) / (pos - 1)
                 for w in (spec.visible_keys(layer) for layer in range(spec.n_layers))]
    assert any(w is not None for w in spec.windows)
    assert scores.definitions["previous_token"].neutral == pytest.approx(sum(per_layer) / len(per_layer), abs=1e-6)


def _mlp_out(layer: int) -> str:
    return f"blocks.{layer}.hook_mlp_out"


def test_weights_reproduce_the_hooks(built):
    """``q, k, v = norm(resid_pre) @ W + b`` (norm: the adapter's, or none); and the adapter's ``additive_heads``
    is true exactly where ``attn_out = sum_h z_h W_O[h] + b_O`` and the next layer's residual stream is
    ``resid_pre + attn_out + mlp_out`` (where either fails, one head's contribution cannot be isolated)."""
    family, hf, bridge = built
    adapter = adapt(bridge)
    n_layers = adapter.spec.n_layers
    names = [f(layer) for layer in range(n_layers)
             for f in (HOOKS.resid_pre, HOOKS.q, HOOKS.k, HOOKS.v, HOOKS.z, HOOKS.attn_out, _mlp_out)]
    kept = {}

    def keep(name):
        def hook(tensor, hook):
            kept[name] = tensor.detach()

        return hook

    tokens = TOKENS.build(bridge).tokens
    gaps = []
    with torch.no_grad():
        adapter.run(tokens, [(name, keep(name)) for name in names])
        w = HeadWeights.from_model(bridge)
        for layer in range(n_layers):
            norm = adapter.attention_norm(layer)
            x = kept[HOOKS.resid_pre(layer)]
            x = norm(x) if norm is not None else x
            for channel, W, b in (("q", w.W_Q, w.b_Q), ("k", w.W_K, w.b_K), ("v", w.W_V, w.b_V)):
                predicted = torch.einsum("bpm,hmd->bphd", x, W[layer]) + (b[layer] if b is not None else 0)
                torch.testing.assert_close(predicted, kept[getattr(HOOKS, channel)(layer)], atol=HOOK_TOL, rtol=0)
            out = torch.einsum("bphd,hdm->bpm", kept[HOOKS.z(layer)], w.W_O[layer])
            out = out + (w.b_O[layer] if w.b_O is not None else 0)
            gaps.append((out, kept[HOOKS.attn_out(layer)]))
            if layer + 1 < n_layers:
                summed = kept[HOOKS.resid_pre(layer)] + kept[HOOKS.attn_out(layer)] + kept[_mlp_out(layer)]
                gaps.append((summed, kept[HOOKS.resid_pre(layer + 1)]))
    absolute = [float((ours - theirs).abs().max()) for ours, theirs in gaps]
    relative = [gap / float(theirs.abs().max()) for gap, (_, theirs) in zip(absolute, gaps, strict=True)]
    if family.additive_heads:
        assert max(absolute) <= HOOK_TOL, absolute
    else:  # the flag that refuses edge evidence is needed
        assert max(relative) > NON_ADDITIVE_GAP, relative


@pytest.mark.parametrize("mode", ["Q", "K", "V"])
def test_composition_equals_transformer_lens(built, mode):
    family, hf, bridge = built
    expected = bridge.all_composition_scores(mode).scores.detach().float()
    ours = composition_scores(HeadWeights.from_model(bridge), mode).float()
    valid = ~expected.isnan()
    torch.testing.assert_close(ours[valid], expected[valid], atol=COMPOSITION_TOL, rtol=0)


def test_scan_runs_end_to_end(built):
    family, hf, bridge = built
    result = ck.scan(bridge, tokens=TOKENS, ablate="top", ablate_top=1, top_k=2, circuit=True)
    assert torch.isfinite(result.head_scores["induction"]).all()
    assert math.isfinite(result.induction_loss.repeated_copies)
    assert result.ablation is not None and result.ablation.exact.any()
    # edge evidence serves the circuit: computed where heads add into the residual stream and a circuit was found
    assert (result.circuit is not None) == (family.additive_heads and result.verified is not None)
    assert ("edges" in [s.name for s in result.stages]) == (result.circuit is not None)
    if family.additive_heads and result.verified is None:  # a random tiny model: the evidence on its own still runs
        evidence = ck.circuit_evidence(bridge, tokens=TOKENS, top_k=2)
        assert evidence.rows and all(math.isfinite(r.attribution) for r in evidence.rows)
    assert result.model.family == f"{family.name} (TransformerBridge)"


def test_task_edge_graph_ends_are_the_clean_and_corrupted_runs(built):
    """The task graph with MLPs in every family whose heads add into the residual stream: every edge kept is the
    clean run and none the corrupted run (the query/key/value, MLP and logits inputs each rebuilt from the senders'
    outputs), and a prompt padded in a batch scores as it does alone."""
    from circuitkit.graph.runner import TaskRunner
    from circuitkit.tasks import Task

    # the shared bridge, after every test above ran on it (an induction scan, resumed passes among them): a resumed
    # pass once dropped the forward TransformerLens sets on Falcon's blocks, and the no-edge end and EAP-IG then
    # read 0.009 and 0.02 off (the blocks' own forwards are now put back: the test below)
    family, hf, bridge = built
    adapter = adapt(bridge)
    if adapter.spec.bidirectional:  # refused in one line
        with pytest.raises(CircuitkitError):
            TaskRunner(adapter, _task_pairs().tokenize(adapter), "logit_diff", mlps=not adapter.attn_only,
                       ablation="corrupted")
        return
    task = _task_pairs()
    runner = TaskRunner(adapter, task.tokenize(adapter), "logit_diff", mlps=not adapter.attn_only,
                        ablation="corrupted")
    # node patching, every family: no head patched is the clean run, every head patched (z from the corrupted
    # prompt, MLPs recomputed) is the corrupted run at the last token (only attention moves information)
    L, H = adapter.spec.n_layers, adapter.spec.n_heads
    none, every = torch.zeros(L, H, dtype=torch.bool), torch.ones(L, H, dtype=torch.bool)
    node_ends = runner.node_metric(torch.stack([none, every]), None)
    assert float(node_ends[0]) == pytest.approx(float(runner.clean["metric"].mean()), abs=1e-4)
    assert float(node_ends[1]) == pytest.approx(float(runner.corrupted["metric"].mean()), abs=1e-4)
    assert runner.edges_defined == family.additive_heads
    # EAP-IG's first point (alpha = 0) is the corrupted run: read from that copy of its pass (node attribution's
    # where edges are not defined), it equals the run apart, and so do the scores
    folded = TaskRunner(adapter, task.tokenize(adapter), "logit_diff", mlps=not adapter.attn_only,
                        ablation="corrupted")
    assert folded.folds_corrupted(3, "left")
    attribute = "attribute" if runner.edges_defined else "node_attribution"
    got, want = getattr(folded, attribute)(3, "left")[0], getattr(runner, attribute)(3, "left")[0]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    for key in ("input", "metric", "logprobs"):
        torch.testing.assert_close(folded.corrupted[key], runner.corrupted[key], rtol=0, atol=1e-5)
    for key in ("z", "mlp"):
        assert set(folded.corrupted[key]) == set(runner.corrupted[key])
        for layer, value in runner.corrupted[key].items():
            torch.testing.assert_close(folded.corrupted[key][layer], value, rtol=0, atol=1e-5)
    if not family.additive_heads:  # node circuits only (graph.runner.EDGES_UNDEFINED)
        return
    allowed = runner.graph.allowed[None]
    ends = runner.edge_metric(torch.cat([allowed, torch.zeros_like(allowed)]))
    assert float(ends[0]) == pytest.approx(float(runner.clean["metric"].mean()), abs=1e-4)
    assert float(ends[1]) == pytest.approx(float(runner.corrupted["metric"].mean()), abs=1e-4)
    # the one exact edge pass (graph/edge_patch: a head's query, key or value, an MLP's input, through the shared ln1
    # in parallel blocks, and the logits; resumed where the family can) against the mask pass missing that edge
    from tests.test_task_passes import _edges_into_every_layer

    edges = _edges_into_every_layer(runner)
    kept = allowed.repeat(len(edges), 1, 1)
    kept[torch.arange(len(edges)), edges[:, 0], edges[:, 1]] = False
    torch.testing.assert_close(runner.single_edge_metric(edges), runner.edge_metric(kept), rtol=0, atol=1e-4)
    alone = TaskRunner(adapter, Task.from_pairs([task.pairs[1]]).tokenize(adapter), "logit_diff",
                       mlps=not adapter.attn_only, ablation="corrupted")
    assert float(alone.clean["metric"][0]) == pytest.approx(float(runner.clean["metric"][1]), abs=1e-4)


def _task_pairs():
    from circuitkit.tasks import Task

    return Task.from_pairs([([5, 9, 12, 7, 9], [5, 11, 12, 7, 9], [12], [5]),
                            ([6, 13, 8, 6], [6, 13, 10, 6], [13], [8])])


def test_edge_evidence_is_refused_where_heads_do_not_add_into_the_residual_stream(tmp_path):
    import transformers

    from circuitkit.circuits import edge_attribution

    config_class, model_class, sizes = CONFIGS["Gemma 2"]
    torch.manual_seed(0)
    getattr(transformers, model_class)(getattr(transformers, config_class)(**sizes)).save_pretrained(str(tmp_path))
    with pytest.raises(CircuitkitError) as info:
        edge_attribution(load_model(str(tmp_path)), tokens=TOKENS)
    message = str(info.value)
    assert "\n" not in message and "Gemma 2" in message and "residual stream" in message


UNSUPPORTED_CONFIGS = {
    "mamba": ("MambaConfig", "MambaForCausalLM", dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                                      state_size=4)),
    "jamba": ("JambaConfig", "JambaForCausalLM", dict(
        GQA, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1, num_experts=2,
        mamba_d_state=4, use_mamba_kernels=False)),
}


@pytest.mark.parametrize("model_type", sorted(UNSUPPORTED_CONFIGS))
def test_families_without_attention_in_every_layer_are_refused_in_one_line(model_type, tmp_path):
    import transformers

    from circuitkit.models.families import UNSUPPORTED

    config_class, model_class, sizes = UNSUPPORTED_CONFIGS[model_type]
    torch.manual_seed(0)
    getattr(transformers, model_class)(getattr(transformers, config_class)(**sizes)).save_pretrained(str(tmp_path))
    with pytest.raises(CircuitkitError) as info:
        load_model(str(tmp_path))
    message = str(info.value)
    assert "\n" not in message and message.startswith("load_model") and UNSUPPORTED[model_type] in message


RESUME_TOL = 1e-5
"""Resuming runs the same modules on the same residual stream: measured <= 1e-6 (BLAS order)."""


def test_resuming_from_a_residual_stream_equals_the_full_pass(built):
    """Exact ablation resumes the forward pass at the first ablated layer (``run_from``): from layer 1's residual
    stream it must give the full pass's logits, whatever the family's block structure (rotary caches, ALiBi,
    bidirectional masks, parallel blocks, experts)."""
    family, hf, bridge = built
    adapter = adapt(bridge)
    assert adapter.can_resume == family.resumable
    tokens = TOKENS.build(bridge).tokens
    kept = {}

    def keep(tensor, hook):
        kept["resid"] = tensor.detach()

    with torch.no_grad():
        full = adapter.run(tokens, [(HOOKS.resid_pre(1), keep)])
        if not family.resumable:  # the family's fact, measured: the bridge's own resumed pass differs
            with pytest.raises(CircuitkitError):
                adapter.run_from(kept["resid"], 1)
            raw = bridge(kept["resid"], start_at_layer=1)
            assert float((raw - full).abs().max()) > RESUME_TOL
            return
        forwards = _block_forwards(bridge)
        resumed = adapter.run_from(kept["resid"], 1)
    torch.testing.assert_close(resumed, full, atol=RESUME_TOL, rtol=0)
    assert _block_forwards(bridge) == forwards  # each block's own forward put back (none, or the one set on it)


def _block_forwards(bridge) -> list:
    """Each wrapped block's instance-level ``forward`` (None where the class's runs)."""
    return [getattr(block, "original_component", block).__dict__.get("forward") for block in bridge.blocks]


def test_resuming_past_the_last_layer_runs_only_the_final_norm_and_unembedding(built):
    """An edge into the logits changes only the final residual stream: ``run_from(final, n_layers)`` must give the
    full pass's logits from it, whatever the family does after its last block (soft-capping, scaled logits,
    biases), and run no block."""
    family, hf, bridge = built
    adapter = adapt(bridge)
    if not family.resumable:
        return  # refused as above: nothing resumes on this family
    tokens = TOKENS.build(bridge).tokens
    L = adapter.spec.n_layers
    kept, blocks_ran = {}, []

    def keep(tensor, hook):
        kept["final"] = tensor.detach()

    def count(tensor, hook):
        blocks_ran.append(hook.name)

    with torch.no_grad():
        full = adapter.run(tokens, [(HOOKS.resid_post(L - 1), keep)])
        if "final" not in kept:  # no final residual stream hook fires (GPT-1's post-norm blocks): the task runner
            return               # keeps none, and an edge into the logits resumes at the last layer instead
        resumed = adapter.run_from(kept["final"], L, [(HOOKS.z(layer), count) for layer in range(L)])
    torch.testing.assert_close(resumed, full, atol=RESUME_TOL, rtol=0)
    assert blocks_ran == []  # no head computed its output


def test_logits_at_the_loss_positions_equal_the_full_pass_there(built):
    """Passes that need only the repeated-copies loss ask for logits at its positions (``positions=``): they equal
    the full pass's logits there, from the start and resumed; families whose Hugging Face class takes
    ``logits_to_keep`` run the unembedding on those positions only (seen at ``unembed.hook_in``)."""
    import inspect

    family, hf, bridge = built
    adapter = adapt(bridge)
    batch = TOKENS.build(bridge)
    at = torch.tensor([1, 4, 6])
    seen = {}

    def keep(tensor, hook):
        seen.setdefault("resid", tensor.detach())

    def unembedded(tensor, hook):
        seen["unembedded"] = tensor.shape[1]

    with torch.no_grad():
        full = adapter.run(batch.tokens, [(HOOKS.resid_pre(1), keep)])
        some = adapter.run(batch.tokens, [("unembed.hook_in", unembedded)], positions=at)
        torch.testing.assert_close(some, full[:, at], atol=RESUME_TOL, rtol=0)
        assert adapter._keeps_logits == ("logits_to_keep" in inspect.signature(hf.forward).parameters)
        assert seen["unembedded"] == (len(at) if adapter._keeps_logits else batch.tokens.shape[1])
        if family.resumable:
            resumed = adapter.run_from(seen["resid"], 1, positions=at)
            torch.testing.assert_close(resumed, full[:, at], atol=RESUME_TOL, rtol=0)


def test_an_unembedding_graph_kept_at_some_positions_gives_the_same_logits_and_gradients(built):
    """``graph_positions=``: every position's logits, the unembedding's autograd graph only at those positions (the
    head attribution's pass). Logits and the gradient of a loss read there equal the full graph's, in every family;
    where ``lm_head`` is a plain ``Linear`` the split is really made (the others keep the full graph)."""
    family, hf, bridge = built
    adapter = adapt(bridge)
    tokens = TOKENS.build(bridge).tokens
    at = torch.tensor([2, 5, 8])
    results = unembedding_split_results(adapter, tokens, at)
    torch.testing.assert_close(results[1][0], results[0][0], atol=RESUME_TOL, rtol=0)
    torch.testing.assert_close(results[1][1], results[0][1], atol=RESUME_TOL, rtol=1e-4)
    head = bridge.unembed.original_component
    split = type(head) is torch.nn.Linear
    assert "forward" not in head.__dict__  # put back after the pass
    assert float(results[0][2].abs().sum()) > 0  # the full graph reaches the other positions ...
    assert (results[1][2] is None or float(results[1][2].abs().sum()) == 0) == split  # ... a split one does not
