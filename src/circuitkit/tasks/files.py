"""Task files, read safely: JSON Lines, CSV, EAP-IG's CSV and auto-circuit's JSON prompt files.

Formats (one pair a row or object):

- **JSON Lines** (``.jsonl``): ``{"clean": ..., "corrupted": ..., "answer": ..., "wrong": ...}`` per line;
  ``answer`` / ``wrong`` a string, a token id, or a list of them.
- **CSV** (``.csv``) with the columns ``clean, corrupted, answer, wrong`` (text), or EAP-IG's columns
  ``clean, corrupted, correct_idx, incorrect_idx`` (answers as token ids of the model the file was written for).
- **auto-circuit JSON** (``.json``): ``{"prompts": [{"clean": ..., "corrupt": ..., "answers": [...],
  "wrong_answers": [...]}, ...]}``.

The file goes through the guarded reader (:func:`circuitkit.models.files.read_bytes`: a regular file, at most
:data:`MAX_TASK_BYTES`, strict UTF-8); every fault is one line naming the file and the line (JSON Lines), row (CSV,
counted with the header) or prompt (JSON). Nothing is truncated: a file with more than
:data:`~circuitkit.graph.task.MAX_PAIRS` pairs is refused. JSON Lines are split at ``"\n"`` only (a raw U+2028 is
legal inside a JSON string); a byte-order mark and CRLF line ends are read as the plain file.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any

from circuitkit.errors import CircuitkitError
from circuitkit.graph.task import MAX_PAIRS, Task, as_pair

MAX_TASK_BYTES = 64 * 2**20
"""Largest task file read (64 MiB: about 300,000 IOI rows, past :data:`MAX_PAIRS`)."""
TEXT_COLUMNS = ("clean", "corrupted", "answer", "wrong")
EAP_COLUMNS = ("clean", "corrupted", "correct_idx", "incorrect_idx")


def _fail(path: Any, problem: str, expected: str) -> CircuitkitError:
    return CircuitkitError(f"task file {str(path)!r}: {problem}; expected {expected}.")


def load_task(path: str | os.PathLike, *, name: str | None = None, metric: str = "logit_diff",
              ablation: str = "corrupted") -> Task:
    """The task in the file ``path`` (module docstring); ``name`` defaults to the file's stem."""
    from circuitkit.models.files import FileKind, check_path_length, read_bytes

    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise CircuitkitError(f"load_task: given {type(path).__name__} {path!r}; expected the path of a task file.")
    check_path_length(path, "load_task")
    p = Path(path)
    if not p.exists():
        raise _fail(path, "no such file", "a .jsonl, .csv or .json task file")
    raw = read_bytes(p, max_bytes=MAX_TASK_BYTES, kind=FileKind("task file", "task file's folder", "your own code"))
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise _fail(path, f"is not UTF-8 text (byte {error.start})", "a UTF-8 text file") from None
    suffix = p.suffix.lower()
    if suffix == ".jsonl":
        rows = _jsonl(path, text)
    elif suffix == ".csv":
        rows = _csv(path, text)
    elif suffix == ".json":
        rows = _auto_circuit(path, text)
    else:
        raise _fail(path, f"has the suffix {suffix!r}", "a .jsonl, .csv or .json task file")
    if not rows:
        raise _fail(path, "holds no pairs", "at least one clean/corrupted pair")
    pairs = tuple(as_pair(row, f"task file {str(path)!r}: {where}") for where, row in rows)
    return Task(name or p.stem, pairs, metric=metric, ablation=ablation, description=f"read from {p.name}")


def _count(path: Any, n: int) -> None:
    if n > MAX_PAIRS:
        raise _fail(path, f"holds more than {MAX_PAIRS} pairs", f"at most {MAX_PAIRS} (take a sample)")


