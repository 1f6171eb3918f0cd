"""``Task``: a behaviour as clean/corrupted prompt pairs, the answers each pair should and should not get, a metric.

Why: circuits are found on behaviours. Indirect-object identification, greater-than, docstring completion and a
researcher's own prompts all take one shape (Wang et al. 2022; Hanna et al. 2023; EAP-IG; auto-circuit; MIB): a
clean prompt, a corrupted prompt of the same token length that differs where the behaviour's information is, the
answer token(s) and the wrong answer token(s). A metric is read at each prompt's **own last token**.

Tokenization (:meth:`Task.tokenize`): text prompts as the model's tokenizer does by default
(``add_special_tokens=True`` as the tokenizer's own files define it: a Llama or Gemma tokenizer prepends its BOS, a
Qwen2 or GPT-2 tokenizer adds nothing), read through :func:`circuitkit.models.tokenizer.default_tokenizer` (the
TransformerLens bridge's own tokenizer always prepends a BOS). ``prepend_bos=True`` puts the tokenizer's BOS before
the prompt's text tokens, ``False`` runs the text tokens alone (no special token at all); token-id prompts are run
as given under every rule. Answers as continuations (no special tokens; a leading space is part of the answer, as in
``" Mary"``). An answer of several tokens is scored by its **first token** (the model's next-token prediction at
the prompt's last position: the metric reads that position only, so one pass serves every answer); an answer and a
wrong answer that share their first token are refused, since the metric cannot tell them apart. A pair whose clean
and corrupted prompts have different token lengths is refused (naming the pair and the lengths the model gets).

Marks (:attr:`Task.marks`) are positions among a prompt's **text tokens** (as ``add_special_tokens=False`` gives
them); :attr:`TaskBatch.prefix` holds, per pair, how many special tokens the rule put before them.

Batching: prompts of different lengths are **right-padded**. The models circuitkit runs are causal, so a position
never attends to a later one: the pads sit after every real token of their row and change nothing at the real
positions (the metric, read at each row's last real token, equals the prompt run alone; a test checks it).
Statistics over positions (mean ablation values) use the real positions only (:attr:`TaskBatch.real`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from circuitkit import validate
from circuitkit.errors import CircuitkitError

MAX_PAIRS = 100_000
"""Pairs one task may hold. Published task sets hold hundreds to a few thousand; a circuit search runs every pair
through the model several times, so a larger set is refused with this figure rather than loaded."""
MAX_PROMPT_CHARS = 20_000
"""Characters of one prompt (a few thousand tokens at most): longer text is refused, never truncated."""
MAX_ANSWERS = 16
"""Answer (or wrong-answer) tokens one pair may list."""
MAX_TOKEN_ID = 2**63 - 1
"""Largest token id taken (int64, as token tensors hold them); the model's vocabulary is checked at tokenization."""


@dataclass(frozen=True)
class Pair:
    """One clean/corrupted pair: prompts as text or token ids, one or more answers and wrong answers (text or ids)."""

    clean: str | tuple[int, ...]
    corrupted: str | tuple[int, ...]
    answers: tuple[str | int, ...]
    wrongs: tuple[str | int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "clean", _prompt(self.clean, "Pair: clean"))
        object.__setattr__(self, "corrupted", _prompt(self.corrupted, "Pair: corrupted"))
        object.__setattr__(self, "answers", _answers(self.answers, "Pair: answers"))
        object.__setattr__(self, "wrongs", _answers(self.wrongs, "Pair: wrongs"))

    def to_json(self) -> dict[str, Any]:
        return {"clean": _plain(self.clean), "corrupted": _plain(self.corrupted),
                "answer": [_plain(a) for a in self.answers], "wrong": [_plain(w) for w in self.wrongs]}


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


