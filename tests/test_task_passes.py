"""What a task scan's passes cost, counted: the clean run's backward reaches only the final norm and unembedding;
a pass that patches nothing below a layer resumes there (the strongest edges' exact effects, a node set patched
from a layer up) and equals the full pass; the pass counts of a known scan."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from circuitkit.errors import CircuitkitError
from circuitkit.graph.runner import TaskRunner
from circuitkit.models.adapters import adapt
from circuitkit.models.toy import AttentionOnlyModel
from circuitkit.tasks import Task
from tests.conftest import boot_bridge, random_weights
from tests.test_tasks import toy_pairs

LAYERS = 3


def _runner(kind: str, kv_edges: str = "grouped", **extra) -> TaskRunner:
    model = {"mha-mlp": lambda: boot_bridge(attn_only=False, n_layers=LAYERS, d_vocab=50, seed=3),
             "gqa-ln-mlp": lambda: boot_bridge(attn_only=False, n_layers=LAYERS, n_key_value_heads=2, d_vocab=50,
                                               seed=8, normalization_type="LN"),
             "attn-only": lambda: boot_bridge(n_layers=LAYERS, d_vocab=50, seed=3),
             "toy": lambda: AttentionOnlyModel(random_weights(n_layers=LAYERS, d_vocab=50), n_ctx=32)}[kind]()
    adapter = adapt(model)
    batch = Task.from_pairs(toy_pairs(), name="toy").tokenize(adapter)
    return TaskRunner(adapter, batch, "logit_diff", mlps=kind not in ("attn-only", "toy"), ablation="corrupted",
                      kv_edges=kv_edges, **extra)


def _edges_into_every_layer(runner: TaskRunner) -> torch.Tensor:
    """One edge into each receiver channel of every layer and into the logits, from the latest sender it can
    have and from the input: ``[n, 2]``."""
    graph = runner.graph
    picked = []
    for (_, layer), cols in graph.receiver_slices.items():
        for receiver in (cols.start, cols.stop - 1):
            senders = graph.allowed[:, receiver].nonzero().flatten()
            picked += [(int(senders[-1]), receiver), (0, receiver)]
            if layer > 0:
                picked.append((int(senders[len(senders) // 2]), receiver))
    return torch.tensor(sorted(set(picked)))


@pytest.mark.parametrize(("kind", "kv_edges"), [("mha-mlp", "grouped"), ("gqa-ln-mlp", "grouped"),
                                                ("gqa-ln-mlp", "per-query-head"), ("attn-only", "grouped"),
                                                ("toy", "grouped")])
def test_a_single_edge_pass_resumed_at_its_receivers_layer_equals_the_full_pass(kind, kv_edges):
    runner = _runner(kind, kv_edges)
    assert runner.adapter.can_resume
    edges = _edges_into_every_layer(runner)
    kept = runner.graph.allowed[None].repeat(len(edges), 1, 1)
    kept[torch.arange(len(edges)), edges[:, 0], edges[:, 1]] = False
    _ = runner.corrupted
    before = runner.passes
    full = runner.edge_metric(kept)
    full_passes = runner.passes - before
    before = runner.passes
    resumed = runner.single_edge_metric(edges)
    resumed_passes = runner.passes - before
    torch.testing.assert_close(resumed, full, rtol=0, atol=1e-5)
    assert not torch.equal(full, torch.full_like(full, float(runner.clean["metric"].mean())))  # edges that matter
    # each edge counts its receiver layer's share (the logits' edges: none, they run no layer), one copy of the
    # pairs: a per-query-head key/value edge patches its group's key/value head and puts the group's other query
    # heads' clean z back, where the full pass runs the group's copies side by side
    graph = runner.graph
    layer_of = {r: layer for (_, layer), cols in graph.receiver_slices.items() for r in range(cols.start, cols.stop)}
    assert layer_of[graph.logits_index] == LAYERS and graph.logits_index in edges[:, 1].tolist()
    share = sum((LAYERS - layer_of[int(r)]) / LAYERS for r in edges[:, 1])
    assert resumed_passes == pytest.approx(share)
    if kv_edges == "grouped":
        assert full_passes == len(edges)
    else:  # the full pass runs a key/value edge's group as side-by-side copies
        assert runner.graph.kv_copies > 1 and full_passes > len(edges)
    assert resumed_passes < full_passes


def test_a_model_that_cannot_resume_runs_the_full_single_edge_pass(monkeypatch):
    runner = _runner("mha-mlp")
    edges = _edges_into_every_layer(runner)[:5]
    monkeypatch.setattr(type(runner.adapter), "can_resume", property(lambda self: False))
    _ = runner.corrupted
    before = runner.passes
    values = runner.single_edge_metric(edges)
    assert runner.passes - before == len(edges)
    kept = runner.graph.allowed[None].repeat(len(edges), 1, 1)
    kept[torch.arange(len(edges)), edges[:, 0], edges[:, 1]] = False
    torch.testing.assert_close(values, runner.edge_metric(kept), rtol=0, atol=1e-6)


def test_single_edge_metric_refuses_what_is_not_an_edge():
    from circuitkit import CircuitkitError

    runner = _runner("attn-only")
    logits = runner.graph.logits_index
    with pytest.raises(CircuitkitError, match="indices of edges of the graph"):
        runner.single_edge_metric(torch.tensor([[len(runner.graph.senders) - 1, 0]]))  # a late head into layer 0
    with pytest.raises(CircuitkitError, match=r"\[n, 2\]"):
        runner.single_edge_metric(torch.tensor([0, logits]))
    n_senders = len(runner.graph.senders)
    for bad in ([[0, logits]], torch.tensor([[0.0, float(logits)]]), torch.tensor([[-1, logits]]),
                torch.tensor([[n_senders, logits]]), torch.tensor([[0, logits + 1]]), torch.tensor([[True, False]])):
        for measure in (runner.single_edge_metric, runner.single_edge_share):  # refused, never indexed
            with pytest.raises(CircuitkitError, match="integer indices of edges of the graph"):
                measure(bad)


@pytest.mark.parametrize("kind", ["mha-mlp", "gqa-ln-mlp"])
def test_a_node_set_patched_from_a_layer_up_resumes_there(kind, monkeypatch):
    runner = _runner(kind)
    L, H = LAYERS, runner.spec.n_heads
    heads = torch.zeros(3, L, H, dtype=torch.bool)
    heads[0, 1, 2] = True  # from layer 1
    heads[1, 2, :] = True  # from layer 2
    heads[2, 1:, 1] = True
    _ = runner.corrupted
    resumed_before = runner.passes
    resumed = runner.node_metric(heads, None, per_pair=True)
    resumed_passes = runner.passes - resumed_before
    assert resumed_passes == pytest.approx((2 + 1 + 2) / L)  # each set from its lowest patched layer
    extra = torch.zeros(1, L, H, dtype=torch.bool)
    extra[0, 0, 3] = True  # a set from layer 0: a full pass
    before = runner.passes
    both = runner.node_metric(torch.cat([heads, extra]), None, per_pair=True)
    assert runner.passes - before == pytest.approx(resumed_passes + 1)
    torch.testing.assert_close(resumed, both[:3], rtol=0, atol=0)
    monkeypatch.setattr(type(runner.adapter), "can_resume", property(lambda self: False))
    before = runner.passes
    full = runner.node_metric(torch.cat([heads, extra]), None, per_pair=True)
    assert runner.passes - before == 4
    torch.testing.assert_close(resumed, full[:3], rtol=0, atol=1e-5)
    torch.testing.assert_close(both[3], full[3], rtol=0, atol=1e-5)


def _autograd_nodes(tensor: torch.Tensor) -> int:
    seen, todo = set(), [tensor.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        todo += [next_fn for next_fn, _ in node.next_functions]
    return len(seen)


def test_the_clean_runs_backward_reaches_only_the_tail_and_counts_one_pass(monkeypatch):
    """Direct logit attribution's backward starts at a detached leaf at the last block's output: its autograd graph
    is the same size on a 1-layer and a 4-layer model (the final norm and the unembedding), so the clean run is
    one pass."""
    sizes = {}
    for layers in (1, 4):
        adapter = adapt(boot_bridge(attn_only=False, n_layers=layers, d_vocab=50, seed=3, normalization_type="LN"))
        runner = TaskRunner(adapter, Task.from_pairs(toy_pairs(), name="toy").tokenize(adapter), "logit_diff",
                            mlps=True, ablation="corrupted")
        grads: list[int] = []
        real_grad = torch.autograd.grad

        def counting(outputs, inputs, *args, grads=grads, real_grad=real_grad, **kwargs):
            grads.append(_autograd_nodes(outputs))
            return real_grad(outputs, inputs, *args, **kwargs)

        monkeypatch.setattr(torch.autograd, "grad", counting)
        assert runner.clean["dla"] is not None and runner.passes == 1.0
        monkeypatch.setattr(torch.autograd, "grad", real_grad)
        assert len(grads) == 1
        sizes[layers] = grads[0]
        _ = runner.corrupted
        assert runner.passes == 2.0
    assert sizes[1] == sizes[4] < 40, sizes


@pytest.mark.parametrize("kind", ["mha-mlp", "gqa-ln-mlp", "attn-only"])
def test_every_node_patched_is_the_corrupted_run_where_the_read_tokens_agree(kind):
    """The oracle: the all-patched pass itself, pair by pair, against the corrupted run's metric."""
    runner = _runner(kind)
    assert runner.every_node_patched_is_corrupted()  # toy_pairs corrupt token 1, never the last one
    L, H = LAYERS, runner.spec.n_heads
    every = {"head": torch.ones(1, L, H, dtype=torch.bool)}
    if kind != "attn-only":
        every["mlp"] = torch.ones(1, L, 1, dtype=torch.bool)
    for patched in (every, {"head": every["head"]}):  # with the MLPs patched too, or recomputed
        values = runner.patched_metric(patched, per_pair=True)[0]
        torch.testing.assert_close(values, runner.corrupted["metric"], rtol=0, atol=1e-5)
    one_head_kept = {"head": every["head"].clone()}
    one_head_kept["head"][0, L - 1, 0] = False
    assert not torch.allclose(runner.patched_metric(one_head_kept, per_pair=True)[0], runner.corrupted["metric"],
                              atol=1e-4)


