"""A saved scan read back: ``scores.json`` -> :class:`~circuitkit.Scan` (``Scan.load(dir)``).

Why: a scan of a large model takes minutes; its figures must come back into Python without running it again.
Everything ``scores.json`` holds is rebuilt as the types a fresh scan has (head scores with their definitions,
:class:`~circuitkit.HeadEffects`, the agreement, composition baselines and top edges, the verified circuit, the
edge evidence), so ``Scan.load(dir).to_json() == json.load(open(dir / "scores.json"))``.

What the file does not hold stays empty: ``tokens`` ``()``, ``patterns`` None, the full composition and spectra
tensors ``{}``, the stages ``()``; a loaded scan therefore answers questions and prints tables, but cannot draw the
report's attention and heatmap figures again (``report.html`` beside it has them). Tensors are float64, so the
7 significant digits saved come back exactly.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from circuitkit import validate
from circuitkit.errors import CircuitkitError, describe
from circuitkit.report.data import JSON_FORMAT, scan_json
from circuitkit.report.saving import SCORES_NAME
from circuitkit.report.scores_check import check_scores_json, first_difference

MAX_SCORES_BYTES = 256 * 2**20
"""A scores.json larger than this is refused (a 100-layer x 64-head scan writes a few MB)."""


@dataclass(frozen=True)
class SavedEvidence:
    """The edge-evidence table of a saved scan: its ``rows`` (:class:`~circuitkit.circuits.evidence.EdgeEvidence`),
    the ``metric`` and corruption they were measured with and the ``thresholds`` of the flags, as saved. (A fresh
    scan's :class:`~circuitkit.circuits.CircuitEvidence` also holds the full attribution and patching results,
    which ``scores.json`` does not.)"""

    rows: tuple[Any, ...]
    metric: str
    corrupt: str
    thresholds: dict[str, float] | None = None  # None: the file had none (written again without)

    @property
    def weight_only(self) -> list[Any]:
        return [r for r in self.rows if r.weight_only]

    @property
    def effect_only(self) -> list[Any]:
        return [r for r in self.rows if r.effect_only]

    def to_json(self) -> dict[str, Any]:
        out = {"metric": self.metric, "corrupt": self.corrupt, "rows": [r.to_json() for r in self.rows]}
        if self.thresholds is not None:
            out["thresholds"] = dict(self.thresholds)
        return out


def _head(text: Any, where: str) -> tuple[int, int]:
    """``"1.3"`` (or ``[1, 3]``) as ``(1, 3)``."""
    try:
        layer, head = (text.split(".") if isinstance(text, str) else text)
        return int(layer), int(head)
    except (ValueError, TypeError, AttributeError):
        raise validate.fail(where, text, "a head written as 'layer.head'") from None


def _heads(values: Any, where: str) -> tuple[tuple[int, int], ...]:
    return tuple(_head(v, where) for v in values or ())


def _grid(rows: Any, where: str) -> torch.Tensor:
    """A ``[layer][head]`` list of numbers (None = NaN) as a float64 tensor."""
    try:
        return torch.tensor([[math.nan if v is None else float(v) for v in row] for row in rows], dtype=torch.float64)
    except (TypeError, ValueError):
        raise validate.fail(where, validate.given("a value that is not a [layer][head] grid of numbers"),
                            "a [layer][head] list of numbers or null") from None


def _float(value: Any) -> float:
    return math.nan if value is None else float(value)


def _settings(data: dict[str, Any]) -> Any:
    from circuitkit.detect.roles import Role
    from circuitkit.scan_record import ScanSettings

    known = {f.name for f in dataclasses.fields(ScanSettings)}
    values = {key: value for key, value in data.items() if key in known}
    roles = []
    for text in data.get("roles", ()):
        name, _, rest = str(text).partition(": ")
        score, _, feeds = rest.partition(" feeding ")
        roles.append(Role(name, score, feeds or None))
    values["roles"] = tuple(roles)
    return ScanSettings(**values)


def _head_scores(data: dict[str, Any], settings: Any) -> Any:
    from circuitkit.detect.registry import ScoreDefinition
    from circuitkit.detect.scores import HeadScores

    scores = {name: _grid(grid, f"scores.json: head_scores[{name!r}]") for name, grid in data["head_scores"].items()}
    definitions = {}
    for name in scores:
        d = data.get("scores", {}).get(name) or {}
        definitions[name] = ScoreDefinition(name=name, short=d.get("short") or name, description=d.get("description")
                                            or "", kind=d.get("kind") or "pattern", neutral=d.get("neutral"))
    return HeadScores(scores, definitions, tokens=torch.empty(0, 0, dtype=torch.long), patterns=None,
                      block_len=settings.block_len, n_repeats=settings.n_repeats, bos=settings.bos)


def _effects(record: dict[str, Any] | None, kind: str) -> Any:
    from circuitkit.detect.effects import HeadEffects

    if record is None:
        return None
    effect = _grid(record["effect"], f"scores.json: {kind}.effect")
    exact = None
    if kind == "ablation":
        exact = torch.zeros(effect.shape, dtype=torch.bool)
        for layer, head in _heads(record.get("ablated"), "scores.json: ablation.ablated"):
            exact[layer, head] = True
    method = record["ablation_method"] if kind == "attribution" else record["method"]
    return HeadEffects(kind=kind, method=method, clean_loss=_float(record["clean_loss"]), effect=effect, exact=exact)


EVIDENCE_ROW_KEYS = ("src", "dst", "channel", "weight_only", "effect_only", "name")
"""The keys of an evidence row that are not an edge measure's value (every other key is one, by its name)."""


