"""Which checkpoints a track reads, their training steps and labels, and how each one is loaded.

A checkpoint is given as a model object, a local directory (a Hugging Face ``save_pretrained`` directory, or a
circuitkit zoo-format directory holding ``tl_config.json`` + ``model.safetensors`` as written by
``python -m circuitkit.zoo.train --checkpoints``), a zoo or hub name, or ``"hub-name@revision"`` (a branch of a
hub repository, e.g. ``"EleutherAI/pythia-70m@step1000"``), read from the local Hugging Face cache unless
downloads are allowed. A directory whose subdirectories are named ``step<N>`` or ``checkpoint-<N>`` stands for
all of them.

The training step of each checkpoint is read from its name (the last path component, or the revision):
``step1000``, ``step_1000``, ``checkpoint-1000``, ``global_step1000`` -> 1000; or given explicitly.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from circuitkit import validate
from circuitkit.errors import CircuitkitError

STEP_PATTERN = re.compile(r"(?:step|checkpoint)[-_]?(\d+)$", re.IGNORECASE)
"""A training step at the end of a checkpoint's name."""
MAX_STEP_DIGITS = 18
"""A step read from a name has at most this many digits (it is kept as a JSON integer; Python refuses to parse
numbers of more than 4,300 digits, and no run takes 10**18 steps)."""
CHECKPOINT_DIR_PATTERN = re.compile(r"^(?:global_)?(?:step|checkpoint)[-_]?\d+$", re.IGNORECASE)
"""Subdirectory names that :func:`expand_directory` takes as checkpoints."""
MAX_CHECKPOINTS = 100_000
"""The most checkpoints one track reads (a list, or an iterator read that far: an endless one is refused)."""


@dataclass(frozen=True)
class Source:
    """One checkpoint to measure: ``item`` (a model or what :func:`load` reads), its ``label`` and ``step``;
    ``where`` names it in the records (a path or ``name@revision``; ``None`` for an in-memory model)."""

    item: Any
    label: str
    step: int
    where: str | None


def step_from_name(name: str) -> int | None:
    """The training step at the end of ``name`` (``step1000``, ``checkpoint-1000``), or ``None``."""
    if not isinstance(name, str):
        raise validate.fail("step_from_name: name", name, "a checkpoint name (a string such as 'step1000')")
    match = STEP_PATTERN.search(name.strip().rstrip("/\\"))
    if match is None:
        return None
    digits = match.group(1)
    if len(digits) > MAX_STEP_DIGITS:
        raise validate.fail("track: step", validate.given(f"a step of {len(digits)} digits in {_shown(name)}"),
                            f"a step of at most {MAX_STEP_DIGITS} digits")
    return int(digits)


def _shown(text: str) -> str:
    """``text`` quoted on one line (control characters escaped), long text elided."""
    quoted = repr(text)
    return quoted if len(quoted) <= 82 else quoted[:40] + "..." + quoted[-40:]


def check_name(item: Any, where: str) -> None:
    """A checkpoint's path or hub name checked for form and length before any file-system call: no control
    characters (a newline would break every message that names it), a revision after ``@`` of at most
    :data:`circuitkit.models.loading.MAX_REVISION` characters, no path component longer than the file system
    allows."""
    if not _is_path_like(item):
        return
    text = os.fspath(item)
    if not text.strip() or any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise validate.fail(where, validate.given(_shown(text)),
                            "a checkpoint directory or hub name, not blank and without control characters")
    from circuitkit.models.files import check_path_length
    from circuitkit.models.loading import MAX_REVISION

    revision = text.rsplit("@", 1)[1] if "@" in text else ""
    if len(revision) > MAX_REVISION and "/" not in revision:
        raise validate.fail(where, validate.given(f"{_shown(text)}, a revision of {len(revision)} characters"),
                            f"'name@revision' with a revision of at most {MAX_REVISION} characters")
    step_from_name(_tail(text))
    check_path_length(text, where)


