"""Sinusoidal encodings and RoPE: closed forms, a least-squares oracle, complex-number oracle, offset invariance."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from circuitkit import CircuitkitError
from circuitkit.theory import (
    rope,
    rope_offset_error,
    rope_rotation_matrix,
    rope_score,
    sinusoidal_encoding,
    sinusoidal_offset_error,
    sinusoidal_offset_map,
)

# float64 sin/cos of angles up to ~1e3 rad: rounding ~1e3 * 2.2e-16 per entry, so 1e-11 leaves room.
TRIG_TOL = 1e-11
# least squares on the (well-conditioned for these sizes) PE table recovers M_k to ~1e-10.
LSTSQ_TOL = 1e-8
FAST = settings(max_examples=30, deadline=None)


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_seed_002_ex_13_15_values():
    pe = sinusoidal_encoding(2, 4)
    expected = torch.tensor([[0.0, 1.0], [math.sin(1.0), math.cos(1.0)]], dtype=torch.float64)
    torch.testing.assert_close(pe[:, :2], expected, atol=1e-15, rtol=0)
    # the second pair has frequency 10000^(-2/4) = 0.01
    torch.testing.assert_close(pe[1, 2:], torch.tensor([math.sin(0.01), math.cos(0.01)], dtype=torch.float64))


@FAST
@given(offset=st.integers(1, 50), half=st.integers(1, 16))
def test_shifted_encoding_is_a_fixed_linear_map(offset, half):
    assert sinusoidal_offset_error(40, 2 * half, offset) < TRIG_TOL


@pytest.mark.parametrize("offset", [1, 3, 17])
def test_offset_map_equals_least_squares_fit(offset):
    """Oracle independent of the closed form: fit M with PE[:-k] M = PE[k:] by least squares."""
    pe = sinusoidal_encoding(64 + offset, 8, base=100.0)
    fitted = torch.linalg.lstsq(pe[:64], pe[offset:]).solution
    torch.testing.assert_close(fitted, sinusoidal_offset_map(offset, 8, base=100.0), atol=LSTSQ_TOL, rtol=0)


def test_offset_map_is_orthogonal_and_composes():
    M2, M3, M5 = (sinusoidal_offset_map(k, 10) for k in (2, 3, 5))
    torch.testing.assert_close(M2 @ M3, M5, atol=TRIG_TOL, rtol=0)
    torch.testing.assert_close(M3 @ M3.T, torch.eye(10, dtype=torch.float64), atol=TRIG_TOL, rtol=0)
    torch.testing.assert_close(sinusoidal_offset_map(-3, 10), M3.T, atol=TRIG_TOL, rtol=0)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        pytest.param(lambda: sinusoidal_encoding(4, 5), "even", id="odd-d_model"),
        pytest.param(lambda: sinusoidal_encoding(-1, 4), "n_pos", id="negative-n_pos"),
        pytest.param(lambda: sinusoidal_encoding(4, 4, base=0.0), "base", id="zero-base"),
        pytest.param(lambda: sinusoidal_offset_map(1.5, 4), "offset", id="float-offset"),
        pytest.param(lambda: rope(_randn(3, 5)), "even", id="rope-odd-d"),
        pytest.param(lambda: rope(_randn(3, 4), [0, 1]), "positions", id="rope-wrong-positions"),
    ],
)
def test_bad_input_raises(make, match):
    with pytest.raises(CircuitkitError, match=match):
        make()


# ------------------------------------------------------------------------------------------------ RoPE
def test_seed_002_ex_13_16_two_dimensional_rotation():
    """d = 2, omega_0 = 1: R_m = [[cos m, -sin m], [sin m, cos m]] whatever the base."""
    for m in (0, 1, 2.5, 7):
        c, s = math.cos(m), math.sin(m)
        expected = torch.tensor([[c, -s], [s, c]], dtype=torch.float64)
        torch.testing.assert_close(rope_rotation_matrix(m, 2), expected, atol=1e-15, rtol=0)


def test_rope_matches_complex_multiplication():
    """Oracle: pair (x_2i, x_2i+1) as x_2i + i x_2i+1, multiplied by exp(i m theta_i)."""
    x = _randn(2, 5, 8, seed=1)
    theta = 10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    rot = torch.polar(torch.ones(5, 4, dtype=torch.float64), torch.arange(5.0, dtype=torch.float64)[:, None] * theta)
    expected = torch.view_as_real(torch.view_as_complex(x.reshape(2, 5, 4, 2).contiguous()) * rot).reshape(2, 5, 8)
    torch.testing.assert_close(rope(x), expected, atol=TRIG_TOL, rtol=0)


def test_rope_equals_rotation_matrices():
    x = _randn(4, 6, seed=2)
    positions = [0, 3, 10, 250]
    expected = torch.stack([rope_rotation_matrix(p, 6) @ x[i] for i, p in enumerate(positions)])
    torch.testing.assert_close(rope(x, positions), expected, atol=TRIG_TOL, rtol=0)


@pytest.mark.parametrize(("m", "n"), [(0, 0), (3, 10), (100, 7)])
def test_rotation_transpose_product_is_relative_rotation(m, n):
    torch.testing.assert_close(
        rope_rotation_matrix(m, 8).T @ rope_rotation_matrix(n, 8), rope_rotation_matrix(n - m, 8), atol=TRIG_TOL, rtol=0
    )


@FAST
@given(
    seed=st.integers(0, 10_000),
    m=st.integers(-500, 500),
    n=st.integers(-500, 500),
    shift=st.integers(-500, 500),
)
def test_rope_score_depends_only_on_the_offset(seed, m, n, shift):
    q, k = _randn(8, seed=seed), _randn(8, seed=seed + 1)
    scale = float(q.norm() * k.norm())  # |score| <= |q||k|; rounding is relative to this
    assert rope_offset_error(q, k, m, n, shift) < TRIG_TOL * scale
    closed_form = float(q @ (rope_rotation_matrix(n - m, 8) @ k))  # <q, R_{n-m} k>
    assert abs(rope_score(q, k, m, n) - closed_form) < TRIG_TOL * scale


def test_rope_scores_do_change_with_the_offset():
    q, k = _randn(8, seed=3), _randn(8, seed=4)
    assert abs(rope_score(q, k, 0, 1) - rope_score(q, k, 0, 2)) > 1e-3
