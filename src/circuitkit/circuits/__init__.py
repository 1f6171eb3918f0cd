"""Edge-level causal evidence: which composition edges between heads actually carry the computation.

Composition scores (:func:`circuitkit.composition_scores`) read edges from the weights; this package checks
them causally, per edge and per channel (the receiver's query, key or value input):

- :mod:`~circuitkit.circuits.edges`: edge specs (:class:`EdgeSpec`) and their validation, the channels;
- :mod:`~circuitkit.circuits.corrupt`: the corrupted run (every copy of the block resampled) and mean corruption;
- :mod:`~circuitkit.circuits.metrics`: the metrics (receiver's induction score, repeated-copies loss, a callable);
- :mod:`~circuitkit.circuits.patching`: :func:`path_patching`, exact (Wang et al. 2022), many edges per pass;
- :mod:`~circuitkit.circuits.attribution`: :func:`edge_attribution`, first-order for all ``[L, H, L, H, 3]``
  edges from one forward and one backward pass (Syed et al. 2023), or with ``steps > 1`` integrated gradients
  over the input embeddings (EAP-IG, Hanna et al. 2024), one more forward and backward pass per step;
- :mod:`~circuitkit.circuits.measures`: the edge-measure registry (:func:`edge_measure`, ``measures.register``):
  a new edge measure is one definition and appears in the evidence table, ``scores.json`` and the report;
- :mod:`~circuitkit.circuits.evidence`: :func:`circuit_evidence`, every registered edge measure side by side;
- :mod:`~circuitkit.circuits.curve`: faithfulness, the gap below which there is nothing to explain
  (:class:`NoBehaviour`) and :class:`CurvePoint`, one definition for the induction circuit and task circuits.
"""

from __future__ import annotations

from circuitkit._lazy import lazy_exports

_LAZY = {
    "CHANNELS": "circuitkit.circuits.edges",
    "EdgeSpec": "circuitkit.circuits.edges",
    "resampled_batch": "circuitkit.circuits.corrupt",
    "METRICS": "circuitkit.circuits.metrics",
    "EdgeEffect": "circuitkit.edge_effect",
    "PathPatching": "circuitkit.circuits.patching",
    "path_patching": "circuitkit.circuits.patching",
    "AttributedEdge": "circuitkit.circuits.attribution",
    "EdgeAttribution": "circuitkit.circuits.attribution",
    "edge_attribution": "circuitkit.circuits.attribution",
    "CircuitEvidence": "circuitkit.circuits.evidence",
    "EdgeEvidence": "circuitkit.circuits.evidence",
    "circuit_evidence": "circuitkit.circuits.evidence",
    "EdgeInputs": "circuitkit.circuits.measures",
    "EdgeMeasure": "circuitkit.circuits.measures",
    "edge_measure": "circuitkit.circuits.measures",
    "Circuit": "circuitkit.circuits.faithfulness",
    "CircuitRecord": "circuitkit.circuits.record",
    "CurvePoint": "circuitkit.circuits.curve",
    "NoBehaviour": "circuitkit.circuits.curve",
    "find_circuit": "circuitkit.circuits.faithfulness",
}
__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
