"""CircuitsVis attention views: the props CircuitsVis receives equal the patterns; patterns read from a model
agree with the model's own full cache."""

from __future__ import annotations

from html.parser import HTMLParser

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from circuitkit import CircuitkitError
from circuitkit.viz import attention_heads, attention_patterns, model_patterns, token_strings, view_props
from circuitkit.viz.attention import CircuitsVisView, parse_rendered

# float32 patterns go through json (float64 repr of the float32 values): exact up to float32 rounding
JSON_ATOL = 1e-7


def _causal_patterns(n: int, pos: int, seed: int = 0) -> torch.Tensor:
    scores = torch.randn(n, pos, pos, generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(pos, pos, dtype=torch.bool).triu(1)
    return scores.masked_fill(mask, float("-inf")).softmax(-1)


def test_attention_heads_props_equal_patterns_tokens_and_names():
    patterns = _causal_patterns(2, 5)
    tokens = ["a", "b", "<c>", "d", "a"]
    view = attention_heads({(0, 1): patterns[0], (1, 3): patterns[1]}, tokens)
    assert isinstance(view, CircuitsVisView)
    props = view_props(view)
    np.testing.assert_allclose(np.asarray(props["attention"]), patterns.numpy(), atol=JSON_ATOL, rtol=0)
    # inert HTML text (CircuitsVis writes tokens as innerHTML and draws them on canvases): a zero-width WORD JOINER
    # after "<", so it opens no tag, and the token reads the same once the joiners are dropped
    assert props["tokens"] == ["a", "b", "<\u2060c>", "d", "a"]
    assert [t.replace("\u2060", "") for t in props["tokens"]] == tokens
    assert props["attentionHeadNames"] == ["0.1", "1.3"]
    assert props["maskUpperTri"] is True


def test_offline_repr_is_the_inlined_bundle_not_the_cdn():
    view = attention_heads(_causal_patterns(1, 3)[0], ["x", "y", "z"])
    html = view._repr_html_()
    assert html == view.local_src and "unpkg.com" not in html
    parsed = parse_rendered(view)
    assert parsed.element == "AttentionHeads" and "var CircuitsVis" in parsed.bundle


def test_attention_patterns_view():
    patterns = _causal_patterns(3, 4, seed=1)
    props = view_props(attention_patterns(patterns, list("wxyz")))
    np.testing.assert_allclose(np.asarray(props["attention"]), patterns.numpy(), atol=JSON_ATOL, rtol=0)


@pytest.mark.parametrize(
    "patterns, tokens, message",
    [
        (torch.rand(2, 3, 4), ["a"] * 4, "expected \\[head, pos, pos\\]"),
        (_causal_patterns(1, 3) * 3, ["a"] * 3, "probabilities in \\[0, 1\\]"),
        (_causal_patterns(1, 3), ["a"] * 4, "given 4 tokens; expected 3"),
        (_causal_patterns(1, 3), "abc", "list of 3 strings"),
        (_causal_patterns(1, 3), [1, 2, 3], "list of 3 strings"),
        ({}, [], "empty mapping"),
    ],
    ids=["not-square", "not-probabilities", "token-count", "string-tokens", "int-tokens", "empty-mapping"],
)
def test_rejects_bad_input(patterns, tokens, message):
    with pytest.raises(CircuitkitError, match=message):
        attention_heads(patterns, tokens)


def test_model_patterns_match_the_full_cache(tiny_bridge):
    tokens = torch.randint(0, 50, (12,), generator=torch.Generator().manual_seed(0))
    chosen = model_patterns(tiny_bridge, tokens, [(0, 2), (1, 0)])
    with torch.inference_mode():
        _, cache = tiny_bridge.run_with_cache(tokens[None])
    for (layer, head), pattern in chosen.items():
        torch.testing.assert_close(pattern, cache[f"blocks.{layer}.attn.hook_pattern"][0, head].float())
        assert pattern.shape == (12, 12)
        torch.testing.assert_close(pattern.sum(-1), torch.ones(12))
    assert token_strings(tiny_bridge, tokens)[:2] == [str(int(tokens[0])), str(int(tokens[1]))]


def test_model_patterns_rejects_bad_heads_and_tokens(tiny_bridge):
    with pytest.raises(CircuitkitError, match=r"head layer: .*expected an int >= 0 and <= 1"):
        model_patterns(tiny_bridge, torch.arange(4), [(2, 0)])
    with pytest.raises(CircuitkitError, match="integer tensor"):
        model_patterns(tiny_bridge, torch.rand(4), [(0, 0)])


class _Collect(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags, self.text = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)

    def handle_endtag(self, tag):
        self.tags.append("/" + tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append(tag)

    def handle_data(self, data):
        self.text.append(data)

    def handle_comment(self, data):
        self.tags.append("!--")

    def handle_decl(self, decl):
        self.tags.append("!")

    def unknown_decl(self, data):
        self.tags.append("!")

    def handle_pi(self, data):
        self.tags.append("?")


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("<>&/!?;#abx1 \"'=-")) | st.characters(), max_size=24))
def test_inert_html_text_opens_no_tag_or_reference_and_reads_the_same(text):
    """As element content (how CircuitsVis writes tokens with innerHTML), the inert text makes no tag, comment or
    character reference: an HTML parser sees only the surrounding element and the text itself (joiners dropped)."""
    from circuitkit.viz.attention import INERT_JOINER, inert_html_text

    parser = _Collect()
    parser.feed("<span>" + inert_html_text(text) + "</span>")
    parser.close()
    assert parser.tags == ["span", "/span"]
    assert "".join(parser.text).replace(INERT_JOINER, "") == text.replace(INERT_JOINER, "")


@pytest.mark.parametrize("bad", [None, 3, b"<b>", ["<b>"]])
def test_inert_html_text_refuses_what_is_not_a_str(bad):
    from circuitkit.viz.attention import inert_html_text

    with pytest.raises(CircuitkitError, match="expected a str"):
        inert_html_text(bad)