@dataclass(frozen=True, eq=False)
class TaskBatch:
    """A task tokenized for one model. ``clean`` / ``corrupted``: ``[pair, pos]`` token ids, right-padded;
    ``last``: ``[pair]`` each row's last real position; ``answers`` / ``wrongs``: ``[pair, A]`` / ``[pair, W]`` ids,
    ``answer_mask`` / ``wrong_mask`` True where an entry is listed (rows may list fewer); ``prefix``: ``[pair]`` the
    special tokens put before each clean prompt's text tokens (marks are shifted by it); ``rule``: the BOS rule that
    ran, ``"auto"`` (the tokenizer's default), ``"yes"`` or ``"no"``; ``scored``: ``[pair, pos]`` bool, the
    positions whose next-token prediction a ``"scored"`` metric reads (the task's :attr:`Task.scored`), or None."""

    clean: Tensor
    corrupted: Tensor
    last: Tensor
    answers: Tensor
    wrongs: Tensor
    answer_mask: Tensor
    wrong_mask: Tensor
    prefix: Tensor | None = None
    rule: str = "auto"
    scored: Tensor | None = None

    @property
    def n_pairs(self) -> int:
        return self.clean.shape[0]

    @property
    def pos(self) -> int:
        return self.clean.shape[1]

    @property
    def real(self) -> Tensor:
        """``[pair, pos]`` bool: True at real (not padding) positions."""
        return torch.arange(self.pos, device=self.last.device)[None, :] <= self.last[:, None]

    def subset(self, index: Tensor) -> TaskBatch:
        """The pairs at ``index`` (a 1-D long tensor; repeats allowed: bootstrap resamples)."""
        index = index.to(self.clean.device)
        last = self.last[index]
        width = int(last.max()) + 1
        return TaskBatch(self.clean[index, :width], self.corrupted[index, :width], last, self.answers[index],
                         self.wrongs[index], self.answer_mask[index], self.wrong_mask[index],
                         None if self.prefix is None else self.prefix[index.to(self.prefix.device)], self.rule,
                         None if self.scored is None else self.scored[index.to(self.scored.device), :width])

    def to(self, device: torch.device) -> TaskBatch:
        return TaskBatch(*(getattr(self, f).to(device) for f in
                           ("clean", "corrupted", "last", "answers", "wrongs", "answer_mask", "wrong_mask")),
                         prefix=None if self.prefix is None else self.prefix.to(device), rule=self.rule,
                         scored=None if self.scored is None else self.scored.to(device))


