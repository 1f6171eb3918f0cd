"""Residual subspaces, head constructors and assembly: exact copies and scores, the position code's margin,
padding invariance, and the errors for overlapping/out-of-range subspaces and a too-small d_head."""

from __future__ import annotations

import pytest
import torch

from circuitkit import CircuitkitError
from circuitkit.handbuilt import (
    OV,
    QK,
    HeadSpec,
    PositionCode,
    ResidualLayout,
    Subspace,
    assemble,
    assemble_weights,
    copy_ov,
    key_bias_qk,
    match_qk,
    previous_token_qk,
)

CODE_TOL = 1e-5  # float32 cos/sin codes (computed in float64, then rounded)


# ---------------------------------------------------------------------- subspaces
def test_basis_writes_and_reads_back_the_coordinates():
    sub = Subspace("s", (5, 1, 3), 8)
    coords = torch.tensor([[1.0, 2.0, 3.0]])
    resid = coords @ sub.basis()
    assert resid.tolist() == [[0, 2, 0, 3, 0, 1, 0, 0]]
    torch.testing.assert_close(sub.read(resid), coords)
    torch.testing.assert_close(resid @ sub.basis().T, coords)


def test_stack_packs_blocks_in_order_and_slices_and_unions_keep_order():
    layout = ResidualLayout.stack(a=3, b=2, d_model=8)
    assert layout["a"].dims == (0, 1, 2) and layout["b"].dims == (3, 4)
    assert layout.free_dims() == (5, 6, 7)
    assert layout["a"][1:3].dims == (1, 2)
    assert layout["a"][-1].dims == (2,)
    assert (layout["b"] + layout["a"][0]).dims == (3, 4, 0)


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: ResidualLayout(8, {"a": range(0, 4), "b": range(3, 6)}), "overlap at dim 3"),
        (lambda: ResidualLayout(8, {"a": range(6, 9)}), r"out of range.*\[0, 8\)"),
        (lambda: Subspace("s", (-1,), 4), "out of range"),
        (lambda: Subspace("s", (1, 1), 4), "repeated dims"),
        (lambda: Subspace("s", (), 4), "at least one"),
        (lambda: ResidualLayout.stack(a=5, b=5, d_model=8), "total size 10"),
        (lambda: ResidualLayout.stack(a=0), r"stack: a: given int 0; expected an int >= 1"),
        (lambda: Subspace.span("s", 0, 4, 8) + Subspace.span("t", 2, 5, 8), "overlap at dim 2"),
        (lambda: Subspace.span("s", 0, 2, 8)[5], r"index 5"),
    ],
    ids=["layout-overlap", "layout-out-of-range", "negative-dim", "repeated-dim", "empty", "stack-too-wide",
         "stack-zero-size", "union-overlap", "index-out-of-range"],
)
def test_bad_subspaces_raise(build, match):
    with pytest.raises(CircuitkitError, match=match):
        build()


# ---------------------------------------------------------------------- OV / QK constructors
def test_copy_ov_moves_exactly_the_source_dims_to_the_destination_dims():
    src, dst = Subspace("src", (0, 2), 6), Subspace("dst", (5, 3), 6)
    ov = copy_ov(src, dst, scale=2.0)
    x = torch.arange(1.0, 7.0)
    assert (x @ ov.W_V @ ov.W_O).tolist() == [0, 0, 0, 6, 0, 2]
    assert ov.rank == 2


@pytest.mark.parametrize(
    "src, dst, d_head, match",
    [
        (Subspace("a", (0, 1, 2), 8), Subspace("b", (4, 5, 6), 8), 2, "needs 3 head dimensions but d_head=2"),
        (Subspace("a", (0, 1), 8), Subspace("b", (4, 5, 6), 8), None, "expected equal sizes"),
        (Subspace("a", (0, 1), 8), Subspace("b", (1, 2), 8), None, "overlap at dim 1"),
        (Subspace("a", (0, 1), 8), Subspace("b", (4, 5), 9), None, "different residual widths"),
    ],
    ids=["d_head-too-small", "size-mismatch", "overlapping", "different-widths"],
)
def test_bad_copies_raise(src, dst, d_head, match):
    with pytest.raises(CircuitkitError, match=match):
        copy_ov(src, dst, d_head=d_head)


def test_match_qk_scores_the_inner_product_of_query_and_key_coordinates():
    q_sub, k_sub = Subspace("q", (0, 1, 2), 7), Subspace("k", (3, 4, 5), 7)
    qk = match_qk(q_sub, k_sub, scale=3.0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 7, generator=g)
    scores = (x @ qk.W_Q) @ (x @ qk.W_K).T
    torch.testing.assert_close(scores, 3.0 * x[:, :3] @ x[:, 3:6].T)
    with pytest.raises(CircuitkitError, match="d_head=2"):
        match_qk(q_sub, k_sub, d_head=2)


