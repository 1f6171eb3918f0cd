"""The Hugging Face model families circuitkit runs through TransformerLens's bridge, and what differs between them.

Why: the bridge gives every family the same hook names and the same ``W_Q/W_K/W_V/W_O``, but not the same
residual stream. Three facts change what circuitkit may compute, and they are written down here, once per family
(:class:`Family`), for :class:`~circuitkit.models.adapters.BridgeAdapter` to answer from:

- **where the attention reads from** (``norm_before_attention``): a pre-norm block (GPT-2, Llama, ...) reads
  ``ln1(resid_pre)``; a post-norm block (BERT, RoBERTa, OpenAI GPT: the norm comes after the residual sum; OLMo 2
  and 3: the norm is on the attention's output) reads ``resid_pre`` as it is.
- **whether head outputs add into the residual stream** (``additive_heads``): in a pre-norm block each head adds
  ``z_h @ W_O[h]`` to the residual stream, so one head's contribution can be isolated (path patching, edge
  attribution). A norm after the attention output (Gemma 2 and 3, OLMo 2 and 3) or after the residual sum
  (post-norm) mixes the heads non-linearly, and Granite scales the attention output (``residual_multiplier``)
  on its way into the residual stream: edge-level evidence is refused for such families; head-level scores,
  ablation and attribution are not affected.
- **whether a pass can resume from a residual stream** (``resumable``): exact ablation and path patching start
  their passes at the first layer they change; where the bridge's resumed pass does not reproduce the full one
  (measured: BLOOM, BERT, RoBERTa), they run full passes instead (same results, slower).
- **which keys a head can see** (:func:`attention_windows`): sliding-window layers (Mistral, Gemma 2/3's local
  layers, GPT-Neo's local layers, OLMo 3) see only the last ``window`` positions; the neutral value of a pattern
  score (what a head attending uniformly scores) counts only those keys.

Everything else (fused QKV, grouped/multi-query attention, rotary and ALiBi positions, QK-norm, parallel attention
and MLP, soft-capping, mixtures of experts) the bridge presents in TransformerLens's shapes; ``notes`` records it
for the table of supported families. Adding a family: one :class:`Family` entry in :data:`FAMILIES` and one tiny
config in ``tests/test_families.py``, whose oracles (Hugging Face's logits and attentions, the hooks) check the
facts above.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Family:
    """One family of Hugging Face models (several ``model_type`` values may share one)."""

    name: str
    model_types: tuple[str, ...]
    example: str  # a checkpoint researchers load
    norm_before_attention: bool = True
    additive_heads: bool = True
    resumable: bool = True
    notes: str = ""

    @property
    def parallel_attention(self) -> bool:
        """Attention and MLP read the same residual stream (``resid_pre``) and add their outputs together: a head
        of layer ``l`` does not feed the MLP of layer ``l`` (every family with it says so in its notes)."""
        return "parallel attention" in self.notes

    @property
    def bidirectional(self) -> bool:
        """Every position attends to every other (BERT-likes): no task metric read at a prompt's last token."""
        return "bidirectional" in self.notes

    @property
    def task_circuits(self) -> str:
        """What a task scan measures in this family (the README table's column)."""
        if self.bidirectional:
            return "no (bidirectional: refused before the model loads)"
        return "nodes and edges" if self.additive_heads else "nodes (no edges: heads do not add into the stream)"


