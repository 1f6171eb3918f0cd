"""The floating-point state is left as found: the training loop flushes subnormal floats to zero while it runs (CPU
steps are many times slower on them) and restores the flag it found, also on an error. Left set, it made a later
hypothesis test fail with "can't represent subnormal floats" (and any subnormal result 0). conftest.py checks
around every test that none changes the state."""

from __future__ import annotations

import sys

import pytest
import torch

from circuitkit.zoo import train


def _flushing() -> bool:
    return sys.float_info.min / 2 == 0.0  # half the smallest normal float64: subnormal, or 0 when flushed


def _tiny_model():
    torch.manual_seed(0)
    embed = torch.nn.Embedding(train.D_VOCAB, 8)
    unembed = torch.nn.Linear(8, train.D_VOCAB)
    return (lambda tokens: unembed(embed(tokens))), [*embed.parameters(), *unembed.parameters()]


@pytest.mark.parametrize("found", [False, True], ids=["normal", "already-flushing"])
def test_train_loop_leaves_the_flush_flag_as_found(found):
    torch.set_flush_denormal(found)
    try:
        assert _flushing() is found
        forward, parameters = _tiny_model()
        seen = []
        train.train_loop(forward, parameters, steps=2, lr=1e-3, seed=0, log=lambda _: seen.append(_flushing()))
        assert seen and all(seen)  # flushed while training
        assert _flushing() is found
    finally:
        torch.set_flush_denormal(False)


def test_the_flag_is_restored_on_an_error():
    assert not _flushing()

    def failing(tokens):
        raise RuntimeError("a forward that fails")

    with pytest.raises(RuntimeError, match="a forward that fails"):
        train.train_loop(failing, [torch.nn.Parameter(torch.zeros(1))], steps=1, lr=1e-3, seed=0, log=lambda _: None)
    assert not _flushing()
    assert train.flushes_denormals() is False and sys.float_info.min / 2 > 0.0
