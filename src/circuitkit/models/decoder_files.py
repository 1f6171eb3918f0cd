"""Reading a Hugging Face Llama / Qwen2 / Mistral directory into circuitkit's :class:`DecoderModel`, with torch,
safetensors and tokenizers only (no transformers, no TransformerLens).

:func:`decoder_refusal` says, from ``config.json`` and the safetensors headers alone, why a directory cannot run
as a ``DecoderModel`` (None where it can): another family, an activation other than SiLU, sliding windows, a rotary
scaling other than Llama 3's, quantised or unknown weights. A caller that has another way to run the model (the
scan: the ``TransformerBridge``) takes it then. :func:`load_decoder` refuses in one :class:`CircuitkitError` line
instead. The files are read as :mod:`circuitkit.models.files` guards them (regular files inside the directory,
size-capped JSON, safetensors only); no code shipped with a model runs.

The tokenizer (:class:`LightTokenizer`) is what a scan of repeated random tokens needs: the BOS id and ``decode``,
read from ``tokenizer.json`` by the ``tokenizers`` library, or, where the directory has no tokenizer, the
generated word-level one that :func:`circuitkit.models.tokenizer.word_tokenizer` builds (``"t{i}"`` words, BOS
from the config). Whether a BOS starts every sequence follows TransformerLens's rule for the family (Llama and
Mistral: yes; Qwen2: no), so the scan's batch is the one the bridge would make.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from circuitkit import validate
from circuitkit.errors import CircuitkitError
from circuitkit.models import files as guarded
from circuitkit.models.decoder import DecoderConfig, DecoderModel
from circuitkit.models.directory import read_config, read_shapes, refuse_custom_code, weight_files

FAMILIES = {"llama": ("Llama", True), "qwen2": ("Qwen2", False), "mistral": ("Mistral", True)}
"""``model_type`` -> (name, whether a BOS starts every sequence: TransformerLens's ``default_prepend_bos``)."""

ROPE_TYPES = ("default", "llama3")
LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
IGNORED_KEYS = ("rotary_emb.inv_freq",)
"""Buffers some older checkpoints saved; recomputed from the config."""


def _error(directory: Path, given: str, expected: str) -> CircuitkitError:
    return CircuitkitError(f"load_model(bridge=False): {str(directory)!r} {given}; expected {expected}.")


def _config(directory: Path) -> dict[str, Any]:
    path = directory / "config.json"
    if not guarded.exists(path):
        raise _error(directory, "has no config.json", "a Hugging Face model directory written by save_pretrained")
    config = read_config(path, "given config")
    refuse_custom_code(directory, config)
    return config


def _rope(config: dict[str, Any]) -> tuple[float | None, dict[str, float] | None, str | None]:
    """``(base, Llama 3 scaling or None, refusal or None)`` from ``rope_parameters`` (transformers 5) or
    ``rope_theta`` / ``rope_scaling`` (earlier)."""
    params = config.get("rope_parameters")
    if not isinstance(params, dict):
        params = dict(config.get("rope_scaling") or {})
        params.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    kind = params.get("rope_type", params.get("type", "default"))
    base = params.get("rope_theta")
    if kind not in ROPE_TYPES:
        return None, None, f"rotary scaling {kind!r} (circuitkit's decoder runs {', '.join(ROPE_TYPES)})"
    if not isinstance(base, (int, float)) or isinstance(base, bool) or base <= 0:
        return None, None, f"rope_theta {base!r}"
    if kind == "default":
        return float(base), None, None
    if not all(isinstance(params.get(key), (int, float)) for key in LLAMA3_KEYS):
        return None, None, f"a llama3 rotary scaling without {', '.join(LLAMA3_KEYS)}"
    return float(base), {key: float(params[key]) for key in LLAMA3_KEYS}, None


def _int(config: dict[str, Any], key: str, default: Any = None) -> int | None:
    value = config.get(key, default)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _read_config(directory: Path, config: dict[str, Any]) -> tuple[DecoderConfig | None, str | None]:
    """The :class:`DecoderConfig` of ``config.json``, or None and why the decoder cannot run it."""
    model_type = config.get("model_type")
    if model_type not in FAMILIES:
        return None, f"model_type {model_type!r} (circuitkit's decoder runs {', '.join(FAMILIES)})"
    family, prepend_bos = FAMILIES[model_type]
    if config.get("hidden_act", "silu") != "silu":
        return None, f"hidden_act {config.get('hidden_act')!r} (the decoder's MLP is SiLU-gated)"
    if config.get("quantization_config"):
        return None, "quantised weights"
    if config.get("attn_implementation", config.get("_attn_implementation")) not in (None, "eager", "sdpa"):
        return None, "an attn_implementation other than eager"
    if (config.get("pretraining_tp") or 1) != 1:
        return None, f"pretraining_tp {config.get('pretraining_tp')!r}"
    windows = config.get("sliding_window") if model_type == "mistral" else (
        config.get("sliding_window") if config.get("use_sliding_window") else None)
    layer_types = config.get("layer_types") or []
    if windows is not None or any(kind != "full_attention" for kind in layer_types):
        return None, "sliding-window attention"
    sizes = {key: _int(config, key) for key in ("num_hidden_layers", "num_attention_heads", "hidden_size",
                                                   "intermediate_size", "vocab_size")}
    missing = [key for key, value in sizes.items() if value is None]
    if missing:
        return None, f"no positive int {', '.join(missing)} in config.json"
    heads = sizes["num_attention_heads"]
    kv = _int(config, "num_key_value_heads", heads)
    d_head = _int(config, "head_dim", None) or (sizes["hidden_size"] // heads)
    eps = config.get("rms_norm_eps", 1e-6)
    base, scaling, refusal = _rope(config)
    if refusal:
        return None, refusal
    if kv is None or heads % kv or not isinstance(eps, (int, float)) or isinstance(eps, bool) or eps <= 0:
        return None, f"num_key_value_heads {config.get('num_key_value_heads')!r} or rms_norm_eps {eps!r}"
    attention_bias = bool(config.get("attention_bias", False)) if model_type == "llama" else False
    try:
        cfg = DecoderConfig(
            n_layers=sizes["num_hidden_layers"], n_heads=heads, n_key_value_heads=kv, d_model=sizes["hidden_size"],
            d_head=d_head, d_mlp=sizes["intermediate_size"], d_vocab=sizes["vocab_size"],
            n_ctx=_int(config, "max_position_embeddings", 2048) or 2048, eps=float(eps), rotary_base=base,
            qkv_bias=model_type == "qwen2" or attention_bias, o_bias=attention_bias,
            mlp_bias=bool(config.get("mlp_bias", False)) if model_type == "llama" else False,
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)), rope_scaling=scaling,
            default_prepend_bos=prepend_bos, model_name=str(directory), family=family,
        )
    except CircuitkitError as error:
        return None, str(error)
    return cfg, None


