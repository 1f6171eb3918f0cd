"""Tasks: pairs, files, metrics, and circuits found on them, checked against independent computations.

Oracles: the edge graph's two ends (every edge kept = the clean run, none = the corrupted run), hand-written hook
computations of node patching and of single edges (through the block's own modules), padded batches against each
prompt alone, IG completeness, direct logit attribution against the unembedding by hand, and TransformerLens
4.3's own edge attribution patching.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import pytest
import torch

from circuitkit import CircuitkitError
from circuitkit.graph.metrics import METRICS
from circuitkit.graph.runner import TaskRunner, build_graph
from circuitkit.graph.task import MAX_PAIRS
from circuitkit.models.adapters import HOOKS, adapt
from circuitkit.tasks import Task, load_task, scan_task
from tests.conftest import boot_bridge

EXACT = 1e-5
"""Patching with hooks vs by hand: the same float32 operations in a different order."""


def toy_pairs(n: int = 6, d_vocab: int = 50, seed: int = 1) -> list[tuple]:
    """Random prompts of 5-7 tokens; the corruption changes token 1; answer: token 1, wrong: its replacement."""
    g = torch.Generator().manual_seed(seed)
    pairs = []
    for i in range(n):
        clean = torch.randint(1, d_vocab, (5 + i % 3,), generator=g).tolist()
        corrupted = list(clean)
        corrupted[1] = (clean[1] + 7) % d_vocab
        pairs.append((clean, corrupted, [clean[1]], [corrupted[1]]))
    return pairs


@pytest.fixture(scope="module", params=["mha-mlp", "attn-only", "gqa-mlp"])
def runner(request):
    attn_only = request.param == "attn-only"
    kv = 2 if request.param == "gqa-mlp" else None
    model = boot_bridge(attn_only=attn_only, n_layers=3, n_key_value_heads=kv, d_vocab=50, seed=3)
    adapter = adapt(model)
    task = Task.from_pairs(toy_pairs(), name="toy")
    return TaskRunner(adapter, task.tokenize(adapter), "logit_diff", mlps=not attn_only, ablation="corrupted")


# ---------------------------------------------------------------------------------------------- pairs and files
def test_pairs_from_tuples_dicts_and_pair_objects_agree():
    rows = toy_pairs(3)
    dicts = [{"clean": c, "corrupted": k, "answer": a, "wrong": w} for c, k, a, w in rows]
    a, b = Task.from_pairs(rows), Task.from_pairs(dicts)
    assert a.pairs == b.pairs
    assert Task.from_pairs(a.pairs).pairs == a.pairs


@pytest.mark.parametrize("bad, needle", [
    ([], "non-empty"),
    ("text", "list of"),
    ([("a", "b", "c")], "(clean, corrupted, answer, wrong)"),
    ([{"clean": "a", "corrupted": "b", "answer": "c"}], "missing ['wrong']"),
    ([{"clean": [1, 2], 0: "x"}], "missing ['corrupted', 'answer', 'wrong']"),  # keys of mixed types
    ([("", "b", "c", "d")], "non-empty prompt"),
    ([("a", "b", [], "d")], "one to 16 answers"),
    ([("a", "b", "c", True)], "answer text or a token id"),
])
def test_bad_pairs_are_one_clear_line(bad, needle):
    with pytest.raises(CircuitkitError) as info:
        Task.from_pairs(bad)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_an_endless_iterator_of_pairs_is_refused_at_the_bound():
    endless = itertools.repeat(([1, 2], [1, 3], [2], [3]))
    with pytest.raises(CircuitkitError, match=f"more than {MAX_PAIRS} pairs"):
        Task.from_pairs(endless)


def test_unknown_metric_and_ablation_are_refused():
    with pytest.raises(CircuitkitError, match="logit_diff"):
        Task.from_pairs(toy_pairs(2), metric="accuracy")
    with pytest.raises(CircuitkitError, match="corrupted"):
        Task.from_pairs(toy_pairs(2), ablation="resample")


def test_unequal_lengths_out_of_vocab_and_shared_answers_name_the_pair():
    adapter = adapt(boot_bridge(d_vocab=50))
    with pytest.raises(CircuitkitError, match="pair 1: the clean prompt is 3 tokens and the corrupted prompt 2"):
        Task.from_pairs([([1, 2], [1, 3], [2], [3]), ([1, 2, 3], [1, 3], [2], [3])]).tokenize(adapter)
    with pytest.raises(CircuitkitError, match=r"pair 0: the answer holds token ids \[99\]"):
        Task.from_pairs([([1, 2], [1, 3], [99], [3])]).tokenize(adapter)
    with pytest.raises(CircuitkitError, match="pair 0: answer and wrong"):
        Task.from_pairs([([1, 2], [1, 3], [2], [2])]).tokenize(adapter)


def test_text_needs_a_tokenizer_and_answers_are_scored_by_their_first_token(tmp_path):
    from circuitkit.models.tokenizer import word_tokenizer

    model = boot_bridge(d_vocab=50)
    with pytest.raises(CircuitkitError, match="without a tokenizer"):
        Task.from_pairs([("a b", "a c", " b", " c")]).tokenize(model)
    model.tokenizer = word_tokenizer(50)
    words = model.tokenizer.convert_ids_to_tokens(list(range(5, 9)))
    ok = Task.from_pairs([(f"{words[0]} {words[1]}", f"{words[0]} {words[2]}", words[1], words[2])])
    batch = ok.tokenize(model)
    assert batch.answers.shape == (1, 1)
    several = Task.from_pairs([(f"{words[0]} {words[1]}", f"{words[0]} {words[2]}", f"{words[1]} {words[3]}",
                                words[2])]).tokenize(model)
    assert several.answers.tolist() == [[model.tokenizer.convert_tokens_to_ids(words[1])]]
    with pytest.raises(CircuitkitError, match="different first tokens"):
        Task.from_pairs([(f"{words[0]} {words[1]}", f"{words[0]} {words[2]}", f"{words[1]} {words[3]}",
                          f"{words[1]} {words[2]}")]).tokenize(model)


def write(path, text: str | bytes):
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return path


def test_files_jsonl_csv_eap_ig_and_auto_circuit_read_the_same_pairs(tmp_path):
    rows = [{"clean": "a b c", "corrupted": "a d c", "answer": " x", "wrong": " y"},
            {"clean": "e f", "corrupted": "e g", "answer": [" x", " z"], "wrong": " y"}]
    jsonl = write(tmp_path / "t.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n")
    task = load_task(jsonl)
    assert task.name == "t" and task.n_pairs == 2 and task.pairs[1].answers == (" x", " z")
    csv = write(tmp_path / "t.csv", 'clean,corrupted,answer,wrong\n"a b c","a d c", x, y\n')
    assert load_task(csv).pairs[0].clean == "a b c"
    eap = write(tmp_path / "eap.csv", "clean,corrupted,correct_idx,incorrect_idx\nab,ac,5,7\n")
    assert load_task(eap).pairs[0].answers == (5,) and load_task(eap).pairs[0].wrongs == (7,)
    auto = {"prompts": [{"clean": "a b", "corrupt": "a c", "answers": [" b"], "wrong_answers": [" c"]}]}
    auto_path = write(tmp_path / "auto.json", json.dumps(auto))
    assert load_task(auto_path).pairs[0].corrupted == "a c"


@pytest.mark.parametrize("name, content, needle", [
    ("empty.jsonl", "", "holds no pairs"),
    ("latin.jsonl", b"\xff\xfe{", "is not UTF-8"),
    ("cols.csv", "clean,corrupted,answer\na,b,c\n", "missing ['wrong']"),
    ("bad.jsonl", '{"clean": "a", "corrupted": "b", "answer": "c", "wrong": "d"}\n{oops\n', "line 2 is not JSON"),
    ("nan.jsonl", '{"clean": NaN}\n', "line 1 is not JSON"),
    ("list.jsonl", "[1, 2]\n", "line 1 is a list"),
    ("x.txt", "hello", "suffix '.txt'"),
    ("gt.csv", "clean,corrupted,correct_idx\na,b,3\n", "greater-than"),
    ("short.csv", 'clean,corrupted,answer,wrong\n"a","b","c"\n', "fields"),
    ("deep.json", "[" * 200_000 + "]" * 200_000, "nested too deeply"),
    ("auto.json", '{"prompts": [{"clean": "a"}]}', "prompt 1 is not an object"),
])
def test_bad_task_files_are_one_clear_line(tmp_path, name, content, needle):
    path = write(tmp_path / name, content)
    with pytest.raises(CircuitkitError) as info:
        load_task(path)
    assert needle in str(info.value) and str(path) in str(info.value) and "\n" not in str(info.value)


def test_a_missing_file_a_directory_and_too_many_rows_are_refused(tmp_path):
    with pytest.raises(CircuitkitError, match="no such file"):
        load_task(tmp_path / "nope.jsonl")
    with pytest.raises(CircuitkitError):
        load_task(tmp_path)
    line = json.dumps({"clean": "a", "corrupted": "b", "answer": "c", "wrong": "d"}) + "\n"
    big = write(tmp_path / "big.jsonl", line * (MAX_PAIRS + 1))
    with pytest.raises(CircuitkitError, match=f"more than {MAX_PAIRS} pairs"):
        load_task(big)


# ---------------------------------------------------------------------------------------------- metrics
def test_the_metric_names_a_task_accepts_are_the_metrics_defined():
    from circuitkit.graph.task import METRIC_NAMES

    assert tuple(METRICS) == METRIC_NAMES


def test_metrics_against_their_definitions():
    adapter = adapt(boot_bridge(d_vocab=50))
    task = Task.from_pairs([([1, 2], [1, 3], [4, 5], [6])])
    batch = task.tokenize(adapter)
    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(0))
    p = logits.softmax(-1)[0]
    assert torch.allclose(METRICS["logit_diff"](logits, batch), (logits[0, 4] + logits[0, 5]) / 2 - logits[0, 6])
    assert torch.allclose(METRICS["prob_diff"](logits, batch), p[4] + p[5] - p[6])
    assert torch.allclose(METRICS["answer_logprob"](logits, batch), (p[4] + p[5]).log())
    other = torch.randn(1, 50, generator=torch.Generator().manual_seed(1))
    q = other.log_softmax(-1)
    kl = (p * (logits.log_softmax(-1)[0] - q[0])).sum()
    assert torch.allclose(METRICS["neg_kl"](other, batch, logits.log_softmax(-1)), -kl, atol=1e-6)


# ---------------------------------------------------------------------------------------------- the graph
def test_graph_counts_and_order():
    adapter = adapt(boot_bridge(attn_only=False, n_layers=2, n_heads=4, n_key_value_heads=2))
    graph = build_graph(adapter, mlps=True)
    # senders: input + 2 x (4 heads + mlp); receivers: 2 x (4 q + 2 k + 2 v + mlp) + logits
    assert len(graph.senders) == 11 and len(graph.receivers) == 19
    assert graph.senders[graph.sender_index(1, 2)] == "1.2" and graph.senders[graph.sender_index(0, None)] == "m0"
    allowed = dict(zip(graph.edge_names(graph.allowed.nonzero()), [True] * graph.n_edges, strict=True))
    assert "0.1->m0" in allowed and "0.1->1.g1:k" in allowed and "m0->1.3:q" in allowed and "input->logits" in allowed
    assert "0.1->0.2:q" not in allowed and "m0->m0" not in allowed and "1.0->m0" not in allowed


def test_every_edge_kept_is_the_clean_run_and_none_the_corrupted_run(runner):
    allowed = runner.graph.allowed[None]
    values = runner.edge_metric(torch.cat([allowed, torch.zeros_like(allowed)]))
    assert values[0] == pytest.approx(float(runner.clean["metric"].mean()), abs=EXACT)
    assert values[1] == pytest.approx(float(runner.corrupted["metric"].mean()), abs=EXACT)


def test_padded_pairs_equal_each_prompt_alone(runner):
    adapter = runner.adapter
    for i, pair in enumerate(toy_pairs()):
        alone = Task.from_pairs([pair]).tokenize(adapter)
        one = TaskRunner(adapter, alone, "logit_diff", mlps=runner.graph.mlps, ablation="corrupted")
        assert float(one.clean["metric"][0]) == pytest.approx(float(runner.clean["metric"][i]), abs=EXACT)
        assert float(one.corrupted["metric"][0]) == pytest.approx(float(runner.corrupted["metric"][i]), abs=EXACT)


def _logit_diff_by_hand(model, batch, hooks) -> float:
    with torch.no_grad():
        logits = model.run_with_hooks(batch.clean, fwd_hooks=hooks)
    rows = torch.arange(batch.n_pairs)
    last = logits[rows, batch.last]
    return float((last[rows, batch.answers[:, 0]] - last[rows, batch.wrongs[:, 0]]).mean())


def test_node_patching_equals_a_hand_written_hook(runner):
    model, batch = runner.adapter.model, runner.batch
    corrupted_z = runner.corrupted["z"]
    patched = {(0, 1), (1, 3), (2, 0)}

    def hook(z, hook):
        layer = int(hook.name.split(".")[1])
        z = z.clone()
        for lay, head in patched:
            if lay == layer:
                z[:, :, head] = corrupted_z[layer][:, :, head]
        return z

    by_hand = _logit_diff_by_hand(model, batch, [(HOOKS.z(layer), hook) for layer in range(3)])
    heads = torch.zeros(1, 3, 4, dtype=torch.bool)
    for layer, head in patched:
        heads[0, layer, head] = True
    mlps = torch.zeros(1, 3, dtype=torch.bool) if runner.graph.mlps else None
    assert float(runner.node_metric(heads, mlps)[0]) == pytest.approx(by_hand, abs=EXACT)


def test_single_edges_equal_hand_written_hooks(runner):
    """Edges into the logits, an MLP and a query head, patched by hand through the block's own modules."""
    graph, model, batch = runner.graph, runner.adapter.model, runner.batch
    W_O = runner.W_O
    delta = (runner.corrupted["z"][0][:, :, 2] - runner.clean["z"][0][:, :, 2]) @ W_O[0, 2]  # sender 0.2
    sender = graph.sender_index(0, 2)

    def only(receiver: str) -> torch.Tensor:
        kept = graph.allowed.clone()
        kept[sender, graph.receivers.index(receiver)] = False
        return runner.edge_metric(kept[None])[0]

    def add(x, hook):
        return x + delta

    assert float(only("logits")) == pytest.approx(
        _logit_diff_by_hand(model, batch, [("blocks.2.hook_resid_post", add)]), abs=EXACT)
    if graph.mlps:
        assert float(only("m1")) == pytest.approx(
            _logit_diff_by_hand(model, batch, [("blocks.1.ln2.hook_in", add)]), abs=EXACT)
    resid = {}

    def keep(x, hook):
        resid["x"] = x

    def q_hook(q, hook):
        block = model.blocks[1]
        head = 3
        x = block.ln1(resid["x"] + delta) if runner.norms[1] is not None else resid["x"] + delta
        q = q.clone()
        q[:, :, head] = x @ runner.W_Q[1, head] + (q[:, :, head] - block.ln1(resid["x"]) @ runner.W_Q[1, head])
        return q

    by_hand = _logit_diff_by_hand(model, batch, [("blocks.1.hook_resid_pre", keep), ("blocks.1.attn.hook_q", q_hook)])
    assert float(only("1.3:q")) == pytest.approx(by_hand, abs=EXACT)


