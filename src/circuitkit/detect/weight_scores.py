"""Weight-based head scores: computed from the weights alone, no forward pass.

**Copying** (Elhage et al. 2021): with the full OV circuit ``W_E W_V W_O W_U`` (row convention,
``[d_vocab, d_vocab]``, rank <= ``d_head``) and ``lambda`` its non-zero eigenvalues,

    copying = Re(sum lambda) / sum |lambda|      in [-1, 1]; +1 for a head whose OV circuit only copies.

The non-zero eigenvalues of ``W_E W_V W_O W_U`` are those of the ``d_head x d_head`` core
``W_O (W_U W_E) W_V`` (cyclic permutation), so ``W_U W_E`` (``d_model x d_model``) is built once for all heads
and nothing ``d_vocab``-sized is built per head. LayerNorm and MLPs are ignored (the direct path).
The eigenvalues come from :func:`circuitkit.factored.stable_eigvals` (each core scaled by its largest entry
first), so no finite input, however large or small, reaches LAPACK out of range.
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
        # float64: W_U W_E can span many orders of magnitude; the products are d_model-sized and cheap
        unembed_embed = w.W_U.double() @ w.W_E.double()  # [d_model, d_model]
        core = w.W_O.double() @ unembed_embed @ w.per_query_head("W_V").double()  # [layer, head, d_head, d_head]
        validate.finite_result("copying_scores: core W_O W_U W_E W_V", core, why="weights too large for float64")
        eig = stable_eigvals(core, name="copying_scores: core W_O W_U W_E W_V")
        total = eig.abs().sum(dim=-1)
        score = torch.where(total > 0, eig.real.sum(dim=-1) / total.clamp_min(1e-300), torch.zeros_like(total))
    return validate.finite_result("copying_scores", score.float().cpu())


__all__ = ["copying_scores"]
