"""Every circuit member explained: one short phrase per head, read from figures the scan already measured.

Why: a circuit found by ranking keeps heads no role rule names (a real 30 x 9 model's induction circuit: 17 of 25
heads). A reader asks of each "what does it do, and how do we know?". The answer is already in the scan's figures;
this module only words them, and never measures or guesses. Each member's phrase joins, in this order, the clauses
its figures support:

- **named roles** given by a rule set (the task's IOI roles), as given;
- **pattern calls**: each registered score that calls the head (:class:`Call`: its label, short name, value),
  ``"previous-token head (prev 0.83)"``;
- **direct effect** (tasks: direct logit attribution ``DLA``, in logits) where
  ``|DLA| >= DIRECT_SHARE * |m_clean - m_corrupted|``: ``"writes the answer directly (DLA +1.20)"``, or against it;
- **edges** it sends and receives (:class:`MeasuredEdge`), exact effects where measured: a carrying edge
  (``|effect| >=`` :data:`~circuitkit.circuits.evidence.CARRIES_NOTHING_FRACTION` of the largest given)
  reads ``"feeds 18.6 through K (effect +0.31)"`` / ``"reads 3.1 through Q (effect +0.12)"``; where every measured
  edge of the head carries nothing, it says so; edges of an edge circuit without an exact effect are counted;
- **removal alone** (induction: the exact single-head ablation, nats): ``"removing it alone raises the loss by
  +1.26 nats (exact)"``, and, where its role's group ablated together raises the loss more than
  :data:`TOGETHER_RATIO` times as much, that rise too (``", with the 3 other induction heads by +3.50"``);
- **its step on the faithfulness curve**, where both neighbouring points were measured: the member joins the
  circuit ``k``-th (``order``), and the curve holds the top ``k - 1`` and the top ``k``: ``"faithfulness from 0.76 to
  0.87 when it joins the top 6"`` (where the two agree to the decimals shown: ``"faithfulness stays at 0.87 when it
  joins the top 6"``);
- **stability**: its share of the circuits found on bootstrap resamples, where measured.

A member with none of the first four (what it does) opens with how it entered: ``"in the circuit by its joint-path
attribution (rank 9 of 270)"``, and where neither its removal nor its step was measured adds ``"no single measured
role"``. Never a bare "no role". The figures come in as plain mappings (head -> value), so a phrase is a function of
the numbers given and nothing else.
Nothing here says "needed only with X" of one other head: that takes the pair's joint removal, which no scan
measures; the group's joint removal is the nearest figure the scan has, and is said as such.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from circuitkit.circuits.evidence import CARRIES_NOTHING_FRACTION
from circuitkit.ranking import Head, head_name

DIRECT_SHARE = 0.1
"""A direct logit attribution is worded as writing the answer from this share of the behaviour's gap
``|m_clean - m_corrupted|`` on (a tenth of what the whole model does; smaller direct writes are left unsaid)."""
MAX_EDGES_NAMED = 2
"""Edges named per direction (sent, received) in one member's phrase, strongest first; the rest are counted."""
NO_ROLE = "no single measured role"
TOGETHER_RATIO = 2.0
"""A member's group's exact removal is said beside its own where it raises the loss more than this many times as
much (the member matters with the others more than alone: what the scan measures of "needed only with")."""


@dataclass(frozen=True)
class Call:
    """A registered head score that calls the head: ``label`` (``"previous-token"``), ``short`` (``"prev"``),
    ``value``; ``kind`` ``"pattern"`` (attention) or ``"weight"`` (read from the weights, e.g. copying)."""

    label: str
    short: str
    value: float
    kind: str = "pattern"


@dataclass(frozen=True)
class MeasuredEdge:
    """An edge ``src -> dst`` through ``channel`` (``"q"``, ``"k"``, ``"v"``; ``""`` into an MLP or the logits):
    node names as the scan writes them (``"0.1"``, ``"m3"``, ``"input"``, ``"logits"``, a key/value group
    ``"3.g1"``); ``effect``: its exact effect (path patching), None where it was not measured one by one."""

    src: str
    dst: str
    channel: str
    effect: float | None


def _num(value: float, fmt: str = "+.2f") -> str:
    return format(value, fmt)


def _receives(member: Head, dst: str, heads_per_group: int) -> bool:
    """Whether ``dst`` (a receiver node) is ``member``'s input: the head itself, or its key/value group."""
    if dst == head_name(member):
        return True
    match = re.fullmatch(r"(\d+)\.g(\d+)", dst)
    return bool(match) and int(match.group(1)) == member[0] and member[1] // heads_per_group == int(match.group(2))