def test_registered_pattern_scores_on_task_prompts_equal_each_prompt_alone(runner):
    """The previous-token score on the task's padded prompts: the mean over real query rows (q >= 1) of the
    attention to q - 1, from each prompt run alone (padding rows and keys count nowhere)."""
    from circuitkit.tasks.scan import registered_pattern_masks

    adapter = runner.adapter
    fresh = TaskRunner(adapter, runner.batch, "logit_diff", mlps=runner.graph.mlps, ablation="corrupted")
    fresh.pattern_masks = registered_pattern_masks(runner.batch)
    _ = fresh.clean
    total, rows = torch.zeros(3, 4), 0
    for pair in toy_pairs():
        tokens = torch.tensor([pair[0]])
        kept = {}

        def keep(pattern, hook, kept=kept):
            kept[int(hook.name.split(".")[1])] = pattern[0]

        with torch.no_grad():
            adapter.model.run_with_hooks(tokens, fwd_hooks=[(HOOKS.pattern(layer), keep) for layer in range(3)])
        n = tokens.shape[1]
        for layer in range(3):
            total[layer] += kept[layer][:, torch.arange(1, n), torch.arange(n - 1)].sum(-1)
        rows += n - 1
    torch.testing.assert_close(fresh.pattern_scores["previous_token"], total / rows, atol=1e-5, rtol=0)


