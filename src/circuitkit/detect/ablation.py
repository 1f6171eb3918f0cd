"""Exact ablation: the rise of the repeated-copies loss when one head is removed.

Why: the causal check behind a head score. A head whose ablation raises the repeated-copies loss is one the
model relies on for in-context copying.

Ablation replaces one head's ``z`` (``blocks.{l}.attn.hook_z``, ``[batch, pos, head, d_head]``, the head's
output before ``W_O``) with zeros (``"zero"``) or with its mean over the batch and positions of the clean run
(``"mean"``), and measures the mean loss over the repeated copies (positions in :mod:`circuitkit.detect.tokens`).
``effect = ablated - clean`` (nats).

Cost. Heads of one layer are ablated in one forward pass over the batch copied once per head (up to
:data:`MAX_SEQUENCES_PER_FORWARD` sequences). Where the model can resume from a residual stream
(``ModelAdapter.can_resume``: TransformerBridge, the toy model), the pass for layer ``l`` starts at layer ``l``
from the clean residual stream saved by the one clean pass, instead of recomputing layers ``0 .. l-1``
(ablating a head of layer ``l`` changes nothing before it, so the result is the same to float tolerance). Each
pass is the one node-patching pass of every engine (:func:`circuitkit.detect.node_patching.patched_logits`), copy
``i`` patching head ``i`` of the chunk.
Only the heads asked for are ablated (``heads=``): :func:`circuitkit.scan` ablates the heads attribution
ranks first plus the detected circuit, not all of them.

The loss is read only at the repeated copies, and the ablated passes compute logits only there
(:func:`circuitkit.detect.loss.loss_positions`: the model unembeds 19 of the default batch's 41 positions), but at
each of those positions over the full vocabulary: ``loss = logsumexp(logits) - logit[next]``, and the normaliser
``logsumexp`` needs every one of the ``d_vocab`` logits, so the unembedding and the log-softmax cannot be narrowed
to the target tokens without changing the loss.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

import torch
from torch import Tensor

from circuitkit import validate
from circuitkit.detect.clean_run import CleanRun
from circuitkit.detect.effects import HeadEffects
from circuitkit.detect.loss import loss_positions, token_losses
from circuitkit.detect.node_patching import Patch, patched_logits
from circuitkit.detect.session import open_session
from circuitkit.detect.tokens import RepeatedTokens, TokenBatch
from circuitkit.models.adapters import HOOKS, ModelAdapter
from circuitkit.models.state import keeps_model_state
from circuitkit.pass_budget import copies_per_pass
from circuitkit.ranking import Head

AblationMethod = Literal["zero", "mean"]
ABLATION_METHODS = ("mean", "zero")

MAX_SEQUENCES_PER_FORWARD = 512
"""Ablated copies of the batch run together up to this many sequences, to bound memory..."""
MAX_LOGIT_BYTES = 256 * 2**20
"""...and only as many as keep one pass's float32 logits ``[sequences, positions, d_vocab]`` under this (at
vocabulary 50k, 16 sequences at 19 positions are 61 MB: larger passes only thrash memory)."""

PROGRESS_MIN_HEADS = 64
"""Show a progress bar by default from this many ablated heads on (small models finish before it would draw)."""


def copies_per_forward(adapter: ModelAdapter, tokens: Tensor, positions: int | None = None) -> int:
    """How many copies of the batch ``tokens`` ``[batch, pos]`` one forward pass stacks: at most
    :data:`MAX_SEQUENCES_PER_FORWARD` sequences and :data:`MAX_LOGIT_BYTES` of float32 logits at ``positions``
    positions per sequence (default: every position) (at least one)."""
    per_copy = tokens.shape[0] * (tokens.shape[1] if positions is None else positions) * adapter.spec.d_vocab * 4
    return copies_per_pass(per_copy, MAX_LOGIT_BYTES, sequences=tokens.shape[0],
                           max_sequences=MAX_SEQUENCES_PER_FORWARD)


def check_heads(heads: Any, n_layers: int, n_heads: int, where: str) -> list[Head]:
    """``heads`` as a sorted list of distinct ``(layer, head)`` pairs inside the model; ``None``: every head.
    Any iterable is read, at most ``L x H`` entries of it (a longer one, or an endless iterator, is refused)."""
    if heads is None:
        return [(layer, head) for layer in range(n_layers) for head in range(n_heads)]
    items = validate.bounded_list(f"{where}: heads", heads, n_layers * n_heads,
                                  "an iterable of (layer, head) pairs, or None for every head",
                                  why=f"L x H = {n_layers} x {n_heads} heads")
    out = set()
    for item in items:
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise validate.fail(f"{where}: heads", item, "a (layer, head) pair")
        layer = validate.integer(f"{where}: heads layer", item[0], minimum=0, maximum=n_layers - 1)
        head = validate.integer(f"{where}: heads head", item[1], minimum=0, maximum=n_heads - 1)
        out.add((layer, head))
    return sorted(out)


def replacements(adapter: ModelAdapter, run: CleanRun, method: str) -> dict[int, Tensor]:
    """Per layer, what each head's ``z`` is replaced with: ``[head, d_head]`` (zeros, or the clean mean)."""
    spec = adapter.spec
    if method == "mean":
        return run.z_means
    return {layer: torch.zeros(spec.n_heads, spec.d_head) for layer in range(spec.n_layers)}