def _evidence(data: dict[str, Any] | None) -> SavedEvidence | None:
    from circuitkit.circuits.evidence import EdgeEvidence

    if data is None:
        return None
    rows = []
    for i, r in enumerate(data.get("rows", ())):
        where = f"scores.json: evidence.rows[{i}]"
        values = {key: _measured(value, f"{where}.{key}") for key, value in r.items() if key not in EVIDENCE_ROW_KEYS}
        flags = [flag for flag in ("weight_only", "effect_only") if r.get(flag)]
        rows.append(EdgeEvidence.of(_head(r["src"], where), _head(r["dst"], where), r["channel"], values, flags))
    return SavedEvidence(rows=tuple(rows), metric=data.get("metric", "loss"), corrupt=data.get("corrupt", "resample"),
                         thresholds=None if data.get("thresholds") is None else dict(data["thresholds"]))


def _measured(value: Any, where: str) -> float | None:
    """An edge measure's saved value: a number, or None (not measured)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise validate.fail(where, value, "a number or null (an edge measure's value)")
    return float(value)


@dataclass(frozen=True)
class SavedRecord:
    """An opt-in measurement a saved circuit holds (its random-set baseline, its stability), as saved; its fields
    are read as the measurement's own (checked by :mod:`circuitkit.report.scores_check` first)."""

    data: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return self.data


@dataclass(frozen=True)
class SavedSets:
    """One kind of random head sets as saved (what :class:`circuitkit.circuits.baseline.SetBaseline` holds)."""

    mean: float
    spread: tuple[float, float]
    interval: tuple[float, float] | None


class SavedRandomBaseline(SavedRecord):
    """A saved :class:`circuitkit.circuits.baseline.RandomBaseline`: ``size``, ``n_sets``, ``passes``,
    ``uniform`` and ``layered`` (:class:`SavedSets`)."""

    def __getattr__(self, name: str) -> Any:
        if name == "data":  # not set yet (a copy being built)
            raise AttributeError(name)
        if name in ("uniform", "layered"):
            kind = self.data[name]
            return SavedSets(_float(kind["mean"]), _pair(kind["spread"]), _pair(kind.get("ci")))
        if name in ("size", "n_sets", "seed", "passes"):
            return self.data[name]
        raise AttributeError(name)