def expected_shapes(cfg: DecoderConfig) -> dict[str, tuple[int, ...]]:
    """Every weight the decoder reads, by its Hugging Face name, with its shape."""
    m, h, g, d, f = cfg.d_model, cfg.n_heads, cfg.n_key_value_heads, cfg.d_head, cfg.d_mlp
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.d_vocab, m), "model.norm.weight": (m,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.d_vocab, m)
    for layer in range(cfg.n_layers):
        p = f"model.layers.{layer}."
        shapes.update({p + "input_layernorm.weight": (m,), p + "post_attention_layernorm.weight": (m,),
                       p + "self_attn.q_proj.weight": (h * d, m), p + "self_attn.k_proj.weight": (g * d, m),
                       p + "self_attn.v_proj.weight": (g * d, m), p + "self_attn.o_proj.weight": (m, h * d),
                       p + "mlp.gate_proj.weight": (f, m), p + "mlp.up_proj.weight": (f, m),
                       p + "mlp.down_proj.weight": (m, f)})
        if cfg.qkv_bias:
            shapes.update({p + "self_attn.q_proj.bias": (h * d,), p + "self_attn.k_proj.bias": (g * d,),
                           p + "self_attn.v_proj.bias": (g * d,)})
        if cfg.o_bias:
            shapes[p + "self_attn.o_proj.bias"] = (m,)
        if cfg.mlp_bias:
            shapes.update({p + "mlp.gate_proj.bias": (f,), p + "mlp.up_proj.bias": (f,),
                           p + "mlp.down_proj.bias": (m,)})
    return shapes


def _stored_shapes(files: tuple[Path, ...]) -> dict[str, tuple[int, ...]]:
    return read_shapes(files)


def _fit(cfg: DecoderConfig, stored: dict[str, tuple[int, ...]]) -> str | None:
    """Why the stored weights are not exactly the decoder's (None where they are)."""
    expected = expected_shapes(cfg)
    stored = {key: shape for key, shape in stored.items() if not key.endswith(IGNORED_KEYS)}
    if cfg.tie_word_embeddings:
        stored.pop("lm_head.weight", None)  # tied: Hugging Face uses the embedding whatever is stored
    missing = sorted(set(expected) - set(stored))
    unknown = sorted(set(stored) - set(expected))
    wrong = [f"{key} {list(stored[key])} (config: {list(shape)})" for key, shape in expected.items()
             if key in stored and stored[key] != shape]
    if missing:
        return f"weights missing {missing[:3]}" + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    if unknown:
        return f"weights the decoder does not read {unknown[:3]}" + (
            f" and {len(unknown) - 3} more" if len(unknown) > 3 else "")
    if wrong:
        return f"weights whose shapes do not fit config.json: {', '.join(wrong[:3])}"
    return None


