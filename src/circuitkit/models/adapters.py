"""The model contract: what circuitkit needs from a model, written down once, and one adapter per family.

Why: detection, ablation, attribution and path patching all run models through TransformerLens-style hooks.
What they need was duck-typed across several modules; here it is stated once, and every runner goes through
:func:`adapt`.

A model circuitkit can run offers (the :class:`HookedModel` protocol):

- ``cfg`` with ``n_layers``, ``n_heads``, ``d_model``, ``d_head``, ``d_vocab`` (TransformerLens names), and
  optionally ``n_ctx``, ``n_key_value_heads``, ``attention_dir``, ``default_prepend_bos``;
- ``run_with_hooks(tokens, fwd_hooks=[(hook_name, fn), ...])`` returning logits ``[batch, pos, d_vocab]``,
  where ``fn(activation, hook)`` may return a replacement and ``hook.name`` is the hook's name;
- the hook points named by :data:`HOOKS` (shapes in the table below);
- weights readable by :meth:`circuitkit.HeadWeights.from_model`;
- optionally ``tokenizer`` (its ``bos_token_id`` is the default BOS).

Hook names (``l`` the layer)::

    blocks.{l}.hook_resid_pre      [batch, pos, d_model]        residual stream entering layer l
    blocks.{l}.attn.hook_pattern   [batch, head, q_pos, k_pos]  attention probabilities
    blocks.{l}.attn.hook_z         [batch, pos, head, d_head]   each head's output before W_O
    blocks.{l}.attn.hook_q/k/v     [batch, pos, head|kv_head, d_head]
    blocks.{l}.hook_attn_out       [batch, pos, d_model]        the attention layer's output
    blocks.{l}.ln2.hook_in         [batch, pos, d_model]        the MLP's input before its norm
    blocks.{l}.mlp.hook_post       [batch, pos, d_mlp]          the MLP's hidden activation (its neurons)
    blocks.{l}.hook_mlp_out        [batch, pos, d_model]        the MLP's output
    blocks.{l}.hook_resid_post     [batch, pos, d_model]        residual stream leaving layer l

Adapters (:data:`ADAPTERS`, tried in order): TransformerLens 4.x ``TransformerBridge``, circuitkit's toy
:class:`~circuitkit.models.AttentionOnlyModel`, and any duck-typed HookedTransformer-like object. An adapter that
can resume a forward pass from a residual stream (``start_at_layer``) says so in ``can_resume``.

Every fact about a model's family that the rest of circuitkit needs is a question to the adapter, never a read of
the model's internals: the norm in front of each attention layer (:meth:`ModelAdapter.attention_norm`,
:attr:`~ModelAdapter.norm_kind`, :func:`norm_parameters`), whether heads add into the residual stream
(:attr:`~ModelAdapter.additive_heads`), sliding windows (``spec.windows``), attention patterns
(:meth:`~ModelAdapter.patterns`), hook names (:class:`HOOKS`), weights, the name and summary. For a bridge over a
Hugging Face model, the answers come from the model's :class:`~circuitkit.models.families.Family`.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch
from torch import Tensor

from circuitkit import validate
from circuitkit.errors import CircuitkitError
from circuitkit.model_state import place

HookFn = Callable[[Tensor, Any], Tensor | None]
FwdHooks = Sequence[tuple[str, HookFn]]


class HOOKS:
    """Hook names, spelled once. Each is a function of the layer."""

    @staticmethod
    def resid_pre(layer: int) -> str:
        return f"blocks.{layer}.hook_resid_pre"

    @staticmethod
    def pattern(layer: int) -> str:
        return f"blocks.{layer}.attn.hook_pattern"

    @staticmethod
    def z(layer: int) -> str:
        return f"blocks.{layer}.attn.hook_z"

    @staticmethod
    def q(layer: int) -> str:
        return f"blocks.{layer}.attn.hook_q"

    @staticmethod
    def k(layer: int) -> str:
        return f"blocks.{layer}.attn.hook_k"

    @staticmethod
    def v(layer: int) -> str:
        return f"blocks.{layer}.attn.hook_v"

    @staticmethod
    def attn_out(layer: int) -> str:
        return f"blocks.{layer}.hook_attn_out"

    @staticmethod
    def resid_post(layer: int) -> str:
        """The residual stream leaving layer ``layer`` (the last layer's: what the final norm reads)."""
        return f"blocks.{layer}.hook_resid_post"

    @staticmethod
    def mlp_in(layer: int) -> str:
        """The MLP's input before its own norm (``ln2``): the residual stream it reads."""
        return f"blocks.{layer}.ln2.hook_in"

    @staticmethod
    def mlp_normed_in(layer: int) -> str:
        """The MLP's input after its norm (in parallel blocks without ``ln2``: after the shared ``ln1``)."""
        return f"blocks.{layer}.mlp.hook_in"

    @staticmethod
    def mlp_post(layer: int) -> str:
        """The MLP's hidden activation ``[batch, pos, d_mlp]``, the input of its output matrix (after the gate in a
        gated MLP): its neurons."""
        return f"blocks.{layer}.mlp.hook_post"

    @staticmethod
    def mlp_out(layer: int) -> str:
        """The MLP's output ``[batch, pos, d_model]``, what it adds into the residual stream."""
        return f"blocks.{layer}.hook_mlp_out"

    @staticmethod
    def final_scale() -> str:
        """The final norm's scale (``[batch, pos, 1]``)."""
        return "ln_final.hook_scale"

    @staticmethod
    def final_normalized() -> str:
        """The final norm's normalised vector, before its weight."""
        return "ln_final.hook_normalized"

    @staticmethod
    def layer_of(name: str) -> int:
        """The layer a ``blocks.{l}....`` hook name belongs to."""
        return int(name.split(".")[1])


def _check_positions(positions: Any, n_pos: int) -> Tensor | None:
    """``positions`` as a non-empty 1-D int64 CPU tensor of distinct positions in ``0 .. n_pos - 1`` (or None)."""
    if positions is None:
        return None
    if (not isinstance(positions, Tensor) or positions.ndim != 1 or positions.numel() == 0
            or positions.dtype.is_floating_point or positions.dtype == torch.bool):
        raise validate.fail("run: positions", positions, "a non-empty 1-D integer tensor of sequence positions")
    positions = positions.detach().to("cpu", torch.long)
    if int(positions.min()) < 0 or int(positions.max()) >= n_pos or len(positions.unique()) != len(positions):
        raise validate.fail("run: positions", positions.tolist(), f"distinct positions in 0 .. {n_pos - 1}")
    return positions


def _check_resume(resid: Any, start_at_layer: Any, spec: Any) -> int:
    """``start_at_layer`` as a layer in ``0 .. n_layers`` (``n_layers``: the final residual stream), with ``resid``
    a floating-point ``[batch, pos, d_model]`` tensor: what :meth:`ModelAdapter.run_from` resumes from."""
    if isinstance(start_at_layer, bool) or not isinstance(start_at_layer, int) or not (
            0 <= start_at_layer <= spec.n_layers):
        raise validate.fail("run_from: start_at_layer", start_at_layer,
                            f"an int layer in 0 .. {spec.n_layers} ({spec.n_layers}: the final residual stream)")
    if (not isinstance(resid, Tensor) or resid.ndim != 3 or resid.shape[-1] != spec.d_model
            or not resid.dtype.is_floating_point or 0 in resid.shape):
        raise validate.fail("run_from: resid", resid, f"a non-empty floating-point [batch, pos, d_model] tensor with "
                            f"d_model = {spec.d_model}")
    return start_at_layer


def _put_back(module: Any, name: str, previous: Any) -> None:
    """Restore ``module``'s instance attribute ``name`` to ``previous`` (None: it had none, so the class's is
    used again)."""
    if previous is None:
        module.__dict__.pop(name, None)
    else:
        module.__dict__[name] = previous


class StopForward(Exception):
    """Raised by a hook to end a forward pass once everything asked for has been seen (hooks are removed by the
    model's ``run_with_hooks`` on the way out); the one such exception of every pass that stops early."""


def norm_parameters(module: Any) -> tuple[float | None, Tensor | None]:
    """``(eps, weight)`` of a LayerNorm or RMSNorm module, where they can be read (None each where not).

    Where each family keeps them: torch's and most Hugging Face LayerNorms ``eps``, Llama-style RMSNorms
    ``variance_epsilon``; a TransformerLens bridge component wraps the Hugging Face module as
    ``original_component``."""
    inner = getattr(module, "original_component", None) or module
    eps = next((getattr(inner, name) for name in ("eps", "variance_epsilon")
                if isinstance(getattr(inner, name, None), float)), None)
    weight = getattr(inner, "weight", None)
    return eps, weight if isinstance(weight, Tensor) else None


@runtime_checkable
class HookedModel(Protocol):
    """What a model must offer (see the module docstring)."""

    cfg: Any

    def run_with_hooks(self, *args: Any, **kwargs: Any) -> Any: ...


@dataclass(frozen=True)
class ModelSpec:
    """A model's sizes and conventions, read once from ``cfg``."""

    family: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    d_head: int
    d_vocab: int
    n_ctx: int | None
    device: torch.device
    default_bos: int | None
    bidirectional: bool
    windows: tuple[int | None, ...] | None = None  # per layer: keys a head sees (sliding window), None: all

    def visible_keys(self, layer: int) -> int | None:
        """How many keys (its own position and the ones before it) a query of ``layer`` sees; None: all."""
        return self.windows[layer] if self.windows is not None else None

    @property
    def n_total_heads(self) -> int:
        return self.n_layers * self.n_heads


class ModelAdapter:
    """Runs one family of models under the contract. Subclasses say which models they ``accept``."""

    family: ClassVar[str] = "duck-typed"
    can_resume: ClassVar[bool] = False

    def __init__(self, model: HookedModel, device: str | torch.device | None = None, *,
                 place_model: bool = True) -> None:
        self.model: HookedModel = model
        where = validate.device("device", device)
        self.spec = self._read_spec(where)
        if where is not None and place_model:  # device= means "run there": the model moves for the call (place)
            place(model, where, "device")

    @classmethod
    def accepts(cls, model: Any) -> bool:
        return isinstance(model, HookedModel) and callable(model.run_with_hooks) and model.cfg is not None

    # ------------------------------------------------------------------ reading the model
    def _read_spec(self, device: torch.device | None) -> ModelSpec:
        model = self.model
        cfg = getattr(model, "cfg", None)
        missing = [name for name in ("n_layers", "n_heads", "d_model", "d_head") if getattr(cfg, name, None) is None]
        if cfg is None or missing:
            raise CircuitkitError(
                f"given a {type(model).__name__} with "
                f"{'no cfg' if cfg is None else 'cfg missing ' + ', '.join(missing)}; expected a model with "
                "cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.d_head (a TransformerLens TransformerBridge, a "
                "circuitkit AttentionOnlyModel, or any model shaped like them)."
            )
        d_vocab = getattr(cfg, "d_vocab", None)
        if d_vocab is None or int(d_vocab) < 1:
            raise CircuitkitError(
                f"given a {type(model).__name__} with cfg.d_vocab={d_vocab!r}; expected a model that takes token "
                "ids and returns logits (a vocabulary). Models on residual inputs cannot be scored on tokens."
            )
        n_layers, n_heads = int(cfg.n_layers), int(cfg.n_heads)
        if n_layers < 1 or n_heads < 1:
            raise CircuitkitError(
                f"given a model with {n_layers} layers x {n_heads} heads; expected at least one attention head."
            )
        if device is None:
            device = self._first_device()
        tokenizer = getattr(model, "tokenizer", None)
        bos = getattr(tokenizer, "bos_token_id", None) if tokenizer is not None else None
        if not getattr(cfg, "default_prepend_bos", True):
            bos = None
        n_kv = getattr(cfg, "n_key_value_heads", None)
        n_ctx = getattr(cfg, "n_ctx", None)
        return ModelSpec(
            family=self.family_name,
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=int(n_kv) if n_kv else n_heads,
            d_model=int(cfg.d_model),
            d_head=int(cfg.d_head),
            d_vocab=int(d_vocab),
            n_ctx=int(n_ctx) if n_ctx is not None else None,
            device=torch.device(device),
            default_bos=bos if isinstance(bos, int) and not isinstance(bos, bool) else None,
            bidirectional=getattr(cfg, "attention_dir", "causal") == "bidirectional",
            windows=self._windows(n_layers),
        )

    def _windows(self, n_layers: int) -> tuple[int | None, ...] | None:
        """Per layer, the sliding window of its heads (None: the family has none)."""
        return None

    def _first_device(self) -> torch.device:
        """Where token ids go: the embedding's device (the first parameter's), else ``cfg.device``, else cpu."""
        parameters = getattr(self.model, "parameters", None)
        first = next(iter(parameters()), None) if callable(parameters) else None
        if first is not None:
            return first.device
        return torch.device(getattr(self.model.cfg, "device", None) or "cpu")

    @property
    def tokenizer(self) -> Any:
        return getattr(self.model, "tokenizer", None)

    def weights(self, *, embeddings: bool = True) -> Any:
        """The model's :class:`~circuitkit.HeadWeights` (``embeddings=False``: without ``W_E``/``W_U``/``W_pos``)."""
        from circuitkit.weights import HeadWeights

        return HeadWeights.from_model(self.model, embeddings=embeddings)

    # ------------------------------------------------------------------ family facts
    @property
    def family_name(self) -> str:
        """The family's name as reports show it."""
        return self.family

    @property
    def additive_heads(self) -> bool:
        """Whether each head adds ``z_h @ W_O[h]`` (+ its share of ``b_O``) into the residual stream as it is, so
        that one head's contribution can be isolated (path patching, edge attribution need it)."""
        return True

    @property
    def default_name(self) -> str:
        """The model's name where its config records one (``cfg.model_name``), else its class name."""
        name = getattr(self.model.cfg, "model_name", None)
        return str(name) if isinstance(name, str) and name.strip() else type(self.model).__name__

    @property
    def attn_only(self) -> bool | None:
        """Whether the model has attention layers only (no MLPs); None where the config does not say."""
        value = getattr(self.model.cfg, "attn_only", None)
        return value if isinstance(value, bool) else None

    @property
    def norm_kind(self) -> str | None:
        """The normalisation in front of each attention layer, in TransformerLens's names: ``"LN"`` (LayerNorm),
        ``"LNPre"`` (LayerNorm without weight), ``"RMS"``, ``"RMSPre"``; None without one."""
        kind = getattr(self.model.cfg, "normalization_type", None)
        return kind if isinstance(kind, str) else None

    def attention_norm(self, layer: int) -> Any:
        """The module normalising layer ``layer``'s attention input (``blocks[layer].ln1``, callable on
        ``[..., d_model]``), or None where the model has no normalisation (:attr:`norm_kind` None)."""
        if self.norm_kind is None:
            return None
        blocks = getattr(self.model, "blocks", None)
        norm = getattr(blocks[layer], "ln1", None) if blocks is not None else None
        if not callable(norm):
            raise CircuitkitError(
                f"{type(self.model).__name__} has cfg.normalization_type={self.norm_kind!r} but no callable "
                f"blocks[{layer}].ln1; expected the normalisation before attention as TransformerLens names it "
                "(path patching recomputes the receiver's input through it)."
            )
        return norm

    def patterns(self, tokens: Tensor, layers: Iterable[int]) -> dict[int, Tensor]:
        """The attention probabilities ``[batch, head, q_pos, k_pos]`` of ``layers`` on ``tokens`` (detached),
        read at :meth:`HOOKS.pattern`; the pass stops after the last layer asked for."""
        layers = sorted(set(layers))
        kept: dict[int, Tensor] = {}

        def keep(layer: int) -> HookFn:
            def hook(pattern: Tensor, hook: Any) -> None:
                kept[layer] = pattern.detach()
                if layer == layers[-1]:
                    raise StopForward

            return hook

        try:
            self.run(tokens, [(HOOKS.pattern(layer), keep(layer)) for layer in layers])
        except StopForward:
            pass
        missing = [layer for layer in layers if layer not in kept]
        if missing:
            raise CircuitkitError(
                f"{type(self.model).__name__} ran without calling the pattern hook of layers {missing}; expected "
                f"{HOOKS.pattern(missing[0])} [batch, head, q_pos, k_pos] in every attention layer."
            )
        return kept

    def embedded(self, tokens: Tensor) -> Tensor:
        """The input embeddings of ``tokens``, the residual stream entering layer 0 ``[batch, pos, d_model]``
        (detached), read at :meth:`HOOKS.resid_pre` of layer 0; the pass stops there, so no layer runs."""
        tokens = validate.tensor("embedded: tokens", tokens, ndim=2, integral=True)
        if tokens.numel() == 0 or int(tokens.min()) < 0 or int(tokens.max()) >= self.spec.d_vocab:
            raise validate.fail("embedded: tokens", tokens, f"a non-empty [batch, pos] tensor of token ids in "
                                f"[0, {self.spec.d_vocab}) (the model's vocabulary)")
        got: list[Tensor] = []

        def keep(x: Tensor, hook: Any) -> None:
            got.append(x.detach())
            raise StopForward

        with torch.no_grad():
            try:
                self.run(tokens, [(HOOKS.resid_pre(0), keep)])
            except StopForward:
                pass
        if not got:
            raise CircuitkitError(f"{type(self.model).__name__} ran without calling {HOOKS.resid_pre(0)}; expected "
                                  "the input embeddings [batch, pos, d_model] there.")
        return got[0]

    # ------------------------------------------------------------------ running
    def run(self, tokens: Tensor, fwd_hooks: FwdHooks = (), *, positions: Tensor | None = None,
            graph_positions: Tensor | None = None) -> Tensor:
        """Logits ``[batch, pos, d_vocab]`` of ``tokens`` with ``fwd_hooks`` attached; no gradients unless the
        caller enables them. With ``positions`` (a 1-D long tensor of sequence positions): the logits at those
        positions only, ``[batch, len(positions), d_vocab]``; families whose model can say so compute the
        unembedding only there (:meth:`_keep_kwargs`), the others slice the full logits. With ``graph_positions``
        (every position's logits wanted, gradients only through these): families that can
        (:meth:`_unembedding_split`) keep the autograd graph of the unembedding to those positions, so a backward
        pass does not multiply the vocabulary matrix at the others; the logits are the same."""
        hooks = list(fwd_hooks)
        positions = _check_positions(positions, tokens.shape[-1])
        graph_positions = _check_positions(graph_positions, tokens.shape[-1])
        keep = self._keep_kwargs(positions)
        with self._unembedding_split(graph_positions if positions is None else None):
            if hooks or not callable(self.model):  # the contract promises run_with_hooks, not __call__
                out = self.model.run_with_hooks(tokens, fwd_hooks=hooks, **keep)
            else:
                out = self.model(tokens, **keep)
        return self._finish(out, tuple(tokens.shape[:2]), positions, bool(keep))

    def _unembedding_split(self, graph_positions: Tensor | None) -> contextlib.AbstractContextManager[None]:
        """A context in which the model's unembedding keeps its autograd graph only at ``graph_positions``
        (nothing to do by default: the graph covers every position, the same gradients at more cost)."""
        return contextlib.nullcontext()

    def run_from(self, resid: Tensor, start_at_layer: int, fwd_hooks: FwdHooks = (), *,
                 positions: Tensor | None = None) -> Tensor:
        """Logits from the residual stream ``resid`` ``[batch, pos, d_model]`` entering ``start_at_layer``
        (layers before it skipped; ``n_layers``: the final residual stream, so only the final norm and the
        unembedding run); ``positions`` as for :meth:`run`. Only for families with ``can_resume``."""
        raise CircuitkitError(
            f"{type(self.model).__name__} cannot resume a forward pass from layer {start_at_layer}; expected a "
            "TransformerBridge or AttentionOnlyModel. Callers check ModelAdapter.can_resume first."
        )

    def _keep_kwargs(self, positions: Tensor | None) -> dict[str, Any]:
        """Keyword arguments telling the model to unembed only at ``positions`` (none: it cannot, or all wanted)."""
        return {}

    def _finish(self, out: Any, batch_pos: tuple[int, ...], positions: Tensor | None, kept: bool) -> Tensor:
        """The checked logits of ``out`` at ``positions``: as the model returned them where it was asked to keep
        only those (``kept``), else sliced from every position."""
        logits = self._logits(out, batch_pos, positions if kept else None)
        if positions is None or kept:
            return logits
        return logits.index_select(1, positions.to(logits.device))

    def _logits(self, out: Any, batch_pos: tuple[int, ...], kept: Tensor | None = None) -> Tensor:
        """The logits in the model's output, checked: ``[batch, pos, d_vocab]``, or ``[batch, len(kept), d_vocab]``
        where the model was asked to unembed only at ``kept``."""
        logits = out if isinstance(out, Tensor) else getattr(out, "logits", None)
        if kept is not None:
            batch_pos = (batch_pos[0], len(kept))
        if not isinstance(logits, Tensor) or logits.ndim != 3 or tuple(logits.shape[:2]) != batch_pos:
            shape = tuple(logits.shape) if isinstance(logits, Tensor) else type(out).__name__
            raise CircuitkitError(
                f"{type(self.model).__name__} returned {shape}; expected logits [batch, pos, d_vocab] with "
                f"batch, pos = {batch_pos}."
            )
        if logits.shape[-1] != self.spec.d_vocab:
            raise CircuitkitError(
                f"{type(self.model).__name__} returned {logits.shape[-1]} logits per position; expected "
                f"cfg.d_vocab = {self.spec.d_vocab} (does the model have an unembedding W_U?)."
            )
        return logits


class BridgeAdapter(ModelAdapter):
    """TransformerLens 4.x ``TransformerBridge``: resumes with ``forward(resid, start_at_layer=l)``.

    The bridge's own ``start_at_layer`` still runs the wrapped model's blocks ``0 .. l-1`` and discards their
    output at block ``l`` (measured: resuming at the last of 30 layers cost a whole forward pass). While
    resuming, each earlier block's wrapped module is therefore replaced by a pass-through that returns its
    hidden-state input in the output structure the module has (learnt from one real call per block), so
    the work skipped is really skipped. Tests check resumed and full passes agree on TransformerLens-native
    bridges and on every family of :mod:`circuitkit.models.families` whose ``resumable`` is true (the others,
    where the bridge's own resumed pass differs from the full one, report ``can_resume`` false).

    Every other family fact (norm before attention, additive heads, sliding windows, the name) comes from the
    wrapped Hugging Face model's :class:`~circuitkit.models.families.Family`.
    """

    family = "transformer-bridge"

    def __init__(self, model: Any, device: str | torch.device | None = None, *, place_model: bool = True) -> None:
        super().__init__(model, device, place_model=place_model)
        self._block_outputs: dict[int, tuple[str, int]] = {}  # block -> ("tensor", 0) | ("tuple", length)

    @classmethod
    def accepts(cls, model: Any) -> bool:
        return any(klass.__name__ == "TransformerBridge" for klass in type(model).__mro__)

    # ------------------------------------------------------------------ family facts (models/families.py)
    @property
    def hf_config(self) -> Any:
        """The wrapped Hugging Face model's config (None for a TransformerLens-native bridge)."""
        return getattr(getattr(self.model, "original_model", None), "config", None)

    @property
    def facts(self) -> Any:
        """The :class:`~circuitkit.models.families.Family` of the wrapped model, None where it is not in the
        table (a native bridge: pre-norm, additive heads, no windows)."""
        from circuitkit.models.families import family_of

        return family_of(self.hf_config) if self.hf_config is not None else None

    @property
    def family_name(self) -> str:
        facts = self.facts
        return f"{facts.name} (TransformerBridge)" if facts is not None else self.family

    @property  # type: ignore[override]  (a class constant elsewhere; here a fact of the wrapped family)
    def can_resume(self) -> bool:
        facts = self.facts
        return facts.resumable if facts is not None else True

    @property
    def additive_heads(self) -> bool:
        facts = self.facts
        return facts.additive_heads if facts is not None else True

    def attention_norm(self, layer: int) -> Any:
        facts = self.facts
        if facts is not None and not facts.norm_before_attention:
            return None  # the attention reads the residual stream as it is
        return super().attention_norm(layer)

    def _windows(self, n_layers: int) -> tuple[int | None, ...] | None:
        from circuitkit.models.families import attention_windows

        if self.hf_config is None:
            return None
        windows = attention_windows(self.hf_config, n_layers)
        return windows if any(w is not None for w in windows) else None

    def run_from(self, resid: Tensor, start_at_layer: int, fwd_hooks: FwdHooks = (), *,
                 positions: Tensor | None = None) -> Tensor:
        if not self.can_resume:
            return super().run_from(resid, start_at_layer, fwd_hooks)  # refuses
        start_at_layer = _check_resume(resid, start_at_layer, self.spec)
        hooks = list(fwd_hooks)
        positions = _check_positions(positions, resid.shape[1])
        keep = self._keep_kwargs(positions)
        # past the last layer (``resid`` the final residual stream): the bridge injects it at the last block, which
        # passes it through, so that only the final norm and the unembedding run
        after_all = start_at_layer == self.spec.n_layers
        inject = start_at_layer - 1 if after_all else start_at_layer
        with self._skipping_blocks(start_at_layer, must_pass=inject if after_all else None):
            if hooks:
                out = self.model.run_with_hooks(resid, fwd_hooks=hooks, start_at_layer=inject, **keep)
            else:
                out = self.model(resid, start_at_layer=inject, **keep)
        return self._finish(out, tuple(resid.shape[:2]), positions, bool(keep))

    def _keep_kwargs(self, positions: Tensor | None) -> dict[str, Any]:
        """Hugging Face causal LMs take ``logits_to_keep`` (a tensor of positions: ``lm_head`` runs only there,
        final norm and soft-capping elementwise before it); masked LMs and native bridges do not. The positions
        stay on the CPU: they index the last hidden state wherever an offloaded model keeps it."""
        if positions is None or not self._keeps_logits:
            return {}
        return {"logits_to_keep": positions.cpu()}

    @functools.cached_property
    def _keeps_logits(self) -> bool:
        forward = getattr(getattr(self.model, "original_model", None), "forward", None)
        try:
            return forward is not None and "logits_to_keep" in inspect.signature(forward).parameters
        except (TypeError, ValueError):  # a forward without a readable signature: unembed everywhere
            return False

    @contextlib.contextmanager
    def _unembedding_split(self, graph_positions: Tensor | None) -> Iterator[None]:
        """While the block runs, the wrapped model's ``lm_head`` (a plain ``torch.nn.Linear`` behind the bridge's
        ``unembed``) computes every position's logits, but with gradients only at ``graph_positions``: the others
        are computed under ``no_grad`` and written around them. What the model does after ``lm_head`` (soft-capping,
        scaling) is elementwise and unchanged. A backward pass then multiplies the ``[d_vocab, d_model]`` matrix for
        those positions only (at vocabulary 262k the unembedding is two thirds of a pass)."""
        head = getattr(getattr(self.model, "unembed", None), "original_component", None)
        if graph_positions is None or type(head) is not torch.nn.Linear or not torch.is_grad_enabled():
            yield
            return

        def forward(hidden: Tensor) -> Tensor:
            if hidden.ndim != 3 or not hidden.requires_grad:
                return torch.nn.functional.linear(hidden, head.weight, head.bias)
            # runs of consecutive positions, each with or without a graph, joined in order (one copy of the logits)
            keep = torch.zeros(hidden.shape[1], dtype=torch.bool, device=hidden.device)
            keep[graph_positions[graph_positions < hidden.shape[1]]] = True
            pieces, start = [], 0
            for stop in [*(i for i in range(1, len(keep)) if keep[i] != keep[i - 1]), len(keep)]:
                with torch.set_grad_enabled(bool(keep[start])):
                    # contiguous first (a few kB): a strided 3-D input makes linear batch its matmul per sequence
                    piece = hidden[:, start:stop].contiguous()
                    pieces.append(torch.nn.functional.linear(piece, head.weight, head.bias))
                start = stop
            return torch.cat(pieces, dim=1)

        previous = head.__dict__.get("forward")  # a forward another library set on the instance is put back
        head.forward = forward
        try:
            yield
        finally:
            _put_back(head, "forward", previous)

    @contextlib.contextmanager
    def _skipping_blocks(self, start_at_layer: int, must_pass: int | None = None) -> Iterator[None]:
        """The wrapped blocks before ``start_at_layer`` pass their input through (their output is discarded: the
        bridge injects the residual stream at the block it resumes at). ``must_pass``: the index of a skipped block
        whose output is used (the last one, resumed past), so it passes its input through from its first call."""
        blocks = getattr(self.model, "blocks", None)
        modules = []
        if blocks is not None:
            for index in range(min(start_at_layer, len(blocks))):
                inner = getattr(blocks[index], "original_component", None)
                if isinstance(inner, torch.nn.Module):
                    modules.append((index, inner))
        if must_pass is not None and must_pass not in {index for index, _ in modules}:
            raise CircuitkitError(
                f"{type(self.model).__name__}: block {must_pass} wraps no module to pass the residual stream "
                "through; expected a TransformerBridge block with an original_component (resuming past the last "
                "layer needs it).")
        # a block's own forward may be an instance attribute already (TransformerLens patches some families'
        # blocks so: Falcon's decoder layer without its in-place add, which a backward hook would see modified):
        # that one is what runs, and what is put back
        previous = {index: inner.__dict__.get("forward") for index, inner in modules}
        try:
            for index, inner in modules:
                inner.forward = self._pass_through(index, inner, index == must_pass)
            yield
        finally:
            for index, inner in modules:
                _put_back(inner, "forward", previous[index])

    def run(self, tokens: Tensor, fwd_hooks: FwdHooks = (), *, positions: Tensor | None = None,
            graph_positions: Tensor | None = None) -> Tensor:
        with self._learning_blocks():
            return super().run(tokens, fwd_hooks, positions=positions, graph_positions=graph_positions)

    @contextlib.contextmanager
    def _learning_blocks(self) -> Iterator[None]:
        """Until every wrapped block's output structure is known (what a skipped block must return in its place:
        a tensor or a tuple of some length), a full pass records it, from module hooks that read the outputs and
        are removed after the pass."""
        blocks = getattr(self.model, "blocks", None)
        handles = []
        if blocks is not None and len(self._block_outputs) < len(blocks):
            for index, block in enumerate(blocks):
                inner = getattr(block, "original_component", None)
                if isinstance(inner, torch.nn.Module) and index not in self._block_outputs:
                    handles.append(inner.register_forward_hook(
                        lambda module, args, out, index=index: self._learn_structure(index, out)))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _learn_structure(self, index: int, out: Any) -> None:
        if isinstance(out, Tensor):
            self._block_outputs[index] = ("tensor", 0)
        elif isinstance(out, tuple) and out and isinstance(out[0], Tensor):
            self._block_outputs[index] = ("tuple", len(out))

    def _pass_through(self, index: int, inner: torch.nn.Module, must_pass: bool = False) -> Callable[..., Any]:
        real = inner.__dict__.get("forward") or type(inner).forward.__get__(inner)

        def forward(*args: Any, **kwargs: Any) -> Any:
            hidden = args[0] if args else kwargs.get("hidden_states")
            structure = self._block_outputs.get(index)
            if structure is None or not isinstance(hidden, Tensor):
                out = real(*args, **kwargs)  # learn the output structure (before any full pass), or run it if unsure
                self._learn_structure(index, out)
                if not must_pass:
                    return out
                structure = self._block_outputs.get(index)
                if structure is None or not isinstance(hidden, Tensor):
                    raise CircuitkitError(
                        f"{type(self.model).__name__}: block {index} takes {type(hidden).__name__} and returns "
                        f"{type(out).__name__}; expected a hidden-state tensor in and a tensor or tuple out, to pass "
                        "the residual stream through it (resuming past the last layer).")
            kind, length = structure
            return hidden if kind == "tensor" else (hidden,) + (None,) * (length - 1)

        return forward


class ToyAdapter(ModelAdapter):
    """circuitkit's :class:`~circuitkit.models.AttentionOnlyModel` (resumes from any layer)."""

    family = "circuitkit-toy"
    can_resume = True

    @classmethod
    def accepts(cls, model: Any) -> bool:
        from circuitkit.models.toy import AttentionOnlyModel

        return isinstance(model, AttentionOnlyModel)

    def run_from(self, resid: Tensor, start_at_layer: int, fwd_hooks: FwdHooks = (), *,
                 positions: Tensor | None = None) -> Tensor:
        start_at_layer = _check_resume(resid, start_at_layer, self.spec)
        positions = _check_positions(positions, resid.shape[1])
        out = self.model.run_with_hooks(resid, fwd_hooks=list(fwd_hooks), start_at_layer=start_at_layer)
        return self._finish(out, tuple(resid.shape[:2]), positions, kept=False)


class DecoderAdapter(ToyAdapter):
    """circuitkit's :class:`~circuitkit.models.decoder.DecoderModel` (a Llama / Qwen2 / Mistral checkpoint run
    without transformers): pre-norm RMSNorm blocks, heads that add into the residual stream, resumes from any
    layer."""

    family = "circuitkit-decoder"

    @classmethod
    def accepts(cls, model: Any) -> bool:
        from circuitkit.models.decoder import DecoderModel

        return isinstance(model, DecoderModel)

    @property
    def family_name(self) -> str:
        return f"{self.model.cfg.family} (circuitkit decoder)"

    def _keep_kwargs(self, positions: Tensor | None) -> dict[str, Any]:
        return {} if positions is None else {"logits_to_keep": positions}

    @contextlib.contextmanager
    def _unembedding_split(self, graph_positions: Tensor | None) -> Iterator[None]:
        self.model.graph_positions = graph_positions
        try:
            yield
        finally:
            self.model.graph_positions = None

    def run_from(self, resid: Tensor, start_at_layer: int, fwd_hooks: FwdHooks = (), *,
                 positions: Tensor | None = None) -> Tensor:
        start_at_layer = _check_resume(resid, start_at_layer, self.spec)
        positions = _check_positions(positions, resid.shape[1])
        keep = self._keep_kwargs(positions)
        out = self.model.run_with_hooks(resid, fwd_hooks=list(fwd_hooks), start_at_layer=start_at_layer, **keep)
        return self._finish(out, tuple(resid.shape[:2]), positions, bool(keep))


ADAPTERS: tuple[type[ModelAdapter], ...] = (BridgeAdapter, ToyAdapter, DecoderAdapter, ModelAdapter)
"""Families, tried in order; the last (duck-typed) accepts anything with ``cfg`` and ``run_with_hooks``."""


def adapt(model: Any, device: str | torch.device | None = None, *, place_model: bool = True) -> ModelAdapter:
    """The adapter that runs ``model`` under the contract; a ``CircuitkitError`` if no family accepts it.

    ``device``: where it runs (None: where the model is). A model wholly on another device is moved there
    (:func:`circuitkit.model_state.place`; a public entry point moves it back when it returns), unless
    ``place_model`` is False (a reader of the spec alone: memory estimates, token batches)."""
    if isinstance(model, ModelAdapter):
        return model
    for adapter in ADAPTERS:
        if adapter.accepts(model):
            return adapter(model, device, place_model=place_model)
    raise CircuitkitError(
        f"given a {type(model).__name__}, which has no cfg or no run_with_hooks; expected a model with TransformerLens "
        "hooks (a TransformerBridge, a circuitkit AttentionOnlyModel, or a HookedTransformer-like object)."
    )


__all__ = [
    "ADAPTERS", "HOOKS", "BridgeAdapter", "DecoderAdapter", "HookedModel", "ModelAdapter", "ModelSpec", "ToyAdapter",
    "adapt",
    "norm_parameters",
]