def _through(edge: MeasuredEdge) -> str:
    """`` through K`` (the receiver's input), `` through its group's K input 3.g1:k`` where the receiver is a
    key/value group its query heads share, "" into an MLP or the logits."""
    channel = edge.channel.upper()
    if not channel:
        return ""
    if re.fullmatch(r"\d+\.g\d+", edge.dst):
        return f" through its group's {channel} input {edge.dst}:{edge.channel}"
    return f" through {channel}"


def _edge_clauses(member: Head, edges: Sequence[MeasuredEdge], heads_per_group: int, members: set[str],
                  unit: str) -> tuple[list[str], list[str]]:
    """What the edges ``member`` sends and receives say (module docstring): ``(carrying, notes)``, the carrying
    ones with their exact effects, strongest first; the notes: the count of those not measured one by one, and,
    where none carries, that its exactly measured edges carry nothing."""
    name = head_name(member)
    largest = max((abs(e.effect) for e in edges if e.effect is not None), default=0.0)
    floor = CARRIES_NOTHING_FRACTION * largest

    def carrying(e: MeasuredEdge) -> bool:
        return e.effect is not None and largest > 0 and abs(e.effect) >= floor

    sent = [e for e in edges if e.src == name]
    received = [e for e in edges if _receives(member, e.dst, heads_per_group)]
    clauses = []
    for verb, mine, other in (("feeds", [e for e in sent if e.dst != "logits"], "dst"), ("reads", received, "src")):
        exact = sorted(filter(carrying, mine), key=lambda e: -abs(e.effect or 0.0))
        parts = []
        for i, e in enumerate(exact[:MAX_EDGES_NAMED]):
            peer = getattr(e, other)
            outside = " (outside the circuit)" if re.fullmatch(r"\d+\.\d+", peer) and peer not in members else ""
            label = "the embeddings" if peer == "input" else peer
            value = _num(e.effect or 0.0)
            figure = f"effect {value}{' ' + unit if unit else ''}" if i == 0 else value
            if verb == "feeds" and re.fullmatch(r"\d+\.g\d+", peer):  # the group's input, shared by its heads
                parts.append(f"{peer}:{e.channel} (a key/value group's {e.channel.upper()} input; {figure})")
                continue
            parts.append(f"{label}{outside}{_through(e)} ({figure})")
        if len(exact) > MAX_EDGES_NAMED:
            parts.append(f"{len(exact) - MAX_EDGES_NAMED} more")
        if parts:
            clauses.append(f"{verb} " + ", ".join(parts))
        if verb == "feeds":
            clauses += [f"writes into the logits (effect {_num(e.effect or 0.0)}{' ' + unit if unit else ''})"
                        for e in sent if e.dst == "logits" and carrying(e)]
    notes = []
    counts = [(word, sum(e.effect is None for e in mine)) for word, mine in (("sends", sent), ("receives", received))]
    counts = [(word, n) for word, n in counts if n]
    if counts:
        said = " and ".join(f"{word} {n}" for word, n in counts)
        total = sum(n for _, n in counts)
        notes.append(f"{said} edge{'s' if total != 1 else ''} of the edge circuit not measured one by one")
    silent = [e for e in sent + received if e.effect is not None and not carrying(e)]
    if silent and not clauses:
        biggest = max((e.effect or 0.0 for e in silent), key=abs)
        notes.append(f"its {len(silent)} exactly measured edge{'s' if len(silent) != 1 else ''} carr"
                       f"{'y' if len(silent) != 1 else 'ies'} nothing (largest {_num(biggest)})")
    return clauses, notes


def _curve_clause(member: Head, order: Sequence[Any], curve: Mapping[int, float]) -> str | None:
    """The member's measured step on the faithfulness curve (module docstring), or None."""
    if member not in order:
        return None
    k = list(order).index(member) + 1
    if k not in curve or (k - 1) not in curve:
        return None
    if k == 1:
        return f"alone it reaches faithfulness {curve[1]:.2f}"
    if f"{curve[k - 1]:.2f}" == f"{curve[k]:.2f}":  # a step the two decimals shown cannot tell from none
        return f"faithfulness stays at {curve[k]:.2f} when it joins the top {k - 1}"
    return f"faithfulness from {curve[k - 1]:.2f} to {curve[k]:.2f} when it joins the top {k - 1}"


