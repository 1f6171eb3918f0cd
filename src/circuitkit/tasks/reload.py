"""A saved task scan read back: ``scores.json`` -> :class:`~circuitkit.tasks.TaskScan` (``TaskScan.load(dir)``,
and ``circuitkit.Scan.load(dir)`` on a task scan's directory).

Why: a task scan of a real model takes minutes; its figures must come back into Python without running it again.
The file holds every figure exactly (:mod:`circuitkit.tasks.record`), so the loaded scan equals the saved one in
every tensor (same values, same dtype), the task (every pair, its marks and head scores), the circuit, its curves
and intervals, the settings and the stages, and its :meth:`~circuitkit.tasks.TaskScan.answer` is the same text.

A researcher's own metric function is not saved: the loaded task names it (``custom:NAME``) and says so if asked
to run. Reading goes through the guarded reader (:func:`circuitkit.models.files.read_json`: size, depth, UTF-8),
then every rule of :mod:`circuitkit.tasks.scores_check`, then the loaded scan is written again and compared with
the file (a field that disagrees with the fields it derives from is refused). Fields a newer scan adds under their
own name (a :class:`TaskScan`, :class:`TaskCircuit` or stage record field with a default) are passed through.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any

import torch

from circuitkit import validate
from circuitkit.errors import CircuitkitError
from circuitkit.models.files import FileKind

TASK_PREFIX = "circuitkit-task-scan/"
"""The ``format`` of every task scan's ``scores.json``, before its version."""
SCAN_FILE = FileKind("scan file", "scan directory", "save()")
"""How the guarded reader names a scan's scores.json in its errors."""
MAX_SCORES_BYTES = 256 * 2**20
"""A task scores.json larger than this is refused (every pair and the first prompt's attention: a few MB)."""


def task_format() -> str:
    from circuitkit.tasks.record import TASK_FORMAT

    return f"{TASK_PREFIX}{TASK_FORMAT}"


def _tensor(values: Any, dtype: torch.dtype) -> torch.Tensor | None:
    """Nested lists of numbers (None = NaN) as a tensor of ``dtype`` (None stays None)."""
    if values is None:
        return None

    def fill(v: Any) -> Any:
        return [fill(x) for x in v] if isinstance(v, list) else (math.nan if v is None else float(v))

    return torch.tensor(fill(values), dtype=dtype, device="cpu")


def _fields(cls: type, data: dict[str, Any], done: set[str]) -> dict[str, Any]:
    """Fields of dataclass ``cls`` that ``data`` holds under their own name and that were not built already: what a
    newer scan adds (written as plain JSON), passed through."""
    return {f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data and f.name not in done}


def _metric(label: str) -> Any:
    """A task's metric from its label: the name, or (``custom:NAME``) a function of that name that says, if run,
    that the researcher's function is not saved."""
    if not label.startswith("custom:"):
        return label
    name = label.removeprefix("custom:")

    def unsaved(logits: Any, batch: Any) -> Any:
        raise CircuitkitError(f"task metric {name!r}: this task was loaded from scores.json, which does not hold the "
                              "metric function; expected the function itself: rebuild the task with "
                              "Task.from_pairs(task.pairs, metric=your_function).")

    unsaved.__name__ = name
    return unsaved


def _task(data: dict[str, Any], pairs: dict[str, Any], where: str) -> Any:
    from circuitkit.graph.task import Task, as_pair

    return Task(name=data["name"], metric=_metric(data["metric"]), ablation=data["ablation"],
                description=data["description"],
                pairs=tuple(as_pair(p, f"{where}, field 'pairs.prompts[{i}]'") for i, p in enumerate(pairs["prompts"])),
                marks=tuple(dict(m) for m in pairs["marks"] or ()),
                scored=tuple(tuple(row) for row in pairs.get("scored") or ()),
                attention_scores=tuple(tuple(s) for s in data["attention_scores"]))


def _points(values: list[dict[str, Any]]) -> tuple[Any, ...]:
    from circuitkit.circuits.curve import CurvePoint

    return tuple(CurvePoint(int(p["size"]), float(p["faithfulness"]), float(p["metric"])) for p in values)


def _head(text: str) -> tuple[int, int]:
    layer, head = text.split(".")
    return int(layer), int(head)


