"""Load a model to analyse: a bundled zoo model, a local Hugging Face directory, or a model in the local hub cache.

Why: circuitkit runs offline and runs only its own code. Three promises, each checked before Hugging Face
``transformers`` is asked for anything:

- **Nothing fetched unless asked.** Unless ``allow_download=True``, every Hugging Face call (config, weights,
  tokenizer, ``TransformerBridge.boot_transformers``) runs inside :func:`hub_offline`: ``HF_HUB_OFFLINE`` /
  ``TRANSFORMERS_OFFLINE`` set and ``huggingface_hub.constants.HF_HUB_OFFLINE`` true for the duration of the
  call (huggingface_hub reads that constant on every request), then restored. A hub name resolves from the
  local cache only.
- **Never a model's own code.** ``trust_remote_code=False`` is passed everywhere. A directory (or cached repo)
  whose ``config.json`` or ``tokenizer_config.json`` has an ``auto_map`` needs custom code and is refused
  with one :class:`CircuitkitError` line; no prompt is shown and no file of the directory is imported.
- **Only safe weight formats.** Weights load from safetensors only. A directory with only pickle checkpoints
  (``pytorch_model.bin``, ``*.pt``, ``*.ckpt``) is refused: unpickling is code execution, and even torch's
  ``weights_only`` unpickler is an allow-list that has had bypasses (CVE-2025-32434, torch <= 2.5.1);
  safetensors is a JSON header plus raw bytes and cannot run anything. The error says how to convert.

Malformed directories (no / empty / non-JSON ``config.json``, unknown ``model_type``, an encoder-decoder,
truncated or garbage safetensors, weights whose shapes do not fit the config) are found by
:func:`inspect_directory` before loading, each as one :class:`CircuitkitError` line: it reads the safetensors
headers (names, shapes) and compares them with the model built from the config on the ``meta`` device (no memory,
no weights). Missing weights are judged as transformers judges them: after its own key renaming, from the
``output_loading_info`` of the load itself; any weight it would initialise at random (a head missing from the
checkpoint) is refused, never scanned.

Sharding (models larger than one device): ``device_map`` / ``max_memory`` / ``n_devices`` / ``offload_folder``
pass through to ``TransformerBridge.boot_transformers`` (accelerate underneath), after :func:`check_device_map`
has checked that an explicit map covers every parameter of the model and names only devices that exist here.

A directory without tokenizer files gets a generated word-level tokenizer (:mod:`circuitkit.models.tokenizer`).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from circuitkit import validate
from circuitkit.errors import CircuitkitError
from circuitkit.models import files as guarded
from circuitkit.models.directory import (
    PICKLE_SUFFIXES,  # noqa: F401  (re-exported)
    SAFETENSORS_INDEX,  # noqa: F401  (re-exported)
    _error,
    read_config,
    read_shapes,
    refuse_custom_code,
    weight_files,
)
from circuitkit.models.gguf import is_gguf
from circuitkit.models.tokenizer import (  # noqa: F401  (re-exported: the names used to live here)
    BOS_TOKEN,
    TOKENIZER_FILES,
    config_bos,
    has_tokenizer,
    load_tokenizer,
    word_tokenizer,
    word_tokenizer_files,
)

__all__ = ["check_device_map", "hub_offline", "induction_model", "inspect_directory", "load_hf_directory",
           "load_model", "own_model"]

DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
"""The string device maps accelerate understands."""
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
DOWNLOAD_PATTERNS = ("*.json", "*.safetensors", "tokenizer.model", "*.txt", "*.tiktoken")
"""With ``allow_download``, only these are fetched: configs, safetensors weights, tokenizer files; never code
(``*.py``) nor pickles."""


@dataclass(frozen=True)
class Sharding:
    """Where the weights go: at most one of ``device`` and ``device_map``/``n_devices``."""

    device: torch.device | None = None
    device_map: str | dict[str, str | int] | None = None
    max_memory: dict[str | int, str | int] | None = None
    n_devices: int | None = None
    offload_folder: str | None = None
    dtype: torch.dtype = torch.float32

    @property
    def sharded(self) -> bool:
        return self.device_map is not None or self.n_devices is not None

    def boot_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"device": self.device if self.device is not None else torch.device("cpu")}
        if self.sharded:
            kwargs = {"device_map": self.device_map, "n_devices": self.n_devices, "max_memory": self.max_memory}
            if self.offload_folder is not None:
                kwargs["offload_folder"] = self.offload_folder
        return {**kwargs, "dtype": self.dtype}


@dataclass(frozen=True)
class ModelDirectory:
    """A checked Hugging Face model directory: its parsed ``config.json`` and its safetensors files."""

    path: Path
    config: dict[str, Any]
    weight_files: tuple[Path, ...]


@contextlib.contextmanager
def hub_offline() -> Iterator[None]:
    """Force the Hugging Face hub client offline for the duration of the block, then restore what was there.

    Sets ``HF_HUB_OFFLINE=1`` and ``TRANSFORMERS_OFFLINE=1`` (read at import by fresh imports) and
    ``huggingface_hub.constants.HF_HUB_OFFLINE = True`` (read on every request by ``is_offline_mode``, which
    transformers' ``cached_file`` and huggingface_hub's HTTP hook consult), so a file that is not in the
    cache fails at once instead of reaching the network."""
    import huggingface_hub.constants as hub_constants

    saved_env = {name: os.environ.get(name) for name in OFFLINE_VARIABLES}
    saved_constant = hub_constants.HF_HUB_OFFLINE
    for name in OFFLINE_VARIABLES:
        os.environ[name] = "1"
    hub_constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        hub_constants.HF_HUB_OFFLINE = saved_constant
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _hub_access(allow_download: bool):
    return contextlib.nullcontext() if allow_download else hub_offline()


def inspect_directory(directory: str | Path) -> ModelDirectory:
    """Check a Hugging Face model directory before anything loads it; one :class:`CircuitkitError` per fault.

    In order: ``config.json`` exists, is non-empty JSON; no ``auto_map`` (custom code) in it or in
    ``tokenizer_config.json``; ``model_type`` is one transformers knows; safetensors weights exist (pickle-only
    checkpoints refused), their headers parse and cover the file (a truncated or garbage file fails here), a
    sharded index names only files present; not an encoder-decoder; and every weight stored under the name of a
    parameter of the model built from the config (on the ``meta`` device) has its shape. Whether every parameter
    is present is checked when the model loads, after transformers' own key renaming (GPT-NeoX's ``embed_out``,
    Mixtral's per-expert weights): a weight transformers would initialise at random is refused then."""
    path = Path(directory)
    config_path = path / "config.json"
    if not guarded.exists(config_path):
        raise _error("given directory", f"{str(path)!r} with no config.json",
                     "a Hugging Face model directory written by save_pretrained(...)")
    config = read_config(config_path, "given config")
    refuse_custom_code(path, config)
    model_type = config.get("model_type")
    from transformers import CONFIG_MAPPING

    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        shown = "no model_type" if model_type is None else f"model_type {model_type!r}"
        raise _error(f"{str(config_path)!r} has", shown,
                     "a model_type that the installed transformers knows (e.g. 'gpt2', 'llama')",
                     "Upgrade transformers if the architecture is newer than it.")
    attention = config.get("attn_implementation", config.get("_attn_implementation"))
    if attention not in (None, "eager", "sdpa"):
        raise _error(f"{str(config_path)!r} asks for", f"attn_implementation {attention!r}",
                     "'eager' (or no entry): circuitkit reads every attention pattern, which only eager attention "
                     "computes", "Remove the attn_implementation entry from config.json.")
    _refuse_unsupported(path, _hf_config(path))
    files = weight_files(path)
    guarded.check_directory(path)  # also the files only Hugging Face opens (generation_config.json, ...)
    _check_shapes(path, config, files)
    return ModelDirectory(path=path, config=config, weight_files=files)


