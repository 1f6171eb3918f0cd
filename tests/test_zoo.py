"""The bundled models: they load offline, their documented heads are what detection finds, and ablation and
K-composition confirm them as the induction circuit."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch

from circuitkit import CircuitkitError, zoo
from circuitkit.detect import RepeatedTokens, ablation_effects, head_scores, induction_loss

ZOO_BYTES_LIMIT = 5 * 2**20
"""The issue's size budget for every bundled model together."""

DETECTION_THRESHOLD = 0.3
"""Same threshold the training script used to document heads (circuitkit.zoo.train.HEAD_THRESHOLD)."""

MODELS = zoo.available()


def test_available_and_info():
    assert "induction-2l" in MODELS
    entry = zoo.info("induction-2l")
    assert entry.name == "induction-2l" and entry.format == "tl-native"
    assert entry.induction_heads and entry.previous_token_heads
    assert all(layer == 1 for layer, _ in entry.induction_heads)
    assert all(layer == 0 for layer, _ in entry.previous_token_heads)


def test_unknown_name_raises():
    with pytest.raises(CircuitkitError, match="induction-2l"):
        zoo.load("induction-9l")


def test_bundled_files_fit_the_budget():
    total = sum(p.stat().st_size for p in zoo.ROOT.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    assert total < ZOO_BYTES_LIMIT


@pytest.mark.parametrize("name", MODELS)
def test_training_curve_shows_the_induction_phase_change(name):
    curve = zoo.curve(name)
    first, repeated = curve["first_half"], curve["repeated_half"]
    chance = math.log(63)  # 63 possible non-BOS tokens
    assert repeated[0] > 0.9 * chance and first[-1] > 0.9 * chance  # the first copy stays unpredictable
    assert repeated[-1] < 0.5 * chance  # the repeated copy became predictable in context
    drops = [a - b for a, b in itertools.pairwise(repeated)]
    assert max(drops) > 5 * (repeated[0] - repeated[-1]) / len(drops)  # a sudden drop, not a steady slope


@pytest.fixture(scope="module", params=MODELS)
def loaded(request):
    return request.param, zoo.info(request.param), zoo.load(request.param)


def _above(scores, name):
    return {head for head, value in scores.top(name, scores[name].numel()) if value > DETECTION_THRESHOLD}


def test_detected_heads_are_the_documented_heads(loaded):
    _, entry, model = loaded
    scores = head_scores(model, RepeatedTokens(batch=32))
    assert _above(scores, "induction") == set(entry.induction_heads)
    assert _above(scores, "previous_token") == set(entry.previous_token_heads)


def test_in_context_loss_gap(loaded):
    _, _, model = loaded
    loss = induction_loss(model)
    assert loss.repeated_copies < 0.5 < 3.0 < loss.first_copy


@pytest.mark.slow
def test_ablation_confirms_the_circuit(loaded):
    """The heads whose mean ablation raises the repeated-copy loss most are exactly the documented circuit
    (induction + previous-token heads), and every induction head matters more than any head outside it."""
    _, entry, model = loaded
    effects = ablation_effects(model, RepeatedTokens(batch=32), method="mean")
    circuit = set(entry.induction_heads) | set(entry.previous_token_heads)
    assert {head for head, _ in effects.top(len(circuit))} == circuit
    outside = [float(effects.delta[h]) for h in itertools.product(range(2), range(4)) if h not in circuit]
    weakest_induction = min(float(effects.delta[h]) for h in entry.induction_heads)
    assert weakest_induction > max(outside)
    zero = ablation_effects(model, RepeatedTokens(batch=32), method="zero")
    assert all(float(zero.delta[h]) > 0 for h in entry.induction_heads)


def test_previous_token_to_induction_k_composition_ranks_top(loaded):
    from circuitkit.composition import composition_scores, top_edges

    _, entry, model = loaded
    expected = set(itertools.product(entry.previous_token_heads, entry.induction_heads))
    edges = top_edges(composition_scores(model, "K"), k=len(expected))
    assert {(e.src, e.dst) for e in edges} == expected


def test_loaded_native_model_matches_saved_weights():
    from safetensors.torch import load_file

    state = load_file(str(zoo.info("induction-2l").path / "model.safetensors"))
    model = zoo.load("induction-2l")
    W_Q = state["layers.1.attn.q.weight"]  # [n_heads * d_head, d_model], nn.Linear layout
    expected = W_Q.view(4, 16, 64).transpose(1, 2)  # [head, d_model, d_head]
    torch.testing.assert_close(model.W_Q[1].detach(), expected)


ORACLE_TOL = 1e-4
"""A dense float32 forward written here against TransformerLens's native model: same maths, different op order
(einsum vs nn.Linear); logits of size ~10 agree to ~1e-5."""


def _dense_attention_only_logits(state: dict[str, torch.Tensor], tokens: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Attention-only forward from the saved nn.Linear weights (``[out, in]``): x = W_E[t] + W_pos; per layer
    x += softmax(causal(q k^T / sqrt(d_head))) v W_O^T + b_O per head; logits = x W_U^T."""
    n_pos = tokens.shape[1]
    x = state["tok_embed.weight"][tokens] + state["pos.weight"][:n_pos]  # [batch, pos, d_model]
    d_model = x.shape[-1]
    d_head = d_model // n_heads
    mask = torch.ones(n_pos, n_pos, dtype=torch.bool).tril()
    for layer in range(2):
        p = f"layers.{layer}.attn."

        q, k, v = (
            (x @ state[p + name + ".weight"].T + state[p + name + ".bias"])
            .view(*x.shape[:2], n_heads, d_head)
            .transpose(1, 2)  # [batch, head, pos, d_head]
            for name in ("q", "k", "v")
        )
        scores = (q @ k.transpose(-1, -2) / d_head**0.5).masked_fill(~mask, float("-inf"))
        z = scores.softmax(-1) @ v  # [batch, head, pos, d_head]
        x = x + z.transpose(1, 2).reshape(*x.shape[:2], d_model) @ state[p + "o.weight"].T + state[p + "o.bias"]
    return x @ state["head.weight"].T


def test_loaded_native_model_computes_the_saved_weights_dense_forward():
    from safetensors.torch import load_file

    state = load_file(str(zoo.info("induction-2l").path / "model.safetensors"))
    tokens = torch.randint(0, 64, (3, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(zoo.load("induction-2l")(tokens), _dense_attention_only_logits(state, tokens, 4),
                                   atol=ORACLE_TOL, rtol=0)


def test_loading_leaves_the_global_random_stream_alone():
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    zoo.load("induction-2l")
    torch.testing.assert_close(torch.rand(3), expected, atol=0, rtol=0)


def test_zoo_imports_neither_the_loader_nor_private_transformer_lens():
    """No cycle models.loading <-> zoo: the zoo's modules import from circuitkit.models only the tokenizer helpers,
    the bridge's state loader, the attention-only model and the guarded file reader (none imports the loader),
    and build the bridge with TransformerLens's public native.boot (no private ``_``-module)."""
    import ast

    imported = set()
    for source in (Path(zoo.__file__), zoo.ROOT / "train.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
    assert "circuitkit.models.tokenizer" in imported
    allowed = {"circuitkit.models.tokenizer", "circuitkit.models.bridge", "circuitkit.models.toy",
               "circuitkit.models.files"}
    assert not [m for m in imported if m.startswith("circuitkit.models") and m not in allowed]
    for module in ("bridge", "toy", "files"):
        source = (Path(zoo.__file__).parents[1] / "models" / f"{module}.py").read_text()
        assert "models.loading" not in source and "circuitkit.zoo" not in source
    assert not [m for m in imported if any(part.startswith("_") for part in m.split(".") if part != "__future__")]
