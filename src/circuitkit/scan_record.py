"""The records of a scan: what :func:`circuitkit.scan` computes and the report, JSON and CLI read.

Why a module of its own, below the report: the pipeline, the report (:mod:`circuitkit.report`) and the command
line all speak about the same object, and the report must read it without importing what calls the report.
:class:`ScanRecord` holds every figure; :class:`circuitkit.scan_types.Scan`, one layer up, adds the views that
call the report (``save``, ``load``, ``to_json``, ``table``, ``to_pandas``, the notebook view). Nothing here
computes anything about a model.

All tensors are float32 on the CPU. Shapes: ``L`` layers, ``H`` query heads, ``pos`` sequence length.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Mapping
from dataclasses import InitVar, asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jaxtyping import Float
from torch import Tensor

from circuitkit.detect.effects import Agreement, HeadEffects
from circuitkit.ranking import Head

if TYPE_CHECKING:
    from circuitkit.circuits.evidence import CircuitEvidence
    from circuitkit.circuits.faithfulness import Circuit
    from circuitkit.composition import CompositionBaseline, Edge
    from circuitkit.detect.loss import InductionLoss
    from circuitkit.detect.roles import Role
    from circuitkit.detect.scores import HeadScores
    from circuitkit.models.adapters import ModelAdapter


@dataclass(frozen=True)
class ModelSummary:
    """What a report says about the model: its name, family (adapter) and shape."""

    name: str
    n_layers: int
    n_heads: int
    d_model: int
    d_head: int
    d_vocab: int | None = None
    n_ctx: int | None = None
    n_kv_heads: int | None = None
    attn_only: bool | None = None
    family: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarise_model(adapter: ModelAdapter, name: str | None) -> ModelSummary:
    """The :class:`ModelSummary` of an adapted model, named ``name`` (None: the adapter's own name)."""
    spec = adapter.spec
    if name is None:
        name = adapter.default_name
    return ModelSummary(
        name=str(name),
        n_layers=spec.n_layers,
        n_heads=spec.n_heads,
        d_model=spec.d_model,
        d_head=spec.d_head,
        d_vocab=spec.d_vocab,
        n_ctx=spec.n_ctx,
        n_kv_heads=spec.n_kv_heads,
        attn_only=adapter.attn_only,
        family=spec.family,
    )
UNSAVED = {"saved": False}
"""Field metadata of a :class:`ScanSettings` field that ``scores.json`` does not hold (it says it otherwise)."""


@dataclass(frozen=True)
class ScanSettings:
    """The options a scan runs with, built once before its first pass (shown verbatim in the report: no
    timestamps, no paths).

    ``top_k`` sets the three listing sizes where they are not given: ``heads_per_score`` (the best heads of each
    score listed, ``top_heads`` in ``scores.json``), ``edges_per_mode`` (the top composition edges per mode) and
    ``edges_listed`` (the edges the evidence table and the answer list); ``scores.json`` holds one of them only
    where it differs from ``top_k``. ``circuit``: the circuit search (and the edge evidence) runs; ``scores.json``
    says so by its ``circuit``."""

    block_len: int
    n_repeats: int
    batch: int
    seed: int
    bos: int | None
    ablate: str  # "top" | "all" | "none"
    ablate_top: int
    ablation_method: str  # "mean" | "zero"
    top_k: int
    device: str
    n_patch: int = 16
    target: float = 0.8
    faithfulness_method: str = "mean"  # "mean" | "zero" | "resample"
    circuit_rank: str = "joint"  # "joint" | "effect" | "auto"
    attribution_method: str = "gradient"  # "gradient" | "ig"
    attribution_steps: int = 1
    edge_attribution_steps: int | None = None  # integration steps of the edge attribution; None: no edge evidence
    roles: tuple[Role, ...] = ()
    n_resamples: int = 1000  # bootstrap resamples behind every interval
    ci_level: float = 0.95  # the intervals' confidence level
    random_sets: int = 0  # random head sets per kind measured beside the circuit (0: none)
    stability: int = 0  # bootstrap resamples the circuit search was rerun on (0: none)
    evaluation_seed: int | None = None  # seed of the held-out batch the circuit is also measured on (None: none)
    search: str = "ranked"  # how the circuit is chosen: the ranked top-n set, or searched further from it
    search_options: dict[str, Any] | None = field(default=None, metadata=UNSAVED)  # what ran: circuit.search.settings
    token_range: tuple[int, int] | None = field(default=None, metadata=UNSAVED)  # the spec's, for that batch
    circuit: bool = field(default=True, metadata=UNSAVED)
    heads_per_score: int | None = None  # None: top_k
    edges_per_mode: int | None = None  # None: top_k
    edges_listed: int | None = None  # None: top_k

    def __post_init__(self) -> None:
        for name in LISTING_SIZES:
            if getattr(self, name) is None:
                object.__setattr__(self, name, self.top_k)

    @property
    def with_edges(self) -> bool:
        """Whether the scan measures edge evidence (a circuit search on a model whose heads can be isolated)."""
        return self.edge_attribution_steps is not None

    @property
    def reuses_corrupt_run(self) -> bool:
        """Whether the circuit search runs the resampled batch the edge evidence needs (so the edges stage does
        not)."""
        return self.circuit and self.faithfulness_method == "resample"

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["roles"] = [role.describe() for role in self.roles]
        for f in fields(self):
            if f.metadata.get("saved", True) is False or (f.name in LISTING_SIZES and out[f.name] == self.top_k):
                del out[f.name]
        if self.evaluation_seed is None:  # no held-out batch: written as files before it were
            del out["evaluation_seed"]
        if self.search == "ranked":  # the ranked circuit: written as files before other searches were
            del out["search"]
        return out


LISTING_SIZES = ("heads_per_score", "edges_per_mode", "edges_listed")
"""The :class:`ScanSettings` fields ``top_k`` sets where they are not given."""


@dataclass(frozen=True)
class StageRecord:
    """One stage of a scan as it ran: its short ``name``, forward passes of the batch it cost (``passes``;
    weight-only work counts 0) and wall ``seconds``."""

    name: str
    passes: float
    seconds: float


@dataclass(frozen=True)
class ScanRecord:
    """Everything a scan measured, as the report reads it (:class:`circuitkit.scan_types.Scan` adds the views
    that call the report: ``save``, ``load``, ``to_json``, ``table``, ``to_pandas``). Build with
    :func:`circuitkit.scan`.

    - ``head_scores``: :class:`~circuitkit.detect.HeadScores`, score name -> ``[L, H]`` in registry order,
      with ``.definitions`` (short name, description, kind, neutral value) for every score;
    - ``tokens``, ``patterns``: the first sequence's token strings and every head's attention on it,
      ``[L, H, pos, pos]`` (rows are queries);
    - ``induction_loss``: per-position loss and its first-copy / repeated-copies means;
    - ``attribution`` / ``ablation`` / ``agreement``: :class:`HeadEffects` and :class:`Agreement` (None when
      not computed);
    - ``composition``: mode ``"Q" | "K" | "V"`` -> ``[L, H, L, H]`` (src layer < dst layer only; 0 elsewhere),
      ``baselines``: mode -> :class:`~circuitkit.CompositionBaseline`, ``edges``: mode -> top
      :class:`~circuitkit.Edge` list;
    - ``spectra``: ``"QK" | "OV"`` -> ``[L, H, d_head]`` singular values, descending;
    - ``circuit``: edge-level causal evidence (:class:`circuitkit.circuits.CircuitEvidence`) or None;
    - ``called``: score name -> the heads that score calls, for the score of each of the scan's roles
      (:mod:`circuitkit.detect.roles`: the threshold and the roles); ``induction_heads``,
      ``previous_token_heads``: those the ``"induction"`` / ``"previous_token"`` scores call (properties of
      ``called``; as keyword arguments they set its entries);
    - ``circuit_ablation``: the rise of the repeated-copies loss with a group of heads ablated together: each
      role's (``"induction heads"``, ``"previous-token heads"``), then ``"circuit"`` (all of them), where the group
      is non-empty;
    - ``verified``: the circuit found by faithfulness (:class:`circuitkit.circuits.faithfulness.Circuit`: its
      heads, faithfulness, necessity, curve, exactly patched edges and roles) or None, with ``verified_error``
      saying why where the scan tried and could not (e.g. no head changes the loss);
    - ``stages``: the stages the scan ran, with their cost in forward passes and seconds (not saved: timings);
    - ``intervals``: the bootstrap intervals of the figures over the batch's sequences
      (:func:`circuitkit.scan_intervals.scan_intervals`; the circuit's own are ``verified.intervals``).
    """

    model: ModelSummary
    settings: ScanSettings
    head_scores: HeadScores
    tokens: tuple[str, ...]
    patterns: Float[Tensor, "layer head pos pos"]
    induction_loss: InductionLoss
    attribution: HeadEffects | None = None
    ablation: HeadEffects | None = None
    agreement: Agreement | None = None
    composition: Mapping[str, Float[Tensor, "layer head layer head"]] = field(default_factory=dict)
    baselines: Mapping[str, CompositionBaseline] = field(default_factory=dict)
    edges: Mapping[str, list[Edge]] = field(default_factory=dict)
    spectra: Mapping[str, Float[Tensor, "layer head k"]] = field(default_factory=dict)
    circuit: CircuitEvidence | None = None
    called: Mapping[str, tuple[Head, ...]] = field(default_factory=dict)
    induction_heads: InitVar[tuple[Head, ...] | None] = None
    previous_token_heads: InitVar[tuple[Head, ...] | None] = None
    circuit_ablation: Mapping[str, float] = field(default_factory=dict)
    verified: Circuit | None = None
    verified_error: str | None = None
    stages: tuple[StageRecord, ...] = ()
    intervals: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self, induction_heads: tuple[Head, ...] | None,
                      previous_token_heads: tuple[Head, ...] | None) -> None:
        called = dict(self.called)
        for score, heads in (("induction", induction_heads), ("previous_token", previous_token_heads)):
            # the keyword arguments of the two default roles' scores (dataclasses.replace passes the properties
            # back: an empty one adds no score the scan did not call by)
            if heads is not None and (heads or score in called):
                called[score] = tuple(heads)
        object.__setattr__(self, "called", called)

    def called_by(self, score: str) -> tuple[Head, ...]:
        """The heads ``score`` calls (best first; () where no role of the scan reads ``score``)."""
        return tuple(self.called.get(score, ()))

    def top(self, score: str | None = None, k: int = 5) -> list[tuple[Head, float]]:
        """The ``k`` best heads by ``score`` (a head-score name, ``"attribution"`` or ``"ablation"``; None: the
        induction score, the head table's default order)."""
        score = "induction" if score is None else score
        if score in ("attribution", "ablation"):
            effects = getattr(self, score)
            if effects is None:
                from circuitkit.validate import fail

                raise fail("Scan.top: score", score, f"a score this scan computed ({score} was not run)")
            return effects.top(k)
        return self.head_scores.top(score, k)

    def __repr__(self) -> str:
        m = self.model
        return (
            f"Scan({m.name}: {m.n_layers} layers x {m.n_heads} heads; induction heads "
            f"{[f'{a}.{b}' for a, b in self.induction_heads]}, previous-token heads "
            f"{[f'{a}.{b}' for a, b in self.previous_token_heads]}"
            + ("" if self.verified is None else f"; circuit {[f'{a}.{b}' for a, b in self.verified.heads]} "
               f"faithfulness {self.verified.faithfulness:.2f}")
            + ")"
        )


