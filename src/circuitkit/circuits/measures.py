"""The edge-measure registry: every per-edge quantity the evidence table shows is one :class:`EdgeMeasure`,
registered once.

Why: an edge measure used to be an edit in every file that shows one (the evidence record, its JSON, the report's
table, the reader of a saved scan). Now :func:`circuitkit.circuits.circuit_evidence` computes every registered
measure in registration order and gives each row of its table the measure's value; ``scores.json``
(``evidence.rows[i][name]``) and the report's evidence table (one column per measure) iterate the registry. The
built-in measures, registered at the bottom of this module:

- ``composition``: the raw Q/K/V composition score of the edge (input ``q`` against Q-composition, ...);
- ``attribution``: edge attribution, the first-order (or integrated-gradients) estimate of the metric's change;
- ``patched``: the exact path-patching effect, measured only on the edges patched (NaN, "not measured", elsewhere).

A measure's ``compute(inputs: EdgeInputs) -> EdgeValues | Tensor [L, H, L, H, 3]`` reads what the evidence
measured (:class:`EdgeInputs`: the composition scores, the attribution and path patching results and the values
of every measure registered before it) and returns the value of every edge, NaN where it measures none. It is the
user's code: it runs guarded (an exception becomes one :class:`~circuitkit.CircuitkitError` naming the measure)
and its result is checked (shape, real dtype, no infinities). Register your own::

    from circuitkit.circuits import measures

    measures.register(measures.edge_measure(
        "weighted", column="composition x attribution",
        description="composition score times edge attribution",
        compute=lambda inputs: inputs.measured["composition"].values * inputs.measured["attribution"].values,
    ))
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from circuitkit import validate
from circuitkit.errors import CircuitkitError
from circuitkit.results import CHANNELS, EdgeValues, edge_mask


@dataclass(frozen=True)
class EdgeInputs:
    """What an edge measure may read: the model's shape, the composition scores (``channel -> [L, H, L, H]``,
    the channels given), the edge attribution (:class:`~circuitkit.circuits.EdgeAttribution`) and path patching
    (:class:`~circuitkit.circuits.PathPatching`) the evidence ran, ``measured``: the values of the measures
    registered before this one, by name, and ``context``: the prepared model and batch they were measured on (read
    its caches before running a pass of your own)."""

    n_layers: int
    n_heads: int
    composition: Mapping[str, Tensor]
    attribution: Any
    patching: Any
    measured: Mapping[str, EdgeValues] = field(default_factory=dict)
    context: Any = None


Compute = Callable[[EdgeInputs], "EdgeValues | Tensor"]


@dataclass(frozen=True)
class EdgeMeasure:
    """One edge measure: ``name`` (its key in an evidence row, ``scores.json`` and an attribute of each row),
    ``column`` (its heading in the report's evidence table), ``description`` (with its unit) and ``compute``."""

    name: str
    column: str
    description: str
    compute: Compute


RESERVED_NAMES = frozenset({
    "src", "dst", "channel", "input", "name", "key", "values", "flags", "measures", "get", "effect", "weight_only",
    "effect_only", "value", "score", "clean", "patched_each", "to_json", "of",
})
"""Attributes and JSON keys an edge record has besides its measured values: a measure named so would hide one."""

_REGISTRY: dict[str, EdgeMeasure] = {}


def _text(field_name: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise validate.fail(f"edge_measure: {field_name}", value, "a non-empty string")
    return value


def edge_measure(name: str, *, column: str, description: str, compute: Compute) -> EdgeMeasure:
    """An edge measure (see the module docstring); ``name`` must be a Python identifier (rows read it as an
    attribute) and not one of :data:`RESERVED_NAMES`."""
    name = _text("name", name)
    if not name.isidentifier() or name in RESERVED_NAMES:
        raise validate.fail("edge_measure: name", name, "a Python identifier that is not an edge record's own "
                            f"attribute ({sorted(RESERVED_NAMES)})")
    if not callable(compute):
        raise validate.fail("edge_measure: compute", compute, "a function EdgeInputs -> EdgeValues or an "
                            "[L, H, L, H, 3] tensor")
    return EdgeMeasure(name, _text("column", column), _text("description", description), compute)


def register(measure: EdgeMeasure, *, replace_existing: bool = False) -> EdgeMeasure:
    """Add ``measure`` to the registry, after those already there (a name already there is an error unless
    ``replace_existing``, which keeps its place)."""
    if not isinstance(measure, EdgeMeasure):
        raise validate.fail("register: measure", measure, "an EdgeMeasure from edge_measure(...)")
    replace_existing = validate.boolean("register: replace_existing", replace_existing)
    if measure.name in _REGISTRY and not replace_existing:
        raise CircuitkitError(f"register: given edge measure {measure.name!r}, which is already registered; expected "
                              "a new name (or replace_existing=True to redefine it).")
    _REGISTRY[measure.name] = measure
    return measure


def unregister(name: str) -> EdgeMeasure:
    """Remove a registered measure and return it."""
    measure = get(name)
    del _REGISTRY[name]
    return measure


def get(name: str) -> EdgeMeasure:
    """A registered measure by name."""
    if not isinstance(name, str) or name not in _REGISTRY:
        raise validate.fail("edge measure", name, f"one of {', '.join(repr(n) for n in _REGISTRY)}")
    return _REGISTRY[name]


def registered() -> tuple[EdgeMeasure, ...]:
    """The registered measures, in registration order."""
    return tuple(_REGISTRY.values())


def measure_names() -> tuple[str, ...]:
    """Names of the registered measures, in order."""
    return tuple(_REGISTRY)


def measure_all(inputs: EdgeInputs) -> dict[str, EdgeValues]:
    """Every registered measure's values, in registration order; each one's ``inputs.measured`` holds those
    before it."""
    measured: dict[str, EdgeValues] = {}
    for measure in registered():
        measured[measure.name] = compute(measure, EdgeInputs(
            inputs.n_layers, inputs.n_heads, inputs.composition, inputs.attribution, inputs.patching, dict(measured),
            inputs.context))
    return measured


def compute(measure: EdgeMeasure, inputs: EdgeInputs) -> EdgeValues:
    """``measure.compute(inputs)``, guarded: an exception becomes one ``CircuitkitError`` naming the measure; the
    result must be :class:`EdgeValues` or a real tensor ``[L, H, L, H, 3]`` (inputs :data:`CHANNELS`) with no
    infinities (NaN: not measured)."""
    where = f"edge measure {measure.name!r}: compute(inputs)"
    try:
        value = measure.compute(inputs)
    except CircuitkitError as error:
        raise CircuitkitError(f"{where}: {_one_line(error)}") from error
    except Exception as error:  # noqa: BLE001 - the user's code: every error it raises is reported, labelled
        raise CircuitkitError(f"{where} raised {type(error).__name__}: {_one_line(error)}; expected it to run on "
                              "EdgeInputs (see circuitkit.circuits.measures). Fix the function or unregister the "
                              "measure.") from error
    L, H = inputs.n_layers, inputs.n_heads
    shape = (L, H, L, H, len(CHANNELS))
    if isinstance(value, EdgeValues):
        if value.inputs != CHANNELS or tuple(value.values.shape) != shape:
            raise validate.fail(where, value, f"EdgeValues of shape {list(shape)} with inputs {list(CHANNELS)}")
        value = value.values
    if (not isinstance(value, Tensor) or tuple(value.shape) != shape or not value.is_floating_point()
            or value.is_meta or value.layout != torch.strided):
        raise validate.fail(where, value, f"EdgeValues or a real floating tensor {list(shape)} holding data")
    value = value.detach().to("cpu", torch.float64 if value.dtype == torch.float64 else torch.float32)
    if bool(value.isinf().any()):
        raise validate.fail(where, validate.given(f"{int(value.isinf().sum())} infinite values"),
                            "finite values, NaN where the edge is not measured")
    return EdgeValues(value, measure.name)


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text[:300] + ("..." if len(text) > 300 else "")


# ------------------------------------------------------------------------------ built-in measures
def _composition(inputs: EdgeInputs) -> Tensor:
    """Input ``c`` of each edge against its own composition mode; NaN for a channel not given."""
    L, H = inputs.n_layers, inputs.n_heads
    missing = torch.full((L, H, L, H), math.nan, device="cpu")
    return torch.stack([inputs.composition[c].float().cpu() if c in inputs.composition else missing for c in CHANNELS],
                       dim=-1)


def _attribution(inputs: EdgeInputs) -> EdgeValues:
    return inputs.attribution.edge_values


def _patched(inputs: EdgeInputs) -> Tensor:
    """The exact effect of each patched edge, in float64 (the difference of two float64 metrics)."""
    L, H = inputs.n_layers, inputs.n_heads
    values = torch.full((L, H, L, H, len(CHANNELS)), math.nan, dtype=torch.float64, device="cpu")
    for e in inputs.patching.edges:
        if e.channel in CHANNELS:
            values[e.src[0], e.src[1], e.dst[0], e.dst[1], CHANNELS.index(e.channel)] = e.effect
    return torch.where(edge_mask(L, H), values, math.nan)


def _register_builtins() -> None:
    register(edge_measure(
        "composition", column="composition", compute=_composition,
        description="raw Q/K/V composition score of the edge's input (ratio, dimensionless)",
    ))
    register(edge_measure(
        "attribution", column="edge attribution (estimate, nats)", compute=_attribution,
        description="edge attribution: estimated behaviour lost with the edge corrupted (the loss's rise in nats)",
    ))
    register(edge_measure(
        "patched", column="path patching (exact, nats)", compute=_patched,
        description="path patching: exact behaviour lost with the edge corrupted (the loss's rise in nats); "
                    "measured on the patched edges only",
    ))


_register_builtins()

__all__ = [
    "RESERVED_NAMES",
    "EdgeInputs",
    "EdgeMeasure",
    "compute",
    "edge_measure",
    "get",
    "measure_all",
    "measure_names",
    "register",
    "registered",
    "unregister",
]
