"""The induction engine's node sets are typed, as a task's: its ``Ablator`` runs node types given as data
(``graph/nodes.NodeType`` records) through the one builder of node patches, ``graph.nodes.node_patches``.

Oracle: a plain run of the model with the node's units overwritten one unit at a time in a hook, and the
repeated-copies loss computed from its logits by hand (mean cross-entropy of the copies' next tokens).
"""

from __future__ import annotations

import pytest
import torch

from circuitkit import CircuitkitError, zoo
from circuitkit.circuits.faithfulness import Ablator, ablation_values
from circuitkit.detect.tokens import RepeatedTokens
from circuitkit.graph.nodes import HEAD, NodeType, neuron_groups
from circuitkit.models.adapters import HOOKS, adapt
from tests.conftest import boot_bridge

RESID = NodeType("resid", lambda spec: 4, lambda layer, i: f"r{layer}.{i}", HOOKS.resid_pre,
                 "its quarter of the residual stream replaced", "rL.I = quarter I of the residual stream entering L")
"""A node type the library does not define: the residual stream entering each layer, in four quarters."""


def _copies_loss(logits: torch.Tensor, tokens: torch.Tensor, repeated: torch.Tensor) -> float:
    """The mean cross-entropy of the next token at the prediction indices ``repeated`` ``[pos - 1]`` (the
    repeated copies), in float64: the loss's definition."""
    logp = logits[:, :-1].double().log_softmax(-1)
    nll = -logp.gather(-1, tokens[:, 1:, None].to(logp.device))[..., 0]  # [batch, pos - 1]
    return float(nll[:, repeated].mean())


def _oracle(adapter, batch, overwrite: dict[str, tuple[list[int], torch.Tensor]]) -> float:
    """The loss with, at each hook named, the listed units overwritten by ``value[..., unit, ...]`` one unit at a
    time (``value`` a per-unit mean ``[U, ...]``)."""
    def overwriting(units: list[int], value: torch.Tensor):
        def hook(x, hook):  # x [batch, pos, U, ...]; value [U, ...]
            x = x.clone()
            for u in units:
                x[:, :, u] = value[u]
            return x
        return hook

    with torch.no_grad():
        logits = adapter.run(batch.tokens, [(name, overwriting(*what)) for name, what in overwrite.items()])
    return _copies_loss(logits, batch.tokens, batch.repeated_copies)


def _means(adapter, batch, kind: NodeType) -> dict[int, torch.Tensor]:
    """Each layer's activation at the type's hook averaged over the batch and positions (mean ablation)."""
    kept: dict[int, torch.Tensor] = {}
    L = adapter.spec.n_layers
    with torch.no_grad():
        adapter.run(batch.tokens, [(kind.hook(layer), lambda x, hook: kept.__setitem__(
            HOOKS.layer_of(hook.name), x.mean(dim=(0, 1)))) for layer in range(L)])
    return kept


@pytest.fixture(scope="module")
def bundled():
    model = zoo.load()
    adapter = adapt(model)
    batch = RepeatedTokens(batch=3, block_len=6, seed=2).build(model)
    values, _ = ablation_values(adapter, batch, "mean")
    return adapter, batch, values


def test_the_loss_is_the_definition(bundled):
    """The oracle's loss is the ablator's with nothing ablated (the two agree before anything is patched)."""
    adapter, batch, values = bundled
    nothing = torch.zeros(1, adapter.spec.n_layers, adapter.spec.n_heads, dtype=torch.bool)
    assert Ablator(adapter, batch, values).losses(nothing)[0] == pytest.approx(_oracle(adapter, batch, {}), abs=1e-5)


