"""Reading a track's files back: every ``track-step<N>.json`` record and every ``track.json`` goes through one
validating reader.

Why: a track's directory is input like a model directory. A rerun, a merge and :meth:`Track.load` read files
that other processes, other versions or other people wrote: a record with a key missing, a ``step`` of ``"abc"``,
``true`` or ``10.7``, a ``NaN`` token, a scores grid of the wrong shape, JSON nested 200,000 levels, 300 MB, a
symlink to ``/dev/zero``. Each file is read by the guarded reader of model files
(:func:`circuitkit.models.files.read_json`: a regular file inside the directory, size-capped, depth-limited,
strict UTF-8, no ``NaN``/``Infinity`` tokens), then checked against the schema below with types and ranges. A bad
file is one :class:`~circuitkit.CircuitkitError` line naming the file and the field.

A record (:data:`RECORD_FORMAT`)::

    format            "circuitkit-track-checkpoint/1"
    label             non-empty string
    step              int >= 0 (not a bool, not 10.7)
    source            string or null (an in-memory model)
    settings          object (how the batch was built, which scores, top_k)
    model             {n_layers, n_heads, d_model, d_head, d_vocab, n_kv_heads: int >= 1, n_ctx: int >= 1 or null,
                       family: string (records written before it was kept lack it)}
    tokens_sha256     64 hex digits
    icl_score, first_copy_loss, repeated_loss    finite numbers
    loss_per_position list of finite numbers
    scores            {name: [n_layers][n_heads] finite number or null (a head whose pattern was NaN)}
    called            {score name among scores: ["layer.head", ...] inside the model}
    top_edges         {"Q" | "K" | "V": [["layer.head", "layer.head", finite number], ...], src layer < dst layer}
    fingerprint       optional: what the checkpoint was (:mod:`circuitkit.tracking.fingerprint`)
    task              present exactly where ``settings`` has a ``task`` (:mod:`circuitkit.tracking.task_figures`):
                      {clean, corrupted, gap: finite numbers, units: string, scores: [n_layers][n_heads] finite
                      number or null, dla: such a grid or null, circuit: null or {heads: ["layer.head", ...] inside
                      the model, mlps: [layer, ...], size, n_nodes: int >= 0, faithfulness, necessity: finite
                      numbers, evaluation: null or {set: string, pairs: int >= 1, faithfulness: finite or null,
                      necessity: finite}}, circuit_error: string or null}; records written before tasks lack both

``track.json`` (:data:`TRACK_FORMAT`) holds ``settings``, ``model``, ``tokens_sha256`` and a non-empty list
``checkpoints`` of records (without ``format``, ``settings`` and ``model``, which it holds once).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from circuitkit import validate
from circuitkit.errors import CircuitkitError
from circuitkit.models.files import FileKind, read_json

TRACK_FORMAT = "circuitkit-track/1"
RECORD_FORMAT = "circuitkit-track-checkpoint/1"
RECORD_FILE = FileKind("track file", "track directory", "circuitkit track")

MAX_RECORD_BYTES = 32 * 2**20
"""A record holds a few [layer, head] grids: about 60 kB for 24 x 14 heads, 2 MB for 80 x 64 with 8 scores."""
MAX_TRACK_BYTES = 512 * 2**20
"""``track.json`` holds every record once: 250 records of the largest size above."""
MAX_DEPTH = 16
"""Records nest 5 levels (``scores`` -> name -> layer -> head); a few more leave room for settings."""

MODEL_SIZES = ("n_layers", "n_heads", "d_model", "d_head", "d_vocab", "n_kv_heads")
HEAD_NAME = re.compile(r"^(\d{1,6})\.(\d{1,6})$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
EDGE_MODES = ("Q", "K", "V")


class _Field:
    """Builds the error for one field of one file."""

    def __init__(self, where: str, file: Path | str) -> None:
        self.where = where
        self.file = str(file)

    def fail(self, field: str, value: Any, expected: str) -> CircuitkitError:
        return validate.fail(f"{self.where}: {self.file!r}, field {field!r}", value, expected)


def _require(data: dict[str, Any], key: str, at: _Field, prefix: str = "") -> Any:
    if key not in data:
        raise at.fail(prefix + key, validate.given("nothing (the key is missing)"), "the key to be present")
    return data[key]


def _int(value: Any, field: str, at: _Field, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise at.fail(field, value, f"an integer >= {minimum} (not a bool, not a float)")
    return value


def _number(value: Any, field: str, at: _Field, *, nullable: bool = False) -> float | None:
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise at.fail(field, value, "a finite number" + (" or null" if nullable else ""))
    return float(value)


def _text(value: Any, field: str, at: _Field, *, nullable: bool = False) -> str | None:
    if value is None and nullable:
        return None
    if not isinstance(value, str) or not value.strip():
        raise at.fail(field, value, "a non-empty string" + (" or null" if nullable else ""))
    return value


def _dict(value: Any, field: str, at: _Field) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise at.fail(field, value, "a JSON object")
    return value


def _list(value: Any, field: str, at: _Field, length: int | None = None) -> list[Any]:
    if not isinstance(value, list) or (length is not None and len(value) != length):
        raise at.fail(field, validate.given(_shape_of(value)),
                      "a list" + (f" of {length} entries" if length is not None else ""))
    return value


def _shape_of(value: Any) -> str:
    if isinstance(value, list):
        return f"a list of {len(value)} entries"
    return f"a JSON {type(value).__name__}"


def check_model(model: Any, at: _Field, field: str = "model") -> dict[str, Any]:
    """The architecture entry: sizes >= 1 (``n_ctx`` may be null), ``family`` a string where present."""
    model = _dict(model, field, at)
    for key in MODEL_SIZES:
        _int(_require(model, key, at, f"{field}."), f"{field}.{key}", at, 1)
    if model.get("n_ctx") is not None:
        _int(model["n_ctx"], f"{field}.n_ctx", at, 1)
    if "family" in model:
        _text(model["family"], f"{field}.family", at)
    return model


def _head(name: Any, field: str, at: _Field, model: dict[str, Any]) -> tuple[int, int]:
    match = HEAD_NAME.match(name) if isinstance(name, str) else None
    if match is None:
        raise at.fail(field, name, "a head name 'layer.head'")
    layer, head = int(match.group(1)), int(match.group(2))
    if layer >= model["n_layers"] or head >= model["n_heads"]:
        raise at.fail(field, name, f"a head of this {model['n_layers']} x {model['n_heads']} model "
                                   f"(layer < {model['n_layers']}, head < {model['n_heads']})")
    return layer, head


def check_entry(record: Any, at: _Field, model: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """The measured part of a record (what ``track.json`` lists per checkpoint), checked against ``model``."""
    record = _dict(record, prefix.rstrip(".") or "record", at)

    def req(key: str) -> Any:
        return _require(record, key, at, prefix)

    _text(req("label"), prefix + "label", at)
    _int(req("step"), prefix + "step", at, 0)
    _text(req("source"), prefix + "source", at, nullable=True)
    for key in ("icl_score", "first_copy_loss", "repeated_loss"):
        _number(req(key), prefix + key, at)
    for i, value in enumerate(_list(req("loss_per_position"), prefix + "loss_per_position", at)):
        _number(value, f"{prefix}loss_per_position[{i}]", at)
    L, H = model["n_layers"], model["n_heads"]
    scores = _dict(req("scores"), prefix + "scores", at)
    if not scores:
        raise at.fail(prefix + "scores", scores, "at least one score grid")
    for name, grid in scores.items():
        field = f"{prefix}scores.{name}"
        for layer, row in enumerate(_list(grid, field, at, L)):
            for head, value in enumerate(_list(row, f"{field}[{layer}]", at, H)):
                _number(value, f"{field}[{layer}][{head}]", at, nullable=True)
    called = _dict(req("called"), prefix + "called", at)
    for name, heads in called.items():
        if name not in scores:
            raise at.fail(f"{prefix}called.{name}", name, f"a score the record holds ({sorted(scores)})")
        for i, head in enumerate(_list(heads, f"{prefix}called.{name}", at)):
            _head(head, f"{prefix}called.{name}[{i}]", at, model)
    edges = _dict(req("top_edges"), prefix + "top_edges", at)
    for mode, rows in edges.items():
        if mode not in EDGE_MODES:
            raise at.fail(f"{prefix}top_edges", mode, f"composition modes from {list(EDGE_MODES)}")
        for i, row in enumerate(_list(rows, f"{prefix}top_edges.{mode}", at)):
            field = f"{prefix}top_edges.{mode}[{i}]"
            src, dst, score = _list(row, field, at, 3)
            (a, _), (b, _) = _head(src, field + "[0]", at, model), _head(dst, field + "[1]", at, model)
            if a >= b:
                raise at.fail(field, row, "an edge from an earlier layer to a later one")
            _number(score, field + "[2]", at)
    if record.get("fingerprint") is not None:
        _dict(record["fingerprint"], prefix + "fingerprint", at)
    if "task" in record:
        check_task_entry(record["task"], at, model, prefix + "task")
    return record


def _grid(value: Any, field: str, at: _Field, model: dict[str, Any]) -> None:
    for layer, row in enumerate(_list(value, field, at, model["n_layers"])):
        for head, number in enumerate(_list(row, f"{field}[{layer}]", at, model["n_heads"])):
            _number(number, f"{field}[{layer}][{head}]", at, nullable=True)


def check_task_entry(entry: Any, at: _Field, model: dict[str, Any], field: str) -> dict[str, Any]:
    """A record's ``task`` entry (module docstring), checked against ``model``."""
    entry = _dict(entry, field, at)

    def req(data: dict[str, Any], key: str, where: str) -> Any:
        return _require(data, key, at, where + ".")

    for key in ("clean", "corrupted", "gap"):
        _number(req(entry, key, field), f"{field}.{key}", at)
    _text(req(entry, "units", field), f"{field}.units", at)
    _grid(req(entry, "scores", field), f"{field}.scores", at, model)
    if req(entry, "dla", field) is not None:
        _grid(entry["dla"], f"{field}.dla", at, model)
    _text(req(entry, "circuit_error", field), f"{field}.circuit_error", at, nullable=True)
    circuit = req(entry, "circuit", field)
    if circuit is None:
        return entry
    where = f"{field}.circuit"
    circuit = _dict(circuit, where, at)
    for i, head in enumerate(_list(req(circuit, "heads", where), f"{where}.heads", at)):
        _head(head, f"{where}.heads[{i}]", at, model)
    for i, layer in enumerate(_list(req(circuit, "mlps", where), f"{where}.mlps", at)):
        if _int(layer, f"{where}.mlps[{i}]", at, 0) >= model["n_layers"]:
            raise at.fail(f"{where}.mlps[{i}]", layer, f"a layer of this {model['n_layers']}-layer model")
    for key in ("size", "n_nodes"):
        _int(req(circuit, key, where), f"{where}.{key}", at, 0)
    for key in ("faithfulness", "necessity"):
        _number(req(circuit, key, where), f"{where}.{key}", at)
    evaluation = req(circuit, "evaluation", where)
    if evaluation is not None:
        held = f"{where}.evaluation"
        evaluation = _dict(evaluation, held, at)
        _text(req(evaluation, "set", held), f"{held}.set", at)
        _int(req(evaluation, "pairs", held), f"{held}.pairs", at, 1)
        _number(req(evaluation, "faithfulness", held), f"{held}.faithfulness", at, nullable=True)
        _number(req(evaluation, "necessity", held), f"{held}.necessity", at)
    return entry


