"""Every option of ``circuitkit scan`` and ``circuitkit track`` either applies or is refused.

The parser is enumerated: for each option of each subcommand and each kind of run (``scan``: the induction scan, a
built-in task, a task file; ``track``: checkpoints, ``--merge``), the table below says how to give the option and
what it must do: reach the call that uses it (the model loader, ``circuitkit.scan``, ``tasks.scan_task``, the task
generator, ``track`` / ``merge``, the report's ``save``, the printed output), or be refused in one
``circuitkit: error:`` line with exit code 2 before any model loads. The heavy calls are replaced by recorders, so
the whole matrix runs in seconds; test_task_file_quick_skips_the_edge_circuit runs one case for real.

A new option fails test_every_option_is_in_the_table until it has its row here.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from circuitkit import cli

REFUSED = "refused"
SCAN_KINDS = ("induction", "built-in task", "task file")
TRACK_KINDS = ("checkpoints", "merge")
ADD_A_ROW = ("{sub} option {flag!r} has no row in tests/test_cli_flags.py {table}: add one saying, for each of "
             "{kinds}, how to give it and what it must change (or REFUSED: then give it its line in "
             "circuitkit.cli.SCAN_UNUSED or the track's refusals), so that a flag is never silently dropped")


def _options(sub: str) -> dict[str, argparse.Action]:
    parser = cli._subcommands(cli.build_parser())[sub]
    return {a.dest: a for a in parser._actions if not isinstance(a, argparse._HelpAction)}


def _flag(action: argparse.Action) -> str:
    return action.option_strings[0] if action.option_strings else action.dest


# ---------------------------------------------------------------------------------------------- recorders
class Calls:
    """What the command called, with which arguments (every heavy call replaced)."""

    def __init__(self) -> None:
        self.load: list[tuple[tuple, dict]] = []
        self.scan: list[dict] = []
        self.scan_task: list[tuple] = []
        self.generator: list[dict] = []
        self.save: list[dict] = []
        self.table_sort: list = []
        self.answer_skipped: list = []
        self.track: list[tuple] = []
        self.merge: list = []
        self.stdout = ""

    @property
    def heavy(self) -> list:
        return [*self.load, *self.scan, *self.scan_task, *self.track, *self.merge]

    @property
    def task(self):
        assert len(self.scan_task) == 1 and not self.scan, "expected one task scan"
        return self.scan_task[0][1]

    @property
    def task_kwargs(self) -> dict:
        assert len(self.scan_task) == 1 and not self.scan, "expected one task scan"
        return self.scan_task[0][2]

    @property
    def induction(self) -> dict:
        assert len(self.scan) == 1 and not self.scan_task, "expected one induction scan"
        return self.scan[0]

    @property
    def loaded(self) -> dict:
        assert len(self.load) == 1, "expected the model loaded once"
        return {"name": self.load[0][0][0] if self.load[0][0] else None, **self.load[0][1]}

    @property
    def scan_kwargs(self) -> dict:
        return self.induction if self.scan else self.task_kwargs


SCORES_TEXT = '{"recorded": true}\n'


class _Result:
    def __init__(self, calls: Calls, tmp: Path) -> None:
        self.calls, self.tmp = calls, tmp
        self.checkpoints = [1]
        self.circuit = "recorded"

    def save(self, out, png=False):
        self.calls.save.append({"out": Path(out), "png": png})
        scores = self.tmp / "recorded-scores.json"
        scores.write_text(SCORES_TEXT)
        return SimpleNamespace(report=Path(out) / "report.html", scores=scores, track=Path(out) / "track.json",
                               pngs=())

    def answer(self) -> str:
        return "Node circuit: recorded"


@pytest.fixture
def calls(monkeypatch, tmp_path) -> Calls:
    import circuitkit
    import circuitkit.memory
    import circuitkit.models.loading
    import circuitkit.report.track_page
    import circuitkit.tracking
    import circuitkit.zoo
    from circuitkit import tasks

    record = Calls()
    model = SimpleNamespace(name="recorded model")

    def load_model(*args, **kwargs):
        record.load.append((args, kwargs))
        return model

    def scan(model_, **kwargs):
        record.scan.append(kwargs)
        return _Result(record, tmp_path)

    def scan_task(model_, task, **kwargs):
        record.scan_task.append((model_, task, kwargs))
        return _Result(record, tmp_path)

    def ioi(model_, n=32, seed=0):  # the generator's own default, as tasks.ioi
        record.generator.append({"n": n, "seed": seed})
        return tasks.Task.from_pairs([([1, 2, 3], [1, 4, 3], 5, 6)], name="ioi")

    def track(checkpoints, **kwargs):
        record.track.append((checkpoints, kwargs))
        return _Result(record, tmp_path)

    def merge(directory):
        record.merge.append(directory)
        return _Result(record, tmp_path)

    monkeypatch.setattr(circuitkit.models.loading, "load_model", load_model)
    monkeypatch.setattr(circuitkit.zoo, "load", load_model)  # the bundled model's scan loads it without the bridge
    monkeypatch.setattr(circuitkit.memory, "check_memory", lambda *a, **k: None)
    monkeypatch.setattr(circuitkit, "scan", scan)
    monkeypatch.setattr(tasks, "scan_task", scan_task)
    monkeypatch.setitem(tasks.GENERATORS, "ioi", ioi)
    monkeypatch.setattr(cli, "ranked_table", lambda result, sort=None: record.table_sort.append(sort) or "table")
    monkeypatch.setattr(cli, "print_answer", lambda out, result, skipped=None: record.answer_skipped.append(skipped))
    monkeypatch.setattr(circuitkit.tracking, "track", track)
    monkeypatch.setattr(circuitkit.tracking, "merge", merge)
    monkeypatch.setattr(circuitkit.report.track_page, "sentences", lambda result: ["recorded"])
    monkeypatch.chdir(tmp_path)
    return record


@pytest.fixture
def places(tmp_path) -> SimpleNamespace:
    """A task file (token ids), a model directory, checkpoint and record directories, an output directory."""
    task_file = tmp_path / "pairs.jsonl"
    rows = [{"clean": [1, 2, 3], "corrupted": [1, 4, 3], "answer": 5, "wrong": 6},
            {"clean": [2, 3, 1], "corrupted": [2, 7, 1], "answer": 3, "wrong": 6}]
    task_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name in ("model-dir", "step100", "step200", "records"):
        (tmp_path / name).mkdir()
    return SimpleNamespace(task_file=task_file, model=tmp_path / "model-dir", ckpt=tmp_path / "step100",
                           ckpt2=tmp_path / "step200", records=tmp_path / "records", out=tmp_path / "elsewhere")


def _base(sub: str, kind: str, places) -> list[str]:
    return {
        "induction": ["scan"],
        "built-in task": ["scan", "--task", "ioi"],
        "task file": ["scan", "--task", str(places.task_file)],
        "checkpoints": ["track", str(places.ckpt)],
        "merge": ["track", "--merge", str(places.records)],
    }[kind]


# ---------------------------------------------------------------------------------------------- the table
def every(argv, check):
    return {kind: (argv, check) for kind in SCAN_KINDS}


def induction_only(argv, check):
    return {"induction": (argv, check), "built-in task": (argv, REFUSED), "task file": (argv, REFUSED)}


def tasks_only(argv, check):
    return {"induction": (argv, REFUSED), "built-in task": (argv, check), "task file": (argv, check)}


def _tokens(c: Calls):
    return c.induction["tokens"]


QUICK_SAID = "Edge circuit skipped (--quick); run without --quick to measure the edge circuit."
SCAN_TABLE = {
    # dest: {kind: (argv to add, REFUSED or a check of what it changed)}
    "model": every(lambda p: [str(p.model)], lambda c, p: c.loaded["name"] == str(p.model)),
    "out": every(lambda p: ["--out", str(p.out)], lambda c, p: c.save[0]["out"] == p.out),
    "device": every(["--device", "cpu"],
                    lambda c, p: c.loaded["device"] == "cpu" and c.scan_kwargs["device"] == "cpu"),
    "dtype": every(["--dtype", "bfloat16"], lambda c, p: c.loaded["dtype"] == "bfloat16"),
    "metric": tasks_only(["--metric", "prob_diff"], lambda c, p: c.task_kwargs["metric"] == "prob_diff"),
    "holdout": tasks_only(["--holdout", "0.25"], lambda c, p: c.task_kwargs["holdout"] == 0.25),
    "target_on": tasks_only(["--target-on", "evaluation"], lambda c, p: c.task_kwargs["target_on"] == "evaluation"),
    "ig_points": tasks_only(["--ig-points", "right"], lambda c, p: c.task_kwargs["ig_points"] == "right"),
    "kv_edges": tasks_only(["--kv-edges", "per-query-head"],
                           lambda c, p: c.task_kwargs["kv_edges"] == "per-query-head"),
    "edge_search": tasks_only(["--edge-search", "refined"], lambda c, p: c.task_kwargs["edge_search"] == "refined"),
    "node_ranking": tasks_only(["--node-ranking", "joint"], lambda c, p: c.task_kwargs["node_ranking"] == "joint"),
    "search": {"induction": (["--search", "masks"], lambda c, p: c.induction["search"] == "masks"),
               **{kind: (["--search", "masks"], lambda c, p: c.task_kwargs["search"] == "masks")
                  for kind in ("built-in task", "task file")}},
    "search_passes": {
        "induction": (["--search", "refined", "--search-passes", "40"],
                      lambda c, p: c.induction["search_options"] == {"max_passes": 40.0}),
        **{kind: (["--search", "refined", "--search-passes", "40"],
                  lambda c, p: c.task_kwargs["search_options"] == {"max_passes": 40.0})
           for kind in ("built-in task", "task file")}},
    "prepend_bos": tasks_only(["--prepend-bos", "yes"], lambda c, p: c.task_kwargs["prepend_bos"] is True),
    "device_map": every(lambda p: [str(p.model), "--device-map", "auto"],
                        lambda c, p: c.loaded["device_map"] == "auto" and "device" not in c.loaded),
    "block_len": induction_only(["--block-len", "7"], lambda c, p: _tokens(c).block_len == 7),
    "batch": induction_only(["--batch", "3"], lambda c, p: _tokens(c).batch == 3),
    "seed": {"induction": (["--seed", "5"], lambda c, p: _tokens(c).seed == 5),
             "built-in task": (["--seed", "5"], lambda c, p: c.generator == [{"n": 32, "seed": 5}]),
             "task file": (["--seed", "5"], REFUSED)},
    "ablate": {"induction": (["--ablate", "all"], lambda c, p: c.induction["ablate"] == "all"),
               **{kind: (["--ablate", "all"], lambda c, p: c.task_kwargs["ablate"] == "all")
                  for kind in ("built-in task", "task file")}},
    # a task patches heads alone only where asked (--ablate top|all): --ablate-top alone is refused there
    "ablate_top": {"induction": (["--ablate-top", "3"], lambda c, p: c.induction["ablate_top"] == 3),
                   **{kind: (["--ablate", "top", "--ablate-top", "3"], lambda c, p: c.task_kwargs["ablate_top"] == 3
                             and c.task_kwargs["ablate"] == "top") for kind in ("built-in task", "task file")}},
    "ablation_method": {"induction": (["--ablation-method", "zero"],
                                      lambda c, p: c.induction["ablation_method"] == "zero"),
                        "built-in task": (["--ablation-method", "zero"], lambda c, p: c.task.ablation == "zero"),
                        "task file": (["--ablation-method", "mean"], lambda c, p: c.task.ablation == "mean")},
    "top_k": induction_only(["--top-k", "2"], lambda c, p: c.induction["top_k"] == 2),
    "no_circuit": induction_only(["--no-circuit"], lambda c, p: c.induction["circuit"] is False
                                 and c.answer_skipped == ["--no-circuit"]),
    "quick": {"induction": (["--quick"], lambda c, p: c.induction["circuit"] is False
                            and c.induction["ablate"] == "none" and c.answer_skipped == ["--quick"]),
              "built-in task": (["--quick"], lambda c, p: c.task_kwargs["quick"] is True and QUICK_SAID in c.stdout),
              "task file": (["--quick"], lambda c, p: c.task_kwargs["quick"] is True and QUICK_SAID in c.stdout)},
    "no_edges": every(["--no-edges"], lambda c, p: c.scan_kwargs["edges"] is False),
    "sort": induction_only(["--sort", "prev"], lambda c, p: c.table_sort == ["prev"]),
    "json": every(["--json"], lambda c, p: c.stdout == SCORES_TEXT),
    # the bundled model's induction scan loads local files without the bridge: the flag reaches the scan
    "allow_download": every(["--allow-download"], lambda c, p: (
        c.scan_kwargs["allow_download"] is True if c.loaded.get("bridge") is False
        else c.loaded["allow_download"] is True)),
    "png": every(["--png"], lambda c, p: c.save[0]["png"] is True),
    # --task names the kind of run: the induction scan by name, else the task the base command gives
    "task": {"induction": (["--task", "induction"], lambda c, p: len(c.scan) == 1 and not c.scan_task),
             "built-in task": ([], lambda c, p: c.task.name == "ioi" and len(c.generator) == 1),
             "task file": ([], lambda c, p: c.task.name == "pairs" and c.task.n_pairs == 2 and not c.generator)},
    "pairs": {"induction": (["--pairs", "5"], REFUSED),
              "built-in task": (["--pairs", "5"], lambda c, p: c.generator == [{"n": 5, "seed": 0}]),
              "task file": (["--pairs", "5"], REFUSED)},
    "target": every(["--target", "0.5"], lambda c, p: c.scan_kwargs["target"] == 0.5),
    "resamples": every(["--resamples", "50"], lambda c, p: c.scan_kwargs["n_resamples"] == 50),
    "ci_level": every(["--ci-level", "0.9"], lambda c, p: c.scan_kwargs["ci_level"] == 0.9),
    "random_sets": every(["--random-sets", "2"], lambda c, p: c.scan_kwargs["random_sets"] == 2),
    "stability": every(["--stability", "2"], lambda c, p: c.scan_kwargs["stability"] == 2),
}


def checkpoints_only(argv, check):
    return {"checkpoints": (argv, check), "merge": (argv, REFUSED)}


def _tracked(c: Calls) -> dict:
    assert len(c.track) == 1 and not c.merge, "expected one track"
    return c.track[0][1]


TRACK_TABLE = {
    "checkpoints": checkpoints_only(lambda p: [str(p.ckpt2)],
                                    lambda c, p: c.track[0][0] == [str(p.ckpt), str(p.ckpt2)]),
    "out": checkpoints_only(lambda p: ["--out", str(p.out)], lambda c, p: _tracked(c)["out"] == str(p.out)),
    "merge": {"checkpoints": (lambda p: ["--merge", str(p.records)], REFUSED),
              "merge": ([], lambda c, p: c.merge == [str(p.records)] and not c.track)},
    "steps": checkpoints_only(["--steps", "100"], lambda c, p: _tracked(c)["steps"] == [100]),
    "block_len": checkpoints_only(["--block-len", "7"], lambda c, p: _tracked(c)["tokens"].block_len == 7),
    "batch": checkpoints_only(["--batch", "3"], lambda c, p: _tracked(c)["tokens"].batch == 3),
    "seed": checkpoints_only(["--seed", "5"], lambda c, p: _tracked(c)["tokens"].seed == 5),
    "top_k": checkpoints_only(["--top-k", "2"], lambda c, p: _tracked(c)["top_k"] == 2),
    "device": checkpoints_only(["--device", "cpu"], lambda c, p: _tracked(c)["device"] == "cpu"),
    "no_resume": checkpoints_only(["--no-resume"], lambda c, p: _tracked(c)["resume"] is False),
    "no_merge": checkpoints_only(["--no-merge"], lambda c, p: _tracked(c)["write_track"] is False and not c.save),
    "allow_download": checkpoints_only(["--allow-download"], lambda c, p: _tracked(c)["allow_download"] is True),
    "task": checkpoints_only(lambda p: ["--task", str(p.task_file)],
                             lambda c, p: _tracked(c)["task"] == str(p.task_file)),
    "target": checkpoints_only(lambda p: ["--task", str(p.task_file), "--target", "0.6"],
                               lambda c, p: _tracked(c)["target"] == 0.6),
    "png": {"checkpoints": (["--png"], lambda c, p: c.save == [{"out": Path(cli.DEFAULT_TRACK_OUT), "png": True}]),
            "merge": (["--png"], lambda c, p: c.save == [{"out": Path(str(p.records)), "png": True}])},
}

TABLES = {"scan": (SCAN_TABLE, SCAN_KINDS), "track": (TRACK_TABLE, TRACK_KINDS)}
MATRIX = [(sub, dest, kind) for sub, (_, kinds) in TABLES.items() for dest in _options(sub) for kind in kinds]


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("sub", TABLES)
def test_every_option_is_in_the_table(sub):
    table, kinds = TABLES[sub]
    options = _options(sub)
    missing = [_flag(options[dest]) for dest in options if dest not in table]
    assert not missing, ADD_A_ROW.format(sub=sub, flag=missing[0], table=f"{sub.upper()}_TABLE", kinds=kinds)
    stale = sorted(set(table) - set(options))
    assert not stale, f"{sub.upper()}_TABLE has rows for options the parser no longer has: {stale}"
    assert all(set(row) == set(kinds) for row in table.values())


@pytest.mark.parametrize("sub, dest, kind", MATRIX, ids=[f"{s}-{d}-{k.replace(' ', '-')}" for s, d, k in MATRIX])
def test_every_option_applies_or_is_refused(sub, dest, kind, calls, places, capsys):
    table, kinds = TABLES[sub]
    action = _options(sub)[dest]
    if dest not in table:
        pytest.fail(ADD_A_ROW.format(sub=sub, flag=_flag(action), table=f"{sub.upper()}_TABLE", kinds=kinds))
    extra, expected = table[dest][kind]
    extra = extra(places) if callable(extra) else extra
    code, out, err = _run([*_base(sub, kind, places), *extra], capsys)
    if expected == REFUSED:
        lines = err.splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("circuitkit: error: "), err
        assert _flag(action) in lines[0], lines[0]
        assert not calls.heavy, "refused only after the model (or a checkpoint) was loaded"
        return
    assert code == 0, err
    calls.stdout = out
    assert expected(calls, places), f"{_flag(action)} with {kind}: no effect seen ({vars(calls)})"


@pytest.mark.parametrize("argv, needle", [
    (["--quick", "--ablate-top", "3"], "--ablate-top: given with --quick"),
    (["--ablate", "all", "--ablate-top", "3"], "--ablate-top: given with --ablate all"),
    (["--ablate", "none", "--ablate-top", "3"], "--ablate-top: given with --ablate none"),
    (["--no-circuit", "--target", "0.5"], "--target: given with --no-circuit, which does not use it (there is no "
                                          "circuit search)"),
    (["--quick", "--random-sets", "2"], "--random-sets: given with --quick"),
    (["--no-circuit", "--stability", "2"], "--stability: given with --no-circuit"),
    (["--json", "--sort", "prev"], "--sort: given with --json"),
    (["--no-circuit", "--no-edges"], "--no-edges: given with --no-circuit"),
    (["--task", "ioi", "--quick", "--no-edges"], "--no-edges: given with --quick, which does not use it (a quick "
                                                 "task scan measures no edge circuit)"),
    (["--task", "ioi", "--quick", "--edge-search", "refined"], "--edge-search: given with --quick, which does not "
                                                               "use it (no edge circuit is measured to search)"),
    (["--task", "ioi", "--no-edges", "--edge-search", "refined"], "--edge-search: given with --no-edges"),
    (["MODEL", "--device-map", "auto", "--device", "cpu"], "--device: given with --device-map"),
    (["--pairs", "5"], "--pairs: given for the induction scan (no --task), which does not use it"),
    (["--task", "ioi", "--batch", "16"], "--batch: given with --task ioi, which does not use it (a task's pairs"),
])
def test_an_option_another_option_turns_off_is_refused(argv, needle, calls, places, capsys):
    argv = [str(places.model) if a == "MODEL" else a for a in argv]
    code, _, err = _run(["scan", *argv], capsys)
    assert code == 2 and err.count("\n") == 1 and needle in err, err
    assert not calls.heavy


def test_png_with_no_merge_is_refused(calls, places, capsys):
    code, _, err = _run(["track", str(places.ckpt), "--no-merge", "--png"], capsys)
    assert code == 2 and err.startswith("circuitkit: error: --png: given with --no-merge") and err.count("\n") == 1
    assert not calls.heavy


def test_given_options_are_the_ones_on_the_command_line():
    """Given at its default value is given (``--batch 16``); left out is not, whatever the default."""
    assert cli.given_options(["scan", "--batch", "16", "--quick"]) == {"batch", "quick"}
    assert cli.given_options(["scan", "--seq-len", "4", "model"]) == {"block_len", "model"}
    assert cli.given_options(["scan"]) == frozenset()
    assert cli.given_options(["track", "--merge", "d"]) == {"merge"}
    # a namespace parsed elsewhere (no record of the command line): the options that differ from their defaults
    assert cli._given(cli.build_parser().parse_args(["scan", "--batch", "3", "--seed", "0"])) == {"batch"}


@pytest.mark.slow
def test_task_file_quick_skips_the_edge_circuit(tmp_path, capsys):
    """For real, on the bundled model: --quick with a task file finds the node circuit with one EAP-IG point and
    skips the edge circuit (settings.edges false, no edges stage); without --quick the edge circuit is measured."""
    import random

    rng = random.Random(0)
    rows = []
    for _ in range(8):  # the bundled model copies in context: the token after an earlier copy of the last one
        tokens = rng.sample(range(1, 60), 7)
        prompt, spare, i = tokens[:6], tokens[6], rng.randint(1, 3)
        clean = [*prompt, prompt[i]]
        corrupted = [*clean[:i], spare, *clean[i + 1:]]
        rows.append({"clean": clean, "corrupted": corrupted, "answer": prompt[i + 1], "wrong": prompt[0]})
    path = tmp_path / "copy.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    seen = {}
    for quick in (True, False):
        out = tmp_path / f"out-{quick}"
        assert cli.main(["scan", "--task", str(path), "--out", str(out), "--json", *(["--quick"] * quick)]) == 0
        seen[quick] = json.loads(capsys.readouterr().out)
    assert seen[True]["settings"]["edges"] is False and seen[False]["settings"]["edges"] is True
    assert "edges" not in [s["name"] for s in seen[True]["stages"]]
    assert "edges" in [s["name"] for s in seen[False]["stages"]]
    assert seen[True]["settings"]["ig_steps"] == 1 and seen[False]["settings"]["ig_steps"] == 3
    assert seen[True]["circuit"]["faithfulness"] >= 0.8 and seen[True]["settings"]["quick"] is True
    assert sum(s["passes"] for s in seen[True]["stages"]) < sum(s["passes"] for s in seen[False]["stages"]) / 2


def test_the_readme_commands_use_only_options_that_apply():
    """Every `circuitkit scan` / `circuitkit track` line of the README parses and passes the refusals."""
    import re
    import shlex

    readme = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")
    commands = re.findall(r"^circuitkit ((?:scan|track)[^#\n]*)", readme, re.M)
    assert len(commands) >= 10
    parser = cli.build_parser()
    for command in commands:
        argv = shlex.split(command)
        args = parser.parse_args(argv)
        args._given = cli.given_options(argv)
        if args.command == "track":
            cli.refuse_unused_track_options(args)
            continue
        kind = (cli.INDUCTION if args.task == "induction" else cli.BUILT_IN_TASK if args.task in cli.BUILT_IN_TASKS
                else cli.TASK_FILE)
        cli.refuse_unused_scan_options(args, kind)


def test_the_choices_written_out_for_help_are_the_librarys():
    """``--help`` imports no torch, so the command line spells the choices of a task's options itself: they must be
    the library's own lists, in order."""
    from circuitkit import cli
    from circuitkit.circuits.search import SEARCH_NAMES
    from circuitkit.graph.nodes import KV_EDGES
    from circuitkit.ig_path import IG_POINTS
    from circuitkit.tasks.circuit import NODE_RANKINGS
    from circuitkit.tasks.search import EDGE_SEARCH_NAMES

    scan = cli._subcommands(cli.build_parser())["scan"]
    choices = {action.dest: tuple(action.choices) for action in scan._actions if action.choices}
    assert choices["search"] == SEARCH_NAMES and choices["edge_search"] == EDGE_SEARCH_NAMES
    assert choices["kv_edges"] == KV_EDGES and choices["ig_points"] == IG_POINTS
    assert choices["node_ranking"] == NODE_RANKINGS


