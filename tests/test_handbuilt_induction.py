"""The hand-wired induction circuit: predictions on repeated sequences, ablations, composition, ranks, bridge."""

from __future__ import annotations

import pytest
import torch

from circuitkit import CircuitkitError, numerical_rank
from circuitkit.handbuilt import induction_circuit, repeated_tokens
from circuitkit.models import to_bridge

D_VOCAB, N_CTX, BLOCK = 20, 64, 20
MIN_REPEATED_ACCURACY = 0.99  # the bar for the repeated half
ABLATED_MAX_ACCURACY = 0.2  # ablated, the repeated half falls to a guess among earlier tokens (~1/BLOCK)
CHANCE_SIGMAS = 5.0  # first-half accuracy within 5 binomial standard deviations of 1/D_VOCAB


def _accuracy(logits: torch.Tensor, tokens: torch.Tensor, lo: int, hi: int) -> float:
    """Next-token accuracy of predictions made at positions lo .. hi-1."""
    return float((logits[:, lo:hi].argmax(-1) == tokens[:, lo + 1: hi + 1]).float().mean())


@pytest.fixture(scope="module", params=["soft", "hard"])
def circuit(request):
    return induction_circuit(D_VOCAB, N_CTX, attention=request.param)


def test_predicts_three_after_one_two_three_one_two(circuit):
    logits = circuit.model(torch.tensor([[1, 2, 3, 1, 2]]))
    assert int(logits[0, -1].argmax()) == 3


def test_repeated_half_is_predicted_and_first_half_is_at_chance(circuit):
    tokens = repeated_tokens(D_VOCAB, BLOCK, batch=64, seed=0)
    logits = circuit.model(tokens)
    assert _accuracy(logits, tokens, BLOCK, 2 * BLOCK - 1) >= MIN_REPEATED_ACCURACY
    # On i.i.d. tokens the next token is independent of everything before it: accuracy is 1/d_vocab in
    # expectation whatever the model does, so a higher score would mean a leak of future tokens.
    iid = torch.randint(0, D_VOCAB, (128, BLOCK), generator=torch.Generator().manual_seed(1))
    first_half = _accuracy(circuit.model(iid), iid, 0, BLOCK - 1)
    n = 128 * (BLOCK - 1)
    chance = 1 / D_VOCAB
    assert abs(first_half - chance) <= CHANCE_SIGMAS * (chance * (1 - chance) / n) ** 0.5


@pytest.mark.parametrize("head", ["previous_token_head", "induction_head"])
def test_ablating_either_head_removes_the_induction(circuit, head):
    layer, index = getattr(circuit, head)
    tokens = repeated_tokens(D_VOCAB, BLOCK, batch=64, seed=2)

    def zero_head(z, hook):
        z = z.clone()
        z[:, :, index] = 0
        return z

    logits = circuit.model.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", zero_head)])
    assert _accuracy(logits, tokens, BLOCK, 2 * BLOCK - 1) <= ABLATED_MAX_ACCURACY


def test_attention_patterns_are_previous_token_and_induction(circuit):
    tokens = repeated_tokens(D_VOCAB, BLOCK, batch=2, seed=3)
    _, cache = circuit.model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    prev = cache["pattern", 0][:, 0]
    ind = cache["pattern", 1][:, 0]
    assert float(prev.diagonal(offset=-1, dim1=-2, dim2=-1).min()) > 0.999
    # query T + k (token x_k) attends to position k + 1, whose previous token is x_k
    assert float(ind[:, torch.arange(BLOCK, 2 * BLOCK), torch.arange(1, BLOCK + 1)].min()) > 0.999


def test_composition_puts_the_previous_token_to_induction_k_edge_first(circuit):
    from circuitkit.composition import composition_scores, top_edges

    scores = {mode: composition_scores(circuit.model, mode) for mode in "QKV"}
    ranked = sorted(((edge.score, mode, edge.name) for mode in "QKV" for edge in top_edges(scores[mode], k=10)),
                    reverse=True)
    assert ranked[0][1:] == ("K", "0.0 -> 1.0")
    assert ranked[0][0] > 0.1 and all(s < ranked[0][0] / 2 for s, _, _ in ranked[1:])


def test_qk_and_ov_ranks_equal_the_built_ranks(circuit):
    for kind in ("QK", "OV"):
        ranks = numerical_rank(circuit.model, kind)
        got = {head: int(ranks[head]) for head in circuit.built_ranks[kind]}
        assert got == circuit.built_ranks[kind]
    assert circuit.built_ranks["QK"][circuit.previous_token_head] == circuit.code.dim


def test_a_transformer_lens_bridge_of_the_circuit_predicts_the_same_tokens():
    circuit = induction_circuit(10, 16)
    tokens = repeated_tokens(10, 8, batch=8, seed=4)
    with torch.no_grad():
        bridge_pred = to_bridge(circuit.model)(tokens).argmax(-1)
    assert torch.equal(bridge_pred, circuit.model(tokens).argmax(-1))


@pytest.mark.parametrize(
    "kwargs, match",
    [({"d_vocab": 1, "n_ctx": 8}, "d_vocab: given int 1"), ({"d_vocab": 5, "n_ctx": 1}, "n_ctx: given int 1"),
     ({"d_vocab": 5, "n_ctx": 8, "gap": 0.0}, "gap: given float 0.0"),
     ({"d_vocab": 5.0, "n_ctx": 8}, "d_vocab: given float 5.0"),
     ({"d_vocab": 5, "n_ctx": 8, "logit_scale": float("nan")}, "logit_scale: given float nan")],
    ids=["tiny-vocab", "tiny-context", "zero-gap", "float-vocab", "nan-logit-scale"],
)
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(CircuitkitError, match=match):
        induction_circuit(**kwargs)


def test_repeated_tokens_refuses_more_distinct_tokens_than_the_vocabulary():
    with pytest.raises(CircuitkitError, match="length=6 distinct tokens from d_vocab=5"):
        repeated_tokens(5, 6)
