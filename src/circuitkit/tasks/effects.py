"""The exact effect of edges a researcher names, on a task: path patching of any edge of the task graph.

    import circuitkit as ck
    task = ck.tasks.ioi(model)
    for e in ck.tasks.edge_effects(model, task, ["9.9->logits", "input->m0"]):
        print(e.name, e.effect, e.interval)

An edge ``sender -> receiver`` is named as a task scan names it (its answer and ``scores.json``): senders ``input``,
heads ``L.H``, MLPs ``mN``; receivers a head's inputs ``L.H:q`` and, per key/value head, ``L.gG:k`` / ``L.gG:v``
(``L.H:k`` / ``L.H:v`` where every head has its own, or with ``kv_edges="per-query-head"``), MLPs ``mN`` and
``logits``. Its effect is the mean metric lost when only that edge takes its value from the corrupted prompt, every
other edge clean (:meth:`~circuitkit.graph.runner.TaskRunner.single_edge_metric`: one stacked copy of the pairs an
edge, resumed at the receiver's layer), with the percentile bootstrap interval over the pairs; the same figures as
a task scan's ``edge_effects`` (there for the circuit's strongest edges). Cost: the clean and corrupted runs, then
per edge its receiver's share of the layers (an edge into the logits runs none).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from circuitkit import validate
from circuitkit.errors import CircuitkitError
from circuitkit.graph.task import Task, check_prepend_bos
from circuitkit.model_state import keeps_model_state
from circuitkit.tasks.circuit import EdgeEffect, effect_intervals, exact_effects

MAX_EDGES = 10_000
"""Most edges one call measures (each is a share of a forward pass of the pairs)."""
NAMED = "e.g. '0.1->1.3:q', 'input->m0', '1.2->logits'"
"""How the task graph's edge names look, for the errors."""
PROGRESS_MIN_EDGES = 32
"""From this many edges on, a call shows a progress bar unless told not to."""


CORRUPTIONS = ("corrupted", "mean")
"""What :func:`edge_effects` patches an edge's sender to (its ``corrupt``)."""


@keeps_model_state
def edge_effects(model: Any, task: Task, edges: Any, *, metric: Any = None, mlps: bool | None = None,
                 kv_edges: str = "grouped", corrupt: str = "corrupted", n_resamples: int = 1000,
                 ci_level: float = 0.95,
                 prepend_bos: bool | None = None, device: Any = None,
                 progress: bool | None = None) -> tuple[EdgeEffect, ...]:
    """The exact effect of each of ``edges`` on ``task`` (module docstring), in the order given.

    Args:
        model: a TransformerBridge, a circuitkit toy model, a model directory's loaded model, or a ``ModelAdapter``.
        task: a :class:`~circuitkit.tasks.Task` (its pairs, metric and tokenization, as ``scan_task`` reads them).
        edges: an edge name (``"9.9->logits"``) or a list of them; an edge between two heads may also be given as
            path patching and the induction scan name it (``"0.1 -> 1.3 (k)"``, ``"0.1 \u2192 1.3 K"``) or as
            their records (:class:`circuitkit.Edge`, ``EdgeAttribution.top()``), one input each, or as either
            engine's :class:`~circuitkit.edge_effect.EdgeEffect` (``PathPatching.top()``, a task scan's edges).
        metric: a metric name or function in place of the task's own (as ``scan_task``'s ``metric``).
        mlps: MLPs are nodes of the graph (default: where the model has MLPs), as ``scan_task``'s ``mlps``.
        kv_edges: ``"grouped"`` (a key/value head's input is one receiver) or ``"per-query-head"``.
        corrupt: what the edge's sender is patched to: ``"corrupted"`` (its output on the corrupted prompt, the
            task's counterfactual) or ``"mean"`` (its clean output's mean over the pairs at each position, path
            patching's batch-mean corruption; the corrupted prompts are then not read).
        n_resamples, ci_level: the percentile bootstrap over the pairs behind each interval.
        prepend_bos: as :meth:`Task.tokenize`.
        progress: a tqdm bar over the edges (default: from :data:`PROGRESS_MIN_EDGES` edges on).

    Returns:
        one :class:`~circuitkit.edge_effect.EdgeEffect` per edge (path patching's record too): ``name`` (as the
        task graph names it), ``clean`` and ``patched`` (the metric's means), ``effect`` (the mean metric lost,
        ``clean - patched``, in the metric's units), ``interval`` (None with one pair), ``each`` (each pair's
        metric lost); ``score`` None (no attribution ran).
    """
    from circuitkit.detect.corrupt import check_mean_over
    from circuitkit.graph.nodes import KV_EDGES
    from circuitkit.graph.runner import EDGES_UNDEFINED, TaskRunner, check_hooks
    from circuitkit.models.adapters import adapt
    from circuitkit.uncertainty import check_settings

    if not isinstance(task, Task):
        raise validate.fail("edge_effects: task", task, "a circuitkit.tasks.Task (load_task, Task.from_pairs, "
                            "ioi, ...)")
    if metric is not None:
        task = replace(task, metric=metric)  # validated as a Task's own metric is
    names = [edges] if isinstance(edges, str) or hasattr(edges, "src") else edges
    if isinstance(names, (set, frozenset, dict)):  # no order to return the effects in
        raise validate.fail("edge_effects: edges", edges, "an edge name or a list of them, in order")
    names = validate.bounded_list("edge_effects: edges", names, MAX_EDGES, "an edge name or a list of them")
    if not names:
        raise validate.fail("edge_effects: edges", edges, "at least one edge name, e.g. '0.1->1.3:q'")
    kv_edges = validate.option("edge_effects: kv_edges", kv_edges, KV_EDGES)
    corrupt = validate.option("edge_effects: corrupt", corrupt, CORRUPTIONS)
    n_resamples, ci_level, _ = check_settings("edge_effects", n_resamples, ci_level, 0, "ci_level")
    show = len(names) >= PROGRESS_MIN_EDGES if progress is None else validate.boolean("edge_effects: progress",
                                                                                      progress)
    adapter = adapt(model, validate.device("edge_effects: device", device))
    mlps = (not adapter.attn_only) if mlps is None else validate.boolean("edge_effects: mlps", mlps)
    check_hooks(adapter, mlps)
    batch = task.tokenize(adapter, check_prepend_bos("edge_effects", prepend_bos))
    runner = TaskRunner(adapter, batch, task.metric, mlps=mlps, ablation=task.ablation, kv_edges=kv_edges)
    if not runner.edges_defined:
        raise validate.fail("edge_effects: model", validate.given(f"a {adapter.spec.family} model"),
                            f"a model whose heads add into the residual stream ({EDGES_UNDEFINED})")
    runner.direct = False  # no direct logit attribution: its backward serves the scan's roles only
    if corrupt == "mean":
        check_mean_over("edge_effects", batch.n_pairs, "task", "pair", "corrupted")
        runner.corrupt_by_mean()
    index = torch.tensor([_edge_index(runner.graph, name, i) for i, name in enumerate(names)], device="cpu")
    from tqdm.auto import tqdm

    with tqdm(total=len(names), disable=not show, desc="patching edges", unit="edge") as bar:
        found = exact_effects(runner, index, progress=bar.update)
    return effect_intervals(tuple(found), n_resamples, ci_level)