def test_the_all_patched_pass_runs_where_it_is_not_the_corrupted_run():
    pairs = toy_pairs()
    clean, corrupted, answer, wrong = pairs[2]
    corrupted = list(corrupted)
    corrupted[-1] = (clean[-1] + 3) % 50  # one pair's last token corrupted: its read position differs
    pairs[2] = (clean, corrupted, answer, wrong)
    adapter = adapt(boot_bridge(attn_only=False, n_layers=LAYERS, d_vocab=50, seed=3))
    batch = Task.from_pairs(pairs, name="toy").tokenize(adapter)
    runner = TaskRunner(adapter, batch, "logit_diff", mlps=True, ablation="corrupted")
    assert not runner.every_node_patched_is_corrupted()
    plain = Task.from_pairs(toy_pairs(), name="toy").tokenize(adapter)
    for ablation in ("mean", "zero", "clean_mean"):
        runner = TaskRunner(adapter, plain, "logit_diff", mlps=True, ablation=ablation)
        assert not runner.every_node_patched_is_corrupted()


def _search_both_sets(monkeypatch, *, saving=None, resumable=True, shortcut=True):
    """The node search and the held-out curve on a tiny model with MLPs; which node passes ran (``True``: every
    node patched), the passes counted, the figures."""
    from circuitkit.tasks.circuit import node_circuit
    from circuitkit.tasks.other_set import other_set_figures

    runner, held = _runner("mha-mlp"), _runner("mha-mlp")
    scores = runner.node_gradients(2)
    if saving is not None:
        monkeypatch.setattr(TaskRunner, "resume_saving", lambda self, patched: saving)
    if not resumable:
        monkeypatch.setattr(type(runner.adapter), "can_resume", property(lambda self: False))
    if not shortcut:
        monkeypatch.setattr(TaskRunner, "every_node_patched_is_corrupted", lambda self: False)
    _ = runner.corrupted, held.corrupted
    before = runner.passes + held.passes
    every: list[bool] = []
    real = TaskRunner._node_pass

    def spying(self, patched, *args, **kwargs):
        every.extend(all(bool(mask[s].all()) for mask in patched.values())
                     for s in range(next(iter(patched.values())).shape[0]))
        return real(self, patched, *args, **kwargs)

    monkeypatch.setattr(TaskRunner, "_node_pass", spying)
    found = node_circuit(runner, scores, 0.8, "abs")
    other = other_set_figures(held, "evaluation", found.curve, len(found.heads), scores, "abs", False, ())
    monkeypatch.undo()
    return every, runner.passes + held.passes - before, found, other


