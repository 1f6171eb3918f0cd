"""Induction as a task on the task engine (``tasks.repeated_tokens``), and the one metric registry it reads.

Oracles: a loop over positions of ``log_softmax`` (the metric), the induction engine's own loss
(``detect.loss.stacked_losses``), the model's plain forward without hooks (each pair's metric), and on the bundled
model the induction scan itself: its circuit, measured by the task engine, has the same faithfulness and its
path-patched edges the same effects; the task's own search finds another circuit for a measured reason (its
EAP-IG node ranking puts the four layer-1 heads first).
"""

from __future__ import annotations

import json

import pytest
import torch

import circuitkit as ck
from circuitkit import CircuitkitError
from circuitkit.circuits.curve import faithfulness_of
from circuitkit.detect.corrupt import resampled_batch
from circuitkit.detect.loss import stacked_losses
from circuitkit.detect.tokens import RepeatedTokens
from circuitkit.graph.metrics import METRICS
from circuitkit.graph.runner import TaskRunner
from circuitkit.graph.task import METRIC_NAMES
from circuitkit.handbuilt.induction import induction_circuit
from circuitkit.metric_registry import REGISTRY, next_token_logprob, repeated_copies_loss
from circuitkit.models.adapters import adapt
from circuitkit.tasks import Task, TaskScan, repeated_tokens, scan_task

EXACT = 1e-5


def _loop_logprob(logits, targets, scored):
    """The mean of log_softmax(logits)[target] over the scored entries, one example at a time."""
    lp = logits.double().log_softmax(-1)
    out = torch.zeros(logits.shape[:-2], dtype=torch.float64)
    for index in torch.cartesian_prod(*[torch.arange(n) for n in logits.shape[:-2]]).reshape(-1, logits.dim() - 2):
        *lead, b = index.tolist()
        picked = [lp[(*lead, b, j, int(targets[b, j]))] for j in range(targets.shape[1]) if scored[b, j]]
        out[(*lead, b)] = sum(picked) / len(picked)
    return out


def test_the_registry_is_the_task_metrics_and_names_them_all():
    assert tuple(REGISTRY) == METRIC_NAMES
    assert METRICS == {name: m.fn for name, m in REGISTRY.items()}
    assert {m.reads for m in REGISTRY.values()} == {"last", "scored"}


def test_next_token_logprob_against_a_loop():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 5, 11, generator=g)
    targets = torch.randint(0, 11, (3, 5), generator=g)
    scored = torch.rand(3, 5, generator=g) < 0.5
    scored[:, 0] = True
    got = next_token_logprob(logits, targets, scored)
    assert got.shape == (2, 3) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), _loop_logprob(logits, targets, scored), atol=1e-5, rtol=0)


def test_next_token_logprob_refuses_an_example_with_nothing_scored_and_bad_shapes():
    logits = torch.zeros(2, 3, 4)
    with pytest.raises(CircuitkitError, match="no scored position"):
        next_token_logprob(logits, torch.zeros(2, 3, dtype=torch.long), torch.tensor([[True] * 3, [False] * 3]))
    with pytest.raises(CircuitkitError, match="shapes"):
        next_token_logprob(logits, torch.zeros(2, 2, dtype=torch.long), torch.ones(2, 2, dtype=torch.bool))


@pytest.mark.parametrize("at_positions", [False, True])
def test_the_induction_loss_read_from_the_registry_is_the_induction_engines(at_positions):
    model = induction_circuit(10, 16).model
    batch = RepeatedTokens(batch=3, block_len=5, seed=2).build(model)
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 3, batch.tokens.shape[1], 10, generator=g)
    if at_positions:
        logits = logits[:, :, batch.repeated_copies.nonzero().flatten()]
    per_sequence = repeated_copies_loss(logits, batch.tokens, batch.repeated_copies)  # [copies, batch]
    stacked = stacked_losses(logits.flatten(0, 1), batch.tokens.repeat(2, 1), batch, 2)
    torch.testing.assert_close(per_sequence.mean(-1), stacked, atol=1e-5, rtol=0)
    from circuitkit.circuits.metrics import repeated_losses

    torch.testing.assert_close(repeated_losses(logits, batch), stacked, atol=1e-5, rtol=0)


