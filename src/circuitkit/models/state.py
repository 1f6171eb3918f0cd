"""The model's state is the caller's: defined in :mod:`circuitkit.model_state` (below ``weights``, which keeps the
contract too), named here as well, beside the adapters that run the model."""

from __future__ import annotations

from circuitkit.model_state import caller_state, keeps_model_state, module_of, settle, state_of

__all__ = ["caller_state", "keeps_model_state", "module_of", "settle", "state_of"]