def test_the_all_patched_pass_runs_only_where_it_pays_and_every_figure_stays(monkeypatch):
    """Where every node patched is the corrupted run, its pass runs only where the passes resuming from it save
    more than it costs; either way (and with full passes only, the old way) the same figures."""
    old_every, old_passes, old, old_other = _search_both_sets(monkeypatch, resumable=False, shortcut=False)
    assert sum(old_every) == 2  # the old way: one all-patched pass on each set
    skipped_every, skipped_passes, skipped, skipped_other = _search_both_sets(monkeypatch, saving=0.0,
                                                                             resumable=False)
    assert not any(skipped_every) and skipped_passes == old_passes - 2
    ran_every, ran_passes, ran, ran_other = _search_both_sets(monkeypatch, saving=2.0)
    assert sum(ran_every) == 2 and ran_passes < old_passes  # recorded once per set, and the others resume from it
    chosen_every, chosen_passes, _, _ = _search_both_sets(monkeypatch)  # the runner's own choice: the cheaper
    assert chosen_passes <= min(skipped_passes, ran_passes) + 1e-9
    for found, other in ((skipped, skipped_other), (ran, ran_other)):
        assert found.heads == old.heads and [p.size for p in found.curve] == [p.size for p in old.curve]
        for a, b in zip(found.curve, old.curve, strict=True):
            assert a.faithfulness == pytest.approx(b.faithfulness, abs=1e-5)
        assert found.all_patched == pytest.approx(old.all_patched, abs=1e-5)
        assert found.necessity == pytest.approx(old.necessity, abs=1e-5)
        for key in ("faithfulness", "necessity", "metric_all_nodes_patched"):
            assert other[key] == pytest.approx(old_other[key], abs=1e-5)
        for a, b in zip(other["curve"], old_other["curve"], strict=True):
            assert a["metric"] == pytest.approx(b["metric"], abs=1e-5)


