"""The seed exercises on attention, computed and tested.

- :mod:`~circuitkit.theory.attention`: scaled dot-product attention in numpy and torch with causal and
  key-padding masks, multi-head / multi-query / grouped-query attention with einops, KV-cache decoding,
  and kernelised (linear) attention in its O(N^2) and O(N) forms.
- :mod:`~circuitkit.theory.checks`: each exercise's claim as a function returning the measured quantity.
- :mod:`~circuitkit.theory.encodings`: sinusoidal encodings and RoPE.
- :mod:`~circuitkit.theory.rank_collapse`: singular values of a deep pure-attention stack.
- :mod:`~circuitkit.theory.calculators`: Chinchilla, parameter counts, FLOPs, KV-cache size, JL dimension, ...
"""

from __future__ import annotations

from circuitkit.theory.attention import (
    FeatureMap,
    KVCacheRun,
    decode_with_kv_cache,
    linear_attention_linear,
    linear_attention_quadratic,
    merge_heads,
    multi_head_attention,
    pattern_numpy,
    pattern_torch,
    sdpa_numpy,
    sdpa_torch,
    split_heads,
)
from circuitkit.theory.calculators import (
    ChinchillaOptimal,
    MultiHeadComplexity,
    SelfAttentionCounts,
    chinchilla_optimal,
    inference_flops_per_token,
    jl_min_dim,
    kv_cache_bytes,
    kv_cache_saving,
    mha_param_count,
    multi_head_complexity,
    param_count,
    rank_collapse_max_rate,
    receptive_field,
    self_attention_counts,
    training_flops,
)
from circuitkit.theory.checks import (
    AttentionRank,
    DotProductStats,
    LinearAttentionGD,
    attention_rank,
    dot_product_variance,
    layernorm_output_norm,
    linear_attention_gap,
    linear_attention_gd,
    permutation_equivariance_error,
    rope_offset_error,
    rope_score,
    self_attention,
    sinusoidal_offset_error,
    softmax_jacobian,
    softmax_saturation,
)
from circuitkit.theory.encodings import (
    rope,
    rope_rotation_matrix,
    sinusoidal_encoding,
    sinusoidal_frequencies,
    sinusoidal_offset_map,
)
from circuitkit.theory.rank_collapse import RankCollapse, rank_collapse

__all__ = [
    # attention
    "sdpa_numpy",
    "pattern_numpy",
    "sdpa_torch",
    "pattern_torch",
    "split_heads",
    "merge_heads",
    "multi_head_attention",
    "KVCacheRun",
    "decode_with_kv_cache",
    "FeatureMap",
    "linear_attention_quadratic",
    "linear_attention_linear",
    # checks
    "self_attention",
    "permutation_equivariance_error",
    "DotProductStats",
    "dot_product_variance",
    "softmax_saturation",
    "softmax_jacobian",
    "AttentionRank",
    "attention_rank",
    "LinearAttentionGD",
    "linear_attention_gd",
    "sinusoidal_offset_error",
    "rope_score",
    "rope_offset_error",
    "layernorm_output_norm",
    "linear_attention_gap",
    # encodings
    "sinusoidal_frequencies",
    "sinusoidal_encoding",
    "sinusoidal_offset_map",
    "rope_rotation_matrix",
    "rope",
    # rank collapse
    "RankCollapse",
    "rank_collapse",
    # calculators
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
