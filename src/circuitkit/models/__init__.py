"""Models circuitkit runs: the hand-buildable attention-only toy model, the TransformerLens bridge, loaders.

- :class:`AttentionOnlyModel` / :class:`ToyConfig` (``models.toy``): a small attention-only transformer that
  runs hand-built or :class:`~circuitkit.HeadWeights` weights, with TransformerLens hook names.
- :func:`to_bridge` (``models.bridge``): the same weights in a TransformerLens ``TransformerBridge``.
- :func:`load_model` (``models.loading``): a bundled zoo name, a local Hugging Face directory, or a
  TransformerLens name, loaded offline where possible.
"""

from __future__ import annotations

from circuitkit._lazy import lazy_exports

_LAZY = {
    "AttentionOnlyModel": "circuitkit.models.toy",
    "ToyConfig": "circuitkit.models.toy",
    "to_bridge": "circuitkit.models.bridge",
    "load_model": "circuitkit.models.loading",
    "HOOKS": "circuitkit.models.adapters",
}
__all__ = sorted(_LAZY)


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