def test_a_node_pass_resumes_from_the_all_patched_run_below_its_lowest_kept_node():
    """The oracle: the same sets in full passes (a fresh runner that cannot resume)."""
    runner = _runner("gqa-ln-mlp")
    L, H = LAYERS, runner.spec.n_heads
    patched = torch.ones(3, L, H, dtype=torch.bool)
    patched[0, 2, 1] = False  # keeps a head of layer 2 only
    patched[1, 1, :] = False
    patched[2, 2, 0] = patched[2, 0, 3] = False  # keeps one of layer 0: a full pass
    _ = runner.corrupted
    every = runner.record_all_patched(("head",))
    before = runner.passes
    assert runner.node_starts({"head": patched}) == [(2, "patched"), (1, "patched"), (0, "full")]
    resumed = runner.node_metric(patched, None, per_pair=True)
    assert runner.passes - before == pytest.approx((1 + 2) / L + 1)
    plain = _runner("gqa-ln-mlp")
    plain.adapter.__class__ = type("NoResume", (type(plain.adapter),), {"can_resume": False})
    full = plain.node_metric(patched, None, per_pair=True)
    torch.testing.assert_close(resumed, full, rtol=0, atol=1e-5)
    torch.testing.assert_close(every, plain.node_metric(torch.ones(1, L, H, dtype=torch.bool), None,
                                                        per_pair=True)[0], rtol=0, atol=1e-5)


def test_a_scans_stages_count_what_ran(monkeypatch):
    """A scan on a tiny model with MLPs, its stages' passes recounted from what ran: the clean run one pass, the
    edge stage's whole copies (MIB's sizes under both rankings, the bisection) plus each exact effect's share of the
    layers from its receiver's layer (into the logits: none)."""
    from circuitkit.tasks import scan_task

    model = boot_bridge(attn_only=False, n_layers=LAYERS, d_vocab=50, seed=3)
    copies: list[int] = []
    real = TaskRunner.edge_metric

    def counting(self, kept, pairs=None):
        copies.append(kept.shape[0])
        return real(self, kept, pairs)

    monkeypatch.setattr(TaskRunner, "edge_metric", counting)
    scan = scan_task(model, Task.from_pairs(toy_pairs(12), name="toy"), target=0.8, n_resamples=20, holdout=0)
    ran = {stage.name: stage.passes for stage in scan.stages}
    # the corrupted run is EAP-IG's first point (alpha = 0): no stage of its own
    assert ran["clean"] == 1.0 and "corrupted" not in ran and ran["attribute"] == 3 * scan.settings["ig_steps"]
    effects = scan.circuit.edge_effects
    assert len(effects) == 8

    def receiver_layer(name: str) -> int:
        receiver = name.split("->")[1]
        return LAYERS if receiver == "logits" else int(receiver[1:]) if receiver.startswith("m") else \
            int(receiver.split(".")[0])

    shares = sum((LAYERS - receiver_layer(e.name)) / LAYERS for e in effects)  # into the logits: no layer
    assert any(e.name.endswith("->logits") for e in effects)
    assert ran["edges"] == pytest.approx(sum(copies) + shares)
    assert shares < len(effects)  # some receiver past layer 0: the old count (one pass each) is more


