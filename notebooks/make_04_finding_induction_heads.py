"""Generate ``04_finding_induction_heads.ipynb`` (committed without outputs).

Run: ``python notebooks/make_04_finding_induction_heads.py``.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

CELLS = [
    new_markdown_cell(
        "# Finding induction heads\n\n"
        "An **induction head** completes `... A B ... A -> B`: from the current token `A` it attends to the token "
        "right after `A`'s earlier occurrence and copies it (Olsson et al. 2022). On random tokens repeated twice, "
        "the first copy is unpredictable and the second is predictable only in context, so induction heads "
        "reveal themselves in three ways:\n\n"
        "1. **where they look**: attention from each repeated token to the token after its earlier copy "
        "(the prefix-matching score);\n"
        "2. **what they write**: an OV circuit that copies tokens (positive eigenvalues of `W_E W_V W_O W_U`);\n"
        "3. **what they do**: ablating them raises the loss on the repeated copy.\n\n"
        "We run all three on the bundled `induction-2l` model, a 2-layer attention-only transformer that "
        "circuitkit's own training script (`python -m circuitkit.zoo.train`) trained on such data."
    ),
    new_code_cell(
        "import plotly.graph_objects as go\n"
        "import torch\n\n"
        "import circuitkit as ck\n"
        "from circuitkit import zoo\n\n"
        "model = zoo.load('induction-2l')\n"
        "entry = zoo.info('induction-2l')\n"
        "print(entry.description)\n"
        "print('documented induction heads:', entry.induction_heads)\n"
        "print('documented previous-token heads:', entry.previous_token_heads)"
    ),
    new_markdown_cell(
        "## The phase change\n\n"
        "The training script logged the loss on a fixed evaluation batch. The first copy stays at chance "
        "(`log 63` nats) throughout; the repeated copy drops suddenly once the previous-token and induction "
        "heads have formed together: the induction phase change."
    ),
    new_code_cell(
        "curve = zoo.curve('induction-2l')\n"
        "fig = go.Figure()\n"
        "fig.add_scatter(x=curve['step'], y=curve['first_half'], name='first copy')\n"
        "fig.add_scatter(x=curve['step'], y=curve['repeated_half'], name='repeated copy')\n"
        "fig.update_layout(xaxis_title='training step', yaxis_title='loss (nats)', height=350)\n"
        "fig"
    ),
    new_markdown_cell(
        "## Head scores in one forward pass\n\n"
        "`ck.head_scores` builds a batch of random blocks repeated `n_repeats` times (no tokenizer needed), runs "
        "**one** forward pass, and reduces each layer's attention pattern inside a hook. Each score averages only "
        "over the query rows where its target exists, so a perfect head scores 1.0. (TransformerLens's "
        "`detect_head` averages over every row and would give a perfect induction head about 0.5 here.)"
    ),
    new_code_cell(
        "scores = ck.head_scores(model, seq_len=20, batch=16)\n"
        "print(scores)\n"
        "scores.to_dataframe('induction').round(3)"
    ),
    new_code_cell(
        "from circuitkit import viz\n\n"
        "viz.head_score_heatmap(scores['induction'], title='induction (prefix-matching) score', zmin=0, zmax=1)"
    ),
    new_markdown_cell(
        "## What the heads look like\n\n"
        "The first sequence's pattern for the best previous-token head (an off-diagonal stripe) and the best "
        "induction head (a stripe `seq_len - 1` below the diagonal, in the second copy)."
    ),
    new_code_cell(
        "(prev_head, _), = scores.top('previous_token', 1)\n"
        "(ind_head, _), = scores.top('induction', 1)\n"
        "for head in (prev_head, ind_head):\n"
        "    pattern = scores.patterns_for(*head)\n"
        "    go.Figure(go.Heatmap(z=pattern.numpy(), colorscale='Blues', zmin=0, zmax=1)).update_layout(\n"
        "        title=f'head {head[0]}.{head[1]}', yaxis_autorange='reversed', height=350, width=400\n"
        "    ).show()"
    ),
    new_markdown_cell(
        "## Copying\n\n"
        "The copying score `Re(sum lambda) / sum |lambda|` over the eigenvalues of the full OV circuit "
        "`W_E W_V W_O W_U` (`d_vocab x d_vocab`, computed from a `d_head x d_head` product, never built): "
        "+1 for a head that only copies. Induction heads copy; previous-token heads move the previous token into "
        "a part of the residual stream the unembedding does not read."
    ),
    new_code_cell("scores['copying'].round(decimals=2)"),
    new_markdown_cell(
        "## The in-context learning signature, and ablation\n\n"
        "`ck.induction_loss` gives the loss per position: high on the first copy, near zero on the second. "
        "`ck.ablation_effects` replaces each head's output `z` with its mean over the batch (or zero) and "
        "measures the repeated-copy loss again; all heads of a layer are ablated in one batched forward pass."
    ),
    new_code_cell(
        "loss = ck.induction_loss(model, seq_len=20, batch=16)\n"
        "print(f'first copy {loss.first_half:.3f} nats, repeated copy {loss.repeated_half:.3f} nats')\n"
        "go.Figure(go.Scatter(y=loss.per_position.numpy())).update_layout(\n"
        "    xaxis_title='position', yaxis_title='loss (nats)', height=300\n"
        ")"
    ),
    new_code_cell(
        "effects = ck.ablation_effects(model, method='mean', seq_len=20, batch=16)\n"
        "print(f'clean repeated-copy loss {effects.clean_loss:.3f}')\n"
        "viz.head_score_heatmap(effects.delta, title='rise in repeated-copy loss when ablated', "
        "colorscale='RdBu_r', zmid=0)"
    ),
    new_markdown_cell(
        "The heads whose ablation hurts are exactly the circuit: the previous-token heads in layer 0 and the "
        "induction heads in layer 1 (the model spreads induction over all four layer-1 heads, so each one alone "
        "matters less than the previous-token head they all read from)."
    ),
    new_code_cell(
        "circuit = set(entry.induction_heads) | set(entry.previous_token_heads)\n"
        "top = {head for head, _ in effects.top(len(circuit))}\n"
        "print('largest ablation effects:', effects.top(len(circuit)))\n"
        "assert top == circuit"
    ),
    new_markdown_cell(
        "## The circuit in the weights: K-composition\n\n"
        "An induction head's keys read what the previous-token head wrote, so the strongest K-composition edges "
        "go from the previous-token heads to the induction heads."
    ),
    new_code_cell(
        "k_scores = ck.composition_scores(model, 'K')\n"
        "for edge in ck.top_edges(k_scores, k=8):\n"
        "    print(edge.name, round(edge.score, 3))"
    ),
]


def main() -> None:
    notebook = new_notebook(cells=CELLS)
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = Path(__file__).with_name("04_finding_induction_heads.ipynb")
    nbformat.write(notebook, path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
