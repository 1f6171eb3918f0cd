"""The roles a scan gives heads, and the policy that calls a head by a score: data, not code paths.

Why a module of its own: the scan's answer, the heads it ablates together, the story without a circuit, the
training track and its report all ask one question, "which heads does this score call?", and one list, "which
roles does the answer give?". Kept here, below the pipeline and the report, they read the same policy and the same
roles, so a new role (a :class:`Role` over any registered head score) reaches every one of them with no edit
elsewhere.

**Calling a head.** Head ``(l, h)`` is *called* a ``score`` head when

    score[l, h] >= max(HEAD_CALL_THRESHOLD, HEAD_CALL_NEUTRAL_RATIO * neutral)

with ``neutral`` what a uniformly attending head scores on the same batch (the score definition's ``neutral``;
0 where it has none).

**A role** (:class:`Role`): a name shown in the answer (``"induction"``), the registered head score that calls
its heads (``score``) and, optionally, the role it must feed (``feeds``). Each role also names:

- its *group*, ``"<name> heads"``: the heads its score calls, ablated together by the scan;
- its score's *key*, ``"<score>_heads"``: where ``scores.json`` lists the heads that score calls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from circuitkit import validate
from circuitkit.ranking import Head, top_heads

if TYPE_CHECKING:
    from circuitkit.detect.scores import HeadScores

HEAD_CALL_THRESHOLD = 0.3
"""A head is called an induction / previous-token head from this score on (a perfect head scores 1.0)..."""
HEAD_CALL_NEUTRAL_RATIO = 3.0
"""...and only if it scores at least this many times a uniformly attending head on the same batch."""
MAX_ROLES = 100
"""The most roles one scan takes (an iterator of roles is read that far: an endless one is refused)."""
TOGETHER = "circuit"
"""The label of the group of every role's called heads, ablated together (with more than one role's heads)."""


@dataclass(frozen=True)
class Role:
    """A role a circuit head can be given in the answer: ``name`` (``"induction"``), the registered head score
    that must pass its threshold (``score``), and optionally the role it must feed (``feeds``): a head of this
    role sits in an earlier layer than a head of role ``feeds`` and its exactly patched edge into it carries."""

    name: str
    score: str
    feeds: str | None = None

    def describe(self) -> str:
        return f"{self.name}: {self.score}" + (f" feeding {self.feeds}" if self.feeds else "")

    @property
    def group(self) -> str:
        """The label of this role's called heads ablated together (``"induction heads"``)."""
        return f"{self.name} heads"

    @property
    def key(self) -> str:
        """Where ``scores.json`` lists the heads this role's score calls (``"previous_token_heads"``)."""
        return called_key(self.score)

    @property
    def title(self) -> str:
        """The role's name as a sentence begins it (``"Previous-token"``)."""
        return self.name[:1].upper() + self.name[1:]


def called_key(score: str) -> str:
    """The ``scores.json`` key listing the heads ``score`` calls (``"induction_heads"``)."""
    return f"{score}_heads"


DEFAULT_ROLES = (Role("induction", "induction"), Role("previous-token", "previous_token", feeds="induction"))
"""The roles the answer gives circuit heads: induction heads, and previous-token heads that feed one."""


def called_heads(scores: HeadScores, name: str) -> tuple[Head, ...]:
    """The heads score ``name`` calls (see the module docstring), best first; () where it was not computed."""
    if name not in scores:
        return ()
    neutral = scores.definitions[name].neutral or 0.0
    floor = max(HEAD_CALL_THRESHOLD, HEAD_CALL_NEUTRAL_RATIO * neutral)
    ranked = top_heads(scores[name], scores[name].numel())
    return tuple(head for head, value in ranked if value >= floor)


def called_by_score(scores: HeadScores, roles: Sequence[Role]) -> dict[str, tuple[Head, ...]]:
    """``score name -> the heads it calls`` (best first) for the scores of ``roles``, in role order (each score
    once): what :attr:`circuitkit.Scan.called` holds."""
    return {role.score: called_heads(scores, role.score) for role in roles}


def role_groups(roles: Sequence[Role], called: Mapping[str, tuple[Head, ...]]) -> dict[str, tuple[Head, ...]]:
    """The groups of called heads ablated together: each role's (:attr:`Role.group`; ``called``: score name ->
    heads, :func:`called_by_score`), then, with two roles or more, all of them (:data:`TOGETHER`, in role order, each
    head once); a group without heads is left out."""
    groups = {role.group: tuple(called.get(role.score, ())) for role in roles}
    if len(roles) > 1:
        every: list[Head] = []
        for heads in groups.values():
            every += [h for h in heads if h not in every]
        groups[TOGETHER] = tuple(every)
    return {label: heads for label, heads in groups.items() if heads}


def group_labels(roles: Sequence[Role]) -> tuple[str, ...]:
    """The labels of every group :func:`role_groups` can give for ``roles``, in order."""
    return tuple(role.group for role in roles) + ((TOGETHER,) if len(roles) > 1 else ())


def role_of_score(roles: Sequence[Role], score: str) -> Role | None:
    """The first role whose heads ``score`` calls, or None."""
    return next((role for role in roles if role.score == score), None)


def feeding_pair(roles: Sequence[Role]) -> tuple[Role, Role] | None:
    """``(feeder, fed)``: the first role that feeds another, and that role; None without one."""
    by_name = {role.name: role for role in roles}
    for role in roles:
        if role.feeds is not None and role.feeds in by_name:
            return role, by_name[role.feeds]
    return None


def check_roles(roles: Any, head_scores: HeadScores | None = None) -> tuple[Role, ...]:
    """``roles`` as :class:`Role` s: each a Role, ``(name, score)`` or ``(name, score, feeds)``; with ``head_scores``
    every score must be one the scan computed, and every ``feeds`` another role's name."""
    items = validate.bounded_list("scan: roles", roles, MAX_ROLES,
                                  "a list of Role(name, score, feeds=None) or (name, score) pairs",
                                  why="MAX_ROLES roles")
    out = []
    for item in items:
        if isinstance(item, Role):
            role = item
        elif isinstance(item, (tuple, list)) and len(item) in (2, 3) and all(
                isinstance(x, str) or x is None for x in item):
            role = Role(*item)
        else:
            raise validate.fail("scan: roles", item, "a Role(name, score, feeds=None) or a (name, score) pair")
        if not isinstance(role.name, str) or not role.name.strip() or not isinstance(role.score, str):
            raise validate.fail("scan: roles", item, "a role name with a visible character and a score name")
        out.append(role)
    names = [role.name for role in out]
    if len(set(names)) != len(names):
        raise validate.fail("scan: roles", names, "distinct role names")
    for role in out:
        if role.feeds is not None and role.feeds not in names:
            raise validate.fail(f"scan: roles: {role.name} feeds", role.feeds, f"one of the role names {names}")
        if role.feeds == role.name:
            raise validate.fail(f"scan: roles: {role.name} feeds", role.feeds, "another role")
        if head_scores is not None and role.score not in head_scores:
            raise validate.fail(f"scan: roles: {role.name}", role.score,
                                f"a registered head score the scan computed: {list(head_scores)}")
    return tuple(out)


__all__ = [
    "DEFAULT_ROLES", "HEAD_CALL_NEUTRAL_RATIO", "HEAD_CALL_THRESHOLD", "MAX_ROLES", "TOGETHER", "Role",
    "called_by_score", "called_heads", "called_key", "check_roles", "feeding_pair", "group_labels", "role_groups",
    "role_of_score",
]
