"""What a MODEL argument names, decided without importing torch.

Why: ``circuitkit scan smol-randm`` must answer a typo in well under a second, before torch, transformers and
TransformerLens load (several seconds). :func:`check_model_name` reads only the file system, the bundled zoo's
names and the local Hugging Face cache's folder names; it refuses what cannot be loaded and lets everything else
through to :func:`circuitkit.models.loading.load_model`, which has the last word.
"""

from __future__ import annotations

import os
from pathlib import Path

from circuitkit.errors import CircuitkitError

GGUF_SUFFIX = ".gguf"


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
    if name in names or os.path.lexists(path):
        return
    absolute = Path(os.path.abspath(path))
    where_looked = str(absolute)
    if looks_like_path(name):
        parent = next((p for p in absolute.parents if p.is_dir()), None)
        hint = "" if parent is None or parent == absolute.parent else f" ({str(parent)!r} is the closest that exists)"
        raise CircuitkitError(f"{where}: no such directory or file: {where_looked!r}{hint}; expected a local Hugging "
                              "Face directory (config.json and weights) or a .gguf file.")
    if allow_download:
        return
    cached = _cached_repos(hub_cache_dir())
    repo_folder = "models--" + name.replace("/", "--")
    if repo_folder in cached or (cached and "/" not in name):  # an alias (gpt2-small -> gpt2): loading decides
        return
    raise CircuitkitError(
        f"{where}: given {name!r}: no such directory or file here ({where_looked!r}), no bundled model of that name "
        f"({', '.join(names)}), and no model of that name in the local Hugging Face cache; expected a local Hugging "
        "Face directory, a .gguf file, a bundled name or a cached hub name. Check the spelling, or pass "
        "--allow-download to fetch it from the hub."
    )
