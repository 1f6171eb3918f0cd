"""What a MODEL argument names, decided without importing torch.

Why: ``circuitkit scan smol-randm`` must answer a typo in well under a second, before torch, transformers and
TransformerLens load (several seconds). :func:`check_model_name` reads only the file system, the bundled zoo's
names and the local Hugging Face cache's folder names; it refuses what cannot be loaded and lets everything else
through to :func:`circuitkit.models.loading.load_model`, which has the last word. A refusal names what was probably
meant where it can tell: ``--task pairs.jsonl`` for a task file, the directory for a model's ``config.json``, the
closest existing name for a typo.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

from circuitkit.errors import CircuitkitError

GGUF_SUFFIX = ".gguf"
TASK_SUFFIXES = (".jsonl", ".csv", ".json")
"""What a task file of clean/corrupted pairs ends in (``circuitkit scan --task FILE``)."""
MODEL_FILES = ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
               "tokenizer_config.json")
"""Files of a Hugging Face model directory: given as MODEL, the directory is what was meant."""


def hub_cache_dir() -> Path:
    """The local Hugging Face hub cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``),
    read the way huggingface_hub reads it."""
    from huggingface_hub import constants  # a light module: no torch

    return Path(os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE).expanduser()


def _cached_repos(cache: Path) -> list[str]:
    """The repository folders (``models--org--name``) in the hub cache, or [] if there is none."""
    try:
        return [entry.name for entry in os.scandir(cache) if entry.name.startswith("models--") and entry.is_dir()]
    except OSError:
        return []


def looks_like_path(name: str) -> bool:
    """Whether ``name`` can only be meant as a file-system path: it starts with ``/``, ``.``, ``~``, ends in
    ``.gguf``, or has more than one ``/`` (a hub id is ``org/name``), or its first part is a local directory."""
    if name.startswith(("/", ".", "~")) or name.lower().endswith(GGUF_SUFFIX) or (os.sep != "/" and os.sep in name):
        return True
    parts = name.split("/")
    return len(parts) > 2 or (len(parts) == 2 and Path(parts[0]).is_dir())


def check_model_name(name: str | None, *, allow_download: bool = False, where: str = "MODEL") -> None:
    """Refuse a MODEL argument that cannot name a model, with a one-line :class:`CircuitkitError` that says so
    plainly ("no such directory or file"); return None for anything that may (a bundled name, an existing path,
    a hub name that is cached, a TransformerLens alias while the cache holds any model, anything under
    ``allow_download``)."""
    if name is None:
        return
    from circuitkit import zoo
    from circuitkit.models.files import check_path_length

    names = zoo.available()
    path = Path(name).expanduser()
    check_path_length(path, where)  # a name longer than the file system allows: said as such
    if name in names:
        return
    if os.path.lexists(path):
        _check_existing(name, path, where)
        return
    absolute = Path(os.path.abspath(path))
    where_looked = str(absolute)
    if looks_like_path(name):
        parent = next((p for p in absolute.parents if p.is_dir()), None)
        if parent == absolute.parent:
            hint = _closest(absolute.name, _entries(parent), lambda n: str(parent / n))
        else:
            hint = "" if parent is None else f" ({str(parent)!r} is the closest that exists)"
        raise CircuitkitError(f"{where}: no such directory or file: {where_looked!r}; expected a local Hugging "
                              f"Face directory (config.json and weights) or a .gguf file{hint or '.'}")
    if allow_download:
        return
    cached = _cached_repos(hub_cache_dir())
    repo_folder = "models--" + name.replace("/", "--")
    if repo_folder in cached or (cached and "/" not in name):  # an alias (gpt2-small -> gpt2): loading decides
        return
    known = [*names, *(folder[len("models--"):].replace("--", "/") for folder in cached), *_entries(Path("."))]
    raise CircuitkitError(
        f"{where}: given {name!r}: no such directory or file here ({where_looked!r}), no bundled model of that name "
        f"({', '.join(names)}), and no model of that name in the local Hugging Face cache; expected a local Hugging "
        "Face directory, a .gguf file, a bundled name or a cached hub name. Check the spelling, or pass "
        f"--allow-download to fetch it from the hub{_closest(name, known, str) or '.'}"
    )


def _check_existing(name: str, path: Path, where: str) -> None:
    """An existing MODEL path: a directory or a .gguf file passes (loading checks the rest); a file that is part of
    a model directory, or a task file, is answered with what was probably meant."""
    if path.is_dir() or not path.exists() or name.lower().endswith(GGUF_SUFFIX):  # a dangling link: loading says
        return
    if path.name in MODEL_FILES or path.suffix == ".safetensors":
        folder = str(path.parent) if str(path.parent) != "." else "."
        raise CircuitkitError(f"{where}: given {name!r}, a file of a model directory; expected the directory "
                              f"itself: did you mean {folder}?")
    if path.suffix.lower() in TASK_SUFFIXES:
        raise CircuitkitError(f"{where}: given {name!r}, a file; expected a model (a local Hugging Face directory or "
                              f"a .gguf file). {name!r} looks like a task file: did you mean --task {name}?")
    raise CircuitkitError(f"{where}: given {name!r}, a file; expected a local Hugging Face directory (config.json "
                          "and weights) or a .gguf file.")


def _entries(folder: Path) -> list[str]:
    """Names in ``folder`` (at most 1000), or [] if it cannot be read."""
    try:
        with os.scandir(folder) as entries:
            return [entry.name for entry in itertools.islice(entries, 1000)]
    except OSError:
        return []


def _closest(name: str, choices: list[str], shown) -> str:
    """``"; did you mean X?"`` for the choice closest to ``name`` (difflib, similarity >= 0.6), else ``""``."""
    import difflib

    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    return f"; did you mean {shown(close[0])}?" if close else ""
