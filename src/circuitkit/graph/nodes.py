"""The node types of a task circuit, as data: one record per kind of node, so that a new kind is one record.

A **node type** (:class:`NodeType`) says what a node is and how it is measured:

- ``name`` (``"head"``, ``"mlp"``, ``"neurons"``, ...) and how its nodes are named, ``label(layer, i)``
  (``"l.h"``, ``"m{l}"``, ``"m{l}.n{g}"``);
- how many nodes a layer has, ``count(spec)``;
- where its nodes write, ``hook(layer)``: a name from :class:`~circuitkit.models.adapters.HOOKS` whose activation
  is ``[batch, pos, unit, ...]``. The ``n`` nodes of a layer split the ``unit`` axis (the third) into contiguous
  groups as equal as can be: with ``U`` units, unit ``u`` belongs to node ``floor(u * n / U)``
  (:func:`groups_of`). A head is one unit of ``hook_z`` (its ``z`` replaced), an MLP all of ``hook_mlp_out``
  (its output replaced), a neuron group ``U / G`` units of the MLP's hidden activation ``hook_post``;
- ``patch``: how a node outside a circuit is patched, in words (every type is patched the same way: its units take
  their value on the corrupted prompt of the same pair, or the task's mean / zero ablation; everything downstream
  is recomputed).

Its **EAP-IG node score** (Hanna et al. 2024, read at the node's own activation ``a``, patched value ``a'``, with
``g_k = dM/da`` at the ``k``-th point between the corrupted and the clean input embeddings)::

    score(node) = sum_{pair, pos, unit in node} (a - a') * (1/steps) sum_k g_k

the first-order estimate of the metric lost when the node alone is patched. (Heads and MLPs are ranked by the sum
of their outgoing edges' scores, equal to this in exact arithmetic: every path from a node's output passes through
one receiver's input.)

**Node sets** (:data:`NodeSets`: type name -> ``[sets, layer, nodes]`` bool) are the one form in which both
engines patch nodes: a task's runner (every type it holds) and the induction scan's ablator
(:class:`~circuitkit.circuits.faithfulness.Ablator`: heads, and any further type given to it with its values) build
their stacked passes with :func:`node_patches` and their joint-path gates with :func:`node_gates`, each node at its
type's hook, so a new type is patched and gated in either without code of its own.

**The edge graph** (:mod:`circuitkit.graph.runner`) is built from the types that send or receive edges
(:data:`EDGE_TYPES`: input, heads, MLPs, logits). A sender writes at ``2 * layer + writes_at`` (``writes_at`` 0
for attention, 1 for the MLP; the input at layer -1, the logits' port at layer ``L``), a receiver (:class:`Port`)
reads at ``2 * layer + reads_at`` (every reader of a layer at 0 where attention and MLP run in parallel); an edge
joins every sender to every receiver that reads after it writes. A head's key and value receivers are one per
key/value head (``l.g{g}:k``, read by its group's query heads) or, with :data:`KV_EDGES` ``"per-query-head"``
(:func:`edge_types`), one per query head (``l.h:k``), as EAP-IG draws them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from circuitkit import validate
from circuitkit.detect.joint_path import Gate
from circuitkit.detect.node_patching import Patch, groups_of
from circuitkit.models.adapters import HOOKS


@dataclass(frozen=True)
class Port:
    """One kind of receiver of the edge graph: ``channel`` (``"q"``, ``"k"``, ``"v"``, ``"mlp"``, ``"logits"``),
    ``count(spec)`` per layer, their names ``label(layer, i, spec)``, the hook where the input is rebuilt
    (``hook(layer)``) and where in its layer it reads (``reads_at``: 0 attention, 1 the MLP)."""

    channel: str
    count: Callable[[Any], int]
    label: Callable[[int, int, Any], str]
    hook: Callable[[int], str]
    reads_at: int = 0


@dataclass(frozen=True)
class NodeType:
    """One kind of node (module docstring). ``where``: ``"layer"`` (``count`` nodes in every layer), ``"before"``
    (one node before layer 0: the input) or ``"after"`` (after the last layer: the logits). ``hook`` None: not a
    node a node circuit patches. ``sends``: an edge-graph sender, writing at ``writes_at``; ``ports``: its
    receivers. ``describe``: what a label means, for the answer's legend; ``plural``: how the answer names them."""

    name: str
    count: Callable[[Any], int]
    label: Callable[[int, int], str]
    hook: Callable[[int], str] | None
    patch: str
    describe: str = ""
    plural: str = ""
    """How the answer names several of them (default: ``"<name> nodes"``)."""
    where: str = "layer"
    sends: bool = False
    writes_at: int = 0
    ports: tuple[Port, ...] = ()


