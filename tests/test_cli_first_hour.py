"""What a new user meets first: the CLI answers argument and path errors before torch loads, says "no such
directory or file" as such, prints a line before the model loads, and its messages say what happened in words
(the start-up times themselves are measured in benchmarks/README.md, not here)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from circuitkit.cli import build_parser, main
from circuitkit.errors import CircuitkitError
from circuitkit.models.locate import check_model_name


def _run_isolated(code: str, tmp_path) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter (so ``sys.modules`` starts empty), with an empty Hugging Face cache."""
    env = {"HF_HUB_CACHE": str(tmp_path / "hf-cache"), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": ":".join(p for p in sys.path if p)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)


@pytest.mark.parametrize(
    "args, said",
    [
        (["scan", "smol-randm"], "MODEL: given 'smol-randm': no such directory or file here"),
        (["scan", "./models/smol"], "MODEL: no such directory or file:"),
        (["scan", "qwen.gguf"], "MODEL: no such directory or file:"),
        (["scan", "--out", "a-file"], "--out: given str 'a-file'; expected a directory"),
        (["scan", "--batch", "x"], "argument --batch: given 'x'; expected an integer"),
        (["scan", "--quick", "--ablate", "all"], "--quick: given with --ablate all"),
        (["scan", "--sort", "foo"], "--sort: given 'foo'; expected a column of the table"),
        (["scan", "--task", "ioi", "--top-k", "3"], "--top-k: given with --task ioi, which does not use it"),
        (["scan", "--task", "pairs.jsonl", "--block-len", "5"], "--block-len: given with --task pairs.jsonl"),
        (["scan", "--task", "sentiment"], "--task: given 'sentiment'; expected one of induction"),
        (["scan", "pairs.jsonl"], "MODEL: given 'pairs.jsonl', a file; expected a model (a local Hugging Face "
                                  "directory or a .gguf file). 'pairs.jsonl' looks like a task file: did you mean "
                                  "--task pairs.jsonl?"),
        (["scan", "--qiuck"], "unrecognized arguments: --qiuck; did you mean --quick?"),
        (["scan", "--QUICK"], "unrecognized arguments: --QUICK; did you mean --quick?"),
        (["track", "x", "--pgn"], "unrecognized arguments: --pgn; did you mean --png?"),
        (["scan", "--task", "iio"], "clean/corrupted pairs; did you mean ioi?"),
        (["scan", "--task", "pair.jsonl"], "--task: 'pair.jsonl': no such file; expected a task file of "
                                           "clean/corrupted pairs; did you mean 'pairs.jsonl'?"),
        (["scan", "--sort", "indct"], "did you mean induct?"),
        (["scan", "--ablate", "al"], "invalid choice: 'al' (choose from 'top', 'all', 'none'); did you mean 'all'?"),
        (["scna"], "invalid choice: 'scna' (choose from 'scan', 'track'); did you mean 'scan'?"),
        (["scan", "induction-2"], "--allow-download to fetch it from the hub; did you mean induction-2l?"),
    ],
    ids=["typo-name", "missing-directory", "missing-gguf", "out-is-a-file", "bad-integer", "quick-with-ablate",
         "sort-column", "option-a-task-does-not-use", "option-a-task-file-does-not-use", "task-name",
         "task-file-as-model", "flag-typo", "flag-case", "track-flag-typo", "task-name-typo", "task-file-typo",
         "sort-typo", "choice-typo", "command-typo", "zoo-name-typo"],
)
def test_argument_and_path_errors_come_before_torch_is_imported(args, said, tmp_path):
    (tmp_path / "a-file").write_text("not a directory")
    (tmp_path / "pairs.jsonl").write_text('{"clean": "a b", "corrupted": "a c", "answer": " d", "wrong": " e"}\n')
    completed = _run_isolated(f"""
        import sys
        from circuitkit.cli import main
        code = main({args!r} + ([] if "--out" in {args!r} else ["--out", "out"]))
        heavy = sorted(m for m in ("torch", "transformers", "transformer_lens", "plotly") if m in sys.modules)
        print(code, heavy)
    """, tmp_path)
    assert completed.stdout.strip() == "2 []", completed.stderr
    errors = [line for line in completed.stderr.splitlines() if line.startswith("circuitkit: error:")]
    assert len(errors) == 1 and said in errors[0], completed.stderr
    assert "neither a zoo model" not in completed.stderr


def test_a_missing_path_is_said_to_be_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    with pytest.raises(CircuitkitError) as caught:
        check_model_name("models/smol-randm/sub")
    message = str(caught.value)
    assert f"no such directory or file: '{tmp_path / 'models/smol-randm/sub'}'" in message
    assert f"'{tmp_path / 'models'}' is the closest that exists" in message
    assert "\n" not in message


def test_names_that_may_load_pass_the_early_check(tmp_path, monkeypatch):
    """A bundled name, an existing path, a cached hub repository, any name with --allow-download: left to
    load_model (the check only refuses what cannot load)."""
    cache = tmp_path / "cache"
    (cache / "models--org--tiny").mkdir(parents=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-dir").mkdir()
    for name in (None, "induction-2l", "a-dir", str(tmp_path / "a-dir"), "org/tiny", "gpt2-small"):
        assert check_model_name(name) is None, name
    assert check_model_name("org/other", allow_download=True) is None
    with pytest.raises(CircuitkitError, match="no model of that name in the local Hugging Face cache"):
        check_model_name("org/other")


def test_a_line_is_printed_before_the_model_loads(tmp_path, capsys, monkeypatch):
    import circuitkit.models.loading as loading

    seen = {}

    def load_model(*args, **kwargs):
        seen["err"] = capsys.readouterr().err
        raise CircuitkitError("stop here")

    from circuitkit import zoo

    monkeypatch.setattr(loading, "load_model", load_model)
    monkeypatch.setattr(zoo, "load", load_model)  # the bundled model's own loader
    assert main(["scan", "--out", str(tmp_path / "out")]) == 2
    assert seen["err"].splitlines() == ["scan: loading induction-2l (the bundled model)"]
    capsys.readouterr()
    assert main(["scan", "--out", str(tmp_path / "out2"), "--task", "ioi"]) == 2  # a task loads the bridge
    assert seen["err"].splitlines() == ["scan: loading induction-2l (the bundled model)"]


def test_device_cuda_without_cuda_says_cuda_is_not_available(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("hardware: this machine has CUDA, so --device cuda is valid here")
    assert main(["scan", "--out", str(tmp_path / "out"), "--device", "cuda"]) == 2
    line = capsys.readouterr().err.splitlines()[-1]
    assert line == ("circuitkit: error: --device: given 'cuda', but CUDA is not available here (no CUDA GPU, or a "
                    "CPU-only torch); expected 'cpu' or a device this machine has. Leave the device out or pass "
                    "'cpu'.")
    assert "on this machine" not in line


def test_no_circuit_help_says_it_skips_the_circuit_search():
    scan = build_parser()._subparsers._group_actions[0].choices["scan"]
    text = " ".join(scan.format_help().split())
    assert "--no-circuit skip the circuit search (faithfulness) and the edge evidence" in text


def _fake_scan(error=None, stages=("scores", "weights")):
    return SimpleNamespace(verified=None, verified_error=error, stages=[SimpleNamespace(name=s) for s in stages],
                           called={"induction": ((1, 0),), "previous_token": ()})


def test_the_answer_says_why_there_is_no_circuit():
    from circuitkit.report.summary import answer_lines, no_circuit_line

    skipped = _fake_scan()
    assert no_circuit_line(skipped, "--no-circuit") == ("Circuit search skipped (--no-circuit); run without "
                                                        "--no-circuit to search for a circuit.")
    assert no_circuit_line(skipped) == ("Circuit search skipped (circuit=False); pass circuit=True to search for "
                                        "a circuit.")
    failed = _fake_scan("faithfulness: ablating every attention head changes the loss by only +0.001 nats",
                        ("scores", "circuit", "weights"))
    line = answer_lines(failed, "--quick")[0]
    assert line == ("No circuit found by faithfulness: ablating every attention head changes the loss by only "
                    "+0.001 nats")
    assert answer_lines(failed)[1] == "Heads by pattern score alone: induction 1.0; previous-token none."


def test_load_model_says_a_missing_path_is_missing(tmp_path, monkeypatch):
    import circuitkit as ck

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    for name in ("./no-such-dir", "smol-randm"):
        with pytest.raises(CircuitkitError, match=f"given '{name}': no such directory or file"):
            ck.load_model(name)


EDGES = ("Edges: exact effect on the loss, path patching, nats: 0.1 → 1.3 K +0.16; 0.1 → 1.1 K +0.11; "
         "0.0 → 1.3 K +0.06; 0.0 → 1.1 K +0.05 (4 other patched edges between circuit heads carry nothing).")
CIRCUIT = "Circuit: 4 of 8 heads: 0.1 prev-token, 0.0 prev-token, 1.3 induction, 1.1 induction."


@pytest.mark.parametrize("width", [20, 32, 50, 80, 200])
@pytest.mark.parametrize("text", [EDGES, CIRCUIT], ids=["edges", "circuit"])
def test_terminal_lines_wrap_between_items_never_inside_one(text, width):
    from circuitkit.cli import wrap_items

    lines = wrap_items(text, width)
    assert " ".join(" ".join(lines).split()) == text  # nothing lost or reordered
    assert all(len(line) <= width for line in lines if " " in line.strip())
    items = ["0.1 → 1.3 K +0.16", "0.0 → 1.3 K +0.06", "0.1 prev-token", "1.3 induction", "1.1 induction"]
    for item in items:
        if item in text and len(item) + 2 <= width:
            assert any(item in line for line in lines), (item, lines)
    if width >= len(text):
        assert lines == [text]


@pytest.mark.parametrize("name, content, said", [
    ("missing.jsonl", '{"clean": "a b", "corrupted": "a c", "answer": " d"}\n', "(missing ['wrong'])"),
    ("broken.jsonl", '{"clean": "a b",\n', "line 1 is not JSON"),
    ("empty.jsonl", '{"clean": "", "corrupted": "a c", "answer": " d", "wrong": " e"}\n', "a non-empty prompt"),
    ("columns.csv", "clean,corrupted,answer\na b,a c, d\n", "missing ['wrong']"),
    ("prompts.json", '{"pairs": []}', 'has no list under "prompts"'),
], ids=["missing-key", "bad-json", "empty-prompt", "csv-missing-column", "json-no-prompts"])
def test_a_bad_task_file_is_refused_before_the_model_loads(name, content, said, tmp_path, capsys, monkeypatch):
    import circuitkit.models.loading as loading

    def load_model(*args, **kwargs):
        raise AssertionError("the model loaded before the task file was read")

    monkeypatch.setattr(loading, "load_model", load_model)
    path = tmp_path / name
    path.write_text(content)
    assert main(["scan", "--task", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"scan: reading the task file {path}" and len(err) == 2, err
    assert err[1].startswith(f"circuitkit: error: task file {str(path)!r}") and said in err[1], err


def test_a_bad_task_file_is_answered_without_the_model_libraries(tmp_path):
    """Reading a task file needs torch (the task module's types), not transformers or TransformerLens."""
    (tmp_path / "missing.jsonl").write_text('{"clean": "a b", "corrupted": "a c", "answer": " d"}\n')
    completed = _run_isolated("""
        import sys
        from circuitkit.cli import main
        code = main(["scan", "--task", "missing.jsonl", "--out", "out"])
        print(code, sorted(m for m in ("transformers", "transformer_lens", "plotly") if m in sys.modules))
    """, tmp_path)
    assert completed.stdout.strip() == "2 []", completed.stderr
    assert "missing ['wrong']" in completed.stderr.splitlines()[-1]


def test_the_sort_columns_are_the_registered_scores(tmp_path):
    """cli.SCORE_COLUMNS mirrors the registry (so --sort is checked before torch loads): a fresh interpreter's
    registered scores, full and short names."""
    completed = _run_isolated("""
        from circuitkit import cli
        from circuitkit.detect import registry
        print({d.name: d.short for d in registry.registered()} == cli.SCORE_COLUMNS)
    """, tmp_path)
    assert completed.stdout.strip() == "True", completed.stderr


@pytest.mark.parametrize("column, said", [
    ("indct", "did you mean induct?"),
    ("previous", "did you mean previous_token?"),
    ("ablatd", "did you mean ablated?"),
    ("zzz", "attrib, copy, dup, first, induct, prev, self."),
])
def test_an_unknown_sort_column_gets_the_closest_names(column, said):
    from circuitkit.cli import sort_column

    with pytest.raises(CircuitkitError) as caught:
        sort_column(column)
    assert str(caught.value).endswith(said) and "\n" not in str(caught.value)


def test_a_file_of_a_model_directory_names_the_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my-model").mkdir()
    for name in ("config.json", "model.safetensors", "model-00001-of-00002.safetensors"):
        (tmp_path / "my-model" / name).write_text("{}")
        with pytest.raises(CircuitkitError) as caught:
            check_model_name(f"my-model/{name}")
        assert str(caught.value) == (f"MODEL: given 'my-model/{name}', a file of a model directory; expected the "
                                     "directory itself: did you mean my-model?")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(CircuitkitError, match="given 'notes.txt', a file; expected a local Hugging Face directory"):
        check_model_name("notes.txt")
    (tmp_path / "weights.gguf").write_text("x")  # a .gguf file and a directory pass: loading reads them
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")  # and a dangling link: loading says what it is
    for name in ("weights.gguf", "my-model", "dangling"):
        assert check_model_name(name) is None


def test_a_missing_path_suggests_its_closest_sibling(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    (tmp_path / "models" / "qwen").mkdir(parents=True)
    with pytest.raises(CircuitkitError) as caught:
        check_model_name(str(tmp_path / "models" / "qwn"))
    assert str(caught.value).endswith(f"or a .gguf file; did you mean {tmp_path / 'models' / 'qwen'}?")
    with pytest.raises(CircuitkitError) as caught:
        check_model_name(str(tmp_path / "models" / "zzzzzz"))
    assert str(caught.value).endswith("or a .gguf file.")
