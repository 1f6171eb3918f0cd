"""Reading a model directory's own files, checked before anything loads them: ``config.json`` (guarded JSON, no
custom code), the safetensors files (an index's shards present, pickles refused) and their headers' shapes.

Shared by :mod:`circuitkit.models.loading` (the bridge) and :mod:`circuitkit.models.decoder_files` (circuitkit's
own decoder); every fault is one :class:`CircuitkitError` line starting ``load_model:``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from circuitkit.errors import CircuitkitError
from circuitkit.models import files as guarded

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
SAFETENSORS_INDEX = "model.safetensors.index.json"


def _error(what: str, given: str, expected: str, fix: str = "") -> CircuitkitError:
    text = f"load_model: {what} {given}; expected {expected}."
    return CircuitkitError(f"{text} {fix}" if fix else text)


def read_config(path: Path, what: str) -> dict[str, Any]:
    """A JSON object file of the directory (``config.json``, an index), read as :mod:`~circuitkit.models.files`
    guards it."""
    try:  # regular file inside the directory, size-capped, UTF-8, depth-limited (circuitkit.models.files)
        data = guarded.read_json(path, path.parent)
    except CircuitkitError as error:
        raise CircuitkitError(f"load_model: {what}: {error}") from None
    if not isinstance(data, dict):
        raise _error(what, f"{str(path)!r} holding a JSON {type(data).__name__}", "a JSON object")
    return data


def refuse_custom_code(path: Path, config: dict[str, Any]) -> None:
    """Refuse a model whose ``config.json`` or ``tokenizer_config.json`` names code of its own (``auto_map``)."""
    sources = {"config.json": config}
    tokenizer_config = path / "tokenizer_config.json"
    if guarded.exists(tokenizer_config):
        sources["tokenizer_config.json"] = read_config(tokenizer_config, "given tokenizer config")
    for name, data in sources.items():
        if data.get("auto_map"):
            raise _error("given model", f"{str(path)!r} whose {name} has an auto_map",
                         "a model that the installed transformers implements; this one needs custom code "
                         "shipped with the model, which circuitkit will not run (trust_remote_code stays False)")


def weight_files(path: Path) -> tuple[Path, ...]:
    """The directory's safetensors files (an index's shards, each present), checked; pickle-only weights refused."""
    index = path / SAFETENSORS_INDEX
    if guarded.exists(index):
        weight_map = read_config(index, "given safetensors index").get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise _error("given safetensors index", f"{str(index)!r} with no weight_map",
                         "the index written by save_pretrained(...)")
        names = sorted(set(map(str, weight_map.values())))
        missing = [name for name in names if not guarded.exists(path / name)]
        if missing:
            raise _error("given directory", f"{str(path)!r} missing {missing[:3]} named in {SAFETENSORS_INDEX}",
                         "every weight shard the index names")
        return tuple(guarded.checked_file(path / name, path) for name in names)
    files = tuple(sorted(path.glob("*.safetensors")))
    if files:
        return tuple(guarded.checked_file(file, path) for file in files)
    pickles = sorted(p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise _error("given directory", f"{str(path)!r} whose only weights are pickle files {pickles[:3]}",
                     "safetensors weights (model.safetensors); loading a pickle can run arbitrary code",
                     "Convert once, where you trust the file: save_pretrained(..., safe_serialization=True).")
    raise _error("given directory", f"{str(path)!r} with no weights file",
                 "model.safetensors (or sharded *.safetensors with model.safetensors.index.json)")


def read_shapes(files: tuple[Path, ...]) -> dict[str, tuple[int, ...]]:
    """Every stored tensor's shape, from the safetensors headers (a truncated or garbage file refused)."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as handle:
                for key in handle.keys():
                    shapes[key] = tuple(handle.get_slice(key).get_shape())
        except Exception as error:  # SafetensorError (Rust), OSError: truncated, garbage, unreadable
            detail = str(error).strip().splitlines()[0][:160] if str(error).strip() else type(error).__name__
            raise _error("given weights", f"{str(file)!r}, which is not a complete safetensors file ({detail})",
                         "a safetensors file written in full by save_pretrained(...)") from None
    return shapes


__all__ = ["PICKLE_SUFFIXES", "SAFETENSORS_INDEX", "read_config", "read_shapes", "refuse_custom_code",
           "weight_files"]
