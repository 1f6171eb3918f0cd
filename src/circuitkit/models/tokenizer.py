"""Tokenizers for models that ship without one, and offline loading of those that do.

Why a module of its own: both the bundled zoo (:mod:`circuitkit.zoo`) and the model loader
(:mod:`circuitkit.models.loading`) need tokenizers; the loader also loads zoo models. Keeping the tokenizer
helpers here lets ``zoo`` import them without importing the loader (no import cycle).

The generated tokenizer is word-level over ids ``0 .. d_vocab - 1``: ``"<bos>"`` is id 0 (also EOS, UNK and
PAD, and prepended to every text), every other id ``i`` is the word ``"t{i}"``, words split on whitespace.
That is all TransformerLens needs to build its bridge and run tools that take strings.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

from circuitkit import validate

BOS_TOKEN = "<bos>"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
"""Any one of these in a directory means it holds a tokenizer of its own."""

__all__ = ["BOS_TOKEN", "TOKENIZER_FILES", "has_tokenizer", "load_tokenizer", "word_tokenizer", "word_tokenizer_files"]


def word_tokenizer_files(d_vocab: int, directory: str | Path) -> Path:
    """Write a word-level tokenizer for ids ``0 .. d_vocab - 1`` into ``directory`` (BOS ``"<bos>"`` = 0,
    prepended by default; id ``i`` is the word ``"t{i}"``). Returns the directory."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    d_vocab = validate.integer("word_tokenizer_files: d_vocab", d_vocab, minimum=2, why="BOS and one word")
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


def has_tokenizer(directory: str | Path) -> bool:
    """Whether ``directory`` holds tokenizer files of its own (see :data:`TOKENIZER_FILES`)."""
    return any((Path(directory) / name).exists() for name in TOKENIZER_FILES)


def load_tokenizer(directory: str | Path):
    """A tokenizer saved with ``save_pretrained`` in ``directory``: read from the directory only (no hub
    access), never running code shipped with it (``trust_remote_code=False``)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory), local_files_only=True, trust_remote_code=False)


@functools.lru_cache(maxsize=8)
def word_tokenizer(d_vocab: int):
    """A generated word-level tokenizer (see :func:`word_tokenizer_files`), built once per process."""
    directory = Path(tempfile.mkdtemp(prefix="circuitkit-tokenizer-"))
    return load_tokenizer(word_tokenizer_files(d_vocab, directory))
