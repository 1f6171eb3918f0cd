"""IOI roles as rules over a scan's figures (``circuitkit.tasks.roles``): each rule checked on figures set by hand,
so that every role's boundary is exercised (a head just inside and one just outside it)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from circuitkit.tasks.roles import (
    ATTENTION_ROLES,
    PATTERN_CALL,
    ROLE_ATTENTION,
    ROLE_DLA,
    ROLE_ORDER,
    ioi_roles,
    roles_line,
)


def _scan(edges=("0.1->2.0:q", "0.2->2.0:k", "m0->2.0:q", "1.3->2.0:q")):
    L, H = 3, 4
    dla = torch.zeros(L, H)
    io = torch.zeros(L, H)
    dla[2, 0], io[2, 0] = 2.0, 0.4      # name mover
    dla[2, 1], io[2, 1] = -1.0, 0.2     # negative name mover
    dla[2, 2], io[2, 2] = 1.5, -0.1     # writes the answer but attends to the subject: no mover role
    patterns = {name: torch.zeros(L, H) for name in ("duplicate_token", "induction", "previous_token")}
    patterns["duplicate_token"][0, 1] = 0.6
    patterns["induction"][1, 0] = PATTERN_CALL
    patterns["previous_token"][1, 0] = PATTERN_CALL - 0.01
    patterns["previous_token"][0, 0] = PATTERN_CALL - 0.01  # just below the call
    circuit = SimpleNamespace(heads=((0, 0), (0, 1), (1, 0), (2, 0), (2, 1), (2, 2)), edges=tuple(edges))
    return SimpleNamespace(circuit=circuit, dla=dla, head_scores={"io_attention": io}, pattern_scores=patterns)


def test_each_rule_on_hand_set_figures():
    roles = ioi_roles(_scan())
    assert roles == {"name mover": ((2, 0),), "negative name mover": ((2, 1),), "S-inhibition": ((0, 1),),
                     "duplicate-token": ((0, 1),), "induction": ((1, 0),)}
    # 0.2->2.0:k is a key edge, m0 an MLP, 1.3 outside the circuit: none is S-inhibition
    line = roles_line(_scan())
    assert "name movers 2.0 (DLA +2.00, io_attention +0.40)" in line and "negative name movers 2.1" in line
    assert "S-inhibition heads 0.1" in line and "induction heads 1.0 (0.30)" in line


def _with_repeat():
    """The same figures with ``s2_attention`` (attention to the subject's repeat minus to the indirect object), as an
    IOI scan records it, and a metric difference of 2 (DLA floor 0.02): each attention role just inside and just
    outside its boundaries."""
    scan = _scan()
    L, H = scan.dla.shape
    io, s2, dla = scan.head_scores["io_attention"], torch.zeros(L, H), scan.dla
    a = ROLE_ATTENTION
    s2[2, 0] = -a                                    # 2.0: IO over both mentions, just: a name mover
    s2[2, 1] = a                                     # 2.1: S2 over IO, just, writing against: a subject mover
    dla[2, 3], io[2, 3], s2[2, 3] = 2.5, 0.05, 0.6   # the largest DLA, looking at S2: a subject suppressor
    dla[1, 1], io[1, 1], s2[1, 1] = 0.3, 0.2, -0.1   # a name mover by both figures
    dla[1, 2], io[1, 2], s2[1, 2] = 0.5, 0.2, -0.04  # IO over S2 by less than the floor: no role
    dla[1, 3], io[1, 3], s2[1, 3] = 0.019, 0.3, -0.3  # attends to IO but writes below 1% of the difference: none
    scan.head_scores["s2_attention"] = s2
    scan.circuit.heads = (*scan.circuit.heads, (2, 3), (1, 1), (1, 2), (1, 3))
    scan.circuit.clean, scan.circuit.corrupted = 3.0, 1.0
    return scan


def test_the_subject_roles_read_where_a_head_attends_among_both_mentions():
    """With ``s2_attention`` a head that writes the answer while attending to the subject's repeat (Qwen2.5-0.5B's
    20.9: DLA +2.13, 0.62 of its attention on S2, 0.05 on IO) is a subject suppressor, not a name mover; one that
    writes against it while looking at the subject, a subject mover; a head without a clear preference, or one
    that writes below the floor, none of the four."""
    scan = _with_repeat()
    assert ROLE_DLA * 2.0 > 0.019
    roles = ioi_roles(scan)
    assert roles["name mover"] == ((2, 0), (1, 1))  # by |DLA|: 2.0 (2.0), then 1.1 (0.3)
    assert roles["subject suppressor"] == ((2, 3), (2, 2))  # 2.3 (S2 +0.6), 2.2 (io_attention -0.1)
    assert roles["subject mover"] == ((2, 1),) and "negative name mover" not in roles
    assert not any(h in roles.get(role, ()) for role in ATTENTION_ROLES for h in ((1, 2), (1, 3)))
    assert list(roles) == [r for r in ROLE_ORDER if r in roles]
    line = roles_line(scan)
    assert "subject suppressors 2.3 (DLA +2.50, io_attention +0.05, s2_attention +0.60)" in line
    assert "name movers 2.0 (DLA +2.00, io_attention +0.40, s2_attention -0.05)" in line
    # the S-inhibition rule reads the name movers: 0.1 -> 2.0:q still counts, and 1.3 -> 2.0:q now that 1.3 is
    # in the circuit (S-inhibition reads an edge, not the head's own DLA)
    assert roles["S-inhibition"] == ((0, 1), (1, 3))


def test_a_scan_without_the_subjects_repeat_keeps_the_rules_it_was_written_with():
    """A scan saved before IOI marked S2 has no ``s2_attention``: the name-mover rules read the signs of
    ``io_attention`` and DLA alone (no floors) and no subject role appears, so its saved roles load back as they
    were written."""
    scan = _with_repeat()
    del scan.head_scores["s2_attention"]
    roles = ioi_roles(scan)
    assert roles["name mover"] == ((2, 3), (2, 0), (1, 2), (1, 1), (1, 3))
    assert roles["negative name mover"] == ((2, 1),)
    assert not {"subject suppressor", "subject mover"} & set(roles)
    assert "s2_attention" not in roles_line(scan)


def test_no_roles_without_io_attention_or_edges():
    scan = _scan()
    scan.head_scores = {}
    assert ioi_roles(scan) is None and roles_line(scan) is None
    no_edges = _scan(edges=())
    assert "S-inhibition" not in ioi_roles(no_edges) and "S-inhibition needs edges" in roles_line(no_edges)


def test_a_rules_figure_never_prints_as_zero_when_the_rule_read_its_sign():
    """A name mover needs io_attention > 0; a figure of +0.004 printed as "+0.00" read as a rule broken."""
    from circuitkit.tasks.roles import signed

    assert signed(0.0043) == "+0.0043" and signed(-0.00041) == "-0.00041"
    assert signed(0.02) == "+0.02" and signed(-2.126) == "-2.13" and signed(0.0) == "+0.00"
    assert signed(0.005) == "+0.01" and signed(0.00499) == "+0.005"
