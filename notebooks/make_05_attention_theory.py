"""Generate ``05_attention_theory.ipynb`` (committed without outputs).

Run: ``python notebooks/make_05_attention_theory.py``.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

CELLS = [
    new_markdown_cell(
        "# Attention theory, computed\n\n"
        "The seed exercise sets (`seeds/` beside the repository: 000 Transformer theory, 002 a textbook chapter, "
        "003 *Understanding Deep Learning* ch. 12, 004 a course's problem set) ask for proofs and back-of-the-"
        "envelope numbers about attention. `circuitkit.theory` turns each computable one into a function that "
        "**measures** the quantity; this notebook shows each measurement next to its closed form. The same "
        "comparisons, with named tolerances, are the tests in `tests/test_theory_*.py`.\n\n"
        "Convention: row vectors, as in TransformerLens (`q = x @ W_Q`); everything is float64."
    ),
    new_code_cell(
        "import math\n\n"
        "import numpy as np\n"
        "import torch\n"
        "import torch.nn.functional as F\n\n"
        "from circuitkit import theory\n\n"
        "g = torch.Generator().manual_seed(0)\n\n\n"
        "def randn(*shape):\n"
        "    return torch.randn(*shape, generator=g, dtype=torch.float64)"
    ),
    new_markdown_cell(
        "## Scaled dot-product attention (002 ex. 13.19-13.20, 004 part 2b)\n\n"
        "`softmax(q k^T / sqrt(d_k) + mask) v`, in numpy and in torch. `key_padding_mask` marks padding with "
        "True (the `nn.MultiheadAttention` convention); torch's boolean `attn_mask` means the opposite."
    ),
    new_code_cell(
        "q, k, v = randn(2, 6, 8), randn(2, 6, 8), randn(2, 6, 4)\n"
        "pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])  # sequence 1 has 2 padding keys\n"
        "ours = theory.sdpa_torch(q, k, v, causal=True, key_padding_mask=pad)\n"
        "allowed = ~pad[:, None, :] & torch.ones(6, 6, dtype=torch.bool).tril()\n"
        "ref = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)\n"
        "ours_np = theory.sdpa_numpy(q.numpy(), k.numpy(), v.numpy(), causal=True, key_padding_mask=pad.numpy())\n"
        "print(f'torch version vs F.scaled_dot_product_attention: {(ours - ref).abs().max():.1e}')\n"
        "print(f'numpy version vs F.scaled_dot_product_attention: {np.abs(ours_np - ref.numpy()).max():.1e}')"
    ),
    new_markdown_cell(
        "## Multi-head, grouped-query and multi-query attention (002 ex. 13.23)\n\n"
        "`W_K`/`W_V` with `kv_head` groups: `kv_head = head` is multi-head attention, 1 is multi-query. "
        "Decoding with a KV cache stores only the groups, so the cache shrinks by `head / kv_head`. "
        "The measured cache (bytes of the tensors actually held) equals `theory.kv_cache_bytes`."
    ),
    new_code_cell(
        "n_heads, d_model, d_head, pos = 12, 48, 4, 16\n"
        "x = randn(1, pos, d_model)\n"
        "for n_kv in (12, 4, 1):\n"
        "    W = [randn(n_heads, d_model, d_head), randn(n_kv, d_model, d_head), randn(n_kv, d_model, d_head),\n"
        "         randn(n_heads, d_head, d_model)]\n"
        "    run = theory.decode_with_kv_cache(x, *W)\n"
        "    full = theory.multi_head_attention(x, *W, causal=True)\n"
        "    formula = theory.kv_cache_bytes(1, n_kv, d_head, pos, x.element_size())\n"
        "    print(f'kv_head={n_kv:2d}: cache {run.cache_bytes:6d} B (formula {formula:6d} B), '\n"
        "          f'cached decode vs full causal attention {(run.output - full).abs().max():.1e}')\n"
        "print(f'MQA saving for a 12-head model: {theory.kv_cache_saving(12, 1):.1%} of the cache')"
    ),
    new_markdown_cell(
        "## Permutation equivariance (000 ex. 1.1, 002 ex. 13.2, 003 problem 12.3)\n\n"
        "Without positions or masks, `Attn(P X) = P Attn(X)`. A causal mask breaks it."
    ),
    new_code_cell(
        "x = randn(7, 6)\n"
        "W_Q, W_K, W_V = randn(6, 4), randn(6, 4), randn(6, 3)\n"
        "perm = [3, 0, 6, 1, 5, 2, 4]\n"
        "for causal in (False, True):\n"
        "    error = theory.permutation_equivariance_error(x, W_Q, W_K, W_V, perm, causal=causal)\n"
        "    print(f'causal={causal}: max |Attn(PX) - P Attn(X)| = {error:.1e}')"
    ),
    new_markdown_cell(
        "## Why divide by sqrt(d_k) (000 ex. 1.2, 004 part 1a, 002 ex. 13.28)\n\n"
        "With i.i.d. N(0, 1) entries `Var(q.k) = d_k`; dividing by `sqrt(d_k)` brings it back to 1. Unscaled, "
        "the softmax tends to one-hot as `d_k` grows (its largest weight tends to 1)."
    ),
    new_code_cell(
        "print(' d_k   Var(q.k)  closed form   Var(q.k/sqrt d_k)   max weight unscaled / scaled')\n"
        "for d_k in (1, 16, 256):\n"
        "    raw = theory.dot_product_variance(d_k, n_samples=20_000, seed=d_k)\n"
        "    scaled = theory.dot_product_variance(d_k, n_samples=20_000, scaled=True, seed=d_k)\n"
        "    sat_raw = theory.softmax_saturation(d_k, n_samples=500, seed=d_k)\n"
        "    sat_scaled = theory.softmax_saturation(d_k, n_samples=500, scaled=True, seed=d_k)\n"
        "    print(f'{d_k:4d} {raw.variance:10.2f} {raw.closed_form_variance:12.0f} {scaled.variance:19.3f}'\n"
        "          f'   {sat_raw:.3f} / {sat_scaled:.3f}')"
    ),
    new_markdown_cell(
        "## The softmax Jacobian and its saturation (003 problem 12.4)\n\n"
        "`d softmax(z)/dz = diag(a) - a a^T`. For `z = (-3, 1, 100, 5, -1)` one input dominates and all 25 "
        "derivatives are below 1e-40: no gradient flows back. `torch.func.jacrev` agrees except on the dominant "
        "diagonal entry `y_3 (1 - y_3) ~ 5.6e-42`, which autograd (like `a - a^2`) rounds to 0 in float64; "
        "`softmax_jacobian` writes `1 - y_i` as the sum of the other weights and keeps it."
    ),
    new_code_cell(
        "z = torch.tensor([-3.0, 1.0, 100.0, 5.0, -1.0], dtype=torch.float64)\n"
        "J = theory.softmax_jacobian(z)\n"
        "print(J)\n"
        "print('largest |dy_i/dz_j|:', J.abs().max().item())\n"
        "autograd = torch.func.jacrev(lambda t: t.softmax(0))(z)\n"
        "print('dy_3/dz_3: closed form', J[2, 2].item(), ' autograd', autograd[2, 2].item())\n"
        "print('max |closed form - autograd| elsewhere:', (J - autograd).fill_diagonal_(0).abs().max().item())"
    ),
    new_markdown_cell(
        "## Rank of an attention output (000 ex. 1.3)\n\n"
        "For the bilinear `(Q K^T) V` the rank is at most `min(n, d_k, d_v)`. For **softmax** attention the `d_k` "
        "bound does not hold: `exp` of a rank-`d_k` score matrix is generically full rank, so the bound is "
        "`min(n, d_v)`. With `H` concatenated heads and `W_O`: `min(n, H d_v, d_model)`."
    ),
    new_code_cell(
        "r = theory.attention_rank(n=8, d_k=1, d_v=8, n_heads=3)\n"
        "print(f'linear  (QK^T)V: rank {r.linear} (bound {r.linear_bound})')\n"
        "print(f'softmax attention: rank {r.softmax} (bound {r.softmax_bound}) > d_k = 1')\n"
        "print(f'3 heads + W_O: rank {r.multi_head} (bound {r.multi_head_bound})')"
    ),
    new_markdown_cell(
        "## Linear attention is one step of gradient descent (000 ex. 1.4)\n\n"
        "From `W_0 = 0` on `L(W) = 1/2 ||XW - Y||^2`, one step gives `W_1 = lr X^T Y`, so "
        "`x_test W_1 = lr (x_test X^T) Y`: linear attention with `Q = x_test, K = X, V = Y`, exactly when `lr = 1`."
    ),
    new_code_cell(
        "X, Y, x_test = randn(20, 5), randn(20, 2), randn(3, 5)\n"
        "for lr in (1.0, 0.1):\n"
        "    res = theory.linear_attention_gd(X, Y, x_test, lr=lr)\n"
        "    print(f'lr = {lr}: max |attention - GD prediction| = {res.max_abs_diff:.2e}')"
    ),
    new_markdown_cell(
        "## Positional encodings (000 ex. 1.6, 002 ex. 13.15-13.16, 13.26-13.27)\n\n"
        "Sinusoidal: `PE[pos + k] = PE[pos] @ M_k` with one block-rotation `M_k` for every position. "
        "RoPE: `<R_m q, R_n k>` depends only on `n - m`."
    ),
    new_code_cell(
        "pe = theory.sinusoidal_encoding(2, 4)\n"
        "print('PE(0,0), PE(0,1), PE(1,0), PE(1,1) for d_model = 4:', pe[:, :2].flatten().tolist())\n"
        "for k in (1, 5, 50):\n"
        "    error = theory.sinusoidal_offset_error(100, 16, k)\n"
        "    print(f'offset {k:2d}: max |PE[pos+k] - PE[pos] M_k| = {error:.1e}')\n"
        "q, kv = randn(8), randn(8)\n"
        "print('RoPE scores for (m, n) = (2, 5), (102, 105), (1002, 1005):',\n"
        "      [round(theory.rope_score(q, kv, m, m + 3), 12) for m in (2, 102, 1002)])\n"
        "print('R_m for d = 2, m = 1:\\n', theory.rope_rotation_matrix(1, 2))"
    ),
    new_markdown_cell(
        "## LayerNorm output norm (004 part 3b) and linear attention in O(N) (003 problem 12.10)\n\n"
        "With `eps = 0`, `||LN(x) - beta 1|| = |gamma| sqrt(d)` for every input. Replacing `exp(k.q)` by "
        "`g(k).g(q)` lets the key sum be taken first: `O(N d^2)` instead of `O(N^2 d)`, same output."
    ),
    new_code_cell(
        "x = randn(4, 64) * 3 + 1\n"
        "print('||LN(x) - beta||:', theory.layernorm_output_norm(x, gamma=2.0, beta=0.5).tolist(),\n"
        "      ' closed form:', 2.0 * math.sqrt(64))\n"
        "q, k, v = randn(1, 200, 16), randn(1, 200, 16), randn(1, 200, 16)\n"
        "for causal in (False, True):\n"
        "    print(f'causal={causal}: max |O(N^2) - O(N)| = {theory.linear_attention_gap(q, k, v, causal=causal):.1e}')"
    ),
    new_markdown_cell(
        "## Rank collapse (000 task 2.3)\n\n"
        "Fifty attention-only layers, no residuals, no MLPs, random weights. Each layer multiplies by a "
        "row-stochastic matrix, which averages tokens; all singular values but the first vanish relative to it "
        "(here within a handful of layers, down to float64 rounding)."
    ),
    new_code_cell(
        "collapse = theory.rank_collapse(50, n_tokens=32, d_model=32, plot_layers=(1, 10, 25, 50))\n"
        "print('sigma_2 / sigma_1 at layers 0, 1, 2, 3, 10, 50:',\n"
        "      [f'{collapse.second_to_first(layer):.1e}' for layer in (0, 1, 2, 3, 10, 50)])\n"
        "collapse.figure"
    ),
    new_markdown_cell("## Calculators and the seeds' worked answers"),
    new_code_cell(
        "n, d = theory.chinchilla_optimal(1.2e24)\n"
        "rows = [\n"
        "    ('000 1.5  Chinchilla N, D for C = 1.2e24', f'{n:.3g}, {d:.3g}'),\n"
        "    ('000 1.7  max collapse rate keeping 10% after 12 layers',\n"
        "     f'{theory.rank_collapse_max_rate(0.1, 12):.4f}'),\n"
        "    ('000 1.9  JL dimension, m = 1e12, eps = 0.1', theory.jl_min_dim(1e12, 0.1)),\n"
        "    ('002 13.12 params, L=24, d=1024, V=50000', f'{theory.param_count(24, 1024, 50_000):,}'),\n"
        "    ('002 13.13 training FLOPs, 13B x 2T tokens', f'{theory.training_flops(13e9, 2e12):.3g}'),\n"
        "    ('002 13.14 KV cache per token, L=80, h=64, d=128 fp16',\n"
        "     f'{theory.kv_cache_bytes(80, 64, 128, 1, 2) / 2**20} MiB'),\n"
        "    ('002 13.14 KV cache for 32K tokens', f'{theory.kv_cache_bytes(80, 64, 128, 32_768, 2) / 2**30} GiB'),\n"
        "    ('002 13.18 Chinchilla for C = 1e22', '{:.3g}, {:.3g}'.format(*theory.chinchilla_optimal(1e22))),\n"
        "    ('002 13.30 MHA params, d=512, h=8 and h=64',\n"
        "     (theory.mha_param_count(512, 8), theory.mha_param_count(512, 64))),\n"
        "    ('004 2a  receptive field, 3 layers, 2 heads', theory.receptive_field(3, 2)),\n"
        "    ('004 2d  bottleneck, n=16, d_model=4096', theory.multi_head_complexity(16, 16, 128, 32).bottleneck),\n"
        "]\n"
        "for name, value in rows:\n"
        "    print(f'{name:58s} {value}')"
    ),
]


def main() -> None:
    notebook = new_notebook(cells=CELLS)
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = Path(__file__).with_name("05_attention_theory.ipynb")
    nbformat.write(notebook, path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
