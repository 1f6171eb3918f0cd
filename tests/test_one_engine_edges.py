"""Path patching (``circuits.path_patching``, the induction scan's edges) and the graph engine's edge patching
(``graph.runner.TaskRunner``) measure the same thing: on the same sequences and the same resampled corruption,
each edge between two heads patched alone has the same effect on the loss of the repeated copies, per sequence
too, on every channel and on the three at once.

The model has what makes the two engines' passes differ most: grouped-query attention (path patching patches the
receiver's key/value group and puts the group's other query heads' clean ``z`` back; the runner gives each query
head its own key/value input), LayerNorm in front of every receiver and MLPs between the layers (recomputed from
the patched stream by both). ``circuits/`` stands above the graph engine in the layers, so path patching may call
the runner; this test is what such a merge keeps equal. So are their estimates: edge attribution (the induction
scan's, integrated on the inputs path) and the runner's EAP-IG give every head edge the same score where they take
their gradients at the same points.
"""

from __future__ import annotations

import pytest
import torch

from circuitkit.circuits import edge_attribution, path_patching
from circuitkit.detect.tokens import RepeatedTokens
from circuitkit.graph.runner import TaskRunner
from circuitkit.models.adapters import adapt
from circuitkit.tasks import repeated_tokens
from tests.conftest import gqa_bridge

EXACT = 1e-5
N, BLOCK, SEED, CORRUPT_SEED = 6, 5, 2, 1


def _task(model):
    """The repeated-tokens task on the sequences and corruption every test here measures: the induction batch of
    ``RepeatedTokens(block_len=BLOCK, batch=N, seed=SEED)`` resampled with ``CORRUPT_SEED``, nodes patched to their
    corrupted values."""
    return repeated_tokens(model, N, seed=SEED, block_len=BLOCK, corrupt_seed=CORRUPT_SEED, ablation="corrupted")


@pytest.fixture(scope="module")
def engines():
    model = gqa_bridge()
    adapter = adapt(model)
    task = _task(model)
    runner = TaskRunner(adapter, task.tokenize(adapter), task.metric, mlps=False, ablation=task.ablation,
                        kv_edges="per-query-head")
    return model, runner


def _edges(spec):
    """Every edge between two heads of different layers, on each channel, and a few on the three at once."""
    L, H = spec.n_layers, spec.n_heads
    edges = [((l1, h1), (l2, h2), c) for l1 in range(L) for h1 in range(H) for l2 in range(l1 + 1, L)
             for h2 in range(H) for c in "qkv"]
    return edges + [((0, 1), (1, 2), "all"), ((0, 3), (2, 0), "all"), ((1, 0), (2, 3), "all")]


def _head_edge_scores(scores: torch.Tensor, attributed, runner) -> tuple[list, torch.Tensor, torch.Tensor]:
    """Every head-to-head edge on one channel (:func:`_edges`), edge attribution's score of each (``attributed``)
    and the runner's (``scores`` ``[sender, receiver]``): ``(edges, induction engine's, runner's)``."""
    graph = runner.graph
    edges = [e for e in _edges(runner.spec) if e[2] != "all"]
    ours = torch.tensor([attributed.value(src, dst, c) for src, dst, c in edges])
    theirs = torch.stack([scores[graph.sender_index(*src), graph.receivers.index(f"{dst[0]}.{dst[1]}:{c}")]
                          for src, dst, c in edges])
    return edges, ours, theirs


