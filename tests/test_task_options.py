"""Every option of a scan on both behaviours: the induction scan (``ck.scan(model)``) and a pair task
(``ck.scan(model, task=...)``), on the bundled model, which copies in context (so both have a circuit).

Options: ``edges=False`` / ``--no-edges``, ``--quick``, ``stability``, ``random_sets``, ``target``, a bfloat16 model,
``device``, and the progress plan (planned before the first pass, each stage's own seconds). Where an independent
computation exists the figure is checked against it: a task's stability reruns against the node search run by hand
on the same resampled pairs, its random sets against the same sets patched by hand.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

import circuitkit as ck
from circuitkit import cli, zoo
from circuitkit.detect.tokens import RepeatedTokens
from tests.test_tasks import copy_next_task, task_file

BEHAVIOURS = ("induction", "task")
BF16_TOLERANCE = 0.05
"""Absolute agreement of a bfloat16 task scan with float32 on the bundled model: the mean metric (logits; the clean
logit difference is about 5 and bfloat16 keeps 8 bits of mantissa, about 4e-3 relative per rounding over two
layers) and the circuit's faithfulness (a ratio of such differences)."""


@pytest.fixture(scope="module")
def model():
    return zoo.load()


def _task():
    return copy_next_task(n=16, d_vocab=60, seed=0)


def run(model, behaviour: str, **options):
    if behaviour == "induction":
        return ck.scan(model, tokens=RepeatedTokens(batch=8), **options)
    return ck.scan(model, task=_task(), **options)


def circuit_of(result):
    """``(heads, faithfulness)`` of the circuit of heads either scan found (``verified`` in both)."""
    return tuple(result.verified.heads), result.verified.faithfulness


def stage_names(result) -> list[str]:
    return [s.name for s in result.stages]


@pytest.fixture(scope="module")
def plain(model):
    return {behaviour: run(model, behaviour) for behaviour in BEHAVIOURS}


# ---------------------------------------------------------------------------------------------- edges
@pytest.mark.parametrize("behaviour", BEHAVIOURS)
def test_edges_false_keeps_the_circuit_of_heads_and_drops_its_edges(model, plain, behaviour):
    result = run(model, behaviour, edges=False)
    assert "edges" in stage_names(plain[behaviour]) and "edges" not in stage_names(result)
    assert circuit_of(result) == circuit_of(plain[behaviour])
    if behaviour == "induction":
        assert result.circuit is None and result.verified.edges is None and plain[behaviour].circuit is not None
        assert result.settings.with_edges is False
    else:
        assert result.circuit.edges == () and result.circuit.edge_faithfulness is None
        assert result.settings["edges"] is False and "Edge circuit: not measured (edges=False)" in result.answer()
    assert sum(s.passes for s in result.stages) < sum(s.passes for s in plain[behaviour].stages)


def _cli(tmp_path, behaviour: str, *flags: str) -> dict:
    """``circuitkit scan`` on the bundled model (induction: 8 sequences; a task: its file), ``scores.json`` read."""
    if behaviour == "induction":
        given = ["--batch", "8"]
    else:
        given = ["--task", str(task_file(_task(), tmp_path / "copy.jsonl"))]
    out = tmp_path / "out"
    assert cli.main(["scan", *given, "--out", str(out), "--json", *flags]) == 0
    return json.loads((out / "scores.json").read_text())


@pytest.mark.parametrize("behaviour", BEHAVIOURS)
def test_no_edges_on_the_command_line(tmp_path, capsys, behaviour):
    data = _cli(tmp_path, behaviour, "--no-edges")
    assert data["circuit"]["heads"] and data["circuit"]["edges"] == []
    if behaviour == "induction":  # its scores.json holds no stages: the settings and the evidence say it
        assert data["settings"]["edge_attribution_steps"] is None and data["evidence"] is None
    else:
        assert data["settings"]["edges"] is False and "edges" not in [s["name"] for s in data["stages"]]


