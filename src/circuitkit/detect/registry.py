"""The score registry: every head score is one :class:`ScoreDefinition`, registered once.

Why: a score used to be four edits in three files (a target table, a special case in ``head_scores``, a list
of names, the command line's column labels). Now a score is one definition; :func:`circuitkit.head_scores`,
:func:`circuitkit.scan`, the command-line table, the report and ``scores.json`` all iterate the registry.

Two kinds:

- **pattern** scores read attention patterns on repeated random tokens. ``targets(tokens) -> [batch, q, k]``
  marks where a head of this type attends; the score of head ``h`` is

      score_h = sum_{b,q,k} A_h[b,q,k] M[b,q,k] / #{(b,q) : row q of M[b] has a target}

  so a head that puts all its attention on its targets scores exactly 1.0. Its ``neutral`` value (what a
  head attending uniformly to every earlier position scores, on the same batch) is computed per batch:
  ``mean over rows with a target of #targets(row) / (q + 1)``.
- **weight** scores are functions of the weights alone: ``compute(HeadWeights) -> [layer, head]`` (or ``None``
  when the model lacks what the score needs, e.g. no unembedding), with a fixed ``neutral``.

Register your own::

    from circuitkit import detect

    detect.register(detect.pattern_score(
        "successor", short="succ", description="attention to the token after the previous copy's successor",
        targets=lambda tokens: ...,  # [batch, pos] -> [batch, q, k] bool
    ))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

from torch import Tensor

from circuitkit import validate
from circuitkit.errors import CircuitkitError

ScoreKind = Literal["pattern", "weight"]
Targets = Callable[[Tensor], Tensor]
RowReader = Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class ScoreDefinition:
    """One head score (see the module docstring).

    ``reader``: optional fast path for pattern scores with exactly one fixed target key per query row
    ``1 .. pos-1``: ``patterns [batch, head, q, k] -> [batch, head, pos - 1]`` (a view of the pattern), used
    instead of contracting with the mask; it must select the same entries as ``targets``.
    """

    name: str
    short: str
    description: str
    kind: ScoreKind
    targets: Targets | None = None
    reader: RowReader | None = None
    compute: Callable[[Any], Tensor | None] | None = None
    neutral: float | None = None

    def with_neutral(self, neutral: float | None) -> ScoreDefinition:
        return replace(self, neutral=neutral)


_REGISTRY: dict[str, ScoreDefinition] = {}


def _check_text(field: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise validate.fail(f"score definition: {field}", value, "a non-empty string")
    return value


def pattern_score(
    name: str, *, short: str, description: str, targets: Targets, reader: RowReader | None = None
) -> ScoreDefinition:
    """A pattern score: ``targets(tokens [batch, pos]) -> [batch, q, k]`` bool mask of the keys to attend to."""
    if not callable(targets):
        raise validate.fail("pattern_score: targets", targets, "a function tokens [batch, pos] -> [batch, q, k] bool")
    return ScoreDefinition(
        name=_check_text("name", name),
        short=_check_text("short", short),
        description=_check_text("description", description),
        kind="pattern",
        targets=targets,
        reader=reader,
    )


def weight_score(
    name: str, *, short: str, description: str, compute: Callable[[Any], Tensor | None], neutral: float | None = None
) -> ScoreDefinition:
    """A weight score: ``compute(HeadWeights) -> [layer, head]`` (or None where it does not apply)."""
    if not callable(compute):
        raise validate.fail("weight_score: compute", compute, "a function HeadWeights -> [layer, head] tensor or None")
    if neutral is not None:
        neutral = validate.real("weight_score: neutral", neutral)
    return ScoreDefinition(
        name=_check_text("name", name),
        short=_check_text("short", short),
        description=_check_text("description", description),
        kind="weight",
        compute=compute,
        neutral=neutral,
    )


def register(definition: ScoreDefinition, *, replace_existing: bool = False) -> ScoreDefinition:
    """Add ``definition`` to the registry (a name already there is an error unless ``replace_existing``)."""
    if not isinstance(definition, ScoreDefinition):
        raise validate.fail("register: definition", definition, "a ScoreDefinition from pattern_score/weight_score")
    if definition.name in _REGISTRY and not replace_existing:
        raise CircuitkitError(
            f"register: given score {definition.name!r}, which is already registered; expected a new name "
            "(or replace_existing=True to redefine it)."
        )
    if not replace_existing and any(d.short == definition.short for d in _REGISTRY.values()):
        raise CircuitkitError(
            f"register: given short name {definition.short!r}, already used by another score; expected a unique "
            "column label."
        )
    _REGISTRY[definition.name] = definition
    return definition


def unregister(name: str) -> ScoreDefinition:
    """Remove a registered score and return its definition."""
    definition = get(name)
    del _REGISTRY[name]
    return definition


def get(name: str) -> ScoreDefinition:
    """The definition of a registered score."""
    if not isinstance(name, str) or name not in _REGISTRY:
        raise validate.fail("score", name, f"one of {', '.join(repr(n) for n in _REGISTRY)}")
    return _REGISTRY[name]


def registered(kind: ScoreKind | None = None) -> tuple[ScoreDefinition, ...]:
    """The registered definitions in registration order (optionally only one ``kind``)."""
    if kind is not None:
        validate.option("registered: kind", kind, ("pattern", "weight"))
    return tuple(d for d in _REGISTRY.values() if kind is None or d.kind == kind)


def score_names() -> tuple[str, ...]:
    """Names of the registered scores, in order."""
    return tuple(_REGISTRY)


def _copying_where_readable(model: Any) -> Any:
    """The copying score, or None for a model whose weights cannot be read (a hooks-only model still gets its
    pattern scores; :func:`copying_scores` itself refuses such input)."""
    from circuitkit.detect.weight_scores import copying_scores
    from circuitkit.weights import HeadWeights

    try:
        weights = HeadWeights.from_model(model)
    except CircuitkitError:
        return None
    return copying_scores(weights)


def _register_builtins() -> None:
    from circuitkit.detect import targets as tokens

    register(pattern_score(
        "induction", short="induct", targets=tokens.induction_targets,
        description="attention from a repeated token to the token after its previous occurrence (Olsson et al.)",
    ))
    register(pattern_score(
        "previous_token", short="prev", targets=tokens.previous_targets,
        reader=lambda p: p.diagonal(offset=-1, dim1=-2, dim2=-1),  # p[i, i-1], i >= 1
        description="attention from each position to the one before it",
    ))
    register(pattern_score(
        "duplicate_token", short="dup", targets=tokens.duplicate_targets,
        description="attention from a repeated token to its earlier occurrences",
    ))
    register(pattern_score(
        "current_token", short="self", targets=tokens.current_targets,
        reader=lambda p: p.diagonal(dim1=-2, dim2=-1)[..., 1:],  # p[i, i], i >= 1
        description="attention from each position to itself",
    ))
    register(pattern_score(
        "first_token", short="first", targets=tokens.first_targets,
        reader=lambda p: p[..., 1:, 0],  # p[i, 0], i >= 1
        description="attention from each position to the first position (an attention sink)",
    ))
    register(weight_score(
        "copying", short="copy", compute=_copying_where_readable, neutral=0.0,
        description="Re(sum of eigenvalues) / sum |eigenvalues| of the full OV circuit W_E W_V W_O W_U: +1 copies",
    ))


_register_builtins()

__all__ = [
    "ScoreDefinition",
    "get",
    "pattern_score",
    "register",
    "registered",
    "score_names",
    "unregister",
    "weight_score",
]
