"""The corrupted run of path patching and edge attribution: defined in :mod:`circuitkit.detect.corrupt` (head
attribution's integrated gradients redraw the same blocks, and ``detect`` stands below ``circuits``), named here
too, where the edge measurements take it from."""

from __future__ import annotations

from circuitkit.detect.corrupt import (
    COPIES,
    CORRUPTIONS,
    DEFAULT_CORRUPT_SEED,
    Corruption,
    check_mean_over,
    position_mean,
    resampled_batch,
)

__all__ = ["COPIES", "CORRUPTIONS", "DEFAULT_CORRUPT_SEED", "Corruption", "check_mean_over", "position_mean",
           "resampled_batch"]
