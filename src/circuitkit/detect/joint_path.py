"""The joint path from every node patched to none: the gradient of a metric with respect to each node's gate, and
the quadrature both engines rank their circuit's nodes by.

Every node ``n`` (a head, an MLP, a group of neurons) gets a gate ``g[n]`` between its patched value ``v`` (a mean,
zeros, the corrupted run's activation) and what it computes in the gated run ``x``::

    x_g = v + g (x - v)           on each of the node's units, at its hook, in every layer

so ``g = 0`` everywhere is the run with every node patched and ``g = 1`` everywhere the clean run. Along the joint
path ``g = alpha * 1`` every node is restored together, and a node's share of the change of a metric ``M`` is the
path integral of its gate's gradient::

    share[n] = int_0^1 dM/dg[n] (alpha * 1) d alpha         sum_n share[n] = M(clean) - M(every node patched)

(completeness). A node that matters only beside another (a previous-token head and the induction head that reads
it) is credited while the other is partly there, which a node patched alone from the clean run misses.

:func:`gate_gradients` takes ``dM/dg`` at several ``alpha`` as stacked copies of one forward and one backward
pass; :func:`radau_shares` is the rule both searches use, Gauss-Radau with its fixed node at the clean end.
The induction scan (:func:`circuitkit.circuits.faithfulness.radau_shares`, heads and the loss on the copies) and
the task runner (:meth:`circuitkit.graph.runner.TaskRunner.joint_shares`, every node type and the task's metric)
call them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from circuitkit.detect.attribution import frozen_parameters
from circuitkit.detect.node_patching import groups_of
from circuitkit.models.adapters import ModelAdapter

RADAU_POINTS = (1 / 3, 1.0)
RADAU_WEIGHTS = (0.75, 0.25)
"""The joint path's rule in both circuit searches: Gauss-Radau with its fixed node at the clean end, ``int_0^1 f ~
3/4 f(1/3) + 1/4 f(1)`` (exact for polynomials up to degree 2, as Simpson's rule with one point fewer). Measured
on Qwen2.5-Coder-0.5B (benchmarks/README.md, "Real models at real speed"): this ranking reaches faithfulness 0.8
with 12 heads, two midpoints with 17."""


@dataclass(frozen=True)
class Gate:
    """The gates of one hook: its activation ``x`` ``[B, P, U, ...]`` moves between ``value`` (broadcastable to
    ``[B, P, U, ...]``) and itself; ``nodes``: how many nodes its units split into, a gate each (contiguous groups,
    :func:`~circuitkit.detect.node_patching.groups_of`, as a node patch splits them), None where each unit is a
    node of its own."""

    hook: str
    value: Tensor
    nodes: int | None = None

    def count(self, units: int) -> int:
        """The gates at a hook of ``units`` units."""
        return units if self.nodes is None else self.nodes


def gate_gradients(adapter: ModelAdapter, tokens: Tensor, gates: Sequence[Gate], alphas: Tensor,
                   metric: Callable[[Tensor], Tensor], *, positions: Tensor | None = None) -> list[Tensor | None]:
    """``dM/dg`` ``[points, nodes]`` (float32, CPU) of each gate in ``gates`` with every gate at each of ``alphas``
    ``[points]`` (module docstring), in the order given; None for a gate the metric does not depend on.

    The points run as stacked copies of ``tokens`` ``[B, P]`` (copy-major) in one forward pass, reading the logits at
    ``positions`` (all where None), and one backward pass of ``metric(logits).sum()``, where ``metric`` maps the
    stacked logits to each copy's metric ``[points]``. Parameters are frozen: only the gates are differentiated."""
    B = tokens.shape[0]
    steps = len(alphas)
    leaves: dict[int, Tensor] = {}

    def gated(i: int, gate: Gate) -> Callable[[Tensor, Any], Tensor]:
        def hook(x: Tensor, hook: Any) -> Tensor:
            units = x.shape[2]
            n = gate.count(units)
            g = alphas.to(device=x.device, dtype=x.dtype)[:, None].expand(steps, n).clone()
            g.requires_grad_(True)
            leaves[i] = g
            per_unit = g if n == units else g[:, groups_of(units, n, x.device)]  # [points, U]
            view = x.view(steps, B, *x.shape[1:])
            value = gate.value.to(device=x.device, dtype=x.dtype)
            value = value.view(1, *([1] * (x.dim() - value.dim())), *value.shape)
            shape = (steps, 1, 1, units, *([1] * (x.dim() - 3)))
            return (value + per_unit.view(shape) * (view - value)).reshape(x.shape)

        return hook

    copies = tokens.repeat(steps, 1)
    with frozen_parameters(adapter.model), torch.enable_grad():
        logits = adapter.run(copies, [(gate.hook, gated(i, gate)) for i, gate in enumerate(gates)], positions=positions)
        total = metric(logits).sum()
        order = sorted(leaves)
        grads = torch.autograd.grad(total, [leaves[i] for i in order], allow_unused=True)
    found = dict(zip(order, grads, strict=True))
    return [None if found.get(i) is None else found[i].detach().float().cpu() for i in range(len(gates))]


def radau_shares(inner: Tensor, end: Tensor) -> Tensor:
    """The joint-path shares by :data:`RADAU_POINTS`: ``3/4 g(1/3) + 1/4 g(1)`` of the gates' gradients at the
    inner point and at the clean end (any shape, the same for both)."""
    return RADAU_WEIGHTS[0] * inner + RADAU_WEIGHTS[1] * end


__all__ = ["RADAU_POINTS", "RADAU_WEIGHTS", "Gate", "gate_gradients", "radau_shares"]
