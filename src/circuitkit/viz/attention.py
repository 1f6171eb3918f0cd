"""Attention patterns of chosen heads on chosen tokens, through CircuitsVis (rendered HTML, nothing written).

:func:`attention_heads` and :func:`attention_patterns` wrap ``circuitsvis.attention.attention_heads`` /
``attention_patterns`` after checking the inputs. They return :class:`CircuitsVisView`, a CircuitsVis
``RenderedHTML`` whose notebook representation is always the offline ``local_src`` (CircuitsVis's own
``_repr_html_`` pings the network first). :func:`model_patterns` reads the ``hook_pattern`` activations
``[batch, head, q_pos, k_pos]`` of a TransformerLens-style model for a list of ``(layer, head)``.

Patterns are ``[head, q_pos, k_pos]``: row ``q`` is the distribution of query position ``q`` over key
positions (rows sum to 1, causal models put zeros above the diagonal).

Escaping. CircuitsVis writes its props with ``json.dumps`` straight into a ``<script>``: a token such as
``</script><img src=x onerror=...>`` would end the script and run in the notebook. The views here never hand
CircuitsVis a user- or model-supplied string: it renders placeholder tokens and head names, and the real ones are
then written into both the offline and the CDN source by :func:`script_json`, which escapes ``<``, ``>``, ``&``
and U+2028/U+2029 as JSON ``\\uXXXX`` escapes (the same strings once parsed, inert inside HTML). CircuitsVis
then puts each token into the page as HTML element content (``innerHTML``, spaces turned into ``&nbsp;``), and
draws it on canvases (the axis labels of the enlarged pattern) as plain text. :func:`inert_html_text` makes a
token read the same both ways: a WORD JOINER (U+2060, zero width, never drawn) after each ``<`` and ``&``, so
neither can open a tag or a character reference (HTML's tokenizer emits a ``<`` or ``&`` followed by anything
else as text), and ``<b>`` shows as ``<b>`` in the page and on the canvas (``html.escape`` would leave
``&lt;b&gt;`` on the canvas).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from circuitsvis.utils.render import RenderedHTML
from jaxtyping import Float, Int
from torch import Tensor

from circuitkit import validate
from circuitkit._html import script_json
from circuitkit.errors import CircuitkitError, describe
from circuitkit.models.state import keeps_model_state
from circuitkit.ranking import head_name
from circuitkit.viz._checks import as_float_array, check_head, token_ids

# softmax outputs in float32 may overshoot [0, 1] and row sums of 1 by rounding
PATTERN_ATOL = 1e-4


class CircuitsVisView(RenderedHTML):
    """A CircuitsVis ``RenderedHTML`` that renders offline in notebooks (``local_src``, no network check)."""

    def _repr_html_(self) -> str:
        return self.local_src


@dataclass(frozen=True)
class ParsedView:
    """The parts of a CircuitsVis ``local_src``: the inlined JavaScript bundle, the element and its props."""

    bundle: str
    element: str
    props: dict[str, Any]


_LOCAL_SRC = re.compile(
    r'<script crossorigin type="module">\s*(?P<bundle>.*)CircuitsVis\.render\(\s*"(?P<id>[^"]+)",\s*'
    r"CircuitsVis\.(?P<element>\w+),\s*(?P<props>\{.*\})\s*\)\s*</script>\s*$",
    re.DOTALL,
)


def parse_rendered(rendered: RenderedHTML) -> ParsedView:
    """Split a CircuitsVis ``RenderedHTML.local_src`` into bundle, element name and props (JSON-decoded).

    The report uses this to inline the bundle once for all views and to re-serialise props safely.
    """
    source = getattr(rendered, "local_src", None)
    match = _LOCAL_SRC.search(source) if isinstance(source, str) else None
    if match is None:
        raise CircuitkitError(
            f"parse_rendered: given {type(rendered).__name__}; expected a CircuitsVis RenderedHTML whose "
            "local_src ends in CircuitsVis.render(id, CircuitsVis.Element, props) (circuitsvis >= 1.43)."
        )
    return ParsedView(match["bundle"].strip(), match["element"], json.loads(match["props"]))


_CDN_PROPS = re.compile(r"(?P<props>\{.*\})\s*\)\s*</script>\s*$", re.DOTALL)


def _with_props(rendered: RenderedHTML, **props: Any) -> CircuitsVisView:
    """``rendered`` (made from placeholder strings) with ``props`` written in, escaped, in both sources."""
    local = _LOCAL_SRC.search(rendered.local_src)
    cdn = _CDN_PROPS.search(rendered.cdn_src)
    if local is None or cdn is None:
        raise CircuitkitError(
            "attention view: CircuitsVis returned HTML in an unexpected layout; expected it to end in "
            "CircuitsVis.render(id, Element, props) (circuitsvis >= 1.43)."
        )
    merged = {**json.loads(local["props"]), **props}
    safe = script_json(merged)
    local_src = rendered.local_src[: local.start("props")] + safe + rendered.local_src[local.end("props") :]
    cdn_src = rendered.cdn_src[: cdn.start("props")] + safe + rendered.cdn_src[cdn.end("props") :]
    return CircuitsVisView(local_src, cdn_src)


INERT_JOINER = "\u2060"
"""WORD JOINER: zero width, not whitespace to CircuitsVis's ``/\\s/`` (so not turned into ``&nbsp;``)."""


