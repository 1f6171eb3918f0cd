"""A loaded scan satisfies every rule a computed one does: ``Scan.load`` refuses a ``scores.json`` that a scan could
not have written (types, ranges, finite numbers, shapes agreeing with the model, heads that exist, settings in
range, fields that agree with those they derive from), in one line naming the file and the field.

The cases are the red team's (each loaded silently, or raised IndexError on save, before the checks) and a seeded
fuzz over every field of a saved bundled-model scan (:func:`test_fuzz_every_field`)."""

from __future__ import annotations

import copy
import json
import math
import os
import random
import re
from pathlib import Path

import jsonschema
import pytest

import circuitkit as ck
from circuitkit import CircuitkitError, RepeatedTokens
from circuitkit.report.reload import comparable

SCHEMA = json.loads((Path(ck.__file__).parent / "report" / "scores.schema.json").read_text(encoding="utf-8"))
FUZZ_SEED = 39
FUZZ_MORE = 1500
"""The fuzz runs its mutations in a seeded order: the cross-field ones, every field once, then this many more. A
count, not a time, so that every machine tries the same mutations (all of them, about 12,000, pass; set
``CIRCUITKIT_FUZZ_MORE`` to try more)."""
FUZZ_MORE = int(os.environ.get("CIRCUITKIT_FUZZ_MORE", FUZZ_MORE))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The bundled model scanned (circuit, edge evidence, intervals, a random-set baseline, stability and the refined
    search) and saved; its parsed ``scores.json``."""
    result = ck.scan(tokens=RepeatedTokens(batch=4, block_len=6), random_sets=2, stability=2, search="refined")
    directory = tmp_path_factory.mktemp("saved")
    result.save(directory)
    data = json.loads((directory / "scores.json").read_text(encoding="utf-8"))
    assert data["model"]["n_layers"] == 2 and data["model"]["n_heads"] == 4
    assert data["evidence"] is not None and data["circuit"]["random_baseline"] and data["circuit"]["stability"]
    assert data["settings"]["search"] == "refined" and data["circuit"]["search"]["search"] == "refined"
    return data


def _write(tmp_path: Path, data: dict, raw: dict[str, str] | None = None) -> Path:
    """``data`` as ``scores.json`` in ``tmp_path``; ``raw`` replaces quoted placeholders by raw JSON text
    (``1e400``, a 400-digit integer) that Python's json would not write."""
    text = json.dumps(data)
    for placeholder, literal in (raw or {}).items():
        text = text.replace(json.dumps(placeholder), literal)
    path = tmp_path / "scores.json"
    path.write_text(text, encoding="utf-8")
    return path


def _set(data: dict, path: str | tuple, value) -> dict:
    """``data`` with ``path`` (``a.b[1][2]``, or its keys as a tuple) set to ``value``: the containers along the
    path copied, everything else shared (``data`` itself is not changed)."""
    keys = path if isinstance(path, tuple) else [int(k) if k.isdigit() else k
                                                 for k in re.findall(r"[^.\[\]]+", path)]
    out = copy.copy(data)
    node = out
    for key in keys[:-1]:
        node[key] = copy.copy(node[key])
        node = node[key]
    node[keys[-1]] = value
    return out