def test_the_generator_is_the_induction_scans_batch_and_its_resampled_copies():
    model = induction_circuit(10, 16).model
    task = repeated_tokens(model, 4, seed=3, block_len=5)
    batch = RepeatedTokens(batch=4, block_len=5, seed=3).build(model)
    corrupted = resampled_batch(batch, 1)
    assert [list(p.clean) for p in task.pairs] == batch.tokens.tolist()
    assert [list(p.corrupted) for p in task.pairs] == corrupted.tokens.tolist()
    assert task.scored == (tuple(batch.repeated_copies.nonzero().flatten().tolist()),) * 4
    assert (task.metric, task.ablation) == ("next_token_logprob", "clean_mean")
    tokenized = task.tokenize(model)
    assert tokenized.scored[:, :-1].tolist() == [batch.repeated_copies.tolist()] * 4
    assert not bool(tokenized.scored[:, -1].any())


def test_a_scored_metric_needs_positions_inside_the_prompt():
    pairs = [((1, 2, 3, 4), (1, 5, 3, 4), 2, 3)]
    with pytest.raises(CircuitkitError, match="scored"):
        Task.from_pairs(pairs, metric="next_token_logprob")
    task = Task(name="t", pairs=Task.from_pairs(pairs).pairs, metric="next_token_logprob", scored=((1, 3),))
    model = induction_circuit(10, 16).model
    with pytest.raises(CircuitkitError, match="next token lies inside"):
        task.tokenize(model)
    with pytest.raises(CircuitkitError, match="increasing"):
        Task(name="t", pairs=task.pairs, metric="next_token_logprob", scored=((2, 1),))


@pytest.fixture(scope="module")
def hand():
    model = induction_circuit(10, 24).model
    task = repeated_tokens(model, 8, block_len=6)
    return model, task, scan_task(model, task, holdout=0.0, n_resamples=20)


def test_each_pairs_metric_equals_the_plain_forward(hand):
    model, task, result = hand
    batch = task.tokenize(model)
    positions = [list(row) for row in task.scored]
    for side, values in (("clean", result.clean), ("corrupted", result.corrupted)):
        with torch.no_grad():
            logits = model(getattr(batch, side))
        n = logits.shape[1] - 1
        scored = torch.zeros(batch.n_pairs, n, dtype=torch.bool)
        for i, row in enumerate(positions):
            scored[i, row] = True
        expected = _loop_logprob(logits[:, :n], batch.clean[:, 1:], scored)  # the clean tokens are the targets
        torch.testing.assert_close(values.double(), expected, atol=EXACT, rtol=0)
    assert result.circuit is not None and result.circuit.faithfulness >= 0.8


def test_the_induction_task_scan_saves_and_loads_back_with_its_positions(hand, tmp_path):
    _, task, result = hand
    result.save(tmp_path)
    data = json.loads((tmp_path / "scores.json").read_text(encoding="utf-8"))
    assert data["pairs"]["scored"] == [list(row) for row in task.scored]
    for loaded in (TaskScan.load(tmp_path), ck.Scan.load(tmp_path)):
        assert loaded.task.scored == task.scored and loaded.task.metric == "next_token_logprob"
        assert loaded.to_json() == data


@pytest.fixture(scope="module")
def bundled():
    scan = ck.scan()
    model = ck.zoo.load()
    task = repeated_tokens(model, 16)
    adapter = adapt(model)
    runner = TaskRunner(adapter, task.tokenize(adapter), task.metric, mlps=False, ablation=task.ablation)
    return scan.verified, model, task, runner


