"""The seed exercises on attention, computed and tested.

- :mod:`~circuitkit.theory.attention`: scaled dot-product attention in numpy and torch with causal and
  key-padding masks, multi-head / multi-query / grouped-query attention with einops, KV-cache decoding,
  and kernelised (linear) attention in its O(N^2) and O(N) forms.
- :mod:`~circuitkit.theory.checks`: each exercise's claim as a function returning the measured quantity.
- :mod:`~circuitkit.theory.encodings`: sinusoidal encodings and RoPE.
- :mod:`~circuitkit.theory.rank_collapse`: singular values of a deep pure-attention stack.
- :mod:`~circuitkit.theory.calculators`: Chinchilla, parameter counts, FLOPs, KV-cache size, JL dimension, ...
"""

from __future__ import annotations

from circuitkit.theory import attention, calculators, checks, encodings
from circuitkit.theory import rank_collapse as _rank_collapse_module
from circuitkit.theory.attention import *  # noqa: F403
from circuitkit.theory.calculators import *  # noqa: F403
from circuitkit.theory.checks import *  # noqa: F403
from circuitkit.theory.encodings import *  # noqa: F403
from circuitkit.theory.rank_collapse import *  # noqa: F403  (binds rank_collapse to the function)

# Each module's __all__ is the one list of its public names.
__all__ = [
    *attention.__all__,
    *checks.__all__,
    *encodings.__all__,
    *_rank_collapse_module.__all__,
    *calculators.__all__,
]
