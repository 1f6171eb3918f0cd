"""The scan's dependence on the CPU thread count, as the README states it: the bundled model's scores.json is
byte-identical with 1 and 2 threads (on larger models a few attribution / edge values may move by <= 2e-10)."""

from __future__ import annotations

from pathlib import Path

import torch

import circuitkit as ck
from circuitkit.report.saving import scores_text


def _scores(threads: int) -> str:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return scores_text(ck.scan())
    finally:
        torch.set_num_threads(before)


def test_bundled_scan_is_identical_with_one_and_two_threads():
    assert _scores(1) == _scores(2)


def test_readme_states_the_thread_count_bound():
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    assert "OMP_NUM_THREADS" in readme and "2e-10" in readme
