"""The model's state is the caller's: every public entry point that takes a model runs it in eval mode and leaves
the modes of every module, the hook dictionaries, ``requires_grad``, devices and parameter values as they were.

The entry points are found, not listed: every fuzz-table case (the table covers every public callable of
``circuitkit.__all__`` and the subpackages' ``__all__``, or test_fuzz fails) whose valid call hands over a model.
A public callable with a ``model`` parameter that is not found that way fails the coverage test.
"""

from __future__ import annotations

import inspect

import pytest
import torch

import circuitkit as ck
from circuitkit.models.state import caller_state, module_of, settle, state_of
from tests import fuzz_cases as fc
from tests.test_loading_safety import save_tiny_gpt2


def _is_model(value) -> bool:
    from circuitkit.models import AttentionOnlyModel

    return isinstance(value, AttentionOnlyModel) or module_of(value) is not None


BUNDLED_ONLY = {"circuitkit:find_circuit", "circuitkit:faithfulness"}
"""Entry points whose valid call needs a model where heads matter (the table's random toy model has none, so the
fuzz table does not run them): here they run on the bundled model like every other entry point."""


def _takes_a_model(key: str) -> bool:
    c = fc.CASES[key]
    if not c.run_valid and key not in BUNDLED_ONLY:
        return False
    return any(_is_model(v) for v in c.valid().values())


NOT_RUN = {"circuitkit.models:load_model": "builds the model it returns; no caller's model to keep",
           **{f"circuitkit.tasks:{name}": "reads only the model's tokenizer to write prompts; never runs the model"
              for name in ("ioi", "greater_than", "docstring", "get_task")}}
ENTRY_POINTS = sorted(k for k in fc.CASES if _takes_a_model(k) and k not in NOT_RUN)


def test_every_public_callable_with_a_model_parameter_is_checked():
    public = fc.public_callables()
    with_model = set()
    for key, obj in public.items():
        try:
            parameters = inspect.signature(obj).parameters
        except (TypeError, ValueError):
            continue
        if "model" in parameters and key in fc.CASES:
            with_model.add(key)
    records = {k for k in with_model if k in fc.RECORDS}
    missing = sorted(with_model - set(ENTRY_POINTS) - set(NOT_RUN) - records)
    assert not missing, f"entry points taking a model that the state test does not run: {missing}"
    assert len(ENTRY_POINTS) >= 12


def _instrument(module: torch.nn.Module) -> None:
    """A caller's model as it may come: in train mode, a hook on a hook point and one on the root, one parameter
    frozen. (``settle``: the bridge's own one-time wiring of its capture hooks, which its first forward pass does
    anyway, is part of the model.)"""
    settle(module)
    module.train()
    hook_points = [m for name, m in module.named_modules() if name.rsplit(".", 1)[-1].startswith("hook_")]
    (hook_points[0] if hook_points else module).register_forward_hook(lambda m, i, o: None)
    module.register_forward_pre_hook(lambda m, i: None)
    next(module.parameters()).requires_grad_(False)


def _values(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone() for name, t in [*module.named_parameters(remove_duplicate=False),
                                                      *module.named_buffers(remove_duplicate=False)]}


@pytest.mark.parametrize("key", ENTRY_POINTS, ids=lambda k: k.replace("circuitkit", "ck"))


def test_entry_point_leaves_the_model_state_as_it_was(key):
    c = fc.CASES[key]
    kwargs = c.valid()
    models = {}
    for name, value in kwargs.items():
        if _is_model(value):  # the table's toy model is no torch Module: a fresh bundled TransformerBridge instead
            kwargs[name] = fresh = ck.zoo.load()
            _instrument(fresh)
            models[name] = fresh
    before = {name: (state_of(m), _values(m)) for name, m in models.items()}
    c.call(kwargs)
    for name, m in models.items():
        state, values = before[name]
        after = state_of(m)
        for part in state:
            assert after[part] == state[part], f"{key}: {name}'s {part} changed"
        for tensor_name, value in _values(m).items():
            assert torch.equal(value, values[tensor_name]), f"{key}: {name}.{tensor_name} changed"


def test_state_is_restored_when_the_call_raises():
    model = ck.zoo.load()
    _instrument(model)
    before = state_of(model)
    with pytest.raises(ck.CircuitkitError):
        ck.head_scores(model, ck.RepeatedTokens(block_len=4, batch=2), device="nonsense")
    assert state_of(model) == before


def test_caller_state_restores_hooks_grads_and_modes_changed_inside():
    model = ck.zoo.load()
    _instrument(model)
    before = state_of(model)
    with caller_state(model):
        assert not any(m.training for m in model.modules())
        for m in model.modules():
            m._forward_hooks.clear()
        for p in model.parameters():
            p.requires_grad_(True)
        model.register_forward_hook(lambda m, i, o: None)
    assert state_of(model) == before


@pytest.fixture(scope="module")
def dropout_bridge(tmp_path_factory):
    """A tiny GPT-2 (dropout 0.1 in attention, residual and embeddings) as a TransformerBridge."""
    directory = tmp_path_factory.mktemp("gpt2") / "model"
    save_tiny_gpt2(directory)
    return ck.models.load_model(str(directory))


def test_training_mode_model_is_measured_without_dropout(dropout_bridge):
    """Before: head_scores on a train()-mode model ran with dropout, so two identical calls differed."""
    tokens = ck.RepeatedTokens(block_len=6, batch=4, seed=0)
    dropout_bridge.eval()
    reference = ck.head_scores(dropout_bridge, tokens)
    dropout_bridge.train()
    first = ck.head_scores(dropout_bridge, tokens)
    second = ck.head_scores(dropout_bridge, tokens)
    assert dropout_bridge.training and all(m.training for m in dropout_bridge.modules())
    for name in reference:
        assert torch.equal(first[name], second[name]), name
        assert torch.equal(first[name], reference[name]), name
    loss_train = ck.induction_loss(dropout_bridge, tokens).repeated_copies
    dropout_bridge.eval()
    assert loss_train == ck.induction_loss(dropout_bridge, tokens).repeated_copies


def test_scan_of_a_training_mode_model_runs_without_dropout(dropout_bridge):
    tokens = ck.RepeatedTokens(block_len=6, batch=4, seed=0)
    dropout_bridge.eval()
    reference = ck.scan(dropout_bridge, tokens=tokens, ablate="none", circuit=False).head_scores
    dropout_bridge.train()
    result = ck.scan(dropout_bridge, tokens=tokens, ablate="none", circuit=False).head_scores
    assert dropout_bridge.training
    for name in reference:
        assert torch.equal(result[name], reference[name]), name


def test_model_on_meta_is_refused_before_any_work():
    model = ck.zoo.load().to("meta")
    with pytest.raises(ck.CircuitkitError, match="meta device") as info:
        ck.head_scores(model, ck.RepeatedTokens(block_len=4, batch=2))
    assert "\n" not in str(info.value)
