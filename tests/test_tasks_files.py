"""Task files read adversarially: special files, sizes, depth, encodings, line endings and odd token ids.

Every bad file is one ``CircuitkitError`` line that names the file (and the row where there is one), returned
quickly; valid variants of one file (CRLF, a byte-order mark, a line separator inside a string) read the same
pairs as the plain file. Complements the format tests in ``tests/test_tasks.py``.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from circuitkit import CircuitkitError
from circuitkit.graph.task import MAX_ANSWERS, MAX_PAIRS
from circuitkit.handbuilt.induction import induction_circuit
from circuitkit.tasks import load_task
from circuitkit.tasks.files import MAX_TASK_BYTES

ROWS = [{"clean": "a b c", "corrupted": "a d c", "answer": " x", "wrong": " y"},
        {"clean": [1, 2, 3], "corrupted": [1, 4, 3], "answer": [2, 5], "wrong": 4}]
CSV = 'clean,corrupted,answer,wrong\n"a b c","a d c", x, y\n"e, f","e, g"," z"," w"\n'


def write(path: Path, data: str | bytes) -> Path:
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return path


def jsonl(rows) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def refused(path, *needles: str) -> str:
    """``load_task(path)`` raises one CircuitkitError line naming the file and every needle, within 10 s."""

    def hung(signum, frame):
        raise TimeoutError

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(10)
    try:
        with pytest.raises(CircuitkitError) as info:
            load_task(path)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    message = str(info.value)
    assert "\n" not in message and len(message) < 1000, message
    assert str(path) in message, message
    for needle in needles:
        assert needle in message, message
    return message


# ---------------------------------------------------------------------------------------------- special files
def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    refused(fifo, "regular file")


def test_links_to_dev_zero_and_dev_zero_itself_are_refused(tmp_path):
    link = tmp_path / "zero.jsonl"
    link.symlink_to("/dev/zero")
    refused(link, "/dev/zero")
    with pytest.raises(CircuitkitError, match="regular file"):
        load_task("/dev/zero")


def test_a_directory_and_a_dangling_link_are_refused(tmp_path):
    folder = tmp_path / "pairs.jsonl"
    folder.mkdir()
    refused(folder, "regular file")
    dangling = tmp_path / "gone.jsonl"
    dangling.symlink_to(tmp_path / "nowhere.jsonl")
    with pytest.raises(CircuitkitError):
        load_task(dangling)


def test_a_file_past_the_size_cap_is_refused_before_it_is_read(tmp_path):
    big = tmp_path / "big.jsonl"
    with open(big, "wb") as handle:  # sparse: 65 MiB on paper, nothing written
        handle.truncate(65 * 2**20)
    assert big.stat().st_size > MAX_TASK_BYTES
    refused(big, "65.0 MiB", "at most 64 MiB")


def test_messages_name_a_task_file_not_a_model_file(tmp_path):
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    message = refused(fifo)
    assert message.startswith("task file") and "model" not in message


# ---------------------------------------------------------------------------------------------- structure
def test_deep_json_is_refused_in_every_format(tmp_path):
    deep = "[" * 200_000 + "]" * 200_000
    refused(write(tmp_path / "deep.json", deep), "nested too deeply")
    refused(write(tmp_path / "deep.jsonl", deep + "\n"), "line 1", "nested too deeply")
    inner = '{"clean": ' + "[" * 200_000 + "]" * 200_000 + ', "corrupted": [1], "answer": 1, "wrong": 2}\n'
    refused(write(tmp_path / "inner.jsonl", inner), "line 1")


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_tokens_are_refused(tmp_path, constant):
    line = f'{{"clean": [1, {constant}], "corrupted": [1, 2], "answer": 2, "wrong": 3}}\n'
    refused(write(tmp_path / "nan.jsonl", line), "line 1 is not JSON")
    auto = f'{{"prompts": [{{"clean": [1], "corrupt": [2], "answers": [{constant}], "wrong_answers": [3]}}]}}'
    refused(write(tmp_path / "nan.json", auto), "is not JSON")


@pytest.mark.parametrize("field, value, needle", [
    ("clean", [1.0, 2], "token ids (ints)"),
    ("clean", [1, 2.5], "token ids (ints)"),
    ("clean", [True, 2], "token ids (ints)"),
    ("clean", [1, -2], "[0, 2**63)"),
    ("clean", [1, 2**64], "[0, 2**63)"),
    ("clean", [1, 1e300], "token ids (ints)"),
    ("clean", [[1, 2], [3]], "token ids (ints)"),
    ("clean", ["1", "2"], "token ids (ints)"),
    ("clean", {"ids": [1]}, "token ids (ints)"),
    ("clean", None, "token ids (ints)"),
    ("clean", [], "non-empty prompt"),
    ("answer", 2.0, "answer text or a token id"),
    ("answer", True, "answer text or a token id"),
    ("answer", -1, "[0, 2**63)"),
    ("answer", 10**40, "[0, 2**63)"),
    ("answer", [[2], [3]], "answer text or a token id"),
    ("answer", [], "one to 16 answers"),
    ("answer", list(range(1, MAX_ANSWERS + 2)), "one to 16 answers"),
    ("answer", list(range(100_000)), "one to 16 answers"),
    ("wrong", "", "non-empty answer"),
    ("wrong", None, "answer text or a token id"),
])
def test_odd_token_ids_and_answers_name_the_row(tmp_path, field, value, needle):
    row = {"clean": [1, 2, 3], "corrupted": [1, 4, 3], "answer": 2, "wrong": 4, field: value}
    good = {"clean": [5, 6], "corrupted": [5, 7], "answer": 6, "wrong": 7}
    path = write(tmp_path / "odd.jsonl", jsonl([good, row]))
    refused(path, "line 2", needle)
    auto = {"prompts": [{"clean": row["clean"], "corrupt": row["corrupted"], "answers": row["answer"],
                         "wrong_answers": row["wrong"]}]}
    refused(write(tmp_path / "odd.json", json.dumps(auto)), "prompt 1", needle)


def test_a_4400_digit_id_is_refused_with_a_short_message(tmp_path):
    """Python's int() refuses more than 4300 digits; the message must not repeat them."""
    line = '{"clean": [1, ' + "7" * 4400 + '], "corrupted": [1, 2], "answer": 2, "wrong": 3}\n'
    message = refused(write(tmp_path / "long.jsonl", line), "line 1")
    assert "7777777777" not in message
    eap = write(tmp_path / "eap.csv", "clean,corrupted,correct_idx,incorrect_idx\na,b," + "9" * 5000 + ",3\n")
    message = refused(eap, "row 2", "5000 characters")
    assert len(message) < 300


