"""One checkpoint measured: every head's scores, the in-context learning score and the top composition edges.

Cost per checkpoint: **one forward pass** over the token batch (the pattern scores ride on it as hooks, the
per-token losses come from its logits) plus weight-only work (composition scores of every head pair in Q, K and V
mode, and the registry's weight scores), no backward pass.

The **in-context learning score** (Olsson et al. 2022) on repeated random tokens: the mean loss on the first copy
of the block minus the mean loss on the repeated copies (nats per token, natural-log cross-entropy; positions as
in :mod:`circuitkit.detect.tokens`). The first copy is unpredictable, so a model that learns in context has a
large positive score; an untrained model scores about 0.
"""

from __future__ import annotations

from typing import Any

import torch

from circuitkit.detect.clean_run import clean_run
from circuitkit.detect.loss import summarise
from circuitkit.detect.roles import DEFAULT_ROLES, called_heads
from circuitkit.detect.scores import PatternCollector
from circuitkit.detect.tokens import TokenBatch
from circuitkit.models.adapters import ModelAdapter
from circuitkit.ranking import head_name

COMPOSITION_MODES = ("Q", "K", "V")
CALLED = tuple(dict.fromkeys(role.score for role in DEFAULT_ROLES))
"""The scores whose called heads (the scan's rule, :func:`circuitkit.detect.roles.called_heads`) each record keeps:
those of the scan's default roles."""
DIGITS = 6
"""Decimals kept in the JSON records (scores and losses are float32: ~7 significant digits)."""


def architecture(adapter: ModelAdapter) -> dict[str, Any]:
    """The shape and family every checkpoint of one track must share (two families of one shape differ in what
    their heads compute: a Llama and a GPT-NeoX checkpoint are not one training run)."""
    spec = adapter.spec
    family = str(spec.family)
    model_type = getattr(getattr(adapter, "hf_config", None), "model_type", None)
    if isinstance(model_type, str) and model_type:  # Llama, Mistral and Qwen2 share one bridge family entry
        family = f"{family} [{model_type}]"
    return {"n_layers": spec.n_layers, "n_heads": spec.n_heads, "d_model": spec.d_model, "d_head": spec.d_head,
            "d_vocab": spec.d_vocab, "n_ctx": spec.n_ctx, "n_kv_heads": spec.n_kv_heads, "family": family}


def _round(value: float) -> float:
    return round(float(value), DIGITS)


def _nested(tensor: torch.Tensor) -> list:
    return [[_round(v) if v == v else None for v in row] for row in tensor.tolist()]


def measure(adapter: ModelAdapter, batch: TokenBatch, *, keep: tuple[str, ...] | None, top_k: int) -> dict[str, Any]:
    """The measured part of a checkpoint's record (see :mod:`circuitkit.tracking.record` for the full record)."""
    collector = PatternCollector(adapter, batch)
    run = clean_run(adapter, batch, extra_hooks=collector.hooks())  # the one forward pass
    scores = collector.result()
    loss = summarise(run.losses, batch)
    names = [name for name in scores if keep is None or name in keep or name in CALLED]
    return {
        "icl_score": _round(loss.first_copy - loss.repeated_copies),
        "first_copy_loss": _round(loss.first_copy),
        "repeated_loss": _round(loss.repeated_copies),
        "loss_per_position": [_round(v) for v in loss.per_position.tolist()],
        "scores": {name: _nested(scores[name]) for name in names},
        "called": {name: [head_name(h) for h in called_heads(scores, name)] for name in CALLED},
        "top_edges": _edges(adapter, top_k),
    }


def _edges(adapter: ModelAdapter, top_k: int) -> dict[str, list]:
    """``mode -> [[src "layer.head", dst "layer.head", score], ...]``, strongest first (none for one layer)."""
    from circuitkit.composition import composition_scores, top_edges

    if adapter.spec.n_layers < 2 or top_k == 0:
        return {}
    weights = adapter.weights(embeddings=False)
    return {
        mode: [[head_name(e.src), head_name(e.dst), _round(e.score)]
               for e in top_edges(composition_scores(weights, mode).float().cpu(), k=top_k)]
        for mode in COMPOSITION_MODES
    }


__all__ = ["COMPOSITION_MODES", "architecture", "measure"]
