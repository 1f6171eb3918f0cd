"""The :class:`Track` type, ``track.json`` and the per-checkpoint records it is assembled from.

Files in a track's directory (every one written atomically: a temporary file, ``fsync``, rename, via
:func:`circuitkit.report.saving.write_together`):

- ``track-step<N>.json``: one record per checkpoint (:data:`RECORD_FORMAT`), written as soon as the checkpoint
  is measured, so an interrupted track keeps what it finished and a rerun skips it; separate processes (a job
  array) can each write their own;
- ``track.json``: :meth:`Track.to_json` (:data:`TRACK_FORMAT`): the records in step order, the settings, the
  architecture and the located ``phase_change`` (:mod:`circuitkit.tracking.phase`); rewritten after every
  checkpoint while a track runs;
- ``report.html``: the offline report (:mod:`circuitkit.report.track_page`), written with ``track.json`` at the
  end (and when a track is interrupted).

Every file read back (a record on a rerun or a merge, ``track.json`` in :meth:`Track.load`) goes through
:mod:`circuitkit.tracking.records`: the guarded file reader, then the schema.

Units: losses and the ICL score are nats per token (natural-log cross-entropy, mean over the batch); steps are
the training steps the checkpoints were saved at.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from circuitkit import validate
from circuitkit.errors import CircuitkitError
from circuitkit.tracking.phase import locate
from circuitkit.tracking.records import RECORD_FORMAT, TRACK_FORMAT, read_record, read_track

TRACK_NAME = "track.json"
REPORT_NAME = "report.html"
RECORD_PREFIX = "track-step"
UNITS = {
    "step": "training steps (optimizer updates) at which the checkpoint was saved",
    "losses": "nats per token (natural-log cross-entropy, mean over the batch)",
    "icl_score": "nats per token: first_copy_loss - repeated_loss",
    "loss_per_position": "nats; index t - 1 is the loss of predicting the token at position t",
}
TASK_UNITS = {"task": "clean, corrupted, gap, necessity, scores and dla in the task metric's units (task.units); "
                      "faithfulness: the fraction of the gap between the all-patched and the clean metric recovered"}
"""Added to ``units`` where the track measured a task."""
RECORD_KEYS = ("label", "step", "source", "icl_score", "first_copy_loss", "repeated_loss", "loss_per_position",
               "scores", "called", "top_edges")
OPTIONAL_KEYS = ("fingerprint", "task")
"""Kept in ``track.json``'s checkpoint entries where the record has them."""
RECORD_FILE = re.compile(r"^track-step(\d+)\.json$")


def record_name(step: int) -> str:
    return f"{RECORD_PREFIX}{int(step)}.json"


