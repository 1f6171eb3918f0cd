"""load_model: a local Hugging Face directory loads offline into a TransformerBridge that computes what HF does."""

from __future__ import annotations

import math

import pytest
import torch

from circuitkit import CircuitkitError, head_scores
from circuitkit.detect import RepeatedTokens
from circuitkit.models import load_model
from circuitkit.models.tokenizer import word_tokenizer_files

LOGIT_TOL = 1e-4
"""The bridge runs the same HF modules (eager attention): float32 agreement to ~1e-6, with a margin."""


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """No hub access: the environment variables for fresh imports, and the constant huggingface_hub read at
    import time (it may already be imported by an earlier test), so a hub lookup fails at once."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def save_tiny_gpt2(directory, *, with_tokenizer: bool, seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=40, n_positions=32, n_embd=32, n_layer=2, n_head=4, bos_token_id=0,
                        eos_token_id=0)
    model = GPT2LMHeadModel(config).eval()
    model.save_pretrained(str(directory), safe_serialization=True)
    if with_tokenizer:
        word_tokenizer_files(40, directory)
    return model


@pytest.mark.slow
@pytest.mark.parametrize("with_tokenizer", [True, False], ids=["tokenizer-in-directory", "generated-tokenizer"])
def test_local_directory_round_trip(tmp_path, with_tokenizer):
    hf = save_tiny_gpt2(tmp_path, with_tokenizer=with_tokenizer)
    assert (tmp_path / "model.safetensors").exists()
    bridge = load_model(str(tmp_path))
    tokens = torch.randint(1, 40, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(bridge(tokens), hf(tokens).logits, atol=LOGIT_TOL, rtol=0)
    assert bridge.tokenizer.bos_token_id == 0
    assert bridge.to_tokens("t3 t4").tolist() == [[0, 3, 4]]
    scores = head_scores(bridge, RepeatedTokens(block_len=6, batch=2))
    assert scores["induction"].shape == (2, 4) and scores.bos == 0


@pytest.mark.parametrize("bos, expected", [(2, 2), (None, 0), (500, 0)], ids=["config-bos", "none", "outside"])
def test_generated_tokenizer_starts_with_the_configs_own_bos(tmp_path, bos, expected):
    """Without tokenizer files, the generated tokenizer's BOS is the one ``config.json`` names (inside the
    vocabulary), else id 0: a Gemma checkpoint keeps a zero embedding row for its pad id 0, and sequences that
    start there run from an exactly zero residual stream."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from circuitkit.models.adapters import adapt

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, max_position_embeddings=32, bos_token_id=bos, eos_token_id=1,
                         pad_token_id=0)
    LlamaForCausalLM(config).save_pretrained(str(tmp_path), safe_serialization=True)
    bridge = load_model(str(tmp_path))
    assert bridge.tokenizer.bos_token_id == expected and adapt(bridge).spec.default_bos == expected
    if expected:  # id 0 is then an ordinary word, "t0"
        assert bridge.to_tokens("t3 t0").tolist() == [[expected, 3, 0]]
    assert RepeatedTokens(block_len=4, batch=2).build(bridge).tokens[:, 0].tolist() == [expected, expected]


def test_directory_without_config_raises(tmp_path):
    with pytest.raises(CircuitkitError, match="config.json"):
        load_model(str(tmp_path))


def test_unknown_name_is_one_line_error_without_touching_the_network(monkeypatch):
    import socket

    def no_network(*args, **kwargs):
        raise AssertionError(f"load_model opened a connection: {args}")

    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    with pytest.raises(CircuitkitError) as info:
        load_model("nobody/no-such-model-circuitkit")
    message = str(info.value)
    assert "\n" not in message and "no-such-model-circuitkit" in message and "induction-2l" in message
    assert "allow_download=True" in message