def test_the_held_out_plan_counts_the_node_searchs_sizes_before_the_search_runs():
    """Before the search the held-out curve is planned at the sizes the node search plans for itself (not a fixed
    four): IOI on Qwen2.5-0.5B planned 8 held-out passes and ran 14.9."""
    from circuitkit.tasks.stages import PlanInputs, held_estimate, node_estimate

    plan = PlanInputs(nodes=336, edges_total=79813, pairs=8, held=8, direct=True, steps=3, edges=True, quick=False,
                      random_sets=0, stability=0)
    sizes = node_estimate(336, 8) - 2  # the search's exact sizes, less its all-patched run and necessity
    assert held_estimate(plan) == 1 + 1 + sizes + 1 + 1
    assert held_estimate(plan, 14) == 1 + 1 + 14 + 1 + 1  # known once the search ran
    assert held_estimate(replace(plan, quick=True)) == 1 + 1 + 2 + 1 + 1


def test_the_edge_plan_counts_both_rankings_and_the_resumed_effects():
    """The edge stage is planned at MIB's sizes under both rankings (CPR reads the signed one, CMD the absolute one),
    the bisection, and the eight exact effects at half a pass each (they resume at the receiver's layer): on IOI's
    79,813 edges 18 + 7 + 4 = 29, where the stage ran 25.83 (it planned 24, under what ran)."""
    from circuitkit.tasks.circuit import EDGE_RESOLUTION, N_EXACT_EDGES, RANKS, mib_sizes
    from circuitkit.tasks.stages import EFFECT_SHARE, edge_estimate

    assert edge_estimate(79813, 8) == 29
    sizes = [k for k in mib_sizes(79813) if 0 < k < 79813]
    assert len(sizes) == 9 and len(RANKS) == 2
    halvings = math.ceil(math.log2(2.5 / EDGE_RESOLUTION)) - 1
    assert edge_estimate(79813, 8) == 2 * 9 + halvings + EFFECT_SHARE * N_EXACT_EDGES
    # a graph of 5 edges: MIB's sizes 0, 0, 0, 0, 0, 0, 0, 1, 2 (5 excluded), under both rankings; 5 effects
    assert edge_estimate(5, 8) == 2 * 2 + halvings + EFFECT_SHARE * 5


@pytest.mark.parametrize("options", [None, {"steps": 7}])
def test_the_masks_search_is_planned_at_its_steps(options):
    """The learned masks' passes are known before they run (each step a forward + backward, 3 passes, then one
    stacked call confirming the smallest sets): the plan says so, where it said 40 for every model (the bundled
    task ran 182). Checked against what a task scan's search stage ran."""
    import circuitkit as ck
    from circuitkit import zoo
    from circuitkit.circuits.search import CONFIRMED_SETS, DEFAULT_MASK_STEPS, search_estimate
    from circuitkit.tasks import repeated_tokens

    steps = (options or {}).get("steps", DEFAULT_MASK_STEPS)
    assert search_estimate("masks", options) == 3 * steps + CONFIRMED_SETS
    model = zoo.load()
    task = ck.scan(model, task=repeated_tokens(model), search="masks", search_options=options, edges=False,
                   progress="off")
    ran = {stage.name: stage.passes for stage in task.stages}["search"]
    assert 3 * steps <= ran <= search_estimate("masks", options) + 1
    with pytest.raises(CircuitkitError, match="masks search: steps"):
        search_estimate("masks", {"steps": "many"})
    with pytest.raises(CircuitkitError, match="refined search: max_passes"):
        search_estimate("refined", {"max_passes": -1})
    assert search_estimate("refined", {"max_passes": 4}) == 4 and search_estimate("ranked") == 0


