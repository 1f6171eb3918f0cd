"""Generate ``02_composition_scores.ipynb`` (committed without outputs).

Run: ``python notebooks/make_02_composition_scores.py``.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

CELLS = [
    new_markdown_cell(
        "# Composition scores: which earlier heads feed which later heads\n\n"
        "A head in layer 1 can read what a head in layer 0 wrote in three ways (Elhage et al. 2021): through its "
        "queries (**Q-composition**), its keys (**K-composition**, the mechanism of induction heads) or its values "
        "(**V-composition**, a *virtual attention head*). The composition score measures how much of the earlier "
        "head's OV circuit the later head's circuit reads:\n\n"
        "`score(a, b) = ||W_A W_B||_F / (||W_A||_F ||W_B||_F)`\n\n"
        "Row convention (TransformerLens, `x @ W`): `W_A = W_V^a W_O^a`; Q: `W_B = W_Q^b W_K^b.T`; "
        "K: `W_B = W_K^b W_Q^b.T`; V: `W_B = W_V^b W_O^b`. The paper's column convention writes the transposes; "
        "the norms are the same. Only pairs with source layer < destination layer exist; the tensor is "
        "`[src_layer, src_head, dst_layer, dst_head]` and exactly 0 elsewhere.\n\n"
        "circuitkit computes every score from `d_head`-sized factors: with `R.T R = V.T V` (Cholesky of a Gram "
        "matrix), `||V O X Y.T||_F = ||(R_V O)(R_Y X.T).T||_F`, so all pairs come from one product "
        "`[L*H*d_head, d_model] @ [d_model, L*H*d_head]`, tiled under a memory budget, followed by block norms."
    ),
    new_code_cell(
        "import math\n"
        "import time\n\n"
        "import torch\n\n"
        "import circuitkit as ck\n"
        "from circuitkit.composition import composition_baseline, composition_scores, top_edges"
    ),
    new_markdown_cell(
        "## A model with three planted circuits\n\n"
        "Random Gaussian heads (2 layers x 4 heads, `d_model` 32, `d_head` 4), then three edges written in by hand. "
        "Each layer-0 head writes into its own 4-dimensional subspace of the residual stream, and one layer-1 head "
        "reads exactly that subspace:\n\n"
        "- `0.1 -> 1.2` by **K**: head 1.2's keys read only where head 0.1 writes;\n"
        "- `0.3 -> 1.0` by **Q**: head 1.0's queries read only where head 0.3 writes;\n"
        "- `0.2 -> 1.3` by **V**: head 1.3's values read only where head 0.2 writes."
    ),
    new_code_cell(
        "L, H, d_model, d_head = 2, 4, 32, 4\n"
        "g = torch.Generator().manual_seed(0)\n\n\n"
        "def randn(*shape):\n"
        "    return torch.randn(*shape, generator=g) / math.sqrt(d_model)\n\n\n"
        "W_Q, W_K, W_V = randn(L, H, d_model, d_head), randn(L, H, d_model, d_head), randn(L, H, d_model, d_head)\n"
        "W_O = randn(L, H, d_head, d_model)\n"
        "eye = torch.eye(d_head)\n\n\n"
        "def subspace(head):  # residual dimensions [4*head, 4*head + 4) belong to layer-0 head `head`\n"
        "    return slice(d_head * head, d_head * (head + 1))\n\n\n"
        "for head in range(H):  # each layer-0 head writes only into its own subspace: W_O[0, h] [d_head, d_model]\n"
        "    W_O[0, head] = 0\n"
        "    W_O[0, head][:, subspace(head)] = torch.randn(d_head, d_head, generator=g)\n\n"
        "for dst_head, src_head, matrix in [(2, 1, W_K), (0, 3, W_Q), (3, 2, W_V)]:  # reads [d_model, d_head]\n"
        "    matrix[1, dst_head] = 0\n"
        "    matrix[1, dst_head][subspace(src_head)] = eye\n\n"
        "weights = ck.HeadWeights(W_Q=W_Q, W_K=W_K, W_V=W_V, W_O=W_O)\n"
        "weights"
    ),
    new_markdown_cell(
        "## Raw scores and the random baseline\n\n"
        "Unrelated heads do not score 0. For heads whose distribution is invariant under rotations of the "
        "residual stream, `E||W_A W_B||^2 = E||W_A||^2 E||W_B||^2 / d_model`, so a random pair scores about "
        "`1/sqrt(d_model)`. `composition_baseline` samples random heads of the same shapes (seeded, cached per "
        "shape) and reports the mean, the standard deviation and that closed form."
    ),
    new_code_cell(
        "baseline = composition_baseline(weights, 'K')\n"
        "print(baseline)\n"
        "for shape in [(16, 4), (768, 64)]:\n"
        "    shaped = ck.HeadWeights(W_Q=torch.zeros(2, 1, *shape), W_K=torch.zeros(2, 1, *shape),\n"
        "                            W_V=torch.zeros(2, 1, *shape), W_O=torch.zeros(2, 1, shape[1], shape[0]))\n"
        "    b = composition_baseline(shaped, 'Q')\n"
        "    print(f'd_model {shape[0]:4d}, d_head {shape[1]:3d}: random mean {b.mean:.4f} +- {b.std:.4f}, '\n"
        "          f'1/sqrt(d_model) = {1 / math.sqrt(shape[0]):.4f}')"
    ),
    new_markdown_cell(
        "## The strongest edges, per mode\n\n"
        "With `baseline='zscore'` each score is measured in standard deviations of the random baseline. "
        "`top_edges` lists the strongest forward pairs; the planted edge leads in each mode."
    ),
    new_code_cell(
        "planted = {'K': '0.1 -> 1.2', 'Q': '0.3 -> 1.0', 'V': '0.2 -> 1.3'}\n"
        "zscores = {mode: composition_scores(weights, mode, baseline='zscore') for mode in 'QKV'}\n"
        "for mode, scores in zscores.items():\n"
        "    edges = top_edges(scores, k=3)\n"
        "    print(mode, [(e.name, round(e.score, 1)) for e in edges])\n"
        "    assert edges[0].name == planted[mode], (mode, edges[0])"
    ),
    new_code_cell(
        "from circuitkit.viz import composition_heatmap\n\n"
        "composition_heatmap(composition_scores(weights, 'K'), baseline=baseline, mode='K')"
    ),
    new_markdown_cell(
        "## The same numbers as TransformerLens\n\n"
        "TransformerLens's `utilities.matrix.composition_scores` on `FactoredMatrix` circuits (as "
        "`TransformerBridge.all_composition_scores` uses it) gives the same scores; it broadcasts every pair to "
        "`[L, H, L, H, d_model, d_head]` on the way."
    ),
    new_code_cell(
        "from transformer_lens.FactoredMatrix import FactoredMatrix\n"
        "from transformer_lens.utilities.matrix import composition_scores as tl_composition_scores\n\n"
        "left = FactoredMatrix(W_V, W_O)\n"
        "right = FactoredMatrix(W_Q, W_K.transpose(-2, -1)).T  # K-composition\n"
        "mask = (torch.arange(L)[:, None, None, None] < torch.arange(L)[None, None, :, None])\n"
        "tl = torch.where(mask, tl_composition_scores(left, right), 0.0)\n"
        "gap = (tl - composition_scores(weights, 'K')).abs().max()\n"
        "print(f'largest difference from TransformerLens: {gap:.1e}')\n"
        "assert gap < 1e-5"
    ),
    new_markdown_cell(
        "## At GPT-2-small shape\n\n"
        "12 layers x 12 heads, `d_model` 768, `d_head` 64, random weights. TransformerLens's broadcast needs about "
        "`(L H)^2 (2 d_model d_head + d_head^2) 4` bytes (~8 GB here, ~9 GB measured with its other temporaries); circuitkit's working set stays under its "
        "`memory_budget` (256 MB by default). `benchmarks/composition.py` measures both side by side."
    ),
    new_code_cell(
        "g = torch.Generator().manual_seed(1)\n"
        "L2, H2, d2, h2 = 12, 12, 768, 64\n"
        "gpt2_shaped = ck.HeadWeights(\n"
        "    *(torch.randn(L2, H2, d2, h2, generator=g) / math.sqrt(d2) for _ in range(3)),\n"
        "    W_O=torch.randn(L2, H2, h2, d2, generator=g) / math.sqrt(d2),\n"
        ")\n"
        "start = time.perf_counter()\n"
        "scores = composition_scores(gpt2_shaped, 'Q')\n"
        "print(f'{time.perf_counter() - start:.2f} s for {int((scores > 0).sum())} pairs')\n"
        "print(f'TransformerLens would need ~{(L2 * H2) ** 2 * (2 * d2 * h2 + h2 * h2) * 4 / 2**30:.1f} GB')\n"
        "print('mean score', float(scores[scores > 0].mean()), 'vs 1/sqrt(768) =', 1 / math.sqrt(768))"
    ),
    new_markdown_cell(
        "## What the score is and is not invariant to\n\n"
        "A change of basis *inside* a head (`W_V -> W_V R`, `W_O -> R^-1 W_O`) leaves every circuit and every score "
        "unchanged. A change of basis of the *residual stream* (`W_O -> W_O P`, reads `W -> P^-1 W`) leaves the "
        "network's function unchanged too (ignoring LayerNorm), but Frobenius norms only survive orthogonal `P`: "
        "a known critique of raw composition scores is this basis dependence. Compare scores within one model "
        "and against its own random baseline, not across models with differently scaled residual streams."
    ),
    new_code_cell(
        "def residual_change(w, P):\n"
        "    P_inv = torch.linalg.inv(P)\n"
        "    return ck.HeadWeights(W_Q=P_inv @ w.W_Q, W_K=P_inv @ w.W_K, W_V=P_inv @ w.W_V, W_O=w.W_O @ P)\n\n\n"
        "orthogonal, _ = torch.linalg.qr(torch.randn(d_model, d_model, generator=g))\n"
        "stretch = torch.diag(torch.logspace(-1, 1, d_model))\n"
        "k_scores = composition_scores(weights, 'K')\n"
        "for name, P in [('orthogonal', orthogonal), ('diagonal stretch', stretch)]:\n"
        "    change = (composition_scores(residual_change(weights, P), 'K') - k_scores).abs().max()\n"
        "    print(f'{name:17s} residual basis change: largest score change {change:.2e}')"
    ),
]


def build() -> nbformat.NotebookNode:
    notebook = new_notebook(cells=CELLS)
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return notebook


if __name__ == "__main__":
    path = Path(__file__).with_name("02_composition_scores.ipynb")
    nbformat.write(build(), path)
    print(f"wrote {path}")
