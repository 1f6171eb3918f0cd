"""A hand-wired two-layer induction circuit: a previous-token head K-composing with an induction head.

On ``... A B ... A`` it predicts ``B``: the layer-1 head attends from the current token ``A`` to the position
whose *previous* token was ``A`` (the key side reads what the layer-0 head wrote, hence K-composition) and
copies that position's token into the output.

Residual layout (``V = d_vocab``, ``B = ceil(log2 n_ctx)``), every block one-hot or a code, nothing shared::

    tok   [V]       W_E[t] = e_t                    the current token
    prev  [V]       written by head 0.0             the previous token (a copy of its tok)
    out   [V]       written by head 1.0, read by W_U the predicted next token
    pos   [2B - 1]  W_pos[i] = PositionCode(n_ctx)[i]
    first [1]       W_pos[0] = 1, else 0            marks position 0

Heads (row convention, shapes ``[d_model, r]``)::

    0.0 previous-token  QK: W_Q = pos.T @ shift(1) * s0,  W_K = pos.T      score = s0 * sum_b cos((i-1-j) w_b)
                        OV: W_V = tok.T, W_O = prev                        prev[i] <- tok[i-1]
    1.0 induction       QK: W_Q = tok.T * s1, W_K = prev.T                 score = s1 * [tok_i == tok_{j-1}]
                            + b_Q = -2 s1 on W_K = first.T                 keep off position 0
                        OV: W_V = tok.T, W_O = out                         out[i] <- tok[j]
    logits = logit_scale * resid @ out.T                                   the copied token's logit is logit_scale

Position 0 has no previous token, so head 0.0 there can only attend to itself and copies position 0's own
token into ``prev``; without the ``first`` flag the induction head would treat that as a match for the token
itself. ``s0 = gap * sqrt(d_head) / 2`` and ``s1 = gap * sqrt(d_head)`` make the intended key win by ``gap``
logits after the model's ``1 / sqrt(d_head)`` (the position code's margin is 2), so soft attention is
near-hard: the rest of a row shares at most ``n_ctx * exp(-gap)`` of the weight.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from circuitkit import validate
from circuitkit.errors import CircuitkitError
from circuitkit.handbuilt import limits
from circuitkit.handbuilt.assembly import assemble
from circuitkit.handbuilt.heads import HeadSpec, PositionCode, copy_ov, key_bias_qk, match_qk, previous_token_qk
from circuitkit.handbuilt.subspace import ResidualLayout
from circuitkit.models.toy import AttentionMode, AttentionOnlyModel

DEFAULT_GAP = 20.0
"""Logit gap of the intended key: off-target attention <= n_ctx * exp(-20) ~ 2e-9 * n_ctx."""

DEFAULT_LOGIT_SCALE = 10.0
"""Logit of the copied token (all others 0): a correct prediction costs ~ (d_vocab - 1) * exp(-10) nats of loss."""


MAX_VOCAB = (limits.MAX_WIDTH - 2 * math.ceil(math.log2(limits.MAX_POSITIONS))) // 3
"""Largest ``d_vocab`` of :func:`induction_circuit`: its residual stream (three vocabulary blocks and the position
code) must fit :data:`circuitkit.handbuilt.limits.MAX_WIDTH`."""


@dataclass(frozen=True, eq=False)
class InductionCircuit:
    """The built circuit: ``model``, its ``layout``, the two heads, and the QK/OV ranks that were built."""

    model: AttentionOnlyModel
    layout: ResidualLayout
    code: PositionCode
    previous_token_head: tuple[int, int] = (0, 0)
    induction_head: tuple[int, int] = (1, 0)

    @property
    def built_ranks(self) -> dict[str, dict[tuple[int, int], int]]:
        """``{"QK": {head: rank}, "OV": {head: rank}}`` as constructed (the bias column adds no QK rank)."""
        V = self.layout["tok"].size
        return {
            "QK": {self.previous_token_head: self.code.dim, self.induction_head: V},
            "OV": {self.previous_token_head: V, self.induction_head: V},
        }


def induction_circuit(
    d_vocab: int,
    n_ctx: int,
    *,
    gap: float = DEFAULT_GAP,
    logit_scale: float = DEFAULT_LOGIT_SCALE,
    attention: AttentionMode = "soft",
) -> InductionCircuit:
    """Build the two-layer induction circuit of the module docstring for ``d_vocab`` tokens and ``n_ctx`` positions.

    ``d_model = 3 * d_vocab + 2 * ceil(log2 n_ctx)``, ``d_head = max(d_vocab + 1, 2 * ceil(log2 n_ctx) - 1)``.
    ``gap``: how many logits the intended key beats the others by in both heads; ``logit_scale``: the logit the
    copied token gets (argmax predictions do not depend on it, the loss does).
    """
    d_vocab = validate.integer("induction_circuit: d_vocab", d_vocab, minimum=2, maximum=MAX_VOCAB,
                               why="d_model = 3 * d_vocab + 2 * ceil(log2 n_ctx) must stay within MAX_WIDTH")
    n_ctx = limits.positions("induction_circuit: n_ctx", n_ctx, minimum=2)
    gap = validate.real("induction_circuit: gap", gap, minimum=0.0, strict_minimum=True)
    logit_scale = validate.real("induction_circuit: logit_scale", logit_scale, minimum=0.0, strict_minimum=True)
    code = PositionCode(n_ctx)
    layout = ResidualLayout.stack(tok=d_vocab, prev=d_vocab, out=d_vocab, pos=code.dim, first=1)
    tok, prev, out, pos, first = (layout[n] for n in ("tok", "prev", "out", "pos", "first"))
    d_head = max(d_vocab + 1, code.dim)
    s0 = gap * math.sqrt(d_head) / code.margin
    s1 = gap * math.sqrt(d_head)

    W_E = tok.basis()                                          # [d_vocab, d_model]: token t -> e_tok[t]
    W_pos = code.codes() @ pos.basis()                         # [n_ctx, d_model]
    W_pos[0] += first.basis()[0]                               # flag position 0
    W_U = logit_scale * out.basis().T                          # [d_model, d_vocab]: read the out block

    previous = HeadSpec(
        qk=previous_token_qk(pos, code, offset=1, scale=s0),   # attend i -> i-1
        ov=copy_ov(tok, prev),                                 # prev[i] <- tok[i-1]
        name="previous-token",
    )
    induction = HeadSpec(
        qk=match_qk(tok, prev, scale=s1) + key_bias_qk(first, -2 * s1),  # attend to j with tok[j-1] == tok[i]
        ov=copy_ov(tok, out),                                  # out[i] <- tok[j]
        name="induction",
    )
    model = assemble(
        [[previous], [induction]], d_head=d_head, W_E=W_E, W_U=W_U, W_pos=W_pos, attention=attention
    )
    return InductionCircuit(model=model, layout=layout, code=code)


def repeated_tokens(
    d_vocab: int, length: int, *, batch: int = 1, seed: int = 0, distinct: bool = True
) -> torch.Tensor:
    """``[batch, 2 * length]`` random blocks repeated twice (``distinct``: no token twice within a block,
    so every repeated-half prediction is unambiguous). ``d_vocab`` is an int in ``[1, MAX_WIDTH]``, ``length``
    in ``[1, MAX_POSITIONS // 2]``, ``batch`` in ``[1, MAX_BATCH]`` (:mod:`circuitkit.handbuilt.limits`), ``seed`` an
    int in ``[0, 2**63 - 1]``, ``distinct`` a bool."""
    d_vocab = limits.width("repeated_tokens: d_vocab", d_vocab)
    length = validate.integer("repeated_tokens: length", length, minimum=1, maximum=limits.MAX_POSITIONS // 2,
                              why="the repeated sequence has 2 * length positions")
    batch = validate.integer("repeated_tokens: batch", batch, minimum=1, maximum=limits.MAX_BATCH)
    seed = validate.seed("repeated_tokens: seed", seed)
    distinct = validate.boolean("repeated_tokens: distinct", distinct)
    if distinct and length > d_vocab:
        raise CircuitkitError(
            f"repeated_tokens: given length={length} distinct tokens from d_vocab={d_vocab}; "
            "expected length <= d_vocab."
        )
    g = torch.Generator().manual_seed(seed)
    if distinct:
        block = torch.stack([torch.randperm(d_vocab, generator=g)[:length] for _ in range(batch)])
    else:
        block = torch.randint(0, d_vocab, (batch, length), generator=g)
    return torch.cat([block, block], dim=1)
