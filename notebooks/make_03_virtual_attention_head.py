"""Generate ``03_virtual_attention_head.ipynb`` (committed without outputs).

Run: ``python notebooks/make_03_virtual_attention_head.py``.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

CELLS = [
    new_markdown_cell(
        "# Building circuits by hand: a virtual attention head and an induction circuit\n\n"
        "Transformer Circuits **exercise 1**: two heads that each attend to the previous token can together "
        "implement a *virtual* head that looks two tokens back, without giving up a whole head to it. "
        "Residual stream 16 dims, heads of 4:\n\n"
        "- head 1 (layer 0) copies dims 0-3 of the previous token to dims 8-11;\n"
        "- head 2 (layer 1) copies dims 4-6 of the previous token to 12-14, **and dim 8 to 15**. Dim 8 of the "
        "previous token was written by head 1 from dim 0 of the token before it.\n\n"
        "Conventions: circuitkit uses row vectors like TransformerLens (`x @ W`, `W_V: [16, 4]`, `W_O: [4, 16]`, "
        "`W_net = W_V @ W_O`, entry `[in, out]`). The exercise uses column vectors (`W_net = W_out W_V`, "
        "entry `[out, in]`): the same matrices transposed. Both are shown below."
    ),
    new_code_cell(
        "import torch\n\n"
        "import circuitkit as ck\n"
        "from circuitkit.build import induction_circuit, repeated_tokens, virtual_head_exercise\n\n"
        "ex = virtual_head_exercise()\n"
        "print(ex.layout)\n"
        "print('W_V1 (row convention, [16, 4]):')\n"
        "print(ex.W_V1.int())"
    ),
    new_markdown_cell(
        "## The expanded matrices\n\n"
        "`W_net1 = W_V1 @ W_O1` and `W_net2 = W_V2 @ W_O2` are 16x16 matrices of rank 4: each is a list of "
        "*which input dim lands in which output dim* when the head attends somewhere. Listing the non-zero entries "
        "`(in -> out)` reads them off directly."
    ),
    new_code_cell(
        "def moves(M):\n"
        "    return [f'{i} -> {j}' for i, j in M.nonzero().tolist()]\n\n"
        "for name in ('W_net1', 'W_net2', 'two_token', 'one_token'):\n"
        "    M = getattr(ex, name)\n"
        "    print(f'{name:9s} rank {int(torch.linalg.matrix_rank(M))}: {moves(M)}')"
    ),
    new_markdown_cell(
        "- `two_token = W_net1 @ W_net2` has rank 1 and a single entry, `0 -> 15`: the virtual head. It moves dim 0 "
        "from **two** tokens back into dim 15.\n"
        "- `one_token = W_net1 + W_net2` is everything that moves exactly one token forward. Its entry `8 -> 15` "
        "copies what head 1 wrote; on raw inputs (dims 8-15 zero) it only acts through the composition.\n\n"
        "The exercise's column-convention matrices are the transposes, with `two_token = W_net^2 W_net^1`:"
    ),
    new_code_cell(
        "col = ex.column\n"
        "print('column W_V^1 shape', tuple(col.W_V1.shape), ' W_out^1 shape', tuple(col.W_out1.shape))\n"
        "print('W_net^2 W_net^1 non-zero [out, in]:', col.two_token.nonzero().tolist())\n"
        "assert torch.equal(col.two_token, ex.two_token.T) and torch.equal(col.one_token, ex.one_token.T)"
    ),
    new_markdown_cell(
        "## Run it\n\n"
        "`ex.run(x)` runs the two heads as a 2-layer attention-only model (`ex.model`) on residual inputs "
        "`[batch, pos, 16]`, with both attention patterns fixed to the previous token through the "
        "`blocks.{l}.attn.hook_pattern` hooks. For inputs whose dims 8-15 are zero, position `t >= 2` ends with "
        "`[8:12] = x[t-1, 0:4]`, `[12:15] = x[t-1, 4:7]` and `[15] = x[t-2, 0]`."
    ),
    new_code_cell(
        "g = torch.Generator().manual_seed(0)\n"
        "x = torch.zeros(1, 6, 16)\n"
        "x[..., :8] = torch.randn(1, 6, 8, generator=g)\n"
        "out = ex.run(x)\n"
        "print('dim 15 at t = 2..5:  ', out[0, 2:, 15].numpy().round(3))\n"
        "print('x[t-2, 0] at t = 2..5:', x[0, :-2, 0].numpy().round(3))\n"
        "assert torch.allclose(out[0, 2:, 15], x[0, :-2, 0], atol=1e-5)\n"
        "assert torch.allclose(out[0, 2:, 8:12], x[0, 1:-1, 0:4], atol=1e-5)\n"
        "assert torch.allclose(out[..., :8], x[..., :8])"
    ),
    new_markdown_cell(
        "The whole network expands into paths. With `P` the previous-token pattern, "
        "`out = x + P x (W_net1 + W_net2) + P^2 x (W_net1 @ W_net2)` for every input: "
        "the identity (direct path), the one-token copies, and the virtual two-token head."
    ),
    new_code_cell(
        "x_any = torch.randn(2, 7, 16, generator=g)\n"
        "paths = ex.paths(x_any)\n"
        "gap = (sum(paths.values()) - ex.run(x_any)).abs().max()\n"
        "print(f'run(x) - sum of paths: {gap:.1e}')"
    ),
    new_markdown_cell(
        "## Capacity: 7/8 on one task, 1/8 on another\n\n"
        "An ordinary head spends all of its `d_head` dimensions on one attention pattern. Here the two heads have "
        "8 value dimensions between them. Seven read the token's own content (dims 0-3 in head 1, 4-6 in head 2): "
        "one-token copying. One (head 2's, reading dim 8) reads what head 1 wrote: two-token copying. So the pair "
        "gives **7/8** of its capacity to the previous-token task and **1/8** to a look-two-back head, which a "
        "small model could otherwise only get by spending a whole head. The 1/8 is cheap because head 1's copy of "
        "dim 0 does double duty."
    ),
    new_code_cell(
        "print(ex.capacity())\n"
        "print('OV ranks per head:', ck.numerical_rank(ex.model, 'OV').flatten().tolist())\n"
        "v = ck.composition_scores(ex.model, 'V')\n"
        "print(f'V-composition 0.0 -> 1.0: {v[0, 0, 1, 0]:.3f}  (= 1/4: one shared unit entry of two rank-4 maps)')"
    ),
    new_markdown_cell(
        "# An induction circuit, wired by hand\n\n"
        "Task 2.2 of the seed exercises: on `[1, 2, 3, 1, 2, ?]`, find the head that attends from the last `2` to "
        "the `3` (the token after the earlier `2`). We build one. `induction_circuit(d_vocab, n_ctx)` lays out "
        "the residual stream as one-hot blocks `tok | prev | out`, a positional code `pos` and a first-position "
        "flag. Head 0.0 attends one position back through `pos` and copies `tok` into `prev`; head 1.0 matches "
        "its query's `tok` against each key's `prev` (**K-composition**) and copies the key's `tok` into `out`, "
        "which the unembedding reads. See `circuitkit.build.induction` for the shapes."
    ),
    new_code_cell(
        "circuit = induction_circuit(d_vocab=10, n_ctx=32)\n"
        "model = circuit.model\n"
        "print(model)\n"
        "print(circuit.layout)\n"
        "tokens = torch.tensor([[1, 2, 3, 1, 2]])\n"
        "logits, cache = model.run_with_cache(tokens)\n"
        "print('prediction after [1, 2, 3, 1, 2]:', int(logits[0, -1].argmax()))\n"
        "print('head 1.0, attention from the last position:', cache['pattern', 1][0, 0, -1].numpy().round(3))\n"
        "print('head 0.0 pattern (previous token):')\n"
        "print(cache['pattern', 0][0, 0].numpy().round(2))"
    ),
    new_code_cell(
        "import plotly.express as px\n\n"
        "seq = repeated_tokens(10, 8, seed=1)\n"
        "_, cache = model.run_with_cache(seq)\n"
        "patterns = torch.stack([cache['pattern', 0][0, 0], cache['pattern', 1][0, 0]]).numpy()\n"
        "px.imshow(patterns, facet_col=0, labels={'x': 'key position', 'y': 'query position'},\n"
        "          title='head 0.0 (previous token), head 1.0 (induction)')"
    ),
    new_markdown_cell(
        "## Does it work, and is it the circuit we think?\n\n"
        "Next-token accuracy on random repeated blocks: the repeated half is predicted; the first half cannot be "
        "(the tokens are random). Zero-ablating either head (`hook_z`) removes the induction."
    ),
    new_code_cell(
        "seq = repeated_tokens(10, 10, batch=64, seed=2)\n"
        "T = 10\n\n"
        "def accuracy(logits):\n"
        "    pred = logits.argmax(-1)\n"
        "    return (pred[:, T:2 * T - 1] == seq[:, T + 1:]).float().mean().item()\n\n"
        "def ablate(head):\n"
        "    def hook(z, hook):\n"
        "        return z * 0\n"
        "    return model.run_with_hooks(seq, fwd_hooks=[(f'blocks.{head[0]}.attn.hook_z', hook)])\n\n"
        "print(f'repeated-half accuracy: {accuracy(model(seq)):.3f}')\n"
        "print(f'previous-token head ablated: {accuracy(ablate(circuit.previous_token_head)):.3f}')\n"
        "print(f'induction head ablated:      {accuracy(ablate(circuit.induction_head)):.3f}')"
    ),
    new_markdown_cell(
        "The weights alone tell the same story: the only composition between the two heads is the K-edge "
        "0.0 -> 1.0 (well above the score random matrices of the same shapes get), and the QK/OV ranks are the "
        "ranks that were built: the position code's dimension for head 0.0's QK, `d_vocab` for the rest."
    ),
    new_code_cell(
        "for mode in 'QKV':\n"
        "    edges = ck.top_edges(ck.composition_scores(model, mode), k=3)\n"
        "    print(mode, [(e.name, round(e.score, 3)) for e in edges])\n"
        "from circuitkit.composition import composition_baseline\n\n"
        "base = composition_baseline(model, 'K')\n"
        "print(f'random baseline for these shapes (K): {base.mean:.3f} +- {base.std:.3f}')\n"
        "print('built ranks:', circuit.built_ranks)\n"
        "print('QK ranks:', ck.numerical_rank(model, 'QK').flatten().tolist(),\n"
        "      ' OV ranks:', ck.numerical_rank(model, 'OV').flatten().tolist())"
    ),
    new_markdown_cell(
        "## TransformerLens runs it too\n\n"
        "`to_bridge` boots a TL-native `TransformerBridge` and sets its weights, so TransformerLens's own "
        "`run_with_cache` and hooks work on the hand-built circuit."
    ),
    new_code_cell(
        "from circuitkit.models import to_bridge\n\n"
        "bridge = to_bridge(model)\n"
        "with torch.no_grad():\n"
        "    tl_logits, tl_cache = bridge.run_with_cache(tokens)\n"
        "print('bridge predicts', int(tl_logits[0, -1].argmax()))\n"
        "print('max |bridge - toy| logits:', float((tl_logits - model(tokens)).abs().max()))"
    ),
]


def main() -> None:
    notebook = new_notebook(cells=CELLS)
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = Path(__file__).with_name("03_virtual_attention_head.ipynb")
    nbformat.write(notebook, path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
