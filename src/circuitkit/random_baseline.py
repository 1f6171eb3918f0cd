"""What composition score random heads of the same shapes get: the baseline every score is read against.

Why: a composition score ``||W_A W_B||_F / (||W_A||_F ||W_B||_F)`` of two *unrelated* heads is not 0.
For matrices whose distribution is invariant under rotations of the residual stream (i.i.d. Gaussian
factors, for example), ``E[W_A.T W_A] = E||W_A||_F^2 / d_model * I``, hence
``E||W_A W_B||_F^2 = E||W_A||_F^2 E||W_B||_F^2 / d_model`` and the score is about ``1 / sqrt(d_model)``
(0.25 at ``d_model`` 16, 0.036 at GPT-2's 768). That value is a ratio of expectations; the mean of the
ratio sits below it by a few percent when ``d_head >= 4`` and by up to ~15% for ``d_head`` of 1 or 2
(measured), so :attr:`CompositionBaseline.closed_form` is given only for ``d_head >= 4``.

The empirical baseline draws ``n_samples`` independent pairs of heads with i.i.d. Gaussian factors of
the model's shapes (row convention: ``W_A = V O`` with ``V: [d_model, d_head]``, ``O: [d_head, d_model]``
and ``W_B = X Y.T`` with ``X, Y: [d_model, d_head]``), scores each pair exactly in float64 from
``d_head``-sized Gram matrices, and reports their mean and standard deviation. The scale of each factor
cancels in the score, so only ``d_model`` and ``d_head`` matter. Under i.i.d. Gaussian weights the three
modes (Q, K, V) have the same distribution, and the same seed draws the same pairs for each: the mode is
validated, so callers can pass the mode they score, and one draw serves all three. Results are cached per
``(d_model, d_head, n_samples, seed)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

import torch

from circuitkit import validate
from circuitkit.weights import as_head_weights

Mode = Literal["Q", "K", "V"]
MODES: tuple[str, ...] = ("Q", "K", "V")
"""Composition modes: query, key, value (here, not in :mod:`circuitkit.composition`, which imports this module)."""


def check_mode(mode: Any, where: str) -> str:
    """``mode`` if it is ``"Q"`` (query), ``"K"`` (key) or ``"V"`` (value composition); else :class:`CircuitkitError`
    naming ``where``."""
    return validate.option(f"{where}: mode", mode, MODES)

CLOSED_FORM_MIN_D_HEAD = 4
"""Below this ``d_head`` the ratio-of-expectations value ``1/sqrt(d_model)`` is more than ~5% off the mean."""

_SAMPLES_PER_CHUNK_BYTES = 64 * 2**20
"""Random factors are drawn in chunks of about this many bytes, so large shapes stay within memory."""


@dataclass(frozen=True)
class CompositionBaseline:
    """The composition score of random heads of given shapes.

    ``mean`` and ``std`` are over ``n_samples`` random pairs; ``closed_form`` is ``1/sqrt(d_model)`` where
    that approximation holds (``d_head >= 4``), else ``None``.
    """

    mean: float
    std: float
    closed_form: float | None
    n_samples: int


MAX_SAMPLES = 1_000_000
"""More random pairs than this would run for hours and the mean is already exact to ~1e-4."""


def composition_baseline(weights: Any, mode: Mode, *, n_samples: int = 32, seed: int = 0) -> CompositionBaseline:
    """The composition score random heads of ``weights``' shapes get (mean and std over random pairs).

    ``weights``: :class:`HeadWeights` or a model (only ``d_model`` and ``d_head`` are used).
    ``mode``: ``"Q"``, ``"K"`` or ``"V"``. ``n_samples`` (>= 2) random pairs are drawn from a generator
    seeded with ``seed``; results are cached per shape. See the module docstring for the maths.
    """
    check_mode(mode, "composition_baseline")
    n_samples = validate.integer(
        "composition_baseline: n_samples", n_samples, minimum=2, maximum=MAX_SAMPLES,
        why="a standard deviation needs two samples; each sample is a pair of random heads"
    )
    seed = validate.seed("composition_baseline: seed", seed)
    hw = as_head_weights(weights, "composition_baseline")
    return _baseline_for_shape(hw.d_model, hw.d_head, n_samples, seed)


@lru_cache(maxsize=64)
def _baseline_for_shape(d_model: int, d_head: int, n_samples: int, seed: int) -> CompositionBaseline:
    generator = torch.Generator().manual_seed(seed)
    per_sample_bytes = 4 * d_model * d_head * 8
    chunk = max(1, min(n_samples, _SAMPLES_PER_CHUNK_BYTES // per_sample_bytes))
    scores = []
    with torch.no_grad():
        for start in range(0, n_samples, chunk):
            count = min(chunk, n_samples - start)
            V, X, Y = (torch.randn(count, d_model, d_head, generator=generator, dtype=torch.float64, device="cpu")
                       for _ in range(3))
            out = torch.randn(count, d_head, d_model, generator=generator, dtype=torch.float64, device="cpu")
            scores.append(_gram_scores(V, out, X, Y))
    values = torch.cat(scores)
    closed_form = 1.0 / math.sqrt(d_model) if d_head >= CLOSED_FORM_MIN_D_HEAD else None
    return CompositionBaseline(
        mean=float(values.mean()), std=float(values.std()), closed_form=closed_form, n_samples=n_samples
    )


def _gram_scores(V, out, X, Y):
    """Scores of ``(V out)(X Y.T)`` batched over the first axis, from ``d_head x d_head`` matrices only.

    ``||V M Y.T||_F^2 = tr(M.T G_V M G_Y) = sum((G_V M) * (M G_Y))`` with ``M = out X``, ``G_V = V.T V``,
    ``G_Y = Y.T Y``; ``||V out||_F^2 = sum(G_V * out out.T)``; ``||X Y.T||_F^2 = sum(X.T X * G_Y)``.
    """
    G_V = V.mT @ V
    G_Y = Y.mT @ Y
    M = out @ X
    numerator = ((G_V @ M) * (M @ G_Y)).sum((-2, -1))
    left = (G_V * (out @ out.mT)).sum((-2, -1))
    right = ((X.mT @ X) * G_Y).sum((-2, -1))
    return (numerator.clamp_min(0) / (left * right)).sqrt()
