"""GGUF files (llama.cpp, Ollama) as circuitkit models: ``load_model("model.gguf")``, ``circuitkit scan model.gguf``.

Why: many users hold their models only as GGUF. transformers reads GGUF itself (``from_pretrained(dir,
gguf_file=...)``, with the ``gguf`` package) and dequantizes every tensor to float32; circuitkit checks the file
first so that what cannot be read fails in one line, before gigabytes are dequantized:

- the file is a regular file that starts with the GGUF magic bytes;
- its ``general.architecture`` is one transformers reads from GGUF (:func:`supported_architectures`);
- every tensor's type is one the ``gguf`` package dequantizes (F32, F16, BF16 and the block quantizations
  ``Q4_0`` .. ``Q8_K``, ``IQ*``; :func:`readable_types`).

The weights are then loaded by transformers from the local file only (never the hub, never code:
``trust_remote_code`` stays False), in float32 with eager attention, and wrapped in a TransformerLens
``TransformerBridge`` like a model directory. The tokenizer is the one the file carries (``tokenizer.ggml.*``);
a file without one gets circuitkit's generated word-level tokenizer (repeated random tokens need only ids).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from circuitkit import validate
from circuitkit.errors import CircuitkitError
from circuitkit.models import files as guarded

GGUF_MAGIC = b"GGUF"
WHERE = "load_model: GGUF file"


@dataclass(frozen=True)
class GGUFFile:
    """What a GGUF file holds, read from its header: ``architecture`` (``general.architecture``), the ``types``
    of its tensors (names such as ``"Q4_K"``), the number of tensors and whether it carries a tokenizer."""

    path: Path
    architecture: str
    types: tuple[str, ...]
    n_tensors: int
    has_tokenizer: bool


def is_gguf(path: str | os.PathLike) -> bool:
    """Whether ``path`` names a GGUF file by its suffix (``.gguf``, any case)."""
    return str(path).lower().endswith(".gguf")


def _fail(path: Path, problem: str, expected: str, fix: str = "") -> CircuitkitError:
    return validate.fail(WHERE, validate.given(f"{str(path)!r}, which {problem}"), expected, fix)


def supported_architectures() -> list[str]:
    """The ``general.architecture`` values transformers reads from GGUF files."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return sorted(set(GGUF_SUPPORTED_ARCHITECTURES))


def readable_types() -> set[str]:
    """The tensor types the installed ``gguf`` package dequantizes (its own table of block formats, plus the
    plain float types it reads directly)."""
    import gguf.quants

    traits = getattr(gguf.quants, "_type_traits", {})  # the package's registry of dequantizers
    return {"F32", "F16"} | {qtype.name for qtype in traits}


def inspect_gguf(path: str | os.PathLike) -> GGUFFile:
    """Read the header of the GGUF file ``path`` and refuse (one :class:`CircuitkitError` line) what transformers
    could not load: not a GGUF file, an architecture it does not read, a tensor type that cannot be dequantized."""
    path = Path(path).expanduser()
    guarded.checked_file(path)
    with open(path, "rb") as file:
        magic = file.read(4)
    if magic != GGUF_MAGIC:
        raise _fail(path, f"starts with {magic!r}, not the GGUF magic bytes", "a GGUF file (llama.cpp, Ollama)")
    try:
        import gguf
    except ImportError:
        raise _fail(path, "needs the gguf package to be read, which is not installed",
                    "the gguf package importable", "pip install gguf") from None
    try:
        reader = gguf.GGUFReader(path, "r")
        field = reader.fields.get("general.architecture")
        architecture = bytes(field.parts[field.data[0]]).decode("utf-8") if field is not None else None
        types = tuple(sorted({tensor.tensor_type.name for tensor in reader.tensors}))
        n_tensors = len(reader.tensors)
        has_tokenizer = "tokenizer.ggml.model" in reader.fields
    except Exception as error:  # a truncated or malformed header: gguf raises whatever numpy raises
        detail = str(error).strip().splitlines()[0][:160] if str(error).strip() else type(error).__name__
        raise _fail(path, f"could not be read as GGUF ({type(error).__name__}: {detail})",
                    "a complete GGUF file (llama.cpp, Ollama)") from None
    if architecture is None:
        raise _fail(path, "names no architecture (no general.architecture)", "a GGUF model file")
    supported = supported_architectures()
    if architecture not in supported:
        raise _fail(path, f"holds architecture {architecture!r}, which transformers cannot read from GGUF",
                    f"one of {', '.join(supported)}")
    unreadable = sorted(set(types) - readable_types())
    if unreadable:
        raise _fail(path, f"holds tensors quantized as {', '.join(unreadable)}, which the gguf package cannot "
                    "dequantize", "tensors in F32, F16, BF16 or a block quantization gguf reads (Q4_K, Q8_0, ...)",
                    "Convert the file with a newer llama.cpp, or upgrade the gguf package.")
    if n_tensors == 0:
        raise _fail(path, "holds no tensors", "a GGUF model file with its weights")
    return GGUFFile(path, architecture, types, n_tensors, has_tokenizer)


