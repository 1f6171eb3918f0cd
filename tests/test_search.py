"""Circuit searches beyond ranking (circuits/search.py, tasks/search.py): the refined circuit is never larger than
the ranked one and reaches the target as an independent patched pass measures it; it is 1-minimal, checked against a
brute force over every head set of a tiny model; learned masks are deterministic with a seed and confirmed exactly;
the gated run equals exact patching at 0/1 masks; scan_task(search=...) wires it in; bad options are refused."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch

from circuitkit import CircuitkitError, RepeatedTokens, zoo
from circuitkit.circuits.faithfulness import faithfulness as induction_faithfulness
from circuitkit.circuits.faithfulness import find_circuit
from circuitkit.circuits.search import SEARCHES, induction_problem, run_search
from circuitkit.graph.runner import TaskRunner
from circuitkit.models.adapters import adapt
from circuitkit.tasks import Task, scan_task
from circuitkit.tasks.circuit import node_circuit
from circuitkit.tasks.search import held_out, search_node_circuit, task_problem
from tests.conftest import boot_bridge
from tests.test_tasks import copy_next_task, toy_pairs

EXACT = 1e-5
"""The same node set measured by two patched passes (stacked with other sets or alone): float32 metrics of order 1,
summed in another order."""
GATED = 1e-4
"""The gated run at 0/1 masks against exact patching: ``v + 1 (z - v)`` rounds differently from ``z`` in float32."""
TARGETS = (0.5, 0.8, 0.95)


def tiny_runner(seed: int, mlps: bool = True) -> TaskRunner:
    """Two layers of four heads (8 heads: 256 head sets, all measurable) on eight random pairs."""
    model = boot_bridge(attn_only=not mlps, n_layers=2, n_heads=4, d_vocab=50, seed=seed)
    adapter = adapt(model)
    task = Task.from_pairs(toy_pairs(8), name="toy")
    return TaskRunner(adapter, task.tokenize(adapter), "logit_diff", mlps=mlps, ablation="corrupted")


def independent_faithfulness(runner: TaskRunner, heads: tuple) -> float:
    """The node circuit ``heads``' faithfulness from a fresh runner (its own clean and corrupted runs) and one
    node_metric call of two sets: every head patched, every head outside ``heads`` patched."""
    fresh = TaskRunner(runner.adapter, runner.batch, "logit_diff", mlps=runner.graph.mlps, ablation="corrupted")
    L, H = fresh.spec.n_layers, fresh.spec.n_heads
    patched = torch.ones(2, L, H, dtype=torch.bool)
    for layer, h in heads:
        patched[1, layer, h] = False
    all_patched, circuit = fresh.node_metric(patched, None).tolist()
    clean = float(fresh.clean["metric"].mean())
    return (circuit - all_patched) / (clean - all_patched)


def brute_force(runner: TaskRunner) -> dict[frozenset, float]:
    """Every head set's faithfulness (heads only; MLPs clean), stacked."""
    L, H = runner.spec.n_layers, runner.spec.n_heads
    heads = [(layer, h) for layer in range(L) for h in range(H)]
    sets = [frozenset(c) for k in range(len(heads) + 1) for c in itertools.combinations(heads, k)]
    patched = torch.ones(len(sets), L, H, dtype=torch.bool)
    for i, s in enumerate(sets):
        for layer, h in s:
            patched[i, layer, h] = False
    values = runner.node_metric(patched, None).tolist()
    all_patched = values[0]
    clean = float(runner.clean["metric"].mean())
    return {s: (v - all_patched) / (clean - all_patched) for s, v in zip(sets, values, strict=True)}


@pytest.fixture(scope="module", params=[3, 5, 11])
def tiny(request):
    runner = tiny_runner(request.param)
    _, node_scores = runner.edge_gradients(2)
    return runner, node_scores


