"""What a checkpoint on disk was when it was measured: a fingerprint kept in its record.

Why: a rerun skips a checkpoint whose record is already in the output directory. If the checkpoint's weights
were replaced since (retrained, re-exported, another model copied over it), the old record describes another
model; nothing in its path or label says so. The fingerprint of a checkpoint directory (a Hugging Face
``save_pretrained`` or zoo-format directory, or the cached snapshot of ``name@revision``):

- ``files``: ``{name: [size in bytes, mtime in ns]}`` of every regular file directly in the directory;
- ``sha256``: a hash of the configuration files (``config.json``, ``tl_config.json``, ``generation_config.json``,
  whole) and of the first and last :data:`SAMPLE_BYTES` of every weight file (the safetensors header names every
  tensor and its offsets; the samples are the first and last tensors' bytes), so a copy that kept the sizes and
  times but not the values still differs.

Reading it costs a directory listing and at most ``2 x SAMPLE_BYTES`` per weight file. A rerun measures a
checkpoint again when its fingerprint differs from its record's (or either has none).
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Any

from circuitkit.errors import CircuitkitError
from circuitkit.models.files import MAX_JSON_BYTES, checked_file, read_bytes

SAMPLE_BYTES = 1 << 20
"""Bytes hashed at each end of a weight file."""
CONFIG_FILES = ("config.json", "tl_config.json", "generation_config.json")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def fingerprint(where: str | None) -> dict[str, Any] | None:
    """The fingerprint of the checkpoint at ``where`` (a directory or ``name@revision`` in the local hub cache),
    or None where there is nothing on disk to fingerprint (an in-memory model, an uncached hub name, a file that
    cannot be read: the loader reports that one)."""
    if where is None:
        return None
    directory = _directory(where)
    if directory is None:
        return None
    try:
        return _of_directory(directory)
    except (CircuitkitError, OSError):
        return None


def _directory(where: str) -> Path | None:
    path = Path(where).expanduser()
    try:
        if path.is_dir():
            return path
    except OSError:
        return None
    if "@" in where and not os.path.lexists(path):
        name, revision = where.rsplit("@", 1)
        from circuitkit.tracking.sources import _revision_snapshot

        try:
            return _revision_snapshot(name, revision, allow_download=False)
        except CircuitkitError:
            return None
    return None


def _of_directory(directory: Path) -> dict[str, Any]:
    files: dict[str, list[int]] = {}
    digest = hashlib.sha256()
    for name in sorted(os.listdir(directory)):
        path = directory / name
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            continue
        files[name] = [info.st_size, info.st_mtime_ns]
        if name in CONFIG_FILES:
            digest.update(name.encode() + b"\0" + read_bytes(path, directory, max_bytes=MAX_JSON_BYTES))
        elif name.endswith(WEIGHT_SUFFIXES):
            digest.update(name.encode() + b"\0" + _ends(checked_file(path, directory), info.st_size))
    return {"files": files, "sha256": digest.hexdigest()}


def _ends(path: Path, size: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CircuitkitError(f"track: {str(path)!r} is not a regular file; expected a weight file.")
        head = os.pread(fd, SAMPLE_BYTES, 0)
        tail = os.pread(fd, SAMPLE_BYTES, max(0, size - SAMPLE_BYTES)) if size > SAMPLE_BYTES else b""
        return head + tail
    finally:
        os.close(fd)


__all__ = ["SAMPLE_BYTES", "fingerprint"]
