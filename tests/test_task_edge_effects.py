"""``ck.tasks.edge_effects``: the exact effect of edges a researcher names on a task, with intervals. Checked against
the mask pass (every edge but that one kept: the edge circuit's own pass, an independent computation) and against a
task scan's effects of the same edges; bad input is one ``CircuitkitError`` line naming it."""

from __future__ import annotations

import pytest
import torch

from circuitkit import CircuitkitError
from circuitkit.graph.runner import TaskRunner
from circuitkit.models.adapters import adapt
from circuitkit.tasks import Task, edge_effects, scan_task
from circuitkit.uncertainty import bootstrap_ci
from tests.conftest import boot_bridge
from tests.test_tasks import toy_pairs

EXACT = 1e-5


@pytest.fixture(scope="module")
def setting():
    model = boot_bridge(attn_only=False, n_layers=3, n_key_value_heads=2, d_vocab=50, seed=3)
    return model, Task.from_pairs(toy_pairs(12), name="toy")


NAMES = ["input->0.g1:k", "0.2->1.3:q", "0.1->m0", "m0->2.g0:v", "1.2->logits", "m2->logits", "input->logits"]


def test_each_effect_is_the_mask_pass_with_that_edge_missing_and_its_bootstrap(setting):
    model, task = setting
    got = edge_effects(model, task, NAMES, n_resamples=200)
    assert [e.name for e in got] == NAMES and all(e.score is None for e in got)
    adapter = adapt(model)
    runner = TaskRunner(adapter, task.tokenize(adapter), task.metric, mlps=True, ablation=task.ablation)
    graph = runner.graph
    kept = graph.allowed[None].repeat(len(NAMES), 1, 1)
    for i, name in enumerate(NAMES):
        sender, receiver = name.split("->")
        kept[i, graph.senders.index(sender), graph.receivers.index(receiver)] = False
    per_pair: list[torch.Tensor] = []
    runner.edge_metric(kept, pairs=per_pair)
    lost = runner.clean["metric"].double()[:, None] - torch.cat(per_pair).double().T  # [pair, edge]
    lo, hi = bootstrap_ci(lost, 200)
    for e, mean, a, b, each in zip(got, lost.mean(0).tolist(), lo.tolist(), hi.tolist(), lost.T, strict=True):
        assert e.effect == pytest.approx(mean, abs=EXACT), e.name
        assert e.interval == (pytest.approx(a, abs=EXACT), pytest.approx(b, abs=EXACT)), e.name
        torch.testing.assert_close(e.each.double(), each, atol=EXACT, rtol=0)
    assert max(abs(e.effect) for e in got) > 100 * EXACT  # edges that do something


def test_the_scans_strongest_edges_have_the_scans_effects_and_intervals(setting):
    model, task = setting
    scan = scan_task(model, task, target=0.8, n_resamples=300, holdout=0)
    strongest = scan.circuit.edge_effects
    got = edge_effects(model, task, [e.name for e in strongest], n_resamples=300)
    for mine, theirs in zip(got, strongest, strict=True):
        assert mine.effect == pytest.approx(theirs.effect, abs=EXACT)
        assert mine.interval == (pytest.approx(theirs.interval[0], abs=EXACT),
                                 pytest.approx(theirs.interval[1], abs=EXACT))


def test_one_name_one_pair_and_the_models_state(setting):
    model, task = setting
    training = model.training
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    (one,) = edge_effects(model, Task.from_pairs(toy_pairs(1), name="one"), "1.2->logits")
    assert one.name == "1.2->logits" and one.interval is None and one.each.shape == (1,)
    assert model.training == training
    assert all(torch.equal(p, params[name]) for name, p in model.named_parameters())
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("edges, needle", [
    ([], "at least one edge name"),
    ("0.1-1.3:q", "sender->receiver"),
    (["0.1->1.3:q", 7], "edges[1]"),
    (["9.0->1.3:q"], "a sender of this model's graph"),
    (["0.1->1.9:q"], "a receiver of this model's graph: L.H:q, L.gG:k"),
    (["0.1->1.1:k"], "L.gG:k, L.gG:v"),
    (["1.1->0.0:q"], "an edge from a sender to a receiver after it"),
    (["2.0->2.1:q"], "an edge from a sender to a receiver after it"),
    ({"0.1->1.3:q"}, "an edge name or a list of them"),
])
def test_bad_edges_are_one_line(setting, edges, needle):
    model, task = setting
    with pytest.raises(CircuitkitError) as err:
        edge_effects(model, task, edges)
    assert needle in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("options, needle", [
    ({"kv_edges": "per-head"}, "kv_edges"),
    ({"n_resamples": 0}, "n_resamples"),
    ({"ci_level": 1.5}, "ci_level"),
    ({"mlps": "yes"}, "mlps"),
    ({"device": "cuda:7"}, "device"),
    ({"progress": "yes"}, "progress"),
])
def test_bad_options_are_one_line(setting, options, needle):
    model, task = setting
    with pytest.raises(CircuitkitError) as err:
        edge_effects(model, task, ["0.1->1.3:q"], **options)
    assert needle in str(err.value)


def test_not_a_task_is_refused(setting):
    model, _ = setting
    with pytest.raises(CircuitkitError, match="edge_effects: task"):
        edge_effects(model, [("a", "b", "c", "d")], ["0.1->1.3:q"])


def test_per_query_head_receivers_are_named_per_head(setting):
    model, task = setting
    (e,) = edge_effects(model, task, ["0.1->1.3:k"], kv_edges="per-query-head")
    adapter = adapt(model)
    runner = TaskRunner(adapter, task.tokenize(adapter), task.metric, mlps=True, ablation=task.ablation,
                        kv_edges="per-query-head")
    graph = runner.graph
    kept = graph.allowed[None].clone()
    kept[0, graph.senders.index("0.1"), graph.receivers.index("1.3:k")] = False
    assert e.effect == pytest.approx(float(runner.clean["metric"].mean() - runner.edge_metric(kept)[0]), abs=EXACT)


def test_a_metric_in_place_of_the_tasks_own(setting):
    """``metric=`` as ``scan_task``'s: the effect in that metric's units (here the answer's probability lead, not
    its logit lead), equal to the same task built with that metric; a bad metric is refused in one line."""
    from dataclasses import replace

    model, task = setting
    (by_name,) = edge_effects(model, task, ["1.2->logits"], metric="prob_diff")
    (by_task,) = edge_effects(model, replace(task, metric="prob_diff"), ["1.2->logits"])
    (logits,) = edge_effects(model, task, ["1.2->logits"])
    assert by_name.effect == by_task.effect and by_name.interval == by_task.interval
    assert by_name.effect != pytest.approx(logits.effect, abs=1e-3)
    with pytest.raises(CircuitkitError, match="metric"):
        edge_effects(model, task, ["1.2->logits"], metric="accuracy")


def test_a_progress_bar_counts_the_edges(setting, capsys):
    model, task = setting
    edge_effects(model, task, NAMES, progress=True)
    err = capsys.readouterr().err
    assert "patching edges" in err and f"{len(NAMES)}/{len(NAMES)}" in err
    edge_effects(model, task, NAMES)  # fewer than PROGRESS_MIN_EDGES: no bar unless asked
    assert "patching edges" not in capsys.readouterr().err
