"""The one reference pass (``detect/reference.py``): what it keeps equals TransformerLens's own cache of the same
run (``run_with_cache``), bit for bit; a slice of a stacked pass keeps that copy; a pass stopped early has run
nothing after its last activation; the caller's hooks see the pass after the reads."""

from __future__ import annotations

import pytest
import torch

from circuitkit.detect.reference import Keep, reads, reference_pass
from circuitkit.models.adapters import HOOKS, StopForward, adapt
from tests.conftest import boot_bridge

L = 3


def _model(kv):
    return boot_bridge(attn_only=False, n_layers=L, n_key_value_heads=kv, seed=1)


def _tokens(batch=3, pos=11):
    return torch.randint(0, 50, (batch, pos), generator=torch.Generator().manual_seed(0))


EVERYTHING = Keep(input=True, z=range(L), z_mean=(0, 2), resid=range(L + 1), mlp=(0, 2), patterns=(1,),
                  nodes=(("post", HOOKS.mlp_post),))


@pytest.mark.parametrize("kv", [None, 2], ids=["mha", "gqa"])
def test_what_a_pass_keeps_is_transformer_lens_cache(kv):
    model = _model(kv)
    tokens = _tokens()
    with torch.no_grad():
        logits, kept = reference_pass(adapt(model), tokens, EVERYTHING)
        want_logits, cache = model.run_with_cache(tokens)
    assert torch.equal(logits, want_logits)
    assert torch.equal(kept.input, cache[HOOKS.resid_pre(0)])
    assert sorted(kept.z) == list(range(L)) and sorted(kept.resid) == list(range(L + 1))
    for layer in range(L):
        assert torch.equal(kept.z[layer], cache[HOOKS.z(layer)])
        assert torch.equal(kept.resid[layer], cache[HOOKS.resid_pre(layer)])
        assert torch.equal(kept.nodes["post"][layer], cache[HOOKS.mlp_post(layer)])
    assert torch.equal(kept.resid[L], cache[HOOKS.resid_post(L - 1)])  # what the final norm reads
    assert sorted(kept.mlp) == [0, 2] and all(torch.equal(kept.mlp[i], cache[HOOKS.mlp_out(i)]) for i in (0, 2))
    assert list(kept.patterns) == [1] and torch.equal(kept.patterns[1], cache[HOOKS.pattern(1)])
    for layer in (0, 2):
        assert torch.allclose(kept.z_mean[layer], cache[HOOKS.z(layer)].mean(dim=(0, 1)), rtol=0, atol=1e-7)
        assert kept.z_mean[layer].shape == (4, 8)


def test_a_slice_of_a_stacked_pass_keeps_that_copy_and_not_the_pass():
    model = _model(2)
    adapter = adapt(model)
    tokens = _tokens()
    stacked = torch.cat([_tokens(3, 11).flip(0), tokens])  # copy 1 of the stacked pass is ``tokens``
    hooks, kept = reads(Keep(z=range(L), mlp=range(L), nodes=(("post", HOOKS.mlp_post),)), L, rows=slice(3, 6))
    with torch.no_grad():
        adapter.run(stacked, hooks)
        _, cache = model.run_with_cache(tokens)
    for layer in range(L):
        assert torch.equal(kept.z[layer], cache[HOOKS.z(layer)])
        assert torch.equal(kept.mlp[layer], cache[HOOKS.mlp_out(layer)])
        assert torch.equal(kept.nodes["post"][layer], cache[HOOKS.mlp_post(layer)])
        assert kept.z[layer].untyped_storage().nbytes() == kept.z[layer].nbytes  # a copy: the pass is not held


def test_a_pass_stopped_at_its_last_activation_runs_nothing_after_it():
    model = _model(None)
    adapter = adapt(model)
    seen: list[str] = []
    later = [(HOOKS.z(2), lambda x, hook: seen.append("z2")), (HOOKS.resid_pre(2), lambda x, hook: seen.append("r2"))]
    with torch.no_grad():
        logits, kept = reference_pass(adapter, _tokens(), Keep(z=(0, 1)), hooks=later, stop_after=HOOKS.z(1))
    assert logits is None and sorted(kept.z) == [0, 1] and seen == []
    with torch.no_grad():
        logits, _ = reference_pass(adapter, _tokens(), Keep(z=(0, 1)), hooks=later)
    assert logits.shape == (3, 11, 50) and seen == ["r2", "z2"]


def test_the_callers_hooks_run_after_the_reads_and_clone_copies():
    """The task runner's final hook makes the last block's output a leaf: the read before it keeps the model's own
    tensor. ``clone`` keeps a copy a later in-place change cannot reach."""
    model = _model(None)
    adapter = adapt(model)
    order: list[str] = []

    def replace(x, hook):
        order.append("caller")
        return x * 0

    hooks, kept = reads(Keep(resid=(L,)), L)
    wrapped = [(name, lambda x, hook, fn=fn: (order.append("read"), fn(x, hook))[1]) for name, fn in hooks]
    with torch.no_grad():
        adapter.run(_tokens(), wrapped + [(HOOKS.resid_post(L - 1), replace)])
        _, cache = model.run_with_cache(_tokens())
    assert order == ["read", "caller"] and torch.equal(kept.resid[L], cache[HOOKS.resid_post(L - 1)])
    as_is, viewed = reads(Keep(resid=(1,)), L)
    copied, cloned = reads(Keep(resid=(1,)), L, clone=True)
    with torch.no_grad():
        adapter.run(_tokens(), as_is + copied)
    assert torch.equal(cloned.resid[1], viewed.resid[1])
    assert cloned.resid[1].data_ptr() != viewed.resid[1].data_ptr()


def test_stop_forward_is_the_one_exception_every_early_stop_raises():
    from circuitkit.circuits import _engine

    assert _engine.StopForward is StopForward
    with pytest.raises(StopForward):
        hooks, _ = reads(Keep(z=(0,)), L, stop_after=HOOKS.z(0))
        hooks[-1][1](torch.zeros(1, 2, 4, 8), None)


def test_every_read_at_the_stop_runs_before_the_pass_ends():
    """Two reads at the activation a pass stops at (a layer's z and its mean) and the caller's own hook there all
    see it: the stop is the last hook at that point."""
    model = _model(None)
    seen: list[str] = []
    with torch.no_grad():
        logits, kept = reference_pass(adapt(model), _tokens(), Keep(z=(1,), z_mean=(1,)), stop_after=HOOKS.z(1),
                                      hooks=[(HOOKS.z(1), lambda x, hook: seen.append("caller"))])
        _, cache = model.run_with_cache(_tokens())
    assert logits is None and seen == ["caller"] and torch.equal(kept.z[1], cache[HOOKS.z(1)])
    assert torch.allclose(kept.z_mean[1], cache[HOOKS.z(1)].mean(dim=(0, 1)), rtol=0, atol=1e-7)