def inert_html_text(text: str) -> str:
    """``text`` as HTML element content that shows ``text`` itself: a WORD JOINER after each ``<`` and ``&``
    (CircuitsVis writes tokens with ``innerHTML`` and also draws them on canvases; see the module docstring)."""
    if not isinstance(text, str):
        raise validate.fail("inert_html_text: text", text, "a str")
    return text.replace("&", "&" + INERT_JOINER).replace("<", "<" + INERT_JOINER)


def _html_tokens(tokens: list[str]) -> list[str]:
    return [inert_html_text(token) for token in tokens]


def _placeholders(prefix: str, count: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(count)]


def attention_heads(
    patterns: Float[Tensor, "head q_pos k_pos"] | Mapping[tuple[int, int], Float[Tensor, "q_pos k_pos"]],
    tokens: Sequence[str],
    *,
    head_names: Sequence[str] | None = None,
    mask_upper_tri: bool = True,
) -> CircuitsVisView:
    """CircuitsVis ``attention_heads``: a thumbnail per head, click one to enlarge.

    ``patterns`` is ``[head, q_pos, k_pos]`` (or one ``[q_pos, k_pos]``), or a mapping ``(layer, head) ->
    [q_pos, k_pos]`` whose keys become the head names ``"layer.head"``. ``tokens`` are the ``pos`` token
    strings. The values passed to CircuitsVis equal ``patterns`` (``view_props(view)["attention"]``).
    """
    import circuitsvis.attention as cv_attention

    array, names = _patterns_and_names(patterns, head_names, "attention_heads", single_ok=True)
    tokens = _check_tokens(tokens, array.shape[-1], "attention_heads")
    mask_upper_tri = validate.boolean("attention_heads: mask_upper_tri", mask_upper_tri)
    rendered = cv_attention.attention_heads(
        attention=array,
        tokens=_placeholders("t", len(tokens)),
        attention_head_names=None if names is None else _placeholders("h", len(names)),
        max_value=1.0,
        min_value=0.0,
        mask_upper_tri=mask_upper_tri,
    )
    extra = {} if names is None else {"attentionHeadNames": names}
    return _with_props(rendered, tokens=_html_tokens(tokens), **extra)


