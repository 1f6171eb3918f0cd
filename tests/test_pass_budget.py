"""The one copies-per-pass rule (circuitkit.pass_budget) and the four stacked passes that use it."""

from __future__ import annotations

import pytest
import torch

from circuitkit import CircuitkitError
from circuitkit.pass_budget import copies_per_pass


def oracle(bytes_per_copy: int, budget: int, sequences: int = 1, max_sequences: int | None = None,
           max_copies: int | None = None) -> int:
    """The largest C >= 1 meeting every bound, found by counting up."""
    best = 1
    for c in range(1, 10_000):
        if c * bytes_per_copy > budget or (max_sequences and c * sequences > max_sequences) \
                or (max_copies and c > max_copies):
            break
        best = c
    return best


@pytest.mark.parametrize("args", [(100, 1000, 1, None, None), (100, 999, 1, None, None), (5000, 1000, 1, None, None),
                                  (10, 1000, 8, 64, None), (10, 1000, 8, 4, None), (1, 1000, 1, None, 32),
                                  (0, 1000, 1, None, 7), (33, 1000, 3, 50, 5)])
def test_copies_per_pass_against_counting(args):
    b, budget, seqs, max_seqs, max_copies = args
    assert copies_per_pass(b, budget, sequences=seqs, max_sequences=max_seqs, max_copies=max_copies) == \
        oracle(b, budget, seqs, max_seqs, max_copies)


@pytest.mark.parametrize("bad", [dict(bytes_per_copy=-1), dict(budget=0), dict(sequences=0), dict(max_copies=0),
                                 dict(bytes_per_copy=1.5)])
def test_copies_per_pass_refuses_bad_input(bad):
    args = dict(bytes_per_copy=10, budget=100) | bad
    with pytest.raises(CircuitkitError):
        copies_per_pass(**args)


def test_the_four_passes_use_the_one_rule(monkeypatch):
    """Each engine's budget goes through copies_per_pass: replacing it changes all four answers."""
    from circuitkit.circuits import patching
    from circuitkit.detect import ablation, attribution
    from circuitkit.detect.tokens import RepeatedTokens
    from circuitkit.graph import runner as graph
    from circuitkit.graph.runner import TaskRunner
    from circuitkit.graph.task import Task
    from circuitkit.models.adapters import adapt
    from circuitkit.models.toy import AttentionOnlyModel
    from tests.conftest import random_weights

    model = AttentionOnlyModel(random_weights(2, 2, 16, 8, d_vocab=20, seed=0), n_ctx=32)
    adapter = adapt(model)
    batch = RepeatedTokens(batch=2, block_len=4, seed=0).build(model)
    calls = []

    def fake(bytes_per_copy, budget, **kwargs):
        calls.append(budget)
        return 3

    for module in (ablation, attribution, patching, graph):
        monkeypatch.setattr(module, "copies_per_pass", fake)
    assert ablation.copies_per_forward(adapter, batch.tokens, 4) == 3
    assert attribution.points_per_pass(adapter, batch) == 3
    task = Task.from_pairs([((1, 2, 3), (1, 4, 3), 5, 6)] * 2)
    runner = TaskRunner(adapter, task.tokenize(adapter), "logit_diff", mlps=False, ablation="corrupted")
    assert runner._copies_per_pass(node=True) == 3
    from circuitkit.circuits._engine import context
    from circuitkit.circuits.metrics import resolve_metric

    ctx = context(model, batch, "resample", 1, None, "test")
    assert patching._edges_per_pass(ctx, resolve_metric("loss", "t"), torch.float32) == 3
    assert calls == [ablation.MAX_LOGIT_BYTES, attribution.MAX_IG_LOGIT_BYTES, graph.SENDER_BUDGET,
                     patching.PASS_MEMORY_BUDGET]