def _refuse_unsupported(path: Path, hf_config: Any) -> None:
    from circuitkit.models.families import unsupported_reason

    reason = unsupported_reason(hf_config)
    if reason is not None:
        raise _error("given model", f"{str(path)!r} of family {hf_config.model_type!r}, {reason}",
                     "a transformer whose layers are all attention layers (GPT-2, Llama, BERT, ...)")
    if getattr(hf_config, "is_encoder_decoder", False):
        raise _error("given model", f"{str(path)!r}, an encoder-decoder ({hf_config.model_type})",
                     "a decoder-only (GPT-2, Llama, ...) or encoder-only (BERT) model: encoder-decoder models are "
                     "not supported, since their decoder's cross-attention heads read a second sequence (the "
                     "encoder's output) and circuitkit scores self-attention over one token sequence")


def _hf_config(path: Path) -> Any:
    """The transformers config of ``path`` (hub offline, no custom code); one error line if it cannot be read."""
    from transformers import AutoConfig

    try:
        with hub_offline():
            return AutoConfig.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except Exception as error:
        detail = str(error).strip().splitlines()[0][:160] if str(error).strip() else type(error).__name__
        raise _error("given config", f"{str(path / 'config.json')!r} that transformers cannot read ({detail})",
                     "a config written by save_pretrained(...)") from None


