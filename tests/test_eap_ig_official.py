"""benchmarks/eap_ig_official.py's own helpers: circuitkit's edge names as EAP-IG's, grouped edges expanded per query
head, the score comparison and the circuit search the EAP-IG half runs.

Oracle for the names: EAP-IG's graph written out from its rule (``Graph.from_model``, sequential attention and MLP):
each layer's heads read the input and every earlier head and MLP through ``<q>``, ``<k>``, ``<v>``; its MLP reads
those and the layer's own heads; the logits read everything.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from circuitkit.graph.runner import build_graph
from circuitkit.models.adapters import adapt
from tests.conftest import boot_bridge

LAYERS, HEADS, KV = 3, 4, 2


@pytest.fixture(scope="module")
def bench():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "eap_ig_official.py"
    spec = importlib.util.spec_from_file_location("eap_ig_official", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def adapter():
    return adapt(boot_bridge(attn_only=False, n_layers=LAYERS, n_heads=HEADS, n_key_value_heads=KV, seed=3))


def eap_ig_edges(n_layers: int, n_heads: int) -> set[str]:
    stream = ["input"]
    edges = set()
    for layer in range(n_layers):
        heads = [f"a{layer}.h{h}" for h in range(n_heads)]
        edges |= {f"{u}->{a}<{c}>" for u in stream for a in heads for c in "qkv"}
        stream += heads
        edges |= {f"{u}->m{layer}" for u in stream}
        stream.append(f"m{layer}")
    return edges | {f"{u}->logits" for u in stream}


def test_per_query_head_names_are_eap_igs_graph(bench, adapter):
    graph = build_graph(adapter, mlps=True, kv_edges="per-query-head")
    mapped = [bench.ck_to_eap(n) for n in graph.edge_names(graph.allowed.nonzero())]
    assert len(set(mapped)) == len(mapped) == graph.n_edges
    assert set(mapped) == eap_ig_edges(LAYERS, HEADS)
    assert bench.ck_to_eap("1.3->2.0:k") == "a1.h3->a2.h0<k>"
    assert bench.ck_to_eap("m0->logits") == "m0->logits"


def test_grouped_edges_expand_to_their_query_heads(bench, adapter):
    group = HEADS // KV
    grouped = build_graph(adapter, mlps=True, kv_edges="grouped")
    names = grouped.edge_names(grouped.allowed.nonzero())
    expanded = [e for n in names for e in bench.expand_grouped(n, group)]
    assert len(set(expanded)) == len(expanded)
    assert set(expanded) == eap_ig_edges(LAYERS, HEADS)
    assert bench.expand_grouped("input->2.g1:v", group) == ["input->a2.h2<v>", "input->a2.h3<v>"]
    assert bench.expand_grouped("0.1->1.2:q", group) == ["a0.h1->a1.h2<q>"]


def test_compare_scores(bench):
    g = torch.Generator().manual_seed(0)
    ck = torch.randn(5000, generator=g, dtype=torch.float64)
    row = bench.compare_scores(ck, ck / 16)
    assert row["scale_ck_over_eap"] == pytest.approx(16.0)
    assert row["max_abs_difference_over_max_score"] < 1e-12
    assert row["spearman"] == pytest.approx(1.0) and row["top100_overlap"] == 100 and row["same_sign"] == 1.0
    other = bench.compare_scores(ck, -ck)
    assert other["spearman"] == pytest.approx(-1.0) and other["same_sign"] == 0.0
    noisy = bench.compare_scores(ck, torch.randn(5000, generator=g, dtype=torch.float64))
    assert abs(noisy["spearman"]) < 0.1 and noisy["top100_overlap"] < 20


def test_smallest_bisects_to_the_resolution(bench):
    total, threshold = 100_000, 6_321
    sizes = bench.mib_sizes(total)
    measured = {s: float(s >= threshold) for s in sizes}
    calls = []

    def evaluate(k):
        calls.append(k)
        return float(k >= threshold)

    k = bench.smallest(evaluate, measured, sizes, total, 0.8)
    assert threshold <= k <= threshold * (1 + bench.RESOLUTION) + 1
    assert len(calls) < 12
    assert bench.smallest(evaluate, {s: 0.0 for s in sizes}, sizes, total, 0.8) == total