class SavedSearch(SavedRecord):
    """A saved :class:`circuitkit.circuits.search.SearchResult` (a circuit searched beyond ranking): ``search``
    (its name), ``start`` (the ranked circuit's size it started from), ``size``, ``passes``, ``faithfulness``,
    ``settings`` (its options and why it stopped)."""

    def __getattr__(self, name: str) -> Any:
        if name == "data":  # not set yet (a copy being built)
            raise AttributeError(name)
        if name == "start":
            return self.data["start_size"]
        if name in ("search", "size", "passes", "faithfulness", "settings"):
            return self.data[name]
        raise AttributeError(name)


class SavedStability(SavedRecord):
    """A saved :class:`circuitkit.circuits.stability.Stability`: ``n_resamples``, ``jaccard``, ``passes`` and
    :meth:`ranked` (the inclusion shares, as saved: most often first)."""

    def __getattr__(self, name: str) -> Any:
        if name == "data":
            raise AttributeError(name)
        if name in ("n_resamples", "seed", "jaccard", "passes", "stable"):
            return self.data[name]
        raise AttributeError(name)

    def ranked(self) -> list[tuple[tuple[int, int], float]]:
        return [(_head(head, "scores.json: circuit.stability.inclusion"), float(share))
                for head, share in self.data["inclusion"].items()]


def _pair(value: Any) -> tuple[float, float] | None:
    """A saved ``[lo, hi]`` (None entries as NaN), or None."""
    if value is None:
        return None
    lo, hi = value
    return (math.nan if lo is None else float(lo), math.nan if hi is None else float(hi))


