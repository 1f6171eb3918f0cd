"""Weight-based head scores: computed from the weights alone, no forward pass.

**Copying** (Elhage et al. 2021): with the full OV circuit ``W_E W_V W_O W_U`` (row convention,
``[d_vocab, d_vocab]``, rank <= ``d_head``) and ``lambda`` its non-zero eigenvalues,

    copying = Re(sum lambda) / sum |lambda|      in [-1, 1]; +1 for a head whose OV circuit only copies.

The non-zero eigenvalues of ``W_E W_V W_O W_U`` are those of the ``d_head x d_head`` core
``W_O (W_U W_E) W_V`` (cyclic permutation), so ``W_U W_E`` (``d_model x d_model``) is built once for all heads
and nothing ``d_vocab``-sized is built per head. LayerNorm and MLPs are ignored (the direct path).
The eigenvalues come from :func:`circuitkit.factored.stable_eigvals` (each core scaled by its largest entry
first), so no finite input, however large or small, reaches LAPACK out of range.

Cost: ``W_U W_E`` is ``2 d_model^2 d_vocab`` flops, at a 262k vocabulary two thirds of a forward pass's worth. It
is taken in float32 (twice float64's speed) on ``W_U`` and ``W_E`` each divided by its largest entry (the score is
homogeneous of degree zero in both, and no float32 product can then overflow), in slices of
:data:`VOCAB_CHUNK` vocabulary entries summed in float64, so the rounding of one float32 sum covers a few
thousand terms, not the whole vocabulary.
"""

from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from circuitkit import validate
from circuitkit.factored import stable_eigvals
from circuitkit.weights import HeadWeights


def copying_scores(weights: Any) -> Float[Tensor, "layer head"] | None:
    """``Re(sum lambda) / sum |lambda|`` per head (see the module docstring); ``None`` without ``W_E``/``W_U``.

    ``weights``: :class:`HeadWeights` or a model :meth:`HeadWeights.from_model` reads. A head whose core is
    exactly zero scores 0."""
    w = weights if isinstance(weights, HeadWeights) else HeadWeights.from_model(weights)
    if w.W_E is None or w.W_U is None:
        return None
    with torch.no_grad():
        unembed_embed = _unembed_embed(w.W_U, w.W_E)  # [d_model, d_model], float64, up to a positive factor
        # float64 from here on: the products are d_model-sized and cheap
        core = w.W_O.double() @ unembed_embed @ w.per_query_head("W_V").double()  # [layer, head, d_head, d_head]
        validate.finite_result("copying_scores: core W_O W_U W_E W_V", core, why="weights too large for float64")
        eig = stable_eigvals(core, name="copying_scores: core W_O W_U W_E W_V")
        total = eig.abs().sum(dim=-1)
        score = torch.where(total > 0, eig.real.sum(dim=-1) / total.clamp_min(1e-300), torch.zeros_like(total))
    return validate.finite_result("copying_scores", score.float().cpu())


VOCAB_CHUNK = 8192
"""Vocabulary entries per float32 slice of ``W_U W_E`` (see the module docstring)."""


def _unembed_embed(W_U: Tensor, W_E: Tensor) -> Float[Tensor, "d_model d_model"]:
    """``W_U W_E / (max|W_U| max|W_E|)`` in float64, from float32 slices of the vocabulary (a zero matrix stays 0).
    Only slices are ever copied (at a 262k vocabulary a scaled float32 copy of ``W_U`` alone is 670 MB), and float32
    weights whose slices' products cannot leave float32's normal range are multiplied as they are, unscaled."""
    largest_U, largest_E = _largest(W_U), _largest(W_E)
    scale_U, scale_E = 1.0 / largest_U, 1.0 / largest_E
    info = torch.finfo(torch.float32)
    as_they_are = (W_U.dtype == W_E.dtype == torch.float32
                   and info.tiny / info.eps < largest_U * largest_E * VOCAB_CHUNK < info.max * 1e-4)
    total = torch.zeros(W_U.shape[0], W_E.shape[1], dtype=torch.float64, device=W_U.device)
    for start in range(0, W_E.shape[0], VOCAB_CHUNK):
        U, E = W_U[:, start : start + VOCAB_CHUNK], W_E[start : start + VOCAB_CHUNK]
        if not as_they_are:
            U, E = (_wide(U) * scale_U).float(), (_wide(E) * scale_E).float()
        total += (U @ E).double()
    return total * (scale_U * scale_E) if as_they_are else total


def _wide(W: Tensor) -> Tensor:
    """``W`` in float32 or wider (scaling a float16 slice before widening it would round it twice)."""
    return W.to(torch.promote_types(W.dtype, torch.float32))


def _largest(W: Tensor) -> float:
    """``max |W|`` (the smallest positive normal number of W's dtype for a zero matrix), without a copy of ``W``;
    a transposed view (a tied ``W_U``) is read in its storage order (a strided read of 168M entries took 0.3 s)."""
    low, high = torch.aminmax(W.mT if not W.is_contiguous() and W.mT.is_contiguous() else W)
    return max(-float(low), float(high), torch.finfo(W.dtype).tiny)


__all__ = ["copying_scores"]