def test_the_induction_scan_takes_search(tmp_path, capsys):
    """``circuitkit scan --search refined`` on the bundled model: at target 0.3 the refined search takes the ranked
    3 heads to 2; the answer says so and ``scores.json`` records it (the library's circuit, tested beside
    ``find_circuit`` in tests/test_task_options.py)."""
    import json

    from circuitkit import cli

    assert cli.main(["scan", "--search", "refined", "--target", "0.3", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "the refined search from the ranked top 3 chose these 2 heads" in out
    data = json.loads((tmp_path / "scores.json").read_text(encoding="utf-8"))
    assert data["settings"]["search"] == "refined" and len(data["circuit"]["heads"]) == 2


@pytest.mark.parametrize("argv, needle", [
    (["--search-passes", "40"], "--search-passes.*with --search ranked"),
    (["--search", "masks", "--search-passes", "40"], "--search-passes.*with --search masks"),
    (["--search", "refined", "--search-passes", "0"], "--search-passes.*above 0"),
    (["--search", "refined", "--search-passes", "nan"], "--search-passes.*above 0"),
    (["--search", "refined", "--no-circuit"], "--search.*with --no-circuit"),
])
def test_search_passes_needs_the_refined_search(argv, needle, capsys):
    """The pass budget is the refined search's: refused in one line without it (and a search without a circuit
    search), before any model loads."""
    from circuitkit import cli

    assert cli.main(["scan", *argv]) != 0
    err = capsys.readouterr().err
    assert re.search(needle, err) and "Traceback" not in err, err