def _pair_grid(rows: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A saved ``[layer][head] -> [lo, hi] | null`` as ``(lo, hi)`` float64 grids (NaN where null)."""
    if rows is None:
        return None
    lo = [[math.nan if c is None or c[0] is None else float(c[0]) for c in row] for row in rows]
    hi = [[math.nan if c is None or c[1] is None else float(c[1]) for c in row] for row in rows]
    return torch.tensor(lo, dtype=torch.float64), torch.tensor(hi, dtype=torch.float64)


def _scan_intervals(data: dict[str, Any]) -> dict[str, Any]:
    """``Scan.intervals`` as :func:`circuitkit.report.data.scan_json` wrote them (empty for a scan without)."""
    if "uncertainty" not in data:
        return {}
    out: dict[str, Any] = {"head_scores": {name: _pair_grid(rows)
                                           for name, rows in (data.get("head_scores_ci") or {}).items()},
                           "circuit_ablation": {label: _pair(value)
                                                for label, value in (data.get("circuit_ablation_ci") or {}).items()}}
    loss = data.get("induction_loss") or {}
    if "ci" in loss:
        out["induction_loss"] = {key: _pair(value) for key, value in loss["ci"].items()}
    for kind in ("attribution", "ablation"):
        record = data.get(kind) or {}
        if "ci" in record:
            out[kind] = _pair_grid(record["ci"]["effect"])
    if (data.get("agreement") or {}).get("ci") is not None:
        out["agreement"] = _pair(data["agreement"]["ci"])
    edges = {(_head(e["src"], "scores.json: circuit.edges"), _head(e["dst"], "scores.json: circuit.edges"),
              e["channel"]): _pair(e["ci"])
             for e in ((data.get("circuit") or {}).get("edges") or ()) if "ci" in e}
    if edges:
        out["edges"] = edges
    return out


def _circuit_intervals(data: dict[str, Any]) -> dict[str, Any]:
    """The verified circuit's intervals as saved (empty without)."""
    if "ci" not in data:
        return {}
    ci = data["ci"]
    return {"faithfulness": _pair(ci.get("faithfulness")), "necessity": _pair(ci.get("necessity")),
            "losses": {key: _pair(value) for key, value in (ci.get("losses") or {}).items()},
            "curve": {int(p["n_heads"]): _pair(p.get("ci")) for p in data.get("curve", ())}}


def _circuit(data: dict[str, Any] | None) -> Any:
    from circuitkit.circuits.faithfulness import Circuit, CurvePoint

    if data is None:
        return None
    heads = _heads(data["heads"], "scores.json: circuit.heads")
    losses = data.get("losses") or {}
    return Circuit(
        heads=heads, faithfulness=_float(data["faithfulness"]), necessity=data.get("necessity"),
        target=_float(data["target"]), method=data["method"], clean_loss=_float(losses.get("clean")),
        all_ablated_loss=_float(losses.get("all_ablated")), circuit_loss=_float(losses.get("circuit_only")),
        curve=tuple(CurvePoint(int(p["n_heads"]), _float(p["faithfulness"]), _float(p["loss"]))
                    for p in data.get("curve", ())),
        ranking=heads, passes=int(data.get("passes") or 0),
        roles={role: _heads(members, "scores.json: circuit.roles")
               for role, members in (data.get("roles") or {}).items()},
        ranked_by=data.get("ranked_by", "effect"),
        intervals=_circuit_intervals(data),
        random_baseline=None if data.get("random_baseline") is None else SavedRandomBaseline(data["random_baseline"]),
        stability=None if data.get("stability") is None else SavedStability(data["stability"]),
        evaluation=data.get("evaluation"),
        search=None if data.get("search") is None else SavedSearch(data["search"]),
    )


def scan_from_json(data: Any, where: str = "Scan.load", cls: type | None = None) -> Any:
    """The scan that ``data`` (a parsed ``scores.json``) describes, built as ``cls`` (:meth:`circuitkit.Scan.load`
    passes :class:`~circuitkit.Scan`; default the record, :class:`~circuitkit.scan_record.ScanRecord`)."""
    from circuitkit.composition import Edge
    from circuitkit.detect.effects import Agreement
    from circuitkit.detect.loss import InductionLoss
    from circuitkit.random_baseline import CompositionBaseline
    from circuitkit.scan_record import ModelSummary, ScanRecord

    # type(...) is int: 4.0 and True compare equal to 4 and 1, and are no format this version wrote
    if not isinstance(data, dict) or type(data.get("format")) is not int or data["format"] != JSON_FORMAT:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise validate.fail(f"{where}, field 'format'", validate.given(f"a scores.json of format {got!r}"),
                            f"format {JSON_FORMAT} (written by this circuitkit's Scan.save)",
                            "Scan it again with this version, or load it with the version that wrote it.")
    check_scores_json(data, where)
    try:
        settings = _settings(data["settings"])
        loss = data.get("induction_loss")
        agreement = data.get("agreement")
        miss = agreement and agreement.get("largest_miss")
        baselines, edges = {}, {}
        for mode, entry in (data.get("composition") or {}).items():
            if entry.get("baseline") is not None:
                b = entry["baseline"]
                baselines[mode] = CompositionBaseline(mean=_float(b["mean"]), std=_float(b.get("std")),
                                                      closed_form=None, n_samples=0)
            edges[mode] = [Edge(_head(e["src"], where), _head(e["dst"], where), _float(e["score"]))
                           for e in entry.get("top_edges", ())]
        scan = (cls or ScanRecord)(
            model=ModelSummary(**data["model"]),
            settings=settings,
            head_scores=_head_scores(data, settings),
            tokens=(),
            patterns=None,
            induction_loss=None if loss is None else InductionLoss(
                per_position=torch.tensor([_float(v) for v in loss.get("per_position") or ()], dtype=torch.float64),
                first_copy=_float(loss["first_copy"]), repeated_copies=_float(loss["repeated_copies"])),
            attribution=_effects(data.get("attribution"), "attribution"),
            ablation=_effects(data.get("ablation"), "ablation"),
            agreement=None if not agreement else Agreement(
                n_exact=int(agreement["n_exact"]), spearman=agreement.get("spearman"),
                largest_miss=None if not miss else (_head(miss["head"], where), _float(miss["exact"]),
                                                    _float(miss["estimate"]))),
            baselines=baselines,
            edges=edges,
            circuit=_evidence(data.get("evidence")),
            called={key.removesuffix("_heads"): _heads(value, where) for key, value in data.items()
                    if key.endswith("_heads") and key != "top_heads"},
            circuit_ablation={label: _float(v) for label, v in (data.get("circuit_ablation") or {}).items()},
            verified=_circuit(data.get("circuit")),
            verified_error=data.get("circuit_error"),
            intervals=_scan_intervals(data),
        )
    except CircuitkitError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as error:
        raise validate.fail(where, validate.given(f"a scores.json with a missing or malformed entry ({error!r})"),
                            "a scores.json written by Scan.save") from None
    _check_written_again(scan, data, where)
    return scan


UNWRITTEN = ("circuitkit_version", "units")
"""Keys of ``scores.json`` a loaded scan does not keep: written again, they say this version's version and units."""

REWORDED = ("circuit", "explanations")
"""Where ``scores.json`` holds prose a loaded scan writes again from its figures, in this version's words (each
circuit member's explanation, :mod:`circuitkit.circuits.explain`): the checker holds its shape (an entry for every
member, non-empty text), and the comparison of the file with the loaded scan written again leaves it out, so that
a scan saved by a version that worded it otherwise still loads (and then says it in today's words)."""


def comparable(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (a parsed ``scores.json``, either kind of scan) without what a loaded scan writes again in this
    version's words: the keys of :data:`UNWRITTEN` and the prose at :data:`REWORDED`; what the comparison with the
    loaded scan written again reads. ``data`` itself is not changed."""
    kept = {key: value for key, value in data.items() if key not in UNWRITTEN}
    outer, inner = REWORDED
    if isinstance(kept.get(outer), dict) and inner in kept[outer]:
        kept[outer] = {k: v for k, v in kept[outer].items() if k != inner}
    return kept


def _check_written_again(scan: Any, data: dict[str, Any], where: str) -> None:
    """:func:`check_written_again` of the loaded induction scan ``scan``."""
    check_written_again(scan_json(scan), data, where)


def check_written_again(written: dict[str, Any], data: dict[str, Any], where: str) -> None:
    """Refuse a file (``data``) whose loaded scan, written again (``written``), says something else: a field that
    disagrees with the fields it derives from (``top_heads`` not the best heads of their grid, ``uncertainty``
    beside other settings, a task's means beside its pairs), the prose aside (:func:`comparable`). Either kind of
    scan."""
    found = first_difference(comparable(data), comparable(written))
    if found is not None:
        path, saved, again = found
        raise validate.fail(f"{where}, field {path!r}", saved,
                            f"{describe(again)}, what the rest of the file gives (a field that disagrees with the "
                            "fields it is derived from)")


def scores_file(path: Any, where: str) -> Path:
    """The ``scores.json`` that ``path`` names (a directory holding one, or the file), checked to be a path a file
    can have (no NUL character, names and length within the file system's limits) and to exist; both kinds of
    scan are read through it."""
    from circuitkit.models import files as guarded

    if not isinstance(path, (str, os.PathLike)) or not str(path).strip() or "\0" in str(path):
        raise validate.fail(f"{where}: path", path, "a directory written by save(), or its scores.json (a path "
                                                    "without NUL characters)")
    guarded.check_path_length(path, f"{where}: path")
    file = Path(path).expanduser()
    if guarded.is_dir(file):
        file = file / SCORES_NAME
    if not guarded.exists(file):
        raise validate.fail(f"{where}: path", validate.given(f"{str(path)!r}, where there is no such file or "
                                                             f"directory ({str(file)!r})"),
                            "a directory written by save(), or its scores.json")
    return file


def load_scan(path: str | os.PathLike, cls: type | None = None) -> Any:
    """The scan saved in ``path`` (a directory holding ``scores.json``, or the file itself), built as ``cls``
    (default :class:`~circuitkit.scan_record.ScanRecord`; :meth:`circuitkit.Scan.load` passes
    :class:`~circuitkit.Scan`, with its views; see the module docstring for what comes back)."""
    from circuitkit.models import files as guarded
    from circuitkit.scan_record import ScanRecord

    if cls is not None and not (isinstance(cls, type) and issubclass(cls, ScanRecord)):
        raise validate.fail("load_scan: cls", cls, "None or a scan record class (circuitkit.Scan, ScanRecord)")
    file = scores_file(path, "Scan.load")
    return scan_from_json(guarded.read_json(file, max_bytes=MAX_SCORES_BYTES), f"Scan.load: {str(file)!r}", cls)
