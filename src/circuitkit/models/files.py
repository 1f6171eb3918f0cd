"""One guarded reader for every file of a model directory.

Why: a model directory is input like any other argument. Its files may be FIFOs (``open()`` blocks for ever),
devices (``/dev/zero`` reads for ever), sockets, symlinks pointing anywhere on the machine, hundreds of MB of junk,
JSON nested deep enough to exhaust Python's recursion limit, or bytes that are not UTF-8. Every file circuitkit or
Hugging Face reads from a model directory is checked here first:

- **regular files only**: ``os.stat`` (which never opens, so never blocks) before any ``open``; the open itself
  uses ``O_NONBLOCK`` and checks the descriptor again (``fstat``), in case the file was swapped in between;
- **symlinks resolved and kept inside** the directory (or, for a Hugging Face hub snapshot, inside its cache
  folder, where the blobs live), like a shard index's ``weight_map``; anything else is refused with a line
  saying where the link points;
- **size-capped before parsing** (:data:`MAX_JSON_BYTES`, :data:`MAX_TOKENIZER_BYTES`);
- **JSON depth-limited** (:data:`MAX_JSON_DEPTH`) and decoded as strict UTF-8, each fault one
  :class:`~circuitkit.CircuitkitError` line naming the file.

Path names are checked too: a name longer than the file system allows (``NAME_MAX`` per component,
``PATH_MAX`` in all) is one line instead of ``OSError: [Errno 36]``.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from circuitkit.errors import CircuitkitError

MAX_JSON_BYTES = 64 * 2**20
"""config.json, generation_config.json, tokenizer_config.json, the shard index: kB to a few MB in practice
(the index of a 400B-parameter model is about 2 MB)."""
MAX_TOKENIZER_BYTES = 128 * 2**20
"""tokenizer.json / vocab.json / merges.txt / tokenizer.model: the largest real ones are about 35 MB (Gemma)."""
MAX_JSON_DEPTH = 100
"""Real configs and tokenizers nest fewer than 10 levels; Python's json parser recurses once per level."""
NAME_MAX = 255
"""Bytes per path component on Linux/macOS file systems (used when ``os.pathconf`` cannot say)."""
PATH_MAX = 4096
"""Bytes in a whole path on Linux (used when ``os.pathconf`` cannot say)."""

TOKENIZER_READS = (
    "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "tokenizer.model",
    "special_tokens_map.json", "added_tokens.json", "vocab.txt", "spiece.model", "chat_template.jinja",
)
"""The files a Hugging Face tokenizer may read from a directory; each is checked before the tokenizer loads."""

__all__ = [
    "MAX_JSON_BYTES", "MAX_JSON_DEPTH", "MAX_TOKENIZER_BYTES", "MODEL_FILE", "FileKind", "check_directory",
    "check_path_length",
    "check_tokenizer_files",
    "checked_file", "exists",
    "is_dir", "read_bytes", "read_json", "read_text",
]


@dataclass(frozen=True)
class FileKind:
    """How errors name a file the guarded reader reads: ``label`` (``"model file"``), the ``folder`` it belongs in
    and the ``writer`` that writes such files (named in the fixes)."""

    label: str
    folder: str
    writer: str


MODEL_FILE = FileKind("model file", "model directory", "save_pretrained(...)")


def _error(path: Path | str, kind: FileKind, problem: str, expected: str, fix: str = "") -> CircuitkitError:
    text = f"{kind.label} {str(path)!r} {problem}; expected {expected}."
    return CircuitkitError(f"{text} {fix}" if fix else text)


def _limits(path: str) -> tuple[int, int]:
    """``(NAME_MAX, PATH_MAX)`` for the file system of the nearest existing ancestor of ``path``."""
    probe = os.path.dirname(os.path.abspath(path)) or "/"
    name_max, path_max = NAME_MAX, PATH_MAX
    for _ in range(64):
        try:
            name_max = os.pathconf(probe, "PC_NAME_MAX")
            path_max = os.pathconf(probe, "PC_PATH_MAX")
            break
        except (OSError, ValueError, AttributeError):
            parent = os.path.dirname(probe)
            if parent == probe:
                break
            probe = parent
    return name_max, path_max


def check_path_length(path: str | os.PathLike, where: str) -> None:
    """Raise one :class:`CircuitkitError` line if ``path`` has a component longer than ``NAME_MAX`` bytes or is
    longer than ``PATH_MAX`` bytes in all (the OS would answer ``Errno 36: File name too long``)."""
    text = os.fspath(path)
    if isinstance(text, bytes):
        return
    encoded = os.fsencode(text)
    name_max, path_max = _limits(text)
    longest = max((len(part) for part in encoded.split(b"/")), default=0)
    total = len(os.fsencode(os.path.abspath(text)))
    if longest > name_max:
        raise CircuitkitError(
            f"{where}: given a path with a name of {longest} bytes ({_short(text)}); expected names of at most "
            f"{name_max} bytes, the limit of this file system. Use a shorter name."
        )
    if total >= path_max:
        raise CircuitkitError(
            f"{where}: given a path of {total} bytes ({_short(text)}); expected at most {path_max - 1} bytes, the "
            "limit of this system. Use a shorter path."
        )