def _tail(text: str) -> str:
    """The part a step is read from, without touching the file system: the revision or the last component."""
    return text.rsplit("@", 1)[1] if "@" in text else (Path(text).name or text)


def _is_path_like(item: Any) -> bool:
    return isinstance(item, (str, os.PathLike)) and not isinstance(os.fspath(item), bytes)


def _name_of(item: Any) -> str:
    """The name a step is read from: the revision of ``name@revision``, else the last path component."""
    text = os.fspath(item)
    if "@" in text and not Path(text).expanduser().exists():
        return text.rsplit("@", 1)[1]
    return Path(text).name or text


def expand_directory(directory: str | os.PathLike) -> list[Path]:
    """The checkpoint subdirectories (``step<N>/``, ``checkpoint-<N>/``) of ``directory``, by step."""
    path = Path(directory).expanduser()
    found = [p for p in path.iterdir() if p.is_dir() and CHECKPOINT_DIR_PATTERN.match(p.name)]
    if not found:
        raise validate.fail(
            "track: checkpoints", str(directory),
            "a directory holding checkpoint subdirectories named step<N>/ or checkpoint-<N>/ (found none)",
            "Pass the checkpoint directories themselves, or write them as DIR/step<N>/.",
        )
    return sorted(found, key=lambda p: step_from_name(p.name) or 0)


def _is_checkpoint_directory(path: Path) -> bool:
    return (path / "config.json").is_file() or (path / "tl_config.json").is_file()


def resolve(checkpoints: Any, steps: Sequence[int] | None, labels: Sequence[str] | None) -> list[Source]:
    """The checkpoints as :class:`Source` s, sorted by step; every error is one :class:`CircuitkitError`."""
    if _is_path_like(checkpoints):
        check_name(checkpoints, "track: checkpoints")
        path = Path(os.fspath(checkpoints)).expanduser()
        if path.is_dir() and not _is_checkpoint_directory(path):
            checkpoints = expand_directory(path)
        else:
            checkpoints = [checkpoints]
    if isinstance(checkpoints, (bytes, dict)):
        raise validate.fail("track: checkpoints", checkpoints, "a list of models, checkpoint directories or hub names")
    items = validate.bounded_list("track: checkpoints", checkpoints, MAX_CHECKPOINTS,
                                  "a list of models, checkpoint directories or hub names",
                                  why="MAX_CHECKPOINTS checkpoints in one track")
    if not items:
        raise validate.fail("track: checkpoints", items, "at least one checkpoint (a model, directory or hub name)")
    steps_given = _given_list("steps", steps, len(items))
    labels_given = _given_list("labels", labels, len(items))
    for index, item in enumerate(items):
        check_name(item, f"track: checkpoints[{index}]")
    sources: list[Source] = []
    for index, item in enumerate(items):
        where = None if not _is_path_like(item) else os.fspath(item)
        if steps_given is not None:
            step = validate.integer(f"track: steps[{index}]", steps_given[index], minimum=0)
        elif where is not None and step_from_name(_name_of(item)) is not None:
            step = step_from_name(_name_of(item))
        else:
            shown = repr(where) if where is not None else f"a {type(item).__name__} object"
            raise CircuitkitError(
                f"track: cannot read the training step of checkpoint {index} ({shown}); expected a name ending in "
                "step<N> or checkpoint-<N> (e.g. 'step1000', 'checkpoint-1000', 'EleutherAI/pythia-70m@step1000'). "
                "Pass steps=[...] (one per checkpoint; --steps on the command line)."
            )
        if labels_given is not None:
            label = labels_given[index]
            if not isinstance(label, str) or not label.strip():
                raise validate.fail(f"track: labels[{index}]", label, "a non-empty string")
        else:
            label = _name_of(item) if where is not None else f"step{step}"
        sources.append(Source(item=item, label=label, step=int(step), where=where))
    _check_unique([s.step for s in sources], "steps", "a different training step for every checkpoint")
    _check_unique([s.label for s in sources], "labels", "a different label for every checkpoint (pass labels=)")
    return sorted(sources, key=lambda s: s.step)