@dataclass(frozen=True, eq=False)
class Task:
    """A behaviour: ``pairs`` (:class:`Pair`), the ``metric`` read at each prompt's last token
    (a name in :data:`circuitkit.graph.metrics.METRICS`, ``"logit_diff"`` by default, or your own function
    ``metric(logits, batch) -> [pair]``: :class:`UserMetric`), a ``name`` and a
    ``description``.

    ``marks``: per pair, named positions among the clean prompt's text tokens (special tokens not counted; IOI:
    ``io``, ``s1``); with them a task brings its own head scores, ``attention_scores``: ``(name, to, minus)`` is
    each head's attention from the prompt's last token to mark ``to`` minus to mark ``minus``, averaged over pairs
    (IOI's ``io_attention``).

    ``scored``: per pair, the positions among the clean prompt's text tokens whose next-token prediction a
    ``"scored"`` metric reads (``next_token_logprob``: the mean log-probability of each scored position's next
    token, which must lie inside the prompt); required by such a metric (a metric of the last token leaves them
    unread).

    ``ablation``: how a node outside a circuit is replaced: ``"corrupted"`` (its value on the corrupted prompt of the
    same pair: counterfactual patching, the default), ``"mean"`` (its mean over the corrupted prompts' real
    positions), ``"clean_mean"`` (its mean over the clean prompts' real positions: the induction scan's mean
    ablation) or ``"zero"``.

    Build one with :meth:`from_pairs` (lists, ``datasets``-style dicts), :func:`circuitkit.tasks.load_task` (a
    JSON Lines / CSV / EAP-IG CSV / auto-circuit JSON file) or a generator (:func:`circuitkit.tasks.ioi`, ...).
    """

    name: str
    pairs: tuple[Pair, ...]
    metric: Any = "logit_diff"
    ablation: str = "corrupted"
    description: str = ""
    marks: tuple[dict[str, int], ...] = ()
    attention_scores: tuple[tuple[str, str, str], ...] = ()
    scored: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip() or "\n" in self.name or len(self.name) > 100:
            raise validate.fail("Task: name", self.name, "a one-line name of at most 100 characters")
        if not isinstance(self.pairs, tuple) or not self.pairs:
            raise validate.fail(f"Task {self.name!r}: pairs", self.pairs, "a non-empty tuple of Pair")
        if len(self.pairs) > MAX_PAIRS:
            raise CircuitkitError(
                f"Task {self.name!r}: given {len(self.pairs)} pairs; expected at most {MAX_PAIRS}. "
                "Take a sample of the pairs: a circuit search runs every pair through the model many times."
            )
        if callable(self.metric) and not isinstance(self.metric, str):  # the researcher's own function
            object.__setattr__(self, "metric", UserMetric(self.metric))
        else:
            metric = validate.option(f"Task {self.name!r}: metric", self.metric, (*METRIC_NAMES, *ALIASES))
            object.__setattr__(self, "metric", ALIASES.get(metric, metric))
        validate.option(f"Task {self.name!r}: ablation", self.ablation, ABLATIONS)
        bad = next((i for i, p in enumerate(self.pairs) if not isinstance(p, Pair)), None)
        if bad is not None:
            raise validate.fail(f"Task {self.name!r}: pair {bad}", self.pairs[bad],
                                "a Pair (Task.from_pairs builds them from tuples and dicts)")
        if not isinstance(self.description, str) or len(self.description) > MAX_PROMPT_CHARS:
            raise validate.fail(f"Task {self.name!r}: description", self.description,
                                f"a string of at most {MAX_PROMPT_CHARS} characters")
        if not isinstance(self.marks, tuple) or (self.marks and len(self.marks) != len(self.pairs)):
            raise validate.fail(f"Task {self.name!r}: marks", self.marks,
                                f"a tuple of one dict of token positions per pair ({len(self.pairs)})")
        for i, row in enumerate(self.marks):
            if not isinstance(row, dict) or not all(
                    isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and 0 <= v < MAX_PROMPT_CHARS
                    for k, v in row.items()):
                raise validate.fail(f"Task {self.name!r}: marks of pair {i}", row,
                                    "a dict of names to token positions (ints >= 0)")
        if not isinstance(self.attention_scores, tuple) or not all(
                isinstance(s, tuple) and len(s) == 3 and all(isinstance(x, str) and x.strip() for x in s)
                for s in self.attention_scores):
            raise validate.fail(f"Task {self.name!r}: attention_scores", self.attention_scores,
                                "a tuple of (name, to, minus) tuples of non-empty strings")
        self._check_scored()
        for name, to, minus in self.attention_scores:
            missing = [m for m in (to, minus) if not self.marks or any(m not in row for row in self.marks)]
            if missing:
                raise validate.fail(f"Task {self.name!r}: attention score {name!r}", missing,
                                    "marks that every pair names")

    def _check_scored(self) -> None:
        """``scored``: empty, or one non-empty tuple of increasing positions (ints >= 0) per pair; required where
        the metric reads scored positions (a metric of the last token leaves them unread)."""
        reads = isinstance(self.metric, str) and _registry()[self.metric].reads == "scored"
        if not isinstance(self.scored, tuple) or (self.scored and len(self.scored) != len(self.pairs)):
            raise validate.fail(f"Task {self.name!r}: scored", self.scored,
                                f"a tuple of one tuple of token positions per pair ({len(self.pairs)})")
        if reads and not self.scored:
            raise validate.fail(f"Task {self.name!r}: scored", self.scored, f"the positions metric {self.metric!r} "
                                "reads: one tuple of token positions per pair (e.g. the repeated copies)")
        for i, row in enumerate(self.scored):
            if not isinstance(row, tuple) or not row or not all(
                    isinstance(v, int) and not isinstance(v, bool) and 0 <= v < MAX_PROMPT_CHARS for v in row) \
                    or any(a >= b for a, b in zip(row, row[1:], strict=False)):
                raise validate.fail(f"Task {self.name!r}: scored positions of pair {i}", row,
                                    "a non-empty tuple of increasing token positions (ints >= 0)")

    @property
    def n_pairs(self) -> int:
        return len(self.pairs)

    @classmethod
    def from_pairs(cls, pairs: Iterable[Any], *, name: str = "custom", metric: Any = "logit_diff",
                   ablation: str = "corrupted", description: str = "") -> Task:
        """A task from pairs: each a :class:`Pair`, a ``(clean, corrupted, answer, wrong)`` tuple, or a dict with
        keys ``clean``, ``corrupted``, ``answer``, ``wrong`` (a ``datasets``-style row; ``answer`` / ``wrong`` may
        be lists). Text or token ids; at most :data:`MAX_PAIRS` pairs (an endless iterator is refused after that)."""
        if isinstance(pairs, (str, bytes, dict)) or not isinstance(pairs, Iterable):
            raise validate.fail("Task.from_pairs: pairs", pairs, "a list of (clean, corrupted, answer, wrong) or dicts")
        try:
            items = list(itertools.islice(pairs, MAX_PAIRS + 1))
        except Exception as error:  # noqa: BLE001 - the caller's iterator: any error it raises is bad input
            raise validate.fail("Task.from_pairs: pairs", validate.given(
                f"an iterable that raised {type(error).__name__}"), "an iterable of pairs that can be read") from None
        if len(items) > MAX_PAIRS:
            raise CircuitkitError(
                f"Task.from_pairs: given more than {MAX_PAIRS} pairs; expected at most {MAX_PAIRS}. "
                "Take a sample of the pairs."
            )
        out = [as_pair(item, f"Task.from_pairs: pair {i}") for i, item in enumerate(items)]
        return cls(name=name, pairs=tuple(out), metric=metric, ablation=ablation, description=description)

    def tokenize(self, model_or_adapter: Any, prepend_bos: bool | None = None) -> TaskBatch:
        """The pairs as token ids for the model (see the module docstring), on the model's device. ``prepend_bos``:
        ``None`` (the tokenizer's default), ``True`` (its BOS, then the text's tokens) or ``False`` (the text's
        tokens alone)."""
        from circuitkit.models.adapters import ModelAdapter, adapt

        adapter = model_or_adapter if isinstance(model_or_adapter, ModelAdapter) else adapt(model_or_adapter)
        return tokenize(self, adapter, prepend_bos)

    def to_json(self, n_examples: int = 3) -> dict[str, Any]:
        return {"name": self.name, "metric": metric_label(self.metric), "pairs": self.n_pairs,
                "ablation": self.ablation, "description": self.description,
                "examples": [p.to_json() for p in self.pairs[:n_examples]]}

    def __repr__(self) -> str:
        return (f"Task({self.name!r}, {self.n_pairs} pairs, metric {metric_label(self.metric)!r}, "
                f"ablation {self.ablation!r})")


