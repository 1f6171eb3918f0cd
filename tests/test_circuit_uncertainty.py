"""The circuit against random head sets of its size, and the circuit's stability over resampled batches, on the
bundled model (documented heads) with independent recomputations through the public functions."""

from __future__ import annotations

import pytest
import torch

import circuitkit as ck
from circuitkit import CircuitkitError, RepeatedTokens, zoo
from circuitkit.circuits.baseline import random_sets
from circuitkit.circuits.stability import jaccard, mean_pairwise_jaccard, resampled_batch
from circuitkit.detect.tokens import as_batch
from circuitkit.models.adapters import adapt
from circuitkit.uncertainty import resample_counts

N_SETS = 20
N_STABILITY = 20
FAR_ABOVE = 0.3
"""The circuit's faithfulness exceeds the top of the random sets' mean interval by this much (measured: 0.87 vs
0.36-0.38 uniform, 0.40-0.43 with the circuit's per-layer counts)."""


@pytest.fixture(scope="module")
def model():
    return zoo.load()


@pytest.fixture(scope="module")
def circuit(model):
    return ck.find_circuit(model, RepeatedTokens(), random_sets=N_SETS, stability=N_STABILITY)


def test_the_circuit_is_far_above_random_sets_of_its_size(circuit):
    baseline = circuit.random_baseline
    assert baseline.size == len(circuit.heads) and baseline.n_sets == N_SETS and baseline.passes == 2 * N_SETS
    low = circuit.intervals["faithfulness"][0]
    for kind in (baseline.uniform, baseline.layered):
        assert len(kind.faithfulness) == N_SETS
        assert kind.mean == pytest.approx(sum(kind.faithfulness) / N_SETS)
        assert kind.interval[0] <= kind.mean <= kind.interval[1]
        assert kind.spread[0] <= kind.mean <= kind.spread[1]
        assert circuit.faithfulness - kind.interval[1] > FAR_ABOVE, kind
        assert low > kind.interval[1]


def test_each_random_set_faithfulness_equals_faithfulness_measured_alone(circuit, model):
    masks = random_sets(circuit.heads, 2, 4, N_SETS, 0, "uniform")
    for s in (0, 1):
        heads = [tuple(h) for h in masks[s].nonzero().tolist()]
        alone = ck.faithfulness(model, heads, RepeatedTokens(), method="mean")
        assert circuit.random_baseline.uniform.faithfulness[s] == pytest.approx(alone, rel=1e-5, abs=1e-6)


def test_random_sets_have_the_size_and_layer_counts_asked_for():
    heads = ((0, 1), (0, 0), (1, 3), (1, 1), (2, 0))
    uniform = random_sets(heads, 3, 4, 50, 7, "uniform")
    layered = random_sets(heads, 3, 4, 50, 7, "layered")
    assert bool((uniform.sum(dim=(1, 2)) == 5).all())
    assert bool((layered.sum(dim=2) == torch.tensor([2, 2, 1])).all())
    assert len({tuple(m.flatten().tolist()) for m in uniform}) > 20  # the draws differ
    assert torch.equal(uniform, random_sets(heads, 3, 4, 50, 7, "uniform"))


def test_the_documented_heads_are_in_nearly_every_resampled_circuit(circuit):
    stability = circuit.stability
    documented = set(zoo.info().induction_heads) | set(zoo.info().previous_token_heads)
    assert set(circuit.heads) <= documented
    for head in circuit.heads:
        assert stability.frequency(head) >= 0.95, (head, stability)
    assert stability.jaccard >= 0.8 and stability.stable
    # inclusion and Jaccard recounted from the resampled circuits themselves
    counted = torch.zeros(2, 4)
    for heads in stability.circuits:
        for a, b in heads:
            counted[a, b] += 1
    assert torch.allclose(stability.inclusion, counted / N_STABILITY)
    record = stability.to_json()
    assert record["inclusion"] == {f"{a}.{b}": f for (a, b), f in stability.ranked()}


def test_a_resampled_circuit_is_find_circuit_on_the_resampled_batch(circuit, model):
    batch = as_batch(RepeatedTokens(), adapt(model))
    counts = resample_counts(batch.batch, N_STABILITY, 0)
    alone = ck.find_circuit(model, resampled_batch(batch, counts[3]))
    assert tuple(alone.heads) == circuit.stability.circuits[3]
    assert alone.faithfulness == pytest.approx(circuit.stability.faithfulness[3], rel=1e-6)


def test_jaccard():
    assert jaccard({(0, 0), (1, 1)}, {(1, 1), (1, 2)}) == pytest.approx(1 / 3)
    assert jaccard(set(), set()) == 1.0
    assert mean_pairwise_jaccard([((0, 0),), ((0, 0),), ((1, 1),)]) == pytest.approx(1 / 3)
    assert mean_pairwise_jaccard([((0, 0),)]) is None


@pytest.mark.parametrize("kwargs", [{"random_sets": 1}, {"random_sets": -2}, {"stability": 1},
                                    {"stability": 2.0}, {"stability": True}],
                         ids=["one-set", "negative-sets", "one-resample", "float", "bool"])
def test_bad_counts_are_refused(model, kwargs):
    with pytest.raises(CircuitkitError):
        ck.find_circuit(model, RepeatedTokens(batch=2), **kwargs)


def test_scan_options_are_opt_in_planned_and_reported(model, tmp_path):
    import json

    from tests.test_report_scores import validate

    plain = ck.scan(model, tokens=RepeatedTokens(batch=8))
    assert plain.verified.random_baseline is None and plain.verified.stability is None
    assert [r.name for r in plain.stages] == ["scores", "ablate", "circuit", "weights", "edges"]
    assert sum(r.passes for r in plain.stages) <= 40  # whole passes; the default cost is unchanged by the options
    scan = ck.scan(model, tokens=RepeatedTokens(batch=8), random_sets=4, stability=3)
    stages = {r.name: r.passes for r in scan.stages}
    assert stages["stability"] == scan.verified.stability.passes > 0
    assert stages["circuit"] == pytest.approx(plain.stages[2].passes + 8)  # 2 kinds x 4 sets
    assert scan.verified.passes == plain.verified.passes
    saved = scan.save(tmp_path)
    data = json.loads(saved.scores.read_text())
    validate(data)
    assert data["circuit"]["stability"]["inclusion"] == {f"{a}.{b}": f for (a, b), f in
                                                         scan.verified.stability.ranked()}
    assert data["circuit"]["random_baseline"]["uniform"]["mean"] == pytest.approx(
        scan.verified.random_baseline.uniform.mean, rel=1e-6)
    report = saved.report.read_text()
    assert "Stability" in report and "Random sets" in report and 'class="ck-baseline"' in report
    for head, share in scan.verified.stability.ranked():
        assert f'data-head="{head[0]}.{head[1]}"' in report and f"{100 * share:.0f}%" in report


def test_stability_is_a_planned_stage_after_the_circuit():
    from circuitkit.pipeline import STAGE_NAMES, stability_estimate, stage_plan

    assert stage_plan("top", True, True, True) == ["scores", "ablate", "circuit", "stability", "weights", "edges"]
    assert "stability" not in stage_plan("top", False, False, True) and "stability" in STAGE_NAMES
    assert stability_estimate(0, 8, "mean", "joint") == 0
    assert stability_estimate(20, 8, "mean", "joint") == pytest.approx(20 * stability_estimate(1, 8, "mean", "joint"))