def _skeleton(path: Path, config: dict[str, Any]) -> torch.nn.Module:
    """The model the config describes, on the ``meta`` device (shapes only, no memory, no weights)."""
    import transformers
    from transformers import AutoModelForCausalLM

    hf_config = _hf_config(path)
    classes = [getattr(transformers, name, None) for name in config.get("architectures") or []]
    builders = [cls for cls in classes if isinstance(cls, type)] + [AutoModelForCausalLM]
    last: Exception | None = None
    for builder in builders:
        try:
            with torch.device("meta"):
                return builder.from_config(hf_config, trust_remote_code=False) if builder is AutoModelForCausalLM \
                    else builder(hf_config)
        except Exception as error:  # a config whose sizes do not make a model, or not a causal LM
            last = error
    detail = str(last).strip().splitlines()[0][:160] if last is not None and str(last).strip() else "unknown"
    raise _error("given config", f"{str(path / 'config.json')!r} that does not build a causal language model "
                 f"({detail})", "the config of a decoder-only model such as GPT-2 or Llama")


def _check_shapes(path: Path, config: dict[str, Any], files: tuple[Path, ...]) -> None:
    """Every weight stored under a parameter's own name has that parameter's shape (one line naming the first
    three that do not). Names transformers renames on load (GPT-NeoX's ``embed_out``, Mixtral's per-expert
    ``w1/w2/w3``) are not compared here: whether the model ends up complete is checked on the loaded model,
    after transformers' own key mapping (:func:`_check_loading_info`)."""
    shapes = read_shapes(files)
    model = _skeleton(path, config)
    prefix = getattr(model, "base_model_prefix", "") or ""
    found: dict[str, tuple[int, ...]] = {}
    for key, shape in shapes.items():  # checkpoints may be saved with or without the base model's prefix
        for candidate in (key, f"{prefix}.{key}", key.removeprefix(f"{prefix}.")):
            found.setdefault(candidate, shape)
    wrong = [f"{name} {list(found[name])} (config: {list(param.shape)})"
             for name, param in model.named_parameters() if name in found and found[name] != tuple(param.shape)]
    if wrong:
        raise _error("given weights", f"in {str(path)!r} whose shapes do not fit config.json: {', '.join(wrong[:3])}"
                     + (f" and {len(wrong) - 3} more" if len(wrong) > 3 else ""),
                     "weights saved from a model with this config")


class _CheckedLoad:
    """Stands in for the Hugging Face model class ``TransformerBridge.boot_transformers`` would pick: loads with
    that class's own ``from_pretrained(..., output_loading_info=True)`` and keeps what transformers reports
    (``missing_keys``: parameters the checkpoint lacks after transformers' key renaming, which it initialises at
    random; ``mismatched_keys``; ``unexpected_keys``: stored weights the model does not use, ignored as
    transformers ignores them)."""

    def __init__(self) -> None:
        self.info: dict[str, Any] | None = None
        self.class_name = "the model"

    def from_pretrained(self, name: str, **kwargs: Any) -> Any:
        from transformer_lens.model_bridge.sources.transformers.helpers import get_hf_model_class_for_architecture
        from transformer_lens.model_bridge.sources.transformers.source import determine_architecture_from_hf_config

        real = get_hf_model_class_for_architecture(determine_architecture_from_hf_config(kwargs["config"]))
        model, self.info = real.from_pretrained(name, output_loading_info=True, **kwargs)
        self.class_name = type(model).__name__
        return model


def _check_loading_info(path: str, load: _CheckedLoad) -> None:
    """Refuse a model with any weight transformers had to initialise at random (one line): its results would
    change from run to run. A checkpoint saved without its head (``BertModel`` for a masked LM) is the usual case."""
    info = load.info or {}
    missing = sorted(map(str, info.get("missing_keys") or ()))
    mismatched = sorted(str(entry[0] if isinstance(entry, tuple) else entry)
                        for entry in info.get("mismatched_keys") or ())
    fresh = missing + [name for name in mismatched if name not in missing]
    if fresh:
        raise _error("given weights", f"in {path!r} that lack {len(fresh)} weight(s) of {load.class_name}, which "
                     f"transformers would initialise at random, e.g. {fresh[:3]}",
                     "every weight of the model config.json describes, after transformers' own renaming (a "
                     "randomly initialised weight, such as the head of a checkpoint saved without one, would "
                     "make every score differ from run to run)",
                     "Save the model with its language-model head (e.g. BertForMaskedLM, not BertModel).")