USER_READS = ("last", "all")
"""Where a researcher's metric reads the logits: at each prompt's last token (``[pair, vocab]``) or at every
position (``[pair, pos, vocab]``)."""


class UserMetric:
    """A researcher's metric function, checked on every call (module docstring). ``label``: ``"custom:NAME"``
    with ``NAME`` the function's ``__name__``.

    ``reads``: ``"last"`` (default): ``fn(logits [pair, vocab], batch)``, the logits at each prompt's last token;
    ``"all"``: ``fn(logits [pair, pos, vocab], batch)``, the logits at every position of the right-padded prompts
    (a pair's positions after ``batch.last[pair]`` are padding: ``batch.real`` is True where a position is real),
    for a behaviour read over a span (a loss on several tokens, a copied sequence). Either returns ``[pair]``."""

    def __init__(self, fn: Callable[..., Any], reads: str | None = None) -> None:
        if isinstance(fn, UserMetric):
            reads = fn.reads if reads is None else reads
            fn = fn.fn
        self.reads = validate.option("task metric: reads", "last" if reads is None else reads, USER_READS)
        if not callable(fn) or isinstance(fn, type):
            raise CircuitkitError(f"task metric: given {type(fn).__name__}; expected a metric name or a function "
                                  f"{self.signature} -> tensor [pair].")
        self.fn = fn
        name = getattr(fn, "__name__", type(fn).__name__)
        self.name = "".join(c for c in str(name) if c.isalnum() or c in "_.<>")[:60] or "metric"
        self.label = f"custom:{self.name}"

    def __repr__(self) -> str:
        return f"UserMetric({self.name}, reads={self.reads!r})"

    @property
    def signature(self) -> str:
        """How the function is called, in words (the refusals name it)."""
        return f"metric(logits [pair, {'pos, ' if self.reads == 'all' else ''}vocab], batch)"

    def __call__(self, logits: Tensor, batch: TaskBatch, clean_logprobs: Tensor | None = None) -> Tensor:
        """``logits`` ``[..., pair, vocab]`` (``reads="all"``: ``[..., pair, pos, vocab]``) -> ``[..., pair]``: the
        function called once per leading index."""
        inner = 3 if self.reads == "all" else 2
        flat = logits.reshape(-1, *logits.shape[-inner:])
        values = torch.stack([self._one(flat[i], batch) for i in range(flat.shape[0])])
        return values.reshape(logits.shape[: logits.dim() - inner + 1])

    def _one(self, logits: Tensor, batch: TaskBatch) -> Tensor:
        where = f"task metric {self.name!r}"
        try:
            out = self.fn(logits, batch)
        except CircuitkitError:
            raise
        except Exception as error:  # noqa: BLE001 - the researcher's function: any error it raises is theirs
            first = (str(error).strip().splitlines() or [""])[0][:200]
            raise CircuitkitError(f"{where}: raised {type(error).__name__}: {first}; expected {self.signature} to "
                                  "return a tensor [pair].") from None
        n = logits.shape[0]
        if not isinstance(out, Tensor) or not out.is_floating_point() or tuple(out.shape) != (n,):
            given = (f"a {tuple(out.shape)} {out.dtype} tensor" if isinstance(out, Tensor) else type(out).__name__)
            raise CircuitkitError(f"{where}: returned {given}; expected a floating tensor of shape ({n},), one value "
                                  "per pair (not their mean).")
        if logits.requires_grad and not out.requires_grad:
            raise CircuitkitError(f"{where}: returned values that do not depend on the logits through autograd; "
                                  "expected a differentiable function of them (no .item(), .detach(), .tolist() or "
                                  "new tensors built from numbers): the circuit's ranking is its gradient.")
        if not bool(torch.isfinite(out.detach()).all()):
            raise CircuitkitError(f"{where}: returned non-finite values (NaN or infinity) for finite logits; "
                                  "expected finite values for every pair (guard logs and divisions).")
        return out


