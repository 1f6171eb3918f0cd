"""Every public argument that takes an iterable of heads (edges, roles, checkpoints) reads it with a bound: at most
``L x H`` heads (every edge once, MAX_ROLES, MAX_CHECKPOINTS), so an endless iterator is refused in one line that
names the bound instead of being read forever."""

from __future__ import annotations

import contextlib
import itertools
import signal

import pytest

import circuitkit as ck
from circuitkit import zoo
from circuitkit.circuits import path_patching
from circuitkit.errors import CircuitkitError
from circuitkit.viz import composition_graph, model_patterns

CALL_LIMIT_S = 5
"""A refused endless input returns at once; a call still running after this long is reading it forever (the
iterators are Python generators, so the alarm interrupts even a ``list(...)`` of them)."""


class _Hung(Exception):
    pass


@contextlib.contextmanager
def _limit(seconds: int):
    def alarm(signum, frame):
        raise _Hung

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="module")
def model():
    return zoo.load()


def _endless():
    return {
        "count": lambda: ((i % 2, i % 4) for i in itertools.count()),
        "cycle": lambda: (head for head in itertools.cycle([(0, 0)])),
    }


CALLS = {
    "faithfulness-heads": lambda m, it: ck.faithfulness(m, heads=it),
    "ablation_effects-heads": lambda m, it: ck.ablation_effects(m, heads=it),
    "find_circuit-ranking": lambda m, it: ck.find_circuit(m, ranking=it),
    "model_patterns-heads": lambda m, it: model_patterns(m, zoo_tokens(), heads=it),
    "path_patching-edges": lambda m, it: path_patching(m, (((0, 0), (1, 0)) for _ in it)),
    "scan-roles": lambda m, it: ck.scan(m, roles=(("r", "induction") for _ in it)),
    "track-checkpoints": lambda m, it: ck.track((m for _ in it), steps=None),
    "composition_graph-edges": lambda m, it: composition_graph({"K": (e for e in it)}),
}


def zoo_tokens():
    import torch

    return torch.arange(1, 9)


@pytest.mark.parametrize("kind", ["count", "cycle"])
@pytest.mark.parametrize("call", list(CALLS))
def test_endless_iterator_is_refused_with_its_bound(model, call, kind):
    with _limit(CALL_LIMIT_S), pytest.raises(CircuitkitError) as caught:
        CALLS[call](model, _endless()[kind]())
    message = str(caught.value)
    assert "\n" not in message
    assert "more than" in message and "at most" in message


@pytest.mark.parametrize("name", ["faithfulness", "ablation_effects"])
def test_heads_bound_is_said_in_heads(model, name):
    with pytest.raises(CircuitkitError, match=r"at most 8 entries \(L x H = 2 x 4 heads\)"):
        getattr(ck, name)(model, heads=itertools.cycle([(0, 0)]))


def test_a_finite_generator_of_heads_is_read(model):
    from_list = ck.faithfulness(model, heads=[(0, 1), (1, 3)])
    from_generator = ck.faithfulness(model, heads=(h for h in [(0, 1), (1, 3)]))
    assert from_list == pytest.approx(from_generator)


def test_an_iterator_that_raises_is_one_line(model):
    def broken():
        yield (0, 0)
        raise RuntimeError("disk gone\nsecond line")

    with pytest.raises(CircuitkitError, match=r"faithfulness: heads: given an iterable that raised RuntimeError"):
        ck.faithfulness(model, heads=broken())
