"""A runnable attention-only transformer for hand-built and loaded :class:`~circuitkit.HeadWeights`.

Why it exists: circuitkit lets a user write a circuit's matrices by hand (``circuitkit.handbuilt``) and then
*run* them, look at the attention patterns through TransformerLens-named hooks, and ablate heads. A
``TransformerBridge`` can run such weights too (:func:`circuitkit.models.to_bridge`), but it cannot take
residual-stream inputs directly, cannot do hard (argmax) attention, and costs seconds to build.

The computation (row vectors, as TransformerLens; no LayerNorm, no MLPs)::

    resid[0]   = W_E[tokens] + W_pos[:pos]        (or the given residual input [batch, pos, d_model])
    q          = resid @ W_Q[l] + b_Q[l]          # [batch, pos, head,    d_head]
    k, v       = resid @ W_K[l] + b_K[l], ...     # [batch, pos, kv_head, d_head]
    scores     = q . k / attn_scale               # [batch, head, q_pos, k_pos], -inf above the diagonal
    pattern    = softmax(scores)  or  hard(scores)
    z          = pattern @ v                      # [batch, pos, head, d_head]
    attn_out   = sum_h z[h] @ W_O[l, h] + b_O[l]  # [batch, pos, d_model]
    resid[l+1] = resid[l] + attn_out
    logits     = resid[L] @ W_U                   (or the final residual when there is no W_U)

``attn_scale`` defaults to ``sqrt(d_head)``, as TransformerLens, so a bridge built from the same weights
agrees with the soft model. Hard attention puts all the weight on the highest-scoring allowed key; exact
ties share it equally, which is the limit of ``softmax(beta * scores)`` as ``beta -> inf``.

Hook names and shapes follow TransformerLens: ``hook_embed``, ``hook_pos_embed``,
``blocks.{l}.hook_resid_pre``, ``blocks.{l}.attn.hook_q/hook_k/hook_v`` ``[batch, pos, head, d_head]``,
``blocks.{l}.attn.hook_attn_scores`` and ``hook_pattern`` ``[batch, head, q_pos, k_pos]``,
``blocks.{l}.attn.hook_z`` ``[batch, pos, head, d_head]``, ``blocks.{l}.hook_attn_out``,
``blocks.{l}.hook_resid_post``. (``hook_attn_scores`` holds the scaled scores with ``-inf`` above the
diagonal, as TransformerLens's ``HookedTransformer``; TransformerLens 4.3's native bridge caches the pattern
under that name instead.) A hook function is called ``fn(tensor, hook)``; ``hook.name`` is the hook's
name and a returned tensor replaces the activation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from jaxtyping import Float, Int
from torch import Tensor

from circuitkit import validate
from circuitkit.errors import CircuitkitError, describe
from circuitkit.weights import HeadWeights

AttentionMode = Literal["soft", "hard"]

DEFAULT_N_CTX = 1024
"""Context length of a model with no ``W_pos`` when none is given (only inputs longer than this are refused)."""


def _softmax_pattern(scores: Tensor) -> Tensor:
    return torch.softmax(scores, dim=-1)


def _hard_pattern(scores: Tensor) -> Tensor:
    best = scores.amax(dim=-1, keepdim=True)
    winners = (scores == best).to(scores.dtype)
    return winners / winners.sum(dim=-1, keepdim=True)


_PATTERNS: dict[str, Callable[[Tensor], Tensor]] = {"soft": _softmax_pattern, "hard": _hard_pattern}


def shape_fields(w: HeadWeights) -> dict[str, int | None]:
    """The config fields a model built from ``w`` shares with it (TransformerLens names)."""
    return {
        "n_layers": w.n_layers,
        "n_heads": w.n_heads,
        "d_model": w.d_model,
        "d_head": w.d_head,
        "n_key_value_heads": None if w.group_size == 1 else w.n_kv_heads,
    }


@dataclass(frozen=True)
class ToyConfig:
    """Shape and attention settings of an :class:`AttentionOnlyModel` (field names as TransformerLens's cfg).

    ``d_vocab`` is ``None`` for a model with no embedding: it then takes residual inputs. ``attn_scale``
    divides the attention scores (``sqrt(d_head)`` when ``None``). ``attention`` is ``"soft"`` (softmax) or
    ``"hard"`` (argmax, ties shared equally).
    """

    n_layers: int
    n_heads: int
    d_model: int
    d_head: int
    d_vocab: int | None
    n_ctx: int
    n_key_value_heads: int | None = None
    attention: AttentionMode = "soft"
    attn_scale: float | None = None
    attn_only: bool = True
    normalization_type: None = None
    default_prepend_bos: bool = False

    def __post_init__(self) -> None:
        for name in ("n_layers", "n_heads", "d_model", "d_head", "n_ctx"):
            validate.positive_int(f"ToyConfig: {name}", getattr(self, name))
        if self.d_vocab is not None:
            validate.integer("ToyConfig: d_vocab", self.d_vocab, minimum=1, why="or None for residual inputs")
        if self.n_key_value_heads is not None:
            kv = validate.positive_int("ToyConfig: n_key_value_heads", self.n_key_value_heads)
            if self.n_heads % kv:
                raise validate.fail("ToyConfig: n_key_value_heads", kv,
                                    f"a divisor of n_heads={self.n_heads} (each group serves n_heads / kv heads)")
        validate.option("ToyConfig: attention", self.attention, tuple(_PATTERNS))
        if self.attn_scale is not None:
            validate.real("ToyConfig: attn_scale (None for sqrt(d_head))", self.attn_scale, minimum=0.0,
                          strict_minimum=True)
        if self.attn_only is not True:
            raise validate.fail("ToyConfig: attn_only", self.attn_only, "True (the toy model has no MLPs)")
        if self.normalization_type is not None:
            raise validate.fail("ToyConfig: normalization_type", self.normalization_type,
                                "None (the toy model has no LayerNorm)")
        validate.boolean("ToyConfig: default_prepend_bos", self.default_prepend_bos)

    @property
    def scale(self) -> float:
        """The divisor of the attention scores."""
        return math.sqrt(self.d_head) if self.attn_scale is None else float(self.attn_scale)


class ToyHook:
    """The ``hook`` argument a hook function receives: carries the hook's ``name`` (as TransformerLens)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"ToyHook({self.name!r})"


class ToyCache(dict):
    """Activations by hook name; also indexable TransformerLens-style: ``cache["pattern", 0]``."""

    def __getitem__(self, key: str | tuple[str, int]) -> Tensor:
        if isinstance(key, tuple):
            name, layer = key
            attn_names = {"q", "k", "v", "z", "attn_scores", "pattern"}
            key = f"blocks.{layer}.attn.hook_{name}" if name in attn_names else f"blocks.{layer}.hook_{name}"
        return super().__getitem__(key)


HookFn = Callable[[Tensor, ToyHook], Tensor | None]
NameFilter = str | Sequence[str] | Callable[[str], bool] | None


class HookPoints:
    """TransformerLens-style hooks for circuitkit's own runnable models (:class:`AttentionOnlyModel`, the Llama-style
    :class:`~circuitkit.models.decoder.DecoderModel`): a ``run_with_hooks`` list resolved against the model's
    :meth:`hook_names` (a name, or a filter over the names), ``run_with_cache``, and each hook point's functions
    applied in turn. A model defines ``hook_names()`` and ``_run(tokens, hooks)``; ``CAST_REPLACEMENTS``: a
    replacement of another dtype is cast to the activation's (else refused)."""

    CAST_REPLACEMENTS: bool = False

    def run_with_cache(self, tokens: Tensor, names_filter: NameFilter = None) -> tuple[Tensor, ToyCache]:
        """``(logits, cache)``: ``cache`` maps hook names (those ``names_filter`` keeps) to activations."""
        keep = self._name_filter(names_filter)
        cache = ToyCache()

        def save(tensor: Tensor, hook: ToyHook) -> None:
            cache[hook.name] = tensor.detach()

        hooks = {name: [save] for name in self.hook_names() if keep(name)}
        logits = self._run(tokens, hooks)
        return logits, cache

    def _name_filter(self, names_filter: NameFilter) -> Callable[[str], bool]:
        if names_filter is None:
            return lambda name: True
        if isinstance(names_filter, str):
            self._check_names([names_filter])
            return lambda name: name == names_filter
        if callable(names_filter):
            return names_filter
        if isinstance(names_filter, bytes) or not hasattr(names_filter, "__iter__"):
            raise validate.fail("run_with_cache: names_filter", names_filter,
                                "None, a hook name, a list of hook names or a filter fn(name) -> bool")
        wanted = set(names_filter)
        if not all(isinstance(name, str) for name in wanted):
            raise validate.fail("run_with_cache: names_filter", names_filter, "hook names (strings)")
        self._check_names(wanted)
        return lambda name: name in wanted

    def _check_names(self, names: Iterable[str]) -> None:
        known = set(self.hook_names())
        unknown = sorted(set(names) - known)
        if unknown:
            raise CircuitkitError(
                f"{type(self).__name__}: given unknown hook names {unknown}; expected names from "
                f"model.hook_names(), e.g. 'blocks.0.attn.hook_pattern'."
            )

    def _resolve_hooks(self, fwd_hooks) -> dict[str, list[HookFn]]:
        hooks: dict[str, list[HookFn]] = {}
        if isinstance(fwd_hooks, (str, bytes)) or not hasattr(fwd_hooks, "__iter__"):
            raise validate.fail("run_with_hooks: fwd_hooks", fwd_hooks, "a list of (name, fn) pairs")
        known = self.hook_names()  # listed once a call, not once a hook (a pass has a hook or more per layer)
        known_set = set(known)
        for entry in fwd_hooks:
            if not (isinstance(entry, (tuple, list)) and len(entry) == 2 and callable(entry[1])):
                raise CircuitkitError(
                    f"run_with_hooks: given hook entry {describe(entry)}; expected (name, fn) with fn(tensor, hook)."
                )
            name, fn = entry
            if isinstance(name, str):
                if name not in known_set:
                    self._check_names([name])
                names = [name]
            elif callable(name):
                names = [n for n in known if name(n)]
            else:
                raise CircuitkitError(
                    f"run_with_hooks: given hook name {describe(name)}; expected a str or a filter fn(name) -> bool."
                )
            for n in names:
                hooks.setdefault(n, []).append(fn)
        return hooks

    def _hook(self, hooks: dict[str, list[HookFn]], name: str, tensor: Tensor) -> Tensor:
        """``tensor`` passed through the hooks at ``name`` in turn, each replacement checked (shape, device, and
        dtype unless :attr:`CAST_REPLACEMENTS`, where it is cast to the activation's dtype)."""
        for fn in hooks.get(name, ()):
            out = fn(tensor, ToyHook(name))
            if out is not None:
                if isinstance(out, Tensor) and self.CAST_REPLACEMENTS:
                    out = out.to(tensor.dtype)
                if not isinstance(out, Tensor) or out.shape != tensor.shape or out.dtype != tensor.dtype or (
                        out.device != tensor.device):
                    raise CircuitkitError(
                        f"hook on {name}: returned {describe(out)}; expected a tensor of shape "
                        f"{tuple(tensor.shape)}, dtype {tensor.dtype} on {tensor.device} (or None to keep the "
                        "activation)."
                    )
                tensor = out
        return tensor


class AttentionOnlyModel(HookPoints):
    """An attention-only transformer that runs any :class:`HeadWeights` (see the module docstring).

    ``AttentionOnlyModel(weights, attention="soft", n_ctx=None, attn_scale=None, tokenizer=None,
    default_prepend_bos=False)``. ``weights`` may be :class:`HeadWeights` or any model
    :meth:`HeadWeights.from_model` reads (a ``TransformerBridge`` too: its LayerNorms and MLPs are not carried
    over). Without ``W_E`` the model takes residual inputs ``[batch, pos, d_model]``; without ``W_U``
    :meth:`forward` returns the final residual stream. ``tokenizer`` (optional, kept as ``model.tokenizer``, as
    a bridge's): its ``decode`` names tokens in views; with ``default_prepend_bos`` its ``bos_token_id`` starts
    every generated sequence, as a tokenizer that adds a BOS does.
    """

    def __init__(
        self,
        weights: Any,
        *,
        attention: AttentionMode = "soft",
        n_ctx: int | None = None,
        attn_scale: float | None = None,
        tokenizer: Any = None,
        default_prepend_bos: bool = False,
    ) -> None:
        w = HeadWeights.from_model(weights)
        default_prepend_bos = validate.boolean("AttentionOnlyModel: default_prepend_bos", default_prepend_bos)
        if default_prepend_bos and not isinstance(getattr(tokenizer, "bos_token_id", None), int):
            raise validate.fail("AttentionOnlyModel: tokenizer", tokenizer,
                                "a tokenizer with an int bos_token_id when default_prepend_bos is True")
        if not isinstance(attention, str) or attention not in _PATTERNS:
            raise CircuitkitError(
                f"AttentionOnlyModel: given attention={attention!r}; expected one of {sorted(_PATTERNS)}."
            )
        if attn_scale is not None:
            attn_scale = validate.real("AttentionOnlyModel: attn_scale (None for sqrt(d_head))", attn_scale,
                                       minimum=0.0, strict_minimum=True)
        if w.W_pos is not None:
            if n_ctx is not None and n_ctx != w.W_pos.shape[0]:
                raise CircuitkitError(
                    f"AttentionOnlyModel: given n_ctx={n_ctx} but W_pos has {w.W_pos.shape[0]} positions; "
                    "expected them to agree (leave n_ctx as None to use W_pos's)."
                )
            n_ctx = w.W_pos.shape[0]
        elif n_ctx is None:
            n_ctx = DEFAULT_N_CTX
        if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 1:
            raise CircuitkitError(f"AttentionOnlyModel: given n_ctx={n_ctx!r}; expected a positive int.")
        if w.W_U is not None and w.W_E is not None and w.W_U.shape[1] != w.W_E.shape[0]:
            raise CircuitkitError(
                f"AttentionOnlyModel: W_E has {w.W_E.shape[0]} tokens but W_U has {w.W_U.shape[1]}; "
                "expected the same vocabulary."
            )
        self._weights = w
        self.tokenizer = tokenizer
        d_vocab = w.d_vocab if w.d_vocab is not None else (None if w.W_U is None else w.W_U.shape[1])
        self.cfg = ToyConfig(
            **shape_fields(w),
            d_vocab=d_vocab,
            n_ctx=n_ctx,
            attention=attention,
            attn_scale=attn_scale,
            default_prepend_bos=default_prepend_bos,
        )

    # ------------------------------------------------------------------ weights, TransformerLens shapes
    def head_weights(self) -> HeadWeights:
        return self._weights

    @property
    def W_Q(self) -> Float[Tensor, "layer head d_model d_head"]:
        return self._weights.W_Q

    @property
    def W_K(self) -> Float[Tensor, "layer kv_head d_model d_head"]:
        """One entry per key/value group (``kv_head == head`` without grouped-query attention), as the bridge."""
        return self._weights.W_K

    @property
    def W_V(self) -> Float[Tensor, "layer kv_head d_model d_head"]:
        return self._weights.W_V

    @property
    def W_O(self) -> Float[Tensor, "layer head d_head d_model"]:
        return self._weights.W_O

    @property
    def W_E(self) -> Float[Tensor, "d_vocab d_model"] | None:
        return self._weights.W_E

    @property
    def W_U(self) -> Float[Tensor, "d_model d_vocab"] | None:
        return self._weights.W_U

    @property
    def W_pos(self) -> Float[Tensor, "n_ctx d_model"] | None:
        return self._weights.W_pos

    @property
    def device(self) -> torch.device:
        return self._weights.device

    def to(self, device: str | torch.device) -> AttentionOnlyModel:
        """A copy on ``device`` (same settings)."""
        return AttentionOnlyModel(
            self._weights.to(device), attention=self.cfg.attention, n_ctx=self.cfg.n_ctx,
            attn_scale=self.cfg.attn_scale, tokenizer=self.tokenizer,
            default_prepend_bos=self.cfg.default_prepend_bos,
        )

    def with_attention(self, attention: AttentionMode) -> AttentionOnlyModel:
        """The same weights with ``"soft"`` or ``"hard"`` attention."""
        return AttentionOnlyModel(
            self._weights, attention=attention, n_ctx=self.cfg.n_ctx, attn_scale=self.cfg.attn_scale,
            tokenizer=self.tokenizer, default_prepend_bos=self.cfg.default_prepend_bos,
        )

    def hook_names(self) -> list[str]:
        """Every hook point, in the order they fire."""
        names = ["hook_embed", "hook_pos_embed"]
        for layer in range(self.cfg.n_layers):
            names += [
                f"blocks.{layer}.hook_resid_pre",
                *(f"blocks.{layer}.attn.hook_{n}" for n in ("q", "k", "v", "attn_scores", "pattern", "z")),
                f"blocks.{layer}.hook_attn_out",
                f"blocks.{layer}.hook_resid_post",
            ]
        return names

    def __repr__(self) -> str:
        c = self.cfg
        return (
            f"AttentionOnlyModel(layers={c.n_layers}, heads={c.n_heads}, d_model={c.d_model}, d_head={c.d_head}, "
            f"d_vocab={c.d_vocab}, n_ctx={c.n_ctx}, attention={c.attention!r})"
        )

    # ------------------------------------------------------------------ running
    def __call__(self, tokens: Tensor) -> Tensor:
        return self.forward(tokens)

    def forward(
        self, tokens: Int[Tensor, "batch pos"] | Float[Tensor, "batch pos d_model"]
    ) -> Float[Tensor, "batch pos d_vocab"]:
        """Logits ``[batch, pos, d_vocab]`` (the final residual ``[batch, pos, d_model]`` without ``W_U``)."""
        return self._run(tokens, {})

    def run_with_hooks(
        self,
        tokens: Tensor,
        fwd_hooks: Iterable[tuple[str | Callable[[str], bool], HookFn]] = (),
        *,
        start_at_layer: int | None = None,
    ) -> Tensor:
        """Run with ``fwd_hooks = [(name or name_filter, fn), ...]``; ``fn(tensor, hook)`` may return a replacement.

        With ``start_at_layer=l``, ``tokens`` is the residual stream ``[batch, pos, d_model]`` entering layer
        ``l`` (``blocks.{l}.hook_resid_pre`` of an earlier run) and layers ``0 .. l-1`` are skipped, as
        TransformerLens's ``forward(..., start_at_layer=l)``."""
        return self._run(tokens, self._resolve_hooks(fwd_hooks), start_at_layer)

    # ------------------------------------------------------------------ internals
    def _embed(self, tokens: Tensor, hooks: dict[str, list[HookFn]]) -> Tensor:
        w, cfg = self._weights, self.cfg
        if not isinstance(tokens, Tensor):
            raise CircuitkitError(f"AttentionOnlyModel: given {describe(tokens)}; expected a torch.Tensor.")
        if tokens.numel() == 0 or tokens.is_meta:
            raise validate.fail("AttentionOnlyModel: tokens", tokens, "a non-empty tensor with data (not on meta)")
        if w.W_E is not None:
            if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
                raise CircuitkitError(
                    f"AttentionOnlyModel: given {describe(tokens)}; expected integer token ids [batch, pos] "
                    "(this model has an embedding W_E)."
                )
            if tokens.ndim == 1:
                tokens = tokens[None]
            if tokens.ndim != 2:
                raise CircuitkitError(
                    f"AttentionOnlyModel: given tokens of shape {tuple(tokens.shape)}; expected [batch, pos]."
                )
            if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= cfg.d_vocab):
                raise CircuitkitError(
                    f"AttentionOnlyModel: given token ids in [{int(tokens.min())}, {int(tokens.max())}]; "
                    f"expected ids in [0, {cfg.d_vocab})."
                )
            # int64 indices: a uint8 tensor would index as a mask, an int8 one not at all
            resid = self._hook(hooks, "hook_embed", w.W_E[tokens.to(device=w.device, dtype=torch.long)])
        else:
            if not tokens.is_floating_point():
                raise CircuitkitError(
                    f"AttentionOnlyModel: given {describe(tokens)}; expected a float residual input "
                    f"[batch, pos, {cfg.d_model}] (this model has no W_E, so it takes residual vectors)."
                )
            if tokens.ndim != 3 or tokens.shape[-1] != cfg.d_model:
                raise CircuitkitError(
                    f"AttentionOnlyModel: given {describe(tokens)}; expected shape [batch, pos, {cfg.d_model}]."
                )
            if not bool(torch.isfinite(tokens).all()):
                raise CircuitkitError("AttentionOnlyModel: given a residual input with NaN/inf; expected finite.")
            resid = self._hook(hooks, "hook_embed", tokens.to(device=w.device, dtype=w.dtype))
        pos = resid.shape[1]
        if pos > cfg.n_ctx:
            raise CircuitkitError(
                f"AttentionOnlyModel: given {pos} positions; expected at most n_ctx={cfg.n_ctx}."
            )
        if w.W_pos is not None:
            pos_embed = w.W_pos[:pos].expand(resid.shape[0], pos, cfg.d_model)
            resid = resid + self._hook(hooks, "hook_pos_embed", pos_embed)
        return resid

    def _resume_input(self, resid: Tensor, start_at_layer: Any) -> Tensor:
        cfg = self.cfg
        if isinstance(start_at_layer, bool) or not isinstance(start_at_layer, int):
            raise CircuitkitError(f"start_at_layer: given {describe(start_at_layer)}; expected an int layer index.")
        if not 0 <= start_at_layer <= cfg.n_layers:
            raise CircuitkitError(
                f"start_at_layer: given {start_at_layer}; expected a layer in [0, {cfg.n_layers}]."
            )
        if not isinstance(resid, Tensor) or not resid.is_floating_point() or resid.ndim != 3 or (
            resid.shape[-1] != cfg.d_model
        ) or resid.is_meta:
            raise CircuitkitError(
                f"AttentionOnlyModel: given {describe(resid)} with start_at_layer={start_at_layer}; expected the "
                f"residual stream [batch, pos, {cfg.d_model}] entering that layer."
            )
        if resid.shape[1] > cfg.n_ctx:
            raise CircuitkitError(
                f"AttentionOnlyModel: given {resid.shape[1]} positions; expected at most n_ctx={cfg.n_ctx}."
            )
        if not bool(torch.isfinite(resid).all()):
            raise CircuitkitError("AttentionOnlyModel: given a residual stream with NaN/inf; expected finite.")
        return resid.to(device=self._weights.device, dtype=self._weights.dtype)

    def _run(self, tokens: Tensor, hooks: dict[str, list[HookFn]], start_at_layer: int | None = None) -> Tensor:
        w, cfg = self._weights, self.cfg
        pattern_fn = _PATTERNS[cfg.attention]
        # No no_grad here: the weights never require grad, and attribution needs gradients w.r.t. activations.
        if start_at_layer is None:
            resid, first_layer = self._embed(tokens, hooks), 0
        else:
            resid, first_layer = self._resume_input(tokens, start_at_layer), start_at_layer
        pos = resid.shape[1]
        future = torch.triu(torch.ones(pos, pos, dtype=torch.bool, device=w.device), diagonal=1)
        for layer in range(first_layer, cfg.n_layers):
            prefix, attn = f"blocks.{layer}.", f"blocks.{layer}.attn."
            resid = self._hook(hooks, prefix + "hook_resid_pre", resid)
            q = torch.einsum("bpm,hmd->bphd", resid, w.W_Q[layer])
            k = torch.einsum("bpm,gmd->bpgd", resid, w.W_K[layer])
            v = torch.einsum("bpm,gmd->bpgd", resid, w.W_V[layer])
            if w.b_Q is not None:
                q = q + w.b_Q[layer]
            if w.b_K is not None:
                k = k + w.b_K[layer]
            if w.b_V is not None:
                v = v + w.b_V[layer]
            q = self._hook(hooks, attn + "hook_q", q)
            k = self._hook(hooks, attn + "hook_k", k)
            v = self._hook(hooks, attn + "hook_v", v)
            k_full = k.repeat_interleave(w.group_size, dim=2)  # [batch, pos, head, d_head]
            v_full = v.repeat_interleave(w.group_size, dim=2)
            scores = torch.einsum("bqhd,bkhd->bhqk", q, k_full) / cfg.scale
            scores = scores.masked_fill(future, float("-inf"))
            scores = self._hook(hooks, attn + "hook_attn_scores", scores)
            pattern = self._hook(hooks, attn + "hook_pattern", pattern_fn(scores))
            z = self._hook(hooks, attn + "hook_z", torch.einsum("bhqk,bkhd->bqhd", pattern, v_full))
            attn_out = torch.einsum("bqhd,hdm->bqm", z, w.W_O[layer])
            if w.b_O is not None:
                attn_out = attn_out + w.b_O[layer]
            attn_out = self._hook(hooks, prefix + "hook_attn_out", attn_out)
            resid = self._hook(hooks, prefix + "hook_resid_post", resid + attn_out)
        out = resid if w.W_U is None else resid @ w.W_U
        return validate.finite_result("AttentionOnlyModel", out, why="inputs or weights too large for "
                                      f"{out.dtype}, or a hook's replacement holding NaN/inf")