def test_every_head_edge_has_the_same_effect_on_both_engines(engines):
    model, runner = engines
    spec = runner.spec
    assert spec.n_kv_heads < spec.n_heads and not runner.adapter.attn_only  # the model the docstring names
    edges = _edges(spec)
    patched = path_patching(model, edges, metric="loss", corrupt="resample", corrupt_seed=CORRUPT_SEED,
                            tokens=RepeatedTokens(block_len=BLOCK, batch=N, seed=SEED))
    graph = runner.graph
    kept = graph.allowed[None].repeat(len(edges), 1, 1)
    for i, (src, dst, channel) in enumerate(edges):
        for c in ("qkv" if channel == "all" else channel):
            kept[i, graph.sender_index(*src), graph.receivers.index(f"{dst[0]}.{dst[1]}:{c}")] = False
    per_pair: list[torch.Tensor] = []
    means = runner.edge_metric(kept, pairs=per_pair)
    per_pair_t = torch.cat(per_pair)  # [edge, sequence]: the next token's log-probability on the copies
    clean = runner.clean["metric"].float().cpu()
    # the runner's metric is minus the loss on the copies (more behaviour scores higher): effect = loss lost
    for i, e in enumerate(patched.edges):
        assert e.clean == pytest.approx(-float(clean.mean()), abs=EXACT)
        assert e.effect == pytest.approx(float(clean.mean() - means[i]), abs=EXACT), e.name
        torch.testing.assert_close(e.patched_each.float(), -per_pair_t[i], atol=EXACT, rtol=0)
    assert max(abs(e.effect) for e in patched.edges) > 100 * EXACT  # edges that do something, not all zeros


@pytest.mark.parametrize("corrupt", ["resample", "mean"])
@pytest.mark.parametrize("steps", [1, 2, 4])
def test_edge_attribution_and_the_runners_eap_ig_give_every_head_edge_the_same_score(engines, steps, corrupt):
    """Both average ``delta_s . dM/d(input of r)`` over the points ``alpha = k / steps``, ``k = 1 .. steps``, of the
    straight path from the corrupted to the clean input embeddings (the runner's ``points="right"``): the induction
    engine with one clean pass (``k = steps``) and a pass per further point, the runner with the points stacked in
    one pass. Path patching's sign convention (``delta = corrupted - clean``, the loss) and the runner's (``clean -
    corrupted``, minus the loss) give the same number. Under the batch-mean corruption (each sender's and the input
    embeddings' clean mean at each position: the runner's :meth:`~circuitkit.graph.runner.TaskRunner.corrupt_by_mean`)
    as under the resampled prompts."""
    model, runner = engines
    if corrupt == "mean":  # a runner of its own: the fixture's keeps its corrupted prompts' run
        task = _task(model)
        runner = TaskRunner(runner.adapter, runner.batch, task.metric, mlps=False, ablation=task.ablation,
                            kv_edges="per-query-head")
        runner.corrupt_by_mean()
    scores, _, _ = runner.attribute(steps, "right")
    attributed = edge_attribution(model, metric="loss", corrupt=corrupt, corrupt_seed=CORRUPT_SEED,
                                  tokens=RepeatedTokens(block_len=BLOCK, batch=N, seed=SEED), steps=steps)
    _, ours, theirs = _head_edge_scores(scores, attributed, runner)
    torch.testing.assert_close(ours, theirs, atol=1e-7, rtol=1e-4)
    assert float(ours.abs().max()) > 1e-3  # scores that are not all zeros


def test_a_single_edge_pass_resumed_at_the_receivers_layer_agrees(engines):
    """The runner's exact single-edge effects against path patching, channel by channel: both run the one edge
    pass (``graph/edge_patch``), so what this checks is what each gives it (the sender's delta: path patching's from
    the corrupted ``z`` in float32, the runner's from its reference runs; the receiver a graph index names) and the
    metric each reads. The pass itself is checked against the mask pass above and in tests/test_task_passes.py."""
    model, runner = engines
    graph = runner.graph
    edges = [e for e in _edges(runner.spec) if e[2] != "all"][::5]
    index = torch.tensor([[graph.sender_index(*src), graph.receivers.index(f"{dst[0]}.{dst[1]}:{c}")]
                          for src, dst, c in edges])
    single = runner.single_edge_metric(index)
    patched = path_patching(model, edges, metric="loss", corrupt="resample", corrupt_seed=CORRUPT_SEED,
                            tokens=RepeatedTokens(block_len=BLOCK, batch=N, seed=SEED))
    clean = float(runner.clean["metric"].float().mean())
    for e, value in zip(patched.edges, single.tolist(), strict=True):
        assert e.effect == pytest.approx(clean - value, abs=EXACT), e.name


