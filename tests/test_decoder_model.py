"""circuitkit's own Llama / Qwen2 / Mistral decoder (``load_model(DIR, bridge=False)``), the induction scan's model
for such a directory.

Oracles: Hugging Face's own eager model of the same directory (logits), the TransformerLens bridge of it (every
hook the two share, the weights in TransformerLens's layout, the BOS rule, and every figure of a scan), and a
subprocess that shows the CLI's scan of such a directory imports neither transformers nor TransformerLens."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import circuitkit as ck
from circuitkit import HeadWeights
from circuitkit.errors import CircuitkitError
from circuitkit.models import load_model
from circuitkit.models.adapters import HOOKS, adapt
from circuitkit.models.decoder import DecoderModel
from circuitkit.models.decoder_files import decoder_refusal
from tests.conftest import assert_close_json, unembedding_split_results

VOCAB = 96
SIZES = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=64, max_position_embeddings=64)
LLAMA3 = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=16)
FAMILIES = {
    # Llama 3's rotary rescaling (wavelengths on both sides of its band at d_head 8), biases in attention and MLP
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(SIZES, bos_token_id=1, rope_scaling=LLAMA3, rope_theta=5e5,
                                                       attention_bias=True, mlp_bias=True)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(SIZES, tie_word_embeddings=True)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(SIZES, sliding_window=None, bos_token_id=1)),
}
TOL = 1e-5
"""float32, the same operations as Hugging Face's eager attention: measured <= 2e-7."""


