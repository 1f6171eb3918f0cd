"""circuitkit's own Llama-style decoder: a Hugging Face Llama, Qwen2 or Mistral checkpoint run without
transformers or TransformerLens, with TransformerLens's hook names.

Why it exists: on a GPU the whole ``circuitkit scan DIR`` of a 1B model spent more time importing transformers and
TransformerLens (about 7 s) than scanning. This module runs the same computation as Hugging Face's eager
``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` / ``MistralForCausalLM`` (checked against them and against the bridge's
hooks in ``tests/test_decoder_model.py``), so a scan of such a directory needs torch, safetensors and tokenizers only.

The computation, per layer ``l`` (row vectors; ``h`` query heads, ``g`` key/value heads, ``d`` = d_head)::

    x          = ln1(resid_pre)                       RMSNorm: w * x / sqrt(mean(x^2) + eps), in float32
    q          = x @ W_q + b_q                        [batch, pos, h, d]   hook_q   (before the rotation)
    k, v       = x @ W_k + b_k, x @ W_v + b_v         [batch, pos, g, d]   hook_k, hook_v
    q', k'     = rope(q), rope(k)                     hook_rot_q, hook_rot_k
    scores     = q' . k'[group of each head] / sqrt(d), lowest float above the diagonal  [batch, h, q_pos, k_pos]
    pattern    = softmax(scores)  (float32, then the weights' dtype)
    z          = pattern @ v                          [batch, pos, h, d]   hook_z
    attn_out   = z @ W_o (+ b_o)                      hook_attn_out
    resid_mid  = resid_pre + attn_out
    mlp_out    = W_down (silu(W_gate y) * (W_up y))   y = ln2(resid_mid);  hook_post = the product (the neurons)
    resid_post = resid_mid + mlp_out
    logits     = ln_final(resid_post[L-1]) @ W_U

``rope`` rotates each pair ``(i, i + d/2)`` by ``pos * theta_i`` with ``theta_i = base^(-2i/d)`` (Llama 3's
frequency rescaling applied where the config names it). The hooks, in the order they fire: ``hook_embed``, per
layer ``hook_resid_pre``, ``attn.hook_q/k/v``, ``attn.hook_rot_q/rot_k``, ``attn.hook_attn_scores``,
``attn.hook_pattern``, ``attn.hook_z``, ``hook_attn_out``, ``hook_resid_mid``, ``ln2.hook_in`` (the MLP norm's
input: replacing it changes the MLP's input only), ``mlp.hook_in`` (after the norm), ``mlp.hook_pre`` (the gate),
``mlp.hook_post``, ``hook_mlp_out``, ``hook_resid_post``; then ``ln_final.hook_scale`` ``[batch, pos, 1]`` and
``ln_final.hook_normalized`` (``x / scale``, before the weight). ``run_with_hooks(resid, start_at_layer=l)``
resumes from the residual stream entering layer ``l``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from circuitkit import validate
from circuitkit.errors import CircuitkitError
from circuitkit.models.toy import HookPoints, ToyHook
from circuitkit.weights import HeadWeights

HookFn = Callable[[Tensor, ToyHook], Tensor | None]


@dataclass
class DecoderConfig:
    """Shapes and settings of a :class:`DecoderModel` (field names as TransformerLens's cfg where it has one)."""

    n_layers: int
    n_heads: int
    n_key_value_heads: int
    d_model: int
    d_head: int
    d_mlp: int
    d_vocab: int
    n_ctx: int
    eps: float
    rotary_base: float
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    rope_scaling: dict[str, float] | None = None
    default_prepend_bos: bool = True
    model_name: str = "decoder"
    family: str = "Llama"
    device: Any = "cpu"
    dtype: torch.dtype = torch.float32
    normalization_type: str = "RMS"
    attn_only: bool = False
    attention_dir: str = "causal"
    positional_embedding_type: str = "rotary"
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("n_layers", "n_heads", "n_key_value_heads", "d_model", "d_head", "d_mlp", "d_vocab", "n_ctx"):
            validate.positive_int(f"DecoderConfig: {name}", getattr(self, name))
        if self.n_heads % self.n_key_value_heads:
            raise validate.fail("DecoderConfig: n_key_value_heads", self.n_key_value_heads,
                                f"a divisor of n_heads={self.n_heads}")
        validate.real("DecoderConfig: eps", self.eps, minimum=0.0, strict_minimum=True)
        validate.real("DecoderConfig: rotary_base", self.rotary_base, minimum=0.0, strict_minimum=True)
        if self.d_head % 2:
            raise validate.fail("DecoderConfig: d_head", self.d_head, "an even size (rotary embeddings pair dims)")


class RMSNorm(torch.nn.Module):
    """``w * x / sqrt(mean(x^2) + eps)``, computed in float32 and cast back before the weight (as Hugging Face)."""

    def __init__(self, weight: Tensor, eps: float) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(weight, requires_grad=False)
        self.eps = eps

    def scale(self, x: Tensor) -> Tensor:
        """``sqrt(mean(x^2) + eps)`` ``[..., 1]`` in float32."""
        return (x.float().pow(2).mean(-1, keepdim=True) + self.eps).sqrt()

    def forward(self, x: Tensor) -> Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class DecoderBlock(torch.nn.Module):
    """One layer's weights, in Hugging Face's layout (``[out, in]`` matrices)."""

    def __init__(self, tensors: dict[str, Tensor], cfg: DecoderConfig) -> None:
        super().__init__()
        frozen = lambda t: None if t is None else torch.nn.Parameter(t, requires_grad=False)  # noqa: E731
        self.ln1 = RMSNorm(tensors["input_layernorm.weight"], cfg.eps)
        self.ln2 = RMSNorm(tensors["post_attention_layernorm.weight"], cfg.eps)
        for name in ("q", "k", "v", "o"):
            setattr(self, f"{name}_weight", frozen(tensors[f"self_attn.{name}_proj.weight"]))
            setattr(self, f"{name}_bias", frozen(tensors.get(f"self_attn.{name}_proj.bias")))
        for name in ("gate", "up", "down"):
            setattr(self, f"{name}_weight", frozen(tensors[f"mlp.{name}_proj.weight"]))
            setattr(self, f"{name}_bias", frozen(tensors.get(f"mlp.{name}_proj.bias")))


def rotary_frequencies(cfg: DecoderConfig, device: torch.device) -> Tensor:
    """``theta_i = base^(-2i/d)`` for ``i < d/2`` (float32), rescaled as Llama 3 does where the config says so:
    wavelengths above ``original / low_freq_factor`` divided by ``factor``, below ``original / high_freq_factor``
    kept, and a smooth mix between."""
    d = cfg.d_head
    inv = 1.0 / (cfg.rotary_base ** (torch.arange(0, d, 2, dtype=torch.int64, device=device).float() / d))
    scaling = cfg.rope_scaling
    if not scaling:
        return inv
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    wavelength = 2 * math.pi / inv
    scaled = torch.where(wavelength > original / low, inv / factor, inv)
    smooth = (original / wavelength - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelength < original / high) & ~(wavelength > original / low)
    return torch.where(medium, smoothed, scaled)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """``x * cos + rotate_half(x) * sin`` on ``[batch, pos, heads, d]`` with ``cos, sin`` ``[pos, d]``."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class DecoderModel(HookPoints, torch.nn.Module):
    """A Llama-style decoder (see the module docstring) with TransformerLens's hook names and weight shapes.

    Build it with :func:`circuitkit.models.load_model` (``bridge=False``) from a Hugging Face directory, or
    ``DecoderModel(tensors, cfg, tokenizer=...)`` from Hugging Face's state dict (``model.`` prefixes included).
    ``W_Q`` ... ``W_U`` are read as TransformerLens lays them out (``W_Q [layer, head, d_model, d_head]``, key/value
    weights per key/value head), so :class:`~circuitkit.HeadWeights` and every circuitkit score read them as they
    read a ``TransformerBridge``'s. Hooks (:class:`~circuitkit.models.toy.HookPoints`): a replacement of another
    dtype is cast to the activation's, as Hugging Face's modules take it.
    """

    CAST_REPLACEMENTS = True

    def __init__(self, tensors: dict[str, Tensor], cfg: DecoderConfig, *, tokenizer: Any = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.tokenizer = tokenizer
        strip = {key.removeprefix("model."): value for key, value in tensors.items()}
        self.embed = torch.nn.Parameter(strip["embed_tokens.weight"], requires_grad=False)
        self.blocks = torch.nn.ModuleList(
            DecoderBlock({key[len(f"layers.{layer}."):]: value for key, value in strip.items()
                          if key.startswith(f"layers.{layer}.")}, cfg)
            for layer in range(cfg.n_layers)
        )
        self.ln_final = RMSNorm(strip["norm.weight"], cfg.eps)
        head = strip.get("lm_head.weight")
        self.unembed_weight = None if cfg.tie_word_embeddings or head is None else (
            torch.nn.Parameter(head, requires_grad=False))
        self.hook_dict = {name: None for name in self.hook_names()}
        self.graph_positions: Tensor | None = None  # see _unembed

    # ------------------------------------------------------------------ TransformerLens-shaped weights
    def _per_head(self, name: str, heads: int) -> Tensor:
        """``[layer, heads, d_model, d_head]`` from the ``[heads * d_head, d_model]`` projections."""
        d, m = self.cfg.d_head, self.cfg.d_model
        return torch.stack([getattr(b, f"{name}_weight").detach().view(heads, d, m).transpose(1, 2)
                            for b in self.blocks])

    def _bias(self, name: str, heads: int) -> Tensor | None:
        if getattr(self.blocks[0], f"{name}_bias") is None:
            return None
        return torch.stack([getattr(b, f"{name}_bias").detach().view(heads, self.cfg.d_head) for b in self.blocks])

    @property
    def W_Q(self) -> Tensor:
        return self._per_head("q", self.cfg.n_heads)

    @property
    def W_K(self) -> Tensor:
        return self._per_head("k", self.cfg.n_key_value_heads)

    @property
    def W_V(self) -> Tensor:
        return self._per_head("v", self.cfg.n_key_value_heads)

    @property
    def W_O(self) -> Tensor:
        """``[layer, head, d_head, d_model]``."""
        c = self.cfg
        return torch.stack([b.o_weight.detach().view(c.d_model, c.n_heads, c.d_head).permute(1, 2, 0)
                            for b in self.blocks])

    @property
    def b_Q(self) -> Tensor | None:
        return self._bias("q", self.cfg.n_heads)

    @property
    def b_K(self) -> Tensor | None:
        return self._bias("k", self.cfg.n_key_value_heads)

    @property
    def b_V(self) -> Tensor | None:
        return self._bias("v", self.cfg.n_key_value_heads)

    @property
    def b_O(self) -> Tensor | None:
        return None if self.blocks[0].o_bias is None else torch.stack([b.o_bias.detach() for b in self.blocks])

    @property
    def W_E(self) -> Tensor:
        return self.embed.detach()

    @property
    def W_U(self) -> Tensor:
        """``[d_model, d_vocab]`` (the embedding's transpose where the two are tied)."""
        return (self.embed if self.unembed_weight is None else self.unembed_weight).detach().T

    def head_weights(self) -> HeadWeights:
        values = {name: getattr(self, name) for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O",
                                                          "W_E", "W_U")}
        return HeadWeights(**{name: value for name, value in values.items() if value is not None})

    def hook_names(self) -> list[str]:
        """Every hook point, in the order they fire."""
        names = ["hook_embed"]
        for layer in range(self.cfg.n_layers):
            a, b = f"blocks.{layer}.attn.", f"blocks.{layer}."
            names += [b + "hook_resid_pre", *(a + f"hook_{n}" for n in ("q", "k", "v", "rot_q", "rot_k",
                                                                          "attn_scores", "pattern", "z")),
                      b + "hook_attn_out", b + "hook_resid_mid", b + "ln2.hook_in", b + "mlp.hook_in",
                      b + "mlp.hook_pre", b + "mlp.hook_post", b + "hook_mlp_out", b + "hook_resid_post"]
        return names + ["ln_final.hook_scale", "ln_final.hook_normalized"]

    def __repr__(self) -> str:
        c = self.cfg
        return (f"DecoderModel({c.family}: layers={c.n_layers}, heads={c.n_heads}, kv_heads={c.n_key_value_heads}, "
                f"d_model={c.d_model}, d_head={c.d_head}, d_mlp={c.d_mlp}, d_vocab={c.d_vocab})")

    # ------------------------------------------------------------------ running
    def forward(self, tokens: Tensor, *, logits_to_keep: Tensor | None = None) -> Tensor:
        """Logits ``[batch, pos, d_vocab]`` of token ids ``[batch, pos]`` (``logits_to_keep``: a 1-D tensor of
        positions, the logits there only, as Hugging Face's argument: the unembedding runs only there)."""
        return self._run(tokens, {}, None, logits_to_keep)

    def run_with_hooks(self, tokens: Tensor, fwd_hooks: Iterable[tuple[Any, HookFn]] = (), *,
                       start_at_layer: int | None = None, logits_to_keep: Tensor | None = None) -> Tensor:
        """Run with ``fwd_hooks = [(name or name_filter, fn), ...]``; ``fn(tensor, hook)`` may return a replacement.
        With ``start_at_layer=l``, ``tokens`` is the residual stream entering layer ``l``; ``logits_to_keep`` as
        for :meth:`forward`."""
        return self._run(tokens, self._resolve_hooks(fwd_hooks), start_at_layer, logits_to_keep)

    def _input(self, tokens: Any, start_at_layer: Any) -> tuple[Tensor, int]:
        c = self.cfg
        if not isinstance(tokens, Tensor) or tokens.numel() == 0 or tokens.is_meta:
            raise validate.fail("DecoderModel: input", tokens, "a non-empty tensor with data")
        if start_at_layer is not None:
            if isinstance(start_at_layer, bool) or not isinstance(start_at_layer, int) or not (
                    0 <= start_at_layer <= c.n_layers):
                raise validate.fail("start_at_layer", start_at_layer, f"a layer in [0, {c.n_layers}]")
            if not tokens.is_floating_point() or tokens.ndim != 3 or tokens.shape[-1] != c.d_model:
                raise validate.fail("DecoderModel: residual input", tokens, f"[batch, pos, {c.d_model}] floats")
            resid, first = tokens.to(device=self.embed.device, dtype=self.embed.dtype), start_at_layer
        else:
            if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
                raise validate.fail("DecoderModel: tokens", tokens, "integer token ids [batch, pos]")
            tokens = tokens[None] if tokens.ndim == 1 else tokens
            if tokens.ndim != 2:
                raise validate.fail("DecoderModel: tokens", tokens, "token ids of shape [batch, pos]")
            low, high = int(tokens.min()), int(tokens.max())
            if low < 0 or high >= c.d_vocab:
                raise CircuitkitError(f"DecoderModel: given token ids in [{low}, {high}]; expected ids in "
                                      f"[0, {c.d_vocab}).")
            resid, first = self.embed[tokens.to(device=self.embed.device, dtype=torch.long)], 0
        if resid.shape[1] > c.n_ctx:
            raise CircuitkitError(f"DecoderModel: given {resid.shape[1]} positions; expected at most n_ctx={c.n_ctx}.")
        return resid, first

    def _run(self, tokens: Tensor, hooks: dict[str, list[HookFn]], start_at_layer: int | None = None,
             logits_to_keep: Tensor | None = None) -> Tensor:
        c = self.cfg
        resid, first = self._input(tokens, start_at_layer)
        if first == 0:
            resid = self._hook(hooks, "hook_embed", resid)
        batch, pos = resid.shape[:2]
        # the frequencies in float32 at every pass (a few numbers): a buffer would be cast with the weights
        inv_freq = rotary_frequencies(c, resid.device)
        angles = torch.arange(pos, device=resid.device, dtype=torch.float32)[:, None] * inv_freq[None, :]
        angles = torch.cat((angles, angles), dim=-1)
        cos, sin = angles.cos().to(resid.dtype), angles.sin().to(resid.dtype)
        future = torch.triu(torch.ones(pos, pos, dtype=torch.bool, device=resid.device), diagonal=1)
        group = c.n_heads // c.n_key_value_heads
        linear = torch.nn.functional.linear
        for layer in range(first, c.n_layers):
            block, a, b = self.blocks[layer], f"blocks.{layer}.attn.", f"blocks.{layer}."
            resid = self._hook(hooks, b + "hook_resid_pre", resid)
            x = block.ln1(resid)
            q = self._hook(hooks, a + "hook_q", linear(x, block.q_weight, block.q_bias).view(
                batch, pos, c.n_heads, -1))
            k = self._hook(hooks, a + "hook_k", linear(x, block.k_weight, block.k_bias).view(
                batch, pos, c.n_key_value_heads, -1))
            v = self._hook(hooks, a + "hook_v", linear(x, block.v_weight, block.v_bias).view(
                batch, pos, c.n_key_value_heads, -1))
            q = self._hook(hooks, a + "hook_rot_q", _rotate(q, cos, sin))
            k = self._hook(hooks, a + "hook_rot_k", _rotate(k, cos, sin))
            keys = k.transpose(1, 2).repeat_interleave(group, dim=1)  # [batch, head, pos, d]
            values = v.transpose(1, 2).repeat_interleave(group, dim=1)
            scores = torch.matmul(q.transpose(1, 2), keys.transpose(2, 3)) * (c.d_head ** -0.5)
            # masked with the dtype's lowest value, as Hugging Face's additive mask leaves them
            scores = scores.masked_fill(future, torch.finfo(scores.dtype).min)
            scores = self._hook(hooks, a + "hook_attn_scores", scores)
            pattern = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            pattern = self._hook(hooks, a + "hook_pattern", pattern)
            z = self._hook(hooks, a + "hook_z", torch.matmul(pattern, values).transpose(1, 2))
            attn_out = self._hook(hooks, b + "hook_attn_out", linear(z.reshape(batch, pos, -1), block.o_weight,
                                                                     block.o_bias))
            resid = self._hook(hooks, b + "hook_resid_mid", resid + attn_out)
            y = self._hook(hooks, b + "mlp.hook_in", block.ln2(self._hook(hooks, b + "ln2.hook_in", resid)))
            gate = self._hook(hooks, b + "mlp.hook_pre", linear(y, block.gate_weight, block.gate_bias))
            neurons = self._hook(hooks, b + "mlp.hook_post", torch.nn.functional.silu(gate) * linear(
                y, block.up_weight, block.up_bias))
            mlp_out = self._hook(hooks, b + "hook_mlp_out", linear(neurons, block.down_weight, block.down_bias))
            resid = self._hook(hooks, b + "hook_resid_post", resid + mlp_out)
        scale = self._hook(hooks, "ln_final.hook_scale", self.ln_final.scale(resid))
        normalized = self._hook(hooks, "ln_final.hook_normalized", resid.float() / scale)
        out = self.ln_final.weight * normalized.to(resid.dtype)
        if logits_to_keep is not None:
            out = out.index_select(1, logits_to_keep.to(device=out.device, dtype=torch.long))
        logits = self._unembed(out)
        return validate.finite_result("DecoderModel", logits, why="weights or inputs too large for their dtype, or "
                                      "a hook's replacement holding NaN/inf")

    def _unembed(self, out: Tensor) -> Tensor:
        """``out @ W_U``; where :attr:`graph_positions` is set (by the adapter, for one pass) and gradients flow,
        the product keeps its autograd graph only at those positions (the others computed without one and written
        beside them): the same logits, and a backward pass multiplies the vocabulary matrix only where a loss is
        read (at vocabulary 150k the unembedding is a large share of a pass)."""
        unembed = self.embed if self.unembed_weight is None else self.unembed_weight
        at = self.graph_positions
        if at is None or not out.requires_grad or not torch.is_grad_enabled() or out.ndim != 3:
            return torch.nn.functional.linear(out, unembed)
        at = at[at < out.shape[1]].to(device=out.device, dtype=torch.long)
        others = torch.ones(out.shape[1], dtype=torch.bool, device=out.device)
        others[at] = False
        rest = others.nonzero().flatten()
        logits = torch.empty(*out.shape[:2], unembed.shape[0], dtype=out.dtype, device=out.device)
        with torch.no_grad():
            logits.index_copy_(1, rest, torch.nn.functional.linear(out.index_select(1, rest), unembed))
        return logits.index_copy(1, at, torch.nn.functional.linear(out.index_select(1, at), unembed))


__all__ = ["DecoderBlock", "DecoderConfig", "DecoderModel", "RMSNorm", "rotary_frequencies"]