def _given_list(name: str, value: Any, n: int) -> list | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise validate.fail(f"track: {name}", value, f"a list with one entry per checkpoint ({n})")
    if len(value) != n:
        raise validate.fail(f"track: {name}", validate.given(f"{len(value)} entries"),
                            f"one per checkpoint ({n})")
    return list(value)


def _check_unique(values: list, name: str, expected: str) -> None:
    seen, repeated = set(), []
    for value in values:
        if value in seen and value not in repeated:
            repeated.append(value)
        seen.add(value)
    if repeated:
        raise validate.fail(f"track: {name}", validate.given(f"duplicates {repeated}"), expected)


def load(source: Source, *, device: Any = None, allow_download: bool = False) -> Any:
    """The model of ``source`` (in eval mode when it has one)."""
    item = source.item
    if not _is_path_like(item):
        return item
    text = os.fspath(item)
    path = Path(text).expanduser()
    if path.is_dir() and (path / "tl_config.json").is_file() and not (path / "config.json").is_file():
        from circuitkit.zoo import _LOADERS

        model = _LOADERS["tl-native"](path, validate.device("track: device", device))
        model.eval()
        return model
    from circuitkit.models.loading import load_model

    if "@" in text and not path.exists():
        name, revision = text.rsplit("@", 1)
        return load_model(_revision_snapshot(name, revision, allow_download), device=device)
    return load_model(text, device=device, allow_download=allow_download)


def load_checkpoint(checkpoint: str | os.PathLike, *, device: Any = None, allow_download: bool = False) -> Any:
    """One checkpoint loaded as :func:`circuitkit.track` loads it (a zoo-format or Hugging Face directory, a zoo or
    hub name, ``"hub-name@revision"``), e.g. to look at a head's attention before and after the phase change."""
    if not _is_path_like(checkpoint) or not os.fspath(checkpoint).strip():
        raise validate.fail("load_checkpoint: checkpoint", checkpoint,
                            "a checkpoint directory, a zoo or hub name, or 'hub-name@revision'")
    check_name(checkpoint, "load_checkpoint: checkpoint")
    allow_download = validate.boolean("load_checkpoint: allow_download", allow_download)
    where = os.fspath(checkpoint)
    return load(Source(item=checkpoint, label=_name_of(checkpoint), step=0, where=where), device=device,
                allow_download=allow_download)


def _revision_snapshot(name: str, revision: str, allow_download: bool) -> Path:
    """The local snapshot of ``name`` at ``revision`` (a branch such as Pythia's ``step1000``), read with the hub
    offline; fetched first (configs, tokenizer, safetensors only) when ``allow_download``."""
    from huggingface_hub import snapshot_download

    from circuitkit.models.loading import (
        DOWNLOAD_PATTERNS,
        _hub_repo_id,
        cached_revision,
        check_hub_name,
        inside_cache,
    )

    check_hub_name(name, revision, "track: checkpoint")  # before any file-system call
    repo = _hub_repo_id(name)
    if not repo:
        raise validate.fail("track: checkpoint", f"{name}@{revision}", "'hub-name@revision', e.g. "
                            "'EleutherAI/pythia-70m@step1000'")
    snapshot = cached_revision(repo, revision, "track")
    if snapshot is not None:
        return snapshot
    if not allow_download:
        raise CircuitkitError(
            f"track: given {name}@{revision}, which is not in the local Hugging Face cache; expected a cached "
            "revision. Pass allow_download=True (--allow-download) to fetch it, which needs the network."
        )
    try:
        return inside_cache(repo, snapshot_download(repo, revision=revision, allow_patterns=list(DOWNLOAD_PATTERNS)),
                            "track")
    except CircuitkitError:
        raise
    except Exception as error:
        detail = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
        raise CircuitkitError(f"track: could not download {repo}@{revision} ({detail}); expected a public "
                              "repository revision and a network connection.") from None


__all__ = ["Source", "expand_directory", "load", "load_checkpoint", "resolve", "step_from_name"]