def test_sixteen_answers_are_taken_and_ids_up_to_int64_wait_for_the_model(tmp_path):
    row = {"clean": [1, 2, 3], "corrupted": [1, 4, 3], "answer": list(range(10, 10 + MAX_ANSWERS)),
           "wrong": [2**63 - 1]}
    task = load_task(write(tmp_path / "many.jsonl", jsonl([row])))
    assert len(task.pairs[0].answers) == MAX_ANSWERS and task.pairs[0].wrongs == (2**63 - 1,)
    model = induction_circuit(10, 16).model  # vocabulary of 10: both lists fall outside it
    with pytest.raises(CircuitkitError, match=r"pair 0: the answer holds token ids \[10, 11, 12, 13, 14\]"):
        task.tokenize(model)


def test_more_pairs_than_the_cap_are_refused_in_every_format(tmp_path):
    prompt = {"clean": [1], "corrupt": [2], "answers": [3], "wrong_answers": [4]}
    auto = write(tmp_path / "many.json", json.dumps({"prompts": [prompt] * (MAX_PAIRS + 1)}))
    refused(auto, f"more than {MAX_PAIRS} pairs")
    csv = write(tmp_path / "many.csv", "clean,corrupted,answer,wrong\n" + "a,b,c,d\n" * (MAX_PAIRS + 1))
    refused(csv, f"more than {MAX_PAIRS} pairs")


