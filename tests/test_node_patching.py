"""The one node-patching pass (``detect/node_patching.py``) every engine runs: exact single-head ablation, the
induction circuit's head sets (``Ablator``), the held-out batch, the task runner's node sets.

Oracles: each stacked copy against its own unstacked run with the same units overwritten one by one in a plain
hook; the induction engine's ``Ablator`` against the task engine's ``TaskRunner`` given the same values (the same
head sets, the loss on the copies is minus the task's metric); and a recorder that sees both engines' passes go
through ``patched_logits``; a pass resumed at a layer against the whole pass.
"""

from __future__ import annotations

import pytest
import torch

import circuitkit.detect.node_patching as node_patching
from circuitkit import CircuitkitError, zoo
from circuitkit.circuits.faithfulness import Ablator
from circuitkit.detect.node_patching import Patch, in_passes, patched_logits, unit_mean
from circuitkit.detect.tokens import RepeatedTokens
from circuitkit.graph.runner import TaskRunner
from circuitkit.models.adapters import HOOKS, adapt
from circuitkit.tasks import repeated_tokens


@pytest.fixture(scope="module")
def tiny():
    model = zoo.load()  # the bundled two-layer model: four heads a layer
    adapter = adapt(model)
    batch = RepeatedTokens(batch=3, block_len=6, seed=2).build(model)
    return model, adapter, batch


def _overwritten(adapter, tokens, layer_units: dict[int, tuple[list[int], torch.Tensor]]):
    """One plain run with, at each layer's z, the listed heads overwritten by ``value`` one head at a time."""
    def hook(z, hook):
        heads, value = layer_units[HOOKS.layer_of(hook.name)]
        z = z.clone()
        full = value.expand(z.shape[0], z.shape[1], *value.shape[-2:]) if value.dim() == 2 else value
        for h in heads:
            z[:, :, h] = full[:, :, h]
        return z

    with torch.no_grad():
        return adapter.run(tokens, [(HOOKS.z(layer), hook) for layer in layer_units])


def test_each_stacked_copy_is_its_own_run_with_its_units_replaced(tiny):
    _, adapter, batch = tiny
    spec = adapter.spec
    B, P = batch.tokens.shape
    g = torch.Generator().manual_seed(0)
    per_unit = torch.randn(spec.n_heads, spec.d_head, generator=g)  # a mean: one value per head
    per_position = torch.randn(B, P, spec.n_heads, spec.d_head, generator=g)  # a corrupted run
    masks = torch.rand(4, spec.n_layers, spec.n_heads, generator=g) < 0.5
    masks[0] = False  # a copy that patches nothing: the plain run
    patches = [Patch(HOOKS.z(0), masks[:, 0], per_unit), Patch(HOOKS.z(1), masks[:, 1], per_position)]
    stacked = patched_logits(adapter, batch.tokens, 4, patches).view(4, B, P, -1)
    for s in range(4):
        heads = {layer: ([h for h in range(spec.n_heads) if masks[s, layer, h]], value)
                 for layer, value in ((0, per_unit), (1, per_position))}
        torch.testing.assert_close(stacked[s], _overwritten(adapter, batch.tokens, heads), atol=1e-5, rtol=0)
    with torch.no_grad():
        plain = adapter.run(batch.tokens)
    torch.testing.assert_close(stacked[0], plain, atol=1e-5, rtol=0)
    assert not torch.allclose(stacked[1], plain, atol=1e-3)


def test_in_passes_covers_every_set_once_in_order():
    for sets, per in ((7, 3), (6, 3), (1, 5), (5, 1)):
        parts = in_passes(sets, per, lambda part, n=sets: list(range(n))[part])
        assert [x for p in parts for x in p] == list(range(sets)) and all(len(p) <= per for p in parts)


def test_both_engines_patch_node_sets_through_the_one_pass_and_agree(tiny, monkeypatch):
    model, adapter, _ = tiny
    task = repeated_tokens(model, 3, seed=2, block_len=6)
    runner = TaskRunner(adapter, task.tokenize(adapter), task.metric, mlps=False, ablation=task.ablation)
    batch = RepeatedTokens(batch=3, block_len=6, seed=2).build(model)
    assert torch.equal(runner.batch.clean, batch.tokens)
    values = runner.values_of("head")  # the clean mean, [pair, pos, head, d_head] by layer
    calls: list[int] = []
    real = node_patching.patched_logits

    def recorded(adapter_, tokens, copies, patches, **kwargs):
        calls.append(copies)
        return real(adapter_, tokens, copies, patches, **kwargs)

    monkeypatch.setattr(node_patching, "patched_logits", recorded)
    spec = adapter.spec
    masks = torch.zeros(4, spec.n_layers, spec.n_heads, dtype=torch.bool)
    masks[1] = True
    masks[2, 0, 1] = masks[2, 1, 0] = True
    masks[3, 1] = True
    ablator = Ablator(adapter, batch, values)
    losses = torch.tensor(ablator.losses(masks))
    assert calls and sum(calls) == 4 == ablator.passes
    calls.clear()
    before = runner.passes  # the clean reference run, already spent on the values
    metric = runner.node_metric(masks, None)
    # the same copies; the set patching nothing and the one from layer 1 resume at layer 1 of 2 (half a pass each)
    assert calls and sum(calls) == 4 and runner.passes - before == 2 + 2 * 0.5
    torch.testing.assert_close(losses.double(), -metric.double(), atol=1e-5, rtol=0)
    assert float(losses[1] - losses[0]) > 0.5  # every head patched: the copies are no longer predicted


