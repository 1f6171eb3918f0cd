"""One measurement session: the model adapted once, each cache made once and shared by the measurements on it, the
scan's stages declared, its settings one record built before the first pass."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

import circuitkit as ck
from circuitkit import CircuitkitError, RepeatedTokens, zoo
from circuitkit.detect.session import Session, open_session
from circuitkit.scan_types import ScanSettings

PATCH_TOLERANCE = 1e-5
"""Path patching on a shared session against a fresh call: the same passes in float32, so equal to rounding."""


class Counter:
    """Counts the forward passes an adapter runs (from the start or resumed at a layer)."""

    def __init__(self, adapter, monkeypatch) -> None:
        self.n = 0
        for method in ("run", "run_from"):
            original = getattr(adapter, method)

            def counted(*args, _original=original, **kwargs):
                self.n += 1
                return _original(*args, **kwargs)

            monkeypatch.setattr(adapter, method, counted)


@pytest.fixture()
def session(tiny_bridge):
    return open_session(tiny_bridge, RepeatedTokens(batch=2, block_len=6))


def test_a_session_keeps_its_clean_run(session, monkeypatch):
    passes = Counter(session.adapter, monkeypatch)
    first = session.clean_run(z_means=True, resid_layers=[1])
    assert session.clean_run(z_means=True) is first and session.clean_run(resid_layers=[1]) is first
    assert passes.n == 1
    wider = session.clean_run(resid_layers=[0, 1])  # a stream it does not hold: one more pass
    assert wider is not first and passes.n == 2 and set(wider.resid_pre) == {0, 1}
    assert session.weights(embeddings=False) is session.weights(embeddings=False)


def test_a_session_is_reused_not_rebuilt(session):
    assert open_session(session) is session
    with pytest.raises(CircuitkitError, match="session: tokens"):
        open_session(session, RepeatedTokens(batch=2))


def test_edge_measurements_share_the_session_caches(tiny_bridge, session, monkeypatch):
    from circuitkit.circuits._engine import context
    from circuitkit.circuits.attribution import attribute
    from circuitkit.circuits.edges import parse_edges
    from circuitkit.circuits.metrics import resolve_metric
    from circuitkit.circuits.patching import patch

    m = resolve_metric("loss", "test")
    attribute(context(session, None, "resample", 0, None, "test"), m)
    assert session.gradients is not None and session.gradients.metric is m
    edges = [((0, 0), (1, 1), "k"), ((0, 1), (1, 0), "q")]
    passes = Counter(session.adapter, monkeypatch)
    ctx = context(session, None, "resample", 0, None, "test")  # a second context on the same session
    shared = patch(ctx, parse_edges(edges, "all", ctx.spec, where="test"), m)
    assert passes.n == 1  # the patched pass only: the clean activations and the corrupted z came from the session
    from circuitkit.circuits import path_patching

    fresh = path_patching(tiny_bridge, edges, metric="loss", corrupt_seed=0,
                                      tokens=RepeatedTokens(batch=2, block_len=6))
    for a, b in zip(shared.edges, fresh.edges, strict=True):
        assert a.effect == pytest.approx(b.effect, abs=PATCH_TOLERANCE)


def test_each_corruption_has_its_own_corrupted_z(session):
    from circuitkit.circuits._engine import context

    resampled = context(session, None, "resample", 0, None, "test").z_corrupt
    resampled[0] = torch.zeros(1)
    assert context(session, None, "resample", 0, None, "test").z_corrupt is resampled
    assert context(session, None, "resample", 1, None, "test").z_corrupt == {}
    assert context(session, None, "mean", 0, None, "test").z_corrupt == {}


def test_a_scan_adapts_its_model_once(monkeypatch):
    from circuitkit.models import adapters

    model = zoo.load()
    made = []
    for cls in adapters.ADAPTERS:
        original = cls.__init__

        def counted(self, *args, _original=original, **kwargs):
            made.append(id(self))  # a subclass's __init__ calling its base's counts once
            _original(self, *args, **kwargs)

        monkeypatch.setattr(cls, "__init__", counted)
    ck.scan(model, tokens=RepeatedTokens(batch=2))
    assert len(set(made)) == 1


def test_settings_split_top_k_and_save_only_what_differs():
    base = dict(block_len=8, n_repeats=2, batch=4, seed=0, bos=0, ablate="top", ablate_top=8,
                ablation_method="mean", top_k=5, device="cpu")
    settings = ScanSettings(**base)
    assert (settings.heads_per_score, settings.edges_per_mode, settings.edges_listed) == (5, 5, 5)
    saved = settings.as_dict()
    assert not {"heads_per_score", "edges_per_mode", "edges_listed", "circuit"} & set(saved)
    split = ScanSettings(**base, heads_per_score=3, circuit=False)
    assert split.as_dict()["heads_per_score"] == 3 and "edges_listed" not in split.as_dict()
    assert not split.with_edges and not split.reuses_corrupt_run


def test_heads_per_score_sets_the_listed_heads():
    from tests.report_fixtures import synthetic_scan

    scan = synthetic_scan(3, 4)
    fewer = dataclasses.replace(scan, settings=dataclasses.replace(scan.settings, heads_per_score=2))
    scores = list(scan.head_scores)  # 12 heads each: the listing is the setting's size
    assert all(len(fewer.to_json()["top_heads"][name]) == 2 for name in scores)
    assert all(len(scan.to_json()["top_heads"][name]) == scan.settings.top_k == 5 for name in scores)
    assert "heads_per_score" not in scan.to_json()["settings"]
    assert fewer.to_json()["settings"]["heads_per_score"] == 2


def test_the_stages_declare_what_they_read_and_write():
    from circuitkit.pipeline import STAGE_NAMES, STAGES, ScanState

    names = {f.name for f in dataclasses.fields(ScanState)} | {"session.clean"}
    assert [stage.name for stage in STAGES] == list(STAGE_NAMES)
    written = {"session"}
    for stage in STAGES:  # a stage reads only what the session holds or an earlier stage wrote
        assert set(stage.reads) <= written, (stage.name, set(stage.reads) - written)
        assert set(stage.writes) <= names, stage.name
        written |= set(stage.writes)


def test_scan_is_a_short_function():
    from circuitkit.pipeline import scan

    source = inspect.getsource(inspect.unwrap(scan))
    docstring = inspect.getdoc(inspect.unwrap(scan)) or ""
    code_lines = len(source.splitlines()) - len(docstring.splitlines()) - 1  # the quotes' own line
    assert code_lines < 60, code_lines


def test_session_fields_are_typed():
    hints = {f.name: f.type for f in dataclasses.fields(Session)}
    assert not [name for name, hint in hints.items() if "Any" in str(hint)], hints
    from circuitkit.scan_types import Scan

    assert not [f.name for f in dataclasses.fields(Scan) if "Any" in str(f.type)]


def test_the_public_edge_measurements_reuse_a_session_given(tiny_bridge, monkeypatch):
    from circuitkit.circuits import edge_attribution, path_patching

    tokens = RepeatedTokens(batch=2, block_len=6)
    session = open_session(tiny_bridge, tokens)
    estimates = edge_attribution(session)
    edges = [(e.src, e.dst, e.channel) for e in estimates.top(3)]
    passes = Counter(session.adapter, monkeypatch)
    shared = path_patching(session, edges)
    assert passes.n == 1  # one stacked patched pass: no clean pass, no corrupted pass of its own
    fresh = path_patching(tiny_bridge, edges, tokens=tokens)
    for a, b in zip(shared.edges, fresh.edges, strict=True):
        assert a.effect == pytest.approx(b.effect, abs=PATCH_TOLERANCE)
    with pytest.raises(CircuitkitError, match="session: tokens"):
        path_patching(session, edges, tokens=tokens)