def metric_label(metric: Any) -> str:
    """How a task's metric is named in the answer and ``scores.json``."""
    return metric.label if isinstance(metric, UserMetric) else metric


def _registry() -> dict[str, Any]:
    from circuitkit.metric_registry import REGISTRY

    return REGISTRY


ABLATIONS = ("corrupted", "mean", "clean_mean", "zero")
METRIC_NAMES = ("logit_diff", "prob_diff", "answer_logprob", "neg_kl", "next_token_logprob")
"""The metrics a task may name (:data:`circuitkit.metric_registry.REGISTRY`; a test checks they agree)."""
ALIASES = {"loss": "answer_logprob", "kl": "neg_kl"}
"""Other names for two metrics: the answer's loss (kept as a log-probability, so that higher is more of the
behaviour) and the KL divergence to the clean run (negated likewise)."""


def as_pair(item: Any, where: str) -> Pair:
    """One pair from a :class:`Pair`, a 4-tuple or a dict (see :meth:`Task.from_pairs`), checked."""
    if isinstance(item, Pair):
        clean, corrupted, answers, wrongs = item.clean, item.corrupted, item.answers, item.wrongs
    elif isinstance(item, dict):
        missing = [k for k in ("clean", "corrupted", "answer", "wrong") if k not in item]
        if missing:
            raise validate.fail(where, sorted(item, key=repr), f"the keys clean, corrupted, answer, wrong (missing "
                                                               f"{missing})")
        clean, corrupted, answers, wrongs = item["clean"], item["corrupted"], item["answer"], item["wrong"]
    elif isinstance(item, (tuple, list)) and len(item) == 4:
        clean, corrupted, answers, wrongs = item
    else:
        raise validate.fail(where, item, "a (clean, corrupted, answer, wrong) tuple or a dict with those keys")
    return Pair(_prompt(clean, f"{where}: clean"), _prompt(corrupted, f"{where}: corrupted"),
                _answers(answers, f"{where}: answer"), _answers(wrongs, f"{where}: wrong"))


