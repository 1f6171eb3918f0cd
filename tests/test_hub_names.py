"""Hub names and revisions are checked for length and form before any file-system call, and the cache's
``refs/<revision>`` files are read as data that must name a snapshot inside the cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import circuitkit as ck
from circuitkit import CircuitkitError
from circuitkit.tracking import load_checkpoint

LONG_NAME = "a" * 300
LONG_STEP = "EleutherAI/pythia-70m@step" + "1" * 4301


def _one_line(caught: pytest.ExceptionInfo) -> str:
    message = str(caught.value)
    assert "\n" not in message and len(message) < 600, message
    return message


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return tmp_path / "hub"


CALLS = {
    "load_model-300": lambda: ck.models.load_model(LONG_NAME),
    "load_model-org-300": lambda: ck.models.load_model("org/" + LONG_NAME),
    "scan-300": lambda: ck.scan(LONG_NAME),
    "track-300": lambda: ck.track(["org/" + LONG_NAME + "@step1"]),
    "track-4301-digits": lambda: ck.track([LONG_STEP]),
    "load_checkpoint-4301-digits": lambda: load_checkpoint(LONG_STEP),
    "track-step-of-30-digits": lambda: ck.track(["EleutherAI/pythia-70m@step" + "9" * 30]),
    "track-revision-newline": lambda: ck.track(["EleutherAI/pythia-70m@step1\nstep2"]),
    "track-revision-newline-steps": lambda: ck.track(["EleutherAI/pythia-70m@main\nx"], steps=[1]),
    "load_checkpoint-revision-newline": lambda: load_checkpoint("EleutherAI/pythia-70m@main\r\n"),
    "track-revision-dotdot": lambda: ck.track(["someone/tiny@../../../etc"], steps=[1]),
}


@pytest.mark.parametrize("call", list(CALLS))
def test_bad_hub_names_are_one_line(cache, call):
    with pytest.raises(CircuitkitError) as caught:
        CALLS[call]()
    _one_line(caught)


def test_long_revision_is_refused_before_the_file_system(cache, monkeypatch):
    def no_stat(*args, **kwargs):
        raise AssertionError("the file system was asked about the name")

    monkeypatch.setattr(os, "stat", no_stat)
    monkeypatch.setattr(os, "lstat", no_stat)
    with pytest.raises(CircuitkitError, match="revision of 4305 characters"):
        ck.track([LONG_STEP])


def _repo(cache: Path, repo: str = "someone/tiny") -> Path:
    root = cache / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    (root / "snapshots").mkdir()
    return root


def test_ref_that_walks_out_of_the_cache_is_refused(cache, tmp_path):
    root = _repo(cache)
    elsewhere = tmp_path / "other" / "dir"
    elsewhere.mkdir(parents=True)
    (elsewhere / "config.json").write_text("{}")
    (root / "refs" / "step1").write_text("../../../../../other/dir")
    with pytest.raises(CircuitkitError) as caught:
        ck.track(["someone/tiny@step1"])
    assert "commit hash" in _one_line(caught)


def test_snapshot_linked_outside_the_cache_is_refused(cache, tmp_path):
    root = _repo(cache)
    commit = "0" * 40
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (root / "snapshots" / commit).symlink_to(elsewhere)
    (root / "refs" / "step1").write_text(commit)
    with pytest.raises(CircuitkitError) as caught:
        ck.track(["someone/tiny@step1"])
    assert "inside" in _one_line(caught)


def test_ref_that_is_a_fifo_is_refused_not_read(cache):
    root = _repo(cache)
    os.mkfifo(root / "refs" / "main")
    with pytest.raises(CircuitkitError) as caught:
        ck.models.load_model("someone/tiny")
    assert "FIFO" in _one_line(caught)


def test_main_ref_walking_out_is_refused_for_load_model(cache, tmp_path):
    root = _repo(cache)
    (root / "refs" / "main").write_text("../../../../../etc")
    with pytest.raises(CircuitkitError) as caught:
        ck.models.load_model("someone/tiny")
    assert "commit hash" in _one_line(caught)