def test_the_node_ablation_mean_is_the_mean_over_real_positions_in_a_loop():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 5, 4, 2, generator=g)
    real = torch.ones(3, 5, dtype=torch.bool)
    real[0, 3:] = real[2, 4:] = False  # two padded pairs
    total, count = torch.zeros(4, 2, dtype=torch.float64), 0
    for b in range(3):
        for p in range(5):
            if real[b, p]:
                total += x[b, p].double()
                count += 1
    torch.testing.assert_close(unit_mean(x, real).double(), total / count, atol=1e-6, rtol=0)
    x[~real] = 1e6  # what a padded position holds changes nothing
    torch.testing.assert_close(unit_mean(x, real).double(), total / count, atol=1e-6, rtol=0)
    dense = x[:, :3].double().mean(dim=(0, 1))
    torch.testing.assert_close(unit_mean(x[:, :3]).double(), dense, atol=1e-6, rtol=0)
    assert unit_mean(x.bfloat16(), real).dtype == torch.bfloat16


def test_both_engines_mean_ablate_to_the_same_values(tiny):
    # the induction scan's mean ablation (the clean run's z averaged over sequences and positions, taken in the
    # pass) and a task's clean mean over its real positions are one definition, unit_mean
    from circuitkit.circuits.faithfulness import ablation_values

    model, adapter, batch = tiny
    task = repeated_tokens(model, 3, seed=2, block_len=6)
    runner = TaskRunner(adapter, task.tokenize(adapter), task.metric, mlps=False, ablation="clean_mean")
    assert torch.equal(runner.batch.clean, batch.tokens) and bool(runner.batch.real.all())
    induction, passes = ablation_values(adapter, batch, "mean")
    assert passes == 1
    task_values = runner.values_of("head")
    for layer in range(adapter.spec.n_layers):
        assert induction[layer].shape == (adapter.spec.n_heads, adapter.spec.d_head)
        for b in range(3):
            for p in range(batch.tokens.shape[1]):
                torch.testing.assert_close(task_values[layer][b, p], induction[layer], atol=1e-6, rtol=1e-6)
    assert not torch.allclose(induction[0], induction[1])


def test_a_value_read_from_the_pass_itself_is_the_value_given(tiny):
    """The held-out batch's means come from the pass's own unpatched copy 0: the same logits as those means given."""
    _, adapter, batch = tiny
    L, H = adapter.spec.n_layers, adapter.spec.n_heads
    masks = torch.ones(3, L, H, dtype=torch.bool)
    masks[0] = False
    masks[2, 0] = False
    seen: dict[int, torch.Tensor] = {}

    def from_copy_0(layer):
        def value(view):
            seen[layer] = view[0].mean(dim=(0, 1))
            return seen[layer]
        return value

    live = patched_logits(adapter, batch.tokens, 3, [Patch(HOOKS.z(layer), masks[:, layer], from_copy_0(layer))
                                                     for layer in range(L)])
    given = patched_logits(adapter, batch.tokens, 3, [Patch(HOOKS.z(layer), masks[:, layer], seen[layer])
                                                      for layer in range(L)])
    assert torch.equal(live, given) and set(seen) == set(range(L))
    with torch.no_grad():
        clean_z = {}
        adapter.run(batch.tokens, [(HOOKS.z(layer), lambda z, hook: clean_z.__setitem__(HOOKS.layer_of(hook.name),
                                                                                        z.mean(dim=(0, 1))))
                                   for layer in range(L)])
    for layer in range(L):
        torch.testing.assert_close(seen[layer], clean_z[layer], atol=1e-5, rtol=0)


def test_a_pass_resumed_at_a_layer_equals_the_whole_pass(tiny):
    _, adapter, batch = tiny
    assert adapter.can_resume
    H = adapter.spec.n_heads
    kept = {}
    with torch.no_grad():
        adapter.run(batch.tokens, [(HOOKS.resid_pre(1), lambda x, hook: kept.__setitem__(1, x.clone()))])
    one_each = torch.eye(H, dtype=torch.bool)
    value = torch.zeros(H, adapter.spec.d_head)
    patches = [Patch(HOOKS.z(1), one_each, value)]
    whole = patched_logits(adapter, batch.tokens, H, patches)
    resumed = patched_logits(adapter, batch.tokens, H, patches, resume=(kept[1], 1))
    torch.testing.assert_close(resumed, whole, atol=1e-5, rtol=0)


def test_a_mask_of_the_wrong_width_is_refused_naming_the_hook(tiny):
    _, adapter, batch = tiny
    wrong = Patch(HOOKS.z(0), torch.ones(2, adapter.spec.n_heads + 1, dtype=torch.bool),
                  torch.zeros(adapter.spec.n_heads + 1, adapter.spec.d_head))
    with pytest.raises(CircuitkitError, match=r"has shape \(6, 13, 4, 16\); expected \[6, pos, 5, ...\]"):
        patched_logits(adapter, batch.tokens, 2, [wrong])