def check_device_map(device_map: Any, model: torch.nn.Module | None = None) -> str | dict[str, str | int]:
    """``device_map`` checked: a strategy in :data:`DEVICE_MAP_STRATEGIES`, or a dict from module names to
    devices (``"cpu"``, ``"disk"``, ``"cuda:N"``, an int N for ``cuda:N``, ``"mps"``) that exist here.
    With ``model`` (a skeleton), a dict must name only modules of it (``""`` is the whole model) and cover every
    entry of its ``state_dict`` with some key equal to the entry's module or a prefix of it."""
    name = "load_model: device_map"
    if isinstance(device_map, str):
        return validate.option(name, device_map, DEVICE_MAP_STRATEGIES)
    if not isinstance(device_map, Mapping) or not device_map:
        raise validate.fail(name, device_map, f"one of {list(DEVICE_MAP_STRATEGIES)} or a non-empty dict "
                            "{module name: device}")
    checked: dict[str, str | int] = {}
    for key, target in device_map.items():
        if not isinstance(key, str):
            raise validate.fail(f"{name} key", key, "a module name (str)")
        checked[key] = _check_target(f"{name}[{key!r}]", target)
    if model is not None:
        modules = {module_name for module_name, _ in model.named_modules()}
        unknown = sorted(key for key in checked if key not in modules)
        if unknown:
            raise validate.fail(name, validate.given(f"keys {unknown[:3]} that are no module of the model"),
                                f"module names such as {sorted(m for m in modules if m.count('.') <= 1)[:6]}")
        uncovered = [entry for entry in model.state_dict() if not _covered(entry, checked)]
        if uncovered:
            raise validate.fail(name, validate.given(f"a map that leaves {len(uncovered)} weight(s) without a "
                                                     f"device, e.g. {uncovered[:3]}"),
                                "a device for every module of the model", "Add their modules (or a parent) to the map.")
    return checked


def _covered(entry: str, device_map: Mapping[str, Any]) -> bool:
    return any(key == "" or entry == key or entry.startswith(key + ".") for key in device_map)


def _check_target(name: str, target: Any) -> str | int:
    if isinstance(target, str) and target == "disk":
        return target
    if isinstance(target, bool):
        raise validate.fail(name, target, "'cpu', 'disk', 'cuda:N' or an int N for cuda:N")
    if isinstance(target, int):
        validate.device(name, f"cuda:{target}", allow_none=False)
        return target
    return str(validate.device(name, target, allow_none=False))


def _check_max_memory(max_memory: Any) -> dict[str | int, str | int] | None:
    if max_memory is None:
        return None
    name = "load_model: max_memory"
    if not isinstance(max_memory, Mapping) or not max_memory:
        raise validate.fail(name, max_memory, "a non-empty dict {device: bytes or size such as '2GiB'}")
    from accelerate.utils import convert_file_size_to_int

    checked: dict[str | int, str | int] = {}
    for key, size in max_memory.items():
        if not (isinstance(key, str) and key == "disk"):
            _check_target(f"{name} key", key)
        if isinstance(size, bool) or not isinstance(size, (int, str)):
            raise validate.fail(f"{name}[{key!r}]", size, "a size in bytes (int) or a string such as '2GiB'")
        try:
            bytes_ = convert_file_size_to_int(size)
        except (ValueError, TypeError):
            raise validate.fail(f"{name}[{key!r}]", size, "a size such as 2_000_000_000 or '2GiB'") from None
        if bytes_ <= 0:
            raise validate.fail(f"{name}[{key!r}]", size, "a positive size")
        checked[key] = size
    return checked


def _sharding(device, device_map, max_memory, n_devices, offload_folder) -> Sharding:
    device = validate.device("load_model: device", device)
    if n_devices is not None:
        n_devices = validate.positive_int("load_model: n_devices", n_devices)
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n_devices > 1 and n_devices > count:
            raise validate.fail("load_model: n_devices", n_devices, f"at most the {count} CUDA device(s) here",
                                "Use device_map (e.g. with 'cpu' and 'disk' entries) to split over CPU and disk.")
        n_devices = None if n_devices == 1 else n_devices
    if device_map is not None:
        device_map = check_device_map(device_map)
    if (device_map is not None or n_devices is not None) and device is not None:
        raise validate.fail("load_model: device", device, "None when device_map or n_devices is given",
                            "A device map places each module itself; pass one or the other.")
    if device_map is not None and n_devices is not None:
        raise validate.fail("load_model: n_devices", n_devices, "None when device_map is given",
                            "n_devices builds a 'balanced' map; pass one or the other.")
    max_memory = _check_max_memory(max_memory)
    if max_memory is not None and device_map is None and n_devices is None:
        raise validate.fail("load_model: max_memory", max_memory, "a device_map or n_devices beside it",
                            "e.g. device_map='auto', max_memory={0: '10GiB', 'cpu': '30GiB'}.")
    if offload_folder is not None:
        if not isinstance(offload_folder, (str, os.PathLike)) or not str(offload_folder):
            raise validate.fail("load_model: offload_folder", offload_folder, "a directory path")
        if device_map is None:
            raise validate.fail("load_model: offload_folder", offload_folder, "a device_map beside it")
        offload_folder = str(offload_folder)
    return Sharding(device, device_map, max_memory, n_devices, offload_folder)