def test_ig_completeness_of_the_input_node(runner):
    """Integrated gradients of the input embeddings add up to the metric's change (the input node's outgoing edges
    carry every path from the tokens)."""
    scores, node = runner.edge_gradients(256)  # the Riemann sum's error is about 1/steps of the path's curvature
    gap = float(runner.clean["metric"].mean() - runner.corrupted["metric"].mean())
    assert float(node[0]) == pytest.approx(gap, rel=0.01, abs=1e-4)
    assert torch.equal(scores != 0, (scores != 0) & runner.graph.allowed)


def test_direct_logit_attribution_by_hand(runner):
    """A head's direct logit attribution: its output at the last token through the final norm with the clean scale
    frozen, read by W_U[:, answer] - W_U[:, wrong]."""
    model, batch = runner.adapter.model, runner.batch
    final = {}

    def keep(x, hook):
        final["x"] = x

    with torch.no_grad():
        model.run_with_hooks(batch.clean, fwd_hooks=[("ln_final.hook_in", keep)])
    rows = torch.arange(batch.n_pairs)
    x = final["x"][rows, batch.last]  # [pair, d_model]
    ln = model.ln_final.original_component if hasattr(model.ln_final, "original_component") else model.ln_final
    eps = getattr(ln, "eps", 1e-5)
    centred = x - x.mean(-1, keepdim=True)
    scale = (centred.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    W_U = model.W_U if hasattr(model, "W_U") else model.unembed.W_U
    direction = W_U[:, batch.answers[:, 0]] - W_U[:, batch.wrongs[:, 0]]  # [d_model, pair]
    head = runner.graph.sender_index(2, 1)
    out = runner.outputs(runner.clean)[head][rows, batch.last]
    out = out - out.mean(-1, keepdim=True)
    expected = ((out / scale * ln.weight.detach()) * direction.T.detach()).sum(-1).mean()
    assert float(runner.clean["dla"][head]) == pytest.approx(float(expected), abs=1e-5)


def test_edge_attribution_equals_transformer_lens(tmp_path):
    """TransformerLens 4.3's edge attribution patching (gradient at its "corrupt" run, so called with the pairs
    swapped), on a GPT-2 checkpoint (MHA with MLPs), one pair at a time and averaged: circuitkit's EAP with one
    step, sign flipped."""
    from transformer_lens.tools.analysis.attribution_patching import EdgeAttributionConfig, attribution_patch

    from circuitkit.models.loading import load_model
    from tests.test_models_loading import save_tiny_gpt2

    save_tiny_gpt2(tmp_path, with_tokenizer=False, seed=5)
    model = load_model(str(tmp_path))
    adapter = adapt(model)
    pairs = [p for p in toy_pairs(9, d_vocab=40) if len(p[0]) == 6]  # TL scores a batch of one length
    task = Task.from_pairs(pairs)
    runner = TaskRunner(adapter, task.tokenize(adapter), "logit_diff", mlps=True, ablation="corrupted")
    scores, _ = runner.edge_gradients(1, "right")  # at the clean run
    answers = [p[2][0] for p in pairs]
    wrongs = [p[3][0] for p in pairs]
    clean = torch.tensor([p[0] for p in pairs])
    corrupt = torch.tensor([p[1] for p in pairs])
    state = {"i": 0}

    def metric(logits):
        i = state["i"] % len(pairs)
        return logits[0, -1, answers[i]] - logits[0, -1, wrongs[i]]

    # TL scores each pair with its own metric only when the batch is one pair: run pair by pair and average
    totals: dict = {}
    for i in range(len(pairs)):
        state["i"] = i
        result = attribution_patch(model, corrupt[i : i + 1], clean[i : i + 1], metric,
                                   EdgeAttributionConfig(granularity="edge"))
        for (src, dst), value in result.edge_scores.items():  # per position: summed over positions
            key = (_tl_sender(src), _tl_receiver(dst))
            totals[key] = totals.get(key, 0.0) + value / len(pairs)
    graph = runner.graph
    compared = 0
    for (s, r), value in totals.items():
        assert s in graph.senders and r in graph.receivers, (s, r)
        ours = float(scores[graph.senders.index(s), graph.receivers.index(r)])
        assert ours == pytest.approx(-value, rel=1e-4, abs=1e-6), (s, r)
        compared += 1
    assert compared == graph.n_edges, (compared, graph.n_edges)


TL_RECEIVERS = {"q_input": "q", "k_input": "k", "v_input": "v"}


def _tl_sender(node) -> str | None:
    """TransformerLens's writer ``Node(kind, layer, position, head)`` as a circuitkit sender name."""
    if node.kind == "embed":
        return "input"
    if node.kind == "mlp_out":
        return f"m{node.layer}"
    if node.kind == "attn_head_out":
        return f"{node.layer}.{node.head}"
    return None


def _tl_receiver(node) -> str | None:
    """TransformerLens's reader node as a circuitkit receiver name."""
    if node.kind == "logits":
        return "logits"
    if node.kind == "mlp_in":
        return f"m{node.layer}"
    if node.kind in TL_RECEIVERS:
        return f"{node.layer}.{node.head}:{TL_RECEIVERS[node.kind]}"
    return None


# ---------------------------------------------------------------------------------------------- circuits
def task_file(task: Task, path):
    """``task``'s pairs (token ids) written as a JSON Lines task file at ``path``; the path."""
    lines = [json.dumps({"clean": list(p.clean), "corrupted": list(p.corrupted), "answer": list(p.answers),
                         "wrong": list(p.wrongs)}) for p in task.pairs]
    return write(path, "\n".join(lines) + "\n")


def copy_next_task(n: int = 12, d_vocab: int = 10, seed: int = 0) -> Task:
    """Prompts of distinct tokens ending in a repeat of an earlier one; the answer is the token that followed it
    (the wrong one: the first token). Corrupted: the earlier occurrence replaced by an unused token, so nothing
    says what comes next. A task in pairs, not the induction scan's repeated random blocks."""
    g = torch.Generator().manual_seed(seed)
    pairs = []
    for _ in range(n):
        tokens = torch.randperm(d_vocab, generator=g)[:7].tolist()
        prompt, spare = tokens[:6], tokens[6]
        i = int(torch.randint(1, 4, (1,), generator=g))
        clean = [*prompt, prompt[i]]
        corrupted = list(clean)
        corrupted[i] = spare
        pairs.append((clean, corrupted, [prompt[i + 1]], [prompt[0]]))
    return Task.from_pairs(pairs, name="copy-next")


def test_the_hand_built_circuit_is_found_at_node_and_edge_level():
    """The hand-built two-layer circuit (previous-token head 0.0 writes the previous token; head 1.0 matches it
    through K and copies): the node circuit is both heads and the edge circuit is exactly its three edges."""
    from circuitkit.handbuilt.induction import induction_circuit

    result = scan_task(induction_circuit(10, 16).model, copy_next_task(), target=0.9)
    c = result.circuit
    assert float(result.clean.mean()) > float(result.corrupted.mean()) + 1.0
    assert c.heads == ((0, 0), (1, 0)) and c.faithfulness >= 0.9
    assert set(c.edges) == {"input->0.0:v", "0.0->1.0:k", "1.0->logits"} and c.edge_faithfulness >= 0.9
    gap = float(result.clean.mean() - result.corrupted.mean())
    for effect in c.edge_effects:  # each of the three alone carries the whole behaviour
        assert effect.effect == pytest.approx(gap, rel=1e-4)
    areas = c.edge_areas
    assert c.cpr == areas["signed"]["area_under"] and c.cmd == areas["abs"]["area_from_1"]
    for rank in ("signed", "abs"):  # faithfulness stays in [0, 1]: the two areas add up to the span 0.001..1
        assert areas[rank]["area_under"] + areas[rank]["area_from_1"] == pytest.approx(0.999, abs=1e-6)


def test_task_scan_json_report_and_save(tmp_path):
    from circuitkit.handbuilt.induction import induction_circuit

    result = scan_task(induction_circuit(10, 16).model, copy_next_task(), target=0.9, name="hand-built")
    data = result.to_json()
    assert data["task"]["name"] == "copy-next" and data["task"]["metric"] == "logit_diff"
    assert data["task"]["pairs"] == 12 and data["task"]["clean"] > data["task"]["corrupted"]
    circuit = data["circuit"]
    assert circuit["heads"] == ["0.0", "1.0"] and circuit["mlps"] == [] and circuit["ablation"] == "corrupted"
    for key in ("faithfulness", "edges", "edge_faithfulness", "curve", "edge_curve", "cpr", "cmd"):
        assert key in circuit
    assert circuit["cpr_cmd"]["cpr"] == circuit["cpr"] and "signed" in circuit["cpr_cmd"]["definition"]
    assert "MIB's CPR" in result.answer() and "circuit-model distance" in result.legend()
    assert sum(s["passes"] for s in data["stages"]) == result.passes
    import jsonschema

    from circuitkit import tasks

    schema = json.loads((Path(tasks.__file__).parent / "task_scores.schema.json").read_text())
    jsonschema.validate(data, schema)
    saved = result.save(tmp_path / "out")
    assert json.loads(saved.scores.read_text()) == json.loads(json.dumps(data))
    page = saved.report.read_text()
    assert "copy-next" in page and "0.0-&gt;1.0:k" in page
    assert "CircuitsVis" in page and "https://" not in page.split("CircuitsVis")[0]  # the bundle inlined


def test_no_behaviour_is_reported_not_raised():
    """Pairs whose corruption changes nothing: the scan says so instead of dividing by zero."""
    model = boot_bridge(d_vocab=50)
    same = [(c, c, a, [(a[0] + 1) % 50]) for c, _, a, _ in toy_pairs(3)]
    result = scan_task(model, Task.from_pairs(same))
    assert result.circuit is None and "do not change what the model does" in result.circuit_error
    assert "No circuit" in result.answer()
    import jsonschema

    from circuitkit import tasks

    schema = json.loads((Path(tasks.__file__).parent / "task_scores.schema.json").read_text())
    jsonschema.validate(result.to_json(), schema)


def test_scan_dispatches_tasks_and_keeps_induction_as_it_was():
    import circuitkit as ck
    from circuitkit.handbuilt.induction import induction_circuit

    model = induction_circuit(10, 16).model
    assert isinstance(ck.scan(model, task=copy_next_task()), ck.tasks.TaskScan)
    with pytest.raises(CircuitkitError, match="no such file"):
        ck.scan(model, task="no-such-task.jsonl")
    with pytest.raises(CircuitkitError, match="a Task, a built-in task name"):
        ck.scan(model, task=3)
    with pytest.raises(CircuitkitError, match="do not apply to a task scan"):
        ck.scan(model, task=copy_next_task(), faithfulness_method="zero")
    # ablation_method applies to a task as --ablation-method does: it replaces the task's own ablation
    zeroed = ck.scan(model, task=copy_next_task(), ablation_method="zero", edges=False)
    assert zeroed.task.ablation == "zero" and copy_next_task().ablation == "corrupted"
    own = ck.scan(model, task=dataclasses.replace(copy_next_task(), ablation="zero"), edges=False)
    assert own.circuit.heads == zeroed.circuit.heads and own.circuit.faithfulness == zeroed.circuit.faithfulness
    with pytest.raises(CircuitkitError, match="ablation_method"):
        ck.scan(model, task=copy_next_task(), ablation_method="corrupted")
    with pytest.raises(CircuitkitError, match=r"\['top_k', 'n_patch'\]"):  # stability applies to a task too
        ck.scan(model, task=copy_next_task(), top_k=3, n_patch=2, stability=2)
    result = ck.scan(model, task=copy_next_task(), n_resamples=50, ci_level=0.9)
    assert result.settings["n_resamples"] == 50 and result.settings["ci_level"] == 0.9


def test_the_induction_task_is_the_default_scan_unchanged():
    import circuitkit as ck
    from circuitkit.report.saving import scores_text

    assert scores_text(ck.scan(task="induction")) == scores_text(ck.scan())


@pytest.mark.parametrize("kwargs, needle", [
    (dict(target=0.0), "target"), (dict(rank="magnitude"), "signed"), (dict(steps=0), "steps"),
    (dict(mlps=True), "attention-only"),
])
def test_scan_task_refuses_bad_settings(kwargs, needle):
    from circuitkit.handbuilt.induction import induction_circuit

    with pytest.raises(CircuitkitError, match=needle):
        scan_task(induction_circuit(10, 16).model, copy_next_task(4), **kwargs)


# ---------------------------------------------------------------------------------------------- generators
def english_model(digits: bool = False):
    """A random bridge with a word-level tokenizer over the built-in tasks' words (punctuation and, with
    ``digits``, every digit split off), so the generators write real text for it."""
    import re

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from circuitkit.tasks import generators as gen

    text = " ".join([*gen.IOI_TEMPLATES, *gen.NAMES, *gen.PLACES, *gen.OBJECTS, *gen.ARGUMENTS, *gen.WORDS,
                     "def self port load run check update build param The war expedition drought reign famine "
                     "project siege voyage lasted from the year to"])
    words = sorted(set(re.findall(r"\w+|[^\w\s]", text.replace("{", " ").replace("}", " "))))
    words += [str(d) for d in range(10)] if digits else [f"{y:02d}" for y in range(100)] + [
        f"{c}{y:02d}" for c in range(11, 19) for y in range(100)] + [str(c) for c in range(11, 19)]
    words += ["(", ":", '"""', "):"]  # the docstring template's punctuation, as the Whitespace split writes it
    vocab = {"<unk>": 0, **{w: i + 1 for i, w in enumerate(dict.fromkeys(words))}}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    split = [pre_tokenizers.Whitespace()] + ([pre_tokenizers.Digits(individual_digits=True)] if digits else [])
    core.pre_tokenizer = pre_tokenizers.Sequence(split)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>")
    model = boot_bridge(attn_only=False, n_layers=2, d_vocab=len(vocab), n_ctx=96, seed=0)
    model.tokenizer = tokenizer
    return model


def test_ioi_pairs_are_equal_length_with_one_token_names_and_marks():
    from circuitkit.tasks import ioi

    model = english_model()
    task = ioi(model, n=10, seed=3)
    batch = task.tokenize(model)
    assert task.metric == "logit_diff" and task.n_pairs == 10
    assert torch.equal(batch.clean != batch.corrupted, (batch.clean != batch.corrupted))  # tokenized without error
    for i in range(task.n_pairs):
        ids = batch.clean[i]
        assert int(ids[task.marks[i]["io"]]) == int(batch.answers[i, 0])  # the indirect object's own token
        assert int(ids[task.marks[i]["s1"]]) == int(batch.wrongs[i, 0])
        s2 = task.marks[i]["s2"]  # the subject's repeat: the one token the corrupted prompt replaces
        assert s2 > task.marks[i]["s1"] and int(ids[s2]) == int(batch.wrongs[i, 0])
        assert int(batch.corrupted[i, s2]) != int(ids[s2])
        assert int((batch.clean[i] != batch.corrupted[i]).sum()) == 1  # ABC: one name replaced
    assert ioi(model, n=10, seed=3).pairs == task.pairs and ioi(model, n=10, seed=4).pairs != task.pairs
    result = scan_task(model, task, edges=False, holdout=0)  # the score over every pair
    patterns = {}

    def keep(pattern, hook):
        patterns[int(hook.name.split(".")[1])] = pattern

    with torch.no_grad():
        model.run_with_hooks(batch.clean, fwd_hooks=[(HOOKS.pattern(layer), keep) for layer in range(2)])
    expected, repeat = torch.zeros(2, 4), torch.zeros(2, 4)
    for i, marks in enumerate(task.marks):
        last = int(batch.last[i])
        for layer in range(2):
            row = patterns[layer][i, :, last]
            expected[layer] += (row[:, marks["io"]] - row[:, marks["s1"]]) / task.n_pairs
            repeat[layer] += (row[:, marks["s2"]] - row[:, marks["io"]]) / task.n_pairs
    torch.testing.assert_close(result.head_scores["io_attention"], expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(result.head_scores["s2_attention"], repeat, atol=1e-6, rtol=0)
    with pytest.raises(CircuitkitError, match="as one token"):
        ioi(_named(model), n=4)


def _named(model):
    """The same model whose tokenizer knows no names (each is split into characters)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel(vocab={"<unk>": 0, "a": 1}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    model.tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>")
    return model


@pytest.mark.parametrize("digits", [False, True], ids=["two-digit-tokens", "digit-by-digit"])
def test_greater_than_answers_are_later_years_or_tens_digits(digits):
    from circuitkit.tasks import greater_than

    model = english_model(digits=digits)
    task = greater_than(model, n=8, seed=1)
    task.tokenize(model)
    for pair in task.pairs:
        year = pair.clean.split("year ")[1].split(" ")[0]
        if digits:
            assert all(int(a) > int(year[2]) for a in pair.answers) and all(int(w) < int(year[2]) for w in pair.wrongs)
        else:
            assert all(int(a) > int(year[2:]) for a in pair.answers)
            assert all(int(w) <= int(year[2:]) for w in pair.wrongs)
    assert task.metric == "prob_diff"


@pytest.mark.parametrize("name", ["ioi", "greater-than", "docstring"])
def test_a_built_in_task_refuses_a_tokenizer_without_its_words_and_says_what_runs(name):
    """The bundled model's tokenizer knows 64 tokens and none of the built-in tasks' words: each refuses it, says
    how many tokens it has, and names what a model without the words runs."""
    from circuitkit import zoo
    from circuitkit.tasks import get_task

    with pytest.raises(CircuitkitError, match=r"It has 64 tokens\. A model without these words runs "
                                              r"'repeated-tokens' .* or a task of token ids"):
        get_task(name, zoo.load())
    assert get_task("repeated-tokens", zoo.load()).n_pairs > 0


def test_docstring_pairs_differ_only_in_the_signature():
    from circuitkit.tasks import docstring

    model = english_model()
    task = docstring(model, n=6, seed=2)
    batch = task.tokenize(model)
    for pair in task.pairs:
        assert pair.clean.split(":", 1)[1] == pair.corrupted.split(":", 1)[1]  # the docstring is the same
        assert pair.answers[0].strip() in pair.clean.split("(")[1].split(")")[0]
    assert batch.answers.shape == (6, 1) and batch.wrongs.shape == (6, 2)


# ---------------------------------------------------------------------------------------------- command line
def test_cli_task_names_agree_with_the_library():
    from circuitkit import cli, tasks

    assert cli.BUILT_IN_TASKS == tasks.BUILT_IN


def test_cli_scans_a_task_file_on_the_bundled_model(tmp_path, capsys):
    """The bundled model copies in context: a file of copy-next pairs (token ids) gives it a circuit."""
    from circuitkit import cli

    task = copy_next_task(n=16, d_vocab=60)
    path = task_file(task, tmp_path / "copy.jsonl")
    out = tmp_path / "out"
    assert cli.main(["scan", "--task", str(path), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    data = json.loads((out / "scores.json").read_text())
    assert data["task"]["name"] == "copy" and data["task"]["pairs"] == 16
    assert data["circuit"] is not None and data["circuit"]["faithfulness"] >= 0.8
    assert "Node circuit" in printed and str(out / "report.html") in printed


@pytest.mark.parametrize("argv, needle", [
    (["scan", "--task", "nope.jsonl"], "no such file"),
    (["scan", "--task", "sentiment"], "expected one of induction, ioi"),
    (["scan", "--target", "0"], "expected a faithfulness in (0, 1]"),
    (["scan", "--pairs", "1"], "--pairs"),
])
def test_cli_task_arguments_are_checked_before_any_work(argv, needle, tmp_path, capsys):
    from circuitkit import cli

    assert cli.main([*argv, "--out", str(tmp_path / "o")]) == 2
    assert needle in capsys.readouterr().err


def test_task_intervals_hold_the_figures_and_are_deterministic():
    """Bootstrap intervals over the pairs (from each pair's values in the passes already run): they hold the mean
    metric, the node circuit's faithfulness and necessity, repeat exactly, and narrow with more pairs."""
    from circuitkit import zoo

    model = zoo.load()
    small = scan_task(model, copy_next_task(n=8, d_vocab=60, seed=1), edges=False)
    again = scan_task(model, copy_next_task(n=8, d_vocab=60, seed=1), edges=False)
    large = scan_task(model, copy_next_task(n=32, d_vocab=60, seed=1), edges=False)
    assert small.intervals == again.intervals and small.circuit.intervals == again.circuit.intervals
    for key, values in (("clean", small.clean), ("corrupted", small.corrupted)):
        lo, hi = small.intervals[key]
        assert lo <= float(values.mean()) <= hi
    c = small.circuit
    assert c.intervals["faithfulness"][0] <= c.faithfulness <= c.intervals["faithfulness"][1]
    assert c.intervals["necessity"][0] <= c.necessity <= c.intervals["necessity"][1]
    width = lambda scan: scan.intervals["clean"][1] - scan.intervals["clean"][0]  # noqa: E731
    assert width(large) < width(small)
    data = small.to_json()
    assert data["task"]["ci"]["clean"] == [pytest.approx(v, abs=1e-6) for v in small.intervals["clean"]]
    assert "faithfulness" in data["circuit"]["ci"] and "[" in small.answer().splitlines()[1]


def test_the_exact_edge_effects_intervals_are_the_bootstrap_of_each_pairs_effect(tmp_path):
    """Each exactly measured edge's interval: the percentile bootstrap over the pairs of ``clean - patched``, its
    per-pair values read from the passes that measured the effect. The oracle measures every pair's patched metric
    again through the mask pass (the edge circuit's pass, every edge but that one kept) and bootstraps it with the
    scan's draw; the interval holds the effect, is written to scores.json and read back."""
    from circuitkit.tasks.scan import TaskScan
    from circuitkit.uncertainty import bootstrap_ci

    model = boot_bridge(attn_only=False, n_layers=3, d_vocab=50, seed=3)
    task = Task.from_pairs(toy_pairs(12), name="toy")
    scan = scan_task(model, task, target=0.8, n_resamples=300, holdout=0)
    effects = scan.circuit.edge_effects
    assert len(effects) == 8 and all(e.interval is not None for e in effects)
    adapter = adapt(model)
    runner = TaskRunner(adapter, task.tokenize(adapter), task.metric, mlps=True, ablation=task.ablation)
    graph = runner.graph
    index = torch.tensor([[graph.senders.index(e.name.split("->")[0]), graph.receivers.index(e.name.split("->")[1])]
                          for e in effects])
    kept = graph.allowed[None].repeat(len(effects), 1, 1)
    kept[torch.arange(len(effects)), index[:, 0], index[:, 1]] = False
    per_pair: list[torch.Tensor] = []
    runner.edge_metric(kept, pairs=per_pair)
    lost = runner.clean["metric"].double()[:, None] - torch.cat(per_pair).double().T  # [pair, edge]
    lo, hi = bootstrap_ci(lost, 300, scan.settings["ci_level"])
    for e, a, b, mean in zip(effects, lo.tolist(), hi.tolist(), lost.mean(0).tolist(), strict=True):
        assert e.effect == pytest.approx(mean, abs=1e-5)
        assert e.interval == (pytest.approx(a, abs=1e-5), pytest.approx(b, abs=1e-5))
        assert e.interval[0] <= e.effect <= e.interval[1]
    assert len({e.interval[1] - e.interval[0] for e in effects}) > 1  # each edge its own spread
    scan.save(tmp_path / "out")
    back = TaskScan.load(tmp_path / "out")
    assert [e.interval for e in back.circuit.edge_effects] == [pytest.approx(e.interval, abs=1e-6) for e in effects]
    line = next(line for line in scan.answer().splitlines() if effects[0].name + ": exact effect" in line)
    assert f"[{effects[0].interval[0]:+.3f}, {effects[0].interval[1]:+.3f}]" in line


@pytest.mark.parametrize("pair, prepend_bos, needle", [
    (("hello world t1 t2", "goodbye moon t3 t4", " t5", " t6"), None, "does not know 'hello', 'world'"),
    (("x" * 10000, "y" * 10000, " t1", " t2"), None, "does not know 'xxxx"),
    (("t1 t2", "t1 t3", " 2", " t5"), None, "answer: given ' 2', of which the model's tokenizer does not know '2'"),
    (("t1 t2", "t1 t3", " t4", " 5"), None, "wrong: given ' 5'"),
    ((" ", "\t", " t2", " t3"), False, "the clean prompt ' ' is no token at all"),
])
def test_text_the_tokenizer_cannot_write_is_refused_naming_the_pair(pair, prepend_bos, needle):
    """Words the tokenizer does not know become its unknown token (the bundled model's is its BOS, id 0): a 10,000
    character prompt read as one placeholder, prompts that differ only there read alike, an unknown answer scored as
    the placeholder. A prompt that is no token at all would have no position to read the answer at. Each is refused
    when the task is tokenized (so by the scan and by ``edge_effects`` alike), naming the pair and what it holds."""
    import circuitkit as ck
    from circuitkit import zoo

    model = zoo.load()
    task = Task.from_pairs([pair] * 4)
    calls = (lambda: task.tokenize(model, prepend_bos=prepend_bos),
             lambda: ck.scan(model, task=task, prepend_bos=prepend_bos, progress=False),
             lambda: ck.tasks.edge_effects(model, task, ["1.3->logits"], prepend_bos=prepend_bos, progress=False))
    for call in calls:
        with pytest.raises(CircuitkitError, match="pair 0: ") as caught:
            call()
        assert needle in str(caught.value) and "\n" not in str(caught.value)
    known = Task.from_pairs([("t1 t2 t3", "t1 t2 t4", " t5", " t6")] * 4).tokenize(model)
    assert known.clean[0].tolist() == [0, 1, 2, 3]  # the BOS, then the three words
