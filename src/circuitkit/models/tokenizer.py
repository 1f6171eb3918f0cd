"""Tokenizers for models that ship without one, and offline loading of those that do.

Why a module of its own: both the bundled zoo (:mod:`circuitkit.zoo`) and the model loader
(:mod:`circuitkit.models.loading`) need tokenizers; the loader also loads zoo models. Keeping the tokenizer
helpers here lets ``zoo`` import them without importing the loader (no import cycle).

The generated tokenizer is word-level over ids ``0 .. d_vocab - 1``: ``"<bos>"`` is the model's own BOS id where
its config names one (else id 0; also EOS, UNK and PAD, and prepended to every text), every other id ``i`` is the
word ``"t{i}"``, words split on whitespace. The BOS id matters: many families keep a zero embedding row for their
padding id (Gemma's is 0), and a sequence starting from a zero residual stream is not one the model was made for.
That is all TransformerLens needs to build its bridge and run tools that take strings.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path
from typing import Any

from circuitkit import validate

BOS_TOKEN = "<bos>"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
"""Any one of these in a directory means it holds a tokenizer of its own."""

__all__ = ["BOS_TOKEN", "TOKENIZER_FILES", "config_bos", "default_tokenizer", "has_tokenizer", "load_tokenizer",
           "vocabulary_size", "word_tokenizer", "word_tokenizer_files"]


def word_tokenizer_files(d_vocab: int, directory: str | Path, bos_id: int = 0) -> Path:
    """Write a word-level tokenizer for ids ``0 .. d_vocab - 1`` into ``directory`` (BOS ``"<bos>"`` = ``bos_id``,
    prepended by default; every other id ``i`` is the word ``"t{i}"``). Returns the directory."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    d_vocab = validate.integer("word_tokenizer_files: d_vocab", d_vocab, minimum=2, why="BOS and one word")
    bos_id = validate.integer("word_tokenizer_files: bos_id", bos_id, minimum=0, maximum=d_vocab - 1)
    vocab = {BOS_TOKEN: bos_id, **{f"t{i}": i for i in range(d_vocab) if i != bos_id}}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=BOS_TOKEN))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A", pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B", special_tokens=[(BOS_TOKEN, bos_id)]
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


def has_tokenizer(directory: str | Path) -> bool:
    """Whether ``directory`` holds tokenizer files of its own (see :data:`TOKENIZER_FILES`)."""
    from circuitkit.models.files import exists

    return any(exists(Path(directory) / name) for name in TOKENIZER_FILES)


def load_tokenizer(directory: str | Path):
    """A tokenizer saved with ``save_pretrained`` in ``directory``: read from the directory only (no hub
    access), never running code shipped with it (``trust_remote_code=False``).

    Every file the tokenizer may read is checked first by :func:`circuitkit.models.files.check_tokenizer_files`
    (regular, inside the directory, size-capped, UTF-8 JSON of bounded depth); whatever Hugging Face still
    refuses (a ``tokenizer.json`` of the wrong structure, an unknown ``tokenizer_class``) is one
    :class:`~circuitkit.CircuitkitError` line naming the directory."""
    from transformers import AutoTokenizer

    from circuitkit.errors import CircuitkitError
    from circuitkit.models.files import check_tokenizer_files

    check_tokenizer_files(directory)
    try:
        return AutoTokenizer.from_pretrained(str(directory), local_files_only=True, trust_remote_code=False)
    except CircuitkitError:
        raise
    except Exception as error:  # malformed structure, unknown tokenizer_class, a BPE model that does not build
        lines = str(error).strip().splitlines()
        detail = f"{type(error).__name__}: {lines[0][:200]}" if lines else type(error).__name__
        raise CircuitkitError(
            f"load_model: given tokenizer files in {str(directory)!r} that Hugging Face cannot load ({detail}); "
            "expected the tokenizer files written by tokenizer.save_pretrained(...). Remove them to get a "
            "generated word-level tokenizer instead."
        ) from None


@functools.lru_cache(maxsize=8)
def word_tokenizer(d_vocab: int, bos_id: int = 0):
    """A generated word-level tokenizer (see :func:`word_tokenizer_files`), built once per process. Its files stay
    in a temporary directory while the process runs (the tokenizer's ``name_or_path``, which
    :func:`default_tokenizer` reads again) and are removed at its exit."""
    import atexit
    import shutil

    directory = Path(tempfile.mkdtemp(prefix="circuitkit-tokenizer-"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    return load_tokenizer(word_tokenizer_files(d_vocab, directory, bos_id))


def config_bos(config: dict, d_vocab: int) -> int:
    """The BOS id a model's ``config.json`` names (``bos_token_id``, an int inside the vocabulary), else 0."""
    bos = config.get("bos_token_id")
    return bos if isinstance(bos, int) and not isinstance(bos, bool) and 0 <= bos < d_vocab else 0


def vocabulary_size(tokenizer: Any) -> int | None:
    """How many tokens ``tokenizer`` has, its special tokens counted (``len``, else ``vocab_size``), or None where it
    says neither: what an error about words it does not write names."""
    try:
        size = len(tokenizer)
    except TypeError:  # a tokenizer without a length
        size = getattr(tokenizer, "vocab_size", None)
    return size if isinstance(size, int) else None


def default_tokenizer(tokenizer: Any) -> Any:
    """The tokenizer as its own files define it by default: what ``AutoTokenizer.from_pretrained(directory)`` gives.

    Why: TransformerLens's bridge replaces the tokenizer it is given by one reloaded with ``add_bos_token=True``, so
    ``bridge.tokenizer(text)`` prepends a BOS even where the model's tokenizer adds none (Qwen2, GPT-2: their BOS is
    an end-of-text or chat marker). Where the tokenizer was read from a local directory (``name_or_path``), that
    directory's tokenizer is loaded again as :func:`load_tokenizer` does (local files only, no remote code; once per
    directory); a hub name (a bridge booted with ``boot_transformers("gpt2")``) is read from its snapshot in the
    local Hugging Face cache (never the network); a tokenizer built in memory has no files to go back to and is its
    own default."""
    import os

    path = getattr(tokenizer, "name_or_path", None)
    if not isinstance(path, str) or not path:
        return tokenizer
    if not os.path.isdir(path):
        path = _cached_tokenizer_dir(path) or ""
    if path and os.path.isdir(path) and has_tokenizer(path):
        return _default_from(os.path.realpath(path))
    return tokenizer


def _cached_tokenizer_dir(name: str) -> str | None:
    """The local cache snapshot holding ``name``'s tokenizer files (its ``main`` revision), or None."""
    try:
        from huggingface_hub import try_to_load_from_cache

        for filename in TOKENIZER_FILES:
            found = try_to_load_from_cache(name, filename)
            if isinstance(found, str):
                return str(Path(found).parent)
    except Exception:  # noqa: BLE001 - not a repository id, or no cache: no files to go back to
        return None
    return None


@functools.lru_cache(maxsize=8)
def _default_from(directory: str) -> Any:
    return load_tokenizer(directory)
