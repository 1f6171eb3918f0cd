"""Every circuit member explained (``circuitkit.circuits.explain``): each phrase is worded from the figures given
(change a figure, the phrase changes), every member gets one, and none reads a bare "no role"; the induction
answer, ``scores.json`` and the task answer carry them."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch

from circuitkit.circuits.evidence import CARRIES_NOTHING_FRACTION
from circuitkit.circuits.explain import (
    DIRECT_SHARE,
    NO_ROLE,
    Call,
    MeasuredEdge,
    induction_explanations,
    parse_edge,
    score_calls,
    task_explanations,
)

BARE = re.compile(r"\bno role\b")


def _induction(**overrides):
    """A three-member induction circuit: a previous-token head 3.1 feeding 18.6 through K, and 9.4 with no call."""
    members = [(18, 6), (3, 1), (9, 4)]
    given = dict(
        calls={(3, 1): [Call("previous-token", "prev", 0.83)], (18, 6): [Call("induction", "induct", 0.91)]},
        edges=[MeasuredEdge("3.1", "18.6", "k", 0.31)],
        removal={(3, 1): 1.26},
        order=[(18, 6), (3, 1), (9, 4), (0, 0)],
        curve={0: 0.0, 1: 0.35, 2: 0.76, 3: 0.87, 4: 0.9},
        ranked_by="joint-path attribution", n_total=270,
        estimates={(18, 6): 0.5, (3, 1): 0.2, (9, 4): 0.03},
    )
    given.update(overrides)
    return induction_explanations(members, **given)


def test_every_member_gets_a_phrase_from_its_figures():
    out = _induction()
    assert set(out) == {"18.6", "3.1", "9.4"}
    assert out["3.1"].startswith("previous-token head (prev 0.83); feeds 18.6 through K (effect +0.31 nats)")
    assert "removing it alone raises the loss by +1.26 nats (exact)" in out["3.1"]
    assert out["18.6"].startswith("induction head (induct 0.91); reads 3.1 through K (effect +0.31 nats)")
    assert "alone it reaches faithfulness 0.35" in out["18.6"]
    assert "faithfulness from 0.35 to 0.76 when it joins the top 1" in out["3.1"]
    # 9.4: no call, no edge, no removal; its step on the curve is measured, so no "no single measured role"
    assert out["9.4"] == ("in the circuit by its joint-path attribution (rank 3 of 270, estimated removal effect "
                          "+0.03 nats); faithfulness from 0.76 to 0.87 when it joins the top 2")
    assert not any(BARE.search(text) for text in out.values())


@pytest.mark.parametrize(("change", "before", "after"), [
    ({"calls": {(3, 1): [Call("previous-token", "prev", 0.64)]}}, "prev 0.83", "prev 0.64"),
    ({"edges": [MeasuredEdge("3.1", "18.6", "q", -0.12)]}, "through K (effect +0.31", "through Q (effect -0.12"),
    ({"removal": {(3, 1): 0.4}}, "by +1.26 nats", "by +0.40 nats"),
    ({"curve": {0: 0.0, 1: 0.35, 2: 0.6, 3: 0.87}}, "from 0.35 to 0.76", "from 0.35 to 0.60"),
])
def test_a_changed_figure_changes_the_phrase(change, before, after):
    old, new = _induction()["3.1"], _induction(**change)["3.1"]
    assert before in old and before not in new and after in new


def test_a_step_is_said_only_where_both_points_were_measured():
    out = _induction(curve={0: 0.0, 3: 0.87, 4: 0.9})  # the search measured no point at 1 or 2
    assert "faithfulness" not in out["3.1"] and "faithfulness" not in out["18.6"]
    assert out["9.4"] == ("in the circuit by its joint-path attribution (rank 3 of 270, estimated removal effect "
                          f"+0.03 nats); {NO_ROLE}")


def test_a_groups_removal_is_said_where_the_member_matters_with_the_others():
    """3.1 alone +1.26 nats; its role's group ablated together: said from TOGETHER_RATIO times its own rise on."""
    from circuitkit.circuits.explain import TOGETHER_RATIO

    pair = {"previous-token heads": ([(3, 1), (4, 2)], 1.26 * TOGETHER_RATIO * 1.01)}
    out = _induction(groups=pair)["3.1"]
    assert (f"removing it alone raises the loss by +1.26 nats, with 4.2 (the other previous-token head) by "
            f"{1.26 * TOGETHER_RATIO * 1.01:+.2f} (exact)") in out
    weak = {"previous-token heads": ([(3, 1), (4, 2)], 1.26 * TOGETHER_RATIO * 0.99)}
    assert "with 4.2" not in _induction(groups=weak)["3.1"]
    many = {"circuit": ([(3, 1), (4, 2), (5, 0), (6, 1)], 9.0), "previous-token heads": ([(3, 1), (4, 2), (5, 0)], 4.0)}
    assert "with the 2 other previous-token heads by +4.00 (exact)" in _induction(groups=many)["3.1"]
    # no exact removal of its own: the group's rise alone says nothing of this member
    assert "with" not in _induction(groups=pair, removal={})["3.1"].split("removing")[-1]


