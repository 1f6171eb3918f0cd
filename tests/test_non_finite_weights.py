"""A model with a NaN or infinite weight is refused before any work, in one line naming the parameter: its
measurements would be NaN, or finite where the bad weight does not reach (attention patterns never read W_V, so
head scores of a model with a NaN W_V used to come back finite and unremarked)."""

from __future__ import annotations

import pytest
import torch

import circuitkit as ck
from circuitkit import zoo
from circuitkit.errors import CircuitkitError

CASES = {"W_K-x-inf": ("k", float("inf")), "W_V-x-nan": ("v", float("nan"))}
ENTRY_POINTS = {
    "scan": lambda m: ck.scan(m),
    "head_scores": lambda m: ck.head_scores(m),
    "find_circuit": lambda m: ck.find_circuit(m),
    "faithfulness": lambda m: ck.faithfulness(m, heads=[(1, 3)]),
    "track": lambda m: ck.track([m], steps=[0], top_k=0),
}


def _bundled_with(channel: str, factor: float) -> tuple[torch.nn.Module, str]:
    model = zoo.load()
    suffix = f"layers.1._original_component.attn._original_component.{channel}._original_component.weight"
    name = next(n for n, _ in model.named_parameters() if n.endswith(suffix))
    with torch.no_grad():
        model.get_parameter(name).mul_(factor)
    return model, name


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
@pytest.mark.parametrize("case", list(CASES))
def test_non_finite_weight_is_refused_naming_the_tensor(case, entry):
    model, name = _bundled_with(*CASES[case])
    with pytest.raises(CircuitkitError) as caught:
        ENTRY_POINTS[entry](model)
    message = str(caught.value)
    assert "\n" not in message
    assert name in message and "finite" in message


def test_finite_model_is_not_refused():
    model = zoo.load()
    assert ck.head_scores(model)["induction"].isfinite().all()
