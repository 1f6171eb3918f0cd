"""load_model(device_map=..., offload_folder=...) shards a Hugging Face model through TransformerLens's
boot_transformers (accelerate underneath): layers offloaded to disk compute what the unsharded model computes,
and a map that misses a module or names a device that does not exist is one CircuitkitError line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from circuitkit import CircuitkitError
from circuitkit.detect import RepeatedTokens, head_scores
from circuitkit.models import load_model
from circuitkit.models.loading import check_device_map

LOGIT_TOL = 1e-5
"""Offloaded weights are the same float32 bytes read back from disk and the same ops run: equal up to
summation order, ~1e-7 here."""
SCORE_TOL = 1e-6
"""Attention-pattern scores are means of softmax probabilities from those same logits."""
VOCAB = 40


def save_tiny(directory: Path, family: str):
    """A random-init tiny GPT-2 or Llama (GQA: 4 query heads, 2 key/value groups) saved with save_pretrained."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if family == "gpt2":
        config = GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=3, n_head=4, bos_token_id=0,
                            eos_token_id=0)
        model = GPT2LMHeadModel(config)
    else:
        config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                             bos_token_id=0, eos_token_id=0, pad_token_id=0)
        model = LlamaForCausalLM(config)
    model.eval().save_pretrained(str(directory), safe_serialization=True)
    return model


# Layer 1 and (Llama, untied) the unembedding on disk, the rest on the CPU. GPT-2 ties lm_head to wte, so
# both stay together (accelerate places a tied tensor once).
MAPS = {
    "gpt2": {"transformer.wte": "cpu", "transformer.wpe": "cpu", "transformer.h.0": "cpu", "transformer.h.1": "disk",
             "transformer.h.2": "cpu", "transformer.ln_f": "cpu", "lm_head": "cpu"},
    "llama": {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk", "model.layers.2": "cpu",
              "model.norm": "cpu", "lm_head": "disk"},
}
OFFLOADED = {"gpt2": lambda hf: hf.transformer.h[1].attn.c_attn.weight, "llama": lambda hf: hf.lm_head.weight}


@pytest.fixture(scope="module", params=sorted(MAPS))
def pair(request, tmp_path_factory):
    """(family, HF reference, unsharded bridge, sharded bridge) for one saved model."""
    family = request.param
    directory = tmp_path_factory.mktemp(family)
    hf = save_tiny(directory / "model", family)
    plain = load_model(str(directory / "model"))
    sharded = load_model(str(directory / "model"), device_map=MAPS[family], offload_folder=directory / "offload")
    return family, hf, plain, sharded


def test_offloaded_layers_are_really_off_the_cpu(pair):
    family, _, plain, sharded = pair
    assert OFFLOADED[family](sharded.original_model).device.type == "meta"  # materialised from disk per call
    assert OFFLOADED[family](plain.original_model).device.type == "cpu"
    assert "disk" in set(sharded.original_model.hf_device_map.values())


def test_sharded_logits_equal_unsharded(pair):
    _, hf, plain, sharded = pair
    tokens = torch.randint(1, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        reference = hf(tokens).logits
        torch.testing.assert_close(plain(tokens), reference, atol=LOGIT_TOL, rtol=0)
        torch.testing.assert_close(sharded(tokens), reference, atol=LOGIT_TOL, rtol=0)


def test_sharded_pattern_scores_equal_unsharded(pair):
    _, _, plain, sharded = pair
    spec = RepeatedTokens(block_len=6, batch=2, seed=3)
    expected, got = head_scores(plain, spec), head_scores(sharded, spec)
    common = [name for name in expected.keys() if name in got.keys()]
    assert "induction" in common and "previous_token" in common
    for name in common:
        torch.testing.assert_close(got[name], expected[name], atol=SCORE_TOL, rtol=0, msg=name)


def test_auto_map_on_a_cpu_only_machine_loads(tmp_path):
    hf = save_tiny(tmp_path, "llama")
    bridge = load_model(str(tmp_path), device_map="auto")
    tokens = torch.randint(1, VOCAB, (1, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(bridge(tokens), hf(tokens).logits, atol=LOGIT_TOL, rtol=0)


# ---------------------------------------------------------------- bad maps and sharding arguments


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("gpt2-bad-maps")
    save_tiny(directory, "gpt2")
    return directory


def _without(key):
    return {k: v for k, v in MAPS["gpt2"].items() if k != key}


BAD = {
    # case id: (load_model keyword arguments, a word the one-line error must contain)
    "map-misses-a-layer": ({"device_map": _without("transformer.h.2")}, "transformer.h.2"),
    "map-misses-the-final-norm": ({"device_map": _without("transformer.ln_f")}, "without a device"),
    "map-names-no-module": ({"device_map": {**MAPS["gpt2"], "transformer.h.9": "cpu"}}, "no module"),
    "map-names-missing-gpu": ({"device_map": {**MAPS["gpt2"], "transformer.h.0": "cuda:3"}}, "device_map"),
    "map-names-gpu-index": ({"device_map": {**MAPS["gpt2"], "transformer.h.0": 5}}, "device_map"),
    "map-names-meta": ({"device_map": {**MAPS["gpt2"], "transformer.h.0": "meta"}}, "meta"),
    "map-names-nonsense": ({"device_map": {**MAPS["gpt2"], "transformer.h.0": "gpu7"}}, "device_map"),
    "map-value-float": ({"device_map": {**MAPS["gpt2"], "transformer.h.0": 1.5}}, "device_map"),
    "map-key-int": ({"device_map": {0: "cpu"}}, "module name"),
    "map-empty": ({"device_map": {}}, "non-empty"),
    "unknown-strategy": ({"device_map": "everywhere"}, "balanced"),
    "map-and-device": ({"device_map": "auto", "device": "cpu"}, "device"),
    "max-memory-alone": ({"max_memory": {"cpu": "1GiB"}}, "device_map"),
    "max-memory-bad-size": ({"device_map": "auto", "max_memory": {"cpu": "lots"}}, "max_memory"),
    "max-memory-negative": ({"device_map": "auto", "max_memory": {"cpu": -1}}, "max_memory"),
    "max-memory-missing-gpu": ({"device_map": "auto", "max_memory": {3: "1GiB"}}, "max_memory"),
    "n-devices-zero": ({"n_devices": 0}, "n_devices"),
    "n-devices-more-than-gpus": ({"n_devices": 64}, "n_devices"),
    "n-devices-float": ({"n_devices": 2.0}, "n_devices"),
    "offload-folder-alone": ({"offload_folder": "/tmp/x"}, "offload_folder"),
    "offload-folder-not-a-path": ({"device_map": "auto", "offload_folder": 3}, "offload_folder"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_sharding_is_one_error_line(gpt2_dir, case):
    kwargs, word = BAD[case]
    with pytest.raises(CircuitkitError) as info:
        load_model(str(gpt2_dir), **kwargs)
    message = str(info.value)
    assert "\n" not in message and word in message


def test_zoo_model_refuses_a_device_map():
    with pytest.raises(CircuitkitError, match="bundled model"):
        load_model("induction-2l", device_map="auto")


def test_check_device_map_accepts_a_root_entry_and_parents():
    from transformers import GPT2Config, GPT2LMHeadModel

    with torch.device("meta"):
        model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4))
    assert check_device_map({"": "cpu"}, model) == {"": "cpu"}
    assert check_device_map({"transformer": "cpu", "lm_head": "disk"}, model)["lm_head"] == "disk"
    with pytest.raises(CircuitkitError, match="lm_head"):
        check_device_map({"transformer": "cpu"}, model)