@pytest.mark.parametrize("behaviour", BEHAVIOURS)
def test_quick_on_the_command_line(tmp_path, capsys, behaviour):
    """Induction: scores, attribution and weights only. A task: the node circuit with one EAP-IG point (its nodes
    ranked by the joint path), no edge circuit, the held-out pairs' circuit figures without the curve."""
    data = _cli(tmp_path, behaviour, "--quick")
    if behaviour == "induction":
        assert data["circuit"] is None and data["evidence"] is None and data["ablation"] is None
        return
    stages = [s["name"] for s in data["stages"]]
    settings = data["settings"]
    assert settings["quick"] is True and settings["ig_steps"] == 1 and settings["edges"] is False
    assert stages == ["clean", "attribute", "joint", "nodes", "held-out"]  # the corrupted run: EAP-IG's alpha = 0
    assert next(s["passes"] for s in data["stages"] if s["name"] == "attribute") == 3
    held = data["circuit"]["other_set"]
    assert held["faithfulness"] is not None and [p["size"] for p in held["curve"]] == [0, len(data["circuit"]["heads"])]


# ---------------------------------------------------------------------------------------------- stability, random sets
@pytest.mark.parametrize("behaviour", BEHAVIOURS)
def test_stability_reruns_the_search_on_resamples(model, behaviour):
    result = run(model, behaviour, stability=2)
    stability = result.verified.stability
    assert stability.n_resamples == 2 and stability.inclusion.shape == (2, 4) and stability.passes > 0
    assert "stability" in stage_names(result)
    heads, _ = circuit_of(result)
    assert all(c is not None for c in stability.circuits)
    assert stability.jaccard is not None and 0 <= stability.jaccard <= 1
    if behaviour == "task":
        data = result.to_json()
        assert data["stability"]["n_resamples"] == 2 and "Stability: the node search rerun on 2" in result.answer()
        _valid(data)
        _check_stability_by_hand(model, result)


def _valid(data: dict) -> None:
    """``data`` (a task scan's to_json) against the task schema, as ``scores.json`` is written."""
    from pathlib import Path

    import jsonschema

    from circuitkit import tasks

    schema = json.loads((Path(tasks.__file__).parent / "task_scores.schema.json").read_text())
    jsonschema.validate(json.loads(json.dumps(data)), schema)


def _check_stability_by_hand(model, result) -> None:
    """Each rerun's circuit is the node search's on those resampled discovery pairs, run here on its own."""
    from circuitkit.graph.runner import TaskRunner
    from circuitkit.models.adapters import adapt
    from circuitkit.tasks.circuit import node_circuit
    from circuitkit.tasks.scan import split_pairs
    from circuitkit.uncertainty import resample_counts

    task = _task()
    adapter = adapt(model)
    batch = task.tokenize(adapter)
    discovery, _ = split_pairs(task.n_pairs, 0.5, 0)
    found = batch.subset(discovery)
    for row, circuit in zip(resample_counts(found.n_pairs, 2, 0), result.stability.circuits, strict=True):
        index = torch.repeat_interleave(torch.arange(found.n_pairs), row.long())
        runner = TaskRunner(adapter, found.subset(index), "logit_diff", mlps=False, ablation="corrupted")
        _, node_scores = runner.edge_gradients(3)
        assert node_circuit(runner, node_scores, 0.8, "abs")[0] == circuit


@pytest.mark.parametrize("behaviour", BEHAVIOURS)
def test_random_sets_of_the_circuits_size(model, behaviour):
    result = run(model, behaviour, random_sets=3)
    baseline = result.verified.random_baseline
    heads, faith = circuit_of(result)
    assert baseline.size == len(heads) and baseline.n_sets == 3
    assert len(baseline.uniform.faithfulness) == 3 and len(baseline.layered.faithfulness) == 3
    assert baseline.uniform.mean < faith  # the circuit beats random sets of its size
    if behaviour == "task":
        assert result.to_json()["random_baseline"]["n_sets"] == 3 and "Random sets:" in result.answer()
        _valid(result.to_json())
        _check_random_sets_by_hand(model, result)


def _check_random_sets_by_hand(model, result) -> None:
    """The first uniform set's faithfulness: its heads kept, every other head patched, on the discovery pairs."""
    from circuitkit.circuits.baseline import random_sets
    from circuitkit.graph.runner import TaskRunner
    from circuitkit.models.adapters import adapt
    from circuitkit.tasks.scan import split_pairs

    task = _task()
    adapter = adapt(model)
    discovery, _ = split_pairs(task.n_pairs, 0.5, 0)
    runner = TaskRunner(adapter, task.tokenize(adapter).subset(discovery), "logit_diff", mlps=False,
                        ablation="corrupted")
    kept = random_sets(result.circuit.heads, 2, 4, 3, 0, "uniform")[0]
    m_set, m_all = runner.node_metric(torch.stack([~kept, torch.ones(2, 4, dtype=torch.bool)]), None).tolist()
    clean = float(runner.clean["metric"].mean())
    assert result.random_baseline.uniform.faithfulness[0] == pytest.approx((m_set - m_all) / (clean - m_all),
                                                                           abs=1e-5)


