"""Back-of-the-envelope calculators from the seed exercises, with their worked answers as tests.

All sizes are validated: negative or zero sizes, non-integers where counts are expected and ``eps`` outside
(0, 1) raise ``CircuitkitError`` naming the value and the expected range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, NamedTuple

from circuitkit.errors import CircuitkitError
from circuitkit.theory._validate import MAX_LAYERS, open_unit, positive_int, positive_real

__all__ = [
    "ChinchillaOptimal",
    "chinchilla_optimal",
    "param_count",
    "mha_param_count",
    "training_flops",
    "inference_flops_per_token",
    "kv_cache_bytes",
    "kv_cache_saving",
    "jl_min_dim",
    "receptive_field",
    "MultiHeadComplexity",
    "multi_head_complexity",
    "rank_collapse_max_rate",
    "SelfAttentionCounts",
    "self_attention_counts",
]


def _finite(name: str, value: float, *inputs: tuple[str, float]) -> float:
    """``value`` if it is a finite float; else one line naming the inputs (the result overflowed float64, about
    1.8e308, or underflowed to 0 where it divides)."""
    if not math.isfinite(value):
        given = ", ".join(f"{n}={v:g}" for n, v in inputs)
        raise CircuitkitError(f"{name}: the result overflows float64 (max about 1.8e308) for {given}; expected "
                              "inputs whose result is representable. Check the units (e.g. 1e9, not 1e900).")
    return value


class ChinchillaOptimal(NamedTuple):
    """Compute-optimal model size ``n_params`` (N) and training tokens ``n_tokens`` (D)."""

    n_params: float
    n_tokens: float


def chinchilla_optimal(
    compute: float, *, tokens_per_param: float = 20.0, flops_per_param_token: float = 6.0
) -> ChinchillaOptimal:
    """Solve ``C = 6 N D`` with ``D = 20 N`` (seed 000 ex. 1.5, 002 ex. 13.18).

    ``N = sqrt(C / (6 * 20))``, ``D = 20 N``; e.g. ``C = 1.2e24`` gives ``N = 1e11``, ``D = 2e12``.
    """
    compute = positive_real("compute", compute)
    tokens_per_param = positive_real("tokens_per_param", tokens_per_param)
    flops_per_param_token = positive_real("flops_per_param_token", flops_per_param_token)
    inputs = (("compute", compute), ("tokens_per_param", tokens_per_param),
              ("flops_per_param_token", flops_per_param_token))
    per_param = _finite("chinchilla_optimal", flops_per_param_token * tokens_per_param, *inputs)
    n = _finite("chinchilla_optimal", math.sqrt(compute / per_param) if per_param > 0 else math.inf, *inputs)
    return ChinchillaOptimal(n, _finite("chinchilla_optimal", tokens_per_param * n, *inputs))


def param_count(n_layers: int, d_model: int, d_vocab: int) -> int:
    """``12 L d^2 + 2 V d`` (seed 002 ex. 13.12, 13.17): 4 d^2 attention + 8 d^2 MLP (d_mlp = 4 d) per layer,
    plus untied embedding and unembedding. Ignores biases, LayerNorms and positional embeddings."""
    n_layers = positive_int("n_layers", n_layers)
    d_model = positive_int("d_model", d_model)
    d_vocab = positive_int("d_vocab", d_vocab)
    return 12 * n_layers * d_model**2 + 2 * d_vocab * d_model


def mha_param_count(d_model: int, n_heads: int) -> int:
    """Weights of one multi-head attention layer: ``h (3 d (d/h) + (d/h) d) = 4 d^2`` for any ``h`` dividing ``d``
    (seed 002 ex. 13.30). Computed per head and summed, so the independence of ``h`` is a result, not an input."""
    d_model = positive_int("d_model", d_model)
    n_heads = positive_int("n_heads", n_heads)
    if d_model % n_heads:
        raise CircuitkitError(
            f"d_model = {d_model} is not divisible by n_heads = {n_heads}; expected d_model = h * d_head."
        )
    d_head = d_model // n_heads
    per_head = 3 * d_model * d_head + d_head * d_model  # W_Q, W_K, W_V in, W_O out
    return n_heads * per_head


def training_flops(n_params: float, n_tokens: float) -> float:
    """``6 N D`` (seed 002 ex. 13.13: 13e9 params x 2e12 tokens = 1.56e23 FLOPs)."""
    n_params, n_tokens = positive_real("n_params", n_params), positive_real("n_tokens", n_tokens)
    return _finite("training_flops", 6.0 * n_params * n_tokens, ("n_params", n_params), ("n_tokens", n_tokens))


def inference_flops_per_token(n_params: float) -> float:
    """``2 N`` for a forward pass (seed 002 ex. 13.29): one multiply and one add per weight per token."""
    n_params = positive_real("n_params", n_params)
    return _finite("inference_flops_per_token", 2.0 * n_params, ("n_params", n_params))


def kv_cache_bytes(
    n_layers: int, n_kv_heads: int, d_head: int, n_tokens: int, bytes_per_value: int = 2, *, batch: int = 1
) -> int:
    """``2 (K and V) * L * n_kv_heads * d_head * n_tokens * bytes_per_value * batch`` (seed 002 ex. 13.14).

    70B-style model, L = 80, 64 heads of d_head 128 in fp16: 2,621,440 bytes (2.5 MiB) per token and
    80 GiB for a 32K (32768) token context.
    """
    n_layers = positive_int("n_layers", n_layers)
    n_kv_heads = positive_int("n_kv_heads", n_kv_heads)
    d_head = positive_int("d_head", d_head)
    n_tokens = positive_int("n_tokens", n_tokens)
    bytes_per_value = positive_int("bytes_per_value", bytes_per_value)
    batch = positive_int("batch", batch)
    return 2 * n_layers * n_kv_heads * d_head * n_tokens * bytes_per_value * batch


def kv_cache_saving(n_heads: int, n_kv_heads: int = 1) -> float:
    """Fraction of the multi-head KV cache saved by sharing K/V across groups: ``1 - n_kv_heads / n_heads``.

    Multi-query attention with 12 heads (seed 002 ex. 13.23) saves 11/12 of the cache, whatever the layer count.
    """
    n_heads = positive_int("n_heads", n_heads)
    n_kv_heads = positive_int("n_kv_heads", n_kv_heads)
    if n_heads % n_kv_heads:
        raise CircuitkitError(
            f"n_kv_heads = {n_kv_heads} does not divide n_heads = {n_heads}; "
            "expected a divisor (1 = MQA, n_heads = MHA)."
        )
    return 1.0 - n_kv_heads / n_heads


def jl_min_dim(n_points: float, eps: float) -> int:
    """Johnson-Lindenstrauss: ``d >= 8 ln(m) / eps^2`` (seed 000 ex. 1.9: m = 1e12, eps = 0.1 -> 22105)."""
    n_points = positive_real("n_points", n_points)
    if n_points < 2:
        raise CircuitkitError(f"n_points = {n_points!r}; expected at least 2 points (distances need pairs).")
    eps = open_unit("eps", eps)
    bound = 8.0 * math.log(n_points) / eps**2 if eps**2 > 0 else math.inf
    return math.ceil(_finite("jl_min_dim", bound, ("n_points", n_points), ("eps", eps)))


def receptive_field(n_layers: int, n_heads: int) -> int:
    """Tokens a node at layer ``n`` can see with argmax attention and residuals: ``(k + 1)^n`` (seed 004 part 2a).

    Each layer branches into the residual path plus one attended position per head. ``n_layers`` is in
    ``[0, MAX_LAYERS]`` (layer 0, the input, sees one token).
    """
    n_layers = positive_int("n_layers", n_layers, minimum=0, maximum=MAX_LAYERS)
    n_heads = positive_int("n_heads", n_heads)
    return (n_heads + 1) ** n_layers


@dataclass(frozen=True)
class MultiHeadComplexity:
    """Multiply-add counts of one multi-head attention call (seed 004 part 2c), ``d_model = h d_head``:

    - ``projections``: ``2 n_q d_model^2`` (Q and output) ``+ 2 n_kv d_model^2`` (K and V),
      Theta(n_t d^2 + n_s d^2);
    - ``attention``: ``2 h n_q n_kv d_head`` (scores and weighted sum) ``+ h n_q n_kv`` (softmax),
      Theta(n_t n_s d);
    - ``bottleneck``: the larger term (projections when d_model is large and sequences short, attention when
      sequences are long and d_model small, seed 004 part 2d).
    """

    projections: int
    attention: int

    @property
    def total(self) -> int:
        return self.projections + self.attention

    @property
    def bottleneck(self) -> Literal["projections", "attention"]:
        return "projections" if self.projections >= self.attention else "attention"


def multi_head_complexity(n_q: int, n_kv: int, d_head: int, n_heads: int) -> MultiHeadComplexity:
    """Cost terms of multi-head attention with query length ``n_q`` and key/value length ``n_kv``."""
    n_q = positive_int("n_q", n_q)
    n_kv = positive_int("n_kv", n_kv)
    d_head = positive_int("d_head", d_head)
    n_heads = positive_int("n_heads", n_heads)
    d_model = n_heads * d_head
    projections = 2 * n_q * d_model**2 + 2 * n_kv * d_model**2
    attention = 2 * n_heads * n_q * n_kv * d_head + n_heads * n_q * n_kv
    return MultiHeadComplexity(projections, attention)


def rank_collapse_max_rate(retained_fraction: float, n_layers: int) -> float:
    """Largest ``lambda`` with ``C e^(-lambda L) >= retained_fraction * C`` (seed 000 ex. 1.7):
    ``lambda <= ln(1 / retained_fraction) / L``; 10 % after 12 layers gives ``ln(10) / 12 = 0.1919``."""
    retained_fraction = open_unit("retained_fraction", retained_fraction)
    n_layers = positive_int("n_layers", n_layers)
    return math.log(1.0 / retained_fraction) / n_layers


@dataclass(frozen=True)
class SelfAttentionCounts:
    """Parameter and attention-weight counts of one self-attention layer on ``N`` inputs of size ``D``
    (seed 003 problem 12.1), next to a fully connected layer on all ``D N`` numbers.

    The seed's worked answer writes "3" biases and ``N^2`` fully connected biases; with ``beta_q, beta_k,
    beta_v`` each ``D x 1`` there are ``3 D`` biases, and a ``DN -> DN`` layer has ``DN`` biases.
    """

    qkv_weights: int  # 3 D^2
    qkv_biases: int  # 3 D
    attention_weights: int  # N^2
    dense_weights: int  # (D N)^2
    dense_biases: int  # D N


def self_attention_counts(n_tokens: int, d: int) -> SelfAttentionCounts:
    """Counts for seed 003 problem 12.1 (see :class:`SelfAttentionCounts`)."""
    n_tokens = positive_int("n_tokens", n_tokens)
    d = positive_int("d", d)
    return SelfAttentionCounts(3 * d * d, 3 * d, n_tokens**2, (d * n_tokens) ** 2, d * n_tokens)