def _group_label(layer: int, g: int, spec: Any) -> str:
    return f"{layer}.{g}" if spec.n_kv_heads == spec.n_heads else f"{layer}.g{g}"


INPUT = NodeType("input", lambda spec: 1, lambda layer, i: "input", None, "not patched",
                 "input = the residual stream entering layer 0 (the embeddings)", where="before", sends=True,
                 writes_at=1)
HEAD = NodeType(
    "head", lambda spec: spec.n_heads, lambda layer, h: f"{layer}.{h}", HOOKS.z, "its z replaced",
    "L.H = head H of layer L (from 0)", sends=True, writes_at=0,
    ports=(Port("q", lambda spec: spec.n_heads, lambda layer, h, spec: f"{layer}.{h}:q", HOOKS.q),
           Port("k", lambda spec: spec.n_kv_heads, lambda layer, g, spec: f"{_group_label(layer, g, spec)}:k", HOOKS.k),
           Port("v", lambda spec: spec.n_kv_heads, lambda layer, g, spec: f"{_group_label(layer, g, spec)}:v",
                HOOKS.v)))
MLP = NodeType("mlp", lambda spec: 1, lambda layer, i: f"m{layer}", HOOKS.mlp_out, "its output replaced",
               "mN = the MLP of layer N", sends=True, writes_at=1,
               ports=(Port("mlp", lambda spec: 1, lambda layer, i, spec: f"m{layer}", HOOKS.mlp_in, reads_at=1),))
LOGITS = NodeType("logits", lambda spec: 1, lambda layer, i: "logits", None, "not patched", where="after",
                  ports=(Port("logits", lambda spec: 1, lambda layer, i, spec: "logits",
                              lambda layer: HOOKS.resid_post(layer - 1)),))
EDGE_TYPES = (INPUT, HEAD, MLP, LOGITS)
"""The edge graph's node types, in the order their nodes are listed within a layer (key/value edges grouped)."""
KV_EDGES = ("grouped", "per-query-head")
"""How the edge graph's key and value inputs are drawn on a grouped-query model: one per key/value head, shared by
its group's query heads (``"grouped"``, ``l.g{g}:k``), or one per query head (``"per-query-head"``, ``l.h:k``: each
query head's keys and values computed from its own input, EAP-IG's graph). The same graph where every query head has
its own key/value head."""
DEFAULT_KV_EDGES = "grouped"
HEAD_PER_QUERY = replace(HEAD, ports=(
    HEAD.ports[0],
    Port("k", lambda spec: spec.n_heads, lambda layer, h, spec: f"{layer}.{h}:k", HOOKS.k),
    Port("v", lambda spec: spec.n_heads, lambda layer, h, spec: f"{layer}.{h}:v", HOOKS.v)))
"""Heads whose every query head has its own key and value input (``"per-query-head"``)."""


def edge_types(kv_edges: str = DEFAULT_KV_EDGES) -> tuple[NodeType, ...]:
    """The edge graph's node types (:data:`EDGE_TYPES`) with key/value receivers drawn as ``kv_edges`` says
    (:data:`KV_EDGES`)."""
    validate.option("kv_edges", kv_edges, KV_EDGES)
    return EDGE_TYPES if kv_edges == "grouped" else (INPUT, HEAD_PER_QUERY, MLP, LOGITS)

MAX_NEURON_GROUPS = 4096