def test_a_runs_outputs_are_its_z_through_w_o_and_a_range_outside_the_senders_is_refused(engines):
    """``TaskRunner.outputs`` against a dense oracle (each head's ``z[:, :, h] @ W_O[l, h]`` from the model's own
    weights, the embeddings first), whole and by ranges that cut through a layer's heads."""
    from circuitkit import CircuitkitError

    model, runner = engines
    graph, run = runner.graph, runner.clean
    W_O = runner.adapter.weights(embeddings=False).W_O
    dense = [run["input"]] + [run["z"][layer][:, :, h] @ W_O[layer, h].to(run["z"][layer].dtype)
                              for layer in range(runner.spec.n_layers) for h in range(runner.spec.n_heads)]
    dense = torch.stack(dense)
    torch.testing.assert_close(runner.outputs(run), dense, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(runner.outputs(run, 3, 7), dense[3:7], atol=1e-5, rtol=1e-5)
    for first, stop in ((0, 0), (5, 3), (-1, 2), (0, len(graph.senders) + 1), (1.0, 2)):
        with pytest.raises(CircuitkitError, match="TaskRunner.outputs"):
            runner.outputs(run, first, stop)


def test_each_engine_measures_the_edges_the_other_names(engines):
    """Path patching's strongest edges, handed to the task engine's :func:`circuitkit.tasks.edge_effects` as its
    records, as their names (``"0.1 -> 1.3 (k)"``) and as the induction scan's answer prints them (``"0.1 → 1.3
    K"``), have the effects path patching gave them; the task engine's records and names (``"0.1->1.3:k"``) handed
    back to path patching give the same again."""
    from circuitkit.tasks import edge_effects

    model, runner = engines
    tokens = RepeatedTokens(block_len=BLOCK, batch=N, seed=SEED)
    task = _task(model)
    edges = [e for e in _edges(runner.spec) if e[2] != "all"]
    top = path_patching(model, edges, metric="loss", corrupt="resample", corrupt_seed=CORRUPT_SEED,
                        tokens=tokens).top(5)
    by_record = edge_effects(model, task, top, kv_edges="per-query-head", progress=False)
    by_name = edge_effects(model, task, [e.name for e in top], kv_edges="per-query-head", progress=False)
    printed = [f"{e.src[0]}.{e.src[1]} \u2192 {e.dst[0]}.{e.dst[1]} {e.channel.upper()}" for e in top]  # the answer's
    assert [e.effect for e in edge_effects(model, task, printed, kv_edges="per-query-head", progress=False)] == [
        e.effect for e in by_name]
    assert [e.name for e in by_record] == [f"{e.src[0]}.{e.src[1]}->{e.dst[0]}.{e.dst[1]}:{e.channel}" for e in top]
    assert [e.name for e in by_name] == [e.name for e in by_record]
    back = path_patching(model, [e.name for e in by_record], metric="loss", corrupt="resample",
                         corrupt_seed=CORRUPT_SEED, tokens=tokens)
    records = path_patching(model, by_record, metric="loss", corrupt="resample", corrupt_seed=CORRUPT_SEED,
                            tokens=tokens)  # the task engine's records themselves
    assert records.edges == back.edges
    for ours, record, named, again in zip(top, by_record, by_name, back.edges, strict=True):
        assert record.effect == pytest.approx(ours.effect, abs=EXACT), ours.name
        assert named.effect == record.effect
        assert (again.src, again.dst, again.channel, again.effect) == (ours.src, ours.dst, ours.channel, ours.effect)
    alone = path_patching(model, by_record[0].name, metric="loss", corrupt="resample", corrupt_seed=CORRUPT_SEED,
                          tokens=tokens)  # one name alone is a list of one
    assert alone.edges == back.edges[:1]
    assert abs(top[0].effect) > 100 * EXACT


@pytest.mark.parametrize("edge, message", [
    ("0.1 -> 1.3 (all)", "one input of the receiving head"),
    ("0.1 -> 1.3", "one input of the receiving head"),
    ("0.1 -> m1 (k)", "as a task scan names it.*as path patching prints it"),
    # a key receiver of a grouped-query model is its group's: refused naming what was given and the graph's name
    ("0.1 -> 1.3 (k)", r"given '0\.1 -> 1\.3 \(k\)' \(in the task graph '0\.1->1\.3:k'\); expected a receiver"),
])
def test_the_task_engine_refuses_a_head_edge_it_cannot_measure_alone(engines, edge, message):
    from circuitkit import CircuitkitError
    from circuitkit.tasks import edge_effects

    model, _ = engines
    task = _task(model)
    with pytest.raises(CircuitkitError, match=message):
        edge_effects(model, task, [edge], progress=False)


@pytest.mark.parametrize("edge", ["input->1.0:q", "0.1->m1", "1.0->logits", "0.1->1.g0:k"])
def test_path_patching_names_the_task_graphs_other_nodes_as_the_task_engines(engines, edge):
    from circuitkit import CircuitkitError

    model, _ = engines
    with pytest.raises(CircuitkitError, match="tasks.edge_effects measures it"):
        path_patching(model, [edge], tokens=RepeatedTokens(block_len=BLOCK, batch=N, seed=SEED))


def test_both_engines_give_one_record_of_an_exactly_patched_edge(engines):
    """Path patching and the task engine return the same record, :class:`circuitkit.EdgeEffect`, for the same edge:
    the task graph's name, the same effect (the behaviour lost) and interval over the same sequences, and each its own
    metric's ``clean`` and ``patched`` means (the loss on the copies; the task's next-token log-probability, minus
    it), of which the effect is the difference in the direction the behaviour is lost. An edge between two heads reads
    its heads back; one from the input or into an MLP or the logits has none, and path patching refuses its record
    with the same words as its name."""
    import circuitkit as ck
    from circuitkit import CircuitkitError
    from circuitkit.tasks import edge_effects

    model, _ = engines
    tokens = RepeatedTokens(block_len=BLOCK, batch=N, seed=SEED)
    task = _task(model)
    assert ck.EdgeEffect is ck.tasks.EdgeEffect is ck.circuits.EdgeEffect
    names = ["0.1->1.3:k", "0.2->2.0:q", "1.0->2.3:v"]
    ours = path_patching(model, names, metric="loss", corrupt="resample", corrupt_seed=CORRUPT_SEED,
                         tokens=tokens).edges
    theirs = edge_effects(model, task, names, kv_edges="per-query-head", progress=False)
    for a, b, name in zip(ours, theirs, names, strict=True):
        assert type(a) is type(b) is ck.EdgeEffect and a.name == b.name == name
        assert a.to_json().keys() == b.to_json().keys() == {"edge", "score", "clean", "patched", "effect", "ci"}
        assert a.effect == pytest.approx(b.effect, abs=EXACT)
        assert a.effect == a.patched - a.clean and b.effect == pytest.approx(b.clean - b.patched, abs=1e-12)
        assert (a.clean, a.patched) == pytest.approx((-b.clean, -b.patched), abs=EXACT)
        torch.testing.assert_close(a.each.double(), b.each.double(), atol=EXACT, rtol=0)  # per sequence, too
        assert a.interval == pytest.approx(b.interval, abs=EXACT)
        assert (a.src, a.dst, a.channel) == (b.src, b.dst, b.channel) != (None, None, None)
    assert ours[0].label == "0.1 -> 1.3 (k)" and max(abs(e.effect) for e in ours) > 100 * EXACT
    other = edge_effects(model, task, ["input->1.0:q"], kv_edges="per-query-head", progress=False)[0]
    assert (other.src, other.dst, other.channel, other.label) == (None, (1, 0), "q", "input->1.0:q")
    assert ck.EdgeEffect("m1->logits", None, 0.5).key == (None, None, None)
    with pytest.raises(CircuitkitError, match="tasks.edge_effects measures it"):
        path_patching(model, [other], tokens=tokens)


def test_the_batch_mean_corruption_is_the_same_in_both_engines(engines):
    """``corrupt="mean"``: each sender patched to its clean output's mean over the sequences (pairs) at each
    position. The task engine (``tasks.edge_effects``, its runner's corrupted run replaced by those means) gives
    every head edge path patching's effect under the same corruption, each sequence's too, and other effects than
    its corrupted prompts give; the corrupted prompts are not read. One pair has no mean to patch to: refused."""
    from dataclasses import replace

    from circuitkit import CircuitkitError
    from circuitkit.tasks import Pair, edge_effects

    model, _ = engines
    tokens = RepeatedTokens(block_len=BLOCK, batch=N, seed=SEED)
    task = _task(model)
    names = ["0.1->1.3:k", "0.2->2.0:q", "1.0->2.3:v", "0.0->1.1:q", "0.3->2.2:v"]
    ours = path_patching(model, names, corrupt="mean", tokens=tokens).edges
    theirs = edge_effects(model, task, names, corrupt="mean", kv_edges="per-query-head", progress=False)
    for a, b in zip(ours, theirs, strict=True):
        assert b.effect == pytest.approx(a.effect, abs=EXACT), a.name
        torch.testing.assert_close(b.each.double(), a.each.double(), atol=EXACT, rtol=0)
    prompts = edge_effects(model, task, names, kv_edges="per-query-head", progress=False)
    assert max(abs(p.effect - b.effect) for p, b in zip(prompts, theirs, strict=True)) > 100 * EXACT
    # other corrupted prompts: the mean corruption does not read them
    scrambled = replace(task, pairs=tuple(Pair(p.clean, p.clean[::-1], p.answers, p.wrongs) for p in task.pairs))
    again = edge_effects(model, scrambled, names, corrupt="mean", kv_edges="per-query-head", progress=False)
    assert [e.effect for e in again] == [e.effect for e in theirs]
    with pytest.raises(CircuitkitError, match="at least 2 pairs for corrupt='mean'"):
        edge_effects(model, replace(task, pairs=task.pairs[:1], scored=task.scored[:1]), names[:1], corrupt="mean",
                     progress=False)


def _copies_logprob(scored: torch.Tensor):
    """A researcher's metric of the logits at every position, written here by hand: each pair's mean
    log-probability of the next token at the positions ``scored`` ``[pair, pos]`` marks (the repeated copies), as
    the task engine's runner calls it (``[pair, pos, vocab]`` -> ``[pair]``)."""

    def copies_logprob(logits: torch.Tensor, batch) -> torch.Tensor:
        logprobs = logits.float().log_softmax(-1)[:, :-1]
        tokens = batch.clean if hasattr(batch, "clean") else batch.tokens
        picked = logprobs.gather(-1, tokens[:, 1:, None].to(logits.device))[..., 0]
        weight = scored[: logits.shape[0], :-1].to(logits.device, torch.float32)
        return (picked * weight).sum(-1) / weight.sum(-1)

    return copies_logprob


def test_a_metric_of_every_position_is_measured_alike_by_both_engines(engines):
    """A function of the logits at every position, the third thing ARCHITECTURE's list asks of the runner before
    edge attribution can be its EAP-IG: the runner with ``UserMetric(fn, reads="all")`` (each pair's value) and the
    induction engine's callable (minus their mean over the sequences, read as a loss) give every head edge the same
    EAP-IG score and every single-edge patch the same effect, and the runner's scores equal those of the registered
    metric the function rewrites (``next_token_logprob`` on the copies), so every position reached the function."""
    from circuitkit.tasks import UserMetric

    model, registered = engines
    spec, graph, batch = registered.spec, registered.graph, registered.batch
    fn = _copies_logprob(batch.scored)
    runner = TaskRunner(registered.adapter, batch, UserMetric(fn, reads="all"), mlps=False, ablation="corrupted",
                        kv_edges="per-query-head")
    assert runner.every_position_metric and len(runner.positions) == batch.pos
    torch.testing.assert_close(runner.clean["metric"], registered.clean["metric"], atol=1e-6, rtol=0)

    def as_loss(logits: torch.Tensor, tokens) -> torch.Tensor:  # the induction engine's callable: one scalar
        return -fn(logits, tokens).mean()

    tokens = RepeatedTokens(block_len=BLOCK, batch=N, seed=SEED)
    edges = [e for e in _edges(spec) if e[2] != "all"]
    at = [(graph.sender_index(*src), graph.receivers.index(f"{dst[0]}.{dst[1]}:{c}")) for src, dst, c in edges]
    scores, _, _ = runner.attribute(2, "right")
    theirs = torch.stack([scores[s, r] for s, r in at])
    attributed = edge_attribution(model, metric=as_loss, corrupt_seed=CORRUPT_SEED, tokens=tokens, steps=2)
    ours = torch.tensor([attributed.value(src, dst, c) for src, dst, c in edges])
    torch.testing.assert_close(ours, theirs, atol=1e-7, rtol=1e-4)
    registered_scores, _, _ = registered.attribute(2, "right")
    torch.testing.assert_close(theirs, torch.stack([registered_scores[s, r] for s, r in at]), atol=1e-7, rtol=1e-4)
    assert float(ours.abs().max()) > 1e-3

    single = runner.single_edge_metric(torch.tensor(at[::7]))
    patched = path_patching(model, edges[::7], metric=as_loss, corrupt_seed=CORRUPT_SEED, tokens=tokens)
    clean = float(runner.clean["metric"].float().mean())
    for e, value in zip(patched.edges, single.tolist(), strict=True):
        assert e.effect == pytest.approx(clean - value, abs=EXACT), e.name
    assert max(abs(e.effect) for e in patched.edges) > 100 * EXACT


@pytest.mark.parametrize("steps", [1, 3])
def test_a_receivers_own_induction_score_is_estimated_alike_by_both_engines(engines, steps):
    """The receiver-local metric, the second thing ARCHITECTURE's list asks of the runner: each receiver head's own
    induction score read from its pattern inside the pass, every head's ``z`` detached
    (``TaskRunner.attribute(local=...)``), against edge attribution's ``metric="induction"`` on the same sequences,
    corruption and points. Every query and key edge between two heads gets the same score (a grouped-query key's
    split by query head through the pattern), every value edge, MLP and logits edge 0."""
    from circuitkit.circuits.metrics import InductionReader
    from circuitkit.detect.tokens import TokenBatch

    model, runner = engines
    graph = runner.graph
    reader = InductionReader(TokenBatch(runner.batch.clean, BLOCK, 2, None), torch.float32)
    scores, _, _ = runner.attribute(steps, "right", local=reader)
    attributed = edge_attribution(model, metric="induction", corrupt_seed=CORRUPT_SEED,
                                  tokens=RepeatedTokens(block_len=BLOCK, batch=N, seed=SEED), steps=steps)
    edges, ours, theirs = _head_edge_scores(scores, attributed, runner)
    torch.testing.assert_close(ours, theirs, atol=1e-7, rtol=1e-4)
    on_keys = [i for i, e in enumerate(edges) if e[2] == "k"]
    assert float(theirs[on_keys].abs().max()) > 1e-3  # the keys carry the score: not all zeros
    values = [i for i, e in enumerate(edges) if e[2] == "v"]
    assert float(theirs[values].abs().max()) == 0.0
    heads_only = [r for r, name in enumerate(graph.receivers) if name.endswith((":q", ":k"))]
    rest = torch.ones(len(graph.receivers), dtype=torch.bool)
    rest[heads_only] = False
    assert float(scores[:, rest].abs().max()) == 0.0  # values, MLPs and the logits read no head's own score


def _tapped_clean_point(model, metric: str):
    """The gradient tap's record of the clean run (``ctx.clean``, what edge attribution's own clean pass or the
    scan's head attribution leaves) on the sequences every test here measures."""
    from circuitkit.circuits._engine import context
    from circuitkit.circuits.attribution import attribute
    from circuitkit.circuits.metrics import resolve_metric

    ctx = context(model, RepeatedTokens(block_len=BLOCK, batch=N, seed=SEED), "resample", CORRUPT_SEED, None, "test")
    attribute(ctx, resolve_metric(metric, "test"), steps=1)
    return ctx.clean


@pytest.mark.parametrize("metric", ["loss", "induction"])
@pytest.mark.parametrize("steps", [1, 3])
def test_the_runners_eap_ig_takes_its_clean_point_from_a_gradient_tap(engines, steps, metric):
    """The fourth thing ARCHITECTURE's list asked of the runner, the tap: its EAP-IG takes the clean point (alpha = 1)
    from another pass's gradient tap (``clean_point``, the tap's record: a loss's gradients, or the receivers' own
    scores') and stacks only the other points, and every head-to-head score is the one its own clean copy gives.
    Receivers the tap's graph does not reach (layer 0's, the logits) are NaN, not a partial sum, and so is every
    node score."""
    from circuitkit.circuits.metrics import InductionReader
    from circuitkit.detect.tokens import TokenBatch

    model, registered = engines
    task = _task(model)
    local = (InductionReader(TokenBatch(registered.batch.clean, BLOCK, 2, None), torch.float32)
             if metric == "induction" else None)
    point = _tapped_clean_point(model, metric)
    runners = [TaskRunner(registered.adapter, registered.batch, task.metric, mlps=False, ablation=task.ablation,
                          kv_edges="per-query-head") for _ in range(2)]
    own, _, _ = runners[0].attribute(steps, "right", local=local)
    tapped, nodes, _ = runners[1].attribute(steps, "right", local=local, clean_point=point)
    assert runners[1].passes == runners[0].passes - 3.0  # one forward and backward (counted 3) fewer
    graph = registered.graph
    heads = torch.zeros(len(graph.receivers), dtype=torch.bool)
    for (channel, layer), cols in graph.receiver_slices.items():
        heads[cols] = channel in "qkv" and layer >= 1
    torch.testing.assert_close(tapped[:, heads], own[:, heads], atol=1e-7, rtol=1e-4)
    assert float(own[:, heads].abs().max()) > 1e-3
    rest = graph.allowed[:, ~heads]
    assert bool(tapped[:, ~heads][rest].isnan().all()) and not bool(tapped[:, ~heads][~rest].isnan().any())
    assert bool(nodes.isnan().all())


def test_a_clean_point_the_runner_cannot_add_to_its_points_is_refused(engines):
    from circuitkit import CircuitkitError

    model, registered = engines
    task = _task(model)
    point = _tapped_clean_point(model, "loss")

    def runner(**kwargs):
        return TaskRunner(registered.adapter, registered.batch, task.metric, ablation=task.ablation,
                          kv_edges="per-query-head", **{"mlps": False, **kwargs})

    with pytest.raises(CircuitkitError, match="'right' with a clean_point"):
        runner().attribute(2, "left", clean_point=point)
    with pytest.raises(CircuitkitError, match="EdgeGradients"):
        runner().attribute(2, "right", clean_point={"q": 1})
    keeps = runner()
    keeps.keep_node_pairs = True
    with pytest.raises(CircuitkitError, match="each pair's term"):
        keeps.attribute(2, "right", clean_point=point)
    embedded = torch.zeros(N, registered.batch.pos, registered.spec.d_model)
    with pytest.raises(CircuitkitError, match="a runner of heads alone"):
        runner(mlps=True).adopt_runs((embedded, point.z), (embedded, point.z))
    with pytest.raises(CircuitkitError, match="z of every layer"):
        runner().adopt_runs((embedded, {0: point.z[0]}), (embedded, point.z))