def test_the_task_engine_measures_the_induction_circuit_as_the_induction_scan_does(bundled):
    circuit, _, _, runner = bundled
    L, H = runner.spec.n_layers, runner.spec.n_heads
    patched = torch.ones(3, L, H, dtype=torch.bool)
    patched[0] = False
    for layer, head in circuit.heads:
        patched[1, layer, head] = False
    clean, kept, none = (float(v) for v in runner.node_metric(patched, None))
    assert clean == pytest.approx(-circuit.clean_loss, abs=EXACT)
    assert none == pytest.approx(-circuit.all_ablated_loss, abs=EXACT)
    assert kept == pytest.approx(-circuit.circuit_loss, abs=EXACT)
    assert faithfulness_of(kept, clean, none) == pytest.approx(circuit.faithfulness, abs=EXACT)


def test_the_induction_scans_edges_have_the_same_effects_on_the_task_graph(bundled):
    circuit, _, _, runner = bundled
    graph, edges = runner.graph, circuit.edges.edges
    kept = graph.allowed[None].repeat(len(edges), 1, 1)
    for i, e in enumerate(edges):
        kept[i, graph.sender_index(*e.src), graph.receivers.index(f"{e.dst[0]}.{e.dst[1]}:{e.channel}")] = False
    lost = float(runner.clean["metric"].mean()) - runner.edge_metric(kept)
    torch.testing.assert_close(lost.double(), torch.tensor([e.effect for e in edges], dtype=torch.float64),
                               atol=EXACT, rtol=0)


def test_ranked_by_eap_ig_the_task_search_finds_a_larger_circuit(bundled):
    """The documented difference (benchmarks/README.md): EAP-IG ranks the four layer-1 heads first; without the
    previous-token heads they do nothing, so the task's smallest top-n set by EAP-IG holds six heads, the induction
    circuit among them. By default the task ranks by the joint path, as the induction scan, and finds its circuit."""
    circuit, model, task, _ = bundled
    found = scan_task(model, task, holdout=0.0, edges=False, n_resamples=20, node_ranking="eap-ig").circuit
    assert set(circuit.heads) < set(found.heads) and len(found.heads) == 6
    curve = {p.size: p.faithfulness for p in found.curve}
    assert curve[4] < 0.1 and found.faithfulness > circuit.faithfulness
    default = scan_task(model, task, holdout=0.0, edges=False, n_resamples=20).circuit
    assert default.ranked_by == "joint" and set(default.heads) == set(circuit.heads)
    assert default.faithfulness == pytest.approx(circuit.faithfulness, abs=1e-6)


def test_the_command_line_runs_the_induction_task_on_the_bundled_model(tmp_path, capsys):
    from circuitkit.cli import main

    assert main(["scan", "--task", "repeated-tokens", "--pairs", "8", "--no-edges", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "scores.json").read_text(encoding="utf-8"))
    assert data["task"]["metric"] == "next_token_logprob" and data["task"]["ablation"] == "clean_mean"
    assert len(data["pairs"]["scored"]) == 8 and data["pairs"]["scored"][0][0] > 0
    assert "next_token_logprob" in capsys.readouterr().out


def test_the_memory_estimate_counts_the_scored_positions_logits():
    from circuitkit.tasks.memory import estimate_task_memory

    model = induction_circuit(10, 24).model
    spec = adapt(model).spec
    N, P, K = 8, 13, 7

    def reference(scored: bool) -> int:
        return estimate_task_memory(model, N, P, steps=2, mlps=False, edges=False, logit_positions=K,
                                    scored_metric=scored).stages["reference run"]

    assert reference(True) - reference(False) == N * spec.d_vocab * 2 * 4 * (K - 1)


