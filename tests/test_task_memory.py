"""The task scan's memory plan: the estimate follows its formula, and a scan that cannot fit is refused in one line
before any pass, with a number of pairs that fits by the same estimate."""

from __future__ import annotations

import pytest
import torch

import circuitkit.tasks.memory as task_memory
from circuitkit import CircuitkitError
from circuitkit.models.adapters import adapt
from circuitkit.tasks import Task, scan_task
from circuitkit.tasks.memory import FIXED, MARGIN, check_task_memory, estimate_task_memory, logit_positions
from tests.conftest import boot_bridge
from tests.test_tasks import toy_pairs

L, H, G, D, DH, V = 3, 4, 2, 32, 8, 50


@pytest.fixture(scope="module")
def model():
    return boot_bridge(attn_only=False, n_layers=L, n_heads=H, n_key_value_heads=G, d_model=D, d_head=DH,
                       d_vocab=V, seed=3)


def plan(model, n, pos, **kw):
    options = {"steps": 3, "mlps": True, "edges": True, **kw}
    return estimate_task_memory(model, n, pos, **options)


def test_the_parts_equal_the_formula_by_hand(model):
    """Independent arithmetic of the module docstring's terms for this shape (float32, d_mlp = 4 d_model)."""
    N, P, S, e, m = 5, 7, 3, 4, model.cfg.d_mlp
    U = 1 + L * H + L
    est = plan(model, N, P, steps=S)
    assert est.resident["head weights"] == 4 * L * D * DH * (2 * H + 2 * G)
    assert est.resident["reference runs"] == 2 * N * P * (D + L * (H * DH + D)) * e  # input, z, MLP outputs
    assert est.stages["EAP-IG pull-back"] == (4 * U * N * P * D + 2 * S * N * P * (L * ((H + 2 * G) * DH + D) + D) * e
                                             + 32 * H * S * N * P * D)
    assert est.stages["reference run"] == U * N * P * D * e + N * V * (P * e + 8)
    assert est.stages["node patching"] == N * P * (3 * m + 4 * D + 3 * H * P) * e + N * V * (P * e + 8)
    # the exact edge effects: as many copies as fit 2**30 bytes at 4 N P d a copy, at most the 8 edges measured
    assert est.stages["exact edge effects"] == 8 * (N * P * (3 * m + 8 * D + 3 * H * P) * e + N * V * (P * e + 8))
    largest = max(est.stages.values())
    assert est.total == int(MARGIN * (sum(est.resident.values()) + largest)) + FIXED


def test_the_estimate_grows_linearly_in_pairs_and_as_the_formula_says_in_pos(model):
    one, two = plan(model, 4, 9), plan(model, 8, 9)
    assert two.resident["head weights"] == one.resident["head weights"]  # no pair in it
    assert two.resident["reference runs"] == 2 * one.resident["reference runs"]
    for name in one.stages:  # every stage holds copies of the pairs (the edge copies stay 10 at this size)
        assert two.stages[name] == 2 * one.stages[name], name
    assert two.total > one.total
    short, long = plan(model, 4, 9), plan(model, 4, 18)
    assert long.resident["reference runs"] == 2 * short.resident["reference runs"]
    # the EAP-IG pass holds attention scores, quadratic in pos: doubling pos more than doubles it, by that term,
    # less the float32 metric's logits at each pair's last position (one per pair whatever pos is)
    S, N, P = 3, 4, 9
    quadratic = S * N * L * 3 * H * 4 * (18 * 18 - 2 * P * P)  # e = 4
    assert long.stages["EAP-IG pass"] - 2 * short.stages["EAP-IG pass"] == quadratic - 2 * S * N * V * 4
    assert plan(model, 4, 9, edges=False).stages.keys() == one.stages.keys() - {"edge patching", "exact edge effects"}
    assert plan(model, 4, 9, steps=6).stages["EAP-IG pass"] > one.stages["EAP-IG pass"]


def test_logits_at_the_last_positions_only_where_the_model_unembeds_only_there(model):
    adapter = adapt(model)
    batch = Task.from_pairs(toy_pairs(6), name="toy").tokenize(adapter)
    assert logit_positions(adapter, batch.last, batch.pos) == batch.pos  # a native bridge slices all logits
    assert plan(model, 6, 7, logit_positions=1).total < plan(model, 6, 7).total


