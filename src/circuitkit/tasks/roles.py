"""IOI roles (Wang et al. 2022) read from a task scan's own figures: which of the node circuit's heads act as name
movers, negative name movers, subject suppressors and subject movers, S-inhibition, duplicate-token, induction and
previous-token heads.

Why a module: the IOI paper names its circuit by roles, and a researcher reads a circuit that way. The roles here
are rules over figures the scan measured, never new measurements; each rule says what it reads:

- **name mover**: direct logit attribution ``> 0`` (the head writes the answer over the wrong name) and, from the
  last token, more attention to the indirect object than to either mention of the subject: ``io_attention >=
  ROLE_ATTENTION`` (IO minus the first mention S1) and ``s2_attention <= -ROLE_ATTENTION`` (the repeat S2 minus IO);
- **negative name mover**: direct logit attribution ``< 0``, attending to the indirect object as a name mover does
  (and writing against it);
- **subject suppressor**: direct logit attribution ``> 0`` while attending more to a mention of the subject than to
  the indirect object (``io_attention <= -ROLE_ATTENTION`` or ``s2_attention >= ROLE_ATTENTION``): it raises the
  logit difference from the wrong name, as a head that writes against the name it attends does (copy suppression,
  McDougall et al. 2023);
- **subject mover**: direct logit attribution ``< 0`` while attending more to the subject: it writes for the wrong
  name;

  each of these four with ``|DLA|`` at least :data:`ROLE_DLA` of the metric's clean-corrupted difference (a head
  that writes less than that directly moves no name) and attention differences of at least
  :data:`ROLE_ATTENTION` (a head without such a preference attends to neither name: it gets none of them);
- **S-inhibition**: an edge of the edge circuit from the head into a name mover's query input (``X->L.H:q``): it
  changes where the name mover looks (only where edges were measured);
- **duplicate-token**, **induction**, **previous-token**: the head's registered pattern score on the task's clean
  prompts (:mod:`circuitkit.detect`) is at least :data:`PATTERN_CALL`, the largest of the three; a head may hold
  one of these and a name-mover role.

Heads outside the node circuit get no role. A role no head meets is left out; the answer names the rule set once.
The subject roles and the two floors read ``s2_attention``: a scan without it (saved before IOI marked the
subject's repeat) keeps the two name-mover rules on the signs of ``io_attention`` and DLA alone, as it was written.
On Qwen2.5-Coder-0.5B the head with the largest direct logit attribution (20.9, +2.13) puts 0.62 of its last-token
attention on S2 and 0.05 on IO, and its direct effect is -2.23 on the subject's logit and -0.09 on the answer's: a
subject suppressor, which the rule on ``io_attention`` alone (+0.01) called a name mover.
"""

from __future__ import annotations

from typing import Any

from circuitkit.ranking import head_name

PATTERN_CALL = 0.3
"""A pattern score (the share of attention on the score's target positions, averaged over rows that have one) from
which a circuit head is called by it: a third of its attention, well above a uniform head's share on prompts of
15-20 tokens."""
PATTERN_ROLES = (("duplicate_token", "duplicate-token"), ("induction", "induction"),
                 ("previous_token", "previous-token"))
ROLE_ATTENTION = 0.05
"""The smallest difference between a head's attention to two names (from the last token; a share of its attention)
from which the attention roles say it attends to one over the other: a twentieth of its attention."""
ROLE_DLA = 0.01
"""The smallest ``|DLA|``, as a share of the metric's clean-corrupted difference, from which a head writes a name
directly (on Qwen2.5-0.5B's IOI, a difference of 4.1 logits: 0.04 logits)."""
ROLE_ORDER = ("name mover", "negative name mover", "subject suppressor", "subject mover", "S-inhibition",
              "duplicate-token", "induction", "previous-token")
ATTENTION_ROLES = ("name mover", "negative name mover", "subject suppressor", "subject mover")
"""The roles read from direct logit attribution and where the head attends (their line prints both figures)."""


def signed(value: float) -> str:
    """A rule's figure in words, with the sign the rule reads: two decimals, or two significant digits where two
    decimals would print a positive or negative figure as ``+0.00`` (the rules compare with 0)."""
    return f"{value:+.2f}" if value == 0 or abs(value) >= 0.005 else f"{value:+.2g}"