def load_hf_directory(
    directory: str | Path,
    *,
    device: str | torch.device | None = None,
    device_map: str | dict[str, str | int] | None = None,
    max_memory: dict[str | int, str | int] | None = None,
    n_devices: int | None = None,
    offload_folder: str | os.PathLike | None = None,
):
    """A Hugging Face causal LM saved in ``directory``, checked by :func:`inspect_directory`, loaded with the hub
    offline and wrapped in a ``TransformerBridge`` (eager attention, float32, eval mode)."""
    sharding = _sharding(device, device_map, max_memory, n_devices, offload_folder)
    checked = inspect_directory(directory)
    return _boot(str(checked.path), checked, sharding, allow_download=False)


def _boot(model_name: str, checked: ModelDirectory, sharding: Sharding, *, allow_download: bool):
    from transformer_lens.model_bridge import TransformerBridge

    if isinstance(sharding.device_map, dict):
        check_device_map(sharding.device_map, _skeleton(checked.path, checked.config))
    with _hub_access(allow_download):
        if has_tokenizer(checked.path):
            tokenizer = load_tokenizer(checked.path)
        else:
            d_vocab = int(checked.config.get("vocab_size") or 0) or 2
            tokenizer = word_tokenizer(d_vocab, config_bos(checked.config, d_vocab))
        load = _CheckedLoad()
        try:
            bridge = TransformerBridge.boot_transformers(
                model_name, tokenizer=tokenizer, trust_remote_code=False, model_class=load, **sharding.boot_kwargs()
            )
        except CircuitkitError:
            raise
        except Exception as error:  # unsupported architecture, accelerate refusing a map: one line for the user
            detail = str(error).strip().splitlines()[0][:240] if str(error).strip() else ""
            raise _error("could not load", f"{model_name!r} ({type(error).__name__}: {detail})",
                         "a decoder-only architecture that TransformerLens supports") from None
    _check_loading_info(model_name, load)
    bridge.eval()
    if sharding.offload_folder is None and any(p.is_meta for p in bridge.parameters()):
        raise _error("given device_map", f"{sharding.device_map!r}, which left weights on the meta device (no data)",
                     "an offload_folder beside a device_map with 'disk' entries, or devices with room for every "
                     "weight", "Pass offload_folder=... (circuitkit scan: a map without 'disk').")
    return bridge


def load_model(
    name_or_path: str | os.PathLike | None = None,
    *,
    device: str | torch.device | None = None,
    allow_download: bool = False,
    device_map: str | dict[str, str | int] | None = None,
    max_memory: dict[str | int, str | int] | None = None,
    n_devices: int | None = None,
    offload_folder: str | os.PathLike | None = None,
    dtype: str | torch.dtype | None = None,
    bridge: bool = True,
) -> Any:
    """Load a model by zoo name, local directory or Hugging Face / TransformerLens name, as a ``TransformerBridge``.

    - ``None`` or a name in :func:`circuitkit.zoo.available`: the bundled model (``None``: ``"induction-2l"``).
    - an existing local directory: a Hugging Face model saved with ``save_pretrained``, checked by
      :func:`inspect_directory` and loaded with the hub offline.
    - an existing ``.gguf`` file (llama.cpp, Ollama): dequantized to float32 by transformers
      (:mod:`circuitkit.models.gguf`; needs the ``gguf`` package).
    - anything else: a hub repository id (or TransformerLens alias such as ``"gpt2-small"``). By default only a
      copy already in the local Hugging Face cache is used, with the hub client forced offline; a name that is
      not cached fails at once with a one-line :class:`CircuitkitError`. ``allow_download=True`` fetches the
      repository's configs, tokenizer and safetensors weights (never code, never pickles) first.

    ``device``: where the model goes (validated by :func:`circuitkit.validate.device`; default CPU for Hugging
    Face models). ``device_map`` (``"auto"``, ``"balanced"``, ``"balanced_low_0"``, ``"sequential"`` or a dict
    from module names to devices, ``"disk"`` included), ``max_memory`` (device -> size), ``n_devices`` (CUDA
    GPUs to split over) and ``offload_folder`` (for ``"disk"`` entries) shard a Hugging Face model through
    ``TransformerBridge.boot_transformers`` and accelerate; they exclude ``device``.

    ``dtype``: the weights' dtype, ``"float32"`` (default), ``"bfloat16"`` or ``"float16"``: a Hugging Face model is
    read in it (half the memory of float32); the bundled and GGUF models are cast after loading.

    ``bridge=False``: circuitkit's own model instead, without importing transformers or TransformerLens: a bundled
    attention-only model as :class:`~circuitkit.models.AttentionOnlyModel`, a local Llama, Qwen2 or Mistral directory
    as :class:`~circuitkit.models.decoder.DecoderModel` (the same logits and hooks; it decodes token ids but does
    not tokenize text, so task scans keep the bridge). Anything else is refused in one line saying why.
    """
    from dataclasses import replace

    allow_download = validate.boolean("load_model: allow_download", allow_download)
    if not validate.boolean("load_model: bridge", bridge):
        return _load_native(name_or_path, device=device, dtype=dtype, sharded=any(
            x is not None for x in (device_map, max_memory, n_devices, offload_folder)))
    sharding = _sharding(device, device_map, max_memory, n_devices, offload_folder)
    sharding = replace(sharding, dtype=validate.dtype("load_model: dtype", dtype) or torch.float32)
    model = _load(name_or_path, sharding, allow_download)
    if any(p.is_floating_point() and p.dtype != sharding.dtype for p in model.parameters()):
        if hasattr(model, "original_model"):  # a TransformerBridge: quietly (it prints the change by default)
            model.to(sharding.dtype, print_details=False)
        else:
            model.to(sharding.dtype)
    return model