def _prompt(value: Any, where: str) -> str | tuple[int, ...]:
    if isinstance(value, str):
        if not value:
            raise validate.fail(where, value, "a non-empty prompt")
        if len(value) > MAX_PROMPT_CHARS:
            raise validate.fail(where, f"{len(value)} characters", f"a prompt of at most {MAX_PROMPT_CHARS} characters")
        return _unicode(value, where)
    ids = _ids(value, where)
    if not ids:
        raise validate.fail(where, value, "a non-empty prompt (text or token ids)")
    return ids


def _unicode(text: str, where: str) -> str:
    """``text`` if a tokenizer can read it: a lone surrogate (a JSON ``"\\ud800"`` escape without its pair) is not
    a character, and tokenizers raise a TypeError on it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise validate.fail(where, validate.given(f"text holding the lone surrogate U+{ord(text[error.start]):04X} "
                                                  f"at character {error.start}"),
                            "valid Unicode text (a \\uD800-\\uDFFF escape only as half of a pair)") from None
    return text


def _ids(value: Any, where: str) -> tuple[int, ...]:
    if isinstance(value, Tensor):
        if value.ndim != 1 or value.dtype.is_floating_point or value.dtype == torch.bool or value.is_complex() \
                or value.numel() > MAX_PROMPT_CHARS or value.is_meta:
            raise validate.fail(where, value, "text or a 1-D integer tensor / list of token ids")
        ids = tuple(int(v) for v in value.tolist())
    elif isinstance(value, (list, tuple)) and len(value) <= MAX_PROMPT_CHARS and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        ids = tuple(int(v) for v in value)
    else:
        raise validate.fail(where, value, "text or a list of token ids (ints)")
    bad = next((v for v in ids if not 0 <= v <= MAX_TOKEN_ID), None)
    if bad is not None:
        raise validate.fail(where, validate.given(f"the token id {_short_int(bad)}"),
                            "token ids in [0, 2**63) (then checked against the model's vocabulary)")
    return ids


def _short_int(value: int) -> str:
    return str(value) if abs(value) < 10**30 else f"{'-' if value < 0 else ''}an int of {value.bit_length()} bits"


def _answers(value: Any, where: str) -> tuple[str | int, ...]:
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if not items or len(items) > MAX_ANSWERS:
        raise validate.fail(where, value, f"one to {MAX_ANSWERS} answers (text or token ids)")
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (str, int)) or (isinstance(item, str) and not item):
            raise validate.fail(where, item, "a non-empty answer text or a token id")
        if isinstance(item, str) and len(item) > MAX_PROMPT_CHARS:
            raise validate.fail(where, f"{len(item)} characters", f"an answer of at most {MAX_PROMPT_CHARS} characters")
        if isinstance(item, str):
            _unicode(item, where)
        if isinstance(item, int) and not 0 <= item <= MAX_TOKEN_ID:
            raise validate.fail(where, validate.given(f"the token id {_short_int(item)}"), "token ids in [0, 2**63)")
    return tuple(items)


def _tokenizer_of(adapter: Any) -> Any:
    tokenizer = adapter.tokenizer
    if tokenizer is None:
        raise CircuitkitError(
            f"Task: given text prompts for a {type(adapter.model).__name__} without a tokenizer; expected a model "
            "with a tokenizer, or prompts and answers as token ids."
        )
    return tokenizer


BOS_RULES = {None: "auto", True: "yes", False: "no"}
"""``prepend_bos`` as the report and ``scores.json`` name it."""


def check_prepend_bos(where: str, value: Any) -> bool | None:
    """``prepend_bos`` checked: None, True or False."""
    if value is None or isinstance(value, bool):
        return value
    raise validate.fail(f"{where}: prepend_bos", value, "None (the tokenizer's default), True or False")


def _encode_prompt(adapter: Any, prompt: str | tuple[int, ...], prepend_bos: bool | None,
                   where: str = "Task: prompt") -> tuple[list[int], int]:
    """The token ids the model gets for ``prompt`` and how many of them come before its text tokens (text the
    tokenizer does not know refused: :func:`_check_known`)."""
    if isinstance(prompt, tuple):
        return list(prompt), 0
    from circuitkit.models.tokenizer import default_tokenizer

    tokenizer = _tokenizer_of(adapter)
    text = [int(t) for t in tokenizer(prompt, add_special_tokens=False)["input_ids"]]
    _check_known(tokenizer, prompt, text, where)
    if prepend_bos is False:
        return text, 0
    if prepend_bos is True:
        bos = getattr(tokenizer, "bos_token_id", None)
        if not isinstance(bos, int):
            raise CircuitkitError(
                f"Task: given prepend_bos=True for a tokenizer without a BOS token ({type(tokenizer).__name__}); "
                "expected a tokenizer that names one, or prepend_bos=None (its default) or False."
            )
        return [bos, *text], 1
    ids = [int(t) for t in default_tokenizer(tokenizer)(prompt)["input_ids"]]
    return ids, _text_start(ids, text)


def _text_start(ids: list[int], text: list[int]) -> int:
    """Where the text tokens ``text`` start inside ``ids`` (the special tokens the default rule adds come first;
    0 where they cannot be found as one run: the marks are then read as given)."""
    n = len(text)
    return next((k for k in range(len(ids) - n + 1) if ids[k : k + n] == text), 0)


def _encode_answer(adapter: Any, answer: str | int, where: str) -> int:
    if isinstance(answer, int):
        return answer
    tokenizer = _tokenizer_of(adapter)
    ids = [int(t) for t in tokenizer(answer, add_special_tokens=False)["input_ids"]]
    if not ids:
        raise CircuitkitError(f"{where}: given {_short(answer)}, which the model's tokenizer writes as no token at "
                              "all; expected an answer of at least one token.")
    _check_known(tokenizer, answer, ids[:1], where)
    return ids[0]  # an answer of several tokens is scored by its first (module docstring)


def _check_known(tokenizer: Any, text: str, ids: list[int], where: str) -> None:
    """Refuse ``text`` where the tokenizer wrote its unknown token for part of it (``ids``: its token ids, no
    special tokens added): the model would read one placeholder for every word it does not know, so prompts that
    differ there would look alike and an unknown answer would score the placeholder. Text that names the unknown
    token itself is the user's choice."""
    unk = getattr(tokenizer, "unk_token_id", None)
    name = getattr(tokenizer, "unk_token", None)
    if not isinstance(unk, int) or unk not in ids or (isinstance(name, str) and name and name in text):
        return
    words = [w for w in dict.fromkeys(text.split())
             if unk in tokenizer(w, add_special_tokens=False)["input_ids"]] or [text]
    shown = ", ".join(_short(w) for w in words[:5]) + (f" and {len(words) - 5} more" if len(words) > 5 else "")
    from circuitkit.models.tokenizer import vocabulary_size

    known = vocabulary_size(tokenizer)
    size = "" if known is None else f" of {known} tokens"
    raise CircuitkitError(
        f"{where}: given {_short(text)}, of which the model's tokenizer does not know {shown} (it writes its unknown "
        f"token {name!r}, id {unk}, in their place); expected text in the tokenizer's vocabulary{size}, or prompts "
        "and answers as token ids."
    )