def ioi_roles(result: Any) -> dict[str, tuple[tuple[int, int], ...]] | None:
    """Role -> the circuit's heads holding it (module docstring), in ``ROLE_ORDER``; None where the scan has no
    ``io_attention`` score or no circuit (not an IOI task)."""
    c = result.circuit
    io = result.head_scores.get("io_attention")
    if c is None or io is None:
        return None
    roles: dict[str, list[tuple[int, int]]] = {name: [] for name in ROLE_ORDER}
    dla = result.dla
    s2 = result.head_scores.get("s2_attention")
    if dla is not None:
        by_dla = sorted(c.heads, key=lambda h: -abs(float(dla[h])))
        floor = ROLE_DLA * abs(c.clean - c.corrupted) if s2 is not None else 0.0
        for h in by_dla:
            writes = float(dla[h]) if abs(float(dla[h])) >= floor else 0.0
            if s2 is None:  # a scan saved without the subject's repeat: the name-mover rules on io_attention alone
                to_io, to_subject = float(io[h]) > 0, False
            else:
                to_io = float(io[h]) >= ROLE_ATTENTION and float(s2[h]) <= -ROLE_ATTENTION
                to_subject = float(io[h]) <= -ROLE_ATTENTION or float(s2[h]) >= ROLE_ATTENTION
            if to_io and writes > 0:
                roles["name mover"].append(h)
            elif to_io and writes < 0:
                roles["negative name mover"].append(h)
            elif to_subject and writes > 0:
                roles["subject suppressor"].append(h)
            elif to_subject and writes < 0:
                roles["subject mover"].append(h)
    movers = {head_name(h) for h in roles["name mover"]}
    for edge in c.edges:
        sender, receiver = edge.split("->")
        if receiver.endswith(":q") and receiver[:-2] in movers and "." in sender and not sender.startswith("m"):
            layer, head = (int(x) for x in sender.split("."))
            if (layer, head) in c.heads and (layer, head) not in roles["S-inhibition"]:
                roles["S-inhibition"].append((layer, head))
    for h in c.heads:
        values = {role: float(result.pattern_scores[name][h]) for name, role in PATTERN_ROLES
                  if name in result.pattern_scores}
        if values:
            role, value = max(values.items(), key=lambda kv: kv[1])
            if value >= PATTERN_CALL:
                roles[role].append(h)
    return {name: tuple(heads) for name, heads in roles.items() if heads}


def rules_said(result: Any) -> str:
    """The rules :func:`ioi_roles` applies to this scan, in words (the answer's legend): the rule set that reads
    ``s2_attention`` where the scan has it, else the one it was written with."""
    if result.head_scores.get("s2_attention") is not None:
        a = f"{ROLE_ATTENTION:g}"
        movers = ("name mover DLA > 0, attending to the indirect object more than to either mention of the subject "
                  f"(io_attention >= {a}, s2_attention <= -{a}); negative name mover DLA < 0, attending as a name "
                  "mover; subject suppressor DLA > 0, attending more to a mention of the subject (io_attention <= "
                  f"-{a} or s2_attention >= {a}); subject mover DLA < 0, attending so; each with |DLA| at least "
                  f"{ROLE_DLA:.0%} of the metric's clean-corrupted difference")
    else:
        movers = "name mover DLA > 0 and io_attention > 0; negative name mover DLA < 0 and io_attention > 0"
    return (f"{movers}; S-inhibition an edge into a name mover's query; duplicate-token / induction / "
            f"previous-token a pattern score >= {PATTERN_CALL:g}")


def roles_line(result: Any) -> str | None:
    """The answer's line naming the roles, with the figure each rule read; None without IOI roles."""
    roles = ioi_roles(result)
    if roles is None:
        return None
    if not roles:
        return "IOI roles (Wang et al. 2022): no circuit head meets a role's rule."
    parts = []
    for role, heads in roles.items():
        if role in ATTENTION_ROLES:
            named = ", ".join(f"{head_name(h)} (DLA {signed(float(result.dla[h]))}, {attention(result, h)})"
                              for h in heads[:4])
        elif role == "S-inhibition":
            named = ", ".join(head_name(h) for h in heads[:4]) + " (edges into a name mover's query)"
        else:
            score = dict((r, n) for n, r in PATTERN_ROLES)[role]
            named = ", ".join(f"{head_name(h)} ({float(result.pattern_scores[score][h]):.2f})" for h in heads[:4])
        parts.append(f"{role}s {named}" if role in ATTENTION_ROLES else f"{role} heads {named}")
    edges_note = "" if result.circuit.edges else "; S-inhibition needs edges, not measured here"
    return "IOI roles (Wang et al. 2022, from this scan's figures): " + "; ".join(parts) + edges_note + "."