def dumps(value: Any) -> bytes:
    return (json.dumps(value, indent=1, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")


@dataclass(frozen=True)
class SavedTrack:
    """Paths written by :meth:`Track.save`."""

    track: Path
    report: Path
    pngs: tuple[Path, ...] = ()


@dataclass(frozen=True, eq=False)
class Track:
    """Scores along a training run: one record per checkpoint (``checkpoints``, in step order; each a dict with
    the keys of ``track.json``'s checkpoint entries), the ``settings`` they were measured with and the shared
    architecture (``model``). :attr:`phase_change` is computed from the records."""

    checkpoints: tuple[dict[str, Any], ...]
    settings: dict[str, Any]
    model: dict[str, Any]
    tokens_sha256: str | None = None
    complete: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def phase_change(self) -> dict[str, Any]:
        """See :mod:`circuitkit.tracking.phase` for the definition."""
        return locate(self.checkpoints)

    @property
    def steps(self) -> list[int]:
        return [r["step"] for r in self.checkpoints]

    @property
    def labels(self) -> list[str]:
        return [r["label"] for r in self.checkpoints]

    @property
    def icl_scores(self) -> list[float]:
        return [r["icl_score"] for r in self.checkpoints]

    def scores(self, name: str) -> torch.Tensor:
        """Score ``name`` of every head at every checkpoint: ``[checkpoint, layer, head]`` (NaN where undefined)."""
        names = sorted(self.checkpoints[0]["scores"]) if self.checkpoints else []
        if name not in names:
            raise validate.fail("Track.scores: name", name, f"one of {names}")
        rows = [[[float("nan") if v is None else v for v in row] for row in r["scores"][name]]
                for r in self.checkpoints]
        return torch.tensor(rows, dtype=torch.float32)

    @property
    def task(self) -> dict[str, Any] | None:
        """The task's settings where the track measured one (``settings["task"]``), else None."""
        return self.settings.get("task")

    def task_values(self, key: str) -> list[float | None]:
        """The task's ``"clean"``, ``"corrupted"`` or ``"gap"`` mean metric, or the node circuit's ``"size"``,
        ``"faithfulness"`` or ``"evaluation"`` (held-out faithfulness), at every checkpoint (None where a
        checkpoint has no circuit)."""
        if self.task is None:
            raise CircuitkitError("Track.task_values: this track measured no task; expected a track run with "
                                  "task= (circuitkit track CKPT --task FILE).")
        validate.option("Track.task_values: key", key, ("clean", "corrupted", "gap", "size", "faithfulness",
                                                        "evaluation"))
        out: list[float | None] = []
        for r in self.checkpoints:
            entry, circuit = r["task"], r["task"]["circuit"]
            if key in ("clean", "corrupted", "gap"):
                out.append(entry[key])
            elif circuit is None:
                out.append(None)
            elif key == "evaluation":
                held = circuit["evaluation"]
                out.append(None if held is None else held["faithfulness"])
            else:
                out.append(circuit[key])
        return out

    def task_scores(self, kind: str = "scores") -> torch.Tensor:
        """Every head's task ``"scores"`` (EAP-IG node score) or ``"dla"`` at every checkpoint:
        ``[checkpoint, layer, head]`` (NaN where undefined)."""
        if self.task is None:
            raise CircuitkitError("Track.task_scores: this track measured no task; expected a track run with "
                                  "task= (circuitkit track CKPT --task FILE).")
        validate.option("Track.task_scores: kind", kind, ("scores", "dla"))
        L, H = self.model["n_layers"], self.model["n_heads"]
        rows = []
        for r in self.checkpoints:
            grid = r["task"][kind]
            rows.append([[float("nan")] * H for _ in range(L)] if grid is None else
                        [[float("nan") if v is None else v for v in row] for row in grid])
        return torch.tensor(rows, dtype=torch.float32, device="cpu")

    def to_json(self) -> dict[str, Any]:
        """Exactly what ``track.json`` holds."""
        from circuitkit import __version__

        return {
            "format": TRACK_FORMAT,
            "circuitkit_version": __version__,
            "complete": self.complete,
            "units": {**UNITS, **(TASK_UNITS if self.settings.get("task") else {})},
            "settings": self.settings,
            "model": self.model,
            "tokens_sha256": self.tokens_sha256,
            "phase_change": self.phase_change,
            "checkpoints": [{key: r[key] for key in (*RECORD_KEYS, *OPTIONAL_KEYS) if key in r}
                            for r in self.checkpoints],
        }

    def save(self, out_dir: str | os.PathLike, *, png: bool = False) -> SavedTrack:
        """Write ``out_dir/track.json`` and ``out_dir/report.html`` (together or not at all); with ``png``, each
        figure as ``out_dir/png/<figure>.png`` (needs headless Chromium, like the scan's export)."""
        from circuitkit.report.saving import prepare_directory, write_together
        from circuitkit.report.track_page import build_track_report

        png = validate.boolean("Track.save: png", png)
        out = prepare_directory(out_dir, where="Track.save: out_dir", kind="track")
        write_together(out, {TRACK_NAME: dumps(self.to_json()), REPORT_NAME: build_track_report(self).encode()})
        pngs: tuple[Path, ...] = ()
        if png:
            from circuitkit.report.track_page import export_track_pngs

            pngs = tuple(export_track_pngs(out / REPORT_NAME, out / "png"))
        return SavedTrack(track=out / TRACK_NAME, report=out / REPORT_NAME, pngs=pngs)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Track:
        """A track read back from ``track.json`` (or the directory holding it)."""
        if not isinstance(path, (str, os.PathLike)) or isinstance(os.fspath(path), bytes):
            raise validate.fail("Track.load: path", path, "the path of a track.json file or of its directory")
        file = Path(path).expanduser()
        if file.is_dir():
            file = file / TRACK_NAME
        data = read_track(file, "Track.load")
        return cls(checkpoints=tuple(data["checkpoints"]), settings=data["settings"], model=data["model"],
                   tokens_sha256=data.get("tokens_sha256"), complete=bool(data.get("complete", True)))

    def chart(self, score: str, highlight: list[str] | tuple[str, ...] = (), *, hline: float | None = None) -> str:
        """Every head's ``score`` against the training step as the report draws it (SVG in HTML, no script):
        the heads named in ``highlight`` (``"layer.head"``) in colour, the others faint; ``hline``: a dashed
        level (e.g. the 0.3 at which the scan calls a head)."""
        from circuitkit.report.track_page import head_chart

        names = sorted(self.checkpoints[0]["scores"]) if self.checkpoints else []
        validate.option("Track.chart: score", score, names)
        heads = set()
        if self.checkpoints:
            n_layers, n_heads = self.scores(score).shape[1:]
            heads = {f"{layer}.{head}" for layer in range(n_layers) for head in range(n_heads)}
        if isinstance(highlight, str) or not isinstance(highlight, (list, tuple)) or not all(
                isinstance(h, str) and h in heads for h in highlight):
            raise validate.fail("Track.chart: highlight", highlight, "a list of this model's head names such as "
                                "['1.3', '0.1']")
        if hline is not None:
            hline = validate.real("Track.chart: hline", hline)
        return head_chart(self, score, list(highlight), hline=hline)

    def _repr_html_(self) -> str:
        from circuitkit.report.track_page import summary_html

        return summary_html(self)

    def __repr__(self) -> str:
        change = self.phase_change
        where = f"phase change at step {change['step']}" if change["step"] is not None else "no phase change"
        return f"Track({len(self.checkpoints)} checkpoints, steps {self.steps[:1]}..{self.steps[-1:]}, {where})"


def read_records(directory: Path, where: str = "track") -> dict[int, dict[str, Any]]:
    """``step -> record`` for every ``track-step<N>.json`` in ``directory``, each read by the guarded reader and
    checked against the record schema (:mod:`circuitkit.tracking.records`); a file whose name is not the step it
    holds, or two files holding one step, are refused naming both."""
    out: dict[int, dict[str, Any]] = {}
    files: dict[int, Path] = {}
    for file in sorted(directory.glob(f"{RECORD_PREFIX}*.json")):
        record = read_record(file, directory, f"{where}: record")
        step = record["step"]
        named = RECORD_FILE.match(file.name)
        if named is None or int(named.group(1)) != step:
            raise CircuitkitError(
                f"{where}: record {str(file)!r} holds step {step}; expected the step its name says (a record of "
                f"step {step} is written as {record_name(step)}). Rename or remove it."
            )
        if step in files:
            raise CircuitkitError(
                f"{where}: records {str(files[step])!r} and {str(file)!r} both hold step {step}; expected one "
                "record per step. Remove one of them."
            )
        files[step] = file
        out[step] = record
    return out


def record_file(directory: Path, step: int, where: str) -> dict[str, Any] | None:
    """The record already written for ``step`` in ``directory`` (checked), or None."""
    file = directory / record_name(step)
    if not os.path.lexists(file):
        return None
    return read_record(file, directory, f"{where}: record")


def same_run(records: list[dict[str, Any]], where: str) -> None:
    """Every record measured with the same score set, settings, batch and architecture (family included), or one
    error naming the first that differs and how."""
    first = records[0]
    for record in records[1:]:
        mine, theirs = set(record["scores"]), set(first["scores"])
        if mine != theirs:
            extra, missing = sorted(mine - theirs), sorted(theirs - mine)
            raise CircuitkitError(
                f"{where}: checkpoint {record['label']!r} (step {record['step']}) has scores "
                f"{'with ' + str(extra) if extra else ''}{' and ' if extra and missing else ''}"
                f"{'without ' + str(missing) if missing else ''} unlike {first['label']!r} (step {first['step']}); "
                "expected one score set in one track (a score was registered or removed between the runs: measure "
                "the checkpoints again with one registry)."
            )
        for key, what in (("model", "architecture, family and vocabulary"), ("settings", "settings"),
                          ("tokens_sha256", "token batch")):
            if record.get(key) != first.get(key):
                raise CircuitkitError(
                    f"{where}: checkpoint {record['label']!r} (step {record['step']}) has {what} "
                    f"{_short(record.get(key))}; expected {_short(first.get(key))} like {first['label']!r} "
                    f"(step {first['step']}): one track compares checkpoints of one model measured one way."
                )


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 200 else text[:197] + "..."


def merge(directory: str | os.PathLike) -> Track:
    """The track assembled from the per-checkpoint records in ``directory`` (written by separate processes or
    jobs); the records must share settings, token batch and architecture."""
    path = Path(os.fspath(directory)).expanduser() if isinstance(directory, (str, os.PathLike)) else None
    if path is None or not path.is_dir():
        raise validate.fail("track merge: directory", directory, "a directory holding track-step<N>.json records")
    records = read_records(path, "track merge")
    if not records:
        raise validate.fail("track merge: directory", str(path),
                            "a directory holding track-step<N>.json records (found none)",
                            "Run `circuitkit track CKPT --out DIR --no-merge` for each checkpoint first.")
    ordered = [records[step] for step in sorted(records)]
    same_run(ordered, "track merge")
    return from_records(ordered)


def from_records(ordered: list[dict[str, Any]], *, complete: bool = True) -> Track:
    first = ordered[0]
    return Track(checkpoints=tuple(ordered), settings=first["settings"], model=first["model"],
                 tokens_sha256=first.get("tokens_sha256"), complete=complete)


__all__ = ["RECORD_FORMAT", "TRACK_FORMAT", "SavedTrack", "Track", "merge", "read_records"]
