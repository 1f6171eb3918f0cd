"""Load a model to analyse: a bundled zoo model, a local Hugging Face directory, or a TransformerLens name.

Why: circuitkit runs offline. Zoo models ship inside the package; a Hugging Face checkpoint saved with
``save_pretrained`` loads from its directory with no hub access and is wrapped in a TransformerLens
``TransformerBridge`` (``boot_transformers(dir, hf_model=...)``). A directory without tokenizer files gets a
generated word-level tokenizer (``"<bos>"`` is id 0, every other id ``i`` is the word ``"t{i}"``), which is
all that TransformerLens needs to build its bridge and run tools that take strings.
"""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from circuitkit.errors import CircuitkitError

BOS_TOKEN = "<bos>"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def word_tokenizer_files(d_vocab: int, directory: str | Path) -> Path:
    """Write a word-level tokenizer for ids ``0 .. d_vocab - 1`` into ``directory`` (BOS ``"<bos>"`` = 0,
    prepended by default; id ``i`` is the word ``"t{i}"``). Returns the directory."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    if d_vocab < 2:
        raise CircuitkitError(f"word_tokenizer_files: given d_vocab={d_vocab}; expected at least 2 token ids.")
    vocab = {BOS_TOKEN: 0, **{f"t{i}": i for i in range(1, d_vocab)}}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=BOS_TOKEN))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A", pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B", special_tokens=[(BOS_TOKEN, 0)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS_TOKEN,
        eos_token=BOS_TOKEN,
        unk_token=BOS_TOKEN,
        pad_token=BOS_TOKEN,
        add_bos_token=True,
    )
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(directory))
    return directory


def load_tokenizer(directory: str | Path):
    """A tokenizer saved with ``save_pretrained`` in ``directory``, loaded with no hub access."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)


@functools.lru_cache(maxsize=8)
def word_tokenizer(d_vocab: int):
    """A generated word-level tokenizer (see :func:`word_tokenizer_files`), built once per process."""
    directory = Path(tempfile.mkdtemp(prefix="circuitkit-tokenizer-"))
    return load_tokenizer(word_tokenizer_files(d_vocab, directory))


def _has_tokenizer(directory: Path) -> bool:
    return any((directory / name).exists() for name in TOKENIZER_FILES)


def load_hf_directory(directory: str | Path, *, device: str | torch.device | None = None):
    """A Hugging Face causal LM saved in ``directory``, loaded offline and wrapped in a ``TransformerBridge``."""
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoConfig, AutoModelForCausalLM

    directory = Path(directory)
    if not (directory / "config.json").exists():
        raise CircuitkitError(
            f"load_model: given directory {str(directory)!r} with no config.json; expected a Hugging Face model "
            "directory written by save_pretrained(...)."
        )
    config = AutoConfig.from_pretrained(str(directory), local_files_only=True)
    hf_model = AutoModelForCausalLM.from_pretrained(
        str(directory), local_files_only=True, attn_implementation="eager", dtype=torch.float32
    )
    hf_model.eval()
    if _has_tokenizer(directory):
        tokenizer = load_tokenizer(directory)
    else:
        tokenizer = word_tokenizer(int(config.vocab_size))
    device = torch.device(device) if device is not None else torch.device("cpu")
    hf_model.to(device)
    bridge = TransformerBridge.boot_transformers(str(directory), hf_model=hf_model, tokenizer=tokenizer, device=device)
    bridge.eval()
    return bridge


def load_model(
    name_or_path: str | None = None,
    *,
    device: str | torch.device | None = None,
    allow_download: bool = False,
) -> Any:
    """Load a model by zoo name, local directory or TransformerLens / Hugging Face name.

    - ``None`` or a name in :func:`circuitkit.zoo.available`: the bundled model (``None``: ``"induction-2l"``).
    - an existing local directory: a Hugging Face model saved with ``save_pretrained``, loaded offline and
      wrapped with ``TransformerBridge.boot_transformers(dir, hf_model=...)``.
    - anything else: a model name for ``TransformerBridge.boot_transformers(name)``. By default only a copy
      already in the local Hugging Face cache is used and no network connection is made; a name that is not
      cached fails at once with a one-line :class:`CircuitkitError`. ``allow_download=True`` lets the hub be
      asked.
    """
    from circuitkit import zoo

    if name_or_path is None or name_or_path in zoo.available():
        return zoo.load(name_or_path or zoo.DEFAULT, device=device)
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise CircuitkitError(
            f"load_model: given {type(name_or_path).__name__}; expected a zoo name, a directory or a model name."
        )
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return load_hf_directory(path, device=device)
    name = str(name_or_path)
    expected = (
        f"expected a zoo name ({', '.join(zoo.available())}), a local Hugging Face directory, or a model name "
        "in the local Hugging Face cache"
    )
    if not allow_download:
        repo = _hub_repo_id(name)
        if repo is None or not _in_local_cache(repo):
            raise CircuitkitError(
                f"load_model: given {name!r}, which is neither a zoo model, a local directory, nor a model in the "
                f"local Hugging Face cache; {expected}. Pass allow_download=True (circuitkit scan "
                "--allow-download) to fetch it from the hub, which needs the network."
            )
    try:
        from transformer_lens.model_bridge import TransformerBridge

        return TransformerBridge.boot_transformers(name, device=device)
    except Exception as error:  # network, missing repo, unsupported architecture: one line for the user
        detail = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
        raise CircuitkitError(
            f"load_model: could not load {name!r} ({type(error).__name__}: {detail}); {expected} "
            "(or a name on the Hugging Face hub with allow_download=True and a network connection)."
        ) from None


def _hub_repo_id(name: str) -> str | None:
    """The Hugging Face repository a TransformerLens alias (``"gpt2-small"``) or repository name refers to."""
    try:
        from transformer_lens.supported_models import get_official_model_name

        return get_official_model_name(name)
    except Exception:  # not a TransformerLens alias: a plain repository id, if it looks like one
        return name if name and not name.startswith(("/", ".")) else None


def _in_local_cache(repo: str) -> bool:
    """Whether ``repo``'s config.json is in the local Hugging Face cache (no network access)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(repo, "config.json"), str)
    except Exception:  # malformed repository id
        return False