def _task_required(settings: dict[str, Any], entry: dict[str, Any], at: _Field, prefix: str) -> None:
    """A track measured with a task has its figures at every checkpoint, and only then."""
    if settings.get("task") is not None and "task" not in entry:
        raise at.fail(prefix + "task", validate.given("nothing (the key is missing)"),
                      "the task's figures, since the settings name a task")
    if settings.get("task") is None and "task" in entry:
        raise at.fail(prefix + "task", validate.given("task figures"), "none, since the settings name no task")


def _header(data: Any, kind: str, fmt: Any, at: _Field) -> tuple[dict[str, Any], Any]:
    """What a record and ``track.json`` both open with: a JSON object of ``fmt``, its settings and its model."""
    data = _dict(data, kind, at)
    if data.get("format") != fmt:
        raise at.fail("format", data.get("format"), repr(fmt))
    _dict(_require(data, "settings", at), "settings", at)
    return data, check_model(_require(data, "model", at), at)


def check_record(data: Any, file: Path | str, where: str) -> dict[str, Any]:
    """A whole ``track-step<N>.json`` record checked (see the module docstring)."""
    at = _Field(where, file)
    data, model = _header(data, "record", RECORD_FORMAT, at)
    sha = _require(data, "tokens_sha256", at)
    if not isinstance(sha, str) or not SHA256.match(sha):
        raise at.fail("tokens_sha256", sha, "64 hexadecimal digits")
    _task_required(data["settings"], data, at, "")
    return check_entry(data, at, model)


