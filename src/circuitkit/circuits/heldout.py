"""The induction circuit judged on sequences it was not found on: its faithfulness on a second, held-out batch.

Why: the circuit search stops at the smallest head set whose faithfulness reaches the target on the batch it
searches, so that figure is chosen to pass; on fresh sequences the same heads can fall short (MIB separates its
discovery and evaluation splits for this reason). The scan keeps its search batch as it is (its circuit and figures
do not move) and draws an **evaluation batch** of the same spec (block length, copies, sequences, BOS, token range)
with another seed, :func:`evaluation_seed` (the discovery seed plus one), then measures the found heads there::

    faithfulness_eval(C) = (L_all - L_C) / (L_all - L_clean)        on the evaluation batch
    necessity_eval(C)    = L_{not C} - L_clean                     nats

with the ablation of the search (``method``), its values taken from the evaluation batch itself (``"mean"``: its
clean mean ``z``; ``"resample"``: its resampled copy, :func:`circuitkit.circuits.resampled_batch` with the scan's
corrupt seed; ``"zero"``), exactly as :func:`circuitkit.circuits.faithfulness` on that batch defines it. Cost: one
stacked pass of four copies (nothing ablated, every head, every head but the circuit's, only the circuit's; with
``"mean"`` each layer's mean ``z`` is read from the unablated copy in that same pass: that copy's ``z`` at a layer is
the clean run's, since nothing before it is ablated; where four copies do not fit one forward pass, the unablated
copy runs first and the others after it, four copies still), plus one pass for the values with ``"resample"``.
Where ablating every head changes the evaluation batch's
loss by less than :data:`~circuitkit.circuits.faithfulness.MIN_GAP` the faithfulness is ``None`` and ``note`` says
why. A batch given as a built ``TokenBatch`` has no spec to draw from: no evaluation batch (the settings say so).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from circuitkit import validate
from circuitkit.circuits.curve import faithfulness_of, has_gap
from circuitkit.circuits.faithfulness import DEFAULT_CORRUPT_SEED, MIN_GAP, Ablator, ablation_values
from circuitkit.circuits.intervals import head_mask
from circuitkit.detect.ablation import copies_per_forward
from circuitkit.detect.loss import loss_positions, token_losses
from circuitkit.detect.tokens import RepeatedTokens, TokenBatch, as_batch
from circuitkit.models.adapters import HOOKS, ModelAdapter
from circuitkit.ranking import Head
from circuitkit.validate import MAX_SEED

EVALUATION_SEED_OFFSET = 1
"""The evaluation batch's seed is the discovery batch's plus this (wrapping past the largest seed)."""
STACKED_COPIES = 4
"""Copies of the evaluation batch in its one stacked pass."""


def evaluation_seed(seed: int) -> int:
    """The seed of the evaluation batch drawn beside a discovery batch of seed ``seed``."""
    return (seed + EVALUATION_SEED_OFFSET) % (MAX_SEED + 1)


def evaluation_passes(method: str) -> int:
    """Forward passes of the batch the held-out measurement costs (ablation values, then the stacked pass)."""
    return (1 if method == "resample" else 0) + STACKED_COPIES


def evaluation_spec(*, block_len: int, n_repeats: int, batch: int, seed: int, bos: int | None,
                    token_range: tuple[int, int] | None) -> RepeatedTokens:
    """The spec of the evaluation batch: the discovery batch's as built (``bos``: its BOS id, None for none) with
    the seed ``seed``."""
    return RepeatedTokens(block_len=block_len, n_repeats=n_repeats, batch=batch, seed=seed,
                          bos=False if bos is None else bos, token_range=token_range)


def held_out(adapter: ModelAdapter, tokens: RepeatedTokens | TokenBatch, heads: tuple[Head, ...], method: str, *,
             corrupt_seed: int = DEFAULT_CORRUPT_SEED) -> dict[str, Any]:
    """The circuit ``heads`` measured on the evaluation batch ``tokens`` (module docstring): ``{"sequences",
    "seed", "faithfulness", "necessity", "losses": {"clean", "all_ablated", "circuit_only"}, "passes", "note"}``
    (``seed``: None for a built batch)."""
    batch = as_batch(tokens, adapter)
    spec = adapter.spec
    L, H = spec.n_layers, spec.n_heads
    nothing = torch.zeros(L, H, dtype=torch.bool, device="cpu")
    masks = torch.stack([nothing, ~nothing, head_mask(heads, L, H, keep=True), head_mask(heads, L, H, keep=False)])
    if method == "mean":  # the means from the unablated copy of the same pass: no pass of their own
        (clean, all_ablated, kept, only), passes = _with_clean_means(adapter, batch, masks), STACKED_COPIES
    else:
        values, passes = ablation_values(adapter, batch, method, corrupt_seed=corrupt_seed)
        ablator = Ablator(adapter, batch, values)
        clean, all_ablated, kept, only = ablator.losses(masks)
        passes += ablator.passes
    out: dict[str, Any] = {
        "sequences": int(batch.tokens.shape[0]),
        "seed": tokens.seed if isinstance(tokens, RepeatedTokens) else None,
        "faithfulness": None, "necessity": only - clean,
        "losses": {"clean": clean, "all_ablated": all_ablated, "circuit_only": kept},
        "passes": passes, "note": None,
    }
    if not has_gap(clean, all_ablated, MIN_GAP):
        out["note"] = (f"ablating every head changes this batch's loss by only {all_ablated - clean:+.3g} nats (less "
                       f"than {MIN_GAP:g}): no effect for the circuit to reproduce")
    else:
        out["faithfulness"] = faithfulness_of(kept, clean, all_ablated)
    return out


def _with_clean_means(adapter: ModelAdapter, batch: TokenBatch, masks: torch.Tensor) -> list[float]:
    """The repeated-copies loss of each set ``masks`` ``[S, layer, head]`` (set 0 ablates nothing), an ablated
    head's ``z`` replaced by its mean over the batch's sequences and positions in the unablated copy at that layer.
    The first pass stacks as many copies as fit (set 0 among them) and keeps those means; any sets left run after
    it with them (:class:`~circuitkit.circuits.faithfulness.Ablator`). ``S`` copies in all."""
    from circuitkit.detect.node_patching import Patch, patched_logits, unit_mean

    positions = loss_positions(batch)
    S = min(masks.shape[0], copies_per_forward(adapter, batch.tokens, len(positions)))
    means: dict[int, torch.Tensor] = {}

    def clean_mean(layer: int) -> Callable[[torch.Tensor], torch.Tensor]:
        def value(view: torch.Tensor) -> torch.Tensor:  # view [S, B, pos, head, d_head]
            means[layer] = mean = unit_mean(view[0])  # [head, d_head]: copy 0 is unablated, its z the clean z
            return mean
        return value

    patches = [Patch(HOOKS.z(layer), masks[:S, layer], clean_mean(layer)) for layer in range(masks.shape[1])]
    logits = patched_logits(adapter, batch.tokens, S, patches, positions=positions)
    copies = batch.tokens.repeat(S, 1)
    with torch.no_grad():
        losses = token_losses(logits, copies, batch.repeated_copies).view(S, -1).mean(dim=1).cpu()
    first = validate.finite_result("faithfulness", losses, why="the ablated model's logits overflowed")
    rest = Ablator(adapter, batch, means).losses(masks[S:]) if S < masks.shape[0] else []
    return [float(v) for v in first] + rest


__all__ = ["EVALUATION_SEED_OFFSET", "evaluation_passes", "evaluation_seed", "evaluation_spec", "held_out"]