def count_runs(monkeypatch, adapter) -> list[int]:
    """Count every pass through the adapter's class (each scan adapts the model anew)."""
    calls = [0]
    run = type(adapter).run

    def counted(self, *args, **kwargs):
        calls[0] += 1
        return run(self, *args, **kwargs)

    monkeypatch.setattr(type(adapter), "run", counted)
    return calls


def toy_task_on(model, n_pairs: int):
    """A task of ``n_pairs`` toy pairs, ``model``'s adapter, the tokenized batch and the logit positions the plan
    counts for it."""
    task = Task.from_pairs(toy_pairs(n_pairs), name="toy")
    adapter = adapt(model)
    batch = task.tokenize(adapter)
    return task, adapter, batch, logit_positions(adapter, batch.last, batch.pos)


def test_a_scan_that_cannot_fit_is_refused_before_any_pass_with_pairs_that_fit(model, monkeypatch):
    task, adapter, batch, K = toy_task_on(model, 6)
    fits = plan(model, 4, batch.pos, logit_positions=K).total  # room for 4 of the 6 pairs
    assert plan(model, 5, batch.pos, logit_positions=K).total > fits
    calls = count_runs(monkeypatch, adapter)
    monkeypatch.setattr(task_memory, "available_memory", lambda device: fits)
    with pytest.raises(CircuitkitError) as info:
        scan_task(model, task)
    message = str(info.value)
    assert "\n" not in message and calls[0] == 0  # refused before the first pass
    assert "given 6 pairs" in message and "Use at most 4 pairs" in message and "reference runs" in message
    monkeypatch.setattr(task_memory, "available_memory", lambda device: None)  # unreadable: no check
    scan_task(model, task, edges=False, n_resamples=10)
    assert calls[0] > 0  # the spy sees passes: the zero above was not for want of counting


def test_check_names_the_most_pairs_that_fit_by_the_same_estimate(model):
    for n in (1, 7, 40):
        available = plan(model, n, 12).total
        with pytest.raises(CircuitkitError, match=f"Use at most {n} pairs") as info:
            check_task_memory(model, 100, 12, steps=3, mlps=True, edges=True, available=available)
        assert "\n" not in str(info.value)
        assert plan(model, n, 12).total <= available < plan(model, n + 1, 12).total
    found = check_task_memory(model, 100, 12, steps=3, mlps=True, edges=True, available=plan(model, 100, 12).total)
    assert found.n_pairs == 100
    with pytest.raises(CircuitkitError, match="Even one pair needs") as info:
        check_task_memory(model, 3, 12, steps=3, mlps=True, edges=True, available=10)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("field, value", [("n_pairs", 0), ("n_pairs", 2.0), ("n_pairs", True), ("pos", -1),
                                          ("steps", 0), ("steps", 65), ("mlps", "yes"), ("edges", 1),
                                          ("logit_positions", 8), ("available", -5), ("available", 1.5)])
def test_bad_arguments_are_one_line(model, field, value):
    args = {"n_pairs": 4, "pos": 7, "steps": 3, "mlps": True, "edges": True, "logit_positions": None,
            "available": 10**12, field: value}
    with pytest.raises(CircuitkitError) as info:
        check_task_memory(model, args.pop("n_pairs"), args.pop("pos"), **args)
    message = str(info.value)
    assert "\n" not in message and (field in message or "available" in message)


def test_the_message_names_fewer_steps_or_no_edge_circuit_only_where_that_fits_every_pair(model):
    n, pos = 20, 12
    no_edges = plan(model, n, pos, edges=False).total
    assert no_edges < plan(model, n, pos).total  # here the edge passes are the peak
    with pytest.raises(CircuitkitError) as info:
        check_task_memory(model, n, pos, steps=3, mlps=True, edges=True, available=no_edges)
    message = str(info.value)
    assert "keep them all with edges=False (--quick)" in message and "steps=" not in message
    two_steps = plan(model, n, pos, steps=2, edges=False)
    assert two_steps.stage.startswith("EAP-IG") and two_steps.total < no_edges  # steps count without edges
    with pytest.raises(CircuitkitError) as info:
        check_task_memory(model, n, pos, steps=3, mlps=True, edges=False, available=two_steps.total)
    assert "keep them all with steps=2." in str(info.value)
    with pytest.raises(CircuitkitError) as info:  # no setting keeps every pair: none is offered
        check_task_memory(model, n, pos, steps=3, mlps=True, edges=True, available=plan(model, 5, pos).total)
    assert "keep them all" not in str(info.value) and "Use at most 5 pairs" in str(info.value)