def test_a_name_in_the_local_hub_cache_is_found(tmp_path, monkeypatch):
    """The cache check reads the standard hub layout (models--org--name/snapshots/REV/config.json)."""
    import huggingface_hub.constants

    from circuitkit.models.loading import _in_local_cache

    snapshot = tmp_path / "models--someone--tiny" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "models--someone--tiny" / "refs").mkdir()
    (tmp_path / "models--someone--tiny" / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    assert _in_local_cache("someone/tiny")
    assert not _in_local_cache("someone/absent")


def test_none_and_zoo_name_load_the_bundled_model():
    default = load_model()
    named = load_model("induction-2l")
    assert default.cfg.n_layers == named.cfg.n_layers == 2
    torch.testing.assert_close(default.W_Q, named.W_Q)


def test_allow_download_fetches_only_configs_tokenizers_and_safetensors(tmp_path, monkeypatch):
    """With allow_download the repository is fetched once, by pattern (never *.py, never pickles), and then loaded
    from the cache with the hub offline. The hub is faked: snapshot_download writes a tiny model into the cache."""
    import fnmatch

    import huggingface_hub
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    calls = []

    def fake_snapshot_download(repo_id, **kwargs):
        calls.append(kwargs)
        root = tmp_path / ("models--" + repo_id.replace("/", "--"))
        snapshot = root / "snapshots" / ("1" * 40)
        if not kwargs.get("local_files_only"):
            save_tiny_gpt2(snapshot, with_tokenizer=True)
            (root / "refs").mkdir()
            (root / "refs" / "main").write_text("1" * 40)
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    bridge = load_model("someone/tiny-download", allow_download=True)
    assert bridge.cfg.d_vocab == 40
    patterns = calls[0]["allow_patterns"]
    fetched = {name for name in ("config.json", "model.safetensors", "tokenizer.json", "modeling_evil.py",
                                 "pytorch_model.bin", "model.ckpt") if any(fnmatch.fnmatch(name, p) for p in patterns)}
    assert fetched == {"config.json", "model.safetensors", "tokenizer.json"}


# ---------------------------------------------------------------- what transformers checks, after its own renaming

TINY = {"vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 64, "max_position_embeddings": 64}
"""Sizes of the tiny random checkpoints below (built from transformers configs, no download)."""


def _save(directory, config, model_class, seed: int = 0):
    torch.manual_seed(seed)
    model = model_class(config).eval()
    model.save_pretrained(str(directory), safe_serialization=True)
    return model


def _stored_keys(directory) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(directory / "model.safetensors"), framework="pt") as handle:
        return set(handle.keys())


def _scan_small(model):
    import circuitkit as ck

    return ck.scan(model, tokens=RepeatedTokens(block_len=5, batch=2, seed=0), ablate="none", circuit=False,
                   top_k=2)


def test_pythia_checkpoint_with_embed_out_loads_and_scans(tmp_path):
    """GPT-NeoX / Pythia checkpoints store the unembedding as ``embed_out.weight``; transformers maps it to the
    model's head on load, so the check must judge the model after that mapping, not the file's names."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    hf = _save(tmp_path, GPTNeoXConfig(**TINY), GPTNeoXForCausalLM)
    assert "embed_out.weight" in _stored_keys(tmp_path)  # the name real Pythia checkpoints use
    bridge = load_model(str(tmp_path))
    tokens = torch.randint(0, 100, (2, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(bridge(tokens), hf(tokens).logits, atol=LOGIT_TOL, rtol=0)
    result = _scan_small(bridge)
    assert result.head_scores["induction"].shape == (2, 4)
    assert torch.isfinite(result.head_scores["induction"]).all()
    assert math.isfinite(result.induction_loss.repeated_copies)


def test_mixtral_checkpoint_with_per_expert_weights_loads_and_scans(tmp_path):
    """Mixtral checkpoints store each expert's w1/w2/w3; the model holds them fused. Accepted after transformers'
    renaming, with logits equal to Hugging Face's."""
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(**TINY, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)
    hf = _save(tmp_path, config, MixtralForCausalLM)
    assert any(key.endswith("experts.0.w1.weight") for key in _stored_keys(tmp_path))
    bridge = load_model(str(tmp_path))
    tokens = torch.randint(0, 100, (2, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(bridge(tokens), hf(tokens).logits, atol=LOGIT_TOL, rtol=0)
    assert torch.isfinite(_scan_small(bridge).head_scores["induction"]).all()


def test_checkpoint_without_its_head_is_refused_not_randomly_initialised(tmp_path):
    """A BertModel checkpoint (no masked-LM head) would load as BertForMaskedLM with a random head: two scans
    would disagree. Refused with one line naming the weights transformers would initialise."""
    from transformers import BertConfig, BertModel

    _save(tmp_path, BertConfig(**TINY), BertModel)
    with pytest.raises(CircuitkitError) as info:
        load_model(str(tmp_path))
    message = str(info.value)
    assert "\n" not in message and message.startswith("load_model")
    assert "initialise at random" in message and "cls.predictions" in message
    assert info.value.__cause__ is None


def test_control_the_same_architecture_with_its_head_loads(tmp_path):
    """The refusal above is about the missing head, not about BERT: BertForMaskedLM loads and matches HF."""
    from transformers import BertConfig, BertForMaskedLM

    hf = _save(tmp_path, BertConfig(**TINY), BertForMaskedLM)
    bridge = load_model(str(tmp_path))
    tokens = torch.randint(0, 100, (2, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(bridge(tokens), hf(tokens).logits, atol=LOGIT_TOL, rtol=0)


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_encoder_decoder_is_refused_with_the_reason(tmp_path, family):
    import transformers

    if family == "t5":
        config = transformers.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4)
        model_class = transformers.T5ForConditionalGeneration
    else:
        config = transformers.BartConfig(vocab_size=100, d_model=32, encoder_layers=2, decoder_layers=2,
                                         encoder_attention_heads=4, decoder_attention_heads=4,
                                         encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64)
        model_class = transformers.BartForConditionalGeneration
    _save(tmp_path, config, model_class)
    with pytest.raises(CircuitkitError) as info:
        load_model(str(tmp_path))
    message = str(info.value)
    assert "\n" not in message and "encoder-decoder" in message and "not supported" in message
    assert "cross-attention" in message  # says why



@pytest.mark.parametrize("dtype", ["int8", "fp8", "", 16, True, None.__class__, "bfloat"],
                         ids=["int8", "fp8", "empty", "int", "bool", "type", "bfloat"])
def test_a_dtype_that_is_not_a_float_weight_dtype_is_one_clear_line(dtype):
    from circuitkit.models.loading import load_model

    with pytest.raises(CircuitkitError) as error:
        load_model(dtype=dtype)
    message = str(error.value)
    assert message.startswith("load_model: dtype: given") and "'float32', 'bfloat16' or 'float16'" in message
    assert "\n" not in message


@pytest.mark.parametrize(("name", "expected"), [("bf16", "bfloat16"), ("float16", "float16"), ("FP32", "float32")])
def test_dtype_names_load_the_bundled_model_in_that_dtype(name, expected):
    import torch

    from circuitkit.models.loading import load_model

    model = load_model(dtype=name)
    assert {p.dtype for p in model.parameters()} == {getattr(torch, expected)}


def test_scan_refuses_a_dtype_beside_a_loaded_model():
    import circuitkit as ck
    from circuitkit import zoo

    with pytest.raises(CircuitkitError, match=r"scan: dtype: .*None with a loaded model"):
        ck.scan(zoo.load(), dtype="bfloat16")


def test_a_generated_tokenizers_files_are_removed_when_the_process_ends(tmp_path):
    """``word_tokenizer`` writes its files to a temporary folder that the tokenizer reads again while the process
    runs; the folder is gone once it exits (a folder per process was left in the temporary directory before)."""
    import os
    import subprocess
    import sys

    script = ("import os\nfrom circuitkit.models.tokenizer import word_tokenizer\n"
              "t = word_tokenizer(40)\nprint(t.name_or_path)\n"
              "assert os.path.isdir(t.name_or_path) and t('3 4')['input_ids']\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    folder = done.stdout.strip().splitlines()[-1]
    assert folder.startswith(str(tmp_path)) and "circuitkit-tokenizer-" in folder
    assert not os.path.exists(folder) and list(tmp_path.iterdir()) == []