def ablate(
    adapter: ModelAdapter,
    run: CleanRun,
    heads: list[Head],
    method: str,
    *,
    resume: bool = True,
    progress: Any = None,
) -> HeadEffects:
    """Ablate ``heads`` exactly, reusing the clean pass ``run`` (which must hold ``z_means`` for ``"mean"`` and
    ``resid_pre`` for every ablated layer when resuming). ``progress(n)`` is told how many heads finished."""
    spec = adapter.spec
    batch = run.batch
    tokens = batch.tokens
    repeated = batch.repeated_copies
    n_batch = tokens.shape[0]
    at = loss_positions(batch)
    per_forward = copies_per_forward(adapter, tokens, len(at))
    values = replacements(adapter, run, method)
    effect = torch.full((spec.n_layers, spec.n_heads), float("nan"), device="cpu")
    exact = torch.zeros(spec.n_layers, spec.n_heads, dtype=torch.bool, device="cpu")
    clean = run.repeated_loss
    clean_each = run.repeated_per_sequence
    per_sequence = torch.full((n_batch, spec.n_layers, spec.n_heads), float("nan"), device="cpu")
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        by_layer.setdefault(layer, []).append(head)
    resume = resume and adapter.can_resume
    with torch.no_grad():
        for layer, layer_heads in sorted(by_layer.items()):
            for start in range(0, len(layer_heads), per_forward):
                chunk = torch.tensor(layer_heads[start : start + per_forward], device="cpu")
                # copy i ablates head chunk[i]: the one node-patching pass, resumed at the layer where it can
                one_each = torch.zeros(len(chunk), spec.n_heads, dtype=torch.bool, device="cpu")
                one_each[torch.arange(len(chunk), device="cpu"), chunk] = True
                copies = tokens.repeat(len(chunk), 1)
                logits = patched_logits(adapter, tokens, len(chunk), [Patch(HOOKS.z(layer), one_each, values[layer])],
                                        positions=at, resume=(run.resid_pre[layer], layer)
                                        if resume and layer > 0 else None)
                losses = token_losses(logits, copies, repeated).cpu()
                effect[layer, chunk] = losses.view(len(chunk), -1).mean(dim=1) - clean
                each = losses.view(len(chunk), n_batch, -1).mean(dim=2) - clean_each  # [heads, batch]
                per_sequence[:, layer, chunk] = each.T
                exact[layer, chunk] = True
                if progress is not None:
                    progress(len(chunk))
    validate.finite_result("ablation_effects", effect[exact], why="the ablated model's logits overflowed")
    return HeadEffects(kind="ablation", method=method, clean_loss=clean, effect=effect, exact=exact,
                       per_sequence=per_sequence)


