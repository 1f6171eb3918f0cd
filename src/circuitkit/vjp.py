"""Vector-Jacobian products without ``grad_outputs``.

``torch.autograd.grad(out, x, grad_outputs=c)`` imports torch's symbolic-shapes machinery (and sympy with it) the first
time it is given a tensor cotangent: 0.5-0.7 s of a scan's cold start, for a shape check. The same product is the
gradient of the scalar ``sum(out * c)`` with ``c`` held constant, and the multiplication's backward hands ``c``
itself to ``out``'s graph, so the result is the same to the bit; only one elementwise product more is computed.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def vjp(output: Tensor, inputs: Tensor | Sequence[Tensor], cotangent: Tensor, *, retain_graph: bool = False,
        allow_unused: bool = False) -> tuple[Tensor | None, ...]:
    """``c^T d(output)/d(inputs)`` for each input (as ``torch.autograd.grad(output, inputs, grad_outputs=c)``);
    ``cotangent`` has ``output``'s shape (or broadcasts to it) and is not differentiated."""
    scalar = (output * cotangent.detach()).sum()
    return torch.autograd.grad(scalar, inputs, retain_graph=retain_graph, allow_unused=allow_unused)


__all__ = ["vjp"]