def _calls(calls: Sequence[Call]) -> str:
    pattern = [c for c in calls if c.kind == "pattern"]
    weight = [c for c in calls if c.kind != "pattern"]
    parts = [f"{c.label} head ({c.short} {c.value:.2f})" for c in pattern]
    parts += [f"{c.label} head by its weights ({c.short} {c.value:+.2f})" for c in weight]
    return ", ".join(parts)


def _explain(*, roles: Sequence[str], calls: Sequence[Call], direct: str | None,
             edges: tuple[list[str], list[str]], removal: str | None, step: str | None, share: float | None,
             entry: str) -> str:
    """The member's phrase: what it does (roles, calls, direct effect, carrying edges), then how much it matters;
    with no "what", how it entered the circuit first, and "no single measured role" with no removal or step."""
    what = [", ".join(roles)] if roles else []
    if calls:
        what.append(_calls(calls))
    if direct:
        what.append(direct)
    carrying, notes = edges
    what += carrying
    how = notes + [c for c in (removal, step) if c]
    if share is not None:
        how.append(f"in {100 * share:.0f}% of the resampled circuits")
    if what:
        return "; ".join(what + how)
    return "; ".join([entry, *how] + ([] if removal or step else [NO_ROLE]))


def induction_explanations(members: Sequence[Head], *, calls: Mapping[Head, Sequence[Call]] | None = None,
                           edges: Sequence[MeasuredEdge] = (), removal: Mapping[Head, float] | None = None,
                           order: Sequence[Head] = (), curve: Mapping[int, float] | None = None,
                           ranked_by: str = "attribution", n_total: int | None = None,
                           estimates: Mapping[Head, float] | None = None,
                           stability: Mapping[Head, float] | None = None,
                           groups: Mapping[str, tuple[Sequence[Head], float]] | None = None) -> dict[str, str]:
    """``head name -> explanation`` for every member of an induction circuit (module docstring).

    ``calls``: head -> the scores that call it (a role of the scan, previous-token feeding induction, is its
    score's call and its edge, both said); ``edges``: exactly patched edges (effects: the rise of the
    repeated-copies loss, nats); ``removal``: head -> the exact rise of the loss when it alone is ablated (only
    heads ablated exactly); ``order``: every head in the order the search added them; ``curve``: ``n ->
    faithfulness`` of the top ``n`` (measured points only); ``ranked_by``: what the order reads (``"joint-path
    attribution"``); ``n_total``: heads in the model; ``estimates``: head -> the first-order estimate of its
    removal (nats); ``stability``: head -> its share of the resampled circuits; ``groups``: label (``"induction
    heads"``) -> (the heads ablated together, the exact rise of the loss), said of a member whose own exact removal
    is measured and less than half its group's (:data:`TOGETHER_RATIO`): it matters with the others."""
    calls, removal, curve, groups = calls or {}, removal or {}, curve or {}, groups or {}
    names = {head_name(h) for h in members}
    out = {}
    for h in members:
        edge_clauses = _edge_clauses(h, edges, 1, names, "nats")
        rise = removal.get(h)
        entry = f"in the circuit by its {ranked_by}"
        figures = []
        if h in order:
            figures.append(f"rank {list(order).index(h) + 1}" + (f" of {n_total}" if n_total else ""))
        if estimates is not None and h in estimates:
            figures.append(f"estimated removal effect {_num(estimates[h])} nats")
        if figures:
            entry += f" ({', '.join(figures)})"
        said = None if rise is None else f"removing it alone raises the loss by {_num(rise)} nats"
        together = sorted(((len(heads), label, tuple(tuple(x) for x in heads), value)
                           for label, (heads, value) in groups.items()
                           if h in [tuple(x) for x in heads] and len(heads) > 1))
        if said is not None and together:
            _, label, heads, value = together[0]  # the smallest group holding it
            if abs(value) > TOGETHER_RATIO * abs(rise or 0.0):
                others = [x for x in heads if x != h]
                one = label[:-1] if label.endswith("heads") else label
                whom = (f"{head_name(others[0])} (the other {one})" if len(others) == 1
                        else f"the {len(others)} other {label}")
                said += f", with {whom} by {_num(value)}"
        said = None if said is None else said + " (exact)"
        out[head_name(h)] = _explain(
            roles=(), calls=tuple(calls.get(h, ())), direct=None, edges=edge_clauses,
            removal=said,
            step=_curve_clause(h, order, curve), share=None if stability is None else stability.get(h), entry=entry)
    return out