def attention_patterns(
    patterns: Float[Tensor, "head q_pos k_pos"] | Mapping[tuple[int, int], Float[Tensor, "q_pos k_pos"]],
    tokens: Sequence[str],
) -> CircuitsVisView:
    """CircuitsVis ``attention_patterns`` (all heads side by side, hover a token to see where it attends).

    ``patterns`` is ``[head, q_pos, k_pos]`` (one head: ``[1, q_pos, k_pos]``) or a mapping ``(layer, head) ->
    [q_pos, k_pos]``; ``tokens`` the ``pos`` token strings."""
    import circuitsvis.attention as cv_attention

    array, _ = _patterns_and_names(patterns, None, "attention_patterns", single_ok=False)
    tokens = _check_tokens(tokens, array.shape[-1], "attention_patterns")
    rendered = cv_attention.attention_patterns(tokens=_placeholders("t", len(tokens)), attention=array)
    return _with_props(rendered, tokens=_html_tokens(tokens))


def view_props(view: RenderedHTML) -> dict[str, Any]:
    """The props a CircuitsVis view was rendered with (e.g. ``["attention"]``, ``["tokens"]``)."""
    return parse_rendered(view).props


@keeps_model_state
def model_patterns(
    model: Any,
    tokens: Int[Tensor, "*one pos"],
    heads: Sequence[tuple[int, int]],
) -> dict[tuple[int, int], Float[Tensor, "pos pos"]]:
    """Run ``model`` on one sequence and return the attention pattern ``[q_pos, k_pos]`` of each chosen head.

    Reads the patterns through the model's adapter (``ModelAdapter.patterns``; any model
    :func:`~circuitkit.models.adapters.adapt` accepts). No gradients are tracked. ``heads`` is a non-empty list
    of ``(layer, head)``. A pattern holding NaN or inf (weights too large for the model's dtype) raises
    ``CircuitkitError``.
    """
    if isinstance(heads, (str, bytes)) or not isinstance(heads, Iterable):
        raise validate.fail("model_patterns: heads", heads, "a list of (layer, head) pairs, e.g. [(0, 1)]")
    if not isinstance(tokens, Tensor) or tokens.dtype not in (torch.int32, torch.int64) or not (
        tokens.ndim == 1 or (tokens.ndim == 2 and tokens.shape[0] == 1)
    ):
        raise CircuitkitError(
            f"model_patterns: given tokens {describe(tokens)}; expected an integer tensor [pos] or [1, pos]."
        )
    from circuitkit.models.adapters import adapt

    adapter = adapt(model)
    token_ids("model_patterns", tokens, adapter.spec)
    L, H = adapter.spec.n_layers, adapter.spec.n_heads
    items = validate.bounded_list("model_patterns: heads", heads, L * H, "a list of (layer, head) pairs, e.g. [(0, 1)]",
                                  why=f"L x H = {L} x {H} heads")
    chosen = [check_head(head, L, H, "model_patterns") for head in items]
    if not chosen:
        raise CircuitkitError("model_patterns: given no heads; expected at least one (layer, head).")
    with torch.inference_mode():
        patterns = adapter.patterns(tokens.reshape(1, -1).to(adapter.spec.device), {layer for layer, _ in chosen})
        out = {(layer, head): patterns[layer][0, head].float().cpu().clone() for layer, head in chosen}
    for head, pattern in out.items():
        validate.finite_result(f"model_patterns: pattern of head {head_name(head)}", pattern,
                               why="the model's attention scores overflowed")
    return out