def _save(directory: Path, family: str, **changes):
    import transformers

    config_class, model_class, sizes = FAMILIES[family]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**{**sizes, **changes})
    config._attn_implementation = "eager"
    hf = getattr(transformers, model_class)(config).eval()
    with torch.no_grad():  # visible biases and norm weights (Hugging Face initialises them to 0 and 1)
        for name, parameter in hf.named_parameters():
            if name.endswith("bias") or "norm" in name:
                parameter.add_(0.1 * torch.randn_like(parameter))
    hf.save_pretrained(str(directory), safe_serialization=True)
    return hf


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def built(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    hf = _save(directory, request.param)
    return request.param, directory, hf, load_model(str(directory), bridge=False), load_model(str(directory))


def _tokens(batch=2, pos=12, seed=1):
    return torch.randint(4, VOCAB, (batch, pos), generator=torch.Generator().manual_seed(seed))


def test_the_decoder_computes_hugging_faces_logits(built):
    _, _, hf, own, _ = built
    assert isinstance(own, DecoderModel)
    tokens = _tokens()
    with torch.no_grad():
        assert torch.allclose(own(tokens), hf(tokens).logits, atol=TOL, rtol=0)


def test_every_hook_equals_the_bridges(built):
    _, _, _, own, bridge = built
    tokens = _tokens()
    with torch.no_grad():
        _, mine = own.run_with_cache(tokens)
        _, theirs = bridge.run_with_cache(tokens)
    vocabulary = [HOOKS.final_scale(), HOOKS.final_normalized()] + [
        hook(layer) for layer in range(2) for hook in (HOOKS.resid_pre, HOOKS.q, HOOKS.k, HOOKS.v, HOOKS.pattern,
                                                       HOOKS.z, HOOKS.attn_out, HOOKS.resid_post, HOOKS.mlp_in,
                                                       HOOKS.mlp_normed_in, HOOKS.mlp_post, HOOKS.mlp_out)]
    assert set(vocabulary) <= set(mine)
    shared = sorted(set(mine) & set(theirs))
    assert len(shared) == len(mine)  # every hook of the decoder has its bridge namesake
    for name in shared:
        assert mine[name].shape == theirs[name].shape, name
        assert torch.allclose(mine[name], theirs[name], atol=TOL, rtol=0), name


def test_weights_and_bos_rule_are_the_bridges(built):
    family, _, _, own, bridge = built
    a, b = HeadWeights.from_model(own), HeadWeights.from_model(bridge)
    for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O", "W_E", "W_U"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None or not bool(y.any())), name  # the bridge may show a zero b_O
        if x is not None:
            assert torch.equal(x, y), name
    assert own.cfg.default_prepend_bos == bridge.cfg.default_prepend_bos == (family != "qwen2")
    assert adapt(own).spec.default_bos == adapt(bridge).spec.default_bos
    assert [own.tokenizer.decode([i]) for i in range(VOCAB)] == [bridge.tokenizer.decode([i]) for i in range(VOCAB)]


def test_resuming_at_a_layer_equals_the_full_pass(built):
    _, _, _, own, _ = built
    tokens = _tokens()
    with torch.no_grad():
        full, cache = own.run_with_cache(tokens)
        resumed = own.run_with_hooks(cache[HOOKS.resid_pre(1)], start_at_layer=1)
    assert torch.allclose(full, resumed, atol=1e-6, rtol=0)


def test_resuming_past_the_last_layer_equals_the_full_pass(built):
    """From the final residual stream (``start_at_layer = n_layers``) only the final norm and the unembedding run:
    the task runner's pass for an edge into the logits."""
    _, _, _, own, _ = built
    adapter, tokens = adapt(own), _tokens()
    L = own.cfg.n_layers
    with torch.no_grad():
        full, cache = own.run_with_cache(tokens)
        resumed = adapter.run_from(cache[HOOKS.resid_post(L - 1)], L)
    assert torch.equal(full, resumed)
    with pytest.raises(CircuitkitError, match="run_from: start_at_layer"):
        adapter.run_from(cache[HOOKS.resid_post(L - 1)], L + 1)


def test_a_replaced_activation_changes_what_follows_only(built):
    _, _, _, own, bridge = built
    tokens = _tokens()

    def zero_head(z, hook):
        z = z.clone()
        z[:, :, 1] = 0
        return z

    def double_mlp_input(x, hook):
        return 2 * x

    hooks = [(HOOKS.z(0), zero_head), (HOOKS.mlp_in(1), double_mlp_input)]
    with torch.no_grad():
        mine = own.run_with_hooks(tokens, fwd_hooks=hooks)
        theirs = bridge.run_with_hooks(tokens, fwd_hooks=hooks)
        assert not torch.allclose(mine, own(tokens), atol=1e-3)
    assert torch.allclose(mine, theirs, atol=TOL, rtol=0)


@pytest.mark.slow
def test_a_scan_by_path_runs_the_decoder_with_the_bridges_figures(built):
    family, directory, _, _, bridge = built
    tokens = ck.RepeatedTokens(block_len=6, batch=4, seed=0)
    a = ck.scan(str(directory), tokens=tokens, name="tiny").to_json()  # by path: circuitkit's own decoder
    b = ck.scan(bridge, tokens=tokens, name="tiny").to_json()
    assert a["model"].pop("family").endswith("(circuitkit decoder)")
    assert b["model"].pop("family").endswith("(TransformerBridge)")
    assert_close_json(a, b)


def test_the_cli_scan_of_a_directory_imports_neither_transformers_nor_transformer_lens(tmp_path):
    _save(tmp_path / "model", "llama")
    code = (
        "import json, sys\n"
        "from circuitkit.cli import main\n"
        f"code = main(['scan', {str(tmp_path / 'model')!r}, '--out', {str(tmp_path / 'out')!r}, '--quick', "
        "'--batch', '4', '--block-len', '6'])\n"
        "print()\n"
        "print(json.dumps({'code': code, 'loaded': sorted(m for m in ('transformer_lens', 'transformers') "
        "if m in sys.modules)}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"code": 0, "loaded": []}
    assert "(Llama, run by circuitkit's own decoder)" in done.stderr
    saved = json.loads((tmp_path / "out" / "scores.json").read_text())
    assert saved["model"]["family"] == "Llama (circuitkit decoder)"


@pytest.mark.parametrize("change, reason", [
    (dict(sliding_window=4), "sliding-window"),
    (dict(hidden_act="gelu"), "hidden_act"),
    (dict(rope_scaling=dict(rope_type="yarn", factor=2.0)), "rotary scaling"),
])
def test_a_config_the_decoder_does_not_run_is_refused_with_the_reason(tmp_path, change, reason):
    family = "mistral" if "sliding_window" in change else "llama"
    directory = tmp_path / "model"
    _save(directory, family, **change)
    assert reason in decoder_refusal(directory)
    with pytest.raises(CircuitkitError, match=reason) as error:
        load_model(str(directory), bridge=False)
    assert "\n" not in str(error.value)
    assert not isinstance(ck.models.loading.induction_model(str(directory)), DecoderModel)  # the bridge runs it


@pytest.mark.parametrize("fault", ["unknown", "missing", "shape", "nan"])
def test_weights_that_are_not_the_decoders_are_refused(tmp_path, fault):
    directory = tmp_path / "model"
    _save(directory, "qwen2")
    path = directory / "model.safetensors"
    state = dict(load_file(str(path)))
    name = "model.layers.1.self_attn.k_proj.weight"
    if fault == "unknown":
        state["model.layers.1.self_attn.q_norm.weight"] = torch.ones(8)
    elif fault == "missing":
        del state[name]
    elif fault == "shape":
        state[name] = torch.zeros(8, 32)
    else:
        state[name] = state[name].clone()
        state[name][0, 0] = float("nan")
    save_file(state, str(path), metadata={"format": "pt"})
    with pytest.raises(CircuitkitError, match="load_model\\(bridge=False\\)"):
        load_model(str(directory), bridge=False)
    if fault != "nan":  # read from the headers: the bridge is the scan's way then
        assert decoder_refusal(directory) is not None


def test_bridge_false_refuses_what_it_cannot_load(tmp_path):
    with pytest.raises(CircuitkitError, match="load_model: bridge"):
        load_model(bridge="no")
    with pytest.raises(CircuitkitError, match="bridge=False"):
        load_model("gpt2", bridge=False)
    with pytest.raises(CircuitkitError, match="device_map"):
        load_model(str(tmp_path), bridge=False, device_map="auto")
    with pytest.raises(CircuitkitError, match="dtype"):
        load_model(bridge=False, dtype="bfloat16")


def test_bfloat16_follows_hugging_faces_bfloat16(tmp_path):
    hf = _save(tmp_path / "model", "llama").to(torch.bfloat16)
    own = load_model(str(tmp_path / "model"), bridge=False, dtype="bfloat16")
    assert own.embed.dtype == torch.bfloat16
    tokens = _tokens()
    with torch.no_grad():
        mine, theirs = own(tokens).float(), hf(tokens).logits.float()
    assert (mine - theirs).abs().max() <= 0.02 * theirs.abs().max()


def test_logits_at_some_positions_and_a_graph_kept_at_some_are_the_full_passes(built):
    """``positions=`` unembeds only there (and from a resumed pass too); ``graph_positions=`` gives every logit with
    the unembedding's graph only at those positions: the same logits, the same gradient of a loss read there, and
    no gradient from the others."""
    _, _, _, own, _ = built
    adapter = adapt(own)
    tokens = _tokens()
    at = torch.tensor([2, 5, 8])
    with torch.no_grad():
        full, cache = own.run_with_cache(tokens)
        assert torch.allclose(adapter.run(tokens, positions=at), full[:, at], atol=1e-6, rtol=0)
        resumed = adapter.run_from(cache[HOOKS.resid_pre(1)], 1, positions=at)
        assert torch.allclose(resumed, full[:, at], atol=1e-6, rtol=0)
    results = unembedding_split_results(adapter, _tokens(), at)
    assert torch.allclose(results[1][0], results[0][0], atol=1e-6, rtol=0)
    assert torch.allclose(results[1][1], results[0][1], atol=1e-6, rtol=1e-5)
    assert float(results[0][2].abs().sum()) > 0  # the full graph reaches the other positions, a split one does not
    assert results[1][2] is None or float(results[1][2].abs().sum()) == 0
    assert own.graph_positions is None  # put back after the pass


def test_a_cast_model_keeps_its_rotary_frequencies_in_float32(tmp_path):
    """``model.to(torch.bfloat16)`` casts the weights, not the rotary angles: the same logits as loading in
    bfloat16."""
    _save(tmp_path / "model", "llama")
    cast = load_model(str(tmp_path / "model"), bridge=False).to(torch.bfloat16)
    loaded = load_model(str(tmp_path / "model"), bridge=False, dtype="bfloat16")
    with torch.no_grad():
        assert torch.equal(cast(_tokens()), loaded(_tokens()))