@pytest.mark.parametrize("content, needle", [
    ('{"prompts": {"clean": "a"}}', 'no list under "prompts"'),
    ('[{"clean": "a", "corrupt": "b", "answers": ["c"], "wrong_answers": ["d"]}]', 'no list under "prompts"'),
    ('{"prompts": [["a", "b", "c", "d"]]}', "prompt 1 is not an object"),
    ('{"prompts": []}', "holds no pairs"),
    ("", "is not JSON"),
])
def test_auto_circuit_files_of_the_wrong_shape(tmp_path, content, needle):
    refused(write(tmp_path / "auto.json", content), needle)


@pytest.mark.parametrize("content, needle", [
    ("clean,corrupted,answer,wrong\n" + '"' + "a" * 200_000 + '",b,c,d\n', "field larger than field limit"),
    ('clean,corrupted,answer,wrong\n"a,b,c,d\n', "row 2 has 1 fields; expected 4"),
    ("clean,corrupted,answer,wrong\na,b,c,d\n,b,c,d\n", "row 3: clean"),
    ("clean,corrupted,answer,wrong,extra\na,b,c,d\n", "row 2 has 4 fields; expected 5"),
    ("clean,corrupted,answer,wrong\na,b,c,d,e\n", "row 2 has 5 fields; expected 4"),
    ("clean,corrupted,answer,wrong\na,b,c\n", "row 2 has 3 fields; expected 4"),
    ("clean,corrupted,correct_idx,incorrect_idx\na,b,1.5,2\n", "an integer token id"),
    ("clean,corrupted,correct_idx,incorrect_idx\na,b,-1,2\n", "row 2: answer"),
])
def test_bad_csv_rows(tmp_path, content, needle):
    refused(write(tmp_path / "bad.csv", content), needle)


def test_a_nul_byte_in_a_csv_field_is_text(tmp_path):
    task = load_task(write(tmp_path / "nul.csv", "clean,corrupted,answer,wrong\na,b,c,d\0\n"))
    assert task.pairs[0].wrongs == ("d\0",)


# ---------------------------------------------------------------------------------------------- valid variants
def test_crlf_and_a_byte_order_mark_read_the_same_pairs(tmp_path):
    plain = load_task(write(tmp_path / "plain.csv", CSV)).pairs
    assert plain[1].clean == "e, f" and plain[1].answers == (" z",)
    assert load_task(write(tmp_path / "crlf.csv", CSV.replace("\n", "\r\n"))).pairs == plain
    assert load_task(write(tmp_path / "bom.csv", b"\xef\xbb\xbf" + CSV.encode())).pairs == plain
    assert load_task(write(tmp_path / "both.csv", b"\xef\xbb\xbf" + CSV.replace("\n", "\r\n").encode())).pairs == plain

    lines = load_task(write(tmp_path / "plain.jsonl", jsonl(ROWS))).pairs
    assert lines[1].clean == (1, 2, 3) and lines[1].answers == (2, 5)
    assert load_task(write(tmp_path / "crlf.jsonl", jsonl(ROWS).replace("\n", "\r\n"))).pairs == lines
    assert load_task(write(tmp_path / "bom.jsonl", b"\xef\xbb\xbf" + jsonl(ROWS).encode())).pairs == lines
    auto = {"prompts": [{"clean": r["clean"], "corrupt": r["corrupted"], "answers": r["answer"],
                         "wrong_answers": r["wrong"]} for r in ROWS]}
    assert load_task(write(tmp_path / "bom.json", b"\xef\xbb\xbf" + json.dumps(auto).encode())).pairs == lines


def test_a_line_separator_inside_a_json_string_stays_in_the_string(tmp_path):
    """JSON allows U+2028, U+2029 and U+0085 raw inside strings; JSON Lines splits at "\\n" only."""
    rows = [{"clean": "one\u2028two\x85three\u2029", "corrupted": "one\u2028tw0\x85three\u2029", "answer": " x",
             "wrong": " y"}, ROWS[1]]
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    task = load_task(write(tmp_path / "sep.jsonl", text))
    assert task.n_pairs == 2 and task.pairs[0].clean == rows[0]["clean"]


def test_blank_lines_and_a_missing_final_newline_are_fine(tmp_path):
    text = "\n\n" + jsonl(ROWS).replace("\n", "\n   \n").rstrip("\n ")
    assert load_task(write(tmp_path / "gaps.jsonl", text)).pairs == load_task(
        write(tmp_path / "plain.jsonl", jsonl(ROWS))).pairs