def _pair(value: Any) -> tuple[float, float]:
    lo, hi = value
    return (math.nan if lo is None else float(lo), math.nan if hi is None else float(hi))


def _optional(value: Any) -> float | None:
    """A saved figure that may be null (not measured, or not written by an older version) as a float or None."""
    return None if value is None else float(value)


def _circuit(data: dict[str, Any] | None, scan: dict[str, Any]) -> Any:
    """The saved ``circuit`` as a :class:`TaskCircuit`, with the random sets and the stability the scan writes beside
    it (``scan``: the whole file)."""
    from circuitkit.edge_effect import EdgeEffect
    from circuitkit.report.reload import SavedRandomBaseline, SavedSearch, SavedStability
    from circuitkit.tasks.circuit import TaskCircuit

    if data is None:
        return None
    built = dict(
        heads=tuple(_head(h) for h in data["heads"]), mlps=tuple(int(m) for m in data["mlps"]),
        faithfulness=float(data["faithfulness"]), necessity=float(data["necessity"]), target=float(data["target"]),
        curve=_points(data["curve"]), n_nodes_total=int(data["nodes_total"]), edges=tuple(data["edges"]),
        edge_faithfulness=_optional(data["edge_faithfulness"]),
        edge_curve=_points(data["edge_curve"]), n_edges_total=int(data["edges_total"]),
        cpr=_optional(data["cpr"]),
        cmd=_optional(data["cmd"]),
        edge_effects=tuple(EdgeEffect(e["edge"], float(e["score"]), float(e["effect"]),
                                      None if e.get("ci") is None else (float(e["ci"][0]), float(e["ci"][1])),
                                      clean=_optional(e.get("clean")), patched=_optional(e.get("patched")))
                           for e in data["edge_effects"]),  # a file written before the metric's means has none
        rank=data["rank"], clean=float(data["metric_clean"]), corrupted=float(data["metric_corrupted"]),
        node_corrupted=float(data["metric_all_nodes_patched"]),
        intervals={key: _pair(v) for key, v in (data.get("ci") or {}).items()},
        other_set=data["other_set"],
        nodes={name: tuple(labels) for name, labels in (data.get("nodes") or {}).items()},
        edge_areas=None if data.get("cpr_cmd") is None else {k: v for k, v in data["cpr_cmd"].items()
                                                             if k != "definition"},
        search=None if data.get("search") is None else SavedSearch(data["search"]),
        edge_search=None if data.get("edge_search") is None else SavedSearch(data["edge_search"]),
        random_baseline=None if scan.get("random_baseline") is None else SavedRandomBaseline(scan["random_baseline"]),
        stability=None if scan.get("stability") is None else SavedStability(scan["stability"]),
    )
    return TaskCircuit(**built, **_fields(TaskCircuit, data, set(built)))


def _single_heads(data: dict[str, Any]) -> Any:
    """The heads patched one at a time (``single_heads`` and ``heads.exact``), or None where not measured; the
    estimate they were compared with is ``heads.score``."""
    from circuitkit.detect.effects import Agreement
    from circuitkit.tasks.single_heads import SingleHeads

    record = data.get("single_heads")
    if record is None:
        return None
    agreed, miss = record["agreement"], record["agreement"]["largest_miss"]
    return SingleHeads(
        heads=tuple(_head(h) for h in record["heads"]), exact=_tensor(data["heads"]["exact"], torch.float32),
        estimate=_tensor(data["heads"]["score"], torch.float32),
        intervals={name: (float(lo), float(hi)) for name, (lo, hi) in record["ci"].items()},
        agreement=Agreement(int(agreed["n_exact"]), _optional(agreed["spearman"]),
                            None if miss is None else (_head(miss["head"]), float(miss["exact"]),
                                                       float(miss["estimate"]))),
        selection=record["selection"],
        agreement_interval=None if agreed.get("ci") is None else (float(agreed["ci"][0]), float(agreed["ci"][1])))


def _split_scores(heads: dict[str, Any], own: tuple[str, ...], order: list[str],
                  dtype: torch.dtype) -> tuple[dict, dict]:
    """``heads`` (every grid but ``dla`` and ``score``) as the task's own head scores (``own``, in the task's order)
    and the pattern scores (``order``: as the scan held them)."""
    return ({name: _tensor(heads[name], dtype) for name in own},
            {name: _tensor(heads[name], dtype) for name in order})