def check_track(data: Any, file: Path | str, where: str) -> dict[str, Any]:
    """A whole ``track.json`` checked: its settings, architecture and every checkpoint entry; at least one."""
    at = _Field(where, file)
    data, model = _header(data, "track", TRACK_FORMAT, at)
    if not isinstance(data.get("complete", True), bool):
        raise at.fail("complete", data["complete"], "true or false")
    sha = data.get("tokens_sha256")
    if sha is not None and (not isinstance(sha, str) or not SHA256.match(sha)):
        raise at.fail("tokens_sha256", sha, "64 hexadecimal digits or null")
    checkpoints = _list(_require(data, "checkpoints", at), "checkpoints", at)
    if not checkpoints:
        raise at.fail("checkpoints", validate.given("an empty list"), "at least one checkpoint")
    steps = []
    for i, entry in enumerate(checkpoints):
        steps.append(check_entry(entry, at, model, f"checkpoints[{i}].")["step"])
        _task_required(data["settings"], entry, at, f"checkpoints[{i}].")
    if len(set(steps)) != len(steps) or steps != sorted(steps):
        raise at.fail("checkpoints", validate.given(f"steps {steps[:20]}"), "distinct steps in increasing order")
    return data


def read_record(file: Path, directory: Path, where: str) -> dict[str, Any]:
    """One record read safely and checked."""
    data = _read(file, directory, MAX_RECORD_BYTES, where)
    return check_record(data, file, where)


def read_track(file: Path, where: str) -> dict[str, Any]:
    """``track.json`` read safely and checked."""
    data = _read(file, file.parent, MAX_TRACK_BYTES, where)
    return check_track(data, file, where)


def _read(file: Path, directory: Path, max_bytes: int, where: str) -> Any:
    try:
        return read_json(file, directory, max_bytes=max_bytes, max_depth=MAX_DEPTH, kind=RECORD_FILE, finite=True)
    except CircuitkitError as error:
        raise CircuitkitError(f"{where}: {error}") from None


__all__ = ["MAX_RECORD_BYTES", "MAX_TRACK_BYTES", "RECORD_FORMAT", "TRACK_FORMAT", "check_record", "check_track",
           "read_record", "read_track"]
