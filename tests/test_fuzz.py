"""Fuzz test: every public callable, thrown bad inputs of every kind, lets only ``CircuitkitError`` escape.

The table is :mod:`tests.fuzz_cases` (valid calls, argument kinds, bad-value generators). Here:

- coverage: every public callable (from the packages' ``__all__``, plus named methods) has a table entry, so a
  new public function is fuzzed or this test fails;
- each valid call returns a finite result (the bad value is then the only thing wrong in a bad call);
- each (callable, argument, bad value): a strict bad value must raise ``CircuitkitError``; a lenient one
  (huge finite weights, numpy, half precision) must raise ``CircuitkitError`` or return a finite result. Any
  other exception, a silent acceptance, or a NaN/inf in a result fails. Weight-spectrum calls on huge/tiny
  weights (the LAPACK routines that crashed the interpreter) run in one child process, so a segfault is a
  reported failure rather than a dead test session;
- a hypothesis part throws several bad arguments at once, and numbers drawn from the whole bad range;
- valid edge cases (1 layer, 1 head, d_head = d_model, half precision, non-contiguous, numpy where documented)
  return finite, right-shaped results;
- the last test prints the counts (bad inputs per callable and in total; run with ``-s`` to see them).
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import warnings
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import circuitkit as ck
from circuitkit import CircuitkitError
from tests import fuzz_cases as fc
from tests.conftest import random_weights

ROOT = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------------------------------------------- the plan

VALID_HERE: set[tuple[str, str, str]] = {
    (key, arg, label) for key, args in fc.VALID_HERE.items() for arg, labels in args.items() for label in labels
}
"""Generated values that are valid for that callable (reasons in ``fuzz_cases.VALID_HERE``): not thrown."""
BAD = [
    (key, arg, label, make, strict)
    for key, c in fc.CASES.items()
    for arg, label, make, strict in c.bad_values()
    if (key, arg, label) not in VALID_HERE
]
LAPACK_KEYS = {
    "circuitkit:singular_values", "circuitkit:numerical_rank", "circuitkit:effective_rank",
    "circuitkit:frobenius_norm", "circuitkit:ov_eigenvalues", "circuitkit:composition_scores",
    "circuitkit:composition_baseline", "circuitkit:copying_scores", "circuitkit:head_scores",
    "circuitkit.viz:singular_value_spectra", "circuitkit:scan",
}
"""Callables that reach eigenvalue/SVD routines: their huge/tiny-weight inputs run in a child process."""


def _in_child(key: str, label: str) -> bool:
    return key in LAPACK_KEYS and label.startswith(("huge", "tiny"))


def _id(key: str, arg: str, label: str) -> str:
    return f"{key.replace('circuitkit', 'ck')}({arg}={label})"


COUNTS: Counter[str] = Counter()
OUTCOMES: Counter[str] = Counter()


CALL_LIMIT_S = 5
"""A bad input must be refused quickly: a call still running after this long (e.g. a loop over 2**70 samples)
is a failure. The slowest valid call here takes about a second."""


MAX_MESSAGE = 1000
"""A message names the call, summarises what was given (type, shape, dtype) and says what was expected: one line,
well under this length. More means a repr of the value was pasted in."""


class _Hung(Exception):
    pass


def _alarm(signum, frame):
    raise _Hung


def outcome(key: str, arg: str, label: str, make, strict: bool) -> str:
    """Call ``key`` with ``arg`` replaced by the bad value; return "raised" or "finite", or a failure text."""
    c = fc.CASES[key]
    kwargs = c.valid_for(arg)
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CALL_LIMIT_S)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            kwargs[arg] = make(kwargs.get(arg))
            result = c.call(kwargs)
    except CircuitkitError as error:
        if "\n" in str(error) or len(str(error)) > MAX_MESSAGE:  # a multi-line repr (numpy, tensor) slipped in
            return f"CircuitkitError of {len(str(error))} characters over several lines: {str(error)[:300]!r}"
        return "raised"
    except _Hung:
        return f"still running after {CALL_LIMIT_S} s"
    except Exception as error:  # noqa: BLE001 - the point is to see every other exception
        return f"{type(error).__name__}: {str(error)[:300]}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    if strict:
        return f"accepted silently (returned {type(result).__name__})"
    bad = fc.non_finite(result)
    if bad is not None and any("NaN" in str(w.message) for w in caught):
        return "finite"  # the model itself produced NaN (e.g. overflowing weights): documented to warn, rank last
    return "finite" if bad is None else f"non-finite result at {bad}"


# ---------------------------------------------------------------------------------------------------- coverage


def test_every_public_callable_has_a_fuzz_entry():
    public = fc.public_callables()
    covered = set(fc.CASES) | set(fc.RECORDS)
    aliases: dict[int, list[str]] = {}
    for key, obj in public.items():
        aliases.setdefault(id(obj), []).append(key)
    missing = sorted(keys[0] for keys in aliases.values() if not covered & set(keys))
    assert not missing, f"public callables with no fuzz entry: {missing}"
    assert not sorted(covered - set(public)), f"fuzz entries for names that are not public: {covered - set(public)}"
    assert not set(fc.CASES) & set(fc.RECORDS)


def test_every_case_argument_is_a_parameter():
    """A table typo (an argument the callable does not take) would make its bad values pass for the wrong reason."""
    import inspect

    for key, c in fc.CASES.items():
        params = inspect.signature(c.function()).parameters
        takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
        for arg in [*c.kinds, *c.extra_bad, *c.context]:
            assert arg in params or takes_kwargs, f"{key}: no parameter {arg!r}"


@pytest.mark.parametrize("key", [k for k, c in fc.CASES.items() if c.run_valid], ids=lambda k: k.replace(
    "circuitkit", "ck"))
def test_valid_call_returns_finite(key):
    c = fc.CASES[key]
    result = c.call(c.valid())
    assert fc.non_finite(result) is None, f"{key}: valid call returned a non-finite {fc.non_finite(result)}"


CONTEXTS = [(k, a) for k, c in fc.CASES.items() for a in c.context]


@pytest.mark.parametrize(("key", "arg"), CONTEXTS, ids=[f"{k.replace('circuitkit', 'ck')}({a})" for k, a in CONTEXTS])
def test_valid_call_in_each_context_returns_finite(key, arg):
    """The valid call a context makes (e.g. ``scan`` with a task) is valid too: the bad values thrown in it are
    then the only thing wrong."""
    c = fc.CASES[key]
    result = c.call(c.valid_for(arg))
    assert fc.non_finite(result) is None, f"{key} ({arg} context): non-finite {fc.non_finite(result)}"


# ---------------------------------------------------------------------------------------------------- bad inputs


@pytest.fixture(scope="module")
def child_outcomes():
    """Outcomes of the LAPACK-sensitive bad inputs, computed in one child process (a crash is an outcome)."""
    wanted = [(k, a, lab) for k, a, lab, _, _ in BAD if _in_child(k, lab)]
    proc = subprocess.run(
        [sys.executable, "-c", "import sys, json; from tests.test_fuzz import _child_main; _child_main()"],
        input=json.dumps(wanted), capture_output=True, text=True, cwd=ROOT, timeout=300,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    got = {(r["key"], r["arg"], r["label"]): r["outcome"] for r in map(json.loads, lines)}
    crash = f"child process died (return code {proc.returncode}): {proc.stderr[-500:]}"
    return {w: got.get(w, crash) for w in wanted}


def _child_main() -> None:
    wanted = json.loads(sys.stdin.read())
    table = {(k, a, lab): (make, strict) for k, a, lab, make, strict in BAD}
    for key, arg, label in wanted:
        make, strict = table[(key, arg, label)]
        print(json.dumps({"key": key, "arg": arg, "label": label,
                          "outcome": outcome(key, arg, label, make, strict)}), flush=True)


@pytest.mark.parametrize(
    ("key", "arg", "label", "make", "strict"),
    [pytest.param(*row, id=_id(*row[:3])) for row in BAD],
)
def test_bad_input_raises_circuitkit_error(key, arg, label, make, strict, request):
    if _in_child(key, label):
        result = request.getfixturevalue("child_outcomes")[(key, arg, label)]
    else:
        result = outcome(key, arg, label, make, strict)
    assert result in ("raised", "finite"), f"{key}({arg}={label}): {result}"
    COUNTS[key] += 1
    OUTCOMES[result] += 1


# ---------------------------------------------------------------------------------------------------- hypothesis


def _strict_bad(key: str) -> dict[str, list]:
    by_arg: dict[str, list] = {}
    for arg, label, make, strict in fc.CASES[key].bad_values():
        if strict and (key, arg, label) not in VALID_HERE:
            by_arg.setdefault(arg, []).append((label, make))
    return by_arg


MULTI_KEYS = sorted(k for k in fc.CASES if len(_strict_bad(k)) >= 2)


@settings(max_examples=120, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_several_bad_arguments_at_once(data):
    """Two or more strict bad arguments in one call still give one ``CircuitkitError``."""
    key = data.draw(st.sampled_from(MULTI_KEYS), label="callable")
    by_arg = _strict_bad(key)
    args = data.draw(st.lists(st.sampled_from(sorted(by_arg)), min_size=2, max_size=3, unique=True), label="args")
    c = fc.CASES[key]
    kwargs = c.valid_for(*args)
    for arg in args:
        label, make = data.draw(st.sampled_from(by_arg[arg]), label=arg)
        kwargs[arg] = make(kwargs.get(arg))
    with pytest.raises(CircuitkitError):
        c.call(kwargs)
    COUNTS["hypothesis: several at once"] += 1


BAD_INT = st.one_of(
    st.integers(max_value=0),
    st.integers(min_value=2**64),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=3),
    st.binary(max_size=3),
    st.none(),
    st.booleans(),
    st.lists(st.integers(), max_size=2),
    st.builds(np.float64, st.floats(0.5, 10.0)),
)
BAD_REAL = st.one_of(
    st.sampled_from([math.nan, -math.inf, math.inf, np.float32("nan")]),
    st.text(max_size=3),
    st.none(),
    st.booleans(),
    st.complex_numbers(min_magnitude=1e-3, allow_nan=False),
)
INT_ARGS = [(k, a) for k, c in fc.CASES.items() for a, kind in c.kinds.items() if kind.rstrip("?") in
            ("int>=1", "size>=1", "size>=2", "seed") and a not in fc.VALID_HERE.get(k, {})]
REAL_ARGS = [(k, a) for k, c in fc.CASES.items() for a, kind in c.kinds.items() if kind.rstrip("?") in
             ("real", "real>0", "real>=0") and a not in fc.VALID_HERE.get(k, {})]


@settings(max_examples=150, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(target=st.sampled_from(INT_ARGS), value=BAD_INT)
def test_positive_int_arguments_refuse_the_whole_bad_range(target, value):
    key, arg = target
    if isinstance(value, int) and not isinstance(value, bool) and value >= 2**64 \
            and not fc.CASES[key].kinds[arg].startswith(("size", "seed")):
        return  # a huge count is legal where nothing is allocated
    if value is None and fc.CASES[key].kinds[arg].endswith("?"):
        return
    if value == 0 and type(value) is int and fc.CASES[key].kinds[arg].startswith("seed"):
        return  # seeds start at 0: the one value of the bad range that is a valid seed
    c = fc.CASES[key]
    kwargs = {**c.valid(), arg: value}
    with pytest.raises(CircuitkitError):
        c.call(kwargs)
    COUNTS["hypothesis: ints"] += 1


@settings(max_examples=100, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(target=st.sampled_from(REAL_ARGS), value=BAD_REAL)
def test_real_arguments_refuse_non_finite_and_non_numbers(target, value):
    key, arg = target
    if value is None and fc.CASES[key].kinds[arg].endswith("?"):
        return
    c = fc.CASES[key]
    with pytest.raises(CircuitkitError):
        c.call({**c.valid(), arg: value})
    COUNTS["hypothesis: reals"] += 1


# ---------------------------------------------------------------------------------------------------- valid edges

EDGE_SHAPES = {  # name -> (n_layers, n_heads, d_model, d_head)
    "1-layer": (1, 2, 8, 4),
    "1-head": (2, 1, 8, 4),
    "d_head=d_model": (2, 2, 4, 4),
}


def _edge_weights(name: str):
    if name == "half":
        return random_weights(2, 2, 8, 4, d_vocab=fc.D_VOCAB, dtype=torch.float16)
    if name == "non-contiguous":
        w = random_weights(2, 2, 8, 4, d_vocab=fc.D_VOCAB)
        strided = {n: getattr(w, n).transpose(-1, -2).contiguous().transpose(-1, -2) for n in ("W_Q", "W_K",
                   "W_V", "W_O")}
        assert not strided["W_Q"].is_contiguous()
        return ck.HeadWeights(**strided, W_E=w.W_E, W_U=w.W_U)
    n_layers, n_heads, d_model, d_head = EDGE_SHAPES[name]
    return random_weights(n_layers, n_heads, d_model, d_head, d_vocab=fc.D_VOCAB)


EDGES = [*EDGE_SHAPES, "half", "non-contiguous"]


@pytest.mark.parametrize("edge", EDGES)
def test_valid_edge_cases_return_finite_right_shaped_results(edge):
    w = _edge_weights(edge)
    L, H, dh = w.n_layers, w.n_heads, w.d_head
    assert w.dtype in (torch.float32, torch.float64)
    results = {
        "singular_values": (ck.singular_values(w, "QK"), (L, H, dh)),
        "numerical_rank": (ck.numerical_rank(w, "OV"), (L, H)),
        "effective_rank": (ck.effective_rank(w), (L, H)),
        "frobenius_norm": (ck.frobenius_norm(w, "QK"), (L, H)),
        "ov_eigenvalues": (ck.ov_eigenvalues(w, full=True), (L, H, dh)),
        "copying_scores": (ck.copying_scores(w), (L, H)),
        "composition_scores": (ck.composition_scores(w, "K"), (L, H, L, H)),
    }
    model = fc.toy_from(replace(w, W_pos=torch.randn(fc.N_CTX, w.d_model, generator=torch.Generator()
                                                     .manual_seed(0)).to(w.dtype)))
    tokens = fc.spec()
    scores = ck.head_scores(model, tokens)
    results["head_scores.induction"] = (scores["induction"], (L, H))
    results["ablation_effects"] = (ck.ablation_effects(model, tokens).effect, (L, H))
    results["attribution_effects"] = (ck.attribution_effects(model, tokens).effect, (L, H))
    loss = ck.induction_loss(model, tokens)
    results["induction_loss"] = (loss.per_position, (tokens.n_repeats * tokens.block_len - 1,))
    for name, (value, shape) in results.items():
        assert tuple(value.shape) == shape, f"{edge}: {name} has shape {tuple(value.shape)}, expected {shape}"
        assert fc.non_finite(value) is None, f"{edge}: {name} is not finite"
    assert math.isfinite(loss.repeated_copies) and math.isfinite(loss.first_copy)


def test_numpy_inputs_where_documented():
    """``HeadWeights.from_tensors`` and the ``*_numpy`` theory functions take numpy arrays."""
    w = random_weights(1, 1, 4, 4)
    from_numpy = ck.HeadWeights.from_tensors({k: v.numpy() for k, v in w.tensors().items()})
    assert torch.equal(from_numpy.W_Q, w.W_Q)
    g = np.random.default_rng(0)
    q, k, v = (g.standard_normal((3, 5, 4)) for _ in range(3))
    out = ck.theory.sdpa_numpy(q, k, v, causal=True)
    pattern = ck.theory.pattern_numpy(q, k, causal=True)
    assert out.shape == (3, 5, 4) and pattern.shape == (3, 5, 5)
    assert np.isfinite(out).all() and np.allclose(pattern.sum(-1), 1.0)


# ---------------------------------------------------------------------------------------------------- summary


def test_zz_print_counts():
    """Runs last (file order): the counts of bad inputs thrown, per callable and in total."""
    if not COUNTS:
        return  # a -k selection ran no bad-input test: nothing to count
    table = sorted((k, n) for k, n in COUNTS.items() if not k.startswith("hypothesis"))
    width = max(len(k) for k, _ in table)
    lines = [f"{k:<{width}}  {n:4d}" for k, n in table]
    total = sum(n for _, n in table)
    hyp = sum(n for k, n in COUNTS.items() if k.startswith("hypothesis"))
    lines.append(f"table-driven bad inputs: {total} over {len(table)} callables "
                 f"({OUTCOMES['raised']} CircuitkitError, {OUTCOMES['finite']} lenient inputs with finite results)")
    lines.append(f"hypothesis-driven bad calls: {hyp} (all CircuitkitError)")
    lines.append(f"callables in the table: {len(fc.CASES)} fuzzed + {len(fc.RECORDS)} result records; "
                 f"generated values valid for their callable, not thrown: {len(VALID_HERE)}")
    print("\n" + "\n".join(lines))
