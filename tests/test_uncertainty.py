"""The bootstrap intervals: coverage on a toy with a known mean, determinism, 1/sqrt(n) narrowing, bad input."""

from __future__ import annotations

import math

import pytest
import torch

from circuitkit import CircuitkitError
from circuitkit.uncertainty import bootstrap_ci, ratio_of_means, resample_counts

TRUE_MEAN, TRUE_SD = 1.5, 2.0
REPEATS = 400
COVERAGE_RANGE = (372, 388)
"""93-97% of 400 repeats: the issue's bound (a correct 95% interval lands here with probability ~0.94)."""


def _sample(n: int, seed: int) -> torch.Tensor:
    return TRUE_MEAN + TRUE_SD * torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_coverage_of_the_true_mean_on_a_normal_toy():
    covered = 0
    for repeat in range(REPEATS):
        lo, hi = bootstrap_ci(_sample(100, 10_000 + repeat), n_resamples=1000, seed=repeat)
        covered += bool(lo <= TRUE_MEAN <= hi)
    assert COVERAGE_RANGE[0] <= covered <= COVERAGE_RANGE[1], covered


def test_interval_contains_the_estimate_and_is_deterministic_for_a_seed():
    values = _sample(50, 1)
    first = bootstrap_ci(values, seed=7)
    again = bootstrap_ci(values.clone(), seed=7)
    other = bootstrap_ci(values, seed=8)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not torch.equal(first[0], other[0])
    assert first[0] < values.mean() < first[1]


def test_width_shrinks_as_one_over_sqrt_n():
    small = bootstrap_ci(_sample(100, 2))
    large = bootstrap_ci(_sample(400, 3))
    ratio = float((large[1] - large[0]) / (small[1] - small[0]))
    assert 0.4 <= ratio <= 0.6, ratio
    # and the width is the normal theory's 2 * 1.96 sd / sqrt(n) within 15%
    expected = 2 * 1.96 * TRUE_SD / math.sqrt(400)
    assert abs(float(large[1] - large[0]) - expected) < 0.15 * expected


def test_every_column_is_resampled_with_the_same_draw():
    values = _sample(30, 4)
    lo, hi = bootstrap_ci(torch.stack([values, 2 * values + 1], dim=1))
    alone = bootstrap_ci(values)
    assert lo.shape == (2,)
    assert torch.allclose(lo[0], alone[0]) and torch.allclose(hi[0], alone[1])
    assert torch.allclose(lo[1], 2 * alone[0] + 1) and torch.allclose(hi[1], 2 * alone[1] + 1)


def test_statistic_of_means_against_a_loop_over_resamples():
    """The ratio of means through the counts matmul agrees with resampling the sequences one by one."""
    num = _sample(20, 5).abs()
    den = 1 + _sample(20, 6).abs()
    lo, hi = bootstrap_ci(torch.stack([num, den], dim=1), n_resamples=200, seed=3, statistic=ratio_of_means)
    counts = resample_counts(20, 200, 3)
    figures = []
    for row in counts:
        index = torch.repeat_interleave(torch.arange(20), row.long())
        figures.append(float(num[index].sum() / den[index].sum()))
    reference = torch.quantile(torch.tensor(figures, dtype=torch.float64), torch.tensor([0.025, 0.975],
                                                                                        dtype=torch.float64))
    assert torch.allclose(torch.stack([lo, hi]), reference, rtol=1e-10)
    assert torch.equal(counts.sum(dim=1), torch.full((200,), 20.0, dtype=torch.float64))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"values": [1.0]}, "n >= 2"),
        ({"values": torch.tensor(1.0)}, "n >= 2"),
        ({"values": [1.0, float("nan")]}, "finite"),
        ({"values": [1, 2]}, "floating"),
        ({"values": "abc"}, "torch.Tensor"),
        ({"values": [1.0, 2.0], "level": 1.0}, "level"),
        ({"values": [1.0, 2.0], "level": 0.0}, "level"),
        ({"values": [1.0, 2.0], "n_resamples": 1}, "n_resamples"),
        ({"values": [1.0, 2.0], "seed": -1}, "seed"),
        ({"values": [1.0, 2.0], "statistic": 3}, "statistic"),
        ({"values": [1.0, 2.0], "statistic": lambda m: m.sum()}, "statistic"),
        ({"values": [[1.0, 0.0], [2.0, 0.0]], "statistic": ratio_of_means}, "undefined"),
    ],
    ids=["one-value", "scalar", "nan", "integers", "string", "level-1", "level-0", "one-resample",
         "negative-seed", "statistic-not-callable", "statistic-wrong-shape", "zero-denominator"],
)
def test_bad_input_is_refused(kwargs, message):
    with pytest.raises(CircuitkitError, match=message):
        bootstrap_ci(**kwargs)