CASES = {  # id -> (path, value, raw JSON literal for the placeholder or None, the field the error names)
    "n_layers 0": ("model.n_layers", 0, None, "model.n_layers"),
    "n_layers -1": ("model.n_layers", -1, None, "model.n_layers"),
    "n_layers '2'": ("model.n_layers", "2", None, "model.n_layers"),
    "n_layers 10**400": ("model.n_layers", "@BIG", "1" + "0" * 400, "model.n_layers"),
    "n_layers 3 beside 2 rows": ("model.n_layers", 3, None, "head_scores.induction"),
    "n_heads 10**9": ("model.n_heads", 10**9, None, "model.n_heads"),
    "n_heads 2.0": ("model.n_heads", 4.0, None, "model.n_heads"),
    "circuit head 9.9": ("circuit.heads[0]", "9.9", None, "circuit.heads[0]"),
    "circuit head -1.0": ("circuit.heads[0]", "-1.0", None, "circuit.heads[0]"),
    "score Infinity": ("head_scores.induction[1][2]", math.inf, None, "head_scores.induction[1][2]"),
    "score 1e400": ("head_scores.induction[1][2]", "@BIG", "1e400", "head_scores.induction[1][2]"),
    "score true": ("head_scores.induction[1][2]", True, None, "head_scores.induction[1][2]"),
    "score 1.5 in [0, 1]": ("head_scores.previous_token[0][0]", 1.5, None, "head_scores.previous_token[0][0]"),
    "copying -2": ("head_scores.copying[0][0]", -2.0, None, "head_scores.copying[0][0]"),
    "uncertainty.n_resamples -5": ("uncertainty.n_resamples", -5, None, "uncertainty.n_resamples"),
    "settings.n_resamples 0": ("settings.n_resamples", 0, None, "settings.n_resamples"),
    "settings.target 5": ("settings.target", 5, None, "settings.target"),
    "settings.target 0": ("settings.target", 0.0, None, "settings.target"),
    "head_scores 1x1": ("head_scores.induction", [[0.5]], None, "head_scores.induction"),
    "ablated head 7.0": ("ablation.ablated[0]", "7.0", None, "ablation.ablated[0]"),
    "composition edge backwards": ("composition.K.top_edges[0].src", "1.0", None, "composition.K.top_edges[0].dst"),
    "evidence row head 5.5": ("evidence.rows[0].src", [5, 5], None, "evidence.rows[0].src"),
    "top_heads value changed": ("top_heads.induction[0].value", 0.123, None, "top_heads.induction[0].value"),
    "uncertainty beside other settings": ("uncertainty.n_resamples", 7, None, "uncertainty.n_resamples"),
    "role of no score": ("settings.roles[0]", "induction: nosuch", None, "settings.roles[0]"),
    "stability jaccard 2": ("circuit.stability.jaccard", 2.0, None, "circuit.stability.jaccard"),
    "random sets size 99": ("circuit.random_baseline.size", 99, None, "circuit.random_baseline.size"),
    "searched, no search record": ("circuit.search", None, None, "circuit.search"),
    "search record of another search": ("settings.search", "masks", None, "circuit.search.search"),
    "searched set of another size": ("circuit.search.size", 1, None, "circuit.search.size"),
    "search started off the curve": ("circuit.search.start_size", 7, None, "circuit.search.start_size"),
    "search of another faithfulness": ("circuit.search.faithfulness", 0.123, None, "circuit.search.faithfulness"),
    "settings search ranked": ("settings.search", "ranked", None, "settings.search"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_load_refuses_what_no_scan_writes(saved, tmp_path, case):
    path, value, literal, field = CASES[case]
    file = _write(tmp_path, _set(saved, path, value), {"@BIG": literal} if literal else None)
    with pytest.raises(CircuitkitError) as caught:
        ck.Scan.load(tmp_path)
    message = str(caught.value)
    assert "\n" not in message and len(message) < 600
    assert str(file) in message and f"field {field!r}" in message, message


def test_evidence_needs_edge_settings(saved, tmp_path):
    """A scan measures edges only where its settings say so (a family without additive heads has neither)."""
    data = copy.deepcopy(saved)
    data["settings"]["edge_attribution_steps"] = None
    _write(tmp_path, data)
    with pytest.raises(CircuitkitError, match="field 'evidence'.*edge_attribution_steps is null"):
        ck.Scan.load(tmp_path)


def test_loaded_scan_with_opt_in_measurements_saves_again(saved, tmp_path):
    """A scan with random-set baselines and stability, loaded, is saved again to the same JSON (it raised
    AttributeError in the answer before: the saved records had none of the fields the answer reads)."""
    _write(tmp_path, saved)
    loaded = ck.Scan.load(tmp_path)
    loaded.save(tmp_path / "again")
    again = json.loads((tmp_path / "again" / "scores.json").read_text(encoding="utf-8"))
    assert again == saved
    assert "random sets of" in (tmp_path / "again" / "report.html").read_text(encoding="utf-8")


def test_an_integer_too_long_to_parse_is_one_line(saved, tmp_path):
    """Python's json refuses integers of more than 4300 digits with a bare ValueError."""
    file = _write(tmp_path, _set(saved, "settings.seed", "@HUGE"), {"@HUGE": "7" * 5000})
    with pytest.raises(CircuitkitError, match="integer") as caught:
        ck.Scan.load(tmp_path)
    assert str(file) in str(caught.value)


# ---------------------------------------------------------------------------------------------- the fuzz
def _paths(value, path=()):
    """Every node of a parsed JSON value (containers and leaves) with its path (a tuple of keys)."""
    yield path, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _paths(item, (*path, i))


def _mutations(value, rng):
    """(kind, new value) mutations of one node: wrong type, out of range, wrong shape."""
    if isinstance(value, bool):
        return [("type", 1), ("type", "true"), ("type", None)]
    if isinstance(value, (int, float)):
        return [("type", str(value)), ("type", True), ("type", [value]), ("range", -1), ("range", 0),
                ("range", -1e9), ("range", 1e9), ("range", 2**70), ("range", math.nan), ("range", math.inf),
                ("range", float(value) + 0.5), ("type", None)]
    if isinstance(value, str):
        return [("type", 7), ("type", None), ("range", ""), ("range", "9.9"), ("range", value + "x")]
    if value is None:
        return [("type", 0), ("type", "x"), ("type", []), ("type", {}), ("type", 0.5)]
    if isinstance(value, list):
        out = [("shape", []), ("type", None), ("type", "x"), ("shape", value[::-1])]
        if value:
            out += [("shape", value[:-1]), ("shape", value + value[-1:]), ("shape", [value[0]])]
        return out
    out = [("type", None), ("type", []), ("shape", {**value, "bogus": 1})]
    if value:
        out.append(("shape", {k: v for k, v in value.items() if k != rng.choice(list(value))}))
    return out


def _cross_field(data):
    """Mutations whose every field is well-typed and in range alone, but which disagree with another field."""
    heads = data["model"]["n_heads"]
    out = [("model.n_layers", data["model"]["n_layers"] + 1), ("model.n_heads", heads + 1),
           ("model.n_heads", heads - 1), ("model.n_kv_heads", 3),
           ("head_scores.induction", data["head_scores"]["induction"][::-1]),
           ("circuit.heads", ["0.0"]), ("circuit.target", 0.5), ("settings.top_k", 2),
           ("settings.heads_per_score", 3), ("settings.edge_attribution_steps", None), ("evidence", None),
           ("ablation.ablated", ["0.0"]), ("agreement.n_exact", 1), ("circuit.curve[1].n_heads", 7),
           ("circuit.roles", {"induction": ["0.0"]}), ("induction_heads", ["0.0", "0.1"]),
           ("uncertainty", None), ("attribution", None), ("composition.Q.top_edges", []),
           ("circuit.stability.n_resamples", 3), ("circuit.random_baseline.n_sets", 3),
           ("scores.induction.kind", "weight"), ("settings.roles", []), ("circuit_ablation", {}),
           ("head_scores_ci", {})]
    return [("cross", path, value) for path, value in out]


def _close(a, b) -> bool:
    """Equal JSON, numbers to 7 significant digits (scores.json's rounding); a bool is not a number."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, (int, float)):
        return type(a) is type(b) and a == b
    return isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=1e-6)


FUZZ_FILE = "/fuzz/scores.json"


def _load_outcome(data):
    """``"refused"`` (a one-line CircuitkitError naming the file and a field) or the loaded scan. The parsed data
    goes to the loader directly (what ``Scan.load`` does after reading the file), so thousands fit in seconds."""
    from circuitkit.report.reload import scan_from_json

    try:
        return scan_from_json(data, f"Scan.load: {FUZZ_FILE!r}", ck.Scan)
    except CircuitkitError as error:
        message = str(error)
        assert "\n" not in message and FUZZ_FILE in message and "field '" in message, message
        return "refused"


def test_fuzz_every_field(saved, tmp_path):
    """Every node of a saved scan gets type, range and shape mutations (and a list of cross-field ones), in a
    seeded order (every node once, then :data:`FUZZ_MORE` more): each is refused in one line
    naming the file and a field, or loads into a scan whose JSON is the mutated file and which saves again; one
    the published schema refuses is never loaded. Never a raw exception."""
    rng = random.Random(FUZZ_SEED)
    schema = jsonschema.Draft202012Validator(SCHEMA)
    nodes = [(path, value) for path, value in _paths(saved) if path]
    by_field: dict[tuple, list] = {}  # a field: a path with its list indices left out
    for path, value in nodes:
        field = tuple("[]" if isinstance(key, int) else key for key in path)
        by_field.setdefault(field, []).extend((kind, path, new) for kind, new in _mutations(value, rng))
    first = [rng.choice(options) for options in by_field.values()]  # every field once
    rest = [m for options in by_field.values() for m in options]
    rng.shuffle(rest)
    counts = {"tried": 0, "refused": 0, "accepted": 0}
    for kind, path, new in _cross_field(saved) + first + rest[:FUZZ_MORE]:
        mutated = _set(saved, path, new)
        outcome = _load_outcome(mutated)
        counts["tried"] += 1
        if outcome == "refused":
            counts["refused"] += 1
            continue
        counts["accepted"] += 1
        schema.validate(mutated)  # loaded: the schema must accept it too
        # the version, units and members' explanations: written again in this version's words
        assert _close(comparable(outcome.to_json()), comparable(mutated)), (kind, path, new)
        outcome.save(tmp_path / "again")
    print(f"scores.json fuzz: {counts['tried']} mutations over {len(by_field)} fields ({len(nodes)} values) tried, "
          f"{counts['refused']} refused, {counts['accepted']} accepted and valid")
    assert counts["tried"] >= len(first) and counts["refused"] and counts["accepted"]


@pytest.mark.parametrize("path", ["/tmp/scan\0dir", "/tmp/" + "x" * 5000, "x/" * 3000])
def test_a_path_no_file_can_have_is_refused_in_one_line_by_every_reader(path):
    """A NUL character (Python's ``os.stat`` raises ``ValueError`` on it) and names or paths past the file
    system's limits (``Errno 36``) are refused by the one check both kinds of scan are read through, naming the
    reader."""
    from circuitkit.report import load_scan

    for reader, name in ((ck.Scan.load, "Scan.load"), (ck.tasks.TaskScan.load, "TaskScan.load"),
                         (load_scan, "Scan.load")):
        with pytest.raises(CircuitkitError, match=f"^{name}: path") as caught:
            reader(path)
        assert "\n" not in str(caught.value)