@pytest.mark.parametrize("target", TARGETS)
def test_refined_is_never_larger_than_ranked_and_reaches_the_target_exactly(tiny, target):
    runner, node_scores = tiny
    found = node_circuit(runner, node_scores, target, "abs")
    circuit, result = search_node_circuit("refined", runner, node_scores, found, target, "abs")
    assert len(circuit[0]) <= len(found[0]) and result.size == len(circuit[0])
    assert result.start == len(found[0]) and result.passes > 0
    assert circuit[2] >= target
    assert independent_faithfulness(runner, circuit[0]) == pytest.approx(circuit[2], abs=EXACT)
    # the necessity reported is the metric lost with only the refined set patched
    L, H = runner.spec.n_layers, runner.spec.n_heads
    only = torch.zeros(1, L, H, dtype=torch.bool)
    for layer, h in circuit[0]:
        only[0, layer, h] = True
    lost = float(runner.clean["metric"].mean()) - float(runner.node_metric(only, None)[0])
    assert circuit[3] == pytest.approx(lost, abs=EXACT)


@pytest.mark.parametrize("target", TARGETS)
def test_refined_is_one_minimal_against_a_brute_force_over_every_head_set(tiny, target):
    """Provable by construction and checked here against all 256 head sets measured independently: the refined set
    reaches the target, no single member can go, and it is no smaller than the smallest set reaching the target
    (the brute-force optimum) nor larger than the ranked one."""
    runner, node_scores = tiny
    table = brute_force(runner)
    found = node_circuit(runner, node_scores, target, "abs")
    circuit, _ = search_node_circuit("refined", runner, node_scores, found, target, "abs")
    chosen = frozenset(circuit[0])
    assert table[chosen] == pytest.approx(circuit[2], abs=EXACT) and table[chosen] >= target
    for member in chosen:
        assert table[chosen - {member}] < target, f"{member} could still be dropped"
    optimum = min(len(s) for s, v in table.items() if v >= target)
    assert optimum <= len(chosen) <= len(found[0])


def test_refined_reaches_the_brute_force_optimum_where_ranking_does_not():
    """A measured example (seeded tiny model, target 0.8): the ranked circuit is larger than the smallest head set
    reaching the target, and refinement finds a set of that smallest size."""
    runner = tiny_runner(5)
    _, node_scores = runner.edge_gradients(2)
    table = brute_force(runner)
    optimum = min(len(s) for s, v in table.items() if v >= 0.8)
    found = node_circuit(runner, node_scores, 0.8, "abs")
    circuit, _ = search_node_circuit("refined", runner, node_scores, found, 0.8, "abs")
    assert len(found[0]) > optimum
    assert len(circuit[0]) == optimum


def test_a_pass_budget_stops_refinement_with_a_measured_circuit_and_says_so(tiny):
    runner, node_scores = tiny
    found = node_circuit(runner, node_scores, 0.8, "abs")
    circuit, result = search_node_circuit("refined", runner, node_scores, found, 0.8, "abs",
                                          options={"max_passes": 0})
    assert result.settings["stopped"] == "max_passes" and result.passes == 0 and circuit[0] == found[0]
    _, full = search_node_circuit("refined", runner, node_scores, found, 0.8, "abs")
    assert full.settings["stopped"] in ("1-minimal, no swap reaches the target", "one node left")


def test_masks_are_deterministic_with_a_seed_and_confirmed_exactly(tiny):
    runner, node_scores = tiny
    found = node_circuit(runner, node_scores, 0.8, "abs")
    options = {"steps": 15, "lr": 0.2, "sparsity": 0.01, "seed": 7}
    first, a = search_node_circuit("masks", runner, node_scores, found, 0.8, "abs", options=options)
    second, b = search_node_circuit("masks", runner, node_scores, found, 0.8, "abs", options=options)
    assert first[0] == second[0] and a.faithfulness == b.faithfulness
    assert a.settings["final_sparsity"] == b.settings["final_sparsity"] and a.trace == b.trace
    assert a.passes >= 3 * 15  # a forward and a backward per step
    assert first[2] >= 0.8
    assert independent_faithfulness(runner, first[0]) == pytest.approx(first[2], abs=EXACT)


