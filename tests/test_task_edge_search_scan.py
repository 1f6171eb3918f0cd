"""``scan_task(edge_search="refined")``: the edge-search stage after the edge circuit. Its edges reach the target as
an independent edge pass on the discovery pairs measures them, are never more than the ranked circuit's, and are the
ones the held-out stage measures on the evaluation pairs; the ranked curve, CPR/CMD and the node circuit stay as
the ranked scan's. The stage is planned from its pass budget, counted and revised; ``settings["edge_search"]``
round-trips through ``Scan.load`` and the checker; the option is refused where it cannot apply."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

import circuitkit as ck
from circuitkit import CircuitkitError
from circuitkit.graph.runner import TaskRunner
from circuitkit.models.adapters import adapt
from circuitkit.tasks import Task, TaskScan
from circuitkit.tasks.scan import scan_task, split_pairs
from circuitkit.tasks.scores_check import check_task_scores
from circuitkit.tasks.search import DEFAULT_EDGE_SEARCH_PASSES, EDGE_SEARCH_NAMES
from tests.conftest import boot_bridge, gqa_bridge
from tests.test_tasks import toy_pairs

EXACT = 1e-5
"""One edge set measured by two stacked edge passes of other sets: float32 sums in another order."""
UNBOUNDED = {"max_passes": None}
"""The refined search run to its end (the tiny graph's ranked circuit of 36 edges is past the default budget's
first round of single drops)."""


@pytest.fixture(scope="module")
def scans():
    model = gqa_bridge()
    task = Task.from_pairs(toy_pairs(12), name="toy")
    ranked = scan_task(model, task, target=0.8, n_resamples=50)
    refined = scan_task(model, task, target=0.8, n_resamples=50, edge_search="refined",
                        edge_search_options=UNBOUNDED)
    return model, task, ranked, refined


def _edge_faithfulness(model, task: Task, index, edges: tuple[str, ...], kv_edges: str = "grouped") -> float:
    """The edge set's faithfulness on the pairs ``index``, by a fresh runner's own edge pass."""
    adapter = adapt(model)
    runner = TaskRunner(adapter, task.tokenize(adapter, None).subset(index), task.metric, mlps=True,
                        ablation=task.ablation, kv_edges=kv_edges)
    graph = runner.graph
    at = graph.allowed.nonzero()
    position = {name: i for i, name in enumerate(graph.edge_names(at))}
    mask = torch.zeros(1, *graph.allowed.shape, dtype=torch.bool)
    for edge in edges:
        i = position[edge]
        mask[0, at[i, 0], at[i, 1]] = True
    clean, corrupted = float(runner.clean["metric"].mean()), float(runner.corrupted["metric"].mean())
    return (float(runner.edge_metric(mask)[0]) - corrupted) / (clean - corrupted)


def test_the_refined_edges_reach_the_target_and_are_no_more_than_the_ranked_ones(scans):
    model, task, ranked, refined = scans
    a, b = ranked.circuit, refined.circuit
    assert ranked.settings["edge_search"]["name"] == "ranked" and refined.settings["edge_search"]["name"] == "refined"
    assert 0 < len(b.edges) < len(a.edges)  # the tiny graph's ranked circuit has edges a search can drop
    assert b.edge_faithfulness >= 0.8
    discovery, evaluation = split_pairs(task.n_pairs, 0.5, 0)
    assert _edge_faithfulness(model, task, discovery, b.edges) == pytest.approx(b.edge_faithfulness, abs=EXACT)
    # held out: the searched edges, measured on the evaluation pairs (the ranked ones give another figure)
    held = _edge_faithfulness(model, task, evaluation, b.edges)
    assert b.other_set["edge_faithfulness"] == pytest.approx(held, abs=EXACT)
    assert a.other_set["edge_faithfulness"] == pytest.approx(_edge_faithfulness(model, task, evaluation, a.edges),
                                                             abs=EXACT)
    # the ranking's figures and the node circuit are the ranked scan's
    assert b.edge_curve == a.edge_curve and b.cpr == a.cpr and b.cmd == a.cmd and b.n_edges_total == a.n_edges_total
    assert b.heads == a.heads and b.faithfulness == a.faithfulness
    assert {e.name for e in b.edge_effects} <= set(b.edges)
    assert {e.name for e in b.edge_effects} == {e.name for e in a.edge_effects} & set(b.edges)


def test_per_query_head_edges_with_the_target_on_the_evaluation_pairs(scans):
    """The search runs on the pairs the target applies to, over the graph the scan drew; the other set measures
    the searched edges."""
    model, task, _, _ = scans
    kwargs = {"target": 0.8, "n_resamples": 50, "kv_edges": "per-query-head", "target_on": "evaluation"}
    ranked = scan_task(model, task, **kwargs)
    refined = scan_task(model, task, **kwargs, edge_search="refined", edge_search_options=UNBOUNDED)
    b = refined.circuit
    assert 0 < len(b.edges) < len(ranked.circuit.edges) and b.edge_faithfulness >= 0.8
    assert b.edge_search.start == len(ranked.circuit.edges) and b.edge_search.size == len(b.edges)
    assert refined.settings["plan"]["edge-search"] == DEFAULT_EDGE_SEARCH_PASSES + 2  # two query heads a group
    discovery, evaluation = split_pairs(task.n_pairs, 0.5, 0)
    assert _edge_faithfulness(model, task, evaluation, b.edges, "per-query-head") == pytest.approx(
        b.edge_faithfulness, abs=EXACT)
    assert b.other_set["set"] == "discovery"
    assert b.other_set["edge_faithfulness"] == pytest.approx(
        _edge_faithfulness(model, task, discovery, b.edges, "per-query-head"), abs=EXACT)


def test_the_stage_is_planned_counted_and_recorded(scans):
    _, _, ranked, refined = scans
    assert "edge-search" not in [s.name for s in ranked.stages] and "edge-search" not in ranked.settings["plan"]
    names = [s.name for s in refined.stages]
    assert names.count("edge-search") == 1 and names.index("edges") < names.index("edge-search") < names.index(
        "held-out")
    stage = next(s for s in refined.stages if s.name == "edge-search")
    said = refined.settings["edge_search"]
    assert said["passes"] == stage.passes > 0
    assert said["options"] == UNBOUNDED and isinstance(said["pruned"], int) and said["pruned"] >= 0
    record = refined.circuit.edge_search  # the circuit's record of the search (SearchResult), as circuit.search's
    assert record.settings["stopped"] == "1-minimal, no swap reaches the target"
    assert record.settings["pruned"] == said["pruned"] and record.faithfulness == refined.circuit.edge_faithfulness
    assert refined.settings["plan"]["edge-search"] == DEFAULT_EDGE_SEARCH_PASSES + 1  # the budget + the pruned set
    assert record.start == len(ranked.circuit.edges) and record.size == len(refined.circuit.edges)
    assert ranked.circuit.edge_search is None and "edge_search" not in ranked.to_json()["circuit"]
    assert refined.to_json()["circuit"]["edge_search"] == record.to_json()
    assert ranked.settings["edge_search"] == {"name": "ranked", "options": {}, "pruned": None,
                                              "passes": next(s.passes for s in ranked.stages if s.name == "edges")}
    # the answer says how the edge circuit was found
    assert (f"Edge circuit: {len(refined.circuit.edges)} of {refined.circuit.n_edges_total} edges reach "
            f"faithfulness {refined.circuit.edge_faithfulness:.3f} (the {len(ranked.circuit.edges)} edges ranked by "
            f"abs score, {said['pruned']} dangling edge{'' if said['pruned'] == 1 else 's'} pruned, then the refined "
            f"search in {stage.passes:.0f} "
            "passes)") in refined.answer()
    assert "edges ranked by abs score); MIB's CPR" in ranked.answer()


def test_the_pass_budget_stops_the_search_at_a_circuit_that_still_reaches_the_target(scans):
    model, task, _, refined = scans
    told = []
    bounded = scan_task(model, task, target=0.8, n_resamples=50, edge_search="refined",
                        edge_search_options={"max_passes": 12, "singles": 8},
                        progress=lambda stage, passes: told.append((stage, passes)))
    said = bounded.settings["edge_search"]
    assert bounded.circuit.edge_search.settings["stopped"] == "max_passes"
    assert said["options"] == {"max_passes": 12.0, "singles": 8}
    assert 0 < said["passes"] < refined.settings["edge_search"]["passes"]
    assert bounded.settings["plan"]["edge-search"] == 12 + 1
    assert ("edge-search", said["passes"]) in told
    assert bounded.circuit.edge_faithfulness >= 0.8
    discovery, _ = split_pairs(task.n_pairs, 0.5, 0)
    assert _edge_faithfulness(model, task, discovery, bounded.circuit.edges) == pytest.approx(
        bounded.circuit.edge_faithfulness, abs=EXACT)
    # the default budget: the 36-edge circuit's single drops (36 passes) are past 30: no round runs
    default = scan_task(model, task, target=0.8, n_resamples=50, edge_search="refined")
    assert default.settings["edge_search"]["options"] == {"max_passes": DEFAULT_EDGE_SEARCH_PASSES}
    assert default.circuit.edge_search.settings["stopped"] == "max_passes"
    assert default.settings["edge_search"]["passes"] <= DEFAULT_EDGE_SEARCH_PASSES + 1


def test_the_saved_scan_reloads_and_the_checker_refuses_a_wrong_name(scans, tmp_path):
    _, _, _, refined = scans
    refined.save(tmp_path / "scan")
    loaded = ck.Scan.load(tmp_path / "scan")
    assert type(loaded) is TaskScan
    assert loaded.settings == refined.settings and loaded.stages == refined.stages
    assert loaded.circuit.edges == refined.circuit.edges
    assert loaded.circuit.edge_faithfulness == pytest.approx(refined.circuit.edge_faithfulness, abs=1e-12)
    data = json.loads((tmp_path / "scan" / "scores.json").read_text(encoding="utf-8"))
    check_task_scores(data, "scores.json")
    report = (tmp_path / "scan" / "report.html").read_text(encoding="utf-8")
    assert (f"The marked size is the refined search's circuit ({len(refined.circuit.edges)} edges at "
            f"{refined.circuit.edge_faithfulness:.3f})") in report
    import jsonschema

    schema = json.loads((Path(ck.tasks.__file__).parent / "task_scores.schema.json").read_text(encoding="utf-8"))
    jsonschema.validate(data, schema)
    assert tuple(schema["properties"]["settings"]["properties"]["edge_search"]["properties"]["name"]["enum"]) == (
        EDGE_SEARCH_NAMES)
    for path, value, needle in [(("edge_search", "name"), "masks", "settings.edge_search.name"),
                                (("edge_search", "pruned"), -1, "settings.edge_search.pruned"),
                                (("edge_search", "passes"), -2.0, "settings.edge_search.passes"),
                                (("edge_search", "extra"), 1, "settings.edge_search"),
                                (("search", "name"), "best", "settings.search.name")]:
        bad = copy.deepcopy(data)
        bad["settings"][path[0]][path[1]] = value
        with pytest.raises(CircuitkitError, match=needle):
            check_task_scores(bad, "scores.json")
    bad = copy.deepcopy(data)
    bad["settings"]["edge_search"]["name"] = "ranked"  # a ranked circuit prunes nothing
    with pytest.raises(CircuitkitError, match="settings.edge_search.pruned"):
        check_task_scores(bad, "scores.json")
    bad = copy.deepcopy(data)
    bad["settings"]["edges"] = False  # no edge circuit (a family without edges): no edge search either
    with pytest.raises(CircuitkitError, match="settings.edge_search.passes"):
        check_task_scores(bad, "scores.json")
    bad["settings"]["edge_search"].update(passes=None, pruned=None)
    del bad["circuit"]["edge_search"]
    check_task_scores(bad, "scores.json")  # asked for, not run: said so
    for key, value, needle in [("size", 3, "circuit.edge_search.size"),
                               ("search", "masks", "circuit.edge_search.search.*settings.edge_search"),
                               ("faithfulness", 0.1, "circuit.edge_search.faithfulness"),
                               ("start_size", 10**6, "circuit.edge_search.start_size")]:
        bad = copy.deepcopy(data)
        bad["circuit"]["edge_search"][key] = value
        with pytest.raises(CircuitkitError, match=needle):
            check_task_scores(bad, "scores.json")
    bad = copy.deepcopy(data)
    bad["settings"]["edge_search"].update(name="ranked", pruned=None, options={})
    with pytest.raises(CircuitkitError, match="circuit.edge_search.*absent"):
        check_task_scores(bad, "scores.json")  # a record of a search that did not run
    assert loaded.circuit.edge_search.start == refined.circuit.edge_search.start
    older = copy.deepcopy(data)  # a file written before the record: the search still named in the answer and page
    del older["circuit"]["edge_search"]
    from circuitkit.tasks.reload import task_scan_from_json
    from circuitkit.tasks.report import task_report

    old_scan = task_scan_from_json(older, "scores.json", TaskScan)
    assert old_scan.circuit.edge_search is None
    assert f"pruned, then the refined search in {data['settings']['edge_search']['passes']:.0f} passes" in (
        old_scan.answer())
    assert "The marked size is the refined search's circuit" in task_report(old_scan)


@pytest.mark.parametrize("kwargs, needle", [
    ({"edge_search": "masks"}, "edge_search.*'ranked', 'refined'"),
    ({"edge_search": "refined", "edges": False}, "edge_search.*edges=False"),
    ({"edge_search": "refined", "quick": True}, "edge_search.*quick"),
    ({"edge_search_options": {"max_passes": 5}}, "edge_search_options.*'ranked'"),
    ({"edge_search": "refined", "edge_search_options": [("max_passes", 5)]}, "edge_search_options.*a dict"),
    ({"edge_search": "refined", "edge_search_options": {"steps": 3}}, "edge_search_options.*options among"),
    ({"edge_search": "refined", "edge_search_options": {"progress": print}}, "edge_search_options"),
    ({"edge_search": "refined", "edge_search_options": {"max_passes": -1}}, "max_passes"),
])
def test_the_option_is_refused_where_wrong_before_any_pass(kwargs, needle):
    model = boot_bridge(d_vocab=50)
    with pytest.raises(CircuitkitError, match=needle):
        scan_task(model, Task.from_pairs(toy_pairs(6)), progress=lambda *a: pytest.fail(f"a stage ran: {a}"),
                  **kwargs)


def test_ck_scan_passes_the_option_to_a_task_and_refuses_it_without_one():
    model = boot_bridge(d_vocab=50, attn_only=False)
    task = Task.from_pairs(toy_pairs(6), name="toy")
    result = ck.scan(model, task=task, edge_search="refined", n_resamples=20)
    assert result.settings["edge_search"]["name"] == "refined"
    assert [s.name for s in result.stages].count("edge-search") == 1
    with pytest.raises(CircuitkitError, match="edge_search"):
        ck.scan(model, edge_search="refined")


def test_no_behaviour_skips_the_stage_and_says_no_search_ran(tmp_path):
    pairs = [([1, 2, 3, 4, 5 + i], [1, 2, 3, 4, 5 + i], [7], [9]) for i in range(6)]  # corrupted = clean
    told = []
    result = scan_task(boot_bridge(d_vocab=50, attn_only=False), Task.from_pairs(pairs, name="same"),
                       edge_search="refined", n_resamples=20, progress=lambda stage, passes: told.append(stage))
    assert result.circuit is None and "edge-search" not in told
    assert result.settings["edge_search"] == {"name": "refined", "options": {"max_passes": DEFAULT_EDGE_SEARCH_PASSES},
                                              "passes": None, "pruned": None}
    result.save(tmp_path / "scan")
    assert ck.Scan.load(tmp_path / "scan").settings == result.settings


JUNK = (None, True, -1, 0, 2.5, float("nan"), "x", "", [], [1], {}, {"a": 1}, 10**30)
"""What a fuzzer puts in a field: every type JSON has, out-of-range numbers, empty containers."""


def test_a_fuzzed_search_record_is_refused_or_loads_never_a_raw_error(tmp_path):
    """Every field of ``circuit.search`` and ``circuit.edge_search`` (and of their trace's first step), each replaced
    by each of :data:`JUNK` or removed: the load refuses with a CircuitkitError naming the file and the field, or
    loads a scan (a value that is still valid), and never raises another error."""
    from circuitkit.tasks.reload import task_scan_from_json

    model = gqa_bridge()
    both = scan_task(model, Task.from_pairs(toy_pairs(12), name="toy"), target=0.8, n_resamples=20,
                     search="refined", edge_search="refined", edge_search_options={"max_passes": 8})
    both.save(tmp_path / "scan")
    data = json.loads((tmp_path / "scan" / "scores.json").read_text(encoding="utf-8"))
    assert task_scan_from_json(copy.deepcopy(data), "scores.json", TaskScan).circuit.search.start >= 1
    refused = 0
    for key in ("search", "edge_search"):
        record = data["circuit"][key]
        paths = [(key, field) for field in record] + [(key, "trace", 0, field) for field in record["trace"][0]]
        for path in paths:
            for value in (*JUNK, "<removed>"):
                bad = copy.deepcopy(data)
                holder = bad["circuit"]
                for step in path[:-1]:
                    holder = holder[step]
                if value == "<removed>":
                    del holder[path[-1]]
                else:
                    holder[path[-1]] = value
                try:
                    task_scan_from_json(bad, "TaskScan.load: 'scores.json'", TaskScan)
                except CircuitkitError as error:
                    message = str(error)
                    assert "\n" not in message and "scores.json" in message and "field '" in message, message
                    refused += 1
    assert refused > 100  # most of them are no record a scan writes
