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
    "Subspace": "circuitkit.build.subspace",
    "ResidualLayout": "circuitkit.build.subspace",
    "check_disjoint": "circuitkit.build.subspace",
    "QK": "circuitkit.build.heads",
    "OV": "circuitkit.build.heads",
    "HeadSpec": "circuitkit.build.heads",
    "PositionCode": "circuitkit.build.heads",
    "copy_ov": "circuitkit.build.heads",
    "match_qk": "circuitkit.build.heads",
    "key_bias_qk": "circuitkit.build.heads",
    "previous_token_qk": "circuitkit.build.heads",
    "assemble": "circuitkit.build.assembly",
    "assemble_weights": "circuitkit.build.assembly",
    "virtual_head_exercise": "circuitkit.build.exercises",
    "VirtualHeadExercise": "circuitkit.build.exercises",
    "previous_token_pattern": "circuitkit.build.exercises",
    "induction_circuit": "circuitkit.build.induction",
    "InductionCircuit": "circuitkit.build.induction",
    "repeated_tokens": "circuitkit.build.induction",
}
__all__ = sorted(_LAZY)


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