def test_the_command_line_and_the_python_call_read_the_same_sequences_and_agree(tmp_path, capsys):
    """``circuitkit scan --task repeated-tokens`` writes the task's own 16 pairs (the induction scan's batch), as
    ``ck.scan(model, task=repeated_tokens(model, 16))`` and ``ck.scan(model, task="repeated-tokens")`` do: the
    same circuit and held-out figures. ``--ablation-method mean`` is another ablation (the mean over the corrupted
    prompts, not the task's clean mean): its held-out necessity differs, and the saved settings and the circuit
    say which ablation each ran."""
    from circuitkit import zoo
    from circuitkit.cli import main

    model = zoo.load()
    in_python = ck.scan(model, task=repeated_tokens(model, 16), edges=False, progress=False).circuit
    by_name = ck.scan(model, task="repeated-tokens", edges=False, progress=False).circuit
    runs = {}
    for label, extra in (("default", []), ("mean", ["--ablation-method", "mean"])):
        out = tmp_path / label
        assert main(["scan", "--task", "repeated-tokens", "--no-edges", "--out", str(out), *extra]) == 0
        runs[label] = json.loads((out / "scores.json").read_text(encoding="utf-8"))
    said = capsys.readouterr()
    assert "16 pairs, metric next_token_logprob, ablation clean_mean" in said.err + said.out
    cli = runs["default"]
    assert cli["task"]["pairs"] == 16 and cli["settings"]["ablation"] == cli["circuit"]["ablation"] == "clean_mean"
    for circuit in (in_python, by_name):
        assert cli["circuit"]["heads"] == [f"{a}.{b}" for a, b in circuit.heads]
        assert cli["circuit"]["faithfulness"] == pytest.approx(circuit.faithfulness, abs=1e-9)
        for key in ("pairs", "faithfulness", "necessity"):
            assert cli["circuit"]["other_set"][key] == pytest.approx(circuit.other_set[key], abs=1e-9)
    mean = runs["mean"]
    assert mean["settings"]["ablation"] == mean["circuit"]["ablation"] == mean["task"]["ablation"] == "mean"
    assert abs(mean["circuit"]["other_set"]["necessity"] - cli["circuit"]["other_set"]["necessity"]) > 0.01


def test_direct_logit_attribution_on_scored_positions_reads_the_next_tokens_logit():
    """A task whose metric is the next token's log-probability on scored positions: a head's DLA is its output read
    through the final norm with the clean scale frozen into logit(next token) minus the mean logit, averaged over
    the scored positions and the pairs (by hand in float64: a LayerNorm and the unembedding written out)."""
    from circuitkit.graph.metrics import dla_meaning
    from tests.conftest import boot_bridge

    model = boot_bridge(attn_only=False, n_layers=3, d_vocab=50, seed=3)
    adapter = adapt(model)
    task = repeated_tokens(model, 4, block_len=5)
    batch = task.tokenize(adapter)
    runner = TaskRunner(adapter, batch, task.metric, mlps=True, ablation="clean_mean")
    final = {}
    with torch.no_grad():
        model.run_with_hooks(batch.clean, fwd_hooks=[("ln_final.hook_in", lambda x, hook: final.update(x=x))])
    x = final["x"].double()
    ln = model.ln_final.original_component if hasattr(model.ln_final, "original_component") else model.ln_final
    scale = ((x - x.mean(-1, keepdim=True)).pow(2).mean(-1, keepdim=True) + getattr(ln, "eps", 1e-5)).sqrt()
    W_U = (model.W_U if hasattr(model, "W_U") else model.unembed.W_U).detach().double()
    direction = W_U - W_U.mean(-1, keepdim=True)  # logit(t) - mean logit, as a direction per token t
    n = x.shape[1] - 1
    for layer, h in ((2, 1), (1, 0), (0, 3)):
        head = runner.graph.sender_index(layer, h)
        o = runner.outputs(runner.clean)[head].double()
        normed = (o - o.mean(-1, keepdim=True)) / scale * ln.weight.detach().double()  # [pair, pos, d_model]
        total = 0.0
        for i, row in enumerate(task.scored):
            reads = [float(normed[i, p] @ direction[:, int(batch.clean[i, p + 1])]) for p in row if p < n]
            total += sum(reads) / len(reads)
        assert float(runner.clean["dla"][head]) == pytest.approx(total / batch.n_pairs, abs=1e-5), (layer, h)
    assert "logit(next token) minus the mean logit" in dla_meaning(task.metric)
    assert "logit(answer) - logit(wrong)" in dla_meaning("neg_kl")