@keeps_model_state
def token_strings(model: Any, tokens: Int[Tensor, "*batch pos"]) -> list[str]:
    """Readable strings for token ids: the model's tokenizer where it has one, else ``"<id>"``-style numbers.

    ``model`` is anything :func:`circuitkit.models.adapters.adapt` accepts (it is not run); ``tokens`` a non-empty
    integer tensor ``[pos]`` or ``[batch, pos]`` of ids in ``[0, d_vocab)``, ``pos <= n_ctx``. The strings of all
    ids are returned in order (``batch * pos`` of them).
    """
    from circuitkit.models.adapters import adapt

    spec = adapt(model).spec
    ids = validate.tensor("token_strings: tokens", tokens, integral=True)
    if ids.ndim not in (1, 2) or ids.numel() == 0:
        raise validate.fail("token_strings: tokens", ids, "a non-empty integer tensor [pos] or [batch, pos]")
    if spec.n_ctx is not None and ids.shape[-1] > spec.n_ctx:
        raise validate.fail("token_strings: tokens", ids, f"at most n_ctx={spec.n_ctx} positions")
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= spec.d_vocab:
        raise validate.fail(
            "token_strings: tokens", validate.given(f"ids in [{low}, {high}]"), f"ids in [0, {spec.d_vocab - 1}]"
        )
    values = [int(t) for t in ids.reshape(-1).tolist()]
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is not None and hasattr(tokenizer, "decode"):
        return [tokenizer.decode([token]) for token in values]
    return [str(token) for token in values]


def _patterns_and_names(
    patterns: Any, head_names: Sequence[str] | None, caller: str, *, single_ok: bool
) -> tuple[np.ndarray, list[str] | None]:
    if isinstance(patterns, Mapping):
        if not patterns:
            raise CircuitkitError(f"{caller}: given an empty mapping; expected (layer, head) -> [q_pos, k_pos].")
        keys = list(patterns)
        for key in keys:
            if not (isinstance(key, tuple) and len(key) == 2):
                raise CircuitkitError(f"{caller}: given key {key!r}; expected (layer, head) tuples as keys.")
        arrays = [as_float_array(patterns[key], name=f"patterns[{key}]", caller=caller, ndim=2) for key in keys]
        if len({a.shape for a in arrays}) != 1:
            raise CircuitkitError(
                f"{caller}: given patterns of shapes {[a.shape for a in arrays]}; expected one [pos, pos] shape."
            )
        array = np.stack(arrays)
        names = _check_names(head_names, caller) if head_names is not None else [head_name(key) for key in keys]
    else:
        if single_ok and isinstance(patterns, Tensor) and patterns.ndim == 2:
            patterns = patterns[None]
        array = as_float_array(patterns, name="patterns", caller=caller, ndim=3)
        names = _check_names(head_names, caller) if head_names is not None else None
    n, q_pos, k_pos = array.shape
    if q_pos != k_pos or q_pos == 0:
        raise CircuitkitError(f"{caller}: given patterns of shape {array.shape}; expected [head, pos, pos].")
    if array.min() < -PATTERN_ATOL or array.max() > 1 + PATTERN_ATOL:
        raise CircuitkitError(
            f"{caller}: given pattern values in [{array.min():.3g}, {array.max():.3g}]; expected attention "
            "probabilities in [0, 1] (pass hook_pattern, not hook_attn_scores)."
        )
    if names is not None and len(names) != n:
        raise CircuitkitError(f"{caller}: given {len(names)} head names for {n} heads; expected one per head.")
    return array, names


def _check_names(names: Any, caller: str) -> list[str]:
    if isinstance(names, str) or not isinstance(names, Sequence) or not all(isinstance(n, str) for n in names):
        raise validate.fail(f"{caller}: head_names", names, "a list of strings, one per head")
    return list(names)


def _check_tokens(tokens: Sequence[str], pos: int, caller: str) -> list[str]:
    if isinstance(tokens, str) or not isinstance(tokens, Sequence) or not all(isinstance(t, str) for t in tokens):
        raise CircuitkitError(
            f"{caller}: given tokens {describe(tokens)}; expected a list of {pos} strings "
            "(circuitkit.viz.token_strings(model, tokens))."
        )
    if len(tokens) != pos:
        raise CircuitkitError(f"{caller}: given {len(tokens)} tokens; expected {pos}, one per pattern position.")
    return list(tokens)
