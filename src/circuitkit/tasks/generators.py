"""Built-in tasks, written for the loaded model's own tokenizer (seeded, deterministic).

- :func:`ioi` — indirect-object identification (Wang et al. 2022): ``"When Mary and John went to the store, John
  gave a drink to"`` -> `` Mary`` (the indirect object) against `` John`` (the subject). Several templates, both
  name orders; names are kept only where `` Name`` is one token of this tokenizer. Corruption "ABC": the second
  subject replaced by a third name (``"..., Anna gave a drink to"``), so the prompt no longer says who is who.
- :func:`greater_than` — Hanna et al. 2023: ``"The war lasted from the year 1732 to the year 17"``. Where the
  tokenizer writes two-digit numbers as one token, the answers are the two-digit years above ``YY`` and the wrong
  ones those at or below it (metric ``prob_diff``, as in the paper). Where it writes numbers **digit by digit**
  (Llama, Qwen), the next token is the tens digit: the answers are the digits above ``YY``'s tens digit, the wrong
  ones those below it (a later year starts with a larger or the same tens digit; the same digit is left out,
  since it can go either way). Corruption: the start year ``1701``/``1700``... becomes ``17`` + ``00``-style
  ``"01"``, after which every year is later.
- :func:`docstring` — Heimersheim & Janiak 2023, for code models: a function with four arguments whose docstring
  documents the first two; the next ``:param`` names the third (answer), against the first two (wrong).
  Corruption: the arguments in the signature renamed (same token count), so the signature no longer says which
  name comes next.
- :func:`repeated_tokens` — induction (Olsson et al. 2022) as a task: the induction scan's own batch of repeated
  random token blocks (:class:`~circuitkit.detect.RepeatedTokens`, token ids, any vocabulary) as the clean prompts;
  the corrupted prompt is the same sequence with every copy of the block redrawn
  (:func:`~circuitkit.circuits.resampled_batch`), so nothing repeats; the metric is ``next_token_logprob`` on the
  repeated copies (each copy's first token skipped), minus the induction scan's loss on the copies, per sequence;
  a head outside a circuit takes its mean over the clean sequences, as in the induction scan
  (``ablation="clean_mean"``). The answer (read by the direct logit attribution)
  is the token the block continues with after the prompt, its first token, against the block's second token.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from circuitkit import validate
from circuitkit.errors import CircuitkitError
from circuitkit.graph.task import Pair, Task

NAMES = (
    "Mary", "John", "Alice", "Bob", "Tom", "James", "Anna", "Sarah", "David", "Emma", "Paul", "Laura", "Mark",
    "Lisa", "Peter", "Kate", "Daniel", "Michael", "Jessica", "Robert", "Linda", "Susan", "Steve", "Kevin", "Jack",
    "Rachel", "Amy", "Chris", "Jennifer", "Richard", "Jane", "George", "Helen", "Frank", "Grace", "Henry", "Eric",
)
PLACES = ("store", "park", "school", "office", "station", "garden", "market", "hospital", "beach", "library")
OBJECTS = ("a drink", "a book", "a ring", "a bag", "an apple", "a letter", "a kiss", "a gift", "a snack", "a key")
IOI_TEMPLATES = (
    "When {A} and {B} went to the {place}, {B} gave {object} to",
    "When {A} and {B} got to the {place}, {B} handed {object} to",
    "After {A} and {B} went to the {place}, {B} gave {object} to",
    "Then, {A} and {B} had a long day at the {place}. {B} gave {object} to",
    "While {A} and {B} were working at the {place}, {B} passed {object} to",
)
ARGUMENTS = ("load", "size", "files", "last", "name", "path", "data", "mode", "user", "value", "item", "count",
             "text", "key", "line", "port", "host", "flag", "limit", "index", "start", "end", "step", "node")
WORDS = ("oil column piece", "crime population", "unit dark", "shape fire", "river gold", "table sound")


def _tokenizer(model: Any) -> Any:
    """The model's tokenizer (the model itself is neither adapted nor run: its state is untouched)."""
    from circuitkit.models.adapters import ModelAdapter

    inner = model.model if isinstance(model, ModelAdapter) else model
    tokenizer = getattr(inner, "tokenizer", None)
    if tokenizer is None:
        raise CircuitkitError(
            f"task generator: given a {type(inner).__name__} without a tokenizer; expected a model with a "
            "tokenizer (built-in tasks write text for it). Build a Task from token ids with Task.from_pairs instead."
        )
    return tokenizer