def task_explanations(members: Sequence[Head], *, calls: Mapping[Head, Sequence[Call]] | None = None,
                      roles: Mapping[Head, Sequence[str]] | None = None, dla: Mapping[Head, float] | None = None,
                      gap: float | None = None, edges: Sequence[MeasuredEdge] = (), heads_per_group: int = 1,
                      order: Sequence[Any] = (), curve: Mapping[int, float] | None = None,
                      node_scores: Mapping[Head, float] | None = None, n_total: int | None = None,
                      unit: str = "", removal: Mapping[Head, float] | None = None) -> dict[str, str]:
    """``head name -> explanation`` for every head of a task's node circuit (module docstring).

    ``calls``: head -> the registered pattern scores that call it on the task's prompts; ``roles``: head -> the
    task's named roles (IOI's) it holds; ``dla``: head -> direct logit attribution; ``gap``: ``m_clean -
    m_corrupted``, what :data:`DIRECT_SHARE` is a share of; ``edges``: the edge circuit's edges (effect: the metric
    lost when only that edge is patched; None where not measured one by one); ``heads_per_group``: query heads per
    key/value group (grouped receivers ``"L.gG:k"``); ``order``: the nodes in the order the node search added them;
    ``curve``: ``n -> faithfulness`` measured; ``node_scores``: head -> EAP-IG node score; ``unit``: the metric's;
    ``removal``: head -> the metric lost with it alone patched (only heads patched alone: the scan's ``ablate``)."""
    calls, roles, curve = calls or {}, roles or {}, curve or {}
    names = {head_name(h) for h in members}
    out = {}
    for h in members:
        edge_clauses = _edge_clauses(h, edges, heads_per_group, names, unit)
        direct = None
        if dla is not None and h in dla and gap is not None and abs(gap) > 0:
            value = dla[h]
            if abs(value) >= DIRECT_SHARE * abs(gap):
                helps = (value > 0) == (gap > 0)
                direct = (f"writes {'the answer' if helps else 'against the answer'} directly "
                          f"(DLA {_num(value)} logits)")
        entry = "in the circuit by its EAP-IG node score"
        figures = []
        if node_scores is not None and h in node_scores:
            figures.append(_num(node_scores[h], "+.3g"))
        if h in order:
            figures.append(f"rank {list(order).index(h) + 1}" + (f" of {n_total}" if n_total else ""))
        if figures:
            entry += f" ({', '.join(figures)})"
        lost = (removal or {}).get(h)
        said = None if lost is None else f"patching it alone loses {_num(lost)}{' ' + unit if unit else ''} (exact)"
        out[head_name(h)] = _explain(
            roles=tuple(roles.get(h, ())), calls=tuple(calls.get(h, ())), direct=direct, edges=edge_clauses,
            removal=said, step=_curve_clause(h, order, curve), share=None, entry=entry)
    return out


def score_calls(head_scores: Any, members: Sequence[Head], labels: Mapping[str, str] | None = None
                ) -> dict[Head, list[Call]]:
    """Head -> the registered scores of ``head_scores`` (:class:`~circuitkit.detect.scores.HeadScores`) that call it
    (:func:`~circuitkit.detect.roles.called_heads`: the threshold over a uniform head's score), for each of
    ``members``, in registry order; ``labels``: score name -> the name a call reads (default: the score's name
    with hyphens, ``"previous-token"``)."""
    from circuitkit.detect.roles import called_heads

    labels = labels or {}
    out: dict[Head, list[Call]] = {tuple(h): [] for h in members}
    definitions = getattr(head_scores, "definitions", {}) or {}
    for name in head_scores:
        definition = definitions.get(name)
        short = str(getattr(definition, "short", None) or name)
        kind = str(getattr(definition, "kind", "pattern"))
        for h in called_heads(head_scores, name):
            if tuple(h) in out:
                out[tuple(h)].append(Call(labels.get(name, name.replace("_", "-")), short,
                                          float(head_scores[name][h[0], h[1]]), kind))
    return out


def parse_edge(name: str, effect: float | None = None) -> MeasuredEdge:
    """A task edge circuit's edge name (``"3.1->5.g0:k"``, ``"input->2.4:q"``, ``"m1->logits"``) as a
    :class:`MeasuredEdge`."""
    src, _, receiver = name.partition("->")
    dst, _, channel = receiver.partition(":")
    return MeasuredEdge(src, dst, channel, effect)


__all__ = ["Call", "DIRECT_SHARE", "MAX_EDGES_NAMED", "MeasuredEdge", "NO_ROLE", "TOGETHER_RATIO",
           "induction_explanations", "parse_edge", "score_calls", "task_explanations"]
