"""Causal evidence for head scores: the induction loss and the effect of ablating each head on it.

Why: a high induction score says where a head looks, not that the model uses it. On repeated random
tokens the first copy of the block is unpredictable and the later copies are predictable only in context;
the gap between the two losses is the in-context-learning signature, and a head whose ablation raises the
repeated-part loss is one the model relies on for it.

Loss positions. With ``p0`` = 1 if there is a BOS else 0, and block length ``T``, the token at position
``t`` is predicted from position ``t - 1`` with cross-entropy ``-log softmax(logits[t-1])[tokens[t]]``.
``per_position[t - 1]`` is that loss averaged over the batch. The first token of each copy cannot be
predicted by any mechanism (what follows the block's last token is new), so both summaries skip it:

    first_half     mean over t in p0 + 1 .. p0 + T - 1                 (first copy)
    repeated_half  mean over t in p0 + r T + 1 .. p0 + (r + 1) T - 1   for r = 1 .. n_repeats - 1

Ablation replaces one head's ``z`` (``blocks.{l}.attn.hook_z``, ``[batch, pos, head, d_head]``, the head's
output before ``W_O``) with zeros (``"zero"``) or with its mean over the batch and positions of the clean run
(``"mean"``), then measures ``repeated_half``. Heads of a layer are ablated in one forward pass over the batch
copied once per head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from jaxtyping import Float, Int
from torch import Tensor

from circuitkit.detect_tokens import ModelInfo, model_info, repeated_tokens, resolve_bos
from circuitkit.errors import CircuitkitError

AblationMethod = Literal["zero", "mean"]

MAX_SEQUENCES_PER_FORWARD = 512
"""Ablated copies of the batch run together up to this many sequences, to bound memory."""

PROGRESS_MIN_HEADS = 64
"""Show a progress bar by default from this many heads on (small models finish before it would draw)."""


@dataclass(frozen=True)
class InductionLoss:
    """Per-position loss on repeated random tokens and its first- and repeated-copy means (nats)."""

    per_position: Tensor  # [pos - 1]: loss predicting token t, at index t - 1
    first_half: float
    repeated_half: float


@dataclass
class AblationEffects:
    """Repeated-copy loss with each head ablated: ``loss[layer, head]``, ``delta = loss - clean_loss``."""

    clean_loss: float
    loss: Float[Tensor, "layer head"]
    delta: Float[Tensor, "layer head"]
    method: str = "mean"

    def top(self, k: int = 5) -> list[tuple[tuple[int, int], float]]:
        """The ``k`` heads whose ablation raises the loss most, as ``((layer, head), delta)``."""
        flat = self.delta.flatten()
        values, index = flat.topk(min(k, flat.numel()))
        n_heads = self.delta.shape[1]
        return [((int(i) // n_heads, int(i) % n_heads), float(v)) for v, i in zip(values, index, strict=True)]


def _tokens(model: Any, *, seq_len, n_repeats, batch, seed, bos, device) -> tuple[ModelInfo, Tensor, int, int]:
    info = model_info(model, device)
    bos_id = resolve_bos(bos, info)
    tokens = repeated_tokens(
        info,
        seq_len=seq_len,
        n_repeats=n_repeats,
        batch=batch,
        seed=seed,
        bos=False if bos_id is None else bos_id,
    )
    prefix = int(bos_id is not None)
    return info, tokens, (tokens.shape[1] - prefix) // n_repeats, prefix


def _token_losses(logits: Tensor, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos_minus_1"]:
    if logits.ndim != 3 or logits.shape[:2] != tokens.shape:
        raise CircuitkitError(
            f"model returned logits of shape {tuple(logits.shape)}; expected [batch, pos, d_vocab] with "
            f"batch, pos = {tuple(tokens.shape)}."
        )
    logprobs = logits[:, :-1].float().log_softmax(dim=-1)
    return -logprobs.gather(-1, tokens[:, 1:, None])[..., 0]


def _half_masks(pos: int, block: int, prefix: int, n_repeats: int) -> tuple[Tensor, Tensor]:
    """Boolean masks over prediction indices ``t - 1`` (``[pos - 1]``) for the first and repeated copies."""
    t = torch.arange(1, pos)
    offset = t - prefix
    in_copy = offset // block
    inside = (offset % block) != 0  # skip each copy's first token
    first = (in_copy == 0) & inside & (offset >= 0)
    repeated = (in_copy >= 1) & (in_copy < n_repeats) & inside
    return first, repeated


def _logits(model: Any, tokens: Tensor) -> Tensor:
    out = model(tokens)
    return out if isinstance(out, Tensor) else out.logits


def induction_loss(
    model: Any,
    *,
    seq_len: int | None = None,
    n_repeats: int = 2,
    batch: int = 16,
    seed: int = 0,
    bos: int | bool | None = None,
    device: str | torch.device | None = None,
) -> InductionLoss:
    """Loss per position on random repeated tokens (same batch as :func:`circuitkit.head_scores` with the
    same arguments) and its first-copy / repeated-copy means; see the module docstring for the positions."""
    _, tokens, block, prefix = _tokens(
        model, seq_len=seq_len, n_repeats=n_repeats, batch=batch, seed=seed, bos=bos, device=device
    )
    with torch.no_grad():
        losses = _token_losses(_logits(model, tokens), tokens).cpu()
    first, repeated = _half_masks(tokens.shape[1], block, prefix, n_repeats)
    return InductionLoss(
        per_position=losses.mean(dim=0),
        first_half=float(losses[:, first].mean()),
        repeated_half=float(losses[:, repeated].mean()),
    )


def _z_means(model: Any, tokens: Tensor, n_layers: int) -> dict[int, Tensor]:
    """Per layer, each head's ``z`` averaged over batch and positions of the clean run: ``[head, d_head]``."""
    means: dict[int, Tensor] = {}

    def record(z: Tensor, hook: Any) -> None:
        means[int(hook.name.split(".")[1])] = z.mean(dim=(0, 1))

    model.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", record) for layer in range(n_layers)])
    return means