def test_summed_parts_score_with_the_sum_of_their_bilinear_forms_and_ranks_add():
    a = match_qk(Subspace("q", (0,), 4), Subspace("k", (1,), 4), scale=2.0)
    b = key_bias_qk(Subspace("f", (3,), 4), -5.0)
    both = a + b
    x = torch.tensor([[1.0, 2.0, 0.0, 1.0], [3.0, 1.0, 0.0, 0.0]])
    score = (x @ both.W_Q + both.b_Q) @ (x @ both.W_K).T
    expected = 2.0 * x[:, :1] @ x[:, 1:2].T - 5.0 * x[:, 3][None, :]
    torch.testing.assert_close(score, expected)
    assert both.rank == 2
    ov = copy_ov(Subspace("a", (0,), 4), Subspace("b", (1,), 4)) + copy_ov(
        Subspace("c", (2,), 4), Subspace("d", (3,), 4)
    )
    assert (torch.tensor([1.0, 0, 5, 0]) @ ov.W_V @ ov.W_O).tolist() == [0, 1, 0, 5]


def test_parts_reject_mismatched_shapes_and_nan():
    with pytest.raises(CircuitkitError, match="same"):
        QK(torch.zeros(4, 2), torch.zeros(4, 3))
    with pytest.raises(CircuitkitError, match="NaN"):
        OV(torch.full((4, 2), float("nan")), torch.zeros(2, 4))
    with pytest.raises(CircuitkitError, match=r"\[d_model, r\] and \[r, d_model\]"):
        OV(torch.zeros(4, 2), torch.zeros(3, 4))


# ---------------------------------------------------------------------- position code
CODE_CASES = [(n, o) for n in (2, 3, 8, 33, 100) for o in (0, 1, 2) if o < n]


@pytest.mark.parametrize("n_ctx, offset", CODE_CASES, ids=[f"n_ctx={n}-offset={o}" for n, o in CODE_CASES])
def test_position_code_shift_moves_codes_back_and_the_target_wins_by_the_margin(n_ctx, offset):
    code = PositionCode(n_ctx)
    codes = code.codes(torch.float64)
    shifted = codes @ code.shift(offset, torch.float64)
    torch.testing.assert_close(shifted[offset:], codes[: n_ctx - offset], atol=CODE_TOL, rtol=0)
    scores = shifted @ codes.T  # [query i, key j], every pair (not only causal ones)
    for i in range(offset, n_ctx):
        others = torch.cat([scores[i, : i - offset], scores[i, i - offset + 1:]])
        assert float(scores[i, i - offset]) == pytest.approx(code.n_freqs, abs=CODE_TOL)
        assert float(others.max()) <= code.n_freqs - code.margin + CODE_TOL


def test_previous_token_qk_attends_one_back_through_the_positional_subspace():
    code = PositionCode(16)
    layout = ResidualLayout.stack(junk=3, pos=code.dim)
    qk = previous_token_qk(layout["pos"], code, scale=10.0)
    resid = code.codes() @ layout["pos"].basis()
    scores = (resid @ qk.W_Q) @ (resid @ qk.W_K).T
    causal = scores.masked_fill(torch.triu(torch.ones(16, 16, dtype=torch.bool), 1), float("-inf"))
    assert causal[1:].argmax(-1).tolist() == list(range(15))
    with pytest.raises(CircuitkitError, match="PositionCode of dim"):
        previous_token_qk(layout["junk"], code)


# ---------------------------------------------------------------------- assembly
def test_assembly_pads_to_d_head_without_changing_the_function():
    layout = ResidualLayout.stack(a=2, b=2, c=2)
    heads = [[HeadSpec(qk=match_qk(layout["a"], layout["b"]), ov=copy_ov(layout["a"], layout["c"]))],
             [HeadSpec(ov=copy_ov(layout["c"], layout["b"])), HeadSpec()]]
    x = torch.randn(2, 5, 6, generator=torch.Generator().manual_seed(1))
    tight = assemble(heads)
    wide = assemble(heads, d_head=5, attn_scale=2**0.5)  # pin tight's 1/sqrt(d_head) scale
    assert tight.cfg.d_head == 2 and wide.cfg.d_head == 5 and wide.cfg.n_heads == 2
    torch.testing.assert_close(wide(x), tight(x), atol=1e-6, rtol=1e-6)
    hard_tight, hard_wide = assemble(heads, attention="hard"), assemble(heads, d_head=5, attention="hard")
    torch.testing.assert_close(hard_wide(x), hard_tight(x), atol=1e-6, rtol=1e-6)
    assert not torch.allclose(assemble(heads, d_head=5)(x), tight(x), atol=1e-3)  # the scale does matter


def test_assembly_errors_name_the_heads_that_do_not_fit():
    layout = ResidualLayout.stack(a=3, b=3)
    big = HeadSpec(ov=copy_ov(layout["a"], layout["b"]))
    with pytest.raises(CircuitkitError, match=r"heads 1\.0 \(rank 3\) need more"):
        assemble_weights([[HeadSpec()], [big]], d_head=2)
    other = HeadSpec(ov=copy_ov(Subspace("x", (0,), 4), Subspace("y", (1,), 4)))
    with pytest.raises(CircuitkitError, match="widths"):
        assemble_weights([[big, other]])
    with pytest.raises(CircuitkitError, match="non-empty list"):
        assemble_weights([])