@pytest.mark.parametrize("search", ["ranked", "refined"])
def test_every_pass_a_scan_runs_is_counted_in_a_stage(search, monkeypatch):
    """The stages' passes add up to every pass the scan's runners ran, on both sets of pairs: the searched set
    measured on the held-out pairs (three stacked sets) ran after the held-out stage had ended, uncounted."""
    import circuitkit as ck
    from circuitkit import zoo
    from circuitkit.tasks import repeated_tokens

    runners: list[TaskRunner] = []
    real = TaskRunner.__init__

    def keep(self, *args, **kwargs):
        real(self, *args, **kwargs)
        runners.append(self)

    monkeypatch.setattr(TaskRunner, "__init__", keep)
    model = zoo.load()
    scan = ck.scan(model, task=repeated_tokens(model), search=search, edges=False, progress="off")
    assert len(runners) == 2  # discovery and evaluation pairs
    ran = {stage.name: stage.passes for stage in scan.stages}
    assert sum(ran.values()) == pytest.approx(sum(runner.passes for runner in runners))
    assert ran["held-out"] == pytest.approx(runners[1].passes)


def test_the_held_out_plan_is_revised_to_what_the_search_paid_a_set(capsys):
    """Once the search ran, the held-out stage is planned at its sets' cost in the search (the same node sets,
    resumed at the same layers): on the bundled model's repeated-tokens task that plan is what it then measures, so
    the bar is not revised a second time (it planned every set a whole pass: 10, then 8.5 ran)."""
    import circuitkit as ck
    from circuitkit import zoo
    from circuitkit.tasks import repeated_tokens

    model = zoo.load()
    scan = ck.scan(model, task=repeated_tokens(model), progress="lines")
    lines = [line for line in capsys.readouterr().err.splitlines() if "held-out" in line and "-> " in line]
    assert len(lines) == 1 and "as in the search" in lines[0], lines
    ran = {stage.name: stage.passes for stage in scan.stages}
    assert f"-> {ran['held-out']:.2f} (" in lines[0] or f"-> {ran['held-out']:g} (" in lines[0], lines


@pytest.mark.parametrize("kind", ["mha-mlp", "gqa-ln-mlp"])
def test_the_edge_plan_counts_what_the_scores_decide(kind, monkeypatch):
    """The edge stage's plan once the scores are known (``edge_plan``): MIB's sizes under both rankings and the
    strongest edges' effects are what the stage then counts; only the bisection is planned at its usual steps."""
    import circuitkit.tasks.circuit as circuit

    runner = _runner(kind)
    scores, _ = runner.edge_gradients(1)
    planned, words = circuit.edge_plan(runner, scores, "abs")
    spent = {"bisection": 0.0, "effects": 0.0}

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            before = runner.passes
            out = fn(*args, **kwargs)
            spent[name] += runner.passes - before
            return out
        return wrapper

    monkeypatch.setattr(circuit, "smallest", counted("bisection", circuit.smallest))
    monkeypatch.setattr(runner, "single_edge_metric", counted("effects", runner.single_edge_metric))
    before = runner.passes
    effects = circuit.edge_circuit(runner, scores, 0.8, "abs")[5]
    ran = runner.passes - before
    assert len(effects) == circuit.N_EXACT_EDGES and spent["effects"] > 0
    index, _, order, _, todo, differ = circuit.edge_sets(runner.graph, scores, "abs")
    assert spent["effects"] == pytest.approx(runner.single_edge_share(index[order[:circuit.N_EXACT_EDGES]]))
    sizes = ran - spent["bisection"] - spent["effects"]
    assert sizes == len(todo) + len(differ)
    assert planned == pytest.approx(sizes + circuit.EDGE_BISECTION + spent["effects"])
    assert f"MIB's {len(todo)} sizes" in words


@pytest.mark.parametrize("kind", ["mha-mlp", "toy"])
@pytest.mark.parametrize("start", [LAYERS + 1, -1, 1.5, True, "1"])
def test_run_from_refuses_a_layer_outside_0_to_n_layers(kind, start):
    adapter = _runner(kind).adapter
    with pytest.raises(CircuitkitError, match=r"run_from: start_at_layer: given .* expected an int layer in 0 \.\. 3"):
        adapter.run_from(torch.zeros(2, 5, adapter.spec.d_model), start)


