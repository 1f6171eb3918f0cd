"""Transformer Circuits exercise 1 (the virtual attention head): matrices, runs, paths, capacity, ranks."""

from __future__ import annotations

import pytest
import torch

from circuitkit import CircuitkitError, numerical_rank
from circuitkit.handbuilt import previous_token_pattern, virtual_head_exercise

EXACT_TOL = 1e-5  # the tolerance; the heads are 0/1 matrices, so runs are exact up to float32 sums


def _unit(pairs: list[tuple[int, int]]) -> torch.Tensor:
    """A 16x16 matrix with ones at the given [row, col] entries (written independently of the builder)."""
    out = torch.zeros(16, 16)
    for row, col in pairs:
        out[row, col] = 1.0
    return out


@pytest.fixture(scope="module")
def ex():
    return virtual_head_exercise()


def test_head_matrices_have_the_exercise_shapes(ex):
    assert [tuple(m.shape) for m in (ex.W_V1, ex.W_O1, ex.W_V2, ex.W_O2)] == [(16, 4), (4, 16), (16, 4), (4, 16)]


def test_expanded_matrices_in_row_convention(ex):
    torch.testing.assert_close(ex.W_net1, _unit([(0, 8), (1, 9), (2, 10), (3, 11)]))
    torch.testing.assert_close(ex.W_net2, _unit([(4, 12), (5, 13), (6, 14), (8, 15)]))
    torch.testing.assert_close(ex.two_token, _unit([(0, 15)]))
    torch.testing.assert_close(ex.one_token, ex.W_net1 + ex.W_net2)
    assert int(torch.linalg.matrix_rank(ex.two_token)) == 1


def test_column_convention_matrices_are_the_transposes(ex):
    col = ex.column
    assert tuple(col.W_V1.shape) == (4, 16) and tuple(col.W_out1.shape) == (16, 4)
    torch.testing.assert_close(col.W_net1, ex.W_net1.T)
    torch.testing.assert_close(col.W_net2, ex.W_net2.T)
    torch.testing.assert_close(col.two_token, _unit([(15, 0)]))  # W_net^2 W_net^1: entry [out, in]
    torch.testing.assert_close(col.one_token, ex.one_token.T)


def test_run_reproduces_the_exercise_exactly(ex):
    g = torch.Generator().manual_seed(0)
    x = torch.zeros(4, 9, 16)
    x[..., :8] = torch.randn(4, 9, 8, generator=g)
    out = ex.run(x)
    torch.testing.assert_close(out[:, 2:, 8:12], x[:, 1:-1, 0:4], atol=EXACT_TOL, rtol=0)
    torch.testing.assert_close(out[:, 2:, 12:15], x[:, 1:-1, 4:7], atol=EXACT_TOL, rtol=0)
    torch.testing.assert_close(out[:, 2:, 15], x[:, :-2, 0], atol=EXACT_TOL, rtol=0)
    torch.testing.assert_close(out[..., :8], x[..., :8], atol=EXACT_TOL, rtol=0)
    torch.testing.assert_close(out[:, 1, 8:15], torch.cat([x[:, 0, 0:4], x[:, 0, 4:7]], -1), atol=EXACT_TOL, rtol=0)
    assert bool((out[:, :2, 15] == 0).all()) and bool((out[:, 0, 8:] == 0).all())  # nothing before position 0


def test_run_equals_the_path_expansion_for_any_input(ex):
    x = torch.randn(2, 7, 16, generator=torch.Generator().manual_seed(1))  # dims 8-15 not zero either
    paths = ex.paths(x)
    torch.testing.assert_close(ex.run(x), paths["direct"] + paths["one_token"] + paths["two_token"],
                               atol=EXACT_TOL, rtol=0)
    P = previous_token_pattern(7)
    assert P[3, 2] == 1 and P[0].sum() == 0 and P.sum() == 6


def test_capacity_splits_seven_eighths_to_one_token_and_one_eighth_to_two_tokens(ex):
    assert ex.capacity() == {"one_token": 7 / 8, "two_token": 1 / 8}


def test_ov_ranks_equal_the_built_ranks_and_only_v_composition_links_the_heads(ex):
    assert numerical_rank(ex.model, "OV").flatten().tolist() == [4, 4]
    from circuitkit.composition import composition_scores

    scores = {mode: composition_scores(ex.model, mode)[0, 0, 1, 0].item() for mode in "QKV"}
    assert scores["Q"] == 0 and scores["K"] == 0  # zero QK weights: the exercise fixes the patterns
    # ||W_net1 @ W_net2||_F / (||W_net1||_F ||W_net2||_F) = 1 / (2 * 2): one shared unit entry
    assert scores["V"] == pytest.approx(0.25, abs=EXACT_TOL)


@pytest.mark.parametrize("bad", [torch.zeros(3, 16), torch.zeros(1, 3, 8), torch.zeros(1, 3, 16, dtype=torch.long)],
                         ids=["2d", "wrong-width", "integer"])
def test_run_rejects_bad_input(ex, bad):
    with pytest.raises(CircuitkitError, match=r"\[batch, pos, 16\]"):
        ex.run(bad)
