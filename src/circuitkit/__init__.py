"""circuitkit: attention-head circuits and induction heads, exactly and fast.

Public API (imported lazily, so ``import circuitkit`` stays cheap and does not import TransformerLens):

- :class:`HeadWeights`: validated per-head weights, the one type every weight analysis consumes.
- QK/OV analysis on factors: :func:`qk_circuit`, :func:`ov_circuit`, :func:`full_qk_circuit`,
  :func:`full_ov_circuit`, :func:`singular_values`, :func:`numerical_rank`, :func:`effective_rank`,
  :func:`frobenius_norm`, :func:`ov_eigenvalues`.
- Composition between heads: :func:`composition_scores`, :func:`composition_baseline`, :func:`top_edges`.
- The two result types: :class:`HeadValues` (a quantity per head ``[layer, head]``) and :class:`EdgeValues` (per
  edge ``[sender, receiver, input]``), each with ``top``, names and ``to_json``; NaN is "not measured".
- The whole pipeline: :func:`scan` -> :class:`Scan` (``.save(dir)``, ``.to_json()``, ``.top(...)``).
- Loading: :func:`load_model` (a zoo name, a local Hugging Face directory, a cached hub name; offline).
- Head detection on repeated random tokens (:class:`RepeatedTokens` is the batch every entry point takes):
  :func:`head_scores`, :func:`induction_loss`, :func:`ablation_effects`, :func:`attribution_effects`;
  scores are a registry (``circuitkit.detect.register``).
- Edge-level causal evidence: :func:`path_patching`, :func:`edge_attribution` (``circuitkit.circuits``).
- The circuit by faithfulness: :func:`find_circuit` -> :class:`Circuit`, :func:`faithfulness`.
- Uncertainty: :func:`bootstrap_ci` (the seeded percentile bootstrap behind every interval a scan reports).
- Training runs: :func:`track` -> :class:`Track` (head scores per checkpoint, the phase change located);
  :func:`load_checkpoint` loads one checkpoint as ``track`` does.
- Circuits of any behaviour: ``circuitkit.tasks`` (clean/corrupted prompt pairs from lists, files or built-in
  generators; node and edge circuits by counterfactual patching); ``scan(model, task=...)``.
- Subpackages: ``circuitkit.handbuilt`` (hand-built circuits), ``circuitkit.tasks``, ``circuitkit.models`` (adapters),
  ``circuitkit.zoo`` (bundled known-answer models), ``circuitkit.viz`` (figures), ``circuitkit.theory``
  (the seed exercises, computed).
"""

from __future__ import annotations

from circuitkit._lazy import lazy_exports
from circuitkit.cpu_threads import prefer_passive_waiting
from circuitkit.errors import CircuitkitError

prefer_passive_waiting()  # as the CLI: torch's idle threads sleep, not spin, where torch is not loaded yet

__version__ = "0.1.0"

# public name -> module that defines it
_LAZY: dict[str, str] = {
    "HeadWeights": "circuitkit.weights",
    "Factored": "circuitkit.factored",
    "qk_circuit": "circuitkit.factored",
    "ov_circuit": "circuitkit.factored",
    "full_qk_circuit": "circuitkit.factored",
    "full_ov_circuit": "circuitkit.factored",
    "singular_values": "circuitkit.factored",
    "numerical_rank": "circuitkit.factored",
    "effective_rank": "circuitkit.factored",
    "frobenius_norm": "circuitkit.factored",
    "ov_eigenvalues": "circuitkit.factored",
    "composition_scores": "circuitkit.composition",
    "composition_baseline": "circuitkit.composition",
    "top_edges": "circuitkit.composition",
    "Edge": "circuitkit.composition",
    "CompositionBaseline": "circuitkit.composition",
    "HeadValues": "circuitkit.results",
    "EdgeValues": "circuitkit.results",
    "RepeatedTokens": "circuitkit.detect.tokens",
    "head_scores": "circuitkit.detect.scores",
    "HeadScores": "circuitkit.detect.scores",
    "induction_loss": "circuitkit.detect.loss",
    "ablation_effects": "circuitkit.detect.ablation",
    "attribution_effects": "circuitkit.detect.attribution",
    "copying_scores": "circuitkit.detect.weight_scores",
    "HeadEffects": "circuitkit.detect.effects",
    "Scan": "circuitkit.scan_types",
    "ScanResult": "circuitkit.scan_record",
    "scan": "circuitkit.pipeline",
    "load_model": "circuitkit.models.loading",
    "path_patching": "circuitkit.circuits.patching",
    "EdgeEffect": "circuitkit.edge_effect",
    "edge_attribution": "circuitkit.circuits.attribution",
    "circuit_evidence": "circuitkit.circuits.evidence",
    "find_circuit": "circuitkit.circuits.faithfulness",
    "faithfulness": "circuitkit.circuits.faithfulness",
    "Circuit": "circuitkit.circuits.faithfulness",
    "CircuitRecord": "circuitkit.circuits.record",
    "track": "circuitkit.tracking", "Track": "circuitkit.tracking", "load_checkpoint": "circuitkit.tracking",
    "bootstrap_ci": "circuitkit.uncertainty",
}
_SUBPACKAGES = {"handbuilt", "circuits", "detect", "models", "zoo", "viz", "theory", "report", "tasks"}

__all__ = ["CircuitkitError", "__version__", *_LAZY, *sorted(_SUBPACKAGES)]


_RENAMED = {"build": "handbuilt"}
"""Former subpackage names still answered as attributes (``from circuitkit import build``)."""

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, _SUBPACKAGES, _RENAMED)