def test_edges_that_carry_nothing_are_not_named_as_carrying():
    small = 0.31 * CARRIES_NOTHING_FRACTION * 0.9  # just under the floor
    edges = [MeasuredEdge("3.1", "18.6", "k", 0.31), MeasuredEdge("9.4", "18.6", "v", small)]
    out = _induction(edges=edges)
    assert "9.4" not in out["18.6"]
    assert out["9.4"].startswith("in the circuit by its joint-path attribution (rank 3 of 270, estimated removal "
                                 f"effect +0.03 nats); its 1 exactly measured edge carries nothing (largest "
                                 f"{small:+.2f})")
    at_floor = _induction(edges=[edges[0], MeasuredEdge("9.4", "18.6", "v", 0.31 * CARRIES_NOTHING_FRACTION)])
    assert at_floor["9.4"].startswith("feeds 18.6 through V (effect +0.02 nats)")


def test_edges_beyond_the_named_are_counted_and_outsiders_marked():
    edges = [MeasuredEdge(f"{layer}.0", "18.6", "k", 0.1 * layer) for layer in (1, 2, 3, 4)]
    out = _induction(edges=edges)
    assert "reads 4.0 (outside the circuit) through K (effect +0.40 nats), 3.0 (outside the circuit) through K " \
           "(+0.30), 2 more" in out["18.6"]


def test_task_phrases_read_dla_against_the_gap_and_grouped_inputs():
    members = [(1, 0), (1, 3), (2, 2)]
    edges = [parse_edge("1.0->logits", 0.5), parse_edge("0.2->1.g1:v", 0.2), parse_edge("1.3->2.2:q"),
             parse_edge("input->2.2:q"), parse_edge("1.0->2.2:q", -0.3), parse_edge("1.3->2.g0:k", 0.25)]
    gap = 2.0
    dla = {(1, 0): DIRECT_SHARE * gap, (1, 3): -0.5, (2, 2): DIRECT_SHARE * gap * 0.99}
    out = task_explanations(members, roles={(1, 0): ["name mover (io_attention +0.40)"]}, dla=dla, gap=gap,
                            edges=edges, heads_per_group=2, order=[(1, 0), (2, 2), (1, 3)],
                            curve={0: 0.0, 1: 0.5, 2: 0.7}, node_scores={(1, 3): 0.0123}, n_total=12,
                            unit="logits")
    assert out["1.0"].startswith("name mover (io_attention +0.40); writes the answer directly (DLA +0.20 logits); "
                                 "feeds 2.2 through Q (effect -0.30 logits); writes into the logits (effect +0.50 "
                                 "logits)")
    # 1.3 (group 1 of layer 1 with two query heads a group) reads 0.2 through the group's value input
    assert "writes against the answer directly (DLA -0.50 logits)" in out["1.3"]
    assert "reads 0.2 (outside the circuit) through its group's V input 1.g1:v (effect +0.20 logits)" in out["1.3"]
    assert "feeds 2.g0:k (a key/value group's K input; effect +0.25 logits)" in out["1.3"]
    assert "sends 1 edge of the edge circuit not measured one by one" in out["1.3"]
    # 2.2: DLA just under the share is not worded; two unmeasured edges in; its curve step measured
    assert "DLA" not in out["2.2"] and "receives 2 edges" in out["2.2"]
    assert "faithfulness from 0.50 to 0.70 when it joins the top 1" in out["2.2"]
    # a sign flip of the gap turns "the answer" into "against the answer"
    flipped = task_explanations(members, dla=dla, gap=-gap)
    assert "writes against the answer directly (DLA +0.20 logits)" in flipped["1.0"]
    assert flipped["1.3"] == "writes the answer directly (DLA -0.50 logits)"
    bare = task_explanations([(0, 0)], node_scores={(0, 0): -0.25}, order=[(1, 0), (0, 0)], n_total=12)
    assert bare["0.0"] == f"in the circuit by its EAP-IG node score (-0.25, rank 2 of 12); {NO_ROLE}"
    assert not any(BARE.search(t) for t in [*out.values(), *flipped.values(), *bare.values()])


