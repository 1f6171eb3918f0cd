"""A task scan is a scan: saved, it loads back equal in every figure (``TaskScan.load``, ``circuitkit.Scan.load``),
its file obeys the published schema and holds the unit of every figure, a file no scan could have written is refused
in one line (a seeded fuzz over every field, the guarded reader's limits), and it has the induction scan's views
(``table()``, ``to_pandas()``, the notebook view).

Scans: IOI on a random two-layer bridge with MLPs and a word-level tokenizer (text prompts, marks, the task's own
head score, the held-out split, MLP nodes of the edge graph), the hand-built induction circuit on copy-next pairs
(token ids; the circuit is known), pairs whose corruption changes nothing (no circuit) and a researcher's metric.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import random
import re
from pathlib import Path

import jsonschema
import pytest
import torch

import circuitkit as ck
from circuitkit import CircuitkitError
from circuitkit.graph.metrics import metric_label, metric_units
from circuitkit.report.reload import comparable
from circuitkit.tasks import Task, TaskScan, scan_task
from circuitkit.tasks.reload import task_scan_from_json
from tests.conftest import boot_bridge
from tests.test_scan_load_checks import _close, _mutations, _paths, _set, _write
from tests.test_tasks import copy_next_task, english_model, toy_pairs

SCHEMA = json.loads((Path(ck.tasks.__file__).parent / "task_scores.schema.json").read_text(encoding="utf-8"))
FUZZ_SEED = 36
FUZZ_MORE = 1000
"""The fuzz tries every field once, then this many more mutations drawn in a seeded order: a count, not a time, so
that every machine tries the same ones (all of them, about 34,000, pass; set ``CIRCUITKIT_FUZZ_MORE`` to try more)."""
FUZZ_MORE = int(os.environ.get("CIRCUITKIT_FUZZ_MORE", FUZZ_MORE))


def log_odds(logits, batch):
    logprobs = logits.log_softmax(-1)
    rows = torch.arange(logits.shape[0])
    return logprobs[rows, batch.answers[:, 0]] - logprobs[rows, batch.wrongs[:, 0]]


@pytest.fixture(scope="module")
def scans():
    """label -> a fresh task scan of each kind (module docstring)."""
    from circuitkit.handbuilt.induction import induction_circuit
    from circuitkit.tasks import ioi

    english = english_model()
    hand = induction_circuit(10, 16).model
    same = [(c, c, a, [(a[0] + 1) % 50]) for c, _, a, _ in toy_pairs(3)]
    return {
        "ioi": scan_task(english, ioi(english, n=8, seed=3), steps=1, n_resamples=20),
        "copy-next": scan_task(hand, copy_next_task(), target=0.9, name="hand-built", n_resamples=20),
        "no circuit": scan_task(boot_bridge(d_vocab=50), Task.from_pairs(same), n_resamples=20),
        "custom metric": scan_task(hand, Task.from_pairs(copy_next_task(6).pairs, name="mine", metric=log_odds),
                                   edges=False, n_resamples=20),
    }


@pytest.fixture(scope="module")
def saved(scans, tmp_path_factory):
    """label -> (the fresh scan, its directory, its parsed scores.json)."""
    out = {}
    for label, scan in scans.items():
        directory = tmp_path_factory.mktemp(label.replace(" ", "-"))
        scan.save(directory)
        out[label] = (scan, directory, json.loads((directory / "scores.json").read_text(encoding="utf-8")))
    return out


def _same_tensor(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(torch.nan_to_num(a, nan=7.5),
                                                                     torch.nan_to_num(b, nan=7.5))


def _same_circuit(a, b) -> None:
    if a is None or b is None:
        assert a is None and b is None
        return
    for f in dataclasses.fields(a):
        assert getattr(a, f.name) == getattr(b, f.name), f.name


@pytest.mark.parametrize("label", ["ioi", "copy-next", "no circuit", "custom metric"])
def test_a_saved_task_scan_loads_back_equal_in_every_figure(saved, label):
    scan, directory, data = saved[label]
    for loaded in (TaskScan.load(directory), TaskScan.load(directory / "scores.json"), ck.Scan.load(directory)):
        assert type(loaded) is TaskScan
        for name in ("clean", "corrupted", "dla", "dla_mlp", "scores", "scores_mlp", "patterns"):
            assert _same_tensor(getattr(loaded, name), getattr(scan, name)), name
        for name in ("head_scores", "pattern_scores"):
            mine, theirs = getattr(loaded, name), getattr(scan, name)
            assert list(mine) == list(theirs), name  # the same columns in the same order
            assert all(_same_tensor(mine[k], theirs[k]) for k in mine), name
        t, u = loaded.task, scan.task
        assert (t.name, t.pairs, t.marks, t.attention_scores, t.ablation, t.description) == (
            u.name, u.pairs, u.marks, u.attention_scores, u.ablation, u.description)
        assert metric_label(t.metric) == metric_label(u.metric)
        _same_circuit(loaded.circuit, scan.circuit)
        assert loaded.model == scan.model and loaded.tokens == scan.tokens
        assert loaded.settings == scan.settings and loaded.stages == scan.stages
        assert loaded.intervals == scan.intervals and loaded.circuit_error == scan.circuit_error
        assert loaded.answer() == scan.answer() and loaded.passes == scan.passes
        assert loaded.to_json() == data


def test_a_loaded_scan_saves_the_same_bytes(saved, tmp_path):
    """Both files, the report included: the page is drawn from saved figures only."""
    scan, directory, _ = saved["ioi"]
    TaskScan.load(directory).save(tmp_path / "again")
    for name in ("scores.json", "report.html"):
        assert (tmp_path / "again" / name).read_bytes() == (directory / name).read_bytes(), name


def test_a_loaded_custom_metric_is_named_and_says_it_cannot_run(saved):
    loaded = TaskScan.load(saved["custom metric"][1])
    assert metric_label(loaded.task.metric) == "custom:log_odds"
    with pytest.raises(CircuitkitError, match="does not hold the metric function"):
        loaded.task.metric(torch.zeros(2, 10), None)


@pytest.mark.parametrize("label", ["ioi", "copy-next", "no circuit", "custom metric"])
def test_saved_files_obey_the_schema_and_give_every_figure_a_unit(saved, label):
    scan, _, data = saved[label]
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    jsonschema.Draft202012Validator(SCHEMA).validate(data)
    units = data["units"]
    for key in data["heads"]:
        assert f"heads.{key}" in units and units[f"heads.{key}"], key
    for column in scan.table()[0]:
        if column not in ("head", "layer", "index", "in_circuit"):
            assert f"heads.{column}" in units, column
    metric_unit = metric_units(scan.task.metric)
    assert units["heads.score"].startswith(metric_unit) and units["pairs.clean"].startswith(metric_unit)
    for wrong in ({**data, "format": "circuitkit-task-scan/1"}, {**data, "units": {"x": 1}},
                  {k: v for k, v in data.items() if k != "pairs"}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(wrong, SCHEMA)


def test_scan_load_dispatches_on_the_format_and_refuses_others_in_one_line(saved, tmp_path):
    _, directory, data = saved["copy-next"]
    assert type(ck.Scan.load(directory / "scores.json")) is TaskScan
    cases = {"circuitkit-task-scan/1": "Scan the task again", "circuitkit-task-scan/99": "Scan the task again",
             "circuitkit-scan/0": "format", "nonsense": "format"}
    for fmt, needle in cases.items():
        file = _write(tmp_path, {**data, "format": fmt})
        for load in (ck.Scan.load, TaskScan.load):
            with pytest.raises(CircuitkitError, match=needle) as caught:
                load(tmp_path)
            message = str(caught.value)
            assert "\n" not in message and str(file) in message and fmt in message, message
    with pytest.raises(CircuitkitError, match="no such file or directory"):
        TaskScan.load(tmp_path / "nowhere")
    for bad in (None, "", 3):
        with pytest.raises(CircuitkitError, match="TaskScan.load: path"):
            TaskScan.load(bad)


CASES = {  # id -> (path, value, the field the error names)
    "n_layers 3 beside 2 rows": ("model.n_layers", 3, "heads.dla"),
    "n_heads 0": ("model.n_heads", 0, "model.n_heads"),
    "n_heads '4'": ("model.n_heads", "4", "model.n_heads"),
    "circuit head 9.9": ("circuit.heads[0]", "9.9", "circuit.heads[0]"),
    "circuit head 1.4 of 4 heads": ("circuit.heads[0]", "1.4", "circuit.heads[0]"),
    "mlp 2 of 2 layers": ("circuit.mlps", [2], "circuit.mlps[0]"),
    "edge backwards": ("circuit.edges[0]", "1.0->0.1:q", "circuit.edges[0]"),
    "edge to no head": ("circuit.edges[0]", "input->0.9:q", "circuit.edges[0]"),
    "edge effect unnamed": ("circuit.edge_effects[0].edge", "a->b", "circuit.edge_effects[0].edge"),
    "score NaN": ("heads.score[1][2]", math.nan, "heads.score[1][2]"),
    "score true": ("heads.score[1][2]", True, "heads.score[1][2]"),
    "score 'x'": ("heads.score[1][2]", "x", "heads.score[1][2]"),
    "grid 1x1": ("heads.dla", [[0.5]], "heads.dla"),
    "pattern score 1.5": ("heads.previous_token[0][0]", 1.5, "heads.previous_token[0][0]"),
    "io_attention -2": ("heads.io_attention[0][0]", -2.0, "heads.io_attention[0][0]"),
    "attention -0.5": ("patterns[0][0][0][0]", -0.5, "patterns[0][0][0][0]"),
    "patterns one token short": ("patterns[1][3]", [[1.0]], "patterns[1][3]"),
    "per-pair metric missing one": ("pairs.clean", [0.0], "pairs.clean"),
    "per-pair metric null": ("pairs.corrupted[0]", None, "pairs.corrupted[0]"),
    "mean disagrees with the pairs": ("task.clean", 123.0, "task.clean"),
    "pairs 10**400": ("task.pairs", 10**400, "task.pairs"),
    "a pair without its answer": ("pairs.prompts[0]", {"clean": "a", "corrupted": "b", "wrong": ["c"]},
                                  "pairs.prompts[0].answer"),
    "a pair of an empty prompt": ("pairs.prompts[0].clean", "", "pairs.prompts[0]"),
    "marks of no pair": ("pairs.marks", [], "pairs.marks"),
    "metric unknown": ("task.metric", "accuracy", "task.metric"),
    "target 5": ("settings.target", 5, "settings.target"),
    "ig_steps 0": ("settings.ig_steps", 0, "settings.ig_steps"),
    "n_resamples -5": ("settings.n_resamples", -5, "settings.n_resamples"),
    "stage seconds -1": ("stages[0].seconds", -1.0, "stages[0].seconds"),
    "unknown key": ("bogus", 1, "bogus"),
    "units not text": ("units.patterns", 3, "units.patterns"),
    "dtype int8": ("dtype", "int8", "dtype"),
    "role of no head": ("roles", {"name movers": ["7.7"]}, "roles.name movers[0]"),
    "intervals reversed": ("task.ci.clean", [1.0, 0.0], "task.ci.clean"),
    "held-out interval null": ("circuit.other_set.ci.necessity", None, "circuit.other_set.ci.necessity"),
    "held-out interval end null": ("circuit.other_set.ci.faithfulness[1]", None, "circuit.other_set.ci.faithfulness"),
    "circuit interval end null": ("circuit.ci.cpr[0]", None, "circuit.ci.cpr"),
    "mlps off beside MLP scores": ("settings.mlps", False, "mlps.score"),
    "a ranked circuit's search start": ("settings.search.ranked_size", 3, "settings.search.ranked_size"),
    "a search's stop not text": ("settings.search.stopped", 5, "settings.search.stopped"),
    "a search record beside a ranked circuit": ("circuit.search", {"search": "refined"}, "circuit.search"),
    "an edge search record beside ranked edges": ("circuit.edge_search", {"search": "refined"},
                                                  "circuit.edge_search"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_load_refuses_what_no_task_scan_writes(saved, tmp_path, case):
    path, value, field = CASES[case]
    data = saved["ioi"][2]
    file = _write(tmp_path, _set(data, path, value))
    with pytest.raises(CircuitkitError) as caught:
        TaskScan.load(tmp_path)
    message = str(caught.value)
    assert "\n" not in message and len(message) < 800, message
    assert str(file) in message and f"field {field!r}" in message, message


def test_explanations_another_version_worded_load_in_todays_words(saved, tmp_path):
    """Each member's explanation is prose written from the figures: a file that words them otherwise (an older
    version's words) loads, and the loaded scan says them as this version does; a member without one is refused."""
    data = saved["ioi"][2]
    today = data["circuit"]["explanations"]
    assert today
    reworded = _set(data, "circuit.explanations", {name: "worded otherwise" for name in today})
    _write(tmp_path, reworded)
    assert TaskScan.load(tmp_path).to_json()["circuit"]["explanations"] == today
    first = sorted(today)[0]
    _write(tmp_path, _set(data, "circuit.explanations", {k: v for k, v in today.items() if k != first}))
    with pytest.raises(CircuitkitError, match="circuit.explanations"):
        TaskScan.load(tmp_path)