@pytest.mark.parametrize("kind", ["mha-mlp", "toy"])
@pytest.mark.parametrize("shape", [(2, 5), (2, 5, 7), (0, 5, None)])
def test_run_from_refuses_a_residual_stream_of_another_shape(kind, shape):
    adapter = _runner(kind).adapter
    shape = tuple(adapter.spec.d_model if s is None else s for s in shape)
    with pytest.raises(CircuitkitError, match=r"run_from: resid: given .* \[batch, pos, d_model\]"):
        adapter.run_from(torch.zeros(shape), LAYERS)


@pytest.mark.parametrize("kind, kv", [("mha-mlp", "grouped"), ("gqa-ln-mlp", "grouped"),
                                      ("gqa-ln-mlp", "per-query-head"), ("attn-only", "grouped"), ("toy", "grouped")])
def test_eap_igs_first_point_is_the_corrupted_run(kind, kv):
    """EAP-IG's point ``alpha = 0`` runs the corrupted input: the corrupted run read from that copy of the stacked
    pass equals the corrupted run made apart (every sender's output, the metric, the last-token log-probabilities),
    the scores are the same, and the two together count EAP-IG's passes alone, one fewer. Per-query-head key/value
    receivers too: EAP-IG splits their gradients by query head within one copy of the pairs a point."""
    folded, apart = _runner(kind, kv), _runner(kind, kv)
    _ = folded.clean, apart.clean, apart.corrupted
    assert folded.folds_corrupted(3, "left") and not apart.folds_corrupted(3, "left")
    before = (folded.passes, apart.passes)
    scores, _, _ = folded.attribute(3, "left")
    expected, _, _ = apart.attribute(3, "left")
    assert folded.passes - before[0] == apart.passes - before[1] == 9.0
    assert folded.passes == apart.passes - 1.0  # the corrupted pass apart
    torch.testing.assert_close(scores, expected, rtol=0, atol=1e-6)
    got, want = folded._corrupt, apart._corrupt
    for key in ("input", "metric", "logprobs"):
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=1e-6)
    for key in ("z", "mlp"):
        assert set(got[key]) == set(want[key]) and len(got[key]) == (0 if key == "mlp" and kind in (
            "attn-only", "toy") else LAYERS)
        for layer in want[key]:
            torch.testing.assert_close(got[key][layer], want[key][layer], rtol=0, atol=1e-6)
            x = got[key][layer]  # its own storage, not a view keeping the pass's three copies alive
            assert x.untyped_storage().nbytes() == x.numel() * x.element_size()


def test_the_corrupted_run_runs_apart_where_no_point_is_alpha_0():
    """``ig_points="right"`` (``alpha = 1/steps .. 1``): the corrupted stage runs, one pass, as before."""
    assert not _runner("mha-mlp").folds_corrupted(3, "right")
    assert not _runner("gqa-ln-mlp", "per-query-head").folds_corrupted(3, "right")
    from circuitkit.tasks import scan_task

    model = boot_bridge(attn_only=False, n_layers=LAYERS, d_vocab=50, seed=3)
    scan = scan_task(model, Task.from_pairs(toy_pairs(12), name="toy"), n_resamples=20, holdout=0, edges=False,
                     ig_points="right")
    assert {s.name: s.passes for s in scan.stages}["corrupted"] == 1.0


@pytest.mark.parametrize("kind", ["mha-mlp", "toy"])
def test_embedded_reads_the_input_embeddings_and_refuses_what_is_not_tokens(kind):
    """``adapter.embedded(tokens)``: the residual stream entering layer 0 of the full pass, from a pass stopped
    there (the corrupted prompts' inputs of a folded EAP-IG pass)."""
    from circuitkit.models.adapters import HOOKS

    adapter = _runner(kind).adapter
    tokens = torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(0))
    full = {}
    adapter.run(tokens, [(HOOKS.resid_pre(0), lambda x, hook: full.__setitem__("x", x.detach()))])
    assert torch.equal(adapter.embedded(tokens), full["x"])
    for bad in (tokens.float(), tokens[None], torch.tensor([[1, 50]]), torch.tensor([[-1, 2]]),
                torch.zeros(0, 5, dtype=torch.long), [[1, 2]]):
        with pytest.raises(CircuitkitError, match="embedded: tokens"):
            adapter.embedded(bad)