def test_held_out_pairs_attribution_on_the_others_their_outputs_beside(model):
    split, discovery = plan(model, 12, 9, evaluation_pairs=4), plan(model, 8, 9)
    for name in ("EAP-IG pass", "EAP-IG pull-back", "edge patching"):
        assert split.stages[name] == discovery.stages[name], name
    assert split.resident == discovery.resident
    held_outputs = plan(model, 4, 9).resident["reference runs"]
    assert split.stages["held-out passes"] > held_outputs and "held-out passes" not in discovery.stages
    with pytest.raises(CircuitkitError, match="evaluation_pairs"):
        plan(model, 12, 9, evaluation_pairs=12)


class FirstPass(Exception):
    pass


def test_scan_task_counts_its_held_out_split(model, monkeypatch):
    """12 pairs: 6 held out by default. The check must use that split (with none, the same memory is refused)."""
    task, adapter, batch, K = toy_task_on(model, 12)
    split = plan(model, 12, batch.pos, evaluation_pairs=6, logit_positions=K).total
    assert plan(model, 12, batch.pos, logit_positions=K).total > split

    def stop(self, *args, **kwargs):
        raise FirstPass

    monkeypatch.setattr(type(adapter), "run", stop)
    monkeypatch.setattr(task_memory, "available_memory", lambda device: split)
    with pytest.raises(FirstPass):  # the check let it through: the first pass was reached
        scan_task(model, task)
    monkeypatch.setattr(task_memory, "available_memory", lambda device: split - 1)
    with pytest.raises(CircuitkitError, match="given 12 pairs"):
        scan_task(model, task)


