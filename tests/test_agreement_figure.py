"""The agreement figure says what it covers: its bootstrap interval over the sequences equals a plain loop over the
shared resample draw (ties included), none below 10 heads, and the answer names the heads it is taken over, with
the interval, or says they are too few to judge; the interval survives saving and loading."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from circuitkit.detect.agreement import (
    MIN_HEADS_TO_JUDGE,
    agreement,
    agreement_interval,
    selection_text,
    spearman,
)
from circuitkit.detect.effects import HeadEffects
from circuitkit.report.summary import answer_lines, story_html
from circuitkit.uncertainty import resample_counts
from tests.report_fixtures import synthetic_scan


def effects_pair(n_exact: int, batch: int = 12, *, ties: bool = False, seed: int = 0):
    """An attribution and an ablation of a 3 x 5 model with per-sequence values; the first ``n_exact`` heads (in
    layer-major order) ablated exactly. ``ties``: two heads' estimates are zero in every sequence."""
    g = torch.Generator().manual_seed(seed)
    exact_each = torch.randn(batch, 3, 5, generator=g, dtype=torch.float64) + torch.linspace(0, 2, 15).view(1, 3, 5)
    estimate_each = exact_each + 0.8 * torch.randn(batch, 3, 5, generator=g, dtype=torch.float64)
    if ties:
        estimate_each[:, 0, :2] = 0.0
    mask = torch.zeros(15, dtype=torch.bool)
    mask[:n_exact] = True
    mask = mask.view(3, 5)
    exact_each = torch.where(mask, exact_each, torch.tensor(float("nan"), dtype=torch.float64))
    attribution = HeadEffects("attribution", "mean", 1.0, estimate_each.mean(0).float(),
                              per_sequence=estimate_each.float())
    ablation = HeadEffects("ablation", "mean", 1.0, exact_each.mean(0).float(), exact=mask,
                           per_sequence=exact_each.float())
    return attribution, ablation


def loop_interval(attribution, ablation, n_resamples=1000, level=0.95, seed=0):
    """The interval written as a loop: each resample's means over the drawn sequences, Spearman by the module's
    average-rank function, the two quantiles."""
    mask = ablation.exact
    est, ex = attribution.per_sequence[:, mask].double(), ablation.per_sequence[:, mask].double()
    batch = est.shape[0]
    rhos = []
    for row in resample_counts(batch, n_resamples, seed):
        rhos.append(spearman(row @ est / batch, row @ ex / batch))
    q = torch.quantile(torch.tensor(rhos, dtype=torch.float64), torch.tensor([(1 - level) / 2, (1 + level) / 2],
                                                                             dtype=torch.float64))
    return float(q[0]), float(q[1])


@pytest.mark.parametrize("ties", [False, True])
def test_interval_equals_the_loop(ties):
    attribution, ablation = effects_pair(12, ties=ties)
    got = agreement_interval(attribution, ablation)
    want = loop_interval(attribution, ablation)
    assert got == pytest.approx(want, abs=1e-12)
    rho = agreement(attribution, ablation).spearman
    assert got[0] < rho < got[1] and got[1] - got[0] > 0.05  # a real spread around the figure


def test_interval_level_and_resamples_are_the_callers():
    attribution, ablation = effects_pair(15)
    narrow = agreement_interval(attribution, ablation, n_resamples=500, level=0.5, seed=3)
    assert narrow == pytest.approx(loop_interval(attribution, ablation, 500, 0.5, 3), abs=1e-12)
    wide = agreement_interval(attribution, ablation, n_resamples=500, level=0.99, seed=3)
    assert wide[0] < narrow[0] and narrow[1] < wide[1]


def test_no_interval_where_it_cannot_be_judged_or_made():
    attribution, ablation = effects_pair(MIN_HEADS_TO_JUDGE - 1)
    assert agreement_interval(attribution, ablation) is None
    attribution, ablation = effects_pair(12, batch=1)
    assert agreement_interval(attribution, ablation) is None
    attribution, ablation = effects_pair(12)
    assert agreement_interval(dataclasses.replace(attribution, per_sequence=None), ablation) is None
    assert agreement_interval(attribution, dataclasses.replace(ablation, per_sequence=None)) is None


def _estimates_line(scan):
    return next(line for line in answer_lines(scan) if line.startswith("Estimates:"))


def test_answer_names_the_heads_and_too_few_to_judge():
    scan = synthetic_scan(verified=True, ablate_top=6)  # 6 heads ablated exactly
    line = _estimates_line(scan)
    assert "Spearman 0.93 over 6 heads (the top 6 by |estimate| plus a called head per role): too few heads to " \
           "judge (fewer than 10)" in line
    assert "too few heads to judge" in story_html(scan)


def test_answer_gives_the_interval_over_enough_heads_and_it_round_trips(tmp_path):
    scan = synthetic_scan(3, 4, verified=True, ablate_top=12)  # every one of the 12 heads
    scan = dataclasses.replace(scan, settings=dataclasses.replace(scan.settings, ablate="all"),
                               intervals={"agreement": (0.71, 0.97)})
    line = _estimates_line(scan)
    assert "Spearman 0.93 [0.71, 0.97] over 12 heads (every head)" in line
    assert "too few" not in line
    assert "[0.71, 0.97] over 12 heads (every head)" in story_html(scan)
    scan.save(tmp_path)
    loaded = type(scan).load(tmp_path)
    assert loaded.intervals["agreement"] == pytest.approx((0.71, 0.97))
    assert _estimates_line(loaded) == line


def test_selection_text():
    assert selection_text("all", 8) == "every head"
    assert selection_text("top", 8) == "the top 8 by |estimate| plus a called head per role"