def _load_native(name_or_path: Any, *, device: Any, dtype: Any, sharded: bool) -> Any:
    """:func:`load_model` with ``bridge=False``."""
    from circuitkit import zoo

    if sharded:
        raise validate.fail("load_model: device_map", "a sharding option", "none with bridge=False (circuitkit's own "
                            "models run on one device)")
    dtype = validate.dtype("load_model: dtype", dtype)
    if _bundled(name_or_path):
        name = name_or_path or zoo.DEFAULT
        if zoo.info(name).format.startswith("hf-"):
            from circuitkit.models.decoder_files import load_decoder

            return load_decoder(zoo.info(name).path, device=device, dtype=dtype)
        if dtype is not None:
            raise validate.fail("load_model: dtype", dtype, f"None for the bundled model {name!r} with bridge=False "
                                "(it runs in its own float32; bridge=True casts it)")
        return zoo.load(name, device=device, bridge=False)
    if not isinstance(name_or_path, (str, os.PathLike)) or not guarded.is_dir(Path(name_or_path).expanduser()):
        raise validate.fail("load_model: name_or_path", name_or_path, "a bundled model's name or a local Hugging "
                            "Face directory with bridge=False")
    from circuitkit.models.decoder_files import load_decoder

    return load_decoder(Path(name_or_path).expanduser(), device=device, dtype=dtype)


def _bundled(name_or_path: Any) -> bool:
    """Whether ``name_or_path`` names a bundled model (None: the default one) and no directory of that name here."""
    from circuitkit import zoo

    return name_or_path is None or (isinstance(name_or_path, str) and name_or_path in zoo.available()
                                    and not guarded.exists(Path(name_or_path) / "config.json"))


def induction_model(name_or_path: Any, *, device: Any = None, dtype: Any = None, allow_download: bool = False) -> Any:
    """The model an induction scan of ``name_or_path`` runs: :func:`own_model` where circuitkit runs the checkpoint
    itself, else :func:`load_model`'s bridge."""
    own = own_model(name_or_path, device=device, dtype=dtype)
    return own if own is not None else load_model(name_or_path, device=device, allow_download=allow_download,
                                                  dtype=dtype)


def own_model(name_or_path: Any, *, device: Any = None, dtype: Any = None) -> Any:
    """``name_or_path`` as circuitkit's own model (:func:`load_model` with ``bridge=False``: the same figures without
    importing transformers or TransformerLens) where it runs it: a bundled attention-only model in its own dtype, or
    a local Llama / Qwen2 / Mistral directory; else None."""
    from circuitkit import zoo

    if _bundled(name_or_path):
        entry = zoo.info(name_or_path or zoo.DEFAULT)
        if entry.format == "tl-native" and dtype is None or entry.format.startswith("hf-") and _decoder_runs(
                entry.path):
            return load_model(name_or_path, device=device, dtype=dtype, bridge=False)
    elif isinstance(name_or_path, (str, os.PathLike)) and _decoder_runs(Path(name_or_path)):
        return load_model(name_or_path, device=device, dtype=dtype, bridge=False)
    return None


def _decoder_runs(path: Path) -> bool:
    """Whether ``path`` is a directory circuitkit's decoder runs (a fault in reading it: False, so that
    :func:`load_model` reports it as it reports every directory)."""
    from circuitkit.models.decoder_files import decoder_refusal

    try:
        return guarded.is_dir(path.expanduser()) and decoder_refusal(path.expanduser()) is None
    except CircuitkitError:
        return False