# ---------------------------------------------------------------------------------------------- target, dtype, device
@pytest.mark.parametrize("behaviour", BEHAVIOURS)
def test_target_sizes_the_circuit(model, plain, behaviour):
    low = run(model, behaviour, target=0.4, edges=False)
    low_heads, low_faith = circuit_of(low)
    heads, faith = circuit_of(plain[behaviour])
    assert low_faith >= 0.4 and faith >= 0.8 and len(low_heads) <= len(heads)
    assert low.verified.target == 0.4


@pytest.mark.parametrize("behaviour", BEHAVIOURS)
def test_ablate_checks_the_estimate_against_each_head_alone(model, behaviour):
    """``ablate="all"``: every head removed alone exactly (the induction scan: ablated; a task: patched from the
    corrupted prompt), the estimate's agreement over the 8 heads, the same record and the same words in both."""
    result = run(model, behaviour, ablate="all", edges=False)
    agreed = result.agreement
    assert agreed.n_exact == 8 and agreed.spearman is not None and -1.0 <= agreed.spearman <= 1.0
    assert "ablate" in stage_names(result) and "too few heads to judge" in result.answer()
    exact = result.ablation.effect if behaviour == "induction" else result.single_heads.exact
    head, value, _ = agreed.largest_miss
    assert float(exact[head]) == pytest.approx(value) and not bool(exact.isnan().any())


@pytest.mark.parametrize("behaviour", BEHAVIOURS)
def test_a_bfloat16_model_agrees_with_float32(plain, behaviour):
    half = run(zoo.load().to(torch.bfloat16), behaviour, edges=False)
    heads, faith = circuit_of(half)
    heads32, faith32 = circuit_of(plain[behaviour])
    assert heads == heads32 and faith == pytest.approx(faith32, abs=BF16_TOLERANCE)
    if behaviour == "task":
        for key in ("clean", "corrupted"):
            assert float(getattr(half, key).mean()) == pytest.approx(float(getattr(plain["task"], key).mean()),
                                                                     abs=BF16_TOLERANCE * 5)
        assert half.circuit.necessity == pytest.approx(plain["task"].circuit.necessity, abs=BF16_TOLERANCE * 5)


@pytest.mark.parametrize("behaviour", BEHAVIOURS)
def test_device_is_where_both_run(model, behaviour):
    result = run(model, behaviour, device="cpu", edges=False)
    device = result.settings.device if behaviour == "induction" else result.settings["device"]
    assert device == "cpu"
    with pytest.raises(ck.CircuitkitError, match="device"):
        run(model, behaviour, device="nowhere")


# ---------------------------------------------------------------------------------------------- progress
@pytest.mark.parametrize("behaviour", BEHAVIOURS)
def test_the_progress_plan_comes_first_and_each_stage_has_its_own_seconds(model, behaviour, capsys):
    """The plan of passes is printed before the first pass; each stage line shows that stage's passes and its own
    seconds (the record's), not the time since the start; the plan plus its announced changes is what ran."""
    result = run(model, behaviour, progress="lines")
    lines = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("scan: preparing")]
    label = "scan" if behaviour == "induction" else "scan copy-next"
    assert re.fullmatch(rf"{label}: \d+ stages, [\d.]+ passes planned \(.*\)", lines[0]), lines[0]
    shown = [re.fullmatch(rf"{label} \[\d+/\d+\] (\S+) +([\d.]+) pass(?:es)? +([\d.]+) s", line) for line in lines
             if line.startswith(f"{label} [")]
    assert [m.group(1) for m in shown] == stage_names(result)
    for m, stage in zip(shown, result.stages, strict=True):
        assert float(m.group(2)) == pytest.approx(stage.passes, abs=0.01)
        assert float(m.group(3)) == pytest.approx(stage.seconds, abs=0.01)
    done = re.fullmatch(rf"{label}: done, ([\d.]+) passes in ([\d.]+) s", lines[-1])
    assert done and float(done.group(1)) == pytest.approx(sum(s.passes for s in result.stages), abs=0.01)
    assert sum(s.seconds for s in result.stages) <= float(done.group(2)) + 0.05  # per stage, not cumulative


