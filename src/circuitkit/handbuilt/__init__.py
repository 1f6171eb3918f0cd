"""Hand-built circuits: named residual subspaces, heads from explicit matrices, and runnable models.

- :class:`Subspace`, :class:`ResidualLayout` (``build.subspace``): which residual dims mean what.
- :class:`QK`, :class:`OV`, :class:`HeadSpec`, :func:`copy_ov`, :func:`match_qk`, :func:`previous_token_qk`,
  :func:`key_bias_qk`, :class:`PositionCode` (``build.heads``): heads from matrices.
- :func:`assemble`, :func:`assemble_weights` (``build.assembly``): heads -> HeadWeights / AttentionOnlyModel.
- :func:`virtual_head_exercise` (``build.exercises``): Transformer Circuits exercise 1, runnable.
- :func:`induction_circuit`, :func:`repeated_tokens` (``build.induction``): a two-layer induction circuit.
"""

from __future__ import annotations

from circuitkit._lazy import lazy_exports

_LAZY = {
    "Subspace": "circuitkit.handbuilt.subspace",
    "ResidualLayout": "circuitkit.handbuilt.subspace",
    "check_disjoint": "circuitkit.handbuilt.subspace",
    "QK": "circuitkit.handbuilt.heads",
    "OV": "circuitkit.handbuilt.heads",
    "HeadSpec": "circuitkit.handbuilt.heads",
    "PositionCode": "circuitkit.handbuilt.heads",
    "copy_ov": "circuitkit.handbuilt.heads",
    "match_qk": "circuitkit.handbuilt.heads",
    "key_bias_qk": "circuitkit.handbuilt.heads",
    "previous_token_qk": "circuitkit.handbuilt.heads",
    "assemble": "circuitkit.handbuilt.assembly",
    "assemble_weights": "circuitkit.handbuilt.assembly",
    "virtual_head_exercise": "circuitkit.handbuilt.exercises",
    "VirtualHeadExercise": "circuitkit.handbuilt.exercises",
    "previous_token_pattern": "circuitkit.handbuilt.exercises",
    "induction_circuit": "circuitkit.handbuilt.induction",
    "InductionCircuit": "circuitkit.handbuilt.induction",
    "repeated_tokens": "circuitkit.handbuilt.induction",
}
__all__ = sorted(_LAZY)


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