def _short(text: str) -> str:
    return repr(text if len(text) <= 60 else text[:28] + "..." + text[-28:])


def _stat(path: Path, follow: bool = True) -> os.stat_result | None:
    """``os.stat`` (never opens the file, so never blocks) or None if nothing is there; a too-long name is one
    line, not ``Errno 36``."""
    try:
        return os.stat(path) if follow else os.lstat(path)
    except FileNotFoundError:
        return None
    except ValueError:  # a NUL character: no file can have that name
        raise _error(path, MODEL_FILE, "holds a NUL character", "a path without one") from None
    except OSError as error:
        if error.errno == errno.ENAMETOOLONG:
            check_path_length(path, "model path")
        if error.errno in (errno.ENOTDIR, errno.ELOOP, errno.ENAMETOOLONG):
            return None
        raise _error(path, MODEL_FILE, f"cannot be inspected ({error.strerror or error})", "a readable file") from None


def exists(path: str | os.PathLike) -> bool:
    """Whether anything is at ``path`` (a dangling symlink counts as absent); never ``Errno 36``."""
    return _stat(Path(path)) is not None


def is_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a directory; never ``Errno 36``."""
    found = _stat(Path(path))
    return found is not None and stat.S_ISDIR(found.st_mode)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _root(directory: Path) -> Path:
    """Where the files of ``directory`` may live: the directory itself, or for a Hugging Face hub snapshot
    (``.../models--org--name/snapshots/<rev>``, whose files are links to ``../../blobs``) the repository's cache
    folder."""
    resolved = directory.resolve()
    if resolved.parent.name == "snapshots" and resolved.parent.parent.name.startswith(("models--", "datasets--")):
        return resolved.parent.parent
    return resolved


def checked_file(path: str | os.PathLike, directory: str | os.PathLike | None = None, *,
                 max_bytes: int | None = None, kind: FileKind = MODEL_FILE) -> Path:
    """``path`` checked without opening it: it exists, is (or links to) a regular file, stays inside
    ``directory`` (its own folder when None) once symlinks are resolved, and holds at most ``max_bytes``.
    Returns the path as given; every fault is one :class:`CircuitkitError` line."""
    path = Path(path)
    check_path_length(path, "model file")
    directory = Path(directory) if directory is not None else path.parent
    link = _stat(path, follow=False)
    if link is None:
        raise _error(path, kind, "does not exist", f"the file in the {kind.folder}")
    try:
        target = path.resolve(strict=True)
    except (OSError, RuntimeError):
        raise _error(path, kind, f"is a symlink to {os.readlink(path)!r}, which does not exist (or loops)",
                     "a file that exists") from None
    root = _root(directory)
    if not target.is_relative_to(root):
        what = f"is a symlink to {str(target)!r}" if stat.S_ISLNK(link.st_mode) else f"resolves to {str(target)!r}"
        raise _error(path, kind, f"{what}, outside {str(root)!r}", f"files inside the {kind.folder}",
                     "Copy the file into the directory if you mean to use it.")
    found = _stat(path)
    if found is None:
        raise _error(path, kind, "does not exist", f"the file in the {kind.folder}")
    if not stat.S_ISREG(found.st_mode):
        raise _error(path, kind, f"is {_kind(found.st_mode)}", "a regular file",
                     f"Reading it could block or never end; replace it by the file {kind.writer} writes.")
    if max_bytes is not None and found.st_size > max_bytes:
        raise _error(path, kind, f"is {found.st_size / 2**20:.1f} MiB", f"at most {max_bytes / 2**20:.0f} MiB for this "
                     "kind of file", f"It is not a file {kind.writer} writes.")
    return path


def read_bytes(path: str | os.PathLike, directory: str | os.PathLike | None = None, *, max_bytes: int,
               kind: FileKind = MODEL_FILE) -> bytes:
    """The bytes of ``path``, checked by :func:`checked_file`, read through a non-blocking descriptor that is
    checked again (``fstat``) after the open."""
    path = checked_file(path, directory, max_bytes=max_bytes, kind=kind)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        raise _error(path, kind, f"cannot be opened ({error.strerror or error})", "a readable file") from None
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):
            raise _error(path, kind, f"is {_kind(found.st_mode)}", "a regular file")
        if found.st_size > max_bytes:
            raise _error(path, kind, f"is {found.st_size / 2**20:.1f} MiB", f"at most {max_bytes / 2**20:.0f} MiB")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                raise _error(path, kind, f"grew past {max_bytes / 2**20:.0f} MiB while being read", "a file at rest")
        return b"".join(chunks)
    except OSError as error:
        raise _error(path, kind, f"cannot be read ({error.strerror or error})", "a readable file") from None
    finally:
        os.close(fd)


def read_text(path: str | os.PathLike, directory: str | os.PathLike | None = None, *,
              max_bytes: int = MAX_JSON_BYTES, kind: FileKind = MODEL_FILE) -> str:
    """The text of ``path`` (strict UTF-8), read by :func:`read_bytes`."""
    data = read_bytes(path, directory, max_bytes=max_bytes, kind=kind)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise _error(path, kind, f"is not UTF-8 text (byte {error.start} is {data[error.start:error.start + 1]!r})",
                     f"a UTF-8 text file written by {kind.writer}") from None


class _NonFinite(ValueError):
    pass


def _refuse_constant(token: str) -> Any:
    raise _NonFinite(token)


def _depth(value: Any) -> int:
    """Nesting depth of parsed JSON, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, level + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def read_json(path: str | os.PathLike, directory: str | os.PathLike | None = None, *,
              max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH, kind: FileKind = MODEL_FILE,
              finite: bool = False) -> Any:
    """``path`` parsed as JSON (UTF-8, at most ``max_bytes``, nested at most ``max_depth`` levels); with
    ``finite``, the non-standard tokens ``NaN``, ``Infinity`` and ``-Infinity`` are refused (Python's ``json``
    accepts them by default)."""
    text = read_text(path, directory, max_bytes=max_bytes, kind=kind)
    if not text.strip():
        raise _error(path, kind, "is empty", f"a JSON file written by {kind.writer}")
    try:
        data = json.loads(text, parse_constant=_refuse_constant) if finite else json.loads(text)
    except _NonFinite as error:
        raise _error(path, kind, f"holds the non-finite number {error.args[0]}",
                     "finite numbers only (standard JSON)") from None
    except RecursionError:
        raise _error(path, kind, "is JSON nested too deeply to parse",
                     f"at most {max_depth} levels of nesting") from None
    except json.JSONDecodeError as error:
        raise _error(path, kind, f"is not JSON ({error.msg} at line {error.lineno})",
                     f"a JSON file written by {kind.writer}") from None
    except ValueError:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise _error(path, kind, "holds an integer too long to read",
                     f"a JSON file written by {kind.writer}") from None
    depth = _depth(data)
    if depth > max_depth:
        raise _error(path, kind, f"is JSON nested {depth} levels deep", f"at most {max_depth} levels of nesting")
    return data