def test_a_progress_function_is_told_each_stage_as_it_ends(model):
    """``scan_task(progress=fn)``: ``fn(stage, passes)`` once per stage, the passes the stage record holds."""
    from circuitkit.tasks import scan_task

    told = []
    result = scan_task(model, _task(), edges=False, progress=lambda stage, passes: told.append((stage, passes)))
    assert told == [(s.name, s.passes) for s in result.stages] and len(told) == 5  # clean .. joint, nodes, held-out
    with pytest.raises(ck.CircuitkitError, match="progress"):
        scan_task(model, _task(), progress=3)


def test_a_task_scans_random_sets_and_stability_load_back(model, tmp_path):
    """The opt-in figures survive ``save`` -> ``TaskScan.load``: the same JSON, the same answer lines."""
    from circuitkit.tasks import TaskScan, scan_task

    result = scan_task(model, _task(), random_sets=3, stability=2, n_resamples=20)
    assert result.random_baseline is not None and result.stability is not None
    result.save(tmp_path)
    back = TaskScan.load(tmp_path)
    assert back.to_json()["random_baseline"] == result.to_json()["random_baseline"]
    assert back.to_json()["stability"] == result.to_json()["stability"]
    assert back.answer() == result.answer()


def test_scan_passes_a_tasks_ig_points_and_the_induction_scan_refuses_them(model):
    """``ck.scan(model, task=..., ig_points=...)`` reaches ``scan_task``; the induction scan takes none."""
    result = ck.scan(model, task=_task(), edges=False, ig_points="right")
    assert result.settings["ig_points"] == "right"
    assert ck.scan(model, task=_task(), edges=False).settings["ig_points"] == "left"
    with pytest.raises(ck.CircuitkitError, match="ig_points"):
        ck.scan(model, ig_points="right")


def test_scan_passes_a_tasks_node_search(model, tmp_path):
    """``ck.scan(model, task=..., search=...)`` runs the task scan's node search (the same circuit and figures as
    ``scan_task`` called directly)."""
    from circuitkit.tasks import scan_task
    from circuitkit.tasks.roles import member_explanations

    via_scan = ck.scan(model, task=_task(), edges=False, search="refined")
    direct = scan_task(model, _task(), edges=False, search="refined")
    assert via_scan.settings["search"]["name"] == "refined"
    assert via_scan.circuit.heads == direct.circuit.heads
    assert via_scan.circuit.faithfulness == pytest.approx(direct.circuit.faithfulness, abs=1e-6)
    ranked = ck.scan(model, task=_task(), edges=False)
    assert ranked.settings["search"] == {"name": "ranked", "options": {}, "passes": ranked.settings["search"]["passes"]}
    found = via_scan.circuit.search  # the search's record, as the induction circuit's circuit.search
    assert found.start == len(ranked.circuit.heads) and found.settings["stopped"] is not None
    assert found.size == len(via_scan.circuit.heads) and found.faithfulness == via_scan.circuit.faithfulness
    assert ranked.circuit.search is None and "search" not in ranked.to_json()["circuit"]
    assert via_scan.searched() == "refined" and ranked.searched() is None and via_scan.searched("edge_search") is None
    with pytest.raises(ck.CircuitkitError, match="TaskScan.searched: key"):
        via_scan.searched("nodes")
    assert via_scan.to_json()["circuit"]["search"] == found.to_json()
    assert f"the refined search from the ranked {found.start} in" in via_scan.answer()
    # a searched set is no prefix of the ranking the curve measures: no member is told its step on that curve
    steps = ("when it joins the top", "alone it reaches faithfulness", "faithfulness stays at")
    assert not any(s in text for text in member_explanations(via_scan).values() for s in steps)
    assert any(s in text for text in member_explanations(ranked).values() for s in steps)
    bounded = ck.scan(model, task=_task(), edges=False, search="refined", search_options={"max_passes": 1})
    assert bounded.circuit.search.settings["stopped"] == "max_passes"
    assert "stopped by its pass budget, so not known to be 1-minimal" in bounded.answer()
    bounded.save(tmp_path)
    assert ck.Scan.load(tmp_path).answer() == bounded.answer()  # the search's record loads back
    import json
    from pathlib import Path

    import jsonschema

    schema = json.loads((Path(ck.tasks.__file__).parent / "task_scores.schema.json").read_text(encoding="utf-8"))
    data = json.loads((tmp_path / "scores.json").read_text(encoding="utf-8"))
    jsonschema.validate(data, schema)  # the record as the published schema describes it
    data["circuit"]["search"]["search"] = "ranked"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, schema)
    # a file written before the record (its start and stop in settings.search) still loads
    from circuitkit.tasks.reload import task_scan_from_json

    older = json.loads((tmp_path / "scores.json").read_text(encoding="utf-8"))
    record = older["circuit"].pop("search")
    older["settings"]["search"].update(ranked_size=record["start_size"], stopped=record["settings"]["stopped"])
    loaded = task_scan_from_json(older, "scores.json", type(bounded))
    assert loaded.circuit.search is None and loaded.circuit.heads == bounded.circuit.heads
    assert "the refined search in" in loaded.answer()  # the search is still named, without the record's start