def test_score_calls_use_the_scans_threshold():
    from circuitkit.detect.registry import get
    from circuitkit.detect.roles import HEAD_CALL_THRESHOLD
    from circuitkit.detect.scores import HeadScores

    prev = torch.zeros(2, 2)
    prev[0, 1], prev[1, 0] = HEAD_CALL_THRESHOLD, HEAD_CALL_THRESHOLD - 1e-3
    scores = HeadScores({"previous_token": prev}, {"previous_token": get("previous_token").with_neutral(0.05)},
                        tokens=torch.zeros(1, 4, dtype=torch.long), patterns=None, block_len=2, n_repeats=2,
                        bos=None)
    calls = score_calls(scores, [(0, 1), (1, 0)], {"previous_token": "previous-token"})
    assert calls[(1, 0)] == [] and calls[(0, 1)] == [Call("previous-token", "prev", pytest.approx(0.3))]


# ---------------------------------------------------------------------------------------------- the scan's answer
@pytest.fixture(scope="module")
def bundled():
    from circuitkit import scan, zoo

    return scan(zoo.load())


def test_the_bundled_answer_lists_every_member_with_its_figures(bundled, tmp_path):
    from circuitkit import Scan
    from circuitkit.report.data import scan_json
    from circuitkit.report.summary import answer_html, answer_lines, find_answer

    members = [f"{a}.{b}" for a, b in bundled.verified.heads]
    lines = answer_lines(bundled)
    said = {line.split(":")[0].removeprefix("Member "): line for line in lines if line.startswith("Member ")}
    assert sorted(said) == sorted(members)
    prev = float(bundled.head_scores["previous_token"][0, 1])
    effect = next(float(e.effect) for e in bundled.verified.edges.edges if (e.src, e.dst) == ((0, 1), (1, 3)))
    assert f"previous-token head (prev {prev:.2f}); feeds 1.3 through K (effect {effect:+.2f} nats)" in said["0.1"]
    rise = bundled.circuit_ablation["induction heads"]  # the four called induction heads ablated together
    assert f"with the 3 other induction heads by {rise:+.2f} (exact)" in said["1.3"]
    assert not any(BARE.search(line) for line in lines)
    html = " ".join(answer_html(find_answer(bundled)))
    assert html.count("<li>") == len(members) and "no role" not in html
    record = scan_json(bundled)
    assert sorted(record["circuit"]["explanations"]) == sorted(members)
    saved = bundled.save(tmp_path / "out")
    again = Scan.load(saved.scores)
    assert scan_json(again)["circuit"]["explanations"] == record["circuit"]["explanations"]