def _vocabulary_note(tokenizer: Any) -> str:
    """What to try where a built-in task finds too few of its words among a tokenizer's tokens: the size of its
    vocabulary, and the tasks that need no words (a model of a few hundred tokens, such as the bundled one, has
    none of them)."""
    from circuitkit.models.tokenizer import vocabulary_size

    size = vocabulary_size(tokenizer)
    told = f" It has {size} tokens." if size is not None else ""
    return (f"{told} A model without these words runs 'repeated-tokens' (induction as a task) or a task of token "
            "ids (Task.from_pairs, a task file).")


def _one_token(tokenizer: Any, text: str) -> bool:
    """``text`` is one token of the tokenizer's own, not its unknown token (a tokenizer that maps every unknown
    word to ``<unk>`` would otherwise make every name "one token", and every name the same one)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return len(ids) == 1 and ids[0] != getattr(tokenizer, "unk_token_id", None)


def _distinct(tokenizer: Any, texts: Any) -> list[str]:
    """``texts`` that are one token each, keeping the first of several that share a token."""
    seen, out = set(), []
    for text in texts:
        if _one_token(tokenizer, text):
            token = tokenizer(text, add_special_tokens=False)["input_ids"][0]
            if token not in seen:
                seen.add(token)
                out.append(text)
    return out


def _templates(templates: Any) -> tuple[str, ...]:
    """IOI templates, checked: 1 to 100 strings with ``{A}`` once, ``{B}`` at least twice, and fields only among
    ``A``, ``B``, ``place``, ``object``."""
    import string

    expected = ("1 to 100 template strings with {A} once, {B} at least twice (the second mention is corrupted) "
                "and no fields but {A}, {B}, {place}, {object}")
    if not isinstance(templates, (tuple, list)) or not 1 <= len(templates) <= 100:
        raise validate.fail("ioi: templates", templates, expected)
    for template in templates:
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None] \
                if isinstance(template, str) and len(template) <= 2000 else None
        except ValueError:
            fields = None
        if fields is None or fields.count("A") != 1 or fields.count("B") < 2 or \
                not set(fields) <= {"A", "B", "place", "object"}:
            raise validate.fail("ioi: templates", template, expected)
    return tuple(templates)


def _check(n: int, seed: int, where: str) -> tuple[int, random.Random]:
    n = validate.integer(f"{where}: n", n, minimum=2, maximum=10_000)
    return n, random.Random(validate.seed(f"{where}: seed", seed))


def ioi(model: Any, n: int = 32, *, seed: int = 0, templates: tuple[str, ...] = IOI_TEMPLATES) -> Task:
    """``n`` IOI pairs with ABC corruption for ``model``'s tokenizer (module docstring); metric ``logit_diff``."""
    n, rng = _check(n, seed, "ioi")
    templates = _templates(templates)
    tokenizer = _tokenizer(model)
    names = [name[1:] for name in _distinct(tokenizer, [" " + name for name in NAMES])]
    if len(names) < 3:
        raise CircuitkitError(f"ioi: this tokenizer writes only {len(names)} of {len(NAMES)} common names as one "
                              "token; expected at least 3 (the task needs three one-token names)."
                              + _vocabulary_note(tokenizer))
    pairs, marks = [], []
    for i in range(n):
        template = templates[i % len(templates)]
        a, b, c = rng.sample(names, 3)
        fill = {"place": rng.choice(PLACES), "object": rng.choice(OBJECTS)}
        clean = template.format(A=a, B=b, **fill)
        # ABC: the second mention of the subject (after the comma / full stop) becomes a third name
        head, tail = clean.rsplit(f" {b} ", 1)
        corrupted = f"{head} {c} {tail}"
        pairs.append(Pair(clean, corrupted, (" " + a,), (" " + b,)))
        marks.append(_ioi_marks(tokenizer, clean, a, b))
    return Task("ioi", tuple(pairs), metric="logit_diff", marks=tuple(marks),
                attention_scores=(("io_attention", "io", "s1"), ("s2_attention", "s2", "io")),
                description="indirect-object identification: the name that appeared once, against the subject; "
                            "corrupted: the second subject replaced by a third name")


