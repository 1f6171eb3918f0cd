"""Finding induction, previous-token, duplicate-token and copying heads, and checking them causally.

- :mod:`~circuitkit.detect.tokens`: :class:`RepeatedTokens` (the batch spec every entry point takes) and the
  target masks;
- :mod:`~circuitkit.detect.registry`: the score registry (:func:`register`, :func:`pattern_score`,
  :func:`weight_score`): a new score is one definition and appears everywhere;
- :mod:`~circuitkit.detect.scores`: :func:`head_scores` / :class:`HeadScores`;
- :mod:`~circuitkit.detect.weight_scores`: weight-only scores (copying);
- :mod:`~circuitkit.detect.loss`: :func:`induction_loss`;
- :mod:`~circuitkit.detect.clean_run`: the one clean pass shared by the measurements;
- :mod:`~circuitkit.detect.effects`: what ablation and attribution return (:class:`HeadEffects`, :class:`Agreement`);
- :mod:`~circuitkit.detect.corrupt`: the corrupted batch (every copy of the block redrawn);
- :mod:`~circuitkit.detect.ablation`: :func:`ablation_effects` (exact, resumed from the clean residual stream);
- :mod:`~circuitkit.detect.attribution`: :func:`attribution_effects` (first-order, all heads in one backward).
"""

from __future__ import annotations

from circuitkit._lazy import lazy_exports

_LAZY = {
    "RepeatedTokens": "circuitkit.detect.tokens",
    "TokenBatch": "circuitkit.detect.tokens",
    "ScoreDefinition": "circuitkit.detect.registry",
    "pattern_score": "circuitkit.detect.registry",
    "weight_score": "circuitkit.detect.registry",
    "register": "circuitkit.detect.registry",
    "unregister": "circuitkit.detect.registry",
    "registered": "circuitkit.detect.registry",
    "score_names": "circuitkit.detect.registry",
    "HeadScores": "circuitkit.detect.scores",
    "head_scores": "circuitkit.detect.scores",
    "pattern_scores": "circuitkit.detect.scores",
    "copying_scores": "circuitkit.detect.weight_scores",
    "InductionLoss": "circuitkit.detect.loss",
    "induction_loss": "circuitkit.detect.loss",
    "ablation_effects": "circuitkit.detect.ablation",
    "attribution_effects": "circuitkit.detect.attribution",
    "agreement": "circuitkit.detect.agreement",
}
__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)


# The submodule ``agreement`` shares its function's name: once anything imports ``circuitkit.detect.agreement``,
# Python sets the package attribute to the module, shadowing the lazy function. Bind the function itself.
from circuitkit.detect.agreement import agreement  # noqa: E402, F401
