"""Registered scores and roles are the user's code: it runs inside a guard (an exception becomes one
CircuitkitError naming the score and the original error), its outputs are checked (shape, real dtype, device,
finite), ``targets`` gets a copy of the tokens, and names that would collide with a built-in table column, an
empty registry and blank role names are refused in one line."""

from __future__ import annotations

import contextlib

import pytest
import torch

import circuitkit as ck
from circuitkit import detect, zoo
from circuitkit.detect import registry
from circuitkit.detect.targets import induction_targets
from circuitkit.errors import CircuitkitError

SHAPE = (2, 4)
"""The bundled model's [layer, head]."""


@pytest.fixture(scope="module")
def model():
    return zoo.load()


@contextlib.contextmanager
def registered(definition):
    detect.register(definition)
    try:
        yield definition
    finally:
        detect.unregister(definition.name)


def weight(name, compute, short=None):
    return detect.weight_score(name, short=short or name[:6], description="a test score", compute=compute)


def pattern(name, targets, short=None, reader=None):
    return detect.pattern_score(name, short=short or name[:6], description="a test score", targets=targets,
                                reader=reader)


def _one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


def test_weight_score_that_raises_is_labelled(model):
    def divide(weights):
        return torch.ones(SHAPE) * (1 / 0)

    with registered(weight("ratio", divide)), pytest.raises(CircuitkitError) as caught:
        ck.head_scores(model)
    message = _one_line(caught)
    assert "score 'ratio'" in message and "ZeroDivisionError" in message and "division by zero" in message


@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_non_finite_weight_score_is_refused_not_saved_as_null(model, bad):
    def compute(weights):
        out = torch.zeros(*SHAPE)
        out[1, 2] = bad
        return out

    with registered(weight("broken", compute)), pytest.raises(CircuitkitError) as caught:
        ck.scan(model, circuit=False, ablate="none")
    assert "score 'broken'" in _one_line(caught) and "NaN or infinite" in str(caught.value)


def test_tensor_division_by_zero_is_refused(model):
    def compute(weights):
        return torch.ones(*SHAPE) / torch.zeros(*SHAPE)

    with registered(weight("overflow", compute)), pytest.raises(CircuitkitError, match="score 'overflow'"):
        ck.head_scores(model)


def test_complex_weight_score_is_refused(model):
    def compute(weights):
        return torch.ones(*SHAPE, dtype=torch.complex64)

    with registered(weight("cplx", compute)), pytest.raises(CircuitkitError) as caught:
        ck.head_scores(model)
    assert "score 'cplx'" in _one_line(caught) and "real tensor" in str(caught.value)


def test_weight_score_of_the_wrong_shape_is_refused(model):
    with registered(weight("flat", lambda w: torch.zeros(3))), pytest.raises(CircuitkitError, match="score 'flat'"):
        ck.head_scores(model)


def test_targets_that_raise_are_labelled(model):
    def targets(tokens):
        raise KeyError("no such token")

    with registered(pattern("picky", targets)), pytest.raises(CircuitkitError) as caught:
        ck.head_scores(model)
    message = _one_line(caught)
    assert "score 'picky'" in message and "KeyError" in message and "no such token" in message


def test_targets_on_the_meta_device_are_refused(model):
    def targets(tokens):
        return induction_targets(tokens).to("meta")

    with registered(pattern("ghost", targets)), pytest.raises(CircuitkitError) as caught:
        ck.head_scores(model)
    assert "score 'ghost'" in _one_line(caught) and "meta" in str(caught.value)


def test_targets_receive_a_copy_of_the_tokens(model):
    before = ck.head_scores(model)

    def vandal(tokens):
        mask = induction_targets(tokens)
        tokens.zero_()  # writes into what it was given
        return mask

    with registered(pattern("vandal", vandal)):
        after = ck.head_scores(model)
    torch.testing.assert_close(after["induction"], before["induction"], rtol=0, atol=0)
    torch.testing.assert_close(after["vandal"], before["induction"], rtol=0, atol=0)


def test_reader_of_the_wrong_shape_is_refused(model):
    definition = pattern("diag", induction_targets, reader=lambda p: p.diagonal(dim1=-2, dim2=-1))  # pos, not pos-1
    with registered(definition), pytest.raises(CircuitkitError) as caught:
        ck.head_scores(model)
    assert "score 'diag'" in _one_line(caught) and "reader" in str(caught.value)


def test_reader_that_raises_is_labelled(model):
    def reader(patterns):
        raise IndexError("bad slice")

    with registered(pattern("slicer", induction_targets, reader=reader)), pytest.raises(CircuitkitError) as caught:
        ck.head_scores(model)
    assert "score 'slicer'" in _one_line(caught) and "IndexError" in str(caught.value)


@pytest.mark.parametrize("field", ["short", "name"])
@pytest.mark.parametrize("column", ["attrib", "ablated", "head", "Rank", "attribution"])
def test_names_of_built_in_columns_are_refused_at_registration(field, column):
    names = {"name": "mine", "short": "mine"} | {field: column}
    definition = detect.weight_score(names["name"], short=names["short"], description="x",
                                     compute=lambda w: None)
    with pytest.raises(CircuitkitError) as caught:
        detect.register(definition)
    assert "built-in table column" in _one_line(caught)
    assert names["name"] not in registry.score_names()


def test_empty_registry_is_refused_clearly(model):
    saved = [detect.unregister(name) for name in list(registry.score_names())]
    try:
        for call in (lambda: ck.head_scores(model), lambda: ck.scan(model)):
            with pytest.raises(CircuitkitError) as caught:
                call()
            assert "empty score registry" in _one_line(caught)
    finally:
        for definition in saved:
            detect.register(definition)
    assert registry.score_names() == tuple(d.name for d in saved)


@pytest.mark.parametrize("name", [" ", "\t", "\n "], ids=["space", "tab", "newline"])
def test_whitespace_role_name_is_refused(model, name):
    with pytest.raises(CircuitkitError) as caught:
        ck.scan(model, roles=[(name, "induction")])
    assert "role name" in _one_line(caught)
