"""A task prompt or answer holding a lone surrogate (a JSON ``"\\ud800"`` escape without its pair) is refused on
read with one line naming the file, the line (row, prompt) and the field; before, the tokenizer raised a TypeError
traceback at scan time. A surrogate *pair* is a character and is read."""

from __future__ import annotations

import json

import pytest

from circuitkit import CircuitkitError
from circuitkit.tasks import Task
from circuitkit.tasks.files import load_task

PAIR = {"clean": "When Mary and John went", "corrupted": "When Mary and Anne went", "answer": " Mary",
        "wrong": " John"}


@pytest.mark.parametrize("field", ["clean", "corrupted", "answer", "wrong"])
def test_jsonl_lone_surrogate_is_one_line(tmp_path, field):
    bad = dict(PAIR, **{field: PAIR[field] + "\ud800"})
    if field == "answer":
        bad[field] = [" Mary", " Ma\udfffry"]
    path = tmp_path / "task.jsonl"
    path.write_text(json.dumps(PAIR) + "\n" + json.dumps(bad) + "\n", encoding="utf-8")  # ASCII: \ud800 escapes
    with pytest.raises(CircuitkitError) as caught:
        load_task(path)
    message = str(caught.value)
    assert "\n" not in message and str(path) in message and f"line 2: {field}" in message
    assert "lone surrogate U+D" in message


def test_auto_circuit_json_lone_surrogate_is_one_line(tmp_path):
    path = tmp_path / "task.json"
    prompt = {"clean": PAIR["clean"], "corrupt": "\udc00" + PAIR["corrupted"], "answers": [" Mary"],
              "wrong_answers": [" John"]}
    path.write_text(json.dumps({"prompts": [prompt]}), encoding="utf-8")
    with pytest.raises(CircuitkitError, match=r"prompt 1: corrupted: given text holding the lone surrogate U\+DC00"):
        load_task(path)


def test_csv_cannot_hold_a_surrogate(tmp_path):
    """CSV has no escapes: a surrogate could only be the bytes of one (CESU-8), which strict UTF-8 refuses."""
    path = tmp_path / "task.csv"
    path.write_bytes(b"clean,corrupted,answer,wrong\nWhen Mary\xed\xa0\x80,When Anne, Mary, John\n")
    with pytest.raises(CircuitkitError, match="is not UTF-8 text"):
        load_task(path)


def test_api_pairs_are_checked_the_same_way():
    with pytest.raises(CircuitkitError, match="lone surrogate U\\+D800"):
        Task.from_pairs([(PAIR["clean"] + "\ud800", PAIR["corrupted"], " Mary", " John")], name="t")


def test_a_surrogate_pair_is_a_character(tmp_path):
    path = tmp_path / "task.jsonl"
    good = dict(PAIR, clean=PAIR["clean"] + " \U0001f600", corrupted=PAIR["corrupted"] + " \U0001f600")
    path.write_text(json.dumps(good) + "\n", encoding="utf-8")  # written as the escape pair \ud83d\ude00
    assert "\\ud83d\\ude00" in path.read_text(encoding="utf-8")
    assert load_task(path).pairs[0].clean.endswith("\U0001f600")