@pytest.mark.parametrize("begin", ["start", "all"])
def test_masks_answer_the_smallest_set_their_steps_ran_reaching_the_target(tiny, begin):
    """Every step runs one discrete set exactly (straight-through): the answer is no larger than the ranked start
    (begin="start": the start is the first set run), reaches the target by an independent pass and, against the
    brute force, is a set of that faithfulness; with refine, 1-minimal."""
    runner, node_scores = tiny
    table = brute_force(runner)
    found = node_circuit(runner, node_scores, 0.8, "abs")
    options = {"steps": 20, "begin": begin}
    circuit, result = search_node_circuit("masks", runner, node_scores, found, 0.8, "abs", options=options)
    assert circuit[2] >= 0.8 and table[frozenset(circuit[0])] == pytest.approx(circuit[2], abs=EXACT)
    assert len(circuit[0]) <= len(found[0])
    assert result.settings["sets_seen"] >= 1 and result.passes >= 3 * 20
    polished, _ = search_node_circuit("masks", runner, node_scores, found, 0.8, "abs",
                                      options={**options, "refine": True})
    chosen = frozenset(polished[0])
    assert len(chosen) <= len(circuit[0]) and table[chosen] >= 0.8
    for member in chosen:
        assert table[chosen - {member}] < 0.8


@pytest.mark.parametrize("mlps", [False, True], ids=["heads", "heads-and-mlps"])
def test_the_gated_run_equals_exact_patching_at_zero_one_masks(mlps):
    runner = tiny_runner(3)
    _, node_scores = runner.edge_gradients(1)
    all_patched = float(runner.node_metric(torch.ones(1, 2, 4, dtype=torch.bool),
                                           torch.ones(1, 2, dtype=torch.bool) if mlps else None)[0])
    problem = task_problem(runner, node_scores, all_patched, mlp_nodes=mlps)
    g = torch.Generator().manual_seed(0)
    kept = torch.rand(4, problem.n, generator=g) > 0.5
    exact = problem.faithfulness(kept)
    gated = torch.stack([problem.gated(k.float()).detach() for k in kept])
    torch.testing.assert_close(gated.double(), exact.double(), atol=GATED, rtol=0)


def test_induction_refined_is_no_larger_and_reaches_the_target_by_the_public_figure():
    model = zoo.load()
    tokens = RepeatedTokens(batch=8)
    circuit = find_circuit(model, tokens, target=0.95, necessity=False)
    from circuitkit.circuits.faithfulness import Ablator, ablation_values

    adapter = adapt(model)
    batch = tokens.build(adapter)
    values, _ = ablation_values(adapter, batch, "mean")
    problem = induction_problem(Ablator(adapter, batch, values), circuit.clean_loss, circuit.all_ablated_loss)
    H = adapter.spec.n_heads
    start = [layer * H + h for layer, h in circuit.heads]
    for name in ("refined", "masks"):
        options = {"steps": 20, "lr": 0.2} if name == "masks" else {}
        result = run_search(name, problem, start, 0.95, start_faithfulness=circuit.faithfulness, **options)
        heads = [divmod(i, H) for i in result.kept]
        assert result.faithfulness >= 0.95
        assert induction_faithfulness(model, heads, tokens) == pytest.approx(result.faithfulness, abs=EXACT)
        if name == "refined":
            assert result.size <= circuit.n_heads


def test_scan_task_search_replaces_the_node_circuit_and_says_which_ran(tmp_path):
    from circuitkit.handbuilt.induction import induction_circuit

    model = induction_circuit(10, 16).model
    task = copy_next_task(16)
    ranked = scan_task(model, task, target=0.9, edges=False)
    refined = scan_task(model, task, target=0.9, edges=False, search="refined")
    assert ranked.settings["search"]["name"] == "ranked" and refined.settings["search"]["name"] == "refined"
    assert refined.settings["search"]["passes"] > 0
    assert [s.name for s in refined.stages].count("search") == 1
    c = refined.circuit
    assert len(c.heads) <= len(ranked.circuit.heads) and c.faithfulness >= 0.9
    # the held-out figures are the refined set's, measured on the evaluation pairs
    adapter = adapt(model)
    from circuitkit.tasks.scan import split_pairs

    batch = task.tokenize(adapter, None)
    _, evaluation = split_pairs(task.n_pairs, 0.5, 0)
    other = TaskRunner(adapter, batch.subset(evaluation), task.metric, mlps=False, ablation=task.ablation)
    expected = held_out(other, c.heads, c.mlps, False)
    assert c.other_set["faithfulness"] == pytest.approx(expected["faithfulness"], abs=EXACT)
    assert c.other_set["necessity"] == pytest.approx(expected["necessity"], abs=EXACT)
    import jsonschema

    from circuitkit import tasks

    schema = json.loads((Path(tasks.__file__).parent / "task_scores.schema.json").read_text())
    jsonschema.validate(refined.to_json(), schema)
    # the page rings each node curve at the searched set's own figure, off the curve, and says so
    import re

    from circuitkit.tasks.report import task_report

    page, plain = task_report(refined, compress=False), task_report(ranked, compress=False)
    n = len(c.heads) + len(c.mlps)
    assert page.count(f"The ring is the refined search's circuit ({n} heads") == 2  # discovery, held out
    rings = re.findall(r'class="ck-searched"[^>]*><title>([^<]*)</title>', page)
    assert rings == [f"the refined set: {n} heads at faithfulness {c.faithfulness:.3f}",
                     f"the refined set: {n} heads at faithfulness "
                     f"{c.other_set['faithfulness']:.3f}"], rings
    assert "The ring is the" not in plain and "ck-searched" not in plain