FAMILIES: tuple[Family, ...] = (
    Family("GPT-2", ("gpt2",), "gpt2", notes="fused QKV, learned positions"),
    Family("GPT-J", ("gptj",), "EleutherAI/gpt-j-6b", notes="rotary, parallel attention and MLP"),
    Family("GPT-Neo", ("gpt_neo",), "EleutherAI/gpt-neo-125m", notes="local layers with a sliding window"),
    Family("GPT-NeoX / Pythia", ("gpt_neox",), "EleutherAI/pythia-70m",
           notes="rotary (partial), parallel attention and MLP, training checkpoints"),
    Family("OPT", ("opt",), "facebook/opt-125m", notes="learned positions"),
    Family("BLOOM", ("bloom",), "bigscience/bloom-560m", resumable=False, notes="ALiBi, fused QKV"),
    Family("Falcon", ("falcon",), "tiiuae/falcon-rw-1b", notes="multi-query attention, ALiBi, parallel attention"),
    Family("Llama", ("llama",), "meta-llama/Llama-3.2-1B", notes="grouped-query attention, rotary, RMSNorm"),
    Family("Mistral", ("mistral",), "mistralai/Mistral-7B-v0.1", notes="grouped-query attention, sliding window"),
    Family("Mixtral", ("mixtral",), "mistralai/Mixtral-8x7B-v0.1", notes="mixture of experts"),
    Family("Qwen2", ("qwen2",), "Qwen/Qwen2.5-0.5B", notes="grouped-query attention, QKV biases"),
    Family("Qwen2-MoE", ("qwen2_moe",), "Qwen/Qwen1.5-MoE-A2.7B", notes="mixture of experts with a shared expert"),
    Family("Qwen3", ("qwen3",), "Qwen/Qwen3-0.6B", notes="QK-norm"),
    Family("Qwen3-MoE", ("qwen3_moe",), "Qwen/Qwen3-30B-A3B", notes="QK-norm, mixture of experts"),
    Family("Gemma", ("gemma",), "google/gemma-2b", notes="multi-query / grouped attention, scaled embeddings"),
    Family("Gemma 2", ("gemma2",), "google/gemma-2-2b", additive_heads=False,
           notes="soft-capping, alternating sliding-window layers, norm after attention"),
    Family("Gemma 3", ("gemma3_text", "gemma3"), "google/gemma-3-1b-pt", additive_heads=False,
           notes="QK-norm, sliding-window layers, norm after attention"),
    Family("Phi", ("phi",), "microsoft/phi-2", notes="partial rotary, parallel attention and MLP"),
    Family("Phi-3", ("phi3",), "microsoft/Phi-3-mini-4k-instruct", notes="fused QKV, grouped-query attention"),
    Family("OLMo", ("olmo",), "allenai/OLMo-1B-hf", notes="non-parametric LayerNorm"),
    Family("OLMo 2", ("olmo2",), "allenai/OLMo-2-0425-1B", norm_before_attention=False, additive_heads=False,
           notes="QK-norm, norm after attention"),
    Family("OLMo 3", ("olmo3",), "allenai/Olmo-3-1025-7B", norm_before_attention=False, additive_heads=False,
           notes="QK-norm, sliding windows, norm after attention"),
    Family("OLMoE", ("olmoe",), "allenai/OLMoE-1B-7B-0924", notes="mixture of experts, QK-norm"),
    Family("StableLM", ("stablelm",), "stabilityai/stablelm-2-1_6b", notes="partial rotary, LayerNorm"),
    Family("GPT-BigCode / StarCoder", ("gpt_bigcode",), "bigcode/starcoderbase-1b", notes="multi-query attention"),
    Family("StarCoder2", ("starcoder2",), "bigcode/starcoder2-3b", notes="grouped-query attention, LayerNorm"),
    Family("CodeGen", ("codegen",), "Salesforce/codegen-350M-mono", notes="fused QKV, rotary, parallel attention"),
    Family("MPT", ("mpt",), "mosaicml/mpt-7b", notes="ALiBi"),
    Family("XGLM", ("xglm",), "facebook/xglm-564M", notes="sinusoidal positions"),
    Family("Granite", ("granite",), "ibm-granite/granite-3.0-2b-base", additive_heads=False,
           notes="attention output scaled by residual_multiplier before the residual stream"),
    Family("Granite-MoE", ("granitemoe",), "ibm-granite/granite-3.0-1b-a400m-base", additive_heads=False,
           notes="mixture of experts, scaled residuals"),
    Family("Cohere", ("cohere",), "CohereForAI/c4ai-command-r-v01", notes="parallel attention, LayerNorm"),
    Family("Cohere 2", ("cohere2",), "CohereLabs/c4ai-command-r7b-12-2024",
           notes="parallel attention, sliding-window layers"),
    Family("EXAONE 4", ("exaone4",), "LGAI-EXAONE/EXAONE-4.0-1.2B", norm_before_attention=False,
           additive_heads=False, notes="QK-norm, norm after attention"),
    Family("Nemotron", ("nemotron",), "nvidia/Minitron-4B-Base", notes="LayerNorm1P"),
    Family("GLM", ("glm",), "THUDM/glm-4-9b-hf", notes="partial rotary, fused gate-up MLP"),
    Family("SmolLM3", ("smollm3",), "HuggingFaceTB/SmolLM3-3B", notes="rotary skipped in some layers"),
    Family("OpenAI GPT", ("openai-gpt",), "openai-community/openai-gpt", norm_before_attention=False,
           additive_heads=False, notes="post-norm"),
    Family("BERT", ("bert",), "bert-base-uncased", norm_before_attention=False, additive_heads=False,
           resumable=False, notes="bidirectional, post-norm (masked-LM head required)"),
    Family("RoBERTa", ("roberta",), "FacebookAI/roberta-base", norm_before_attention=False, additive_heads=False,
           resumable=False, notes="bidirectional, post-norm (masked-LM head required)"),
)
"""Every family the test matrix (``tests/test_families.py``) checks against Hugging Face, in table order."""

_BY_MODEL_TYPE = {model_type: family for family in FAMILIES for model_type in family.model_types}

_STATE_SPACE = "a state-space model with no attention layers, so it has no attention heads to score"
_HYBRID = ("a hybrid whose layers are not all attention layers; circuitkit indexes heads by attention layer and "
           "resumes passes at layer boundaries, which such stacks do not share")