def decoder_refusal(directory: str | Path) -> str | None:
    """Why ``directory`` cannot run as a :class:`DecoderModel` (None where it can). Reads ``config.json`` and the
    safetensors headers only; a directory that cannot be read at all raises, as :func:`load_decoder` would."""
    directory = Path(directory)
    cfg, refusal = _read_config(directory, _config(directory))
    if refusal:
        return refusal
    return _fit(cfg, _stored_shapes(weight_files(directory)))


def load_decoder(directory: str | Path, *, device: str | torch.device | None = None,
                 dtype: torch.dtype | None = None) -> DecoderModel:
    """The directory's model as a :class:`DecoderModel` on ``device`` (default CPU) in ``dtype`` (default float32,
    as ``load_model`` reads every model); one :class:`CircuitkitError` line where it cannot run as one."""
    from safetensors.torch import load_file

    directory = Path(directory)
    where = validate.device("load_model: device", device) or torch.device("cpu")
    dtype = dtype or torch.float32
    config = _config(directory)
    cfg, refusal = _read_config(directory, config)
    if refusal:
        raise _error(directory, f"has {refusal}", "a Llama, Qwen2 or Mistral checkpoint the decoder runs "
                     "(load it with bridge=True)")
    files = weight_files(directory)
    guarded.check_directory(directory)
    refusal = _fit(cfg, _stored_shapes(files))
    if refusal:
        raise _error(directory, f"has {refusal}", "the weights of a model with this config.json")
    tensors: dict[str, torch.Tensor] = {}
    wanted = expected_shapes(cfg)
    for file in files:
        try:
            loaded = load_file(str(file), device=str(where))
        except Exception as error:  # noqa: BLE001 - SafetensorError (Rust), OSError: one line naming the file
            detail = str(error).strip().splitlines()[0][:160] if str(error).strip() else type(error).__name__
            raise _error(directory, f"has weights {file.name!r} that do not load ({detail})",
                         "a safetensors file written in full by save_pretrained") from None
        for key, value in loaded.items():
            if key in wanted:
                if not value.is_floating_point():
                    raise _error(directory, f"stores {key} as {value.dtype}", "floating-point weights")
                value = value.to(dtype)
                if not bool(torch.isfinite(value).all()):
                    raise _error(directory, f"has NaN or inf in {key} (read as {dtype})", "finite weights")
                tensors[key] = value
    cfg.device, cfg.dtype = where, dtype
    return DecoderModel(tensors, cfg, tokenizer=LightTokenizer.of(directory, cfg, config))


class LightTokenizer:
    """A tokenizer read by the ``tokenizers`` library alone: the BOS id and ``decode`` (special tokens kept, as
    Hugging Face's ``decode``), what a scan of repeated random tokens needs."""

    def __init__(self, core: Any, bos_token_id: int | None) -> None:
        self._tokenizer = core
        self.bos_token_id = bos_token_id

    @classmethod
    def of(cls, directory: Path, cfg: DecoderConfig, config: dict[str, Any]) -> LightTokenizer:
        """The directory's ``tokenizer.json``, else the generated word-level tokenizer of ``cfg.d_vocab`` ids."""
        from tokenizers import Tokenizer, models, pre_tokenizers

        from circuitkit.models.files import check_tokenizer_files
        from circuitkit.models.tokenizer import BOS_TOKEN, config_bos, has_tokenizer

        if has_tokenizer(directory):
            if not guarded.exists(directory / "tokenizer.json"):
                raise _error(directory, "has tokenizer files but no tokenizer.json",
                             "tokenizer.json (the fast tokenizer), or load it with bridge=True")
            check_tokenizer_files(directory)
            core = Tokenizer.from_file(str(directory / "tokenizer.json"))
            bos = _bos_name(directory)
            bos_id = core.token_to_id(bos) if bos is not None else None
            if bos_id is None:
                bos_id = config.get("bos_token_id") if isinstance(config.get("bos_token_id"), int) else None
            return cls(core, bos_id)
        bos_id = config_bos(config, cfg.d_vocab)
        vocab = {BOS_TOKEN: bos_id, **{f"t{i}": i for i in range(cfg.d_vocab) if i != bos_id}}
        core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=BOS_TOKEN))
        core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        return cls(core, bos_id)

    def decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def __repr__(self) -> str:
        return f"LightTokenizer(vocab={self._tokenizer.get_vocab_size()}, bos_token_id={self.bos_token_id})"


def _bos_name(directory: Path) -> str | None:
    """``bos_token`` of ``tokenizer_config.json`` (a string or ``{"content": ...}``), None where it names none."""
    path = directory / "tokenizer_config.json"
    if not guarded.exists(path):
        return None
    data = guarded.read_json(path, directory)
    bos = data.get("bos_token") if isinstance(data, dict) else None
    if isinstance(bos, dict):
        bos = bos.get("content")
    return bos if isinstance(bos, str) else None


__all__ = ["FAMILIES", "LightTokenizer", "decoder_refusal", "expected_shapes", "load_decoder"]
