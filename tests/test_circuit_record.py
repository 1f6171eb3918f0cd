"""One record of a found circuit for both engines (:class:`circuitkit.CircuitRecord`), and the questions either
scan answers the same way (``verified``, ``verified_error``, ``answer()``, ``passes``, ``top()``).

The induction scan's circuit (``Circuit``) and a task's (``TaskCircuit``) are the one record with each engine's own
figures added: the same names mean the same figures, read the same way (``scan.verified`` in either scan), and a
reload gives them back. Checked on the bundled model (which copies in context, so both scans find a circuit), and
on a tiny model with MLPs for the members of every node type.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import circuitkit as ck
from circuitkit import CircuitkitError, zoo
from circuitkit.circuits.curve import CurvePoint
from circuitkit.circuits.record import CircuitRecord
from circuitkit.detect.tokens import RepeatedTokens
from circuitkit.tasks import Task, scan_task
from tests.conftest import boot_bridge
from tests.test_tasks import copy_next_task, toy_pairs

BEHAVIOURS = ("induction", "task")
SHARED = tuple(f.name for f in dataclasses.fields(CircuitRecord))


@pytest.fixture(scope="module")
def scans():
    model = zoo.load()
    return {"induction": ck.scan(model, tokens=RepeatedTokens(batch=8), random_sets=2, stability=2),
            "task": ck.scan(model, task=copy_next_task(n=16, d_vocab=60, seed=0), random_sets=2, stability=2)}


def test_the_record_names_the_figures_both_engines_measure():
    assert SHARED == ("heads", "faithfulness", "necessity", "target", "curve", "intervals", "ranked_by", "search",
                      "random_baseline", "stability")
    for cls in (ck.Circuit, ck.tasks.TaskCircuit):
        assert issubclass(cls, CircuitRecord)
        assert set(SHARED) <= {f.name for f in dataclasses.fields(cls)}
    assert ck.CircuitRecord is ck.circuits.CircuitRecord is CircuitRecord


@pytest.mark.parametrize("behaviour", BEHAVIOURS)
def test_either_scan_gives_its_circuit_as_the_one_record(scans, behaviour):
    scan = scans[behaviour]
    c = scan.verified
    assert isinstance(c, CircuitRecord)
    if behaviour == "task":
        assert c is scan.circuit
    n = len(c.heads)
    assert c.members == tuple(f"{layer}.{head}" for layer, head in c.heads) and c.size == c.n_heads == n
    # the circuit's faithfulness is the curve's point at its size, and the search reached the target there
    assert next(p.faithfulness for p in c.curve if p.size == n) == c.faithfulness >= c.target
    assert c.ranked_by == "joint"  # both scans rank by the joint path by default
    lo, hi = c.interval("faithfulness")
    assert (lo, hi) == tuple(c.intervals["faithfulness"]) and lo <= hi
    assert c.interval("necessity") == tuple(c.intervals["necessity"])
    # the opt-in figures live on the circuit in both scans
    assert c.random_baseline.size == n and c.random_baseline.n_sets == 2
    assert c.stability.n_resamples == 2 and c.stability.jaccard is not None
    if behaviour == "task":  # a task scan still answers them where it always did
        assert scan.random_baseline is c.random_baseline and scan.stability is c.stability


@pytest.mark.parametrize("behaviour", BEHAVIOURS)
def test_a_reload_gives_the_record_back(scans, behaviour, tmp_path):
    """Every figure of the record comes back (the induction scan's ``scores.json`` keeps 7 significant digits)."""
    scan = scans[behaviour]
    scan.save(tmp_path / "out")
    back = ck.Scan.load(tmp_path / "out").verified
    c = scan.verified
    assert isinstance(back, CircuitRecord) and type(back) is type(c)
    assert back.heads == c.heads and back.members == c.members and back.ranked_by == c.ranked_by
    assert back.faithfulness == pytest.approx(c.faithfulness, abs=1e-6)
    assert back.necessity == pytest.approx(c.necessity, abs=1e-6) and back.target == c.target
    assert [p.size for p in back.curve] == [p.size for p in c.curve]
    assert [p.faithfulness for p in back.curve] == pytest.approx([p.faithfulness for p in c.curve], abs=1e-6)
    assert back.interval("faithfulness") == pytest.approx(c.interval("faithfulness"))
    saved = json.loads((tmp_path / "out" / "scores.json").read_text())
    written = saved["circuit"] if behaviour == "induction" else saved  # each scan's layout
    assert back.random_baseline.to_json() == written["random_baseline"] and back.random_baseline.size == c.size
    assert back.stability.to_json() == written["stability"]


def test_a_task_record_lists_members_of_every_node_type():
    """MLPs (``m{layer}``) and further node types (their labels) follow the heads, in the order they joined."""
    model = boot_bridge(attn_only=False, n_layers=3, d_vocab=50, seed=3)
    task = Task.from_pairs(toy_pairs(12), name="toy")
    c = scan_task(model, task, neuron_groups=4, target=0.8, edges=False).circuit
    neurons = c.nodes["neurons"]
    assert neurons, "the toy task's circuit holds neuron groups"
    assert c.members == (*(f"{layer}.{head}" for layer, head in c.heads), *neurons)
    assert c.size == c.n_heads + len(neurons) > c.n_heads
    assert f"{c.size} nodes [" in repr(c)
    mlps = scan_task(model, task, mlp_nodes=True, target=0.8, edges=False).circuit
    assert mlps.members == (*(f"{layer}.{head}" for layer, head in mlps.heads), *(f"m{m}" for m in mlps.mlps))


def test_an_interval_is_asked_for_by_the_name_of_one_figure():
    c = CircuitRecord(heads=((0, 1),), faithfulness=0.9, necessity=1.0, target=0.8,
                      curve=(CurvePoint(1, 0.9, 0.5),),
                      intervals={"faithfulness": (0.8, 0.95), "necessity": None, "losses": {"clean": (0.1, 0.2)},
                                 "cpr": [0.5, 0.7]})
    assert c.interval("faithfulness") == (0.8, 0.95) and c.interval("cpr") == (0.5, 0.7)
    assert c.interval("necessity") is None  # undefined on some resample
    assert CircuitRecord(heads=(), faithfulness=1.0, necessity=None, target=0.8, curve=()).interval(
        "faithfulness") is None  # not computed
    for bad in ("losses", "curve", "Faithfulness", 3, None):
        with pytest.raises(CircuitkitError, match="CircuitRecord.interval: figure"):
            c.interval(bad)
    assert repr(c) == "CircuitRecord(1 heads [0.1], faithfulness 0.900 (target 0.8))"


TOP = {"induction": "induction", "task": "score"}


@pytest.mark.parametrize("behaviour", BEHAVIOURS)
def test_either_scan_answers_the_same_questions(scans, behaviour):
    """``answer()``, ``passes``, ``verified_error`` and ``top()`` on both scans, each checked against the figures it
    reports."""
    scan = scans[behaviour]
    c = scan.verified
    text = scan.answer()
    assert all(name in text for name in c.members)
    assert f"{c.faithfulness:.2f}" in text or f"{c.faithfulness:.3f}" in text
    assert scan.passes == sum(s.passes for s in scan.stages) > 0 and scan.verified_error is None
    name = TOP[behaviour]
    top = scan.top(name, 3)
    values = (scan.head_scores[name] if behaviour == "induction" else scan.scores).float()
    key = values if behaviour == "induction" else values.abs()  # a task's columns rank by magnitude
    order = torch.sort(-key.flatten(), stable=True).indices[:3]
    H = values.shape[1]
    assert [h for h, _ in top] == [(int(i) // H, int(i) % H) for i in order]
    assert [v for _, v in top] == pytest.approx([float(values.flatten()[i]) for i in order])


def test_a_task_scans_top_heads_are_checked(scans):
    scan = scans["task"]
    assert scan.verified.ranked_by == "joint" and scan.top(k=2) == scan.top("joint", 2)  # the ranking's column
    for bad in ({"score": "loss"}, {"score": 3}, {"k": 0}, {"k": 2.5}):
        with pytest.raises(CircuitkitError, match="TaskScan.top"):
            scan.top(**bad)


def test_both_scans_are_one_kind_of_result(scans, tmp_path):
    """Both results are :class:`circuitkit.ScanResult` s: every question it names is answered by both classes (an
    abstract one left unanswered would refuse to build the scan), ``top()`` without a column takes each scan's
    default, and ``Scan.load`` gives either kind back as one."""
    from circuitkit.tasks import TaskScan

    assert {"answer", "passes", "table", "to_pandas", "top", "to_json", "save", "load", "_repr_html_"} \
        == set(ck.ScanResult.__abstractmethods__)
    for cls in (ck.Scan, TaskScan):
        assert issubclass(cls, ck.ScanResult) and not cls.__abstractmethods__
    with pytest.raises(TypeError, match="abstract"):
        ck.ScanResult()
    for behaviour, scan in scans.items():
        assert isinstance(scan, ck.ScanResult)
        assert scan.top(k=2) == scan.top("induction" if behaviour == "induction" else None, 2)
        back = ck.Scan.load(scan.save(tmp_path / behaviour).scores)
        assert isinstance(back, ck.ScanResult) and type(back) is type(scan)
        assert [row["head"] for row in back.table()] == [row["head"] for row in scan.table()]
