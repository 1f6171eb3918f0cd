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

A definition's functions are the user's code: they run inside a guard (:func:`targets_of`, :func:`read_rows`,
:func:`compute_scores`): an exception becomes one :class:`~circuitkit.CircuitkitError` naming the score and the
original error; the output is checked (a tensor of the promised shape, a real dtype, the input's device, finite
values); ``targets`` receives a copy of the tokens, so a function that writes into them changes nothing else.
Names and short names must not be a built-in table column (:data:`RESERVED_COLUMNS`).

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

import torch
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

RESERVED_COLUMNS = frozenset({
    "rank", "head", "layer", "attrib", "ablated", "attr", "ablate", "attribution", "ablation", "exact",
})
"""Column labels and keys the head tables (command line, report, ``scores.json``) use for other things than a
registered score; a score named (or short-named) so would be shown in, or sorted by, the wrong column."""


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
    for field, value in (("name", definition.name), ("short", definition.short)):
        if value.strip().lower() in RESERVED_COLUMNS:
            raise validate.fail(f"register: {field}", value,
                                f"a name that is not a built-in table column ({sorted(RESERVED_COLUMNS)})")
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


# ------------------------------------------------------------------------------ the user's code, guarded
def _guarded(definition: ScoreDefinition, what: str, function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)``; any exception it raises becomes one line naming the score and the original error."""
    try:
        return function(*args)
    except CircuitkitError as error:
        if f"score {definition.name!r}" in str(error):
            raise
        raise CircuitkitError(f"score {definition.name!r}: {what}: {_one_line(error)}") from error
    except Exception as error:  # noqa: BLE001 - the user's code: every error it raises is reported, labelled
        raise CircuitkitError(
            f"score {definition.name!r}: {what} raised {type(error).__name__}: {_one_line(error)}; expected it to "
            "run on the documented input (see circuitkit.detect.registry). Fix the function or unregister the score."
        ) from error


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text[:300] + ("..." if len(text) > 300 else "")


def targets_of(definition: ScoreDefinition, tokens: Tensor) -> Tensor:
    """The pattern score's ``[batch, q, k]`` bool target mask on ``tokens`` ``[batch, pos]``, guarded: the function
    receives a copy of the tokens; its result must be a bool tensor of that shape on the tokens' device."""
    mask = _guarded(definition, "targets(tokens)", definition.targets, tokens.clone())
    expected = f"a bool tensor [batch, q, k] = {[*tokens.shape, tokens.shape[1]]} on {tokens.device}"
    if (not isinstance(mask, Tensor) or mask.shape != (*tokens.shape, tokens.shape[1]) or mask.dtype != torch.bool
            or mask.device != tokens.device or mask.layout != torch.strided):
        raise validate.fail(f"score {definition.name!r}: targets(tokens)", mask, expected)
    return mask


def read_rows(definition: ScoreDefinition, patterns: Tensor) -> Tensor:
    """The pattern score's fast ``reader``, guarded: ``patterns [batch, head, q, k] -> [batch, head, pos - 1]``,
    real floating, on the patterns' device."""
    rows = _guarded(definition, "reader(patterns)", definition.reader, patterns)
    batch, heads, pos, _ = patterns.shape
    if (not isinstance(rows, Tensor) or tuple(rows.shape) != (batch, heads, pos - 1) or not rows.is_floating_point()
            or rows.device != patterns.device):
        raise validate.fail(f"score {definition.name!r}: reader(patterns)", rows,
                            f"a real floating tensor [batch, head, pos - 1] = {[batch, heads, pos - 1]} on "
                            f"{patterns.device}")
    return rows


def compute_scores(definition: ScoreDefinition, source: Any, n_layers: int, n_heads: int) -> Tensor | None:
    """The weight score of every head (``[layer, head]`` float32 on the CPU), or None where it does not apply;
    guarded: the result must be a real tensor of that shape holding data (not on ``meta``), every value finite
    (a NaN or inf score is refused, not saved as ``null``)."""
    value = _guarded(definition, "compute(weights)", definition.compute, source)
    if value is None:
        return None
    name = f"score {definition.name!r}: compute(weights)"
    if (not isinstance(value, Tensor) or tuple(value.shape) != (n_layers, n_heads)
            or not (value.is_floating_point() or value.dtype in (torch.int32, torch.int64))
            or value.is_meta or value.layout != torch.strided):
        raise validate.fail(name, value, f"a real tensor [layer, head] = {[n_layers, n_heads]} holding data, or None")
    value = value.detach().float().cpu()
    bad = int((~torch.isfinite(value)).sum())
    if bad:
        raise validate.fail(name, validate.given(f"{bad} NaN or infinite scores of {value.numel()}"),
                            "a finite score for every head", "A score that divides by zero needs a guard "
                            "(return 0 or the neutral value there).")
    return value


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
    "RESERVED_COLUMNS",
    "ScoreDefinition",
    "compute_scores",
    "read_rows",
    "targets_of",
    "get",
    "pattern_score",
    "register",
    "registered",
    "score_names",
    "unregister",
    "weight_score",
]