@pytest.mark.parametrize(("edit", "field"), [
    (lambda e: e.pop("0.1"), "no entry for 0.1"),
    (lambda e: e.update({"0.2": "not a member"}), "0.2"),
    (lambda e: e.update({"0.1": ""}), "circuit.explanations.0.1"),
])
def test_reload_refuses_explanations_no_scan_writes(bundled, tmp_path, edit, field):
    from circuitkit import CircuitkitError, Scan

    saved = bundled.save(tmp_path / "out")
    record = json.loads(saved.scores.read_text())
    edit(record["circuit"]["explanations"])
    saved.scores.write_text(json.dumps(record))
    with pytest.raises(CircuitkitError, match=re.escape(field)):
        Scan.load(saved.scores)


def test_a_scan_whose_explanations_another_version_worded_loads_in_todays_words(bundled, tmp_path):
    """The explanations are prose written from the figures: a file whose members are worded otherwise (an older
    version's words) loads, and the loaded scan says them as this version does."""
    from circuitkit import Scan
    from circuitkit.report.data import scan_json

    saved = bundled.save(tmp_path / "out")
    record = json.loads(saved.scores.read_text())
    today = dict(record["circuit"]["explanations"])
    record["circuit"]["explanations"] = {name: f"worded otherwise: {text[:20]}" for name, text in today.items()}
    saved.scores.write_text(json.dumps(record))
    assert scan_json(Scan.load(saved.scores))["circuit"]["explanations"] == today


def test_a_member_without_a_call_is_explained_by_its_figures(bundled):
    """The bundled circuit with 1.2 added (called by the induction score, but its edges never patched): still a
    phrase, from its call and its exact ablation; with the calls taken away, from its rank."""
    from circuitkit.report.data import circuit_explanations

    verified = dataclasses.replace(bundled.verified, heads=(*bundled.verified.heads, (1, 2)))
    wider = dataclasses.replace(bundled, verified=verified)
    out = circuit_explanations(wider)
    assert out["1.2"].startswith("induction head (induct ")
    assert "no role" not in " ".join(out.values())


# ---------------------------------------------------------------------------------------------- task scans
def test_a_task_scan_explains_every_node_circuit_head():
    from circuitkit.graph.runner import build_graph
    from circuitkit.models.adapters import adapt
    from circuitkit.tasks import Task
    from circuitkit.tasks.circuit import node_order as search_order
    from circuitkit.tasks.roles import member_explanations, node_order
    from circuitkit.tasks.scan import scan_task
    from tests.conftest import gqa_bridge
    from tests.test_tasks import toy_pairs

    model = gqa_bridge()
    task = Task.from_pairs(toy_pairs(8), name="toy")
    result = scan_task(model, task, holdout=0, steps=1)
    heads = result.circuit.heads
    out = member_explanations(result)
    assert sorted(out) == sorted(f"{a}.{b}" for a, b in heads)
    assert not any(BARE.search(text) for text in out.values())
    lines = result.answer().splitlines()
    for name, text in out.items():
        assert f"  {name}: {text}." in lines
    assert result.to_json()["circuit"]["explanations"] == out
    # the order read back from the scores that ranked the nodes (the joint path's, saved with the scan) is the
    # search's own (oracle: tasks.circuit.node_order on the graph)
    assert result.circuit.ranked_by == "joint" and result.ranking is not None
    graph = build_graph(adapt(model), mlps=result.settings["mlps"])
    scores = torch.zeros(len(graph.senders))
    L, H = result.scores.shape
    for layer in range(L):
        for h in range(H):
            scores[graph.sender_index(layer, h)] = result.ranking["heads"][layer, h]
    assert node_order(result) == search_order(graph, L, H, scores, result.settings["rank"], False)
    assert sorted(node_order(result)[:len(heads)]) == sorted(heads)


def test_a_step_the_shown_decimals_cannot_tell_from_none_is_worded_as_none():
    out = _induction(curve={0: 0.0, 1: 0.35, 2: 0.352, 3: 0.87, 4: 0.9})
    assert "faithfulness stays at 0.35 when it joins the top 1" in out["3.1"]
    assert "from 0.35 to 0.35" not in out["3.1"]