def _no_bar(iterable: Any, *args: Any, **kwargs: Any) -> Any:
    return iterable


def load_gguf(path: str | os.PathLike, *, device: Any = None) -> Any:
    """The model in the GGUF file ``path``, dequantized to float32 by transformers, as a ``TransformerBridge``
    (see the module docstring). ``device``: where it goes (default CPU)."""
    import torch
    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from circuitkit.models.tokenizer import word_tokenizer

    checked = inspect_gguf(path)
    directory, name = str(checked.path.parent), checked.path.name
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # transformers' loading bar: the CLI prints its own line
    # its dequantizing bar is a plain tqdm that no setting turns off: replaced by a pass-through while loading
    dequantizing_bar = getattr(gguf_utils, "tqdm", None)
    gguf_utils.tqdm = _no_bar
    try:
        # local_files_only: the file is here, nothing is fetched (the hub is never asked)
        model, info = AutoModelForCausalLM.from_pretrained(
            directory, gguf_file=name, dtype=torch.float32, attn_implementation="eager",
            trust_remote_code=False, local_files_only=True, output_loading_info=True)
        if checked.has_tokenizer:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name, trust_remote_code=False,
                                                      local_files_only=True)
        else:
            vocab = int(model.config.vocab_size)
            bos = model.config.bos_token_id
            tokenizer = word_tokenizer(vocab, bos if isinstance(bos, int) and 0 <= bos < vocab else 0)
    except CircuitkitError:
        raise
    except Exception as error:  # transformers refusing the file's contents: one line for the user
        detail = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
        raise _fail(checked.path, f"transformers could not load ({type(error).__name__}: {detail})",
                    f"a {checked.architecture} model transformers reads from GGUF") from None
    finally:
        gguf_utils.tqdm = dequantizing_bar
        if bars:
            hf_logging.enable_progress_bar()
    fresh = sorted(map(str, (info or {}).get("missing_keys") or ()))
    if fresh:
        raise _fail(checked.path, f"lacks {len(fresh)} weight(s) of {type(model).__name__}, e.g. {fresh[:3]}",
                    "every weight of the model (a missing one would be initialised at random)")
    config = model.config
    config.__dict__.pop("quantization_config", None)  # float32 now: nothing is quantized any more
    model.eval()
    try:
        bridge = TransformerBridge.boot_transformers(checked.path.stem, hf_model=model, tokenizer=tokenizer,
                                                     trust_remote_code=False)
    except Exception as error:
        detail = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
        raise _fail(checked.path, f"holds a {checked.architecture} model TransformerLens cannot wrap "
                    f"({type(error).__name__}: {detail})", "a decoder-only architecture TransformerLens supports") \
            from None
    bridge.eval()
    if device is not None:
        bridge = bridge.to(device)
    return bridge