def together_cost(heads: list[Head], n_layers: int, run: CleanRun, adapter: ModelAdapter) -> float:
    """Forward passes :func:`ablate_together` spends on ``heads``: one, or ``(L - l) / L`` resumed at layer ``l``."""
    first = min(layer for layer, _ in heads)
    resumed = adapter.can_resume and first > 0 and first in run.resid_pre
    return (n_layers - first) / n_layers if resumed else 1.0


def ablate_together(adapter: ModelAdapter, run: CleanRun, heads: list[Head], method: str) -> float:
    """The rise of the repeated-copies loss when all ``heads`` are ablated at once (one forward pass, resumed at the
    first ablated layer where ``run`` saved its residual stream): what removing a whole circuit does, which
    single-head effects do not add up to when heads back each other up."""
    return ablate_together_each(adapter, run, heads, method)[0]


def ablate_together_each(adapter: ModelAdapter, run: CleanRun, heads: list[Head], method: str
                         ) -> tuple[float, Tensor]:
    """:func:`ablate_together` and each sequence's rise ``[batch]`` (their mean is the rise) from the same pass."""
    if not heads:
        raise validate.fail("ablate_together: heads", heads, "at least one (layer, head)")
    values = replacements(adapter, run, method)
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        by_layer.setdefault(layer, []).append(head)

    def together(chosen: list[int]) -> Tensor:  # [1, head]: one copy ablating every chosen head of a layer
        mask = torch.zeros(1, adapter.spec.n_heads, dtype=torch.bool, device="cpu")
        mask[0, chosen] = True
        return mask

    patches = [Patch(HOOKS.z(layer), together(chosen), values[layer]) for layer, chosen in sorted(by_layer.items())]
    first = min(by_layer)
    at = loss_positions(run.batch)
    resumed = together_cost(heads, adapter.spec.n_layers, run, adapter) < 1.0
    logits = patched_logits(adapter, run.batch.tokens, 1, patches, positions=at,
                            resume=(run.resid_pre[first], first) if resumed else None)
    losses = token_losses(logits, run.batch.tokens, run.batch.repeated_copies).cpu()
    rise = float(validate.finite_result("ablate_together", losses.mean())) - run.repeated_loss
    return rise, losses.float().mean(dim=1) - run.repeated_per_sequence


@keeps_model_state
def ablation_effects(
    model: Any,
    tokens: RepeatedTokens | TokenBatch | None = None,
    *,
    method: AblationMethod = "mean",
    heads: Iterable[Head] | None = None,
    resume: bool = True,
    device: str | torch.device | None = None,
    progress: bool | None = None,
) -> HeadEffects:
    """Ablate each head in ``heads`` (default: every head) and report the rise of the repeated-copies loss.

    Returns :class:`~circuitkit.scan_types.HeadEffects` with ``effect[layer, head]`` (NaN for heads not
    ablated), ``exact`` (which were), ``clean_loss``; ``.delta`` is ``effect``, ``.loss`` is ``clean + effect``.
    ``resume=False`` forces full forward passes (the reference the resumed passes are tested against);
    ``progress`` shows a tqdm bar (default: from :data:`PROGRESS_MIN_HEADS` heads on).
    """
    method = validate.option("ablation_effects: method", method, ABLATION_METHODS)
    resume = validate.boolean("ablation_effects: resume", resume)
    if progress is not None:
        validate.boolean("ablation_effects: progress", progress)
    session = open_session(model, tokens, device)
    adapter, spec = session.adapter, session.spec
    chosen = check_heads(heads, spec.n_layers, spec.n_heads, "ablation_effects")
    layers = {layer for layer, _ in chosen} if resume and adapter.can_resume else set()
    run = session.clean_run(z_means=method == "mean", resid_layers=layers)
    from tqdm.auto import tqdm

    show = len(chosen) >= PROGRESS_MIN_HEADS if progress is None else progress
    with tqdm(total=len(chosen), disable=not show, desc="ablating heads") as bar:
        return ablate(adapter, run, chosen, method, resume=resume, progress=bar.update)


__all__ = [
    "ABLATION_METHODS",
    "AblationMethod",
    "ablate",
    "ablate_together",
    "ablation_effects",
    "check_heads",
    "replacements",
    "together_cost",
]