def attention(result: Any, head: tuple[int, int]) -> str:
    """Where a head attends, as the attention roles read it: ``io_attention`` and, where the scan has it,
    ``s2_attention``, each with its sign."""
    scores = result.head_scores
    said = f"io_attention {signed(float(scores['io_attention'][head]))}"
    if scores.get("s2_attention") is not None:
        said += f", s2_attention {signed(float(scores['s2_attention'][head]))}"
    return said


NAMED_ROLES = (*ATTENTION_ROLES, "S-inhibition")
"""The roles a member's explanation names as roles: the pattern roles are said as its pattern calls instead."""


def node_order(result: Any) -> list[tuple[int, int | None]]:
    """The nodes in the order the node search added them (:func:`circuitkit.tasks.circuit.node_order`, read back
    from the scores that ranked them, the joint path's shares (``result.ranking``) or the EAP-IG node scores: heads
    ``(layer, head)``, then MLPs ``(layer, None)`` where they were nodes; by score, largest first, by magnitude
    with ``rank="abs"``, ties in that order)."""
    import torch

    from circuitkit.tasks.table import ranking_scores

    L, H = result.scores.shape
    settings = result.settings
    heads, mlps = ranking_scores(result)
    mlp_nodes = bool(settings.get("mlp_nodes")) and bool(settings.get("mlps")) and mlps is not None
    nodes: list[tuple[int, int | None]] = [(layer, h) for layer in range(L) for h in range(H)]
    values = [float(v) for v in heads.reshape(-1).tolist()]
    if mlp_nodes:
        nodes += [(layer, None) for layer in range(L)]
        values += [float(v) for v in mlps.tolist()]
    key = torch.tensor(values, dtype=torch.float32, device="cpu")
    key = key.abs() if settings.get("rank") == "abs" else key
    return [nodes[i] for i in torch.sort(-key, stable=True).indices.tolist()]


def member_explanations(result: Any) -> dict[str, str] | None:
    """``head name -> what it does`` for every head of the task scan's node circuit
    (:func:`circuitkit.circuits.explain.task_explanations`); None without a circuit."""
    from circuitkit.circuits.explain import Call, parse_edge, task_explanations
    from circuitkit.detect.registry import registered
    from circuitkit.graph.metrics import metric_units

    c = result.circuit
    if c is None:
        return None
    members = [tuple(h) for h in c.heads]
    shorts = {d.name: d.short for d in registered()}
    calls: dict[tuple[int, int], list[Call]] = {h: [] for h in members}
    for name, values in result.pattern_scores.items():
        for h in members:
            if float(values[h]) >= PATTERN_CALL:
                calls[h].append(Call(name.replace("_", "-"), shorts.get(name, name), float(values[h])))
    roles: dict[tuple[int, int], list[str]] = {h: [] for h in members}
    named = ioi_roles(result) or {}
    io = result.head_scores.get("io_attention")
    for role in NAMED_ROLES:
        for h in named.get(role, ()):
            figure = f" ({attention(result, h)})" if io is not None and role in ATTENTION_ROLES else ""
            roles[h].append(role + figure)
    effects = {e.name: e.effect for e in c.edge_effects}
    edges = [parse_edge(name, effects.get(name)) for name in c.edges]
    in_circuit = set(c.edges)
    edges += [parse_edge(name, effect) for name, effect in effects.items() if name not in in_circuit]
    model = result.model
    kv = getattr(model, "n_kv_heads", None) or model.n_heads
    dla = None if result.dla is None else {h: float(result.dla[h]) for h in members}
    # a set searched beyond ranking is not a prefix of the ranking the curve measures: no member's step on it is the
    # set's (as the induction circuit's members)
    searched = result.searched() is not None
    return task_explanations(
        members, calls=calls, roles=roles, dla=dla, gap=c.clean - c.corrupted, edges=edges,
        heads_per_group=max(1, model.n_heads // kv), order=[] if searched else node_order(result),
        curve={p.size: p.faithfulness for p in c.curve}, node_scores={h: float(result.scores[h]) for h in members},
        n_total=c.n_nodes_total, unit=metric_units(result.task.metric),
        removal=None if result.single_heads is None else {
            h: float(result.single_heads.exact[h]) for h in members if h in result.single_heads.heads})


__all__ = ["ATTENTION_ROLES", "NAMED_ROLES", "PATTERN_CALL", "ROLE_ATTENTION", "ROLE_DLA", "ROLE_ORDER", "attention",
           "ioi_roles", "member_explanations", "node_order", "roles_line", "rules_said"]