def _jsonl(path: Any, text: str) -> list[tuple[str, dict]]:
    """``(where, row)`` per pair: where names the line (the CSV reader names the row, the JSON reader the prompt)."""
    rows = []
    # JSON Lines ends lines with "\n" (and "\r\n"); str.splitlines would also split inside strings at U+2028 etc.
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        _count(path, len(rows) + 1)
        try:
            row = json.loads(line, parse_constant=_no_constant)
        except (ValueError, RecursionError) as error:
            raise _fail(path, f"line {number} is not JSON ({_reason(error)})", "one JSON object per line") from None
        if not isinstance(row, dict):
            raise _fail(path, f"line {number} is a {type(row).__name__}", "a JSON object per line")
        rows.append((f"line {number}", row))
    return rows


def _csv(path: Any, text: str) -> list[tuple[str, dict]]:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        header = reader.fieldnames or []
    except csv.Error as error:
        raise _fail(path, f"is not CSV ({error})", "a CSV file with a header row") from None
    eap = all(c in header for c in EAP_COLUMNS)
    if not eap and "correct_idx" in header:
        raise _fail(path, "has EAP-IG's greater-than columns (correct_idx is a year, not a token)",
                    "the columns clean, corrupted, answer, wrong; or use the built-in greater-than task")
    missing = [c for c in TEXT_COLUMNS if c not in header]
    if not eap and missing:
        raise _fail(path, f"has the columns {header} (missing {missing})",
                    f"the columns {list(TEXT_COLUMNS)} or EAP-IG's {list(EAP_COLUMNS)}")
    rows = []
    try:
        for number, row in enumerate(reader, 2):
            _count(path, len(rows) + 1)
            if None in row or any(v is None for v in row.values()):  # DictReader: None holds extras, fills gaps
                given = sum(v is not None for k, v in row.items() if k is not None) + len(row.get(None) or ())
                raise _fail(path, f"row {number} has {given} fields", f"{len(header)} fields, as the header")
            if eap:
                rows.append((f"row {number}", {"clean": row["clean"], "corrupted": row["corrupted"],
                                                 "answer": _token_id(path, number, row["correct_idx"]),
                                                 "wrong": _token_id(path, number, row["incorrect_idx"])}))
            else:
                rows.append((f"row {number}", {k: row[k] for k in TEXT_COLUMNS}))
    except csv.Error as error:
        raise _fail(path, f"is not CSV ({error})", "a CSV file with a header row") from None
    return rows


def _token_id(path: Any, number: int, value: str) -> int:
    try:
        token = int(value)
    except ValueError:
        shown = repr(value) if len(value) <= 40 else f"{value[:37]!r}... ({len(value)} characters)"
        raise _fail(path, f"row {number} gives the token index {shown}", "an integer token id") from None
    return token


def _auto_circuit(path: Any, text: str) -> list[tuple[str, dict]]:
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as error:
        raise _fail(path, f"is not JSON ({_reason(error)})", "auto-circuit's {\"prompts\": [...]} file") from None
    prompts = data.get("prompts") if isinstance(data, dict) else None
    if not isinstance(prompts, list):
        raise _fail(path, "has no list under \"prompts\"", "auto-circuit's {\"prompts\": [{\"clean\", \"corrupt\", "
                    "\"answers\", \"wrong_answers\"}, ...]}")
    _count(path, len(prompts))
    rows = []
    for i, item in enumerate(prompts, 1):
        if not isinstance(item, dict) or any(k not in item for k in ("clean", "corrupt", "answers", "wrong_answers")):
            raise _fail(path, f"prompt {i} is not an object with clean, corrupt, answers, wrong_answers",
                        "auto-circuit's prompt objects")
        rows.append((f"prompt {i}", {"clean": item["clean"], "corrupted": item["corrupt"],
                                     "answer": item["answers"], "wrong": item["wrong_answers"]}))
    return rows


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _reason(error: Exception) -> str:
    return "nested too deeply" if isinstance(error, RecursionError) else str(error).split(":")[0]


__all__ = ["MAX_TASK_BYTES", "load_task"]
