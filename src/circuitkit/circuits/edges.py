"""Edges between heads: ``sender (l1, h1) -> receiver (l2, h2)`` through one channel of the receiver's input.

Why a module: path patching, edge attribution and the evidence table must agree on what an edge is and refuse
the same bad ones. An edge exists only for ``l1 < l2`` (a head reads only what earlier layers wrote). The
channel says which input of the receiver the sender's output is read through: ``"q"`` (its queries), ``"k"``
(its keys), ``"v"`` (its values); :func:`circuitkit.circuits.path_patching` also takes ``"all"`` (the three at once).

Grouped-query attention: keys and values are computed once per key/value group and shared by the group's query
heads. circuitkit counts K and V edges **per query head**: the receiver ``(l2, h2)`` is always a query head; for
``"k"``/``"v"`` the group's key/value input is the one patched, but only query head ``h2`` reads the patched
version (the group's other heads keep their clean outputs). The group-level effect is, to first order, the sum
over the group's query heads.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from circuitkit import validate
from circuitkit.models.adapters import ModelSpec
from circuitkit.ranking import Head, head_name
from circuitkit.results import CHANNELS, INPUTS, Edge, parse_edge_name
from circuitkit.results import channel as as_channel

Channel = Literal["q", "k", "v"]


class EdgeSpec(Edge):
    """One edge to measure: ``src = (layer, head)`` feeds ``dst = (layer, head)`` through ``channel``, as an
    :class:`~circuitkit.results.Edge` with nothing measured yet.

    ``src`` and ``dst`` are pairs of non-negative ints with ``src`` layer < ``dst`` layer (stored as tuples);
    ``channel`` is one of :data:`INPUTS` (``"q"``, ``"k"``, ``"v"``, ``"all"``), upper case accepted and stored
    in lower case. Whether the heads exist in a model is checked where a model is at hand (:func:`parse_edges`).
    """

    def __init__(self, src: Head, dst: Head, channel: str) -> None:
        src = _pair("EdgeSpec: src", src)
        dst = _pair("EdgeSpec: dst", dst)
        if src[0] >= dst[0]:
            raise validate.fail(
                "EdgeSpec", validate.given(f"{head_name(src)} -> {head_name(dst)}"),
                "an edge from an earlier layer to a later one (src layer < dst layer)",
                "A head only reads what earlier layers wrote.",
            )
        super().__init__(src, dst, as_channel(channel, "EdgeSpec: channel", INPUTS))

    def __repr__(self) -> str:
        return f"EdgeSpec(src={self.src!r}, dst={self.dst!r}, channel={self.channel!r})"


MAX_HEAD_INDEX = 2**16 - 1
"""Largest layer or head index an :class:`EdgeSpec` takes without a model to check against: far above any model's
layer or head count, far below where an index stops fitting the int64 tensors it indexes."""


def _pair(where: str, value: Any) -> Head:
    """``value`` as a ``(layer, head)`` tuple of ints in ``[0, MAX_HEAD_INDEX]`` (no model, so no tighter bound)."""
    if not (isinstance(value, (tuple, list)) and len(value) == 2):
        raise validate.fail(where, value, "a head (layer, head) of two non-negative ints, e.g. (0, 1)")
    layer = validate.integer(f"{where} layer", value[0], minimum=0, maximum=MAX_HEAD_INDEX)
    head = validate.integer(f"{where} head", value[1], minimum=0, maximum=MAX_HEAD_INDEX)
    return layer, head


def _head(where: str, value: Any, spec: ModelSpec) -> Head:
    if not (isinstance(value, (tuple, list)) and len(value) == 2):
        raise validate.fail(where, value, "a head (layer, head), e.g. (0, 1)")
    layer = validate.integer(f"{where} layer", value[0], minimum=0, maximum=spec.n_layers - 1)
    head = validate.integer(f"{where} head", value[1], minimum=0, maximum=spec.n_heads - 1)
    return layer, head


def parse_edges(edges: Any, channel: str, spec: ModelSpec, *, where: str = "edges") -> list[EdgeSpec]:
    """``edges`` as :class:`EdgeSpec` s, validated against the model's sizes.

    Each item is ``(src, dst)`` (read through ``channel``), ``(src, dst, channel)``, an object with ``src`` and
    ``dst`` attributes (a :class:`circuitkit.Edge`, an :class:`EdgeSpec`, an ``EdgeEvidence``; its own ``channel``
    attribute, if any, wins), or an edge's name as circuitkit writes it, ``"0.1 -> 1.3 (k)"`` (the records),
    ``"0.1->1.3:k"`` (a task scan) or ``"0.1 \u2192 1.3 K"`` (the induction scan's answer)
    (:func:`~circuitkit.results.parse_edge_name`; its input, if any, wins; one name alone is a list of one), or a
    record that names its edge so (an :class:`~circuitkit.edge_effect.EdgeEffect` of either engine).
    ``channel`` is one of :data:`INPUTS`. Raises one ``CircuitkitError`` per bad edge: not a pair of heads, out of
    range, ``src layer >= dst layer``, unknown channel; and for an empty list.
    """
    channel = validate.option(f"{where}: input", channel, INPUTS)
    if isinstance(edges, str):
        edges = [edges]
    if isinstance(edges, bytes) or not isinstance(edges, Iterable):
        raise validate.fail(where, edges, "a list of edges ((src_layer, src_head), (dst_layer, dst_head))")
    L, H = spec.n_layers, spec.n_heads
    limit = L * (L - 1) // 2 * H * H * len(INPUTS)
    items = validate.bounded_list(where, edges, max(limit, 1), "a list of edges ((src_layer, src_head), (dst_layer, "
                                  "dst_head))", why=f"every edge of {L} x {H} heads once per input {list(INPUTS)}")
    if not items:
        raise validate.fail(where, items, "at least one edge ((src_layer, src_head), (dst_layer, dst_head))")
    out = []
    for i, item in enumerate(items):
        label = f"{where}[{i}]"
        own = channel
        if getattr(item, "src", None) is not None and getattr(item, "dst", None) is not None:
            src, dst = item.src, item.dst
            own = getattr(item, "channel", None) or channel  # a composition edge has no channel: None
        elif isinstance(item, (tuple, list)) and len(item) in (2, 3):
            src, dst = item[0], item[1]
            if len(item) == 3:
                own = item[2]
        elif isinstance(item, str) or isinstance(getattr(item, "name", None), str):
            # a name, or a record that names its edge (an EdgeEffect whose ends are not both heads says so)
            src, dst, named = parse_edge_name(item if isinstance(item, str) else item.name, label)
            own = named or channel
        else:
            raise validate.fail(label, item, "(src, dst) or (src, dst, channel) with heads (layer, head), or an "
                                "edge's name, e.g. '0.1 -> 1.3 (k)' or '0.1->1.3:k'")
        own = validate.option(f"{label} channel", own, INPUTS)
        src, dst = _head(f"{label} src", src, spec), _head(f"{label} dst", dst, spec)
        if src[0] >= dst[0]:
            raise validate.fail(
                label,
                validate.given(f"{head_name(src)} -> {head_name(dst)}"),
                "an edge from an earlier layer to a later one (src layer < dst layer)",
                "A head only reads what earlier layers wrote.",
            )
        out.append(EdgeSpec(src, dst, own))
    return out


__all__ = ["CHANNELS", "INPUTS", "Channel", "EdgeSpec", "parse_edges"]
