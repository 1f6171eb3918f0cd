"""The scan's intervals: per-sequence values that average to the figures, checked against one-sequence and
resampled batches run through the public functions (the bootstrap's replicates, recomputed from scratch)."""

from __future__ import annotations

import pytest
import torch

import circuitkit as ck
from circuitkit import CircuitkitError, RepeatedTokens, zoo
from circuitkit.circuits.intervals import faithfulness_ratio
from circuitkit.detect.tokens import TokenBatch
from circuitkit.uncertainty import resample_counts

SUM_TOLERANCE = 1e-5
"""float32 sums over a batch in another order: relative agreement of a mean of per-sequence values and the figure."""
BATCH = 8


@pytest.fixture(scope="module")
def model():
    return zoo.load()


@pytest.fixture(scope="module")
def scan(model):
    return ck.scan(model, tokens=RepeatedTokens(batch=BATCH), ablation_method="zero", n_resamples=500)


def _sub_batch(scan, index) -> TokenBatch:
    hs = scan.head_scores
    return TokenBatch(hs.tokens[index], hs.block_len, hs.n_repeats, hs.bos)


def test_per_sequence_values_average_to_the_figures(scan):
    for effects in (scan.attribution, scan.ablation):
        assert effects.per_sequence.shape == (BATCH, *effects.effect.shape)
        measured = ~effects.effect.isnan()
        assert torch.allclose(effects.per_sequence.mean(dim=0)[measured], effects.effect[measured],
                              rtol=SUM_TOLERANCE, atol=SUM_TOLERANCE)
    for name, (attention, rows) in scan.head_scores.per_sequence.items():
        assert torch.allclose(attention.sum(dim=0) / rows.sum(), scan.head_scores[name], atol=SUM_TOLERANCE)
    clean = float(scan.induction_loss.repeated_copies)
    for edge in scan.verified.edges.edges:  # each patched edge's per-sequence losses average to its patched loss
        assert float(edge.patched_each.mean()) == pytest.approx(edge.patched, rel=SUM_TOLERANCE)
        assert edge.clean == pytest.approx(clean, rel=SUM_TOLERANCE)


def test_exact_ablation_per_sequence_equals_one_sequence_batches(scan, model):
    """Zero ablation does not depend on the batch: sequence i's value is the ablation of a batch of sequence i."""
    head = scan.ablation.top(1)[0][0]
    for i in range(3):
        alone = ck.ablation_effects(model, _sub_batch(scan, slice(i, i + 1)), method="zero", heads=[head])
        assert float(alone.effect[head]) == pytest.approx(float(scan.ablation.per_sequence[i, head[0], head[1]]),
                                                          rel=1e-4, abs=1e-5)


def test_faithfulness_replicates_equal_faithfulness_of_resampled_batches(scan, model):
    """Each bootstrap replicate of faithfulness is faithfulness measured on the resampled batch itself."""
    from circuitkit.circuits.faithfulness import Ablator, _mask, ablation_values
    from circuitkit.detect.tokens import as_batch
    from circuitkit.models.adapters import adapt

    heads = scan.verified.heads
    adapter = adapt(model)
    batch = as_batch(_sub_batch(scan, slice(None)), adapter)
    L, H = adapter.spec.n_layers, adapter.spec.n_heads
    values, _ = ablation_values(adapter, batch, "zero")
    ablator = Ablator(adapter, batch, values)
    masks = torch.stack([torch.ones(L, H, dtype=torch.bool), _mask(heads, L, H, keep=True),
                         torch.zeros(L, H, dtype=torch.bool)])
    ablator.losses(masks)
    each = torch.stack([ablator.sequence_losses(m) for m in masks], dim=1).double()  # [batch, 3]
    counts = resample_counts(BATCH, 500, 0)
    for row in counts[:3]:
        index = torch.repeat_interleave(torch.arange(BATCH), row.long())
        replicate = float(faithfulness_ratio((row @ each / BATCH)[None]))
        direct = ck.faithfulness(model, heads, _sub_batch(scan, index), method="zero")
        assert replicate == pytest.approx(direct, rel=1e-4)
    low, high = scan.verified.intervals["faithfulness"]
    assert low <= scan.verified.faithfulness <= high


def test_every_interval_holds_its_figure(scan):
    bounds = scan.intervals
    loss = scan.induction_loss
    for key in ("first_copy", "repeated_copies"):
        low, high = bounds["induction_loss"][key]
        assert low <= getattr(loss, key) <= high
    for kind in ("attribution", "ablation"):
        low, high = bounds[kind]
        effect = getattr(scan, kind).effect.double()
        measured = ~effect.isnan()
        assert bool((low[measured] <= effect[measured] + 1e-7).all() and (effect[measured] <= high[measured] + 1e-7)
                    .all())
        assert bool(low[~measured].isnan().all())
    for label, (low, high) in bounds["circuit_ablation"].items():
        assert low <= scan.circuit_ablation[label] <= high
    for edge in scan.verified.edges.edges:
        low, high = bounds["edges"][(edge.src, edge.dst, edge.channel)]
        assert low <= edge.effect <= high
    circuit = scan.verified.intervals
    assert circuit["necessity"][0] <= scan.verified.necessity <= circuit["necessity"][1]
    assert set(circuit["curve"]) == {p.size for p in scan.verified.curve}


def test_intervals_are_deterministic_and_use_the_settings(scan, model):
    again = ck.scan(model, tokens=RepeatedTokens(batch=BATCH), ablation_method="zero", n_resamples=500)
    assert again.intervals["induction_loss"] == scan.intervals["induction_loss"]
    assert again.verified.intervals == scan.verified.intervals
    assert torch.equal(again.intervals["attribution"][0], scan.intervals["attribution"][0])
    wider = ck.scan(model, tokens=RepeatedTokens(batch=BATCH), ablation_method="zero", n_resamples=500,
                    ci_level=0.99, circuit=False, ablate="none")
    low, high = wider.intervals["induction_loss"]["repeated_copies"]
    narrow = scan.intervals["induction_loss"]["repeated_copies"]
    assert low < narrow[0] and high > narrow[1]
    assert scan.settings.n_resamples == 500 and wider.settings.ci_level == 0.99


@pytest.mark.parametrize("kwargs", [{"n_resamples": 1}, {"n_resamples": 2.5}, {"ci_level": 1.0},
                                    {"ci_level": 0.0}, {"ci_level": float("nan")}],
                         ids=["one-resample", "float-resamples", "level-1", "level-0", "level-nan"])
def test_bad_interval_settings_are_refused(model, kwargs):
    with pytest.raises(CircuitkitError):
        ck.scan(model, tokens=RepeatedTokens(batch=2), circuit=False, **kwargs)


def test_a_score_undefined_on_some_resample_gets_no_interval():
    """A sequence without a target row contributes 0 / 0; resamples of only such sequences leave the score
    undefined, so it gets no interval (never a NaN interval, never an error that stops the scan)."""
    from circuitkit.scan_intervals import head_score_intervals

    generator = torch.Generator().manual_seed(0)
    attention = torch.rand(4, 2, 3, generator=generator)
    attention[:3] = 0
    out = head_score_intervals({"sparse": (attention, torch.tensor([0.0, 0.0, 0.0, 5.0])),
                                "dense": (torch.rand(4, 2, 3, generator=generator), torch.full((4,), 5.0))},
                               200, 0.95, 0)
    assert "sparse" not in out and out["dense"][0].shape == (2, 3)
