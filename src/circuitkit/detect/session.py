"""One measurement session: the adapted model, the batch and every cache a measurement reads, each made once. Both
engines hold a model through it: the induction scan's measurements on its batch, path patching's and edge
attribution's :class:`~circuitkit.circuits._engine.Context` on it, and every
:class:`~circuitkit.graph.runner.TaskRunner` of a task scan (a session without a batch of its own: each runner holds
its task's pairs and their reference runs), which then read the model's weights and receivers' norms once.

Why: head scores, the loss, attribution, exact ablation, the circuit search, edge attribution and path patching all
read the same few things about one model on one batch: its clean activations (per-token losses, each head's mean
``z``, the residual streams exact ablation resumes from), the senders' corrupted ``z``, and the gradients of a
metric at the receivers' inputs. A :class:`Session` holds them, so a measurement that finds what it needs there
runs no pass of its own, and the model is adapted once per public call (:func:`open_session`).

What it holds (shapes: ``B`` sequences, ``P`` positions, ``H`` query heads):

- ``adapter``, ``batch``, ``device``: the model under the contract, the ``[B, P]`` token batch (None in a task's
  session), where it runs;
- ``weights()``: the model's :class:`~circuitkit.HeadWeights`, read once (``device_weights()``: on the session's
  device, as edge measurements and task runners read them);
- ``held(key, make)``: anything else read of the model once and shared by every measurement on the session (the
  receivers' attention norms of both engines' edge measurements, :func:`~circuitkit.graph.pullback.session_norms`);
- ``clean``: :class:`~circuitkit.detect.clean_run.CleanRun`, the clean pass's per-token losses ``[B, P - 1]``, mean
  ``z`` per layer ``[H, d_head]`` and residual streams per layer ``[B, P, d_model]`` (:meth:`clean_run` runs it
  where no earlier pass filled it);
- ``gradients``: :class:`EdgeGradients`, what edge attribution's clean pass kept (the clean ``z`` and
  ``resid_pre`` by layer, the receivers' gradients ``dM/d(q, k, v)``, the metric's value);
- ``corrupted(key)``: the senders' corrupted ``z`` by layer ``[B, P, H, d_head]``, one map per corruption
  (``("resample", seed)``, ``("mean",)``, ``("given", id)``), filled as layers are asked for.

The public measurements take a session where they take a model (``tokens`` then None: the session brings its
batch): ``edge_attribution(session)`` then ``path_patching(session, edges)`` runs the clean pass once, and the
corrupted pass once, for both (a named metric is the same metric in both calls; a callable is wrapped per call).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeVar

import torch
from torch import Tensor

from circuitkit.detect.clean_run import CleanRun, clean_run
from circuitkit.detect.tokens import RepeatedTokens, TokenBatch, as_batch
from circuitkit.models.adapters import HookFn, ModelAdapter, ModelSpec, adapt

if TYPE_CHECKING:
    from circuitkit.weights import HeadWeights

T = TypeVar("T")

CorruptKey = tuple[str | int, ...]
"""Which corruption a map of corrupted ``z`` belongs to: ``("resample", seed)``, ``("mean",)``, ``("given", id)``."""


class MeasuredMetric(Protocol):
    """What a session needs to know of the metric its gradients are of (:class:`circuitkit.circuits.metrics.Metric`):
    its ``name`` and whether it is ``local`` (read from a receiver's pattern, not from the logits)."""

    name: str
    local: bool


@dataclass(eq=False)
class EdgeGradients:
    """What edge attribution's clean pass (:class:`circuitkit.circuits.attribution.GradientTap`) keeps for the next
    measurement on the same batch (path patching): ``z`` ``[B, P, H, d_head]`` and ``resid`` (``resid_pre``,
    ``[B, P, d_model]``) by layer, the receivers' ``patterns`` ``[B, H, q, k]`` (``"induction"`` only), the gradients
    ``dM/d(q, k, v)`` per query head by ``(channel, layer)``, and ``total``, the metric they are of (for
    ``"induction"``, the sum of all heads'); ``each``: with the repeated-copies loss, each sequence's ``[batch]``
    where the pass that left them read it (path patching's intervals resample it), else None; ``input``: the
    pass's input embeddings ``[B, P, d_model]`` where it kept them."""

    metric: MeasuredMetric
    z: dict[int, Tensor]
    resid: dict[int, Tensor]
    patterns: dict[int, Tensor]
    grads: dict[tuple[str, int], Tensor]
    total: float
    each: Tensor | None = None
    input: Tensor | None = None

    @property
    def value(self) -> float | None:
        """The clean metric of the logits (None for ``"induction"``, a per-receiver score)."""
        return None if self.metric.local else self.total


@dataclass(eq=False)
class Session:
    """One model (on one batch, where it has one) and what has been read and measured of it (module docstring)."""

    adapter: ModelAdapter
    batch: TokenBatch | None  # None: a task's session (its runners hold their pairs)
    clean: CleanRun | None = None
    gradients: EdgeGradients | None = None
    _corrupted: dict[CorruptKey, dict[int, Tensor]] = field(default_factory=dict, repr=False)
    _weights: dict[bool, HeadWeights] = field(default_factory=dict, repr=False)
    _held: dict[str, object] = field(default_factory=dict, repr=False)

    @property
    def model(self) -> object:
        """The model itself (what :func:`circuitkit.models.state.keeps_model_state` restores after a call)."""
        return self.adapter.model

    @property
    def spec(self) -> ModelSpec:
        return self.adapter.spec

    @property
    def device(self) -> torch.device:
        return self.adapter.spec.device

    def weights(self, *, embeddings: bool = True) -> HeadWeights:
        """The model's weights per head (with ``embeddings``: ``W_E``/``W_U``/``W_pos`` too), read once; a read with
        embeddings serves a later one without."""
        held = self._weights.get(True)
        if held is None:
            held = self._weights.get(embeddings)
        if held is None:
            held = self._weights[embeddings] = self.adapter.weights(embeddings=embeddings)
        return held

    def device_weights(self) -> HeadWeights:
        """The head weights (:meth:`weights`, embeddings aside) on the session's device: what both engines' edge
        measurements and a task's runners multiply by, read and moved once for the session (a float32 copy of every
        head's ``W_Q, W_K, W_V, W_O``: 5 GiB at the Llama-3.1-8B shape)."""
        return self.held("device_weights", lambda: self.weights(embeddings=False).to(device=self.device))

    def held(self, key: str, make: Callable[[], T]) -> T:
        """What ``make()`` reads of the model, made on the first call for ``key`` and held for every later one (and
        every measurement on this session)."""
        if key not in self._held:
            self._held[key] = make()
        return self._held[key]  # type: ignore[return-value]

    def clean_run(self, *, z_means: bool = False, resid_layers: Collection[int] = (),
                  extra_hooks: Sequence[tuple[str, HookFn]] = ()) -> CleanRun:
        """The clean pass's :class:`CleanRun` with (at least) what is asked for: the one held where it has it and no
        hook must see a pass, else a new pass (:func:`circuitkit.detect.clean_run.clean_run`), then held."""
        if self.batch is None:
            raise _no_batch()
        held = self.clean
        if (held is not None and not extra_hooks and (held.z_means or not z_means)
                and set(resid_layers) <= held.resid_pre.keys()):
            return held
        self.clean = clean_run(self.adapter, self.batch, z_means=z_means, resid_layers=resid_layers,
                               extra_hooks=extra_hooks)
        return self.clean

    def corrupted(self, key: CorruptKey) -> dict[int, Tensor]:
        """The senders' corrupted ``z`` by layer under corruption ``key`` (filled by the caller, kept here)."""
        return self._corrupted.setdefault(key, {})


def _no_batch() -> Exception:
    """The refusal of a measurement on a task's session: the induction measurements read the session's token batch,
    which a task's session (its runners hold their pairs) has none of."""
    from circuitkit import validate

    return validate.fail("session", validate.given("a task's session (no token batch)"), "a session on a token batch")


def open_session(model: ModelAdapter | Session | object, tokens: RepeatedTokens | TokenBatch | None = None,
                 device: str | torch.device | None = None) -> Session:
    """A :class:`Session` for ``model`` on ``tokens`` (the default :class:`RepeatedTokens` spec where None): the model
    adapted once (:func:`circuitkit.models.adapters.adapt`). A session given is returned as it is (then ``tokens``
    must be None or its own batch)."""
    if isinstance(model, Session):
        from circuitkit import validate

        if model.batch is None:
            raise _no_batch()
        if tokens is not None and tokens is not model.batch:
            raise validate.fail("session: tokens", tokens, "None with a session given (it brings its batch)")
        return model
    adapter = adapt(model, device)
    return Session(adapter, as_batch(tokens, adapter))


__all__ = ["CorruptKey", "EdgeGradients", "MeasuredMetric", "Session", "open_session"]
