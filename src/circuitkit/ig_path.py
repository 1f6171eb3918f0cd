"""The straight path of integrated gradients: its points and the values along it, one definition for every engine.

Integrated gradients (Sundararajan et al. 2017; on edges, EAP-IG, Hanna et al. 2024) average a gradient over points
``x(alpha) = x' + alpha (x - x')`` of the straight line from a baseline ``x'`` (``alpha = 0``: the corrupted or
ablated value) to the clean value ``x`` (``alpha = 1``). Three sets of points are used:

- ``"left"``: ``alpha = k / m`` for ``k = 0 .. m - 1``, the left Riemann sum (EAP-IG's own points, so MIB's);
- ``"right"``: ``k = 1 .. m``, ending at the clean run (``m = 1`` is plain attribution patching);
- ``"interior"``: ``k = 1 .. m - 1``, for a caller that already holds the gradient at the clean end (the induction
  scan's attribution: its first-order pass is the point ``alpha = 1``).

:func:`along` is the one interpolation, ``x' + alpha (x - x')``, for a batch of points stacked on a new leading
axis; the task runner's EAP-IG and node attribution, the induction attribution's inputs and per-layer paths and the
edge attribution's inputs path all read it. :func:`stacked_inputs` is the hook that moves each stacked copy of a
batch to its point of the inputs path, as the induction engine's head and edge attributions run their points.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from circuitkit import validate

IG_POINTS = ("left", "right")
"""The point sets a user may choose (``scan_task(ig_points=...)``); ``"interior"`` is the engines' own."""
DEFAULT_IG_POINTS = "left"
"""EAP-IG's own points (``get_scores_eap_ig`` in hannamw/EAP-IG ``src/eap/attribute.py``: ``k / steps`` for ``k``
in ``range(0, steps)``), so that scores, and the circuits ranked by them, compare one to one with EAP-IG's and
MIB's. Both are Riemann sums of the same path integral, with errors of the same order."""
_K_RANGE = {"left": (0, -1), "right": (1, 0), "interior": (1, -1)}
"""Per set of points, ``(first k, last k - steps)``: ``k`` runs from the first to ``steps`` plus the second."""


def ig_alphas(steps: int, points: str) -> Tensor:
    """``[n]`` float32 on the CPU: the points ``alpha = k / steps`` of the path where the gradients are taken,
    ``k`` as the module docstring gives it for ``points`` (``n = steps`` for ``"left"`` and ``"right"``, ``steps - 1``
    for ``"interior"``). Each ``k / steps`` is IEEE float32 division, so the same float as Python's ``k / steps``
    rounded to float32 (the quotient of two small integers is never close enough to a rounding midpoint to differ)."""
    steps = validate.integer("integrated gradients: steps", steps, minimum=1)
    validate.option("integrated gradients: points", points, tuple(_K_RANGE))
    first, last = _K_RANGE[points]
    return torch.arange(first, steps + last + 1, dtype=torch.float32, device="cpu") / steps


def along(start: Tensor, end: Tensor, alphas: Tensor | float) -> Tensor:
    """``start + alpha (end - start)``: the path's values at ``alphas``.

    ``alphas``: a float (one point; the result has the broadcast shape of ``start`` and ``end``) or ``[n]`` (points
    stacked on the leading axis: ``start`` and ``end`` each have that axis, of size ``n`` or 1, and the alphas are
    cast to ``end``'s dtype and device first, so that a half-precision run interpolates in its own precision)."""
    if isinstance(alphas, Tensor):
        ndim = max(start.ndim, end.ndim)
        alphas = alphas.to(device=end.device, dtype=end.dtype).view(-1, *([1] * (ndim - 1)))
    return start + alphas * (end - start)


PathStart = Tensor | Callable[[Tensor], Tensor]
"""Where an inputs path starts: the corrupted embeddings, or a function of the clean ones (:func:`stacked_inputs`)."""


def stacked_inputs(alphas: Tensor, base: PathStart) -> Callable[[Tensor, Any], Tensor]:
    """The hook at the input embeddings (``resid_pre`` of layer 0) of a pass that runs ``len(alphas)`` copies of a
    batch stacked on the batch axis, ``x`` ``[copies * batch, pos, d_model]``: copy ``i`` moved to the point
    ``along(start, x_i, alphas[i])`` of the inputs path, ``start`` the corrupted batch's embeddings ``base``
    ``[batch, pos, d_model]``, or where ``base`` is a function, that function of the clean embeddings (every copy
    holds them): the batch mean at each position for the mean corruption
    (:func:`circuitkit.detect.corrupt.position_mean`). The one interpolation of the induction engine's stacked
    points (head attribution's inputs path, edge attribution's)."""

    def interpolate(x: Tensor, hook: Any) -> Tensor:
        copies = x.view(len(alphas), -1, *x.shape[1:])
        start = base(copies[0]) if callable(base) else base.to(x.device, x.dtype)
        return along(start[None], copies, alphas).view_as(x)

    return interpolate


__all__ = ["DEFAULT_IG_POINTS", "IG_POINTS", "PathStart", "along", "ig_alphas", "stacked_inputs"]