def test_a_node_type_of_its_own_runs_in_the_induction_ablator(bundled):
    """Quarters of the residual stream, a type the library does not have, given to the ablator as a record and its
    values: each set's loss is the oracle's, alone and beside heads in one set, and the sets' per-sequence losses
    are kept under the typed set."""
    adapter, batch, values = bundled
    spec = adapter.spec
    means = _means(adapter, batch, RESID)
    ablator = Ablator(adapter, batch, values, {RESID: means})
    resid = torch.zeros(3, spec.n_layers, 4, dtype=torch.bool)
    heads = torch.zeros(3, spec.n_layers, spec.n_heads, dtype=torch.bool)
    resid[0, 1, 2] = True                      # quarter 2 entering layer 1
    resid[1, 0, 0] = resid[1, 1, 3] = True     # quarter 0 entering layer 0 and quarter 3 entering layer 1
    resid[2, 1, 1] = True
    heads[2, 0, 1] = True                      # and head 0.1, in the same set
    got = ablator.losses({"resid": resid, "head": heads})
    d = spec.d_model
    quarter = [list(range(q * d // 4, (q + 1) * d // 4)) for q in range(4)]
    expected = [
        _oracle(adapter, batch, {HOOKS.resid_pre(1): (quarter[2], means[1])}),
        _oracle(adapter, batch, {HOOKS.resid_pre(0): (quarter[0], means[0]),
                                 HOOKS.resid_pre(1): (quarter[3], means[1])}),
        _oracle(adapter, batch, {HOOKS.resid_pre(1): (quarter[1], means[1]),
                                 HOOKS.z(0): ([1], values[0])}),
    ]
    assert got == pytest.approx(expected, abs=2e-5)
    assert all(g != pytest.approx(got[0], abs=1e-4) for g in got[1:])  # the sets differ: the test can fail
    assert ablator.passes == 3
    kept = ablator.sequence_losses({"resid": resid[1:2], "head": heads[1:2]})
    assert kept is not None and float(kept.mean()) == pytest.approx(got[1], abs=1e-5)
    torch.testing.assert_close(ablator.sequence_losses({"resid": resid[1:2]}), kept)  # no heads named: none ablated


def test_a_head_mask_and_the_same_typed_set_are_one_set(bundled):
    """A head mask ``[sets, layer, head]`` is the node set of the head type: the same losses, the same kept
    per-sequence losses, whichever form asks."""
    adapter, batch, values = bundled
    spec = adapter.spec
    masks = torch.zeros(2, spec.n_layers, spec.n_heads, dtype=torch.bool)
    masks[0, 1, 2] = masks[1, 0, 0] = True
    ablator = Ablator(adapter, batch, values, {RESID: _means(adapter, batch, RESID)})
    plain = ablator.losses(masks)
    nothing = torch.zeros(2, spec.n_layers, 4, dtype=torch.bool)
    typed = ablator.losses({"head": masks, "resid": nothing})
    assert typed == plain
    torch.testing.assert_close(ablator.sequence_losses(masks[1]), ablator.sequence_losses({"head": masks[1:2]}))


def test_neuron_groups_run_in_the_induction_ablator():
    """The library's neuron groups (a task's ``neuron_groups``) on a model with MLPs: a group's units of the MLP's
    hidden activation take their mean, as the oracle overwrites them."""
    model = boot_bridge(n_layers=2, attn_only=False, seed=3)
    adapter = adapt(model)
    batch = RepeatedTokens(batch=2, block_len=5, seed=1, bos=False).build(model)
    values, _ = ablation_values(adapter, batch, "mean")
    groups = neuron_groups(3)
    means = _means(adapter, batch, groups)
    ablator = Ablator(adapter, batch, values, {groups: means})
    sets = torch.zeros(2, adapter.spec.n_layers, 3, dtype=torch.bool)
    sets[0, 0, 1] = True
    sets[1, 1, 0] = sets[1, 1, 2] = True
    got = ablator.losses({"neurons": sets})
    width = means[0].shape[-1]
    group = [[u for u in range(width) if u * 3 // width == g] for g in range(3)]
    expected = [_oracle(adapter, batch, {HOOKS.mlp_post(0): (group[1], means[0])}),
                _oracle(adapter, batch, {HOOKS.mlp_post(1): (group[0] + group[2], means[1])})]
    assert got == pytest.approx(expected, abs=2e-5)


BAD_SETS = ["unknown-type", "wrong-width", "wrong-layers", "not-bool", "sets-disagree", "empty"]


def _bad_sets(case: str, L: int, H: int) -> dict:
    return {
        "unknown-type": {"mlp": torch.zeros(1, L, 1, dtype=torch.bool)},
        "wrong-width": {"resid": torch.zeros(1, L, 3, dtype=torch.bool)},
        "wrong-layers": {"head": torch.zeros(1, L + 1, H, dtype=torch.bool)},
        "not-bool": {"head": torch.zeros(1, L, H)},
        "sets-disagree": {"head": torch.zeros(1, L, H, dtype=torch.bool),
                          "resid": torch.zeros(2, L, 4, dtype=torch.bool)},
        "empty": {},
    }[case]


@pytest.mark.parametrize("case", [*BAD_SETS, "named-head"])
def test_bad_node_sets_are_refused_in_words(bundled, case):
    adapter, batch, values = bundled
    spec = adapter.spec
    if case == "named-head":
        with pytest.raises(CircuitkitError, match="further.*names of their own"):
            Ablator(adapter, batch, values, {HEAD: values})
        return
    ablator = Ablator(adapter, batch, values, {RESID: _means(adapter, batch, RESID)})
    with pytest.raises(CircuitkitError, match="Ablator: ablated"):
        ablator.losses(_bad_sets(case, spec.n_layers, spec.n_heads))


@pytest.mark.parametrize("case", BAD_SETS)
def test_a_task_runner_refuses_the_same_bad_sets_by_the_same_check(case):
    """Both engines check node sets in one place (``graph.nodes.check_node_sets``): a task's runner refuses what
    the ablator refuses, naming itself (``resid`` is not one of its types either)."""
    from circuitkit.graph.runner import TaskRunner
    from circuitkit.tasks import repeated_tokens

    model = zoo.load()
    adapter = adapt(model)
    task = repeated_tokens(model, 3, seed=2, block_len=6)
    runner = TaskRunner(adapter, task.tokenize(adapter), task.metric, mlps=False, ablation=task.ablation)
    with pytest.raises(CircuitkitError, match="task circuit: patched"):
        runner.patched_metric(_bad_sets(case, adapter.spec.n_layers, adapter.spec.n_heads))
