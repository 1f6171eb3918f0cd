"""A user metric of the logits is the user's code: its exceptions become one line naming it, and it reads a copy of
the batch's tokens (a metric that writes into them changes no other measurement)."""

from __future__ import annotations

import pytest

from circuitkit import CircuitkitError, zoo
from circuitkit.circuits import edge_attribution, path_patching

EDGE = [((0, 1), (1, 3), "k")]


@pytest.fixture(scope="module")
def model():
    return zoo.load()


def last_logsumexp(logits, batch):
    return logits[:, -1].logsumexp(-1).mean()


def divides_by_zero(logits, batch):
    return 1 / 0


@pytest.mark.parametrize("call", [
    lambda m, metric: path_patching(m, EDGE, metric=metric),
    lambda m, metric: edge_attribution(m, metric=metric),
], ids=["path_patching", "edge_attribution"])
def test_metric_that_raises_is_one_line_naming_it(model, call):
    with pytest.raises(CircuitkitError) as caught:
        call(model, divides_by_zero)
    message = str(caught.value)
    assert "\n" not in message
    assert "metric 'divides_by_zero'" in message and "ZeroDivisionError" in message


def test_metric_writing_into_the_tokens_changes_nothing(model):
    def vandal(logits, batch):
        batch.tokens.zero_()
        return last_logsumexp(logits, batch)

    clean = path_patching(model, EDGE, metric=last_logsumexp).edges[0].effect
    again = path_patching(model, EDGE, metric=vandal).edges[0].effect
    assert abs(clean) > 1e-3  # the edge moves this metric
    assert again == clean
