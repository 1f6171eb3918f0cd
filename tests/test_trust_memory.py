"""The memory estimate before the first pass: a scan that cannot fit is refused before any work, with the estimate
and what to lower; one that fits passes. Before it, ``--batch 10000000`` ran until the kernel killed the process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import circuitkit as ck
from circuitkit import CircuitkitError
from circuitkit.memory import MARGIN, available_memory, check_memory, estimate_memory

ROOT = Path(__file__).resolve().parents[1]
CLI_TIMEOUT_S = 120
"""Imports and loading the bundled model take seconds on a loaded 2-core machine; the refusal itself is instant.
Before the check the same command ran for about a minute and was killed by the kernel."""


@pytest.fixture(scope="module")
def model():
    return ck.zoo.load()


def test_estimate_follows_its_closed_form(model):
    e = estimate_memory(model, batch=3, block_len=5, n_repeats=2, bos=True, circuit=True)
    L, H, d_model, d_head, d_vocab = 2, 4, 64, 16, 64  # the bundled model
    S = 2 * 5 + 1
    assert e.seq_len == S and e.block_len == 5 and e.batch == 3
    assert e.patterns == 4 * 6 * L * H * 3 * S * S
    assert e.logits == 4 * 3 * 3 * S * d_vocab
    assert e.edges == 4 * 4 * L * H * 3 * S * d_model
    assert e.activations == 2 * 4 * ((L + 1) * 3 * S * d_model + L * 3 * S * (6 * d_model + 4 * H * d_head))
    assert e.total == int(MARGIN * (e.activations + e.patterns + e.logits + e.edges + e.tokens))
    assert estimate_memory(model, batch=3, block_len=5, circuit=False).edges == 0


def test_estimate_grows_linearly_in_batch_and_quadratically_in_patterns(model):
    one, two = estimate_memory(model, 10, 8), estimate_memory(model, 20, 8)
    assert two.patterns == 2 * one.patterns and two.activations == 2 * one.activations
    long = estimate_memory(model, 10, 16)
    assert long.patterns > 3.5 * one.patterns  # (2*16+1)^2 / (2*8+1)^2 = 3.77


def test_huge_batch_is_refused_with_the_estimate_and_what_to_lower(model):
    with pytest.raises(CircuitkitError) as info:
        check_memory(model, 10_000_000)
    message = str(info.value)
    assert "\n" not in message and "batch 10000000" in message and "TiB" in message and "--batch" in message


def test_a_batch_that_fits_is_returned_with_its_estimate(model):
    estimate = check_memory(model, 4, 8)
    assert estimate.total < available_memory()


def test_the_suggested_batch_fits(model):
    available = estimate_memory(model, 100, 10).total
    with pytest.raises(CircuitkitError, match="to (\\d+) or less") as info:
        check_memory(model, 1000, 10, available=available)
    import re

    suggested = int(re.search("to (\\d+) or less", str(info.value)).group(1))
    assert 1 <= suggested <= 100
    check_memory(model, suggested, 10, available=available)


def test_when_one_sequence_cannot_fit_the_block_length_is_named(model):
    with pytest.raises(CircuitkitError, match="Even one sequence") as info:
        check_memory(model, 1, 20, available=1000)
    assert "--block-len" in str(info.value)


@pytest.mark.parametrize("bad", [0, -1, 2.5, "8", None, True], ids=["zero", "negative", "float", "str", "none", "bool"])
def test_bad_batch_is_one_line(model, bad):
    with pytest.raises(CircuitkitError, match="batch"):
        check_memory(model, bad)


def test_huge_sizes_do_not_overflow(model):
    e = estimate_memory(model, 2**62, 2**20)
    assert e.total > 2**100  # Python ints: no wrap-around to a small or negative number


def test_available_memory_reads_the_cpu():
    free = available_memory("cpu")
    assert free is None or free > 0


def test_cli_refuses_a_huge_batch_before_any_work(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-c", "import sys; from circuitkit.cli import main; sys.exit(main())",
                           "scan", "--batch", "10000000", "--out", str(tmp_path / "out")], capture_output=True,
                          text=True, timeout=CLI_TIMEOUT_S, env=env, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    # the progress lines that come before the model loads, then the one error line
    lines = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("scan: ")]
    assert len(lines) == 1 and "needs about" in lines[0] and "--batch" in lines[0]
    assert not (tmp_path / "out" / "report.html").exists()