def _load(name_or_path: str | os.PathLike | None, sharding: Sharding, allow_download: bool) -> Any:
    """:func:`load_model` once its arguments are checked."""
    from circuitkit import zoo

    if name_or_path is None or (isinstance(name_or_path, str) and name_or_path in zoo.available()
                                and not _local_model_directory(name_or_path)):
        return _load_zoo(zoo, name_or_path or zoo.DEFAULT, sharding)
    if not isinstance(name_or_path, (str, os.PathLike)) or not str(name_or_path).strip():
        raise validate.fail("load_model: name_or_path", name_or_path,
                            "a zoo name, a local Hugging Face directory or a model name")
    path = Path(name_or_path).expanduser()
    guarded.check_path_length(path, "load_model: name_or_path")
    if is_gguf(path) and guarded.exists(path) and not guarded.is_dir(path):
        if sharding.sharded:
            raise validate.fail("load_model: device_map", sharding.device_map or sharding.n_devices,
                                "None for a GGUF file (it is dequantized on the CPU; pass device= to move it)")
        from circuitkit.models.gguf import load_gguf

        return load_gguf(path, device=sharding.device)
    if guarded.is_dir(path):
        checked = inspect_directory(path)
        return _boot(str(path), checked, sharding, allow_download=False)
    if guarded.exists(path):
        raise validate.fail("load_model: name_or_path", str(name_or_path),
                            "a directory holding config.json and the weights, not a file")
    return _load_hub_name(str(name_or_path), sharding, allow_download, zoo.available())


def _local_model_directory(name: str) -> bool:
    """Whether the zoo name ``name`` is also a model directory here (it holds a config.json): the path wins, and
    a warning says so (``circuitkit.zoo.load(name)`` loads the bundled one)."""
    if not guarded.exists(Path(name) / "config.json"):
        return False
    import warnings

    warnings.warn(f"load_model: {name!r} is both a bundled model and the model directory {str(Path(name).resolve())!r}"
                  f" here; loading the directory (circuitkit.zoo.load({name!r}) loads the bundled one).", stacklevel=3)
    return True


def _load_zoo(zoo, name: str, sharding: Sharding):
    if sharding.sharded:
        raise validate.fail("load_model: device_map", sharding.device_map or sharding.n_devices,
                            f"None for the bundled model {name!r}, which is a few kB and fits any device")
    entry = zoo.info(name)
    if entry.format.startswith("hf-"):
        return load_hf_directory(entry.path, device=sharding.device)
    return zoo.load(name, device=sharding.device)


def _load_hub_name(name: str, sharding: Sharding, allow_download: bool, zoo_names: list[str]):
    expected = (
        f"a zoo name ({', '.join(zoo_names)}), a local Hugging Face directory, or a model name in the local "
        "Hugging Face cache"
    )
    repo = _hub_repo_id(name)
    if repo is None:
        raise _error("given", f"{name!r}: no such directory or file, and not a zoo model or hub name", expected)
    snapshot = _cached_snapshot(repo)
    if snapshot is None and allow_download:
        snapshot = _download(repo)
    if snapshot is None:
        raise _error("given", f"{name!r}: no such directory or file, no zoo model of that name, and no model "
                     "of that name in the local Hugging Face cache", expected,
                     "Pass allow_download=True (circuitkit scan --allow-download) to fetch it from the hub, "
                     "which needs the network.")
    checked = inspect_directory(snapshot)
    # Everything is in the cache now: load it with the hub offline even when downloads were allowed.
    return _boot(repo, checked, sharding, allow_download=False)


def _hub_repo_id(name: str) -> str | None:
    """The Hugging Face repository a TransformerLens alias (``"gpt2-small"``) or repository name refers to."""
    try:
        from transformer_lens.supported_models import get_official_model_name

        return get_official_model_name(name)
    except Exception:  # not a TransformerLens alias: a plain repository id, if it looks like one
        return name if name and not name.startswith(("/", ".", "~")) else None


def _cached_snapshot(repo: str) -> Path | None:
    """The local snapshot directory of ``repo`` (its ``main`` revision) if it holds a config.json, else None."""
    try:
        check_hub_name(repo, "main", "load_model")
    except CircuitkitError:  # not a hub repository id: nothing of it can be cached
        return None
    snapshot = cached_revision(repo, "main", "load_model")
    if snapshot is None or not guarded.exists(snapshot / "config.json"):
        return None
    return snapshot