@pytest.mark.parametrize("search", ["refined", "masks"])
def test_the_induction_scan_searches_beyond_ranking(model, tmp_path, capsys, search):
    """``ck.scan(model, search=...)``: at target 0.3 the bundled model's ranked circuit is 3 heads and the searches
    find 2. The scan's circuit is ``find_circuit``'s on the same batch, its faithfulness what
    :func:`circuitkit.faithfulness` measures for those heads, its random sets of the searched size; the record
    saves, loads back and says what ran; the plan revision and the answer name the search."""
    result = ck.scan(model, search=search, target=0.3, random_sets=2, edges=False, progress="lines")
    assert f"the {search} search took them to 2" in capsys.readouterr().err
    found = ck.find_circuit(model, search=search, target=0.3, random_sets=2)
    assert found.random_baseline.size == len(found.heads) == 2  # the searched size, not the ranked 3
    circuit = result.verified
    assert circuit.search.search == search and circuit.search.start == 3
    assert set(circuit.heads) == set(found.heads) and len(circuit.heads) == 2
    assert circuit.faithfulness == pytest.approx(ck.faithfulness(model, circuit.heads), abs=1e-5)
    assert circuit.faithfulness >= 0.3 and circuit.random_baseline.size == 2
    result.save(tmp_path)
    data = json.loads((tmp_path / "scores.json").read_text(encoding="utf-8"))
    assert data["settings"]["search"] == search
    assert data["circuit"]["search"]["size"] == 2 and data["circuit"]["search"]["start_size"] == 3
    back = ck.Scan.load(tmp_path)
    assert back.verified.search.search == search and back.verified.heads == circuit.heads
    back.save(tmp_path / "again")
    page = (tmp_path / "again" / "report.html").read_text(encoding="utf-8")
    assert f"the {search} search from the ranked top 3 chose these 2 heads" in page
    # the curve's ring is the searched set's own figure, off the ranking's curve (whose top 2 do nothing here)
    assert ('class="ck-searched"' in page and f"2 heads at faithfulness {circuit.faithfulness:.3f}</title>" in page)
    assert "search" not in ck.scan(model, edges=False).to_json()["settings"]  # ranked: written as before


def test_search_options_bound_the_induction_search_and_are_checked_first(model):
    """``search_options`` reach the induction scan's search: a budget of 1 pass stops the refined search before
    its first round (the ranked 3 heads kept, the record saying why), where unbounded it finds 2; options the
    search does not take, or options beside the ranked circuit, are refused before any pass, for both scans."""
    bounded = ck.scan(model, search="refined", search_options={"max_passes": 1}, target=0.3, edges=False)
    assert len(bounded.verified.heads) == 3 and bounded.verified.search.settings["max_passes"] == 1
    assert "max_passes" in bounded.verified.search.settings["stopped"]
    from circuitkit.report.summary import answer_lines

    assert "stopped by its pass budget, so not known to be 1-minimal" in "\n".join(answer_lines(bounded))
    with pytest.raises(ck.CircuitkitError, match=r"scan: search_options.*options among .*max_passes"):
        ck.scan(model, search="refined", search_options={"budget": 5})
    with pytest.raises(ck.CircuitkitError, match=r"scan: search_options.*'ranked'"):
        ck.scan(model, search_options={"max_passes": 5})
    with pytest.raises(ck.CircuitkitError, match=r"scan: search_options.*options among"):
        ck.scan(model, task=_task(), search="masks", search_options={"max_passes": 5})
    with pytest.raises(ck.CircuitkitError, match=r"scan: search_options.*a dict"):
        ck.scan(model, search="refined", search_options=[("max_passes", 5)])