def test_per_query_head_edges_count_the_group_copies_of_an_edge_pass(model):
    """``H / G`` copies of the pairs side by side in an edge pass, each with ``3 H`` query/key/value patches a layer;
    EAP-IG's pass keeps each layer's pattern and ``z`` for the split by query head with their gradients, and its
    key/value gradients are per query head; everything else as the grouped graph; and the scan checks the graph it
    will run."""
    grouped = plan(model, 5, 7)
    per_query = plan(model, 5, 7, kv_edges="per-query-head")
    assert per_query.resident == grouped.resident
    assert {k: v for k, v in per_query.stages.items() if "edge" not in k and "held" not in k
            and "EAP-IG" not in k} == {k: v for k, v in grouped.stages.items() if "edge" not in k
                                       and "held" not in k and "EAP-IG" not in k}
    N, P, e, m = 5, 7, 4, model.cfg.d_mlp
    S, dh = 3, DH  # plan()'s steps
    assert per_query.stages["EAP-IG pass"] - grouped.stages["EAP-IG pass"] == S * N * P * L * (2 * H * P + H * dh) * e
    assert per_query.stages["EAP-IG pull-back"] - grouped.stages["EAP-IG pull-back"] == (
        2 * S * N * P * L * 2 * (H - G) * dh * e)
    U = 1 + L * H + L
    C = task_memory.copies_per_pass(N * P * D * 4 * U, task_memory.SENDER_BUDGET,
                                    max_copies=min(task_memory.MAX_COPIES, task_memory.MAX_SETS))
    one = C * N * P * ((U + U // 2 + 3 * H) * D * e + 3 * 4 * H * D + (11 * m * e) // 10) + C * N * V * (P * e + 8)
    assert per_query.stages["edge patching"] == (H // G) * one > grouped.stages["edge patching"]
    with pytest.raises(CircuitkitError, match="kv_edges"):
        plan(model, 5, 7, kv_edges="per-head")


def test_scan_task_checks_the_per_query_head_graphs_memory(model, monkeypatch):
    task, adapter, batch, K = toy_task_on(model, 12)
    grouped = plan(model, 12, batch.pos, evaluation_pairs=6, logit_positions=K).total
    monkeypatch.setattr(task_memory, "available_memory", lambda device: grouped)
    with pytest.raises(CircuitkitError, match="given 12 pairs"):
        scan_task(model, task, kv_edges="per-query-head")


def test_neuron_groups_count_their_activations_in_both_runs_and_in_eap_ig(model):
    """A further node type ``w`` wide per token and layer adds ``2 N P L w e`` to the reference runs' outputs and
    ``3 S N P L w e`` to the EAP-IG pass; nothing else changes. Neuron groups read the MLP's hidden activation:
    ``w = d_mlp``; a residual-stream type ``d_model``."""
    from circuitkit.graph.nodes import NodeType, neuron_groups

    N, P, S, e, m = 5, 7, 3, 4, model.cfg.d_mlp
    adapter = adapt(model)
    resid = NodeType("resid", lambda spec: 1, lambda layer, i: f"r{layer}",
                     lambda layer: f"blocks.{layer}.hook_resid_pre", "its residual stream replaced")
    assert task_memory.node_widths(adapter, (neuron_groups(4), resid)) == (m, D)
    plain, neurons = plan(model, N, P, steps=S), plan(model, N, P, steps=S, node_widths=(m,))
    assert neurons.resident["reference runs"] - plain.resident["reference runs"] == 2 * N * P * L * m * e
    assert neurons.stages["EAP-IG pass"] - plain.stages["EAP-IG pass"] == 3 * S * N * P * L * m * e
    assert {k: v for k, v in neurons.stages.items() if k != "EAP-IG pass"} == {
        k: v for k, v in plain.stages.items() if k != "EAP-IG pass"}
    with pytest.raises(CircuitkitError, match="node_widths"):
        plan(model, N, P, node_widths=(-1,))


def test_scan_task_counts_its_neuron_groups(model, monkeypatch):
    """The check before the first pass sees the neuron groups: memory that fits the scan without them refuses it
    with them."""
    task, adapter, batch, K = toy_task_on(model, 12)
    without = plan(model, 12, batch.pos, evaluation_pairs=6, logit_positions=K, mlps=True).total
    monkeypatch.setattr(task_memory, "available_memory", lambda device: without)
    with pytest.raises(CircuitkitError, match="given 12 pairs"):
        scan_task(model, task, neuron_groups=4)

    def stop(self, *args, **kwargs):
        raise FirstPass

    monkeypatch.setattr(type(adapter), "run", stop)
    with pytest.raises(FirstPass):  # the same memory lets the scan without neuron groups through
        scan_task(model, task)


def test_the_sender_budget_is_the_floor_on_the_cpu_and_a_share_of_a_gpus_free_memory():
    from circuitkit.graph.runner import GPU_SENDER_SHARE, MAX_SENDER_BUDGET, SENDER_BUDGET, sender_budget

    gib = 2**30
    assert sender_budget("cpu", 500 * gib) == SENDER_BUDGET  # the CPU keeps its passes as they were
    assert sender_budget("cuda", None) == SENDER_BUDGET  # free memory unknown
    assert sender_budget("cuda", 4 * gib) == SENDER_BUDGET  # never below the floor
    assert sender_budget("cuda:0", 139 * gib) == 139 * gib // GPU_SENDER_SHARE
    assert sender_budget("cuda", 10_000 * gib) == MAX_SENDER_BUDGET
    for device, available in (("nowhere", gib), (3, gib), ("cuda", -1), ("cuda", 1.5), ("cuda", True)):
        with pytest.raises(CircuitkitError) as info:
            sender_budget(device, available)
        assert "\n" not in str(info.value) and "sender_budget" in str(info.value)


@pytest.mark.parametrize("budget", [0, -1, 1.5, True, "1GiB"])
def test_a_bad_budget_is_refused_in_one_line(model, budget):
    from circuitkit.graph.runner import TaskRunner

    task = Task.from_pairs(toy_pairs(4), name="toy")
    adapter = adapt(model)
    with pytest.raises(CircuitkitError, match="budget") as info:
        TaskRunner(adapter, task.tokenize(adapter), "logit_diff", mlps=True, ablation="corrupted", budget=budget)
    assert "\n" not in str(info.value)
    with pytest.raises(CircuitkitError, match="budget"):
        plan(model, 4, 7, budget=budget)


def test_a_wider_budget_is_used_where_its_estimate_fits_else_the_floor(model, monkeypatch):
    """On a GPU with room the check returns the wider budget (its edge stage counted with more copies); where only
    the floor's estimate fits, the floor, and no refusal."""
    n, pos = 40, 12
    monkeypatch.setattr(task_memory, "SENDER_BUDGET", 1)  # the floor: one copy a pass
    narrow = plan(model, n, pos, budget=1)
    wide_budget = 64 * narrow.stages["edge patching"]  # room for every copy the edge search stacks
    wide = plan(model, n, pos, budget=wide_budget)
    assert wide.stages["edge patching"] > narrow.stages["edge patching"] and wide.total > narrow.total
    monkeypatch.setattr(task_memory, "sender_budget", lambda device, available: wide_budget)
    found = check_task_memory(model, n, pos, steps=3, mlps=True, edges=True, available=wide.total)
    assert found.budget == wide_budget and found.total == wide.total
    found = check_task_memory(model, n, pos, steps=3, mlps=True, edges=True, available=wide.total - 1)
    assert found.budget == 1 and found.total == narrow.total
    with pytest.raises(CircuitkitError, match=f"given {n} pairs"):
        check_task_memory(model, n, pos, steps=3, mlps=True, edges=True, available=narrow.total - 1)


def test_scan_task_runs_its_patching_with_the_budget_the_memory_plan_chose(model, monkeypatch):
    """Wider passes are the same measurements in fewer passes: every figure equal (to float rounding: the stacked
    batch is wider), the edge passes fewer."""
    import circuitkit.graph.runner as graph

    task = Task.from_pairs(toy_pairs(12), name="toy")
    calls = {"n": 0}
    edge_pass = graph.TaskRunner._edge_pass

    def counted(self, *args, **kwargs):
        calls["n"] += 1
        return edge_pass(self, *args, **kwargs)

    monkeypatch.setattr(graph.TaskRunner, "_edge_pass", counted)
    monkeypatch.setattr(graph, "SENDER_BUDGET", 1)  # one copy a pass: the floor of a model this small
    monkeypatch.setattr(task_memory, "SENDER_BUDGET", 1)
    narrow = scan_task(model, task, n_resamples=10)
    narrow_calls, calls["n"] = calls["n"], 0
    monkeypatch.setattr(task_memory, "sender_budget", lambda device, available: 2**30)
    wide = scan_task(model, task, n_resamples=10)
    assert calls["n"] < narrow_calls
    a, b = narrow.circuit, wide.circuit
    assert a.heads == b.heads and a.edges == b.edges and narrow.passes == pytest.approx(wide.passes, abs=1e-9)
    assert b.edge_faithfulness == pytest.approx(a.edge_faithfulness, abs=1e-5)
    assert [p.faithfulness for p in b.edge_curve] == pytest.approx([p.faithfulness for p in a.edge_curve], abs=1e-5)


def test_the_held_out_runner_and_the_stability_reruns_share_the_head_weights(model, monkeypatch):
    """The plan counts one float32 copy of the head weights; the scan reads them once, however many runners it
    builds (measured on an H200 before: two copies, 10 GiB at the 8B shape, where the plan counted 5): its runners
    share one session, which holds what they read of the model (the weights, the receivers' norms)."""
    from circuitkit.circuits._engine import context
    from circuitkit.detect import RepeatedTokens
    from circuitkit.detect.session import Session, open_session
    from circuitkit.graph import pullback
    from circuitkit.graph.runner import TaskRunner
    from circuitkit.models.adapters import ModelAdapter

    reads, norms = {"n": 0}, {"n": 0}
    read, read_norms = ModelAdapter.weights, pullback.receiver_norms

    def counted(self, *args, **kwargs):
        reads["n"] += 1
        return read(self, *args, **kwargs)

    def counted_norms(adapter):
        norms["n"] += 1
        return read_norms(adapter)

    monkeypatch.setattr(ModelAdapter, "weights", counted)
    monkeypatch.setattr(pullback, "receiver_norms", counted_norms)
    task = Task.from_pairs(toy_pairs(12), name="toy")
    scan_task(model, task, n_resamples=10, stability=2, edges=False)  # two runners and two reruns
    assert reads["n"] == 1 and norms["n"] == 1
    adapter = adapt(model)
    batch = task.tokenize(adapter)
    first = TaskRunner(adapter, batch, "logit_diff", mlps=True, ablation="corrupted")
    second = TaskRunner(first.session, batch, "logit_diff", mlps=True, ablation="corrupted")
    assert first.session is second.session and first.session.batch is None
    assert second.W_Q.data_ptr() == first.W_Q.data_ptr() and second.W_O.data_ptr() == first.W_O.data_ptr()
    assert second.norms is first.norms
    # a runner given an adapter opens a session of its own: the weights are read again
    third = TaskRunner(adapter, batch, "logit_diff", mlps=True, ablation="corrupted")
    assert third.session is not first.session and third.W_Q.data_ptr() != first.W_Q.data_ptr()
    # path patching's context on a session reads the model as a runner on it does: the same tensors
    session = open_session(model, RepeatedTokens(batch=2, block_len=4))
    ctx = context(session, None, "resample", 0, None, "test")
    on_it = TaskRunner(session, batch, "logit_diff", mlps=True, ablation="corrupted")
    assert ctx.W_O is on_it.W_O and ctx.W_in["k"] is on_it.W_K and ctx.norms is on_it.norms
    # a task's session has no token batch: the induction measurements refuse it, saying so
    with pytest.raises(CircuitkitError, match="a session on a token batch"):
        open_session(first.session)
    with pytest.raises(CircuitkitError, match="a session on a token batch"):
        Session(adapter, None).clean_run()


def test_a_large_vocabulary_stacks_fewer_copies_by_one_rule_in_the_runner_and_the_plan():
    """A stacked copy of a node-patching (or exact edge) pass holds its logits at the positions it reads: with a large
    vocabulary and a metric of every scored position they are most of it. The runner sizes its stacked copies by
    the whole copy (``node_copy_bytes``: the plan's node-patching term, checked here by hand), so it stacks fewer
    than the activations alone would allow, and the memory plan counts the copies the runner stacks: a scan that
    fits with fewer copies is not refused for stacking 32 (the repeated-tokens task on Qwen2.5-0.5B, 16 pairs of
    40 tokens, was planned at 13.4 GiB, 25.1 where a model computes every position's logits, most of it 32 stacked
    copies of the held-out passes' logits; now 5.5 and 6.9)."""
    from circuitkit.graph.runner import MAX_COPIES, TaskRunner, node_copy_bytes
    from circuitkit.tasks import repeated_tokens

    V, budget = 6000, 2**24
    big = boot_bridge(attn_only=False, n_layers=2, n_heads=H, d_model=D, d_head=DH, d_vocab=V, seed=3)
    adapter = adapt(big)
    task = repeated_tokens(big, 6, block_len=5)
    runner = TaskRunner(adapter, task.tokenize(adapter), task.metric, mlps=True, ablation=task.ablation,
                        budget=budget)
    N, P = runner.batch.clean.shape
    K = len(runner.positions)
    assert runner.scored_metric and K > 1
    m, e = big.cfg.d_mlp, 4
    by_hand = N * P * (3 * m + 4 * D + 3 * H * P) * e + N * V * (K * e + 8 * K)
    assert node_copy_bytes(adapter, N, P, K, K) == by_hand
    copies = runner._copies_per_pass(node=True)
    assert copies == max(1, min(MAX_COPIES, budget // by_hand)) < MAX_COPIES
    assert budget // (N * P * D * 4) >= MAX_COPIES  # the activations alone would have stacked 32
    # the plan: the exact edge effects' copies as the runner stacks them, at most the 8 edges measured
    est = estimate_task_memory(big, N, P, steps=3, mlps=True, edges=True, logit_positions=K, scored_metric=True,
                               budget=budget)
    C = max(1, min(8, budget // by_hand))
    assert est.stages["exact edge effects"] == C * (by_hand + 4 * N * P * D * e)
    # and the passes give what one copy at a time gives
    L = 2
    sets = torch.rand(7, L, H, generator=torch.Generator().manual_seed(0)) < 0.5
    stacked = runner.node_metric(sets, None)
    alone = torch.cat([runner.node_metric(sets[i : i + 1], None) for i in range(len(sets))])
    torch.testing.assert_close(stacked, alone, rtol=0, atol=1e-5)