def _ioi_marks(tokenizer: Any, prompt: str, io: str, subject: str) -> dict[str, int]:
    """The marks of one IOI prompt among its text tokens (no special tokens: :class:`~circuitkit.tasks.Task` marks
    count from the text's first token): ``io`` and ``s1``, the first occurrence of each name (as the one token
    `` Name``), and ``s2``, the subject's last occurrence, the mention the corrupted prompt replaces."""
    ids = list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    out = {}
    for mark, name in (("io", io), ("s1", subject)):
        token = tokenizer(" " + name, add_special_tokens=False)["input_ids"][0]
        if token not in ids:
            raise CircuitkitError(f"ioi: the tokenizer writes {name!r} in {prompt!r} differently from ' {name}'; "
                                  "expected the name's own token in the prompt.")
        out[mark] = ids.index(token)
    out["s2"] = len(ids) - 1 - ids[::-1].index(ids[out["s1"]])
    if out["s2"] == out["s1"]:
        raise CircuitkitError(f"ioi: the tokenizer writes the subject's second mention in {prompt!r} differently "
                              "from its first; expected the same token at both.")
    return out


def greater_than(model: Any, n: int = 32, *, seed: int = 0) -> Task:
    """``n`` greater-than pairs for ``model``'s tokenizer (module docstring); metric ``prob_diff``."""
    n, rng = _check(n, seed, "greater_than")
    tokenizer = _tokenizer(model)
    nouns = ("war", "expedition", "drought", "reign", "famine", "project", "siege", "voyage")
    two_digit = all(_one_token(tokenizer, f"{y:02d}") for y in (10, 32, 57, 99))
    answers = [f"{y:02d}" for y in range(100)] if two_digit else [str(d) for d in range(10)]
    if len(_distinct(tokenizer, answers)) < len(answers):
        kind = "two-digit number" if two_digit else "digit"
        raise CircuitkitError(f"greater_than: this tokenizer does not write every {kind} as a token of its own; "
                              "expected each to be one distinct token (they are the answers)."
                              + _vocabulary_note(tokenizer))
    pairs = []
    for _ in range(n):
        noun = rng.choice(nouns)
        century = rng.choice((11, 12, 13, 14, 15, 16, 17, 18))
        if two_digit:
            yy = rng.randint(2, 97)
            answers = tuple(f"{y:02d}" for y in range(yy + 1, 100))[:16]
            wrongs = tuple(f"{y:02d}" for y in range(max(0, yy - 15), yy + 1))
            start_clean, start_corrupt = f"{century}{yy:02d}", f"{century}01"
        else:
            tens = rng.randint(2, 8)
            yy = tens * 10 + rng.randint(0, 9)
            answers = tuple(str(d) for d in range(tens + 1, 10))
            wrongs = tuple(str(d) for d in range(0, tens))
            start_clean, start_corrupt = f"{century}{yy:02d}", f"{century}0{rng.randint(0, 9)}"
        clean = f"The {noun} lasted from the year {start_clean} to the year {century}"
        corrupted = f"The {noun} lasted from the year {start_corrupt} to the year {century}"
        pairs.append(Pair(clean, corrupted, answers, wrongs))
    return Task("greater-than", tuple(pairs), metric="prob_diff",
                description="a later year than the one given: the probability of later years (or tens digits) "
                            "minus earlier ones; corrupted: the start year at the century's beginning")


