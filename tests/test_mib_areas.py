"""CPR and CMD as MIB computes them (``MIB_circuit_track/evaluation.py``, ``evaluate_area_under_curve``): sizes
``int(x * edges)`` at its ten fractions, the trapezoid rule over the nominal fractions with no point at 0, CPR from
the signed ranking's curve and CMD from the absolute one's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from circuitkit import CircuitkitError
from circuitkit.tasks.circuit import area_from_1, area_under, edge_circuit, mib_areas, mib_sizes

X = (.001, .002, .005, .01, .02, .05, .1, .2, .5, 1)  # MIB's percentages, written out again


def _mib(f, from_1):
    """MIB's loop, densely: sum over neighbours of (x2 - x1) * (g1 + g2) / 2, g = |1 - f| or f."""
    g = [abs(1.0 - v) for v in f] if from_1 else list(f)
    return sum((X[i + 1] - X[i]) * (g[i] + g[i + 1]) / 2 for i in range(len(X) - 1))


CURVES = {
    "rising": [0.0, 0.05, 0.2, 0.4, 0.6, 0.75, 0.9, 0.97, 1.0, 1.0],
    "overshoot": [0.3, 0.9, 1.6, 2.4, 2.9, 3.3, 3.5, 3.6, 3.0, 1.0],  # the top edges push past the clean run
    "negative": [-0.4, -0.2, 0.1, 0.5, 0.8, 1.1, 1.2, 1.05, 1.0, 1.0],
}


@pytest.mark.parametrize("name", list(CURVES))
def test_areas_equal_mibs_formula_and_numpys_trapezoid(name):
    f = CURVES[name]
    assert area_under(f) == pytest.approx(_mib(f, False), abs=1e-12)
    assert area_from_1(f) == pytest.approx(_mib(f, True), abs=1e-12)
    assert area_under(f) == pytest.approx(float(np.trapezoid(f, X)), abs=1e-12)
    assert area_from_1(f) == pytest.approx(float(np.trapezoid(np.abs(1 - np.array(f)), X)), abs=1e-12)


def test_cpr_can_exceed_one_and_takes_the_signed_curve_cmd_the_absolute():
    signed, absolute = CURVES["overshoot"], CURVES["rising"]
    areas = mib_areas({"signed": signed, "abs": absolute}, mib_sizes(79_813))
    assert areas["cpr"] == pytest.approx(_mib(signed, False)) and areas["cpr"] > 1.0  # 2.99...
    assert areas["cmd"] == pytest.approx(_mib(absolute, True))
    assert areas["signed"]["area_from_1"] == pytest.approx(_mib(signed, True))
    assert areas["abs"]["area_under"] == pytest.approx(_mib(absolute, False))
    # no point at (0, 0): the first trapezoid starts at x = 0.001 with the first value
    assert area_under([1.0] * 10) == pytest.approx(0.999) and area_from_1([1.0] * 10) == 0.0


def test_sizes_are_truncated_not_rounded():
    assert mib_sizes(79_813) == [79, 159, 399, 798, 1596, 3990, 7981, 15962, 39906, 79813]
    assert mib_sizes(250) == [0, 0, 1, 2, 5, 12, 25, 50, 125, 250]  # 0 edges: the corrupted run, faithfulness 0


@pytest.mark.parametrize("bad", [[0.5] * 9, [0.5] * 9 + [float("nan")]])
def test_a_curve_of_the_wrong_length_or_not_finite_is_refused(bad):
    with pytest.raises(CircuitkitError, match="expected 10 finite ones"):
        area_under(bad)


def test_edge_circuit_areas_are_the_two_rankings_measured_by_hand():
    """On a tiny model: each ranking's curve is the faithfulness of the top ``int(x E)`` edges by signed or
    absolute EAP-IG score, measured here with masks built from the scores; CPR and CMD are their areas."""
    from circuitkit.graph.runner import TaskRunner
    from circuitkit.models.adapters import adapt
    from circuitkit.tasks import Task
    from tests.conftest import boot_bridge
    from tests.test_tasks import toy_pairs

    model = boot_bridge(attn_only=False, n_layers=3, d_vocab=50, seed=3)
    adapter = adapt(model)
    runner = TaskRunner(adapter, Task.from_pairs(toy_pairs(), name="toy").tokenize(adapter), "logit_diff",
                        mlps=True, ablation="corrupted")
    scores, _ = runner.edge_gradients(2)
    index = runner.graph.allowed.nonzero()
    flat = scores[index[:, 0], index[:, 1]]
    E = index.shape[0]
    clean, corrupted = float(runner.clean["metric"].mean()), float(runner.corrupted["metric"].mean())
    curves = {}
    for rank, key in (("signed", flat), ("abs", flat.abs())):
        ranked = torch.argsort(-key)
        faith = []
        for x in X:
            mask = torch.zeros_like(runner.graph.allowed)
            top = index[ranked[:int(x * E)]]
            mask[top[:, 0], top[:, 1]] = True
            faith.append((float(runner.edge_metric(mask[None])[0]) - corrupted) / (clean - corrupted))
        curves[rank] = faith
    assert max(abs(a - b) for a, b in zip(curves["signed"], curves["abs"], strict=True)) > 1e-3  # they differ
    for rank in ("abs", "signed"):  # whichever ranking sizes the circuit
        *_, cpr, cmd, _, n_edges, areas = edge_circuit(runner, scores, 0.8, rank)
        assert n_edges == E and areas["sizes"] == [int(x * E) for x in X]
        for which in ("signed", "abs"):
            np.testing.assert_allclose(areas[which]["faithfulness"], curves[which], atol=1e-4)
        assert cpr == pytest.approx(_mib(curves["signed"], False), abs=1e-4)
        assert cmd == pytest.approx(_mib(curves["abs"], True), abs=1e-4)