def _ablating_hook(heads: Tensor, replacement: Tensor, batch: int):
    """Copy ``i`` of the batch (rows ``i*batch .. (i+1)*batch``) gets head ``heads[i]`` replaced."""

    def hook(z: Tensor, hook: Any) -> Tensor:
        if z.ndim != 4:
            raise CircuitkitError(
                f"{hook.name} has shape {tuple(z.shape)}; expected [batch, pos, head, d_head] to ablate heads."
            )
        z = z.clone()
        view = z.view(len(heads), batch, *z.shape[1:])
        copies = torch.arange(len(heads), device=z.device)
        view[copies, :, :, heads.to(z.device)] = replacement[heads].to(z.dtype)[:, None, None, :]
        return z

    return hook


def ablation_effects(
    model: Any,
    *,
    method: AblationMethod = "mean",
    seq_len: int | None = None,
    n_repeats: int = 2,
    batch: int = 16,
    seed: int = 0,
    bos: int | bool | None = None,
    device: str | torch.device | None = None,
    progress: bool | None = None,
) -> AblationEffects:
    """Ablate each head in turn (``"zero"`` or ``"mean"``, see the module docstring) and report the
    repeated-copy loss; ``progress`` shows a tqdm bar (default: from :data:`PROGRESS_MIN_HEADS` heads on)."""
    if method not in _METHODS:
        raise CircuitkitError(f"ablation_effects: given method={method!r}; expected one of {sorted(_METHODS)}.")
    if not callable(getattr(model, "run_with_hooks", None)):
        raise CircuitkitError(
            f"ablation_effects: given a {type(model).__name__} without run_with_hooks; expected a model whose "
            "blocks.{l}.attn.hook_z can be replaced (TransformerBridge, AttentionOnlyModel)."
        )
    info, tokens, block, prefix = _tokens(
        model, seq_len=seq_len, n_repeats=n_repeats, batch=batch, seed=seed, bos=bos, device=device
    )
    _, repeated = _half_masks(tokens.shape[1], block, prefix, n_repeats)
    n_batch = tokens.shape[0]
    per_forward = max(1, MAX_SEQUENCES_PER_FORWARD // n_batch)
    loss = torch.empty(info.n_layers, info.n_heads)
    from tqdm.auto import tqdm

    total_heads = info.n_layers * info.n_heads
    show = total_heads >= PROGRESS_MIN_HEADS if progress is None else progress
    with torch.no_grad():
        clean = float(_token_losses(_logits(model, tokens), tokens).cpu()[:, repeated].mean())
        replacements = _METHODS[method](model, tokens, info)
        with tqdm(total=total_heads, disable=not show, desc="ablating heads") as bar:
            for layer in range(info.n_layers):
                for start in range(0, info.n_heads, per_forward):
                    heads = torch.arange(start, min(start + per_forward, info.n_heads))
                    hook = _ablating_hook(heads, replacements[layer], n_batch)
                    logits = model.run_with_hooks(
                        tokens.repeat(len(heads), 1), fwd_hooks=[(f"blocks.{layer}.attn.hook_z", hook)]
                    )
                    losses = _token_losses(logits, tokens.repeat(len(heads), 1)).cpu()[:, repeated]
                    loss[layer, heads] = losses.view(len(heads), -1).mean(dim=1)
                    bar.update(len(heads))
    return AblationEffects(clean_loss=clean, loss=loss, delta=loss - clean, method=method)


def _zero_replacements(model: Any, tokens: Tensor, info: ModelInfo) -> dict[int, Tensor]:
    d_head = getattr(model.cfg, "d_head", None)
    if d_head is None:
        raise CircuitkitError("ablation_effects: model.cfg has no d_head; expected TransformerLens config fields.")
    return {layer: torch.zeros(info.n_heads, d_head, device=tokens.device) for layer in range(info.n_layers)}


def _mean_replacements(model: Any, tokens: Tensor, info: ModelInfo) -> dict[int, Tensor]:
    return _z_means(model, tokens, info.n_layers)


_METHODS = {"zero": _zero_replacements, "mean": _mean_replacements}
