"""GGUF files: ``load_model("model.gguf")`` and ``circuitkit scan model.gguf`` give the model the same weights saved as
safetensors give (a tiny Qwen2 the test writes itself with ``gguf.GGUFWriter``, float32 tensors), and what cannot be
read (not GGUF, an architecture transformers does not read, a tensor type gguf cannot dequantize, a truncated
file) is one CircuitkitError line. No network, no remote code."""

from __future__ import annotations

import json

import gguf  # a dependency of circuitkit (pyproject.toml): GGUF reading and writing
import numpy as np
import pytest
import torch

import circuitkit as ck
from circuitkit import CircuitkitError

N_LAYERS, N_HEADS, N_KV, D_MODEL, D_MLP, VOCAB, N_CTX = 2, 4, 2, 16, 32, 32, 64
LOGITS_ATOL = 1e-5
"""The same float32 weights through two loaders: only the order of float operations may differ."""

PER_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
"""Hugging Face Qwen2 parameter -> llama.cpp tensor name (per block), as llama.cpp's converter writes them."""


def _gguf_names(n_layers: int) -> dict[str, str]:
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    for layer in range(n_layers):
        names.update({f"model.layers.{layer}.{hf}": f"blk.{layer}.{g}" for hf, g in PER_LAYER.items()})
    return names


def write_gguf(path, state: dict[str, torch.Tensor], *, architecture: str = "qwen2",
               int8: str | None = None) -> None:
    """``state`` (a Qwen2 state dict) as a GGUF file of F32 tensors with the Qwen2 header llama.cpp writes;
    ``int8``: one tensor stored as I8 (a type gguf cannot dequantize)."""
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny-qwen2")
    writer.add_block_count(N_LAYERS)
    writer.add_context_length(N_CTX)
    writer.add_embedding_length(D_MODEL)
    writer.add_feed_forward_length(D_MLP)
    writer.add_head_count(N_HEADS)
    writer.add_head_count_kv(N_KV)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(VOCAB)
    names = _gguf_names(N_LAYERS)
    for key, value in state.items():
        array = value.detach().numpy().astype(np.float32)
        if names[key] == int8:
            array = np.clip(array * 100, -127, 127).astype(np.int8)
        writer.add_tensor(names[key], array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A random-init 2-layer Qwen2 (GQA: 4 query heads over 2 key/value heads), saved twice: as a Hugging Face
    directory (safetensors) and as a GGUF file."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=D_MODEL, intermediate_size=D_MLP, num_hidden_layers=N_LAYERS,
                         num_attention_heads=N_HEADS, num_key_value_heads=N_KV, max_position_embeddings=N_CTX,
                         rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=0,
                         eos_token_id=0)
    model = Qwen2ForCausalLM(config).eval()
    root = tmp_path_factory.mktemp("tiny-qwen2")
    directory = root / "safetensors"
    model.save_pretrained(directory)
    state = model.state_dict()
    write_gguf(root / "tiny-qwen2.gguf", state)
    return {"dir": directory, "gguf": root / "tiny-qwen2.gguf", "state": state, "root": root}


def test_gguf_loads_the_same_model_as_safetensors(tiny):
    from_gguf = ck.load_model(tiny["gguf"])
    from_dir = ck.load_model(str(tiny["dir"]))
    assert from_gguf.cfg.n_layers == N_LAYERS and from_gguf.cfg.n_heads == N_HEADS
    # every weight back exactly (F32 in, F32 out); the bridge wraps modules, so its keys gain wrapper names
    loaded = from_gguf.original_model.state_dict()
    hf = {key.replace("._original_component", ""): value for key, value in loaded.items()}
    for key, value in tiny["state"].items():
        assert hf[key].dtype == torch.float32
        assert torch.equal(hf[key], value), key
    tokens = torch.randint(1, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(from_gguf(tokens), from_dir(tokens), atol=LOGITS_ATOL, rtol=0)
    gguf_weights, dir_weights = ck.HeadWeights.from_model(from_gguf), ck.HeadWeights.from_model(from_dir)
    for name in ("W_Q", "W_K", "W_V", "W_O"):
        torch.testing.assert_close(getattr(gguf_weights, name), getattr(dir_weights, name), atol=0, rtol=0)


def test_cli_scans_a_gguf_file(tiny, tmp_path, capsys):
    from circuitkit.cli import main

    out = tmp_path / "out"
    args = ["--out", str(out), "--batch", "2", "--block-len", "6", "--quick"]
    assert main(["scan", str(tiny["gguf"]), *args]) == 0
    from_gguf = json.loads((out / "scores.json").read_text(encoding="utf-8"))
    assert main(["scan", str(tiny["dir"]), *args]) == 0
    from_dir = json.loads((out / "scores.json").read_text(encoding="utf-8"))
    assert from_gguf["model"]["n_layers"] == N_LAYERS and from_gguf["model"]["n_kv_heads"] == N_KV
    for name, grid in from_dir["head_scores"].items():
        np.testing.assert_allclose(np.array(from_gguf["head_scores"][name], dtype=float), np.array(grid, dtype=float),
                                   atol=1e-5)
    err = capsys.readouterr().err
    assert "de-quantizing" not in err and "Loading weights" not in err  # circuitkit's own lines only


@pytest.mark.parametrize(
    "make, said",
    [
        (lambda t, p: p.write_bytes(b"not a gguf file at all"), "starts with b'not ', not the GGUF magic bytes"),
        (lambda t, p: p.write_bytes(t["gguf"].read_bytes()[:200]), "could not be read as GGUF"),
        (lambda t, p: write_gguf(p, t["state"], architecture="nosuchnet"),
         "holds architecture 'nosuchnet', which transformers cannot read from GGUF"),
        (lambda t, p: write_gguf(p, t["state"], int8="blk.0.attn_q.weight"),
         "holds tensors quantized as I8, which the gguf package cannot dequantize"),
    ],
    ids=["not-gguf", "truncated", "unknown-architecture", "unreadable-quantization"],
)
def test_unreadable_gguf_is_one_error_line(tiny, tmp_path, make, said):
    path = tmp_path / "bad.gguf"
    make(tiny, path)
    with pytest.raises(CircuitkitError) as caught:
        ck.load_model(path)
    message = str(caught.value)
    assert message.startswith(f"load_model: GGUF file: given '{path}', which ") and said in message
    assert "\n" not in message


def test_a_missing_gguf_is_said_to_be_missing(tmp_path, capsys):
    from circuitkit.cli import main

    assert main(["scan", str(tmp_path / "model.gguf"), "--out", str(tmp_path / "out")]) == 2
    assert f"MODEL: no such directory or file: '{tmp_path / 'model.gguf'}'" in capsys.readouterr().err