def docstring(model: Any, n: int = 32, *, seed: int = 0) -> Task:
    """``n`` docstring pairs for ``model``'s tokenizer (module docstring); metric ``logit_diff``."""
    n, rng = _check(n, seed, "docstring")
    tokenizer = _tokenizer(model)
    args = [a[1:] for a in _distinct(tokenizer, [" " + a for a in ARGUMENTS])]
    if len(args) < 8:
        raise CircuitkitError(f"docstring: this tokenizer writes only {len(args)} of the argument names as one "
                              "token; expected at least 8." + _vocabulary_note(tokenizer))
    pairs = []
    for _ in range(n):
        names = rng.sample(args, 8)
        clean_args, corrupt_args = names[:4], names[4:]
        w1, w2 = rng.sample(WORDS, 2)
        function = rng.choice(("port", "load", "run", "check", "update", "build"))
        body = f'    """{w1}\n\n    :param {clean_args[0]}: {w2}\n    :param {clean_args[1]}: {w1}\n    :param'
        clean = f"def {function}(self, {', '.join(clean_args)}):\n{body}"
        corrupted = f"def {function}(self, {', '.join(corrupt_args)}):\n{body}"
        pairs.append(Pair(clean, corrupted, (" " + clean_args[2],), (" " + clean_args[0], " " + clean_args[1])))
    return Task("docstring", tuple(pairs), metric="logit_diff",
                description="the next argument a docstring documents; corrupted: the signature's names replaced")


def repeated_tokens(model: Any, n: int = 16, *, seed: int = 0, block_len: int | None = None, n_repeats: int = 2,
                    corrupt_seed: int = 1, ablation: str = "clean_mean") -> Task:
    """The induction behaviour as a task (module docstring): ``n`` sequences of :class:`~circuitkit.detect.
    RepeatedTokens` (``block_len``, ``n_repeats``, ``seed``; the model's BOS where its tokenizer has one), each
    paired with its copies redrawn (``corrupt_seed``); metric ``next_token_logprob`` on the repeated copies; the
    clean mean ablation (``ablation``: any of :data:`~circuitkit.graph.task.ABLATIONS`)."""
    from circuitkit.detect.corrupt import resampled_batch
    from circuitkit.detect.tokens import RepeatedTokens

    n, _ = _check(n, seed, "repeated_tokens")
    corrupt_seed = validate.seed("repeated_tokens: corrupt_seed", corrupt_seed)
    batch = RepeatedTokens(block_len=block_len, n_repeats=n_repeats, batch=n, seed=seed).build(model)
    corrupted = resampled_batch(batch, corrupt_seed).tokens.cpu().tolist()
    clean = batch.tokens.cpu().tolist()
    scored = tuple(int(p) for p in batch.repeated_copies.nonzero().flatten())
    first = batch.prefix
    pairs = tuple(Pair(tuple(c), tuple(k), (c[first],), (c[first + 1],)) for c, k in zip(clean, corrupted, strict=True))
    return Task("repeated-tokens", pairs, metric="next_token_logprob", ablation=ablation, scored=(scored,) * n,
                description=f"induction: {batch.n_repeats} copies of a random block of {batch.block_len} tokens; "
                            "corrupted: every copy redrawn; metric: the next token's log-probability on the "
                            "repeated copies")


GENERATORS: dict[str, Callable[..., Task]] = {"ioi": ioi, "greater-than": greater_than, "docstring": docstring,
                                               "repeated-tokens": repeated_tokens}
"""Built-in tasks by name (``induction`` is the induction scan itself; ``repeated-tokens`` the same behaviour as a
task on the task engine)."""
BUILT_IN = ("induction", *GENERATORS)


__all__ = ["BUILT_IN", "GENERATORS", "docstring", "greater_than", "ioi", "repeated_tokens"]