def neuron_groups(groups: int) -> NodeType:
    """Each MLP's neurons (its hidden activation ``hook_post``, the input of its output matrix) in ``groups``
    contiguous groups per layer, ``m{l}.n{g}``; a group outside a circuit has its activations replaced (MIB's neuron
    level, at the granularity of a group)."""
    groups = validate.integer("neuron_groups", groups, minimum=1, maximum=MAX_NEURON_GROUPS)
    return NodeType("neurons", lambda spec: groups, lambda layer, g: f"m{layer}.n{g}", HOOKS.mlp_post,
                    "its neurons' activations replaced",
                    f"mL.nG = neuron group G of the MLP of layer L (its hidden units split in {groups} groups)",
                    plural="neuron groups")


NodeSets = Mapping[str, Tensor]
"""Node sets of several types, the form both engines' node patching takes: node type name -> ``[sets, layer,
nodes]`` bool (True: that set patches that node); a type left out patches none of its nodes."""


def check_node_sets(where: str, kinds: Mapping[str, NodeType], patched: Any, spec: Any) -> int:
    """``patched`` checked as :data:`NodeSets` of the types ``kinds`` (each mask a bool tensor ``[sets, layer,
    nodes]`` of its type's shape, as many sets for every type; at least one type); the number of sets. Both
    engines' node patching checks its sets here (``where`` names the caller in the refusal)."""
    L = spec.n_layers
    if not isinstance(patched, Mapping) or not patched:
        raise validate.fail(where, patched, "a non-empty dict: node type -> [sets, layer, nodes]")
    sets = None
    for name, mask in patched.items():
        if name not in kinds:
            raise validate.fail(where, name, f"one of the node types {sorted(kinds)}")
        n = kinds[name].count(spec)
        if (not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.dim() != 3
                or tuple(mask.shape[1:]) != (L, n) or (sets is not None and mask.shape[0] != sets)):
            raise validate.fail(f"{where}[{name!r}]", mask, f"a bool tensor [sets, {L}, {n}] (sets the same for "
                                "every type)")
        sets = int(mask.shape[0])
    return sets


def node_patches(kinds: Mapping[str, NodeType], patched: NodeSets, values: Mapping[str, Mapping[int, Any]],
                 first: int = 0) -> list[Patch]:
    """The patches of one stacked node-patching pass (:func:`~circuitkit.detect.node_patching.patched_logits`) for
    the sets ``patched`` (:data:`NodeSets`), each node written where its type says (``kinds[name].hook(layer)``):
    one :class:`~circuitkit.detect.node_patching.Patch` per type and layer at or after ``first`` where some set
    patches a node, its mask ``[sets, nodes]`` splitting the hook's units into the type's nodes, its value
    ``values[name][layer]`` (broadcastable to the activation ``[B, P, U, ...]``, or a function of it). The
    induction scan's ablator and a task's runner both build their passes here."""
    return [Patch(kinds[name].hook(at), mask[:, at], values[name][at])
            for name, mask in patched.items() for at in range(first, mask.shape[1]) if bool(mask[:, at].any())]


def node_gates(kinds: Sequence[NodeType], values: Mapping[str, Mapping[int, Tensor]], spec: Any
               ) -> tuple[list[Gate], list[tuple[str, int]]]:
    """The joint path's gates (:class:`~circuitkit.detect.joint_path.Gate`) of every node of ``kinds`` in every
    layer, each hook's units split into the type's ``count(spec)`` nodes, gated between ``values[name][layer]`` and
    the unit's own activation; with each gate's ``(type name, layer)``, in the same order."""
    gates, where = [], []
    for kind in kinds:
        for layer in range(spec.n_layers):
            gates.append(Gate(kind.hook(layer), values[kind.name][layer], kind.count(spec)))
            where.append((kind.name, layer))
    return gates, where


__all__ = ["DEFAULT_KV_EDGES", "EDGE_TYPES", "HEAD", "HEAD_PER_QUERY", "INPUT", "KV_EDGES", "LOGITS", "MLP", "NodeSets",
           "NodeType", "Port", "check_node_sets", "edge_types", "groups_of", "neuron_groups", "node_gates",
           "node_patches"]
