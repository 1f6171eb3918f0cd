"""The hand-building and theory APIs refuse bad input as the scan does: one CircuitkitError line each, never a raw
torch/Python exception, a broadcast that hides a shape mismatch, or a silent NaN/inf/overflowed result.

Categories: ``build`` (HeadSpec, QK/OV addition, Subspace indexing and reads, VirtualHeadExercise.paths),
``Factored`` operators, ``ToyConfig``, ``viz.model_patterns`` tokens, the theory helpers."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch

import circuitkit as ck
from circuitkit import CircuitkitError
from circuitkit.handbuilt import OV, QK, HeadSpec, ResidualLayout, Subspace
from circuitkit.models import ToyConfig

MAX_MESSAGE = 600
"""A one-line message names the call, what was given (summarised) and what was expected; longer means a repr."""


def _qk(d_model=8, r=2):
    return QK(torch.eye(d_model)[:, :r], torch.eye(d_model)[:, :r])


def _ov(d_model=8, r=2):
    return OV(torch.eye(d_model)[:, :r], torch.eye(d_model)[:r])


def _sub():
    return Subspace("tok", (0, 1, 2, 3), 8)


def _factored():
    g = torch.Generator().manual_seed(0)
    return ck.Factored(torch.randn(2, 3, 8, 4, generator=g), torch.randn(2, 3, 4, 8, generator=g))


def _patterns(tokens, heads=((0, 0),)):
    return ck.viz.model_patterns(_toy_model(), tokens, heads=list(heads))


def _toy_model():
    from tests import fuzz_cases as fc

    return fc.toy()  # n_ctx 32, d_vocab 16


def _x(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


def _mha(**changes):
    args = {"x": _x(2, 5, 8), "W_Q": _x(2, 8, 4), "W_K": _x(2, 8, 4), "W_V": _x(2, 8, 4), "W_O": _x(2, 4, 8),
            "key_padding_mask": torch.ones(2, 5, dtype=torch.bool)}
    args.update(changes)
    mask = args.pop("key_padding_mask")
    return ck.theory.multi_head_attention(**args, key_padding_mask=mask)


T = ck.theory
CASES = {
    "build": {
        "HeadSpec-qk-not-a-QK": lambda: HeadSpec(qk="qk"),
        "HeadSpec-ov-a-tensor": lambda: HeadSpec(ov=torch.eye(8)),
        "HeadSpec-qk-is-an-OV": lambda: HeadSpec(qk=_ov()),
        "HeadSpec-name-int": lambda: HeadSpec(name=3),
        "QK-plus-int": lambda: _qk() + 1,
        "QK-plus-OV": lambda: _qk() + _ov(),
        "QK-plus-QK-other-width": lambda: _qk(8) + _qk(4),
        "OV-plus-None": lambda: _ov() + None,
        "OV-plus-tensor": lambda: _ov() + torch.eye(8),
        "OV-plus-QK": lambda: _ov() + _qk(),
        "QK-W_Q-int": lambda: QK(torch.ones(8, 2, dtype=torch.long), torch.ones(8, 2)),
        "QK-W_Q-numpy": lambda: QK(np.eye(8)[:, :2], torch.eye(8)[:, :2]),
        "QK-W_K-meta": lambda: QK(torch.eye(8)[:, :2], torch.eye(8)[:, :2].to("meta")),
        "QK-b_Q-wrong-length": lambda: QK(torch.eye(8)[:, :2], torch.eye(8)[:, :2], torch.ones(3)),
        "OV-W_O-wrong-shape": lambda: OV(torch.eye(8)[:, :2], torch.eye(8)[:3]),
        "OV-empty": lambda: OV(torch.zeros(8, 0), torch.zeros(0, 8)),
        "Subspace-index-str": lambda: _sub()["a"],
        "Subspace-index-float": lambda: _sub()[1.5],
        "Subspace-index-out-of-range": lambda: _sub()[4],
        "Subspace-index-negative-out": lambda: _sub()[-5],
        "Subspace-index-numpy-int-out": lambda: _sub()[np.int64(9)],
        "Subspace-empty-slice": lambda: _sub()[2:2],
        "Subspace-slice-step-0": lambda: _sub()[::0],
        "Subspace-index-tuple": lambda: _sub()[0, 1],
        "Subspace-index-None": lambda: _sub()[None],
        "Subspace-index-bool": lambda: _sub()[True],
        "Subspace-plus-int": lambda: _sub() + 1,
        "Subspace-read-list": lambda: _sub().read([1.0] * 8),
        "Subspace-read-numpy": lambda: _sub().read(np.ones(8)),
        "Subspace-read-wrong-width": lambda: _sub().read(torch.ones(3, 5)),
        "Subspace-read-scalar": lambda: _sub().read(torch.tensor(1.0)),
        "Subspace-read-None": lambda: _sub().read(None),
        "Subspace-basis-dtype-int": lambda: _sub().basis("float32"),
        "Subspace-dims-numpy-ints": lambda: Subspace("a", np.arange(3), 8),
        "Subspace-dims-float": lambda: Subspace("a", (0.0, 1.0), 8),
        "Subspace-d_model-negative": lambda: Subspace("a", (0,), -8),
        "ResidualLayout-negative-d_model": lambda: ResidualLayout(-4, {"a": range(2)}),
        "ResidualLayout-missing-key": lambda: ResidualLayout(8, {"a": range(2)})["b"],
        "ResidualLayout-key-int": lambda: ResidualLayout(8, {"a": range(2)})[0],
        "paths-list": lambda: ck.handbuilt.virtual_head_exercise().paths([[[0.0] * 16]]),
        "paths-wrong-width": lambda: ck.handbuilt.virtual_head_exercise().paths(torch.ones(1, 3, 8)),
        "paths-2d": lambda: ck.handbuilt.virtual_head_exercise().paths(torch.ones(3, 16)),
        "paths-int-dtype": lambda: ck.handbuilt.virtual_head_exercise().paths(torch.ones(1, 3, 16, dtype=torch.long)),
        "paths-nan": lambda: ck.handbuilt.virtual_head_exercise().paths(torch.full((1, 3, 16), math.nan)),
        "paths-None": lambda: ck.handbuilt.virtual_head_exercise().paths(None),
        "paths-empty-pos": lambda: ck.handbuilt.virtual_head_exercise().paths(torch.ones(1, 0, 16)),
        "run-numpy": lambda: ck.handbuilt.virtual_head_exercise().run(np.ones((1, 3, 16))),
        "PositionCode-negative": lambda: ck.handbuilt.PositionCode(-3),
        "PositionCode-shift-str": lambda: ck.handbuilt.PositionCode(8).shift("1"),
        "PositionCode-codes-dtype-str": lambda: ck.handbuilt.PositionCode(8).codes("float"),
        "previous_token_pattern-negative": lambda: ck.handbuilt.previous_token_pattern(-1),
        "previous_token_pattern-dtype-int": lambda: ck.handbuilt.previous_token_pattern(4, dtype=torch.long),
    },
    "factored": {
        "matmul-int": lambda: _factored() @ 3,
        "matmul-str": lambda: _factored() @ "x",
        "matmul-list": lambda: _factored() @ [[1.0] * 8] * 8,
        "matmul-numpy": lambda: _factored() @ np.ones((8, 8)),
        "matmul-wrong-rows": lambda: _factored() @ torch.ones(5, 8),
        "matmul-1d": lambda: _factored() @ torch.ones(8),
        "matmul-factored-wrong-inner": lambda: _factored() @ ck.Factored(torch.ones(5, 2), torch.ones(2, 5)),
        "matmul-wrong-batch": lambda: _factored() @ torch.ones(7, 8, 8),
        "matmul-int-dtype": lambda: _factored() @ torch.ones(8, 8, dtype=torch.long),
        "matmul-nan": lambda: _factored() @ torch.full((8, 8), math.nan),
        "rmatmul-wrong-cols": lambda: torch.ones(8, 5) @ _factored(),
        "rmatmul-numpy": lambda: np.ones((8, 8)) @ _factored(),
        "rmatmul-int": lambda: 3 @ _factored(),
        "index-out-of-range": lambda: _factored()[5],
        "index-negative-out-of-range": lambda: _factored()[-3],
        "index-second-axis-out": lambda: _factored()[0, 3],
        "index-str": lambda: _factored()["a"],
        "index-float": lambda: _factored()[0.5],
        "index-too-many": lambda: _factored()[0, 0, 0],
        "index-None": lambda: _factored()[None],
        "index-empty-slice": lambda: _factored()[1:1],
        "index-bool-tensor-wrong": lambda: _factored()[torch.tensor([True, False, True])],
        "index-long-tensor-out": lambda: _factored()[torch.tensor([0, 7])],
        "construct-mismatched-inner": lambda: ck.Factored(torch.ones(8, 4), torch.ones(3, 8)),
        "construct-int": lambda: ck.Factored(torch.ones(8, 4, dtype=torch.long), torch.ones(4, 8, dtype=torch.long)),
        "construct-1d": lambda: ck.Factored(torch.ones(8), torch.ones(8)),
        "construct-meta": lambda: ck.Factored(torch.ones(8, 4, device="meta"), torch.ones(4, 8, device="meta")),
        "construct-sparse": lambda: ck.Factored(torch.ones(8, 4).to_sparse(), torch.ones(4, 8).to_sparse()),
    },
    "toyconfig": {
        "negative-layers": lambda: ToyConfig(n_layers=-1, n_heads=2, d_model=8, d_head=4, d_vocab=16, n_ctx=8),
        "zero-heads": lambda: ToyConfig(n_layers=1, n_heads=0, d_model=8, d_head=4, d_vocab=16, n_ctx=8),
        "negative-d_model": lambda: ToyConfig(n_layers=1, n_heads=2, d_model=-8, d_head=4, d_vocab=16, n_ctx=8),
        "negative-d_head": lambda: ToyConfig(n_layers=1, n_heads=2, d_model=8, d_head=-4, d_vocab=16, n_ctx=8),
        "negative-vocab": lambda: ToyConfig(n_layers=1, n_heads=2, d_model=8, d_head=4, d_vocab=-16, n_ctx=8),
        "negative-n_ctx": lambda: ToyConfig(n_layers=1, n_heads=2, d_model=8, d_head=4, d_vocab=16, n_ctx=-8),
        "float-layers": lambda: ToyConfig(n_layers=1.5, n_heads=2, d_model=8, d_head=4, d_vocab=16, n_ctx=8),
        "str-heads": lambda: ToyConfig(n_layers=1, n_heads="2", d_model=8, d_head=4, d_vocab=16, n_ctx=8),
        "bool-d_model": lambda: ToyConfig(n_layers=1, n_heads=2, d_model=True, d_head=4, d_vocab=16, n_ctx=8),
        "unknown-attention": lambda: ToyConfig(n_layers=1, n_heads=2, d_model=8, d_head=4, d_vocab=16, n_ctx=8,
                                               attention="sparse"),
        "attention-int": lambda: ToyConfig(n_layers=1, n_heads=2, d_model=8, d_head=4, d_vocab=16, n_ctx=8,
                                           attention=1),
        "kv-heads-not-dividing": lambda: ToyConfig(n_layers=1, n_heads=3, d_model=8, d_head=4, d_vocab=16, n_ctx=8,
                                                   n_key_value_heads=2),
        "kv-heads-zero": lambda: ToyConfig(n_layers=1, n_heads=2, d_model=8, d_head=4, d_vocab=16, n_ctx=8,
                                           n_key_value_heads=0),
        "attn-scale-nan": lambda: ToyConfig(n_layers=1, n_heads=2, d_model=8, d_head=4, d_vocab=16, n_ctx=8,
                                            attn_scale=math.nan),
        "attn-scale-negative": lambda: ToyConfig(n_layers=1, n_heads=2, d_model=8, d_head=4, d_vocab=16, n_ctx=8,
                                                 attn_scale=-1.0),
        "attn-only-false": lambda: ToyConfig(n_layers=1, n_heads=2, d_model=8, d_head=4, d_vocab=16, n_ctx=8,
                                             attn_only=False),
        "normalization-LN": lambda: ToyConfig(n_layers=1, n_heads=2, d_model=8, d_head=4, d_vocab=16, n_ctx=8,
                                              normalization_type="LN"),
        "prepend-bos-str": lambda: ToyConfig(n_layers=1, n_heads=2, d_model=8, d_head=4, d_vocab=16, n_ctx=8,
                                             default_prepend_bos="yes"),
    },
    "model_patterns": {
        "tokens-beyond-n_ctx": lambda: _patterns(torch.zeros(40, dtype=torch.long)),
        "tokens-outside-vocab": lambda: _patterns(torch.tensor([1, 2, 16])),
        "tokens-negative": lambda: _patterns(torch.tensor([1, -2, 3])),
        "tokens-float": lambda: _patterns(torch.tensor([1.0, 2.0])),
        "tokens-empty": lambda: _patterns(torch.tensor([], dtype=torch.long)),
        "tokens-3d": lambda: _patterns(torch.ones(1, 2, 3, dtype=torch.long)),
        "tokens-str": lambda: _patterns("t1 t2"),
        "tokens-batch-2": lambda: _patterns(torch.ones(2, 4, dtype=torch.long)),
        "bridge-tokens-beyond-n_ctx": lambda: ck.viz.model_patterns(ck.zoo.load(), torch.ones(65, dtype=torch.long),
                                                                   heads=[(0, 0)]),
        "bridge-tokens-outside-vocab": lambda: ck.viz.model_patterns(ck.zoo.load(), torch.tensor([1, 64]),
                                                                    heads=[(0, 0)]),
        "bridge-tokens-negative": lambda: ck.viz.model_patterns(ck.zoo.load(), torch.tensor([1, -1]), heads=[(0, 0)]),
        "heads-out-of-range": lambda: _patterns(torch.tensor([1, 2]), [(5, 0)]),
        "heads-not-pairs": lambda: _patterns(torch.tensor([1, 2]), [0]),
        "token_strings-outside-vocab": lambda: ck.viz.token_strings(ck.zoo.load(), torch.tensor([1, 999])),
        "token_strings-negative": lambda: ck.viz.token_strings(ck.zoo.load(), torch.tensor([-1])),
    },
    "theory": {
        "sdpa-mask-batch-mismatch": lambda: T.sdpa_torch(_x(2, 4, 3), _x(2, 4, 3), _x(2, 4, 3),
                                                          key_padding_mask=torch.ones(3, 4, dtype=torch.bool)),
        "sdpa-mask-length-mismatch": lambda: T.sdpa_torch(_x(2, 4, 3), _x(2, 4, 3), _x(2, 4, 3),
                                                           key_padding_mask=torch.ones(2, 5, dtype=torch.bool)),
        "sdpa-mask-broadcasting-batch-1": lambda: T.sdpa_torch(_x(2, 4, 3), _x(2, 4, 3), _x(2, 4, 3),
                                                                key_padding_mask=torch.ones(1, 4, dtype=torch.bool)),
        "sdpa-mask-float": lambda: T.sdpa_torch(_x(2, 4, 3), _x(2, 4, 3), _x(2, 4, 3),
                                                 key_padding_mask=torch.ones(2, 4)),
        "sdpa-mask-all-padding": lambda: T.sdpa_torch(_x(2, 4, 3), _x(2, 4, 3), _x(2, 4, 3),
                                                       key_padding_mask=torch.ones(2, 4, dtype=torch.bool)),
        "sdpa-batch-mismatch": lambda: T.sdpa_torch(_x(2, 4, 3), _x(3, 4, 3), _x(3, 4, 3)),
        "sdpa-batch-broadcast-1": lambda: T.sdpa_torch(_x(2, 4, 3), _x(1, 4, 3), _x(1, 4, 3)),
        "sdpa-numpy-mask-mismatch": lambda: T.sdpa_numpy(np.ones((2, 4, 3)), np.ones((2, 4, 3)), np.ones((2, 4, 3)),
                                                          key_padding_mask=np.ones((2, 5), dtype=bool)),
        "sdpa-numpy-mask-int": lambda: T.sdpa_numpy(np.ones((2, 4, 3)), np.ones((2, 4, 3)), np.ones((2, 4, 3)),
                                                     key_padding_mask=np.ones((2, 4))),
        "sdpa-numpy-batch-mismatch": lambda: T.sdpa_numpy(np.ones((2, 4, 3)), np.ones((3, 4, 3)),
                                                           np.ones((3, 4, 3))),
        "pattern-scale-nan": lambda: T.pattern_torch(_x(2, 4, 3), _x(2, 4, 3), scale=math.nan),
        "pattern-scale-zero": lambda: T.pattern_torch(_x(2, 4, 3), _x(2, 4, 3), scale=0.0),
        "mha-mask-batch-mismatch": lambda: _mha(key_padding_mask=torch.ones(3, 5, dtype=torch.bool)),
        "mha-mask-length-mismatch": lambda: _mha(key_padding_mask=torch.ones(2, 4, dtype=torch.bool)),
        "mha-mask-1d": lambda: _mha(key_padding_mask=torch.ones(5, dtype=torch.bool)),
        "split_heads-not-dividing": lambda: T.split_heads(_x(2, 5, 8), 3),
        "split_heads-zero": lambda: T.split_heads(_x(2, 5, 8), 0),
        "rope-positions-nan": lambda: T.rope(_x(1, 3, 4), positions=[0.0, math.nan, 2.0]),
        "rope-positions-inf": lambda: T.rope(_x(1, 3, 4), positions=torch.tensor([0.0, math.inf, 2.0])),
        "rope-positions-wrong-length": lambda: T.rope(_x(1, 3, 4), positions=[0.0, 1.0]),
        "rope-positions-2d": lambda: T.rope(_x(1, 3, 4), positions=torch.zeros(3, 1)),
        "rope-odd-d": lambda: T.rope(_x(1, 3, 5)),
        "rope_score-m-nan": lambda: T.rope_score(_x(4), _x(4), math.nan, 1.0),
        "rope_score-n-inf": lambda: T.rope_score(_x(4), _x(4), 1.0, math.inf),
        "rope_offset_error-shift-nan": lambda: T.rope_offset_error(_x(4), _x(4), 1.0, 2.0, math.nan),
        "rope_rotation_matrix-position-nan": lambda: T.rope_rotation_matrix(math.nan, 4),
        "rope_rotation_matrix-position-huge": lambda: T.rope_rotation_matrix(1e300, 4),
        "training_flops-overflow": lambda: T.training_flops(1e300, 1e300),
        "inference_flops-overflow": lambda: T.inference_flops_per_token(1e308),
        "chinchilla-overflow": lambda: T.chinchilla_optimal(1e308, tokens_per_param=1e-300),
        "jl_min_dim-eps-zero": lambda: T.jl_min_dim(100, 0.0),
        "jl_min_dim-eps-one": lambda: T.jl_min_dim(100, 1.0),
        "jl_min_dim-eps-negative": lambda: T.jl_min_dim(100, -0.5),
        "jl_min_dim-eps-nan": lambda: T.jl_min_dim(100, math.nan),
        "jl_min_dim-points-inf": lambda: T.jl_min_dim(math.inf, 0.5),
        "jl_min_dim-points-huge": lambda: T.jl_min_dim(1e308, 1e-300),
        "rank_collapse_max_rate-fraction-2": lambda: T.rank_collapse_max_rate(2.0, 3),
        "rank_collapse_max_rate-fraction-nan": lambda: T.rank_collapse_max_rate(math.nan, 3),
        "kv_cache_saving-not-dividing": lambda: T.kv_cache_saving(8, 3),
        "sinusoidal-base-one": lambda: T.sinusoidal_encoding(4, 8, base=1.0),
        "sinusoidal-base-inf": lambda: T.sinusoidal_encoding(4, 8, base=math.inf),
        "sinusoidal-odd-d_model": lambda: T.sinusoidal_encoding(4, 7),
        "layernorm-gamma-nan": lambda: T.layernorm_output_norm(_x(2, 4), gamma=math.nan),
        "layernorm-d-1": lambda: T.layernorm_output_norm(_x(2, 1)),
        "softmax_jacobian-nan": lambda: T.softmax_jacobian([1.0, math.nan]),
        "softmax_jacobian-2d": lambda: T.softmax_jacobian(torch.ones(2, 2)),
        "permutation-not-a-permutation": lambda: T.permutation_equivariance_error(
            _x(4, 8), _x(8, 4), _x(8, 4), _x(8, 4), [0, 0, 1, 2]),
        "permutation-wrong-length": lambda: T.permutation_equivariance_error(
            _x(4, 8), _x(8, 4), _x(8, 4), _x(8, 4), [0, 1, 2]),
        "linear_attention_gd-mismatched-n": lambda: T.linear_attention_gd(_x(5, 3), _x(4, 2), _x(2, 3)),
        "linear_attention_gd-lr-nan": lambda: T.linear_attention_gd(_x(5, 3), _x(5, 2), _x(2, 3), lr=math.nan),
        "self_attention-batch-x-1d": lambda: T.self_attention(_x(8), _x(8, 4), _x(8, 4), _x(8, 4)),
        "decode_kv-mismatched-heads": lambda: T.decode_with_kv_cache(_x(1, 3, 8), _x(2, 8, 4), _x(3, 8, 4),
                                                                      _x(3, 8, 4), _x(2, 4, 8)),
        "receptive_field-negative": lambda: T.receptive_field(-1, 2),
    },
}
ALL = [(category, label) for category, cases in CASES.items() for label in cases]
OUTCOMES: Counter[tuple[str, str]] = Counter()


@pytest.mark.parametrize(("category", "label"), ALL, ids=[f"{c}:{lab}" for c, lab in ALL])
def test_bad_input_is_one_circuitkit_error_line(category, label):
    try:
        result = CASES[category][label]()
    except CircuitkitError as error:
        message = str(error)
        assert "\n" not in message and len(message) <= MAX_MESSAGE, message
        OUTCOMES[(category, "one clear line")] += 1
        return
    except Exception as error:  # noqa: BLE001 - the point is to see every other exception
        OUTCOMES[(category, "other")] += 1
        pytest.fail(f"{type(error).__name__}: {str(error)[:300]}")
    OUTCOMES[(category, "other")] += 1
    pytest.fail(f"accepted silently, returned {type(result).__name__}: {str(result)[:200]}")


def test_huge_counts_are_exact_python_ints():
    """Counts are Python ints: exact for any size (no overflow to check), unlike the float FLOP counts above."""
    assert T.kv_cache_bytes(10**200, 1, 1, 1, 1) == 2 * 10**200
    assert T.param_count(10**50, 1, 1) > 10**50
    assert T.multi_head_complexity(10**60, 10**60, 1, 1).attention > 10**100


def test_zz_outcomes_by_category():
    """Runs last: the counts per category (run with -s to see them)."""
    if OUTCOMES:
        for (category, outcome), n in sorted(OUTCOMES.items()):
            print(f"{category:16s} {outcome:16s} {n}")