READ_SUFFIXES = (".json", ".safetensors", ".txt", ".model", ".jinja", ".tiktoken")
"""Files of a model directory that Hugging Face may open (configs, generation config, weights, tokenizer files)."""


def check_directory(directory: str | os.PathLike) -> None:
    """Every file of ``directory`` that Hugging Face may read (:data:`READ_SUFFIXES`, e.g. a
    ``generation_config.json`` circuitkit never opens itself) checked before anything loads: a regular file inside
    the directory, size-capped unless it holds weights; JSON files parsed (UTF-8, depth-limited)."""
    directory = Path(directory)
    try:
        names = sorted(os.listdir(directory))
    except OSError as error:
        raise _error(directory, MODEL_FILE, f"cannot be listed ({error.strerror or error})",
                     "a readable directory") from None
    for name in names:
        if not name.endswith(READ_SUFFIXES) or name.startswith("."):
            continue
        path = directory / name
        if name.endswith(".safetensors"):
            checked_file(path, directory)
        elif name.endswith(".json") and name not in ("tokenizer.json", "vocab.json"):  # those: check_tokenizer_files
            read_json(path, directory, max_bytes=MAX_TOKENIZER_BYTES)
        else:
            checked_file(path, directory, max_bytes=MAX_TOKENIZER_BYTES)


def check_tokenizer_files(directory: str | os.PathLike) -> None:
    """Every file a tokenizer may read from ``directory`` checked: regular, inside, size-capped; the JSON ones
    parsed (UTF-8, depth-limited), ``tokenizer.json`` and ``vocab.json`` as JSON objects."""
    directory = Path(directory)
    for name in TOKENIZER_READS:
        path = directory / name
        if _stat(path, follow=False) is None:
            continue
        if name.endswith(".json"):
            data = read_json(path, directory, max_bytes=MAX_TOKENIZER_BYTES)
            if not isinstance(data, dict):
                raise _error(path, MODEL_FILE, f"holds a JSON {type(data).__name__}", "a JSON object")
            if name == "tokenizer.json" and not isinstance(data.get("model"), dict):
                raise _error(path, MODEL_FILE, "has no 'model' object",
                             "a tokenizer.json written by a Hugging Face tokenizer")
        elif name in ("merges.txt", "vocab.txt", "chat_template.jinja"):
            read_text(path, directory, max_bytes=MAX_TOKENIZER_BYTES)
        else:
            checked_file(path, directory, max_bytes=MAX_TOKENIZER_BYTES)
