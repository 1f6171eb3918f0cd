"""Transformer Circuits exercise 1, built and run: a virtual attention head from two previous-token heads.

Residual stream of 16 dims, heads of 4 (layout: ``input`` 0-7, ``head1`` 8-11, ``head2`` 12-15):

- head 1 (layer 0) copies dims 0-3 of the previous token to 8-11;
- head 2 (layer 1) copies dims 4-6 of the previous token to 12-14 and dim 8 to 15. Dim 8 at the previous
  token was written there by head 1 from dim 0 of the token before it, so dim 15 ends up holding dim 0 from
  *two* tokens back: a "virtual attention head" no single head implements.

Row convention (TransformerLens, ``x @ W``; ``W_V: [16, 4]``, ``W_O: [4, 16]``), ``E[a, b]`` the unit matrix::

    W_net1 = W_V1 @ W_O1 = E[0,8] + E[1,9] + E[2,10] + E[3,11]          # rank 4: dims 0-3 -> 8-11
    W_net2 = W_V2 @ W_O2 = E[4,12] + E[5,13] + E[6,14] + E[8,15]        # rank 4: dims 4-6 -> 12-14, 8 -> 15
    two_token = W_net1 @ W_net2 = E[0,15]                               # rank 1: dim 0 -> 15, two tokens back
    one_token = W_net1 + W_net2                                         # the paths one token back

With ``P`` the previous-token pattern (``P[t, t-1] = 1``) both heads use, the two layers expand exactly into
``out = x + P x (W_net1 + W_net2) + P^2 x (W_net1 @ W_net2)`` (:meth:`VirtualHeadExercise.paths`).

The exercise writes column vectors (``W x``): ``W_net^1 = W_out^1 W_V^1`` with ``W_V^1: [4, 16]``,
``W_out^1: [16, 4]``, two-token copy ``W_net^2 W_net^1``, one-token copy ``W_net^2 I + I W_net^1``. These
are the transposes of the matrices above (:attr:`VirtualHeadExercise.column`); entry ``[out, in]`` instead
of ``[in, out]``, the same ranks and singular values.

**Capacity.** Each head has ``d_head = 4`` value dimensions, 8 in all. Seven of them read dims of the token
itself (0-3 in head 1, 4-6 in head 2): one-token copying. One (head 2's dim reading 8) reads what head 1
wrote: two-token copying. So the pair spends 7/8 of its capacity on one task and 1/8 on another, where an
ordinary head gives all of its capacity to one pattern. The 1/8 buys a whole "attend two back" head's worth
of behaviour for one dimension, because head 1's copy of dim 0 does double duty (:meth:`capacity`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from circuitkit import validate
from circuitkit.errors import CircuitkitError, describe
from circuitkit.handbuilt import limits
from circuitkit.handbuilt.assembly import assemble
from circuitkit.handbuilt.heads import OV, HeadSpec, copy_ov
from circuitkit.handbuilt.subspace import ResidualLayout
from circuitkit.models.toy import AttentionOnlyModel, ToyHook

D_MODEL = 16
D_HEAD = 4


def previous_token_pattern(n_pos: int, dtype: torch.dtype = torch.float32) -> Float[Tensor, "pos pos"]:
    """``[pos, pos]`` with ``P[t, t-1] = 1``; row 0 is all zero (position 0 has no previous token).

    ``n_pos`` is an int in ``[1, MAX_POSITIONS]`` (:mod:`circuitkit.handbuilt.limits`); ``dtype`` a floating dtype.
    """
    n_pos = limits.positions("previous_token_pattern: n_pos", n_pos)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise validate.fail("previous_token_pattern: dtype", dtype, "a floating torch.dtype such as torch.float32")
    return torch.diag(torch.ones(n_pos - 1, dtype=dtype), diagonal=-1)


@dataclass(frozen=True)
class ColumnConvention:
    """The exercise's matrices in its column-vector convention (each the transpose of the row-convention one)."""

    W_V1: Float[Tensor, "4 16"]
    W_out1: Float[Tensor, "16 4"]
    W_V2: Float[Tensor, "4 16"]
    W_out2: Float[Tensor, "16 4"]

    @property
    def W_net1(self) -> Float[Tensor, "16 16"]:
        """``W_out^1 W_V^1``: entry ``[out, in]``."""
        return self.W_out1 @ self.W_V1

    @property
    def W_net2(self) -> Float[Tensor, "16 16"]:
        return self.W_out2 @ self.W_V2

    @property
    def two_token(self) -> Float[Tensor, "16 16"]:
        """``W_net^2 W_net^1``."""
        return self.W_net2 @ self.W_net1

    @property
    def one_token(self) -> Float[Tensor, "16 16"]:
        """``W_net^2 I + I W_net^1``."""
        return self.W_net2 + self.W_net1


