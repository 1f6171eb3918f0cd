"""Both scans declare their stages as one record type (:class:`circuitkit.stage.Stage`) and run them through one
loop (:func:`circuitkit.stage.run_planned`): each stage reads only what its scan's state starts with or an earlier
stage wrote, and a stage an earlier one skipped does not run."""

from __future__ import annotations

import dataclasses

import pytest

from circuitkit.progress import Progress
from circuitkit.stage import Stage, plan_of, run_planned

STARTS = {
    "induction": {"session"},
    "task": {"options", "runner", "held", "search", "other", "told"},
}


def _declared():
    from circuitkit.pipeline import STAGES, ScanState
    from circuitkit.tasks.stages import TASK_STAGES, TaskScanState

    return {"induction": (STAGES, ScanState, {"session.clean"}), "task": (TASK_STAGES, TaskScanState, set())}


@pytest.mark.parametrize("scan", ["induction", "task"])
def test_each_scans_stages_declare_what_they_read_and_write(scan):
    stages, state_type, extra = _declared()[scan]
    fields = {f.name for f in dataclasses.fields(state_type)} | extra
    assert all(isinstance(stage, Stage) for stage in stages)
    assert len({stage.name for stage in stages}) == len(stages)
    written = set(STARTS[scan])
    assert written <= fields
    for stage in stages:  # a stage reads only what the state starts with or an earlier stage wrote
        assert set(stage.reads) <= written, (stage.name, set(stage.reads) - written)
        assert set(stage.writes) <= fields, (stage.name, set(stage.writes) - fields)
        assert stage.what and "\n" not in stage.what
        written |= set(stage.writes)


def test_the_loop_runs_the_planned_stages_in_order_and_not_a_skipped_one():
    ran: list[str] = []

    def run(name, skip=None):
        def stage_run(state, settings, bar):
            bar.start(name)
            ran.append(name)
            bar.advance(settings[name])
            bar.end()
            if skip:
                bar.skip(skip, "nothing left for it")

        return stage_run

    stages = (
        Stage("a", "first", (), ("x",), lambda s, state: s["a"], run("a")),
        Stage("b", "off by its settings", ("x",), ("y",), lambda s, state: s["b"], run("b"), runs=lambda s: False),
        Stage("c", "skips d", ("x",), ("z",), lambda s, state: s["c"], run("c", skip="d")),
        Stage("d", "skipped", ("z",), (), lambda s, state: s["d"], run("d")),
        Stage("e", "last", ("x",), (), lambda s, state: s["e"], run("e")),
    )
    settings = {"a": 1, "b": 2, "c": 3, "d": 4, "e": 5}
    plan = plan_of(stages, settings, None)
    assert plan == [("a", 1), ("c", 3), ("d", 4), ("e", 5)]
    bar = Progress("off", plan)
    run_planned(stages, None, settings, bar)
    assert ran == ["a", "c", "e"]
    assert [(r.name, r.passes) for r in bar.ran] == [("a", 1), ("c", 3), ("e", 5)]
    assert [(r.stage, r.after) for r in bar.revisions] == [("d", 0)]


def test_a_task_scans_plan_is_its_declared_stages():
    from circuitkit.tasks.stages import TASK_STAGE_NAMES, PlanInputs, task_plan

    plan = PlanInputs(nodes=12, edges_total=100, pairs=8, held=8, direct=True, steps=3, edges=False, quick=False,
                      random_sets=2, stability=0, search="refined", search_passes=15.0, node_ranking="eap-ig")
    names = [name for name, _ in task_plan(plan)]
    assert names == ["clean", "corrupted", "attribute", "nodes", "search", "random-sets", "held-out"]
    assert list(TASK_STAGE_NAMES)[:6] == ["clean", "corrupted", "attribute", "joint", "ablate", "nodes"]
    # each head patched alone (ablate): planned at half a pass a head, after the ranking, before the search
    single = dataclasses.replace(plan, single_heads=8)
    assert [name for name, _ in task_plan(single)][:5] == ["clean", "corrupted", "attribute", "ablate", "nodes"]
    assert dict(task_plan(single))["ablate"] == 4.0
    assert dict(task_plan(plan))["search"] == 15.0 and dict(task_plan(plan))["random-sets"] == 4
    # the corrupted run read from EAP-IG's first point: no stage of its own, one pass fewer per stability rerun
    folded = dataclasses.replace(plan, folded=True, stability=2)
    assert [name for name, _ in task_plan(folded)][:3] == ["clean", "attribute", "nodes"]
    apart = dataclasses.replace(plan, stability=2)
    assert dict(task_plan(folded))["stability"] == dict(task_plan(apart))["stability"] - 2
    # nodes ranked by the joint path: its stage before the search, and each stability rerun ranks by it too (its
    # clean and corrupted runs, 6 passes for the path, where EAP-IG's rerun took 3 a point)
    joint = dataclasses.replace(plan, node_ranking="joint", stability=2, folded=True)
    assert [name for name, _ in task_plan(joint)][:4] == ["clean", "attribute", "joint", "nodes"]
    assert dict(task_plan(joint))["joint"] == 6
    assert dict(task_plan(joint))["stability"] == dict(task_plan(folded))["stability"] + 2 * (1 + 6 - 3 * 3)


@pytest.mark.parametrize("where", ["circuitkit.pipeline:scan", "circuitkit.tasks.scan:scan_task"])
def test_each_scan_is_a_short_function_over_its_stages(where):
    """Both scans read as the same few steps (options checked, the state prepared, the declared stages run, the
    record built), each step a function of its own."""
    import importlib
    import inspect

    module, name = where.split(":")
    fn = inspect.unwrap(getattr(importlib.import_module(module), name))
    source = inspect.getsource(fn)
    docstring = inspect.getdoc(fn) or ""
    code_lines = len(source.splitlines()) - len(docstring.splitlines()) - 1  # the quotes' own line
    assert code_lines < 60, code_lines
    assert "run_stages" in source or "run_planned" in source