ScanRecord.induction_heads = property(lambda self: self.called_by("induction"),  # type: ignore[assignment]
                                      doc="The heads the induction score calls (best first).")
ScanRecord.previous_token_heads = property(  # type: ignore[assignment]
    lambda self: self.called_by("previous_token"), doc="The heads the previous-token score calls (best first).")


class ScanResult(abc.ABC):
    """What every scan's result answers, whichever behaviour it measured: the induction scan's
    :class:`~circuitkit.Scan` and a task's :class:`~circuitkit.tasks.TaskScan` are both one
    (``isinstance(result, circuitkit.ScanResult)``), so code that reads a scan takes either. Each answers in its own
    figures (the induction scan's loss on the copies, a task's metric); the questions and their names are one:

    - ``answer()``: the terminal's answer as text; ``passes``: forward passes of the batch its stages ran;
    - ``verified`` / ``verified_error``: the circuit found (a :class:`~circuitkit.CircuitRecord`) or why none was;
    - ``table(sort)`` / ``to_pandas(sort)``: one row per head; ``top(score, k)``: the largest heads by a column;
    - ``to_json()``, ``save(dir, png=)``, ``load(path)`` (``Scan.load`` reads either kind back), the notebook view.
    """

    @abc.abstractmethod
    def answer(self) -> str:
        """The answer in a few lines of plain text, as the terminal prints it."""

    @property
    @abc.abstractmethod
    def passes(self) -> float:
        """Forward passes of the batch the scan's stages ran (stacked copies count one each)."""

    @abc.abstractmethod
    def table(self, sort: str | None = None) -> list[dict[str, Any]]:
        """One dict per head, largest ``sort`` first (each scan's default column)."""

    @abc.abstractmethod
    def to_pandas(self, sort: str | None = None) -> Any:
        """:meth:`table` as a ``pandas.DataFrame`` indexed by head."""

    @abc.abstractmethod
    def top(self, score: str | None = None, k: int = 5) -> list[tuple[Head, float]]:
        """The ``k`` heads with the largest ``score`` (each scan's default column where None), largest first."""

    @abc.abstractmethod
    def to_json(self) -> dict[str, Any]:
        """What ``scores.json`` holds."""

    @abc.abstractmethod
    def save(self, out_dir: str | os.PathLike, *, png: bool = False) -> SavedReport:
        """Write ``report.html`` and ``scores.json`` into ``out_dir`` together (with ``png``: the page's PNGs)."""

    @classmethod
    @abc.abstractmethod
    def load(cls, path: str | os.PathLike) -> ScanResult:
        """The scan :meth:`save` wrote into ``path``, read back."""

    @abc.abstractmethod
    def _repr_html_(self) -> str:
        """The notebook view: the answer first, then the top of the head table."""


@dataclass(frozen=True)
class SavedReport:
    """The files :meth:`circuitkit.scan_types.Scan.save` wrote."""

    report: Path
    scores: Path
    pngs: tuple[Path, ...] = ()


__all__ = ["LISTING_SIZES", "UNSAVED", "ModelSummary", "SavedReport", "ScanRecord", "ScanResult", "ScanSettings",
           "StageRecord", "summarise_model"]