def test_units_another_version_worded_load_in_todays_words(saved, tmp_path):
    """The ``units`` map is prose written from the scan (as in the induction scan's file): a file whose units are
    worded otherwise loads, and the loaded scan writes this version's."""
    data = saved["ioi"][2]
    _write(tmp_path, _set(data, "units.patterns", "furlongs"))
    assert TaskScan.load(tmp_path).to_json()["units"] == data["units"]


def test_an_edge_effect_keeps_its_metrics_means_and_a_file_without_them_still_loads(saved, tmp_path):
    """Each exactly patched edge is written with its metric's ``clean`` and ``patched`` means, of which its effect is
    the difference; a file written before they were kept loads without them and writes itself again, and one whose
    effect disagrees with its means is refused in one line."""
    data = saved["ioi"][2]
    effects = data["circuit"]["edge_effects"]
    assert effects and all(e["effect"] == pytest.approx(e["clean"] - e["patched"], abs=1e-6) for e in effects)
    older = copy.deepcopy(data)
    for e in older["circuit"]["edge_effects"]:
        del e["clean"], e["patched"]
    _write(tmp_path, older)
    loaded = TaskScan.load(tmp_path)
    assert all(e.clean is None and e.patched is None for e in loaded.circuit.edge_effects)
    assert loaded.to_json()["circuit"]["edge_effects"] == older["circuit"]["edge_effects"]
    _write(tmp_path, _set(data, "circuit.edge_effects[0].patched", effects[0]["patched"] + 1.0))
    with pytest.raises(CircuitkitError, match=r"edge_effects\[0\].effect.*clean - patched"):
        TaskScan.load(tmp_path)