@dataclass(frozen=True, eq=False)
class VirtualHeadExercise:
    """The two heads of exercise 1 in row convention, their products, and a runnable two-layer model.

    See the module docstring for the matrices and the 7/8 vs 1/8 capacity split.
    """

    W_V1: Float[Tensor, "16 4"]
    W_O1: Float[Tensor, "4 16"]
    W_V2: Float[Tensor, "16 4"]
    W_O2: Float[Tensor, "4 16"]
    layout: ResidualLayout

    @property
    def W_net1(self) -> Float[Tensor, "16 16"]:
        return self.W_V1 @ self.W_O1

    @property
    def W_net2(self) -> Float[Tensor, "16 16"]:
        return self.W_V2 @ self.W_O2

    @property
    def two_token(self) -> Float[Tensor, "16 16"]:
        """``W_net1 @ W_net2``: the virtual head, rank 1, only dim 0 -> dim 15."""
        return self.W_net1 @ self.W_net2

    @property
    def one_token(self) -> Float[Tensor, "16 16"]:
        """``W_net1 + W_net2``: what moves exactly one token forward."""
        return self.W_net1 + self.W_net2

    @property
    def column(self) -> ColumnConvention:
        """The same heads in the exercise's column convention (``W_V^1 = W_V1.T`` etc.)."""
        return ColumnConvention(self.W_V1.T, self.W_O1.T, self.W_V2.T, self.W_O2.T)

    @cached_property
    def model(self) -> AttentionOnlyModel:
        """The two heads as a 2-layer, 1-head model on residual inputs (its QK weights are zero; :meth:`run`
        fixes both patterns to the previous token)."""
        return assemble(
            [[HeadSpec(ov=OV(self.W_V1, self.W_O1), name="head 1")],
             [HeadSpec(ov=OV(self.W_V2, self.W_O2), name="head 2")]],
            d_model=D_MODEL, d_head=D_HEAD,
        )

    def capacity(self) -> dict[str, float]:
        """Fractions of the heads' value dimensions spent on one-token and on two-token copying.

        A value dimension reading the ``input`` subspace copies the previous token's own content (one token
        back); one reading a subspace an earlier head writes (``head1``) copies something that was already
        one token old (two back). Counted as ranks of ``W_V``'s row blocks: ``{"one_token": 7/8, "two_token": 1/8}``.
        """
        inputs = list(self.layout["input"].dims)
        written = list(self.layout["head1"].dims)
        one = sum(int(torch.linalg.matrix_rank(W[inputs])) for W in (self.W_V1, self.W_V2))
        two = int(torch.linalg.matrix_rank(self.W_V2[written]))
        total = 2 * D_HEAD
        return {"one_token": one / total, "two_token": two / total}

    def run(self, x: Float[Tensor, "batch pos 16"]) -> Float[Tensor, "batch pos 16"]:
        """The final residual stream after both heads, each attending to the previous token.

        For inputs with dims 8-15 zero, positions ``t >= 2`` get ``[8:12] = x[t-1, 0:4]``,
        ``[12:15] = x[t-1, 4:7]``, ``[15] = x[t-2, 0]``; dims 0-7 pass through unchanged.
        """
        x = _residual_input("VirtualHeadExercise.run", x)
        pattern = previous_token_pattern(x.shape[1], dtype=self.model.head_weights().dtype)

        def fix_pattern(scores_pattern: Tensor, hook: ToyHook) -> Tensor:
            return pattern.expand_as(scores_pattern)

        return self.model.run_with_hooks(x, fwd_hooks=[(lambda name: name.endswith("hook_pattern"), fix_pattern)])

    def paths(self, x: Float[Tensor, "batch pos 16"]) -> dict[str, Tensor]:
        """The path expansion of :meth:`run`: ``direct = x``, ``one_token = P x (W_net1 + W_net2)``,
        ``two_token = P^2 x (W_net1 @ W_net2)``; they sum to ``run(x)`` for every ``x``."""
        x = _residual_input("VirtualHeadExercise.paths", x)
        P = previous_token_pattern(x.shape[1], dtype=x.dtype)
        return {
            "direct": x,
            "one_token": torch.einsum("qk,bkm->bqm", P, x) @ self.one_token.to(x.dtype),
            "two_token": torch.einsum("qk,bkm->bqm", P @ P, x) @ self.two_token.to(x.dtype),
        }


def _residual_input(name: str, x: Any) -> Tensor:
    """``x`` checked: a finite float tensor ``[batch, pos, 16]`` with at least one position."""
    if not isinstance(x, Tensor) or x.ndim != 3 or x.shape[-1] != D_MODEL or not x.is_floating_point():
        raise CircuitkitError(f"{name}: given {describe(x)}; expected a float tensor [batch, pos, {D_MODEL}].")
    if x.shape[1] == 0:
        raise CircuitkitError(f"{name}: given {describe(x)}; expected at least one position.")
    return validate.tensor(f"{name}: x", x, finite=True)


def virtual_head_exercise() -> VirtualHeadExercise:
    """Build exercise 1's two heads (see the module docstring) from named subspaces."""
    layout = ResidualLayout(D_MODEL, {"input": range(0, 8), "head1": range(8, 12), "head2": range(12, 16)})
    inputs, head1, head2 = layout["input"], layout["head1"], layout["head2"]
    ov1 = copy_ov(inputs[0:4], head1, d_head=D_HEAD)                 # dims 0-3 -> 8-11
    ov2 = copy_ov(inputs[4:7] + head1[0], head2, d_head=D_HEAD)      # dims 4,5,6,8 -> 12,13,14,15
    return VirtualHeadExercise(W_V1=ov1.W_V, W_O1=ov1.W_O, W_V2=ov2.W_V, W_O2=ov2.W_O, layout=layout)
