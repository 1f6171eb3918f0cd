"""One home for the HTML escape and for ``script_json``: the report's sections, figures and summary and the
attention views use the same two functions, and the one ``script_json`` escapes every character that could end a
script or a JavaScript string (the views' copy escaped U+2028/U+2029, the report's did not)."""

from __future__ import annotations

import json

import pytest

from circuitkit import _html
from circuitkit.report import figures, page, sections, summary
from circuitkit.viz import attention


def test_every_user_is_the_one_home():
    assert sections.esc is _html.escape
    assert figures._esc is _html.escape
    assert summary._esc is _html.escape
    assert page.script_json is _html.script_json
    assert attention.script_json is _html.script_json


HOSTILE = ["</script><script>alert(1)</script>", "<!-- x", "a & b", "line\u2028sep\u2029para", 'q"uote\'s',
           "ünïcödé ✓"]


@pytest.mark.parametrize("text", HOSTILE, ids=["close-script", "comment", "amp", "line-separators", "quotes",
                                               "unicode"])
def test_script_json_is_inert_in_a_script_and_reads_back(text):
    out = _html.script_json({"label": text, "values": [1, 2.5]})
    for char in ("<", ">", "&", "\u2028", "\u2029"):
        assert char not in out
    assert out.isascii()  # read the same under any page charset
    assert json.loads(out) == {"label": text, "values": [1, 2.5]}


def test_script_json_refuses_nan():
    with pytest.raises(ValueError):
        _html.script_json({"x": float("nan")})


@pytest.mark.parametrize("text", HOSTILE)
def test_escape_leaves_no_markup(text):
    out = _html.escape(text)
    assert "<" not in out and ">" not in out and '"' not in out and "'" not in out
