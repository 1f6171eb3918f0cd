"""Agreement with TransformerLens's head_detector.

TransformerLens's ``detect_head(model, prompt, kind)`` (error measure ``"mul"``) scores a head by
``sum(pattern * detection_pattern) / sum(pattern)`` on one prompt. Attention rows sum to 1, so the
denominator is the number of query rows ``pos``: rows with no target count as zeros. circuitkit divides by the
number of rows that have a target instead. Given the same patterns, ``TL = circuitkit * rows_with_target / pos``
exactly. We run TransformerLens end to end, through the model's own (bundled, offline) tokenizer and strings.
"""

from __future__ import annotations

import pytest
import torch

from circuitkit import RepeatedTokens, head_scores, zoo
from circuitkit.detect import registry

TARGETS = {d.name: d.targets for d in registry.registered("pattern")}

AGREEMENT_TOL = 1e-5
"""Same float32 patterns summed in different orders: ~1e-7 differences; 100x margin."""

KINDS = {
    "induction": "induction_head",
    "previous_token": "previous_token_head",
    "duplicate_token": "duplicate_token_head",
}


@pytest.fixture(scope="module")
def model():
    return zoo.load("induction-2l")


def _prompt(row: torch.Tensor) -> str:
    return " ".join(f"t{int(t)}" for t in row)


@pytest.mark.parametrize("token_range", [None, (1, 9)], ids=["distinct-tokens", "chance-duplicates"])
def test_target_masks_equal_transformer_lens_detection_patterns(token_range):
    from transformer_lens import head_detector as hd

    builders = {
        "induction": hd.get_induction_head_detection_pattern,
        "previous_token": hd.get_previous_token_head_detection_pattern,
        "duplicate_token": hd.get_duplicate_token_head_detection_pattern,
    }
    scores = head_scores(zoo.load("induction-2l"), RepeatedTokens(block_len=12, batch=3, token_range=token_range))
    for name, build in builders.items():
        ours = TARGETS[name](scores.tokens)
        for b in range(3):
            assert torch.equal(build(scores.tokens[b : b + 1].cpu()).bool(), ours[b]), (name, b)


@pytest.mark.parametrize("name", list(KINDS))
def test_scores_equal_detect_head_after_renormalising(model, name):
    from transformer_lens.head_detector import detect_head

    scores = head_scores(model, RepeatedTokens(block_len=10, batch=3))
    tokens = scores.tokens
    assert scores.bos == 0 and model.to_tokens(_prompt(tokens[0, 1:])).tolist() == tokens[:1].tolist()
    pos = tokens.shape[1]
    rows = int(TARGETS[name](tokens)[0].any(dim=-1).sum())  # the same in every sequence (distinct blocks)
    assert all(int(TARGETS[name](tokens)[b].any(dim=-1).sum()) == rows for b in range(3))
    tl = torch.stack([detect_head(model, _prompt(tokens[b, 1:]), KINDS[name]) for b in range(3)]).mean(0)
    torch.testing.assert_close(scores[name] * rows / pos, tl.float(), atol=AGREEMENT_TOL, rtol=0)
    if name == "induction":  # the renormalisation is the point: TL scores a near-perfect head about half
        assert float(scores[name].max()) > 0.75 and float(tl.max()) < 0.5
