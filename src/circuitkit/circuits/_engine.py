"""What path patching and edge attribution share: a :class:`~circuitkit.detect.session.Session` and one corruption.
The session holds the model under the contract, its weights (``W_K`` / ``W_V`` per key/value head, as a task runner
on the session reads them) and the receivers' pre-attention normalisation, the senders' corrupted ``z``, and the clean
activations one measurement leaves for the next on the same batch.

Sender output (row convention): head ``(l1, h1)`` writes ``z[l1][:, :, h1] @ W_O[l1, h1]`` ``[batch, pos,
d_model]`` into the residual stream; its difference ``delta = (z_corrupt - z_clean) @ W_O`` is what an edge
carries. Receiver input: head ``(l2, h2)``'s channel ``c`` reads ``x = norm(resid_pre[l2])`` through
``W_c[l2, h2]`` (``W_K``/``W_V`` of its key/value group); ``norm`` is the model's attention normalisation
(:meth:`~circuitkit.models.adapters.ModelAdapter.attention_norm`) where it has one, else the identity.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from circuitkit import validate
from circuitkit.circuits.corrupt import (
    CORRUPTIONS,
    DEFAULT_CORRUPT_SEED,
    check_mean_over,
    position_mean,
    resampled_batch,
)
from circuitkit.detect.reference import Keep, reference_pass
from circuitkit.detect.session import CorruptKey, EdgeGradients, Session, open_session
from circuitkit.detect.tokens import RepeatedTokens, TokenBatch, as_batch
from circuitkit.graph.pullback import session_norms
from circuitkit.models.adapters import HOOKS, ModelAdapter, ModelSpec, StopForward

Norm = Callable[[Tensor], Tensor]


@dataclass(eq=False)
class Context:
    """A session with one corruption, ready for edge measurements. What it reads of the model is the session's (its
    weights and receivers' norms, read once for every measurement and task runner on the session); what the
    measurements leave (the clean gradients, the corrupted ``z``) is kept in the session too, so a later context on
    the same session finds it."""

    session: Session
    corrupt: str
    corrupt_seed: int
    corrupt_batch: TokenBatch | None = None  # a given corrupted batch (corrupt is then "given")

    @property
    def W_in(self) -> dict[str, Tensor]:
        """Channel -> ``[layer, unit, d_model, d_head]``: ``W_Q`` per query head, ``W_K`` / ``W_V`` per key/value
        head (the session's :meth:`~circuitkit.detect.session.Session.device_weights`)."""
        weights = self.session.device_weights()
        return {"q": weights.W_Q, "k": weights.W_K, "v": weights.W_V}

    @property
    def W_O(self) -> Tensor:
        """``[layer, head, d_head, d_model]``."""
        return self.session.device_weights().W_O

    @property
    def norms(self) -> list[Norm | None]:
        """Each layer's attention norm as the receivers read it (None where it has none): the session's."""
        return session_norms(self.session)

    @property
    def adapter(self) -> ModelAdapter:
        return self.session.adapter

    @property
    def batch(self) -> TokenBatch:
        return self.session.batch

    @property
    def clean(self) -> EdgeGradients | None:
        """What a clean pass with gradients left for later measurements on this batch (the session's)."""
        return self.session.gradients

    @clean.setter
    def clean(self, gradients: EdgeGradients | None) -> None:
        self.session.gradients = gradients

    @property
    def z_corrupt(self) -> dict[int, Tensor]:
        """The senders' corrupted ``z`` by layer, as computed so far under this context's corruption (and at
        :data:`INPUT` the corrupted input embeddings, where a measurement asked for them)."""
        if self.corrupt == "given":
            key: CorruptKey = ("given", id(self.corrupt_batch))
        else:
            key = (self.corrupt, self.corrupt_seed) if self.corrupt == "resample" else (self.corrupt,)
        return self.session.corrupted(key)

    @property
    def spec(self) -> ModelSpec:
        return self.adapter.spec

    @property
    def group_size(self) -> int:
        return self.spec.n_heads // self.spec.n_kv_heads

    def kv_index(self, head: int) -> int:
        return head // self.group_size


def context(
    model: Any,
    tokens: RepeatedTokens | TokenBatch | None,
    corrupt: str | TokenBatch,
    corrupt_seed: int,
    device: str | torch.device | None,
    where: str,
) -> Context:
    """A checked :class:`Context` on a new session for ``model`` (or on the :class:`Session` given): the model's
    weights and receivers' norms are the session's (read once for it, :meth:`Session.device_weights`,
    :func:`~circuitkit.graph.pullback.session_norms`)."""
    session = open_session(model, tokens, device)
    adapter = session.adapter
    if not adapter.additive_heads:
        raise validate.fail(f"{where}: model", validate.given(f"a {adapter.spec.family} model"),
                            "a model whose heads add z @ W_O into the residual stream; in this family a norm sits "
                            "between the attention output and the residual stream, so one head's contribution "
                            "cannot be isolated (head scores, ablation and attribution still apply)")
    batch = session.batch
    corrupt_batch = None
    if isinstance(corrupt, TokenBatch):
        corrupt_batch = as_batch(corrupt, adapter)
        if corrupt_batch.tokens.shape != batch.tokens.shape:
            shape = tuple(batch.tokens.shape)
            raise validate.fail(f"{where}: corrupt", corrupt_batch.tokens, f"a TokenBatch of the clean shape {shape}")
        corrupt = "given"
    else:
        corrupt = validate.option(f"{where}: corrupt", corrupt, (*CORRUPTIONS, "a TokenBatch"))
        if corrupt == "a TokenBatch":
            raise validate.fail(f"{where}: corrupt", corrupt, "'resample', 'mean' or a TokenBatch object")
        if corrupt == "mean":
            check_mean_over(where, batch.tokens.shape[0], "batch", "sequence", "resample")
    corrupt_seed = validate.seed(f"{where}: corrupt_seed", corrupt_seed)
    return Context(session, corrupt, corrupt_seed, corrupt_batch)


INPUT = -1
"""Where a corrupted run's input embeddings are kept among its senders' ``z`` (:attr:`Context.z_corrupt`): layer
-1, where the graph engine puts the input sender."""


def corrupt_z(ctx: Context, clean_z: dict[int, Tensor], layers: Iterable[int], *,
              with_input: bool = False) -> dict[int, Tensor]:
    """The senders' corrupted ``z`` per layer ``[batch, pos, head, d_head]``: from the resampled batch, or the
    clean batch mean at each position (``corrupt="mean"``). Kept in ``ctx``: a later call for the same layers
    runs nothing. ``with_input`` (a resampled or given corruption): the corrupted input embeddings too, kept at
    :data:`INPUT` by the same pass (embedded alone where no pass is left to run)."""
    layers = sorted(set(layers))
    missing = [layer for layer in layers if layer not in ctx.z_corrupt]
    if missing and ctx.corrupt == "mean":
        ctx.z_corrupt.update({layer: position_mean(clean_z[layer]).expand_as(clean_z[layer]) for layer in missing})
    elif missing or (with_input and INPUT not in ctx.z_corrupt):
        corrupted = ctx.corrupt_batch or resampled_batch(ctx.batch, ctx.corrupt_seed)
        keep_input = with_input and INPUT not in ctx.z_corrupt
        with torch.no_grad():
            if missing:  # the pass ends at the last sender's z: later layers and the unembedding are not needed
                _, kept = reference_pass(ctx.adapter, corrupted.tokens, Keep(z=missing, input=keep_input),
                                         stop_after=HOOKS.z(missing[-1]))
                ctx.z_corrupt.update(kept.z)
                if keep_input:
                    ctx.z_corrupt[INPUT] = kept.input
            else:
                ctx.z_corrupt[INPUT] = ctx.adapter.embedded(corrupted.tokens)
    return {layer: ctx.z_corrupt[layer] for layer in layers}


__all__ = ["DEFAULT_CORRUPT_SEED", "INPUT", "Context", "EdgeGradients", "Session", "StopForward", "context",
           "corrupt_z"]