def test_the_registry_holds_every_search_with_one_signature():
    import inspect

    assert set(SEARCHES) == {"ranked", "refined", "masks"}
    for fn in SEARCHES.values():
        assert list(inspect.signature(fn).parameters)[:3] == ["problem", "start", "target"]


@pytest.mark.parametrize("name, options, needle", [
    ("greedy", {}, "search"),
    ("refined", {"swaps": -1}, "swaps"),
    ("refined", {"steps": 3}, "options"),
    ("refined", {"max_passes": -1}, "max_passes"),
    ("masks", {"steps": 0}, "steps"),
    ("masks", {"lr": 0.0}, "lr"),
    ("masks", {"sparsity": -1.0}, "sparsity"),
    ("masks", {"seed": "x"}, "seed"),
    ("masks", {"begin": "none"}, "begin"),
    ("masks", {"rate": -1.0}, "rate"),
    ("masks", {"init": 0.0}, "init"),
    ("refined", {"singles": -1}, "singles"),
])
def test_bad_search_options_are_refused(tiny, name, options, needle):
    runner, node_scores = tiny
    found = node_circuit(runner, node_scores, 0.8, "abs")
    with pytest.raises(CircuitkitError, match=needle):
        search_node_circuit(name, runner, node_scores, found, 0.8, "abs", options=options)


def test_a_start_below_the_target_and_a_bad_scan_option_are_refused(tiny):
    runner, node_scores = tiny
    problem = task_problem(runner, node_scores, float(runner.corrupted["metric"].mean()))
    with pytest.raises(CircuitkitError, match="start"):
        run_search("refined", problem, [0], 0.8, start_faithfulness=0.1)
    with pytest.raises(CircuitkitError, match="target"):
        run_search("refined", problem, [0], 1.5)
    model = boot_bridge(d_vocab=50)
    with pytest.raises(CircuitkitError, match="search"):
        scan_task(model, Task.from_pairs(toy_pairs(3)), search="best")
    with pytest.raises(CircuitkitError, match="search_options"):
        scan_task(model, Task.from_pairs(toy_pairs(3)), search="refined", search_options=[("steps", 3)])


def test_find_circuit_search_refines_the_induction_circuit_and_measures_it_again():
    model = zoo.load()
    tokens = RepeatedTokens(batch=8)
    ranked = find_circuit(model, tokens, target=0.95)
    refined = find_circuit(model, tokens, target=0.95, search="refined", search_options={"swaps": 2})
    assert ranked.search is None and refined.search.search == "refined"
    assert refined.n_heads <= ranked.n_heads and refined.faithfulness >= 0.95
    # the search runs on the ranked search's ablator (its values are not computed again): the ranked passes, the
    # search's, and one stacked call of 4 copies (nothing, everything, the circuit kept, the circuit ablated)
    assert refined.passes == ranked.passes + refined.search.passes + 4
    assert induction_faithfulness(model, refined.heads, tokens) == pytest.approx(refined.faithfulness, abs=EXACT)
    lo, hi = refined.intervals["faithfulness"]
    assert lo <= refined.faithfulness <= hi
    assert refined.necessity is not None and refined.curve == ranked.curve
    with pytest.raises(CircuitkitError, match="search"):
        find_circuit(model, tokens, search="exhaustive")
    with pytest.raises(CircuitkitError, match="swaps"):
        find_circuit(model, tokens, search="refined", search_options={"swaps": "many"})


