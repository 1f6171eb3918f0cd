"""`circuitkit scan`: writes report.html and scores.json whose numbers are circuitkit's own scores; bad input
ends in one `circuitkit: error:` line and exit code 2, also from the real console script."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from circuitkit.cli import main

pytestmark = pytest.mark.slow

SCAN_ARGS = ["--batch", "2", "--block-len", "6", "--top-k", "3"]
# scores.json holds float64 copies of float32 scores
JSON_ATOL = 1e-7


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A random-init 2-layer GPT-2 (context 32) saved as a local Hugging Face directory: the offline MODEL path."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=16, vocab_size=32, n_positions=32, bos_token_id=0,
                        eos_token_id=0)
    directory = tmp_path_factory.mktemp("tiny-gpt2")
    GPT2LMHeadModel(config).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def scanned(hf_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("scan") / "report-dir"
    code = main(["scan", str(hf_dir), "--out", str(out), *SCAN_ARGS])
    return code, out


def test_scan_writes_report_and_scores(scanned):
    code, out = scanned
    assert code == 0
    html = (out / "report.html").read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>")
    data = json.loads((out / "scores.json").read_text(encoding="utf-8"))
    assert set(data["head_scores"]) >= {"induction", "previous_token"}
    assert set(data["composition"]) == {"Q", "K", "V"}
    assert all(len(entry["top_edges"]) == 3 for entry in data["composition"].values())
    assert data["settings"]["block_len"] == 6 and data["settings"]["batch"] == 2
    assert data["attribution"] is not None and data["ablation"]["ablated"]


def test_scores_json_equals_circuitkit_head_scores(scanned, hf_dir):
    """The oracle: the same model and options through the library give the numbers in scores.json."""
    from circuitkit.detect import RepeatedTokens, head_scores
    from circuitkit.models.loading import load_model

    _, out = scanned
    data = json.loads((out / "scores.json").read_text(encoding="utf-8"))
    expected = head_scores(load_model(str(hf_dir)), RepeatedTokens(block_len=6, batch=2, seed=0))
    for name in expected:
        written = torch.tensor(data["head_scores"][name], dtype=torch.float64)
        torch.testing.assert_close(written, expected[name].double(), atol=JSON_ATOL, rtol=0)


def test_scan_prints_a_ranked_table(hf_dir, tmp_path, capsys):
    assert main(["scan", str(hf_dir), "--out", str(tmp_path), *SCAN_ARGS]) == 0
    printed = capsys.readouterr().out
    assert "heads ranked by induction" in printed and "induct" in printed
    assert f"wrote {tmp_path / 'report.html'}" in printed.replace("\n", "")


def test_json_flag_prints_the_scores_json(hf_dir, tmp_path, capsys):
    assert main(["scan", str(hf_dir), "--out", str(tmp_path), "--json", *SCAN_ARGS]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads((tmp_path / "scores.json").read_text(encoding="utf-8"))


def _one_error_line(stderr: str) -> str:
    errors = [line for line in stderr.splitlines() if line.startswith("circuitkit: error:")]
    assert len(errors) == 1, stderr
    assert "Traceback" not in stderr
    return errors[0]


def test_unwritable_out_is_one_line_error(hf_dir, tmp_path, capsys):
    a_file = tmp_path / "not-a-dir"
    a_file.write_text("x")
    assert main(["scan", str(hf_dir), "--out", str(a_file)]) == 2
    assert "--out: given" in (line := _one_error_line(capsys.readouterr().err)) and "not a file" in line
    assert main(["scan", str(hf_dir), "--out", str(a_file / "below")]) == 2
    assert "--out: given" in (line := _one_error_line(capsys.readouterr().err)) and "cannot create 'below'" in line


def test_block_len_too_long_for_the_model_is_one_line_error(hf_dir, tmp_path, capsys):
    assert main(["scan", str(hf_dir), "--out", str(tmp_path), "--block-len", "17"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "block_len=17" in line and "expected at most the model's context n_ctx=32" in line


@pytest.mark.parametrize(
    "args, match",
    [
        (["--block-len", "0"], "expected an integer >= 2"),
        (["--batch", "-3"], "expected an integer >= 1"),
        (["--seed", str(2**70)], "expected an integer in [0,"),
        (["--seed", "1.5"], "expected an integer"),
        (["--ablate", "some"], "invalid choice"),
        (["--ablate-top", "0"], "expected an integer >= 1"),
        (["--out", ""], "empty path"),
        (["--device", "nonsense"], "device"),
        (["--device", "cuda"], "CUDA"),
        (["--device", "meta"], "meta"),
        (["--device-map", "{not json"], "--device-map"),
        (["--no-such-flag"], "unrecognized arguments"),
    ],
    ids=["block-len-0", "batch-negative", "seed-2-70", "seed-float", "ablate-value", "ablate-top-0", "out-empty",
         "device-nonsense", "device-cuda-without-gpu", "device-meta", "device-map-not-json", "unknown-flag"],
)
def test_bad_options_are_one_line_errors_with_exit_2(args, match, tmp_path, capsys):
    if "cuda" in args and torch.cuda.is_available():
        pytest.skip("this machine has a GPU: --device cuda is valid here")
    out = [] if "--out" in args else ["--out", str(tmp_path / "out")]
    assert main(["scan", *out, *args]) == 2
    assert match in _one_error_line(capsys.readouterr().err)


def test_ctrl_c_is_one_line_exit_130_and_keeps_earlier_outputs(scanned, tmp_path, capsys, monkeypatch):
    import circuitkit

    _, first = scanned
    out = tmp_path / "kept"
    shutil.copytree(first, out)
    before = {name: (out / name).read_bytes() for name in ("report.html", "scores.json")}

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(circuitkit, "scan", interrupted)
    assert main(["scan", "--out", str(out)]) == 130
    err = capsys.readouterr().err
    # the progress line that comes before the model loads, then the one line of the interruption
    lines = [line for line in err.splitlines() if not line.startswith("scan: ")]
    assert lines == [lines[0]] and lines[0].startswith("circuitkit: interrupted") and "Traceback" not in err
    assert {name: (out / name).read_bytes() for name in before} == before


def test_directory_without_a_model_is_one_line_error(tmp_path, capsys):
    empty = tmp_path / "empty-model-dir"
    empty.mkdir()
    assert main(["scan", str(empty), "--out", str(tmp_path / "out")]) == 2
    assert "no config.json" in _one_error_line(capsys.readouterr().err)


def _console_script() -> str:
    beside = Path(sys.executable).with_name("circuitkit")
    found = str(beside) if beside.exists() else shutil.which("circuitkit")
    assert found, "the circuitkit console script is not installed (pip install -e .)"
    return found


def test_console_script_unknown_model_offline_is_one_line_error(tmp_path):
    """The real `circuitkit` entry point: a name that is no zoo model, no directory and unreachable."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}  # no network here; the same path a user without network takes
    completed = subprocess.run(
        [_console_script(), "scan", "no-such-model-xyz", "--out", str(tmp_path / "out")],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert completed.returncode == 2, completed.stderr
    line = _one_error_line(completed.stderr)
    assert "'no-such-model-xyz'" in line and "local Hugging Face directory" in line
    assert "--allow-download" in line
    assert completed.stdout == ""


def test_default_model_is_the_bundled_known_answer_model(tmp_path, capsys):
    """`circuitkit scan` with no MODEL (the README's quick start) scans the zoo default and ranks its
    documented induction heads on top."""
    from circuitkit import zoo

    assert main(["scan", "--out", str(tmp_path), "--batch", "8", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    entry = zoo.info(zoo.DEFAULT)
    assert data["model"]["name"] == zoo.DEFAULT
    assert entry.induction_heads, f"zoo entry {zoo.DEFAULT!r} documents no induction heads"
    n = len(entry.induction_heads)
    ranked = {(item["layer"], item["index"]) for item in data["top_heads"]["induction"][:n]}
    assert ranked == set(entry.induction_heads)
    assert (tmp_path / "report.html").stat().st_size > 0


def test_same_scan_gives_the_same_bytes(scanned, hf_dir, tmp_path):
    """No timestamps or random ids: a repeated scan reproduces report.html and scores.json exactly."""
    _, first = scanned
    assert main(["scan", str(hf_dir), "--out", str(tmp_path), *SCAN_ARGS]) == 0
    for name in ("report.html", "scores.json"):
        assert (tmp_path / name).read_bytes() == (first / name).read_bytes(), name


# ---------------------------------------------------------------------- --sort and --quick
def _table_rows(table) -> list[list[str]]:
    """The rendered rows of a ranked table (rank, head, one cell per column), read from rich's own text."""
    import io

    from rich.console import Console

    buffer = io.StringIO()
    Console(file=buffer, width=300, color_system=None).print(table)
    lines = buffer.getvalue().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("rank"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.strip() or not line.split()[0].isdigit():
            break
        rows.append(line.split())
    return rows


@pytest.fixture(scope="module")
def scan_all(hf_dir):
    """The tiny model scanned with every head ablated exactly (4 heads): every ablated cell is filled."""
    import circuitkit as ck
    from circuitkit.detect import RepeatedTokens
    from circuitkit.models.loading import load_model

    return ck.scan(load_model(str(hf_dir)), tokens=RepeatedTokens(block_len=6, batch=2), ablate="all", circuit=False)


@pytest.mark.parametrize("column, source", [("ablate", "ablation"), ("ablated", "ablation"),
                                            ("attrib", "attribution"), ("prev", "previous_token"),
                                            ("previous_token", "previous_token"), ("dup", "duplicate_token")])
def test_sort_orders_the_table_by_any_column(scan_all, column, source):
    from circuitkit.cli import ranked_table
    from circuitkit.ranking import head_name

    table = ranked_table(scan_all, sort=column)
    values = (getattr(scan_all, source).effect if source in ("ablation", "attribution")
              else scan_all.head_scores[source])
    # the oracle: torch's own descending sort of the column's values (no ties in this random model)
    order = torch.argsort(values.reshape(-1), descending=True).tolist()
    expected = [head_name(divmod(i, values.shape[1])) for i in order]
    assert [row[1] for row in _table_rows(table)] == expected
    label = {"ablation": "ablated (loss rise, nats)", "attribution": "attrib (loss rise, nats)"}
    assert str(table.title).endswith("ranked by " + label.get(source, f"{source} score"))


def test_default_table_order_is_the_induction_score(scan_all):
    from circuitkit.cli import ranked_table

    values = scan_all.head_scores["induction"].reshape(-1)
    heads = [row[1] for row in _table_rows(ranked_table(scan_all))]
    assert heads[0] == "{}.{}".format(*divmod(int(values.argmax()), 2))


def test_sort_puts_heads_that_were_not_ablated_last(hf_dir, tmp_path, capsys):
    assert main(["scan", str(hf_dir), "--out", str(tmp_path), "--ablate-top", "1", "--sort", "ablate",
                 *SCAN_ARGS]) == 0
    data = json.loads((tmp_path / "scores.json").read_text(encoding="utf-8"))
    exact = sum(value is not None for row in data["ablation"]["effect"] for value in row)  # JSON null: not ablated
    printed = capsys.readouterr().out
    assert "heads ranked by ablated" in printed
    assert 0 < exact < 4  # a few heads ablated exactly, the others not: their cells are blank, at the bottom
    rows = [line.split() for line in printed.splitlines() if line.strip()[:1].isdigit() and "." in line]
    filled = [len(row) for row in rows]
    assert filled == sorted(filled, reverse=True) and filled[0] > filled[-1]


def test_quick_skips_exact_ablation_and_edge_evidence(hf_dir, tmp_path, capsys):
    assert main(["scan", str(hf_dir), "--out", str(tmp_path), "--quick", *SCAN_ARGS]) == 0
    data = json.loads((tmp_path / "scores.json").read_text(encoding="utf-8"))
    assert data["settings"]["ablate"] == "none"
    assert data["ablation"] is None and data["circuit"] is None
    assert data["attribution"] is not None and set(data["composition"]) == {"Q", "K", "V"}
    out = capsys.readouterr().out
    assert "ablated" not in out.split("attrib:")[0]
    # the search never ran: the answer says it was skipped and which flag did it, not "no circuit found"
    assert "Circuit search skipped (--quick); run without --quick to search for a circuit." in out
    assert "No circuit found" not in out


@pytest.mark.parametrize(
    "args, match",
    [
        (["--sort", "nope"], "--sort: given 'nope'; expected a column of the table: ablated, attrib, copy"),
        (["--quick", "--sort", "ablated"], "ablates no head exactly"),
        (["--ablate", "none", "--sort", "ablate"], "ablates no head exactly"),
        (["--quick", "--ablate", "top"], "--quick: given with --ablate top"),
    ],
    ids=["unknown-column", "quick-ablated", "none-ablated", "quick-with-ablate"],
)
def test_bad_sort_and_quick_are_one_line_errors_before_any_work(args, match, tmp_path, capsys, monkeypatch):
    import circuitkit

    def must_not_scan(*a, **k):
        raise AssertionError("the scan ran before the options were checked")

    monkeypatch.setattr(circuitkit, "scan", must_not_scan)
    assert main(["scan", "--out", str(tmp_path / "out"), *args]) == 2
    assert match in _one_error_line(capsys.readouterr().err)
