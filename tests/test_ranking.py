"""The one top-k: highest first (or lowest, or by absolute value), ties in flat order, NaN last, against a plain
Python sort that states the rule."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from circuitkit.ranking import top_indices

VALUES = st.lists(st.sampled_from([-2.0, -1.0, 0.0, 1.0, 2.0, math.nan, math.inf, -math.inf, 1e308, -1e308]),
                  min_size=1, max_size=40)


def rule(values: list[float], k: int, absolute: bool, largest: bool) -> list[int]:
    def key(i: int) -> tuple[bool, float, int]:
        v = values[i]
        if math.isnan(v):
            return True, 0.0, i
        v = abs(v) if absolute else v
        return False, -v if largest else v, i

    return sorted(range(len(values)), key=key)[:k]


@settings(max_examples=300, deadline=None)
@given(VALUES, st.integers(1, 45), st.booleans(), st.booleans())
def test_top_indices_follow_the_rule(values, k, absolute, largest):
    got = top_indices(torch.tensor(values, dtype=torch.float64), k, absolute=absolute, largest=largest)
    assert [i for i, _ in got] == rule(values, k, absolute, largest)
    assert all(v == values[i] or (math.isnan(v) and math.isnan(values[i])) for i, v in got)