@pytest.mark.parametrize("field, value", [("circuit.edge_effects[0].edge", "\n"), ("circuit.edges[0]", "\n"),
                                          ("circuit.heads[0]", "\n")])
def test_a_name_with_a_trailing_newline_is_refused_in_one_line(saved, tmp_path, field, value):
    """The checker's patterns are matched whole: ``"$"`` alone also matches before a last newline, which let an edge
    ``"1.3->logits\n"`` through to a raw ``TypeError``."""
    data = saved["ioi"][2]
    keys = [int(k) if k.isdigit() else k for k in field.replace("[", ".").replace("]", "").split(".")]
    node = data
    for key in keys:
        node = node[key]
    _write(tmp_path, _set(data, field, node + value))
    for load in (TaskScan.load, ck.Scan.load):
        with pytest.raises(CircuitkitError, match=re.escape(field)) as caught:
            load(tmp_path)
        assert "\n" not in str(caught.value).replace("\\n", "")


def test_the_guarded_reader_refuses_truncated_deep_and_huge_files(saved, tmp_path):
    text = (saved["ioi"][1] / "scores.json").read_text(encoding="utf-8")
    file = tmp_path / "scores.json"
    for content, needle in ((text[: len(text) // 2], "not JSON"), ("", "empty"), ("[" * 5000 + "]" * 5000, "nested"),
                            (text.replace('"ig_steps": 1', '"ig_steps": ' + "7" * 5000), "integer"),
                            (b"\xff\xfe{}", "UTF-8"), ("[1, 2]", "format")):
        file.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
        for load in (TaskScan.load, ck.Scan.load):
            with pytest.raises(CircuitkitError, match=needle) as caught:
                load(tmp_path)
            assert "\n" not in str(caught.value)


def _outcome(data):
    try:
        return task_scan_from_json(data, "TaskScan.load: '/fuzz/scores.json'", TaskScan)
    except CircuitkitError as error:
        message = str(error)
        assert "\n" not in message and "/fuzz/scores.json" in message and "field '" in message, message
        return "refused"


@pytest.mark.parametrize("label", ["ioi", "copy-next"])
def test_fuzz_every_field(saved, tmp_path, label):
    """Every node of a saved task scan gets type, range and shape mutations in a seeded order (every field once,
    then :data:`FUZZ_MORE` more): each is refused in one line naming the file and a field, or loads
    into a scan whose JSON is the mutated file and which saves again; a mutation the schema refuses never loads.
    Never a raw exception."""
    data = saved[label][2]
    rng = random.Random(FUZZ_SEED)
    schema = jsonschema.Draft202012Validator(SCHEMA)
    by_field: dict[tuple, list] = {}
    for path, value in _paths(data):
        if path:
            field = tuple("[]" if isinstance(key, int) else key for key in path)
            by_field.setdefault(field, []).extend((path, new) for _, new in _mutations(value, rng))
    first = [rng.choice(options) for options in by_field.values()]
    rest = [m for options in by_field.values() for m in options]
    rng.shuffle(rest)
    counts = {"refused": 0, "accepted": 0}
    for path, new in first + rest[:FUZZ_MORE]:
        mutated = _set(data, path, new)
        outcome = _outcome(mutated)
        if outcome == "refused":
            counts["refused"] += 1
            continue
        counts["accepted"] += 1
        schema.validate(mutated)
        # float32 figures: written again to 9 digits; the explanations and units in this version's words
        assert _close(comparable(outcome.to_json()), comparable(mutated)), path
        outcome.save(tmp_path / "again")
    print(f"task scores.json fuzz ({label}): {sum(counts.values())} mutations over {len(by_field)} fields, "
          f"{counts['refused']} refused, {counts['accepted']} accepted")
    assert sum(counts.values()) >= len(first) and counts["refused"] and counts["accepted"]


def test_deep_and_huge_values_in_fields_are_refused_not_raised(saved):
    data = saved["ioi"][2]
    deep: object = 1.0
    for _ in range(90):
        deep = [deep]
    for path, value in (("heads.score", deep), ("settings.split", deep), ("pairs.prompts[0].clean", [2**80]),
                        ("circuit.curve[0].size", 2**70), ("task.tokens", [deep]), ("stages", [{"name": deep}]),
                        ("circuit.other_set.curve", [{"size": 0}]), ("task.attention_scores", [["a", "b"]])):
        assert _outcome(_set(data, path, value)) == "refused", path


def test_table_lists_every_head_by_the_ranking_that_chose_the_circuit_with_the_task_columns(scans):
    scan = scans["ioi"]
    assert scan.circuit.ranked_by == "joint"
    rows = scan.table()
    L, H = scan.scores.shape
    assert len(rows) == L * H and {r["head"] for r in rows} == {f"{a}.{b}" for a in range(L) for b in range(H)}
    assert [abs(r["joint"]) for r in rows] == sorted((abs(r["joint"]) for r in rows), reverse=True)
    by_score = scan.table(sort="score")
    assert [abs(r["score"]) for r in by_score] == sorted((abs(r["score"]) for r in by_score), reverse=True)
    assert list(rows[0]) == ["head", "layer", "index", "score", "joint", "dla", "io_attention", "s2_attention",
                             *scan.pattern_scores, "in_circuit"]
    for r in rows:
        layer, head = r["layer"], r["index"]
        assert r["score"] == float(scan.scores[layer, head]) and r["dla"] == float(scan.dla[layer, head])
        assert r["joint"] == float(scan.ranking["heads"][layer, head])
        assert r["io_attention"] == float(scan.head_scores["io_attention"][layer, head])
        assert r["s2_attention"] == float(scan.head_scores["s2_attention"][layer, head])
        assert r["in_circuit"] == ((layer, head) in scan.circuit.heads)
    by_dla = scan.table(sort="dla")
    assert [abs(r["dla"]) for r in by_dla] == sorted((abs(r["dla"]) for r in by_dla), reverse=True)
    with pytest.raises(CircuitkitError, match="TaskScan.table: sort.*score, joint, dla, io_attention"):
        scan.table(sort="induction_loss")
    assert not any(r["in_circuit"] for r in scans["no circuit"].table())


def test_to_pandas_is_the_table_and_says_when_pandas_is_missing(scans, monkeypatch):
    pandas = pytest.importorskip("pandas")  # a dev extra: its absence is tested below, not hidden
    scan = scans["copy-next"]
    frame = scan.to_pandas()
    assert isinstance(frame, pandas.DataFrame) and list(frame.index) == [r["head"] for r in scan.table()]
    assert frame.loc["1.0", "in_circuit"] and frame.loc["1.0", "score"] == float(scan.scores[1, 0])
    monkeypatch.setitem(__import__("sys").modules, "pandas", None)
    with pytest.raises(CircuitkitError, match="TaskScan.to_pandas: needs pandas"):
        scan.to_pandas()


def test_the_notebook_view_puts_the_answer_first_then_the_table(scans):
    scan = scans["ioi"]
    html = scan._repr_html_()
    answer = html.index("Node circuit:")
    table = html.index("<table")
    assert answer < table and "<script" not in html and "Task &#x27;ioi&#x27;" in html
    best = scan.table()[0]["head"]
    assert f"<td>{best}</td>" in html[table:]


def test_a_file_from_a_newer_scan_keeps_its_fields_with_defaults(saved):
    """A TaskScan / TaskCircuit / stage record field a newer scan adds under its own name passes through; a key that is
    no field is refused."""
    data = copy.deepcopy(saved["copy-next"][2])
    data["stages"][0]["note"] = "x"
    assert _outcome(data) == "refused"  # not a stage record field: written again, it is gone
    data = copy.deepcopy(saved["copy-next"][2])
    data["circuit"]["bogus"] = 1
    assert _outcome(data) == "refused"


# ---------------------------------------------------------------------------------------------- the report page
def test_the_settings_table_prints_records_as_words_not_literals(saved):
    """The "Model and settings" table of either report prints a record (the plan, the split, the edge search) as
    ``key value; ...`` and a fraction of a pass to 6 digits: no JSON or Python literal, no 16-digit float."""
    import re

    from circuitkit.report.sections import setting_text

    assert setting_text({"name": "ranked", "options": {}, "passes": 26.16666666666667, "pruned": None}) == (
        "name ranked; passes 26.1667")
    assert setting_text(["induction: induction", "previous-token: x"]) == "induction: induction, previous-token: x"
    assert setting_text(None) == "none" and setting_text(29.0) == "29" and setting_text(True) == "True"
    scan, directory, _ = saved["ioi"]
    page = (directory / "report.html").read_text(encoding="utf-8")
    details = page[page.index('id="ck-sec-details"'):]
    details = details[: details.index("</section>")]
    cells = re.findall(r"<td>(.*?)</td>", details)
    # the plan (no corrupted stage: the corrupted run is EAP-IG's first point)
    assert any(cell.startswith("attribute 3; clean 1; edges ") for cell in cells)
    assert "<td>1 pass, " in details and "<td>1 passes" not in details
    for cell in cells:
        assert not re.search(r"[{}\[\]]|&quot;|\d\.\d{7}", cell), cell


def test_the_report_reads_without_javascript_answer_first(saved):
    """The answer (its lines as paragraphs, the circuit's heads as links and no number mistaken for a head), the
    diagram with every circuit head and the heads' table by |EAP-IG score| are in the page as plain HTML, before any
    script; the page data names the task's columns; no script or style is loaded from outside."""
    import re

    from circuitkit.tasks.report import HEAD_TEXT

    scan, directory, _ = saved["ioi"]
    page = (directory / "report.html").read_text(encoding="utf-8")
    main = page[: page.index("<script")]
    sections = re.findall(r'<section id="ck-sec-([\w-]+)"', main)
    assert sections[0] == "summary" and {"patterns", "heads", "scores", "faithfulness", "task"} <= set(sections)
    answer = main[main.index('id="ck-sec-summary"'):main.index('id="ck-sec-patterns"')]
    for line in scan.answer().splitlines()[:2]:
        assert re.sub(r"<[^>]+>", "", line) in re.sub(r"<[^>]+>", "", answer).replace("&#x27;", "'")
    linked = set(re.findall(r'class="ck-head" data-head="(\d+\.\d+)"', answer))
    assert {f"{a}.{b}" for a, b in scan.circuit.heads} <= linked
    assert all(int(h.split(".")[1]) < scan.model.n_heads for h in linked)
    legend = answer[answer.index("Legend:"):]
    assert "pattern score &gt;= 0.3" in legend and "data-head" not in legend[:legend.index("</p>")]
    # signed numbers and numbers of 3 decimals with a leading 0 are never read as heads (others are: "1.284" reads
    # as head 284 of layer 1, which no linked set holds)
    assert [m.group(0) for m in HEAD_TEXT.finditer("1.048, +0.048, 0.3, 1.2. [+1.000] 10.000")] == ["0.3", "1.2"]
    diagram = answer[answer.index("ck-task-circuit"):]
    assert {f"{a}.{b}" for a, b in scan.circuit.heads} <= set(re.findall(r'data-head="(\d+\.\d+)"', diagram))
    assert diagram.count("<path") == len(scan.circuit.edges) and "logits" in diagram and "input" in diagram
    table = main[main.index('id="ck-table"'):]
    rows = re.findall(r'<tr><th scope="row">(\d+\.\d+)</th>', table)
    assert rows == [r["head"] for r in scan.table()]
    data = json.loads(re.search(r'id="ck-data">(.*?)</script>', page).group(1))
    assert [c["key"] for c in data["columns"]] == [k for k in scan.table()[0] if k not in ("head", "layer", "index")]
    assert data["sort"] == "joint" and data["pattern"]["pos"] == len(scan.tokens)
    assert not re.search(r"<(script|link)[^>]+(src|href)=", page)


@pytest.fixture
def browser():
    from circuitkit.report import CHROMIUM_FLAGS
    from tests.conftest import require_browser

    executable = require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        instance = driver.chromium.launch(executable_path=executable, args=list(CHROMIUM_FLAGS))
        yield instance
        instance.close()


@pytest.mark.browser
@pytest.mark.slow
def test_the_report_in_a_browser(browser, saved):
    """Offline at 1400 and 800 px: no error, no request, CircuitsVis drawn, the table sorted by |EAP-IG score| and
    filtered, a click on a diagram node shows that head in the panel, no horizontal scroll. Screenshots:
    /tmp/report-shots/task-1400.png and task-800.png."""
    from tests.test_browser import SHOTS, _open

    scan, directory, _ = saved["ioi"]
    events = _open(browser, directory / "report.html")
    page = events["page"]
    assert events["ready"] == "true", page.inner_text("#ck-status")
    assert events["errors"] == [] and events["blocked"] == [] and events["dialogs"] == []
    assert page.evaluate("document.documentElement.dataset.ckCircuitsvis") == "drawn"
    heads = page.evaluate("Array.from(document.querySelectorAll('#ck-table tbody tr'), r => r.dataset.head)")
    assert heads == [r["head"] for r in scan.table()]
    maps = page.evaluate("document.querySelectorAll('#ck-heatmaps canvas[data-col]').length")
    assert maps == len(scan.table()[0]) - 3  # one per column
    page.fill("#ck-filter", "circuit>0")
    shown = page.evaluate("Array.from(document.querySelectorAll('#ck-table tbody tr'), r => r.hidden ? null : "
                          "r.dataset.head).filter(Boolean)")
    assert sorted(shown) == sorted(f"{a}.{b}" for a, b in scan.circuit.heads)
    last = max(scan.circuit.heads)
    page.click(f'.ck-task-circuit [data-head="{last[0]}.{last[1]}"]')
    assert page.evaluate("document.getElementById('ck-detail').dataset.head") == f"{last[0]}.{last[1]}"
    page.wait_for_function("document.querySelector('#ck-cv-pattern canvas') !== null", timeout=60_000)
    SHOTS.mkdir(exist_ok=True)
    for width in (1400, 800):
        page.set_viewport_size({"width": width, "height": 1000})
        page.evaluate("window.scrollTo(0, 0)")
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        page.screenshot(path=str(SHOTS / f"task-{width}.png"))


def test_the_diagram_of_a_node_circuit_alone_draws_its_heads_and_no_edge(scans):
    from circuitkit.tasks.diagram import circuit_diagram

    scan = scans["custom metric"]  # edges=False
    svg = circuit_diagram(scan)
    import re

    assert set(re.findall(r'data-head="(\d+\.\d+)"', svg)) == {f"{a}.{b}" for a, b in scan.circuit.heads}
    assert "<path" not in svg and "logits" not in svg and "edges not measured" in svg
    full = circuit_diagram(scans["copy-next"])
    assert full.count("<path") == 3 and ">logits<" in full and ">input<" in full


@pytest.mark.parametrize("members", [3, 8, 9, 61])
def test_the_answers_member_lines_sit_in_details_closed_past_eight(scans, monkeypatch, members):
    """Every member line is in the page, inside one ``<details>`` right after the node circuit's line; it opens
    with the page up to MEMBERS_OPEN members and on a click past them (a 61-head circuit's lines no longer push
    the diagram screens down). Other indented lines (the strongest edges) stay paragraphs outside it."""
    import re

    import circuitkit.tasks.report as report
    from circuitkit._html import escape

    scan = scans["ioi"]
    answer = scan.answer().splitlines()
    at = next(i for i, line in enumerate(answer) if line.startswith("Node circuit:"))
    lines = [f"  {a}.{b}: a member line number {k}." for k, (a, b) in enumerate([(0, 0)] * members)]
    rest = [line for line in answer[at + 1:] if not (line.startswith("  ") and ": exact effect" not in line)]
    text = "\n".join([*answer[: at + 1], *lines, *rest])
    monkeypatch.setattr(type(scan), "answer", lambda self: text)
    html = report._answer_html(scan)
    blocks = re.findall(r'<details class="ck-members"( open)?><summary>(.*?)</summary>(.*?)</details>', html)
    assert len(blocks) == 1
    opened, summary, inside = blocks[0]
    assert (opened == " open") == (members <= report.MEMBERS_OPEN)
    assert summary == f"The circuit's {members} members, each explained"
    assert [re.sub(r"<[^>]+>", "", p) for p in re.findall(r"<p>(.*?)</p>", inside)] == [
        "&nbsp;&nbsp;" + line for line in lines]
    effects = [line for line in rest if ": exact effect" in line]
    after = re.sub(r"<[^>]+>", "", html.split("</details>")[1])
    assert effects and all(escape(e.strip().split(":")[0]) in after for e in effects)


@pytest.mark.parametrize("layers", [2, 24])
def test_no_two_nodes_of_the_diagram_overlap_however_many_layers_the_circuit_spans(layers):
    """A circuit with a head and an MLP in every layer (49 ranks on 24 layers) is drawn top to bottom, the logits on
    top and each layer's rank below the next one's, within the page's width; one whose ranks fit side by side keeps
    its columns, input on the left. No two nodes overlap either way (the IOI circuit of a 24-layer model overlapped
    its nodes when every drawing was 900 px wide, then needed 3,000 px of sideways scrolling)."""
    import re
    from types import SimpleNamespace

    from circuitkit.tasks.diagram import NODE_H, NODE_W, WIDTH, circuit_diagram

    heads = tuple((layer, head) for layer in range(layers) for head in (0, 1))
    edges = tuple(f"{a}.0->m{a}" for a in range(layers)) + tuple(f"m{a}->{a + 1}.1:q" for a in range(layers - 1))
    circuit = SimpleNamespace(heads=heads, mlps=tuple(range(layers)), edges=edges, edge_effects=())
    scores = torch.zeros(layers, 2)
    fake = SimpleNamespace(circuit=circuit, model=SimpleNamespace(n_layers=layers), scores=scores, dla=scores,
                           scores_mlp=torch.zeros(layers))
    svg = circuit_diagram(fake)
    found = re.findall(r'<rect x="([\d.]+)" y="([\d.]+)" width="\d+" height="\d+" rx="5" fill="[^"]+" stroke="[^"]+" '
                       r'stroke-width="[\d.]+"/><text x="[\d.]+" y="[\d.]+" text-anchor="middle" font-weight="\d+">'
                       r"([^<]+)</text>", svg)
    boxes = {name: (float(x), float(y)) for x, y, name in found}
    assert len(boxes) == 2 * layers + layers + 1  # heads, MLPs, the logits
    points = list(boxes.values())
    for i, (x1, y1) in enumerate(points):
        for x2, y2 in points[i + 1:]:
            assert abs(x1 - x2) >= NODE_W or abs(y1 - y2) >= NODE_H, (x1, y1, x2, y2)
    width = float(re.search(r'<svg class="[^"]*" width="([\d.]+)"', svg).group(1))
    assert width == WIDTH and "ck-wide" not in svg
    assert svg.startswith('<div class="ck-scroll-x">') and svg.endswith("</svg></div>")
    down = layers == 24
    assert ("ck-down" in svg) == down and ("the logits on top" in svg) == down
    # model order: along x for columns, up the page (falling y) for rows
    along = [boxes["0.0"], boxes["m0"], boxes[f"{layers - 1}.0"], boxes[f"m{layers - 1}"], boxes["logits"]]
    coordinate = [y for _, y in along] if down else [x for x, _ in along]
    assert coordinate == sorted(coordinate, reverse=down) and len(set(coordinate)) == len(coordinate)
    if down:  # each edge leaves its sender's top and ends at its receiver's bottom
        for _, y1, _, y2 in re.findall(r'<path d="M([\d.]+) ([\d.]+)C[\d. ]+ ([\d.]+) ([\d.]+)"', svg):
            assert float(y2) < float(y1)