UNSUPPORTED: dict[str, str] = {
    **{model_type: _STATE_SPACE for model_type in ("mamba", "mamba2", "falcon_mamba", "rwkv")},
    **{model_type: _HYBRID for model_type in ("jamba", "zamba2", "bamba", "falcon_h1", "granitemoehybrid",
                                              "nemotron_h", "lfm2", "lfm2_moe", "qwen3_next", "olmo_hybrid",
                                              "recurrent_gemma")},
}
"""Families TransformerLens bridges that circuitkit refuses at load time, with the reason (encoder-decoder models
are refused by their config's ``is_encoder_decoder``)."""


def unsupported_reason(hf_config: Any) -> str | None:
    """Why circuitkit cannot score a model of this config's family, or None where it can."""
    return UNSUPPORTED.get(getattr(hf_config, "model_type", None))


def family_of(hf_config: Any) -> Family | None:
    """The :class:`Family` of a transformers config (by ``model_type``), or None for a family not in the table."""
    return _BY_MODEL_TYPE.get(getattr(hf_config, "model_type", None))


def task_refusal(model_dir: Any) -> str | None:
    """Why a task scan cannot run on the model in local directory ``model_dir``, read from its ``config.json``'s
    ``model_type`` before any weight loads (None where it can, or where the directory or its family is not known
    here: the loaded model is checked again)."""
    import json
    import os

    path = os.path.join(os.fspath(model_dir), "config.json") if isinstance(model_dir, (str, os.PathLike)) else None
    if path is None or not os.path.isfile(path) or os.path.getsize(path) > 2**20:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            model_type = json.load(f).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None
    family = _BY_MODEL_TYPE.get(model_type) if isinstance(model_type, str) else None
    if family is not None and family.bidirectional:
        return (f"a {family.name} model (model_type {model_type!r}) is bidirectional; a task's metric is read at "
                "each prompt's last token, which needs a causal language model")
    return None


def attention_windows(hf_config: Any, n_layers: int) -> tuple[int | None, ...]:
    """Per layer, how many keys (the query's own position and those before it) a head can see: ``None`` for every
    earlier position, ``w`` for a sliding window of ``w`` (key ``k`` visible from query ``q`` when
    ``q - w < k <= q``).

    Read from the config as transformers reads it: ``layer_types`` (``"sliding_attention"`` layers use
    ``sliding_window``), else GPT-Neo's ``attention_layers`` (``"local"`` layers use ``window_size``), else a
    ``sliding_window`` that applies to every layer unless ``use_sliding_window`` is false."""
    layer_types = getattr(hf_config, "layer_types", None)
    window = getattr(hf_config, "sliding_window", None)
    if isinstance(layer_types, (list, tuple)) and len(layer_types) == n_layers:
        return tuple(_positive(window) if kind == "sliding_attention" else None for kind in layer_types)
    neo_layers = getattr(hf_config, "attention_layers", None)
    if getattr(hf_config, "model_type", None) == "gpt_neo" and isinstance(neo_layers, (list, tuple)):
        size = _positive(getattr(hf_config, "window_size", None))
        return tuple(size if kind == "local" else None for kind in neo_layers[:n_layers])
    if getattr(hf_config, "use_sliding_window", True) is False:
        return (None,) * n_layers
    return (_positive(window),) * n_layers


def _positive(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def table_rows(families: Iterable[Family] = FAMILIES) -> str:
    """The README's table of supported families (markdown), generated from :data:`FAMILIES`."""
    lines = [
        "| family | `model_type` | e.g. | what differs | edge evidence | task circuits |",
        "|---|---|---|---|---|---|",
    ]
    for family in families:
        types = ", ".join(f"`{t}`" for t in family.model_types)
        edges = "yes" if family.additive_heads else "no (heads do not add into the residual stream)"
        notes = family.notes + ("" if family.resumable else "; ablation runs full passes")
        lines.append(f"| {family.name} | {types} | `{family.example}` | {notes} | {edges} | {family.task_circuits} |")
    return "\n".join(lines)


README_START, README_END = "<!-- families:start -->", "<!-- families:end -->"


def write_readme_table(path: str) -> None:
    """Replace the generated table between :data:`README_START` and :data:`README_END` in the file at ``path``."""
    from pathlib import Path

    file = Path(path)
    text = file.read_text(encoding="utf-8")
    if README_START not in text or README_END not in text:
        raise SystemExit(f"{path}: no {README_START} ... {README_END} block to refresh")
    head, rest = text.split(README_START, 1)
    tail = rest.split(README_END, 1)[1]
    file.write_text(f"{head}{README_START}\n{table_rows()}\n{README_END}{tail}", encoding="utf-8")


if __name__ == "__main__":  # python -m circuitkit.models.families README.md
    import sys

    write_readme_table(sys.argv[1] if len(sys.argv) > 1 else "README.md")


__all__ = [
    "FAMILIES", "UNSUPPORTED", "Family", "attention_windows", "family_of", "table_rows", "task_refusal",
    "unsupported_reason",
    "write_readme_table",
]