def tokenize(task: Task, adapter: Any, prepend_bos: bool | None = None) -> TaskBatch:
    """``task`` as a :class:`TaskBatch` for ``adapter``'s model (module docstring), every id checked against the
    vocabulary, clean and corrupted lengths equal per pair (counted as the model gets them)."""
    prepend_bos = check_prepend_bos(f"task {task.name!r}", prepend_bos)
    spec = adapter.spec
    V = spec.d_vocab
    clean, corrupted, answers, wrongs, prefix, scored = [], [], [], [], [], []
    for i, pair in enumerate(task.pairs):
        where = f"task {task.name!r}: pair {i}"
        (c, start), (k, _) = (_encode_prompt(adapter, pair.clean, prepend_bos, f"{where}: clean prompt"),
                              _encode_prompt(adapter, pair.corrupted, prepend_bos, f"{where}: corrupted prompt"))
        if not c:
            raise CircuitkitError(
                f"{where}: the clean prompt {_short(pair.clean)} is no token at all as the model gets it (BOS rule "
                f"{BOS_RULES[prepend_bos]!r}); expected a prompt of at least one token."
            )
        if len(c) != len(k):
            raise CircuitkitError(
                f"{where}: the clean prompt is {len(c)} tokens and the corrupted prompt {len(k)} (as the model gets "
                f"them, BOS rule {BOS_RULES[prepend_bos]!r}); expected the same token length (clean "
                f"{_short(pair.clean)}, corrupted {_short(pair.corrupted)}). Corrupt with substitutions of the same "
                "token length."
            )
        if spec.n_ctx and len(c) > spec.n_ctx:
            raise validate.fail(f"{where}: prompt", f"{len(c)} tokens", f"at most the model's n_ctx {spec.n_ctx}")
        a = [_encode_answer(adapter, x, f"{where}: answer") for x in pair.answers]
        w = [_encode_answer(adapter, x, f"{where}: wrong") for x in pair.wrongs]
        for label, ids in (("clean prompt", c), ("corrupted prompt", k), ("answer", a), ("wrong", w)):
            bad = [t for t in ids if not 0 <= t < V]
            if bad:
                raise CircuitkitError(
                    f"{where}: the {label} holds token ids {bad[:5]}; expected ids in [0, {V}) "
                    "(the model's vocabulary)."
                )
        marks = task.marks[i] if task.marks else {}
        beyond = {m: p for m, p in marks.items() if p + start >= len(c)}
        if beyond:
            raise validate.fail(f"{where}: marks", beyond,
                                f"token positions inside the clean prompt's {len(c) - start} text tokens")
        positions = [p + start for p in (task.scored[i] if task.scored else ())]
        if positions and positions[-1] + 1 >= len(c):
            raise validate.fail(f"{where}: scored positions", list(task.scored[i]),
                                f"positions whose next token lies inside the clean prompt's {len(c) - start} text "
                                f"tokens (at most {len(c) - start - 2})")
        scored.append(positions)
        if set(a) & set(w):
            raise validate.fail(f"{where}: answer and wrong", (pair.answers, pair.wrongs),
                                "different first tokens (an answer is scored by its first token; one that is also "
                                "a wrong answer's measures nothing)")
        clean.append(c)
        corrupted.append(k)
        answers.append(a)
        wrongs.append(w)
        prefix.append(start)
    device = spec.device
    return TaskBatch(
        clean=_padded(clean).to(device),
        corrupted=_padded(corrupted).to(device),
        last=torch.tensor([len(c) - 1 for c in clean], device=device),
        answers=_padded(answers).to(device),
        wrongs=_padded(wrongs).to(device),
        answer_mask=_padded([[1] * len(a) for a in answers]).bool().to(device),
        wrong_mask=_padded([[1] * len(w) for w in wrongs]).bool().to(device),
        prefix=torch.tensor(prefix, dtype=torch.long, device=device),
        rule=BOS_RULES[prepend_bos],
        scored=_scored_mask(scored, max(len(c) for c in clean), device) if task.scored else None,
    )


def _scored_mask(rows: list[list[int]], width: int, device: Any) -> Tensor:
    out = torch.zeros(len(rows), width, dtype=torch.bool, device="cpu")
    for i, row in enumerate(rows):
        out[i, row] = True
    return out.to(device)


def _padded(rows: Sequence[Sequence[int]]) -> Tensor:
    width = max(len(r) for r in rows)
    out = torch.zeros(len(rows), width, dtype=torch.long, device="cpu")
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.long, device="cpu")
    return out


def _short(prompt: Any) -> str:
    text = repr(prompt if isinstance(prompt, str) else list(prompt))
    return text if len(text) <= 60 else text[:57] + "..."


__all__ = ["ABLATIONS", "ALIASES", "BOS_RULES", "MAX_PAIRS", "METRIC_NAMES", "USER_READS", "Pair", "Task", "TaskBatch",
           "UserMetric", "as_pair", "check_prepend_bos", "metric_label", "tokenize"]