def _graph_name(name: Any, where: str) -> Any:
    """An edge between two heads given as circuitkit's other measurements name or return it (``"0.1 -> 1.3 (k)"``,
    a :class:`~circuitkit.results.Edge`) as the task graph names it, ``"0.1->1.3:k"``; anything else as given."""
    from circuitkit.edge_effect import EdgeEffect
    from circuitkit.results import graph_edge_name, parse_edge_name

    if isinstance(name, EdgeEffect):  # either engine's record of an exactly patched edge names it so already
        return name.name
    if hasattr(name, "src") and hasattr(name, "dst") and not isinstance(name, str):
        src, dst, channel = name.src, name.dst, getattr(name, "channel", None)
        if not (isinstance(src, tuple) and isinstance(dst, tuple) and len(src) == len(dst) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) for v in (*src, *dst))):
            raise validate.fail(where, name, "an edge between two heads (layer, head)")
    elif isinstance(name, str) and (" " in name.strip() or "\u2192" in name):  # the other spellings
        try:
            src, dst, channel = parse_edge_name(name, where)
        except CircuitkitError:
            raise validate.fail(where, name, f"an edge named 'sender->receiver' as a task scan names it, {NAMED}, "
                                "or one between two heads as path patching prints it, '0.1 -> 1.3 (k)'") from None
    else:
        return name
    if channel not in ("q", "k", "v"):
        raise validate.fail(where, name, "one input of the receiving head, q, k or v (a task graph's edge is one "
                            "sender into one receiver's input)")
    return graph_edge_name(src, dst, channel)


def _edge_index(graph: Any, name: Any, i: int) -> tuple[int, int]:
    """``(sender, receiver)`` of the edge named ``name`` in ``graph`` (a ``CircuitkitError`` naming what is not)."""
    where = f"edge_effects: edges[{i}]"
    given, name = name, _graph_name(name, where)
    if not isinstance(name, str) or name.count("->") != 1:
        raise validate.fail(where, name, f"an edge named 'sender->receiver' as a task scan names it, {NAMED}")
    as_given = getattr(given, "name", given)  # a record by its name
    # refusals name what was given, and the graph's name for it where that is another spelling
    name_shown = name if as_given == name else validate.given(f"{as_given!r} (in the task graph {name!r})")
    sender, receiver = name.split("->")
    if sender not in graph.senders:
        raise validate.fail(where, name_shown, f"a sender of this model's graph: input, L.H (heads, layers 0 to "
                            f"{graph.n_layers - 1}){', mN (MLPs)' if graph.mlps else ''}")
    if receiver not in graph.receivers:
        kv = "L.H:k, L.H:v" if graph.kv_edges == "per-query-head" or graph.n_kv == graph.n_heads else "L.gG:k, L.gG:v"
        raise validate.fail(where, name_shown, f"a receiver of this model's graph: L.H:q, {kv}"
                            f"{', mN' if graph.mlps else ''}, logits")
    s, r = graph.senders.index(sender), graph.receivers.index(receiver)
    if not bool(graph.allowed[s, r]):
        raise validate.fail(where, name_shown, "an edge from a sender to a receiver after it (a head of layer L feeds "
                            "the layers after L, its own layer's MLP and the logits)")
    return s, r


__all__ = ["CORRUPTIONS", "MAX_EDGES", "PROGRESS_MIN_EDGES", "edge_effects"]
