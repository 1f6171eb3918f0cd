"""The two result types (per head, per edge) and the one edge record every measurement returns."""

from __future__ import annotations

import math

import pytest
import torch

import circuitkit as ck
from circuitkit import CircuitkitError
from circuitkit.circuits import AttributedEdge, EdgeAttribution, EdgeEffect, EdgeEvidence, EdgeSpec, PathPatching
from circuitkit.ranking import top_heads
from circuitkit.results import CHANNELS, Edge, EdgeValues, HeadValues, channel, edge_name

L, H = 3, 2
"""A model shape small enough to rank every edge by hand (3 x 2 heads: 3 * 4 * 3 = 36 edges)."""


def _edge_tensor(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(L, H, L, H, 3, generator=g)


def _brute_top(values: torch.Tensor, k: int, absolute: bool) -> list[tuple[tuple, str, float]]:
    """An independent ranking: every edge listed in (src, dst, input) order, Python's stable sort, NaN dropped."""
    rows = []
    for l1 in range(L):
        for h1 in range(H):
            for l2 in range(L):
                for h2 in range(H):
                    for c, name in enumerate(CHANNELS):
                        v = float(values[l1, h1, l2, h2, c])
                        if l1 < l2 and not math.isnan(v):
                            rows.append((((l1, h1), (l2, h2)), name, v))
    rows.sort(key=lambda r: -abs(r[2]) if absolute else -r[2])
    return rows[:k]


# ------------------------------------------------------------------------------------------------ per head
def test_head_values_rank_as_the_one_top_k_and_drop_what_was_not_measured():
    values = torch.tensor([[0.5, math.nan], [-0.9, 0.5]])
    hv = HeadValues(values, "effect")
    assert hv.top(4) == [((0, 0), 0.5), ((1, 1), 0.5), ((1, 0), pytest.approx(-0.9))]  # ties in (layer, head) order
    assert hv.top(2, absolute=True) == [((1, 0), pytest.approx(-0.9)), ((0, 0), 0.5)]
    assert hv.top(3) == [(h, v) for h, v in top_heads(values, 3) if not math.isnan(v)]
    assert hv.names() == ["0.0", "0.1", "1.0", "1.1"]
    assert hv[(1, 0)] == pytest.approx(-0.9)
    assert hv.measured.tolist() == [[True, False], [True, True]]
    assert hv.to_json() == [[0.5, None], [pytest.approx(-0.9), 0.5]]  # NaN ("not measured") as null


@pytest.mark.parametrize("bad", [torch.zeros(3), torch.zeros(2, 2) > 0, torch.full((2, 2), math.inf),
                                 torch.zeros(2, 0), torch.zeros(2, 2, dtype=torch.complex64), [[1.0]], None],
                         ids=["1-d", "bool", "inf", "empty", "complex", "list", "None"])
def test_head_values_refuse_bad_values(bad):
    with pytest.raises(CircuitkitError):
        HeadValues(bad, "x")


def test_head_values_refuse_a_bad_name_and_absolute():
    with pytest.raises(CircuitkitError, match="name"):
        HeadValues(torch.zeros(2, 2), "")
    with pytest.raises(CircuitkitError, match="absolute"):
        HeadValues(torch.zeros(2, 2), "x").top(1, absolute="yes")


# ------------------------------------------------------------------------------------------------ per edge
def test_edge_values_hold_edges_only_and_rank_like_a_sort_by_hand():
    raw = _edge_tensor()
    ev = EdgeValues(raw, "m")
    for l1 in range(L):
        for l2 in range(L):
            assert ev.values[l1, :, l2].isnan().all() == (l1 >= l2)  # a non-edge is never a value
    for absolute in (True, False):
        got = [((e.src, e.dst), e.channel, e.m) for e in ev.top(50, absolute=absolute)]
        want = _brute_top(ev.values, 50, absolute)
        assert [(k, c) for k, c, _ in got] == [(k, c) for k, c, _ in want]
        assert [v for *_, v in got] == pytest.approx([v for *_, v in want])
    assert len(ev.top(50)) == 36 and len(ev.edges()) == 36 == len(ev.names())
    k_only = ev.top(3, input="K")  # the composition modes' upper case names the same input
    assert [e.channel for e in k_only] == ["k"] * 3
    assert k_only == ev.top(3, input="k")
    torch.testing.assert_close(ev.input("Q"), ev.input("q"), equal_nan=True)
    assert ev.value((0, 1), (2, 0), "v") == pytest.approx(float(raw[0, 1, 2, 0, 2]))
    assert ev.names()[0] == "0.0 -> 1.0 (q)"


def test_edge_values_to_json_writes_not_measured_as_null():
    values = torch.full((2, 1, 2, 1, 3), math.nan)
    values[0, 0, 1, 0, 1] = 0.25
    data = EdgeValues(values, "m").to_json()
    assert data["name"] == "m" and data["inputs"] == ["q", "k", "v"]
    assert data["values"][0][0][1][0] == [None, 0.25, None]
    assert data["values"][1][0][0][0] == [None, None, None]


def test_edge_values_from_listed_edges_keep_float64():
    ev = EdgeValues.from_edges([((0, 0), (1, 1), "k", 0.1 + 1e-12)], 2, 2, "patched")
    assert ev.values.dtype == torch.float64 and ev.value((0, 0), (1, 1), "k") == 0.1 + 1e-12
    assert int(ev.measured.sum()) == 1
    both = EdgeValues.from_edges([((0, 0), (1, 1), "all", 1.0)], 2, 2)
    assert both.inputs == ("q", "k", "v", "all") and both.value((0, 0), (1, 1), "all") == 1.0


@pytest.mark.parametrize("bad, match", [
    (torch.zeros(2, 2, 2, 2), "axes"), (torch.zeros(2, 2, 3, 2, 3), "shape"), (torch.full((2, 1, 2, 1, 3), math.inf),
                                                                                  "infinite"),
], ids=["rank-4", "unpaired", "inf"])
def test_edge_values_refuse_bad_values(bad, match):
    with pytest.raises(CircuitkitError, match=match):
        EdgeValues(bad, "x")


def test_edge_values_refuse_a_bad_input_and_top_k():
    ev = EdgeValues(_edge_tensor(), "m")
    with pytest.raises(CircuitkitError, match="input"):
        ev.input("x")
    with pytest.raises(CircuitkitError, match="k"):
        ev.top(0)
    with pytest.raises(CircuitkitError, match="inputs"):
        EdgeValues(_edge_tensor(), "m", ("q", "q", "v"))


# ------------------------------------------------------------------------------------------------ the one record
def test_every_edge_record_is_the_one_edge_type_with_its_old_attributes():
    comp = ck.Edge((0, 1), (1, 0), 0.5)
    spec = EdgeSpec((0, 1), (1, 0), "K")
    attributed = AttributedEdge((0, 1), (1, 0), "k", -0.25)
    row = EdgeEvidence((0, 1), (1, 0), "k", 0.5, -0.25, None, weight_only=True)
    for record in (comp, spec, attributed, row):
        assert isinstance(record, Edge) and record.src == (0, 1) and record.dst == (1, 0)
    assert comp.channel is None and comp.score == 0.5 and comp.name == "0.1 -> 1.0"
    assert spec.channel == "k" and spec.name == "0.1 -> 1.0 (k)" == edge_name((0, 1), (1, 0), "k")
    assert attributed.value == -0.25 and attributed.attribution == -0.25
    assert row.composition == 0.5 and row.patched is None and row.effect == -0.25
    assert row.weight_only and not row.effect_only
    assert row.to_json() == {"src": [0, 1], "dst": [1, 0], "channel": "k", "composition": 0.5, "attribution": -0.25,
                             "patched": None, "weight_only": True, "effect_only": False, "name": "0.1 -> 1.0 (k)"}
    # records compare and hash by value, per type
    assert comp == ck.Edge((0, 1), (1, 0), 0.5) and hash(comp) == hash(ck.Edge((0, 1), (1, 0), 0.5))
    assert comp != ck.Edge((0, 1), (1, 0), 0.6)
    with pytest.raises(AttributeError):
        _ = comp.nothing_measured_so


def test_channel_has_one_spelling():
    assert channel("Q", "c") == "q" and channel("v", "c") == "v"
    for bad in ("Qk", " q", "x", 1, None):
        with pytest.raises(CircuitkitError):
            channel(bad, "c")


# ------------------------------------------------------------------------------------------------ the measurements
def test_edge_attribution_ranks_through_edge_values():
    scores = _edge_tensor(1)
    scores = torch.where(EdgeValues(scores, "a").measured, scores, math.nan)
    result = EdgeAttribution(scores, "loss", "resample", 1.0)
    want = _brute_top(scores, 5, absolute=True)
    got = result.top(5)
    assert [((e.src, e.dst), e.channel) for e in got] == [(k, c) for k, c, _ in want]
    assert all(isinstance(e, AttributedEdge) for e in got)
    assert [e.value for e in got] == pytest.approx([v for *_, v in want])
    assert result.edge_values.name == "attribution"
    assert result.to_json()["scores"] == result.edge_values.to_json()["values"]


def test_path_patching_gives_its_effects_as_edge_values():
    edges = (EdgeEffect.between_heads((0, 0), (1, 1), "k", clean=2.0, patched=2.5, effect=0.5),
             EdgeEffect.between_heads((0, 1), (1, 0), "q", clean=2.0, patched=1.75, effect=-0.25))
    values = PathPatching(edges, "loss", "resample").edge_values(2, 2)
    assert values.name == "patched" and int(values.measured.sum()) == 2
    assert values.value((0, 0), (1, 1), "k") == 0.5 and values.value((0, 1), (1, 0), "q") == -0.25
    with pytest.raises(CircuitkitError, match="1 layers"):
        PathPatching(edges, "loss", "resample").edge_values(1, 2)


# ------------------------------------------------------------------------------------------------ an edge's name
@pytest.mark.parametrize("text, want", [
    ("0.1 -> 1.3 (k)", ((0, 1), (1, 3), "k")),
    ("0.1->1.3:k", ((0, 1), (1, 3), "k")),
    ("0.1 -> 1.3", ((0, 1), (1, 3), None)),
    ("0.1->1.3", ((0, 1), (1, 3), None)),
    ("  10.12 -> 11.0 (ALL) ", ((10, 12), (11, 0), "all")),
    ("2.0->5.7:Q", ((2, 0), (5, 7), "q")),
    ("0.1 \u2192 1.3 K", ((0, 1), (1, 3), "k")),  # as the induction scan's answer prints it
    ("0.1 \u2192 1.3", ((0, 1), (1, 3), None)),
])
def test_an_edge_name_reads_back_either_way_circuitkit_writes_it(text, want):
    from circuitkit.results import graph_edge_name, parse_edge_name

    assert parse_edge_name(text, "t") == want
    src, dst, channel = want
    assert parse_edge_name(edge_name(src, dst, channel), "t") == want  # both writers read back by the one reader
    assert parse_edge_name(graph_edge_name(src, dst, channel), "t") == want


@pytest.mark.parametrize("text", ["input->m0", "0.1->logits", "13.2->14.g0:v", "0.1 -> 1.3 (x)", "0.1 -> 1.3 kq",
                                  "0.1 => 1.3", "0.1 - 1.3", "-1.0->1.3", "0.1->1.3:kk", "0.1\n->1.3", "9" * 70, "",
                                  3, None, b"0.1->1.3"])
def test_a_name_that_is_not_an_edge_between_two_heads_is_refused_with_what_was_read(text):
    from circuitkit.results import parse_edge_name

    with pytest.raises(CircuitkitError, match="^t: given"):
        parse_edge_name(text, "t")


@pytest.mark.parametrize("args, field", [
    (("x", (1, 3), "k"), "src"), (((0, 1), (1,), "k"), "dst"), (((0, -1), (1, 3), "k"), "src"),
    (((0, 1.0), (1, 3), "k"), "src"), (((0, 1), (1, True), "k"), "dst"), (((0, 1), (1, 3), "o"), "input"),
    (((0, 1), (1, 3), 5), "input"),
])
def test_a_task_graph_name_of_what_is_not_an_edge_between_heads_is_refused(args, field):
    from circuitkit.results import graph_edge_name

    with pytest.raises(CircuitkitError, match=f"^graph_edge_name: {field}: given"):
        graph_edge_name(*args)
    assert graph_edge_name((0, 1), (1, 3), "K") == "0.1->1.3:k" and graph_edge_name([0, 1], [1, 3]) == "0.1->1.3"
