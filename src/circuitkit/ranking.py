"""Ranking heads and naming them: the one top-k and the one head name every module uses.

Why: a ranking has to say what it does with ties and NaN. Here: highest first (or by absolute value), ties
broken by position in the flattened tensor (``(layer, head)`` order, i.e. stable), NaN always last. A head is
named ``"layer.head"`` (``"1.3"``), as in the Framework paper's figures.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from circuitkit import validate

Head = tuple[int, int]


def head_name(head: Sequence[int]) -> str:
    """``(layer, head)`` -> ``"layer.head"``."""
    layer, index = head
    return f"{int(layer)}.{int(index)}"


def top_indices(values: Tensor, k: int, *, absolute: bool = False, largest: bool = True) -> list[tuple[int, float]]:
    """The ``k`` best flat indices of ``values`` as ``(index, value)``: descending (``largest``) or ascending,
    by ``|value|`` when ``absolute`` (the value returned keeps its sign). Ties keep flat order; NaN last."""
    k = validate.positive_int("k", k)
    flat = values.detach().reshape(-1).to("cpu", torch.float64)
    key = flat.abs() if absolute else flat
    key = -key if largest else key
    # two stable sorts (torch's, in C: a Python sort of the 219k edges of a 30-layer model took 0.1 s each): by
    # the key, then NaN last; stability keeps flat order among ties
    order = torch.sort(torch.where(flat.isnan(), 0.0, key), stable=True).indices
    order = order[torch.sort(flat.isnan()[order].to(torch.uint8), stable=True).indices][:k].tolist()
    return [(i, float(flat[i])) for i in order]


def unravel(index: int, shape: Sequence[int]) -> tuple[int, ...]:
    """The position of flat (row-major) ``index`` in a tensor of ``shape``: ``unravel(7, (2, 4)) == (1, 3)``."""
    out = []
    for size in reversed(shape):
        index, position = divmod(int(index), int(size))
        out.append(position)
    return tuple(reversed(out))


def top_heads(
    scores: Tensor, k: int, *, absolute: bool = False, largest: bool = True
) -> list[tuple[Head, float]]:
    """The ``k`` best heads of a ``[layer, head]`` tensor as ``((layer, head), value)``, best first
    (see :func:`top_indices` for ties and NaN)."""
    scores = validate.tensor("scores", scores, ndim=2)
    n_heads = scores.shape[1]
    top = top_indices(scores, k, absolute=absolute, largest=largest)
    return [(unravel(i, (scores.shape[0], n_heads)), v) for i, v in top]


__all__ = ["Head", "head_name", "top_heads", "top_indices", "unravel"]