# ------------------------------------------------------------------------------- hub names, revisions, cache refs
MAX_REPO_PART = 96
"""The hub's limit on an organisation or repository name."""
MAX_REVISION = 255
"""A branch or tag name (git allows longer, the hub's and file systems' limits are about this)."""
REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(?:/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
REVISION = re.compile(r"^[A-Za-z0-9._][A-Za-z0-9._/+=-]*$")
COMMIT = re.compile(r"^[0-9a-f]{40}$")
MAX_REF_BYTES = 1024
"""A ``refs/<revision>`` file holds a 40-character commit hash."""


def check_hub_name(repo: Any, revision: Any, where: str) -> tuple[str, str]:
    """``repo`` (``org/name``) and ``revision`` checked for length and form before any file-system call: the hub's
    characters, at most :data:`MAX_REPO_PART` per part and :data:`MAX_REVISION` in a revision, no control
    characters, no ``..`` (a revision names ``refs/<revision>`` inside the cache)."""
    shown = _shown(f"{repo}@{revision}")
    if not isinstance(repo, str) or not REPO_ID.match(repo) or ".." in repo:
        raise validate.fail(where, validate.given(shown),
                            "'org/name@revision' with a hub repository name of letters, digits, '.', '_' and '-'")
    longest = max(len(part) for part in repo.split("/"))
    if longest > MAX_REPO_PART:
        raise validate.fail(where, validate.given(f"{shown}, a repository name part of {longest} characters"),
                            f"at most {MAX_REPO_PART} characters per part (the hub's limit)")
    if not isinstance(revision, str) or len(revision) > MAX_REVISION:
        size = len(revision) if isinstance(revision, str) else 0
        raise validate.fail(where, validate.given(f"{shown}, a revision of {size} characters"),
                            f"a revision of 1 to {MAX_REVISION} characters")
    if not REVISION.match(revision) or ".." in revision.split("/") or revision.endswith("/"):
        raise validate.fail(where, validate.given(shown),
                            "a revision (branch, tag or commit) of letters, digits and '._/+=-', without control "
                            "characters, spaces or '..'")
    return repo, revision


def _shown(text: str) -> str:
    """``text`` as one short line (control characters escaped, long text elided)."""
    text = repr(text)[1:-1]
    return text if len(text) <= 80 else text[:38] + "..." + text[-38:]


def _repo_cache(repo: str) -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE).expanduser() / f"models--{repo.replace('/', '--')}"


def cached_revision(repo: str, revision: str, where: str) -> Path | None:
    """The cached snapshot directory of ``repo`` at ``revision`` (a branch, tag or commit), or None if it is not in
    the local Hugging Face cache. The ``refs/<revision>`` file is read as data (a regular file, size-capped,
    through :mod:`circuitkit.models.files`) that must be a commit hash naming a directory under the repository's
    ``snapshots/``: a ref pointing elsewhere (``../../other``) or a snapshot that leaves the cache is refused."""
    repo, revision = check_hub_name(repo, revision, where)
    root = _repo_cache(repo)
    if COMMIT.match(revision):
        commit = revision
    else:
        ref = root / "refs" / revision
        if not guarded.exists(ref):
            return None
        text = guarded.read_text(ref, root, max_bytes=MAX_REF_BYTES).strip()
        if not COMMIT.match(text):
            raise CircuitkitError(
                f"{where}: the local Hugging Face cache's ref {str(ref)!r} holds {_shown(text)}; expected a "
                "40-character commit hash. The cache entry is damaged: remove it and fetch the revision again."
            )
        commit = text
    snapshot = root / "snapshots" / commit
    if not guarded.is_dir(snapshot):
        return None
    return inside_cache(repo, snapshot, where)


def inside_cache(repo: str, snapshot: str | os.PathLike, where: str) -> Path:
    """``snapshot`` checked to be a directory under ``repo``'s ``snapshots/`` in the cache, links resolved."""
    snapshots = (_repo_cache(repo) / "snapshots").resolve()
    resolved = Path(snapshot).resolve()
    if resolved.parent != snapshots or not COMMIT.match(resolved.name):
        raise CircuitkitError(
            f"{where}: the local Hugging Face cache names {_shown(str(snapshot))} for {repo}, which resolves to "
            f"{_shown(str(resolved))}; expected a snapshot directory inside {_shown(str(snapshots))}. The cache "
            "entry is damaged or points elsewhere: remove it and fetch the model again."
        )
    return Path(snapshot)


def _download(repo: str) -> Path:
    from huggingface_hub import snapshot_download

    try:
        return inside_cache(repo, snapshot_download(repo, allow_patterns=list(DOWNLOAD_PATTERNS)), "load_model")
    except CircuitkitError:
        raise
    except Exception as error:  # network, missing or gated repository
        detail = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
        raise _error("could not download", f"{repo!r} ({type(error).__name__}: {detail})",
                     "a public repository on the Hugging Face hub and a network connection") from None


def _in_local_cache(repo: str) -> bool:
    """Whether ``repo``'s ``main`` revision, with its config.json, is in the local Hugging Face cache (no network
    access; refs read as data, :func:`cached_revision`)."""
    return _cached_snapshot(repo) is not None
