"""Generate ``01_qk_ov_circuits.ipynb`` (committed without outputs). Run: ``python notebooks/make_01_qk_ov_circuits.py``."""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

CELLS = [
    new_markdown_cell(
        "# QK and OV circuits, exactly and on factors\n\n"
        "Every attention head is two low-rank matrices (Elhage et al. 2021). In the row-vector convention "
        "of TransformerLens (`x @ W`):\n\n"
        "- the **QK circuit** `W_Q @ W_K.T` (`d_model x d_model`) scores a destination residual `x_dst` against a "
        "source `x_src`: `x_dst @ QK @ x_src.T`;\n"
        "- the **OV circuit** `W_V @ W_O` (`d_model x d_model`) is what the head writes to the destination when it "
        "attends to the source: `x_src @ OV`.\n\n"
        "The paper writes column vectors: `W_QK = W_Q^T W_K`, `W_OV = W_O W_V` — the same matrices transposed, "
        "with the same singular values and eigenvalues. Both have rank at most `d_head`, so circuitkit never builds "
        "them: it keeps the factors and computes spectra from `d_head x d_head` matrices."
    ),
    new_code_cell(
        "import torch\n\n"
        "import circuitkit as ck\n"
        "from circuitkit import zoo\n\n"
        "model = zoo.load()  # the bundled 2-layer attention-only model with known induction heads\n"
        "weights = ck.HeadWeights.from_model(model)\n"
        "weights"
    ),
    new_markdown_cell(
        "## Factored circuits\n\n"
        "`ck.ov_circuit(weights)` is a `Factored` batch `[layer, head, d_model, d_model]` stored as "
        "`A = W_V [.., d_model, d_head]` and `B = W_O [.., d_head, d_model]`."
    ),
    new_code_cell(
        "ov = ck.ov_circuit(weights)\n"
        "qk = ck.qk_circuit(weights)\n"
        "print(ov, qk, sep='\\n')\n"
        "print('singular values of OV, head 1.0:', ck.singular_values(weights, 'OV')[1, 0])"
    ),
    new_markdown_cell(
        "## Check against a dense computation\n\n"
        "On a model this small we can afford the dense `d_model x d_model` matrices, and the spectra agree."
    ),
    new_code_cell(
        "dense_ov = ov.dense()\n"
        "gap = (torch.linalg.svdvals(dense_ov)[..., : weights.d_head] - ck.singular_values(weights, 'OV')).abs().max()\n"
        "print(f'largest difference from dense SVD: {gap:.2e}')\n"
        "assert gap < 1e-4"
    ),
    new_markdown_cell(
        "## Ranks, effective ranks and norms\n\n"
        "Numerical rank never exceeds `min(d_model, d_head)` (seed 000, exercise 1.3). The effective rank "
        "`exp(H(sigma / sum sigma))` says how many directions a head really uses."
    ),
    new_code_cell(
        "print('numerical rank (OV):\\n', ck.numerical_rank(weights, 'OV'))\n"
        "print('effective rank (OV):\\n', ck.effective_rank(weights, 'OV').round(decimals=2))\n"
        "print('Frobenius norm (QK):\\n', ck.frobenius_norm(weights, 'QK').round(decimals=2))"
    ),
    new_markdown_cell(
        "## Copying: eigenvalues of the full OV circuit\n\n"
        "The full OV circuit `W_E W_V W_O W_U` is `d_vocab x d_vocab` but its non-zero eigenvalues are those of "
        "the `d_head x d_head` matrix `W_O W_U W_E W_V`. A copying head has mostly positive real eigenvalues; "
        "`sum(lambda) / sum(|lambda|)` is +1 for a pure copier."
    ),
    new_code_cell(
        "eig = ck.ov_eigenvalues(weights, full=True)\n"
        "copying = eig.sum(-1).real / eig.abs().sum(-1)\n"
        "print('copying score per head:\\n', copying.round(decimals=2))"
    ),
    new_markdown_cell(
        "## Invariance: a change of basis inside a head\n\n"
        "`W_V -> W_V R`, `W_O -> R^-1 W_O` changes every factor but not the circuit, so the spectrum is unchanged."
    ),
    new_code_cell(
        "R = torch.randn(weights.d_head, weights.d_head, generator=torch.Generator().manual_seed(0)) + 2 * torch.eye(weights.d_head)\n"
        "rotated = ck.HeadWeights(W_Q=weights.W_Q, W_K=weights.W_K, W_V=weights.W_V @ R, W_O=torch.linalg.inv(R) @ weights.W_O)\n"
        "change = (ck.singular_values(rotated, 'OV') - ck.singular_values(weights, 'OV')).abs().max()\n"
        "print(f'spectrum change under R: {change:.2e}')"
    ),
    new_code_cell(
        "from circuitkit import viz\n\n"
        "viz.singular_value_spectra(weights, 'OV')"
    ),
]


def main() -> None:
    notebook = new_notebook(cells=CELLS)
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = Path(__file__).with_name("01_qk_ov_circuits.ipynb")
    nbformat.write(notebook, path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