def _ten_that_matter():
    """A fresh synthetic search problem of 40 nodes, of which 10 carry the behaviour and 30 almost nothing (its
    faithfulness the kept share of the weights; each measured set one pass)."""
    from circuitkit.circuits.search import SearchProblem

    weights = torch.tensor([1.0] * 10 + [0.001] * 30, dtype=torch.float64)
    spent = [0.0]

    def faithfulness(kept):
        spent[0] += kept.shape[0]
        return (kept.double() * weights).sum(dim=1) / weights.sum()

    return SearchProblem(tuple(str(i) for i in range(40)), faithfulness, None, lambda: spent[0], weights.float())


def test_a_budget_below_a_round_still_drops_the_least_important_members():
    """A budget that does not afford a round of single drops (one pass per member) tries the least important
    members it affords, drops those that can go, keeps within the budget and says the budget stopped it; every
    accepted set reaches the target. Synthetic: 10 nodes carry the behaviour, 30 carry almost nothing."""
    from circuitkit.circuits.search import run_search

    start = list(range(40))
    bounded = run_search("refined", _ten_that_matter(), start, 0.8, start_faithfulness=1.0, max_passes=20)
    assert bounded.settings["stopped"] == "max_passes" and bounded.passes <= 20
    assert 10 <= bounded.size < 40 and set(range(10)) <= set(bounded.kept)  # only near-zero members went
    assert bounded.faithfulness >= 0.8 and all(f >= 0.8 for _, _, f in bounded.trace)
    unbounded = run_search("refined", _ten_that_matter(), start, 0.8, start_faithfulness=1.0)
    assert unbounded.size == 9 and unbounded.faithfulness >= 0.8  # 9 of the 10: 0.897; 8 reach only 0.798


def test_a_budget_the_block_phase_spent_past_stops_the_search_instead_of_raising():
    """The block phase measures the blocks that can go together after its round (a few sizes), which can spend past
    ``max_passes``; the round of single drops that follows then has a negative number of passes left and stops the
    search as over budget (it raised a raw ``math domain error`` there). Every budget and block threshold returns a
    circuit that reaches the target."""
    from circuitkit.circuits.search import run_search

    stopped = set()
    for budget in range(1, 60):
        for singles in (4, 8, 16):
            found = run_search("refined", _ten_that_matter(), list(range(40)), 0.8, start_faithfulness=1.0,
                               max_passes=budget, singles=singles)
            assert found.faithfulness >= 0.8 and set(range(9)) <= set(found.kept)
            stopped.add(found.settings["stopped"])
    assert "max_passes" in stopped


@pytest.mark.parametrize("name, options, needle", [
    ("masks", {"lr": -1}, "masks search: lr"),
    ("masks", {"begin": "middle"}, "masks search: begin"),
    ("masks", {"refine": "yes"}, "masks search: refine"),
    ("masks", {"steps": 0}, "masks search: steps"),
    ("refined", {"swaps": 1000}, "refined search: swaps"),
    ("refined", {"max_rounds": 0}, "refined search: max_rounds"),
    ("refined", {"max_passes": float("nan")}, "refined search: max_passes"),
])
def test_a_bad_search_option_value_is_refused_before_any_pass(name, options, needle):
    """A search's option values are checked where the options are (before the scan's first pass), by the checks
    the search itself runs: before, a bad value waited for the clean, corrupted, attribution and node stages."""
    from circuitkit.circuits.search import OPTION_CHECKS, _accepted, check_search_options

    for search in OPTION_CHECKS:  # every option a user sets has its check
        assert set(OPTION_CHECKS[search]) == _accepted(search, users=True)
    with pytest.raises(CircuitkitError, match=needle):
        check_search_options("scan: search_options", name, options)
    model = boot_bridge(d_vocab=50)
    with pytest.raises(CircuitkitError, match=needle):
        scan_task(model, Task.from_pairs(toy_pairs(6)), search=name, search_options=options,
                  progress=lambda *stage: pytest.fail(f"a stage ran: {stage}"))
    assert check_search_options("scan: search_options", "refined", {"max_passes": 4}) == {"max_passes": 4.0}