def test_a_saved_scan_carries_both_curves_and_the_check_refuses_a_cpr_that_is_not_the_circuits():
    import copy
    import json

    from circuitkit.handbuilt.induction import induction_circuit
    from circuitkit.tasks import scan_task
    from circuitkit.tasks.scores_check import check_task_scores
    from tests.test_tasks import copy_next_task

    result = scan_task(induction_circuit(10, 16).model, copy_next_task(), target=0.9, n_resamples=20)
    data = json.loads(json.dumps(result.to_json()))
    areas = data["circuit"]["cpr_cmd"]
    assert areas["sizes"] == mib_sizes(data["circuit"]["edges_total"])
    assert areas["cpr"] == pytest.approx(_mib(areas["signed"]["faithfulness"], False))
    assert areas["cmd"] == pytest.approx(_mib(areas["abs"]["faithfulness"], True))
    check_task_scores(data, "scores.json")
    bad = copy.deepcopy(data)
    bad["circuit"]["cpr_cmd"]["cpr"] += 0.1
    with pytest.raises(CircuitkitError, match="circuit.cpr_cmd.cpr"):
        check_task_scores(bad, "scores.json")
    bad = copy.deepcopy(data)
    bad["circuit"]["cpr_cmd"]["abs"]["faithfulness"] = [0.5] * 9
    with pytest.raises(CircuitkitError, match="circuit.cpr_cmd.abs.faithfulness"):
        check_task_scores(bad, "scores.json")


def test_edge_intervals_resample_the_pairs_behind_each_figure():
    """The edge circuit's faithfulness, CPR and CMD intervals: every pair's metric at each of MIB's sizes comes from
    the curve's own passes (its mean is the curve's point), and on each resample of the pairs (the same draw,
    :func:`circuitkit.uncertainty.resample_counts`) the figures recomputed from that resample's means with the scalar
    formulas (:func:`area_under`, :func:`area_from_1`, the faithfulness ratio) give the same percentile interval."""
    from circuitkit.graph.runner import TaskRunner
    from circuitkit.models.adapters import adapt
    from circuitkit.tasks import Task
    from circuitkit.tasks.circuit import edge_intervals
    from circuitkit.uncertainty import resample_counts
    from tests.conftest import boot_bridge
    from tests.test_tasks import toy_pairs

    model = boot_bridge(attn_only=False, n_layers=3, d_vocab=50, seed=3)
    adapter = adapt(model)
    runner = TaskRunner(adapter, Task.from_pairs(toy_pairs(12), name="toy").tokenize(adapter), "logit_diff",
                        mlps=True, ablation="corrupted")
    scores, _ = runner.edge_gradients(2)
    pairs: dict = {}
    names, faith, curve, cpr, cmd, _, E, areas = edge_circuit(runner, scores, 0.8, "abs", pairs=pairs)
    clean, corrupted = runner.clean["metric"], runner.corrupted["metric"]
    n = clean.shape[0]
    assert pairs["circuit"].shape == (n,) and pairs["signed"].shape == pairs["abs"].shape == (len(X), n)
    m_clean, m_corr = float(clean.mean()), float(corrupted.mean())
    for rank in ("signed", "abs"):  # each row's mean is the point the areas were computed from
        f = [(float(row.mean()) - m_corr) / (m_clean - m_corr) for row in pairs[rank]]
        np.testing.assert_allclose(f, areas[rank]["faithfulness"], atol=1e-5)
    assert (float(pairs["circuit"].mean()) - m_corr) / (m_clean - m_corr) == pytest.approx(faith, abs=1e-5)

    R, level = 300, 0.9
    got = edge_intervals(pairs, clean, corrupted, R, level)
    counts = resample_counts(n, R, 0)
    figures = []
    for weights in counts:
        def mean(row, weights=weights):
            return float((weights * row.double()).sum() / n)

        mc, mk = mean(clean), mean(corrupted)
        ratio = [(mean(row) - mk) / (mc - mk) for row in pairs["signed"]]
        absolute = [(mean(row) - mk) / (mc - mk) for row in pairs["abs"]]
        figures.append([(mean(pairs["circuit"]) - mk) / (mc - mk), area_under(ratio), area_from_1(absolute)])
    lo, hi = np.quantile(np.array(figures), [(1 - level) / 2, (1 + level) / 2], axis=0)
    for i, key in enumerate(("edge_faithfulness", "cpr", "cmd")):
        assert got[key] == pytest.approx((lo[i], hi[i]), rel=1e-9, abs=1e-9), key
        assert got[key][0] < got[key][1]
    assert set(edge_intervals(pairs, clean, corrupted, R, level, circuit=False)) == {"cpr", "cmd"}
    assert edge_intervals({k: v[..., :1] for k, v in pairs.items()}, clean[:1], corrupted[:1], R, level) == {}