def task_scan_from_json(data: Any, where: str, scan_cls: type) -> Any:
    """The task scan that ``data`` (a parsed task ``scores.json``) describes (see the module docstring), built as
    ``scan_cls`` (:class:`~circuitkit.tasks.TaskScan`, passed in by its callers: this module stands below the scan
    that calls it), its stages the :class:`~circuitkit.scan_record.StageRecord` both scans keep."""
    from circuitkit.report.reload import check_written_again
    from circuitkit.scan_record import ModelSummary, StageRecord
    from circuitkit.tasks.record import DTYPES
    from circuitkit.tasks.scores_check import check_task_scores

    expected = task_format()
    if not isinstance(data, dict) or data.get("format") != expected:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise validate.fail(f"{where}, field 'format'", validate.given(f"a scores.json of format {got!r}"),
                            f"format {expected!r} (written by this circuitkit's TaskScan.save)",
                            "Scan the task again with this version, or load it with the version that wrote it.")
    check_task_scores(data, where, tuple(f.name for f in dataclasses.fields(scan_cls)))
    try:
        dtype = DTYPES[data["dtype"]]
        pairs, heads = data["pairs"], data["heads"]
        task = _task(data["task"], pairs, where)
        own, patterns = _split_scores(heads, tuple(s[0] for s in task.attention_scores),
                                       data["pattern_scores"], dtype)
        ci = data["task"].get("ci") or {}
        built = dict(
            model=ModelSummary(**data["model"]), task=task,
            clean=_tensor(pairs["clean"], dtype), corrupted=_tensor(pairs["corrupted"], dtype),
            dla=_tensor(heads["dla"], dtype), dla_mlp=_tensor(data["mlps"]["dla"], dtype),
            scores=_tensor(heads["score"], dtype), scores_mlp=_tensor(data["mlps"]["score"], dtype),
            head_scores=own, pattern_scores=patterns, patterns=_tensor(data["patterns"], dtype),
            tokens=tuple(data["task"]["tokens"]), circuit=_circuit(data["circuit"], data),
            circuit_error=data["circuit_error"], settings=data["settings"],
            stages=tuple(StageRecord(**{f.name: s[f.name] for f in dataclasses.fields(StageRecord) if f.name in s})
                         for s in data["stages"]),
            intervals={key: _pair(v) for key, v in ci.items()},
            nodes={name: {**kind, "score": _tensor(kind["score"], dtype)} for name, kind in
                   (data.get("nodes") or {}).items()},
            single_heads=_single_heads(data),
            ranking=None if "joint" not in heads else {
                "heads": _tensor(heads["joint"], dtype), "mlps": _tensor(data["mlps"]["joint"], dtype)},
        )
        scan = scan_cls(**built, **_fields(scan_cls, data, set(built)))
        written = scan.to_json()
        scan.answer()  # every figure the answer reads is there
    except CircuitkitError as error:
        if f"{where}, field '" in str(error):
            raise
        raise validate.fail(f"{where}, field 'task'", validate.given(f"a task that does not rebuild ({error})"),
                            "a task as TaskScan.save writes it") from None
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RuntimeError) as error:
        raise validate.fail(where, validate.given(f"a scores.json with a missing or malformed entry ({error!r})"),
                            "a scores.json written by TaskScan.save") from None
    check_written_again(written, data, where)
    return scan


def read_scores(path: Any, where: str) -> tuple[Path, Any]:
    """``(file, parsed JSON)`` of the ``scores.json`` ``path`` names, read through the guarded reader."""
    from circuitkit.models import files as guarded
    from circuitkit.report.reload import scores_file

    file = scores_file(path, where)
    return file, guarded.read_json(file, max_bytes=MAX_SCORES_BYTES, kind=SCAN_FILE)


def load_task_scan(path: str | os.PathLike, scan_cls: type) -> Any:
    """The task scan saved in ``path`` (a directory holding ``scores.json``, or the file itself), built as
    :func:`task_scan_from_json` says."""
    file, data = read_scores(path, "TaskScan.load")
    return task_scan_from_json(data, f"TaskScan.load: {str(file)!r}", scan_cls)


__all__ = ["TASK_PREFIX", "load_task_scan", "read_scores", "task_format", "task_scan_from_json"]
