"""The two result types every measurement returns or reads: per-head values and per-edge values.

Why: a quantity measured per head (a score, an ablation effect) or per edge between heads (a composition score, an
edge attribution, a path-patching effect) is ranked, named and written to JSON the same way whoever measured it.
Here each of those is written once:

- :class:`HeadValues`: a ``[layer, head]`` tensor. Heads are named ``"layer.head"``; :meth:`HeadValues.top`
  ranks through :func:`circuitkit.ranking.top_heads` (stable ties, NaN last).
- :class:`EdgeValues`: a ``[src_layer, src_head, dst_layer, dst_head, input]`` tensor, the graph
  ``[sender, receiver, input]``: the sender's output read through the receiver's ``input`` (its query, key or value
  input, :data:`CHANNELS`; ``"all"`` where the three were patched together). An edge exists only for
  ``src layer < dst layer``.
- :class:`Edge`: the one record of an edge, ``src``, ``dst``, ``channel`` and the values measured on it by name
  (``edge.attribution`` reads the ``"attribution"`` value). The records the measurements used to return
  (``composition.Edge``, ``EdgeSpec``, ``AttributedEdge``, ``EdgeEvidence``) are thin constructors of it that keep
  their old arguments. An exactly patched edge is recorded apart, in both engines' one record
  (:class:`circuitkit.edge_effect.EdgeEffect`): its ends may be the input, an MLP or the logits.

NaN means "not measured" (or "not an edge"), in both types; :func:`plain` writes it, and every non-finite value,
as JSON ``null``. The input is spelled in lower case (``"q"``, ``"k"``, ``"v"``) everywhere; :func:`channel` also
takes the composition modes' upper case (``"Q"``), where the public functions took it before.

All tensors are held on the CPU, as float32 (values given in float64 stay float64).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from circuitkit import validate
from circuitkit.ranking import Head, head_name, top_heads, top_indices, unravel

CHANNELS: tuple[str, ...] = ("q", "k", "v")
"""The receiver's inputs an edge is read through, in the order of :class:`EdgeValues`' last axis."""
INPUTS: tuple[str, ...] = (*CHANNELS, "all")
"""What an edge can be patched through: one channel, or ``"all"`` three at once."""


def channel(value: Any, where: str, options: Sequence[str] = CHANNELS) -> str:
    """``value`` as the lower-case input name (``"Q"`` -> ``"q"``), one of ``options``; else a ``CircuitkitError``."""
    if isinstance(value, str) and value.lower() in options and value in (value.lower(), value.upper()):
        value = value.lower()
    return validate.option(where, value, tuple(options))


def edge_name(src: Sequence[int], dst: Sequence[int], input: str | None = None) -> str:
    """``"0.1 -> 1.3 (k)"`` (without the input: ``"0.1 -> 1.3"``)."""
    name = f"{head_name(src)} -> {head_name(dst)}"
    return name if input is None else f"{name} ({input})"


def graph_edge_name(src: Sequence[int], dst: Sequence[int], input: str | None = None) -> str:
    """The same edge as a task graph names it (a task scan's answer, ``scores.json`` and
    :func:`circuitkit.tasks.edge_effects`): ``"0.1->1.3:k"`` (without the input: ``"0.1->1.3"``). ``src`` and
    ``dst``: heads ``(layer, head)`` of non-negative ints; ``input``: one of :data:`INPUTS` (upper case read as
    :func:`channel` reads it) or None."""
    for where, head in (("src", src), ("dst", dst)):
        if not (isinstance(head, (tuple, list)) and len(head) == 2):
            raise validate.fail(f"graph_edge_name: {where}", head, "a head (layer, head) of two non-negative ints")
        for value in head:
            validate.integer(f"graph_edge_name: {where}", value, minimum=0)
    input = None if input is None else channel(input, "graph_edge_name: input", INPUTS)
    name = f"{head_name(src)}->{head_name(dst)}"
    return name if input is None else f"{name}:{input}"


MAX_EDGE_NAME = 64
"""Longest edge name :func:`parse_edge_name` reads (``"65535.65535 -> 65535.65535 (all)"`` is 32 characters)."""
_EDGE_NAME = re.compile(r"(\d{1,9})\.(\d{1,9}) {0,3}(?:->|\u2192) {0,3}(\d{1,9})\.(\d{1,9})"  # sender -> receiver
                        r"(?: {0,3}\(([A-Za-z]{1,3})\)|:([A-Za-z]{1,3})| {1,3}([A-Za-z]{1,3}))?")  # " (k)", ":k", " K"


def parse_edge_name(text: Any, where: str) -> tuple[Head, Head, str | None]:
    """``(src, dst, input)`` of an edge between two heads named any way circuitkit writes one: :func:`edge_name`
    (``"0.1 -> 1.3 (k)"``, the records of path patching and edge attribution), :func:`graph_edge_name`
    (``"0.1->1.3:k"``, a task scan's) or as the induction scan's answer prints it (``"0.1 \u2192 1.3 K"``).
    ``input``: None where the name has none, else in lower case (``"K"`` read as :func:`channel` reads it). Whether
    the heads exist is the caller's check; a name of anything else (an MLP, the logits, a key/value group) is a
    ``CircuitkitError`` saying what is read."""
    expected = ("an edge between two heads named '0.1 -> 1.3 (k)', '0.1->1.3:k' or '0.1 \u2192 1.3 K' (the input "
                "optional)")
    if not isinstance(text, str) or len(text) > MAX_EDGE_NAME:
        raise validate.fail(where, text, expected)
    found = _EDGE_NAME.fullmatch(text.strip())
    if found is None:
        raise validate.fail(where, text, expected, "An edge from or to the input, an MLP (mN), the logits or a "
                            "key/value group (L.gG) is a task graph's: circuitkit.tasks.edge_effects measures it."
                            if "->" in text or "\u2192" in text else "")
    l1, h1, l2, h2, paren, colon, spaced = found.groups()
    named = paren or colon or spaced
    return (int(l1), int(h1)), (int(l2), int(h2)), None if named is None else channel(named, where, INPUTS)


def plain(value: Any) -> float | None:
    """``value`` as a float, or None for None, NaN and infinities (JSON's "not measured")."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


# ---------------------------------------------------------------------------------------------- the edge record
@dataclass(frozen=True)
class Edge:
    """One edge ``src = (layer, head) -> dst = (layer, head)`` through the receiver's input ``channel``
    (``None`` where the quantity is not read through one input, e.g. a composition score listed per mode) and
    ``values``: ``(name, value)`` pairs of what was measured on it (None: not measured), each readable as an
    attribute (``edge.attribution``); ``flags``: names of the boolean marks an edge table gave it, readable as
    attributes too (``edge.weight_only``)."""

    src: Head
    dst: Head
    channel: str | None = None
    values: tuple[tuple[str, float | None], ...] = ()
    flags: frozenset[str] = field(default_factory=frozenset)

    @property
    def name(self) -> str:
        """``"0.1 -> 1.3 (k)"``, or ``"0.1 -> 1.3"`` without a channel."""
        return edge_name(self.src, self.dst, self.channel)

    @property
    def input(self) -> str | None:
        """The receiver's input the edge is read through (the same as ``channel``)."""
        return self.channel

    @property
    def key(self) -> tuple[Head, Head, str | None]:
        """``(src, dst, channel)``: what identifies the edge in a table."""
        return self.src, self.dst, self.channel

    @property
    def measures(self) -> dict[str, float | None]:
        """The values by name, in the order they were measured."""
        return dict(self.values)

    def get(self, name: str, default: Any = None) -> Any:
        """The value named ``name`` (``default`` where the edge has none)."""
        return dict(self.values).get(name, default)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        state = object.__getattribute__(self, "__dict__")
        for key, value in state.get("values", ()):
            if key == name:
                return value
        if name in state.get("flags", ()):
            return True
        raise AttributeError(f"{type(self).__name__} has no attribute or measured value {name!r}")


def _real(where: str, value: Any, ndim: int) -> Tensor:
    """``value`` if it is a non-empty real (not complex, not bool) tensor with ``ndim`` axes and no infinities
    (NaN is allowed: "not measured")."""
    value = validate.tensor(where, value, ndim=ndim)
    if value.is_complex() or value.dtype == torch.bool or value.numel() == 0:
        raise validate.fail(where, value, "a non-empty real tensor (float or int)")
    if value.is_floating_point() and bool(value.isinf().any()):
        raise validate.fail(where, validate.given(f"{int(value.isinf().sum())} infinite values"),
                            "finite values, NaN where not measured")
    return value


def _dtype(values: Tensor) -> torch.dtype:
    """float64 stays float64 (an exact effect is a difference of two float64 metrics; a saved scan is read back in
    float64): the rest is held as float32."""
    return torch.float64 if values.dtype == torch.float64 else torch.float32


def _name(where: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise validate.fail(where, value, "a non-empty name (str)")
    return value


def _head_pair(value: Any) -> Head:
    return int(value[0]), int(value[1])


def make_edge(src: Any, dst: Any, input: str | None, values: Mapping[str, float | None] | Iterable = (),
              flags: Iterable[str] = ()) -> Edge:
    """An :class:`Edge` from heads given as any pair of ints and ``values`` as a mapping or pairs."""
    items = tuple(values.items()) if isinstance(values, Mapping) else tuple(values)
    return Edge(_head_pair(src), _head_pair(dst), input, items, frozenset(flags))


# ---------------------------------------------------------------------------------------------- per head
@dataclass(frozen=True, eq=False)
class HeadValues:
    """A quantity per head: ``values`` ``[layer, head]`` (float32 or float64, CPU; NaN: not measured), named
    ``name``."""

    values: Tensor
    name: str = "value"

    def __post_init__(self) -> None:
        _name("HeadValues: name", self.name)
        values = _real(f"HeadValues({self.name!r}): values", self.values, 2)
        object.__setattr__(self, "values", values.detach().to("cpu", _dtype(values)))

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.values.shape)  # type: ignore[return-value]

    @property
    def measured(self) -> Tensor:
        """``[layer, head]`` bool: where a value was measured (not NaN)."""
        return ~self.values.isnan()

    def names(self) -> list[str]:
        """Every head's name ``"layer.head"``, in ``(layer, head)`` order."""
        L, H = self.shape
        return [head_name((a, b)) for a in range(L) for b in range(H)]

    def __getitem__(self, head: Sequence[int]) -> float:
        return float(self.values[head[0], head[1]])

    def top(self, k: int = 5, *, absolute: bool = False) -> list[tuple[Head, float]]:
        """The ``k`` best heads as ``((layer, head), value)``, largest first (``absolute``: largest ``|value|``);
        heads not measured are left out."""
        absolute = validate.boolean("HeadValues.top: absolute", absolute)
        return [(h, v) for h, v in top_heads(self.values, k, absolute=absolute) if not math.isnan(v)]

    def to_json(self) -> list[list[float | None]]:
        """Nested lists ``[layer][head]`` of floats, NaN (not measured) as None."""
        return [[plain(v) for v in row] for row in self.values.double().tolist()]

    def __repr__(self) -> str:
        best = ", ".join(f"{head_name(h)}: {v:+.4g}" for h, v in self.top(3, absolute=True))
        L, H = self.shape
        return f"HeadValues({self.name!r}, {L} layers x {H} heads; top {best})"


# ---------------------------------------------------------------------------------------------- per edge
@dataclass(frozen=True, eq=False)
class EdgeValues:
    """A quantity per edge: ``values`` ``[src_layer, src_head, dst_layer, dst_head, input]`` (float32 or float64,
    CPU), the
    last axis one entry per name in ``inputs`` (:data:`CHANNELS` by default); NaN where not measured and wherever
    ``src layer >= dst layer`` (not an edge)."""

    values: Tensor
    name: str = "value"
    inputs: tuple[str, ...] = CHANNELS

    def __post_init__(self) -> None:
        _name("EdgeValues: name", self.name)
        if (not isinstance(self.inputs, tuple) or not self.inputs
                or any(i not in INPUTS for i in self.inputs) or len(set(self.inputs)) != len(self.inputs)):
            raise validate.fail("EdgeValues: inputs", self.inputs, f"a tuple of distinct inputs from {list(INPUTS)}")
        values = _real(f"EdgeValues({self.name!r}): values", self.values, 5)
        L, H = values.shape[0], values.shape[1]
        if tuple(values.shape) != (L, H, L, H, len(self.inputs)):
            raise validate.fail(f"EdgeValues({self.name!r}): values", values,
                                f"a [src_layer, src_head, dst_layer, dst_head, input] tensor of shape "
                                f"{[L, H, L, H, len(self.inputs)]} (inputs {list(self.inputs)})")
        values = values.detach().to("cpu", _dtype(values))
        object.__setattr__(self, "values", torch.where(edge_mask(L, H, len(self.inputs)), values, math.nan))

    @classmethod
    def empty(cls, n_layers: int, n_heads: int, name: str = "value", inputs: tuple[str, ...] = CHANNELS
              ) -> EdgeValues:
        """Nothing measured yet: all NaN."""
        return cls(torch.full((n_layers, n_heads, n_layers, n_heads, len(inputs)), math.nan), name, inputs)

    @classmethod
    def from_edges(cls, edges: Iterable[tuple[Head, Head, str, float]], n_layers: int, n_heads: int,
                   name: str = "value") -> EdgeValues:
        """The values of the listed edges ``(src, dst, input, value)``; NaN elsewhere (the inputs are
        :data:`CHANNELS`, or :data:`INPUTS` where an edge was read through ``"all"``)."""
        edges = list(edges)
        inputs = INPUTS if any(e[2] == "all" for e in edges) else CHANNELS
        values = torch.full((n_layers, n_heads, n_layers, n_heads, len(inputs)), math.nan, dtype=torch.float64)
        for src, dst, input, value in edges:
            values[src[0], src[1], dst[0], dst[1], inputs.index(input)] = float(value)
        return cls(values, name, inputs)

    @property
    def n_layers(self) -> int:
        return int(self.values.shape[0])

    @property
    def n_heads(self) -> int:
        return int(self.values.shape[1])

    @property
    def measured(self) -> Tensor:
        """``[L, H, L, H, input]`` bool: where a value was measured (not NaN)."""
        return ~self.values.isnan()

    def input(self, name: str) -> Tensor:
        """The ``[src_layer, src_head, dst_layer, dst_head]`` values through input ``name`` (``"q"`` or ``"Q"``)."""
        return self.values[..., self.inputs.index(channel(name, f"EdgeValues({self.name!r}).input", self.inputs))]

    def value(self, src: Sequence[int], dst: Sequence[int], input: str) -> float:
        """One edge's value (NaN where not measured)."""
        return float(self.input(input)[src[0], src[1], dst[0], dst[1]])

    def edges(self) -> list[Edge]:
        """Every measured edge, in ``(src, dst, input)`` order."""
        index = self.measured.reshape(-1).nonzero().flatten().tolist()
        return [self._edge(i) for i in index]

    def names(self) -> list[str]:
        """The names ``"0.1 -> 1.3 (k)"`` of the measured edges, in :meth:`edges` order."""
        return [e.name for e in self.edges()]

    def top(self, k: int = 10, *, absolute: bool = True, input: str | None = None) -> list[Edge]:
        """The ``k`` edges with the largest value (``absolute``, the default: the largest ``|value|``), all inputs
        or one, as :class:`Edge` records holding this value under :attr:`name`; ties in ``(src, dst, input)``
        order; edges not measured are left out."""
        k = validate.positive_int(f"EdgeValues({self.name!r}).top: k", k)
        absolute = validate.boolean(f"EdgeValues({self.name!r}).top: absolute", absolute)
        values = self.values if input is None else self.input(input)[..., None]
        inputs = self.inputs if input is None else (channel(input, "EdgeValues.top: input", self.inputs),)
        n = int((~values.isnan()).sum())
        if n == 0:
            return []
        L, H = self.n_layers, self.n_heads
        out = []
        for index, value in top_indices(values, min(k, n), absolute=absolute):
            l1, h1, l2, h2, c = unravel(index, (L, H, L, H, len(inputs)))
            out.append(make_edge((l1, h1), (l2, h2), inputs[c], {self.name: value}))
        return out

    def to_json(self) -> dict[str, Any]:
        """``{"name", "inputs", "values"}``, ``values`` nested lists ``[src_layer][src_head][dst_layer][dst_head]
        [input]`` of floats, None where not measured."""
        nested = [[[[[plain(v) for v in c] for c in h2] for h2 in l2] for l2 in h1]
                  for h1 in self.values.double().tolist()]
        return {"name": self.name, "inputs": list(self.inputs), "values": nested}

    def _edge(self, index: int) -> Edge:
        L, H = self.n_layers, self.n_heads
        l1, h1, l2, h2, c = unravel(index, (L, H, L, H, len(self.inputs)))
        return make_edge((l1, h1), (l2, h2), self.inputs[c], {self.name: float(self.values.reshape(-1)[index])})

    def __repr__(self) -> str:
        best = ", ".join(f"{e.name}: {e.get(self.name):+.4g}" for e in self.top(3))
        return f"EdgeValues({self.name!r}, {self.n_layers} layers x {self.n_heads} heads; top {best})"


def edge_mask(n_layers: int, n_heads: int, n_inputs: int = len(CHANNELS)) -> Tensor:
    """``[L, H, L, H, n_inputs]`` bool: True where ``src layer < dst layer`` (an edge)."""
    layers = torch.arange(n_layers, device="cpu")
    return (layers[:, None, None, None, None] < layers[None, None, :, None, None]).expand(
        n_layers, n_heads, n_layers, n_heads, n_inputs)


__all__ = ["CHANNELS", "INPUTS", "Edge", "EdgeValues", "HeadValues", "channel", "edge_mask", "edge_name",
           "graph_edge_name", "make_edge", "parse_edge_name", "plain"]
