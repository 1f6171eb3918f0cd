"""Per-query-head key/value edges (``kv_edges="per-query-head"``) on grouped-query models, checked against a dense
oracle: a hand-written forward of a tiny grouped-query transformer (LayerNorm, MLPs) in which every receiver of the
edge graph reads its own input, each query head computing its keys and values from its own (patched) residual
stream while the other heads of its group keep theirs.

Oracles: that forward with edges patched (the edge metric) and differentiated at EAP-IG's points (the edge scores);
the identity between the two graphs' gradient scores (a grouped key/value edge's score is the sum of its query
heads' scores: the grouped input is read by every head of its group, so its gradient is their sum); a grouped
circuit written per query head patches the same thing (also on a rotary model); EAP-IG's own edge count.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import torch

from circuitkit import CircuitkitError, tasks
from circuitkit.graph.runner import TaskRunner, build_graph
from circuitkit.models.adapters import adapt
from circuitkit.tasks import Task, scan_task
from tests.conftest import boot_bridge
from tests.test_tasks import toy_pairs

LAYERS, HEADS, KV = 3, 4, 2
GROUP = HEADS // KV


def _model(**extra):
    return boot_bridge(attn_only=False, n_layers=LAYERS, n_heads=HEADS, n_key_value_heads=KV, d_vocab=50, seed=3,
                       **extra)


@pytest.fixture(scope="module")
def runners():
    adapter = adapt(_model())
    batch = Task.from_pairs(toy_pairs(), name="toy").tokenize(adapter)
    grouped = TaskRunner(adapter, batch, "logit_diff", mlps=True, ablation="corrupted")
    per_head = TaskRunner(adapter, batch, "logit_diff", mlps=True, ablation="corrupted", kv_edges="per-query-head")
    return grouped, per_head


# ---------------------------------------------------------------------------------------------- the dense oracle
def _parameters(model) -> dict:
    """The native model's parameters by short name (``l0.q.weight``, ``embed``, ``pos``, ``ln_out.weight`` ...)."""
    out = {}
    for name, value in model.original_model.state_dict().items():
        parts = [p for p in name.split(".") if p != "_original_component"]
        if parts[0] == "layers" and parts[2] == "attn":  # layers.L.attn.q.weight
            key = f"l{parts[1]}.{parts[3]}.{parts[4]}"
        elif parts[0] == "layers":  # layers.L.ln1.weight, layers.L.mlp.fc_in.weight
            key = f"l{parts[1]}." + ".".join(parts[2:])
        else:
            key = ".".join(parts)
        out.setdefault(key, value.detach())
    return out


def dense(model, tokens, kept=None, corrupt=None, start=None, leaves=None):
    """The model by hand with every receiver reading its own input. Receivers ``l.h:q|k|v`` (one per query head),
    ``m{l}``, ``logits``; senders ``input``, ``l.h``, ``m{l}``. A receiver ``r`` reads the residual stream plus
    ``corrupt[u] - out[u]`` for every earlier sender ``u`` whose edge ``kept(u, r)`` is False (``corrupt``: the
    corrupted run's outputs by sender name); ``start`` replaces the embeddings; ``leaves`` (receiver -> tensor) is
    added to a receiver's input. Returns the logits and every sender's output by name."""
    p, cfg = _parameters(model), model.cfg
    eps, d_head, P = cfg.eps, cfg.d_head, tokens.shape[1]
    act = model.original_model.layers[0].mlp.original_component.act

    def ln(x, prefix):
        x = x - x.mean(-1, keepdim=True)
        return x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt() * p[f"{prefix}.weight"] + p[f"{prefix}.bias"]

    def linear(x, prefix, rows=slice(None)):
        return x @ p[f"{prefix}.weight"][rows].T + p[f"{prefix}.bias"][rows]

    x0 = p["tok_embed.weight"][tokens] + p["pos.weight"][:P] if start is None else start
    outs = {"input": x0}
    resid = x0

    def reads(receiver):
        x = resid
        if corrupt is not None:
            for sender, out in outs.items():
                if not kept(sender, receiver):
                    x = x + corrupt[sender] - out
        if leaves is not None and receiver in leaves:
            x = x + leaves[receiver]
        return x

    future = torch.triu(torch.ones(P, P, dtype=torch.bool), diagonal=1)
    for layer in range(cfg.n_layers):
        pre = f"l{layer}"
        heads = {}
        for h in range(cfg.n_heads):
            g = h // (cfg.n_heads // cfg.n_key_value_heads)
            own = slice(h * d_head, (h + 1) * d_head)
            group = slice(g * d_head, (g + 1) * d_head)
            q = linear(ln(reads(f"{layer}.{h}:q"), f"{pre}.ln1"), f"{pre}.q", own)
            k = linear(ln(reads(f"{layer}.{h}:k"), f"{pre}.ln1"), f"{pre}.k", group)
            v = linear(ln(reads(f"{layer}.{h}:v"), f"{pre}.ln1"), f"{pre}.v", group)
            scores = (q @ k.transpose(-1, -2) / d_head ** 0.5).masked_fill(future, float("-inf"))
            z = scores.softmax(-1) @ v
            heads[f"{layer}.{h}"] = z @ p[f"{pre}.o.weight"][:, own].T
        outs.update(heads)
        resid = resid + sum(heads.values()) + p[f"{pre}.o.bias"]
        mlp = linear(act(linear(ln(reads(f"m{layer}"), f"{pre}.ln2"), f"{pre}.mlp.fc_in")), f"{pre}.mlp.fc_out")
        outs[f"m{layer}"] = mlp
        resid = resid + mlp
    final = ln(reads("logits"), "ln_out")
    return final @ p["head.weight"].T, outs


def _metric(logits, batch):
    rows = torch.arange(batch.n_pairs)
    last = logits[rows, batch.last]
    return (last[rows, batch.answers[:, 0]] - last[rows, batch.wrongs[:, 0]]).mean()


def test_the_oracle_is_the_model():
    """The hand-written forward (nothing patched) gives the model's own logits: the oracle is this model."""
    model = _model()
    tokens = torch.tensor([[3, 9, 4, 17, 2, 8]])
    ours, _ = dense(model, tokens)
    with torch.no_grad():
        theirs = model(tokens)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_graph_counts_per_query_head_and_eap_igs_count():
    adapter = adapt(_model())
    grouped, per_head = build_graph(adapter, mlps=True), build_graph(adapter, mlps=True, kv_edges="per-query-head")
    assert len(per_head.receivers) == LAYERS * (3 * HEADS + 1) + 1
    assert len(grouped.receivers) == LAYERS * (HEADS + 2 * KV + 1) + 1
    assert "1.3:k" in per_head.receivers and "1.g1:k" not in per_head.receivers
    assert per_head.kv_copies == GROUP and grouped.kv_copies == 1
    names = set(per_head.edge_names(per_head.allowed.nonzero()))
    assert "0.1->1.3:k" in names and "m0->2.2:v" in names and "1.0->1.1:k" not in names
    # EAP-IG's graph of a 30-layer model of 9 query heads and 3 key/value heads: 123,211 edges; grouped: 70,651
    big = adapt(boot_bridge(attn_only=False, n_layers=30, n_heads=9, n_key_value_heads=3, d_model=18, d_head=2,
                            n_ctx=8, d_vocab=11))
    assert build_graph(big, mlps=True, kv_edges="per-query-head").n_edges == 123_211
    assert build_graph(big, mlps=True).n_edges == 70_651
    # multi-head attention: one graph whatever the option
    mha = adapt(boot_bridge(attn_only=False, n_layers=2, n_heads=4))
    a, b = build_graph(mha, mlps=True), build_graph(mha, mlps=True, kv_edges="per-query-head")
    assert a.receivers == b.receivers and torch.equal(a.allowed, b.allowed) and b.kv_copies == 1
    with pytest.raises(CircuitkitError, match="kv_edges.*'grouped', 'per-query-head'"):
        build_graph(adapter, mlps=True, kv_edges="per-head")


def _kept_fn(graph, mask):
    index = {name: i for i, name in enumerate(graph.senders)}, {name: i for i, name in enumerate(graph.receivers)}
    return lambda sender, receiver: bool(mask[index[0][sender], index[1][receiver]])


def test_edge_patching_equals_the_dense_oracle(runners):
    """Random circuits (a query head's key edge kept while its group-mate's is patched, and the reverse): the
    metric with every other edge patched equals the hand-written forward's."""
    _, runner = runners
    graph, batch, model = runner.graph, runner.batch, runner.adapter.model
    _, corrupt = dense(model, batch.corrupted)
    masks = []
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        masks.append((torch.rand(graph.allowed.shape, generator=g) < 0.5) & graph.allowed)
    got = runner.edge_metric(torch.stack(masks))
    for mask, value in zip(masks, got.tolist(), strict=True):
        logits, _ = dense(model, batch.clean, _kept_fn(graph, mask), corrupt)
        assert value == pytest.approx(float(_metric(logits, batch)), abs=1e-5)
    # the per-query-head patch matters: the first mask's key edges kept for one head of each group only differ
    # from the same mask with the group's keys kept together
    one = masks[0].clone()
    cols = [graph.receivers.index(f"{layer}.{h}:k") for layer in range(LAYERS) for h in range(HEADS)]
    one[:, cols] = False
    one[:, cols[::GROUP]] = graph.allowed[:, cols[::GROUP]]
    both = one.clone()
    both[:, cols] = graph.allowed[:, cols]
    a, b = runner.edge_metric(torch.stack([one, both])).tolist()
    assert a != pytest.approx(b, abs=1e-4)
    assert a == pytest.approx(float(_metric(dense(model, batch.clean, _kept_fn(graph, one), corrupt)[0], batch)),
                              abs=1e-5)


def test_query_heads_with_the_same_edges_share_a_copy():
    """One key/value head for 4 query heads: circuits where some heads of the group keep the same key/value edges
    run one copy per distinct head (counted in the passes), and equal the oracle."""
    model = boot_bridge(attn_only=False, n_layers=2, n_heads=4, n_key_value_heads=1, d_vocab=50, seed=5)
    adapter = adapt(model)
    batch = Task.from_pairs(toy_pairs(), name="toy").tokenize(adapter)
    runner = TaskRunner(adapter, batch, "logit_diff", mlps=True, ablation="corrupted", kv_edges="per-query-head")
    graph = runner.graph
    _, corrupt = dense(model, batch.corrupted)
    base = (torch.rand(graph.allowed.shape, generator=torch.Generator().manual_seed(1)) < 0.5) & graph.allowed
    k = [graph.receivers.index(f"1.{h}:k") for h in range(4)]
    v = [graph.receivers.index(f"1.{h}:v") for h in range(4)]
    for h in range(1, 4):  # layer 0's heads and layer 1's values alike; layer 1's keys: heads 0 and 2 alike
        for layer_cols in ([graph.receivers.index(f"0.{h}:k")], [graph.receivers.index(f"0.{h}:v")], [v[h]]):
            base[:, layer_cols] = base[:, [layer_cols[0] - h]]
    base[:, k[0]] = graph.allowed[:, k[0]] & (torch.arange(len(graph.senders)) % 2 == 0)
    base[:, k[2]] = base[:, k[0]]
    base[:, k[1]] = graph.allowed[:, k[1]]
    base[:, k[3]] = False
    mixed = (torch.rand(graph.allowed.shape, generator=torch.Generator().manual_seed(2)) < 0.5) & graph.allowed
    cases = {3: base, 1: graph.allowed.clone(), 4: mixed}
    _ = runner.clean, runner.corrupted
    for copies, mask in cases.items():
        before = runner.passes
        got = float(runner.edge_metric(mask[None])[0])
        assert runner.passes - before == copies
        logits, _ = dense(model, batch.clean, _kept_fn(graph, mask), corrupt)
        assert got == pytest.approx(float(_metric(logits, batch)), abs=1e-5)
    before = runner.passes
    runner.edge_metric(torch.stack([cases[1], cases[3]]))  # stacked circuits run as many copies as the most needs
    assert runner.passes - before == 2 * 3


@pytest.mark.parametrize("steps", [1, 2])
def test_edge_scores_equal_the_dense_oracles_gradients(runners, steps):
    """EAP-IG's scores (the points in one pass of the pairs, each group's key/value gradient split by query head
    through its layer's pattern and ``z``) against the gradient of the hand-written forward at each receiver's own
    input, at EAP-IG's points."""
    _, runner = runners
    graph, batch, model = runner.graph, runner.batch, runner.adapter.model
    scores, node_scores = runner.edge_gradients(steps)
    _, clean = dense(model, batch.clean)
    _, corrupt = dense(model, batch.corrupted)
    expected = torch.zeros_like(scores)
    for k in range(steps):
        alpha = k / steps
        start = corrupt["input"] + alpha * (clean["input"] - corrupt["input"])
        leaves = {r: torch.zeros_like(start, requires_grad=True) for r in graph.receivers}
        logits, _ = dense(model, batch.clean, start=start, leaves=leaves)
        grads = torch.autograd.grad(_metric(logits, batch), [leaves[r] for r in graph.receivers])
        for j, grad in enumerate(grads):
            for i, sender in enumerate(graph.senders):
                if graph.allowed[i, j]:
                    expected[i, j] += float(((clean[sender] - corrupt[sender]) * grad).sum()) / steps
    torch.testing.assert_close(scores, expected, atol=2e-6, rtol=1e-4)
    torch.testing.assert_close(node_scores, expected.sum(1), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("steps", [1, 3])
def test_a_groups_per_query_head_scores_add_up_to_its_grouped_score(runners, steps):
    grouped, per_head = runners
    a, node_a = grouped.edge_gradients(steps)
    b, node_b = per_head.edge_gradients(steps)
    for layer in range(LAYERS):
        ga, gb = grouped.graph.receivers_of(layer), per_head.graph.receivers_of(layer)
        for channel in ("k", "v"):
            summed = b[:, gb[channel]].reshape(b.shape[0], KV, GROUP).sum(-1)
            torch.testing.assert_close(summed, a[:, ga[channel]], atol=1e-7, rtol=1e-5)
            assert not torch.allclose(b[:, gb[channel]][:, ::GROUP], b[:, gb[channel]][:, 1::GROUP], atol=1e-6)
        for channel in ("q", "mlp"):
            torch.testing.assert_close(b[:, gb[channel]], a[:, ga[channel]], atol=1e-7, rtol=1e-5)
    torch.testing.assert_close(node_b, node_a, atol=1e-6, rtol=1e-5)


def _per_head(grouped_graph, per_head_graph, mask):
    """A grouped circuit written per query head: each head's key/value edges are its group's."""
    out = torch.zeros_like(per_head_graph.allowed)
    for j, name in enumerate(per_head_graph.receivers):
        layer, _, rest = name.partition(".")
        if rest.endswith((":k", ":v")):
            head, channel = rest.split(":")
            name = f"{layer}.g{int(head) // GROUP}:{channel}"
        out[:, j] = mask[:, grouped_graph.receivers.index(name)]
    return out


@pytest.mark.parametrize("positions", ["standard", "rotary"])
def test_a_grouped_circuit_written_per_query_head_patches_the_same(positions):
    """Through the model's own attention (rotary positions included): a per-query-head circuit whose heads of a
    group keep the same edges is the grouped circuit."""
    adapter = adapt(_model(positional_embedding_type=positions))
    batch = Task.from_pairs(toy_pairs(), name="toy").tokenize(adapter)
    grouped = TaskRunner(adapter, batch, "logit_diff", mlps=True, ablation="corrupted")
    per_head = TaskRunner(adapter, batch, "logit_diff", mlps=True, ablation="corrupted", kv_edges="per-query-head")
    masks = [(torch.rand(grouped.graph.allowed.shape, generator=torch.Generator().manual_seed(s)) < 0.4)
             & grouped.graph.allowed for s in range(2)]
    a = grouped.edge_metric(torch.stack(masks))
    b = per_head.edge_metric(torch.stack([_per_head(grouped.graph, per_head.graph, m) for m in masks]))
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    ends = per_head.edge_metric(torch.stack([per_head.graph.allowed, torch.zeros_like(per_head.graph.allowed)]))
    assert float(ends[0]) == pytest.approx(float(per_head.clean["metric"].mean()), abs=1e-5)
    assert float(ends[1]) == pytest.approx(float(per_head.corrupted["metric"].mean()), abs=1e-5)


# ---------------------------------------------------------------------------------------------- the scan
def test_a_per_query_head_scan_saves_checks_and_reloads(tmp_path):
    from circuitkit.tasks.scan import TaskScan
    from circuitkit.tasks.scores_check import check_task_scores

    task = Task.from_pairs(toy_pairs(12), name="toy")
    scan = scan_task(_model(), task, target=0.8, n_resamples=50, kv_edges="per-query-head")
    c = scan.circuit
    assert scan.settings["kv_edges"] == "per-query-head"
    steps = scan.settings["ig_steps"]  # each edge set runs a copy per query head of a group; EAP-IG one a point
    ran = {stage.name: stage.passes for stage in scan.stages}
    assert ran["attribute"] == pytest.approx(3 * steps) == scan.settings["plan"]["attribute"]
    assert "corrupted" not in ran  # EAP-IG's first point is the corrupted run, per-query-head receivers or not
    # whole copies of the pairs, or (the strongest edges' effects, resumed) their share of the layers
    assert ran["edges"] * LAYERS == pytest.approx(round(ran["edges"] * LAYERS)) and ran["edges"] > 0
    assert c.n_edges_total == build_graph(adapt(_model()), mlps=True, kv_edges="per-query-head").n_edges
    receivers = {name.split("->")[1] for name in c.edges}
    assert not any(".g" in r for r in receivers)
    assert "Edge circuit:" in scan.answer()
    saved = scan.save(tmp_path / "out")
    data = json.loads(saved.scores.read_text())
    check_task_scores(data, "scores.json")
    schema = json.loads((Path(tasks.__file__).parent / "task_scores.schema.json").read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator(schema).validate(data)
    again = TaskScan.load(tmp_path / "out")
    assert again.circuit.edges == c.edges and again.settings["kv_edges"] == "per-query-head"
    assert again.answer() == scan.answer()
    assert "<svg" in saved.report.read_text()
    # a grouped receiver in a per-query-head file, and a query head's key receiver in a grouped one, are refused
    bad = json.loads(json.dumps(data))
    bad["circuit"]["edges"][0] = "0.1->1.g0:k"
    with pytest.raises(CircuitkitError, match="key/value receiver of the scan's graph"):
        check_task_scores(bad, "scores.json")
    bad["settings"]["kv_edges"] = "grouped"
    bad["circuit"]["edges"][0] = "0.1->1.3:k"
    with pytest.raises(CircuitkitError, match="key/value receiver of the scan's graph"):
        check_task_scores(bad, "scores.json")
    bad["settings"]["kv_edges"] = "per-head"
    with pytest.raises(CircuitkitError, match="settings.kv_edges"):
        check_task_scores(bad, "scores.json")


def test_the_option_reaches_scan_task_and_is_checked():
    import circuitkit as ck

    task = Task.from_pairs(toy_pairs(6), name="toy")
    with pytest.raises(CircuitkitError, match="kv_edges.*'grouped', 'per-query-head'"):
        scan_task(_model(), task, kv_edges="per-head")
    assert ck.scan(_model(), task=task, edges=False, kv_edges="per-query-head",
                   n_resamples=20).settings["kv_edges"] == "per-query-head"
    assert scan_task(_model(), task, edges=False, n_resamples=20).settings["kv_edges"] == "grouped"
    with pytest.raises(CircuitkitError, match="kv_edges"):
        ck.scan(_model(), kv_edges="per-query-head")


def test_eap_ig_per_query_head_without_a_pattern_hook_says_so(monkeypatch):
    """The split by query head reads each layer's pattern and ``z``: a model whose attention does not call its
    pattern hook gets an error naming the hooks, not key scores of zero."""
    adapter = adapt(_model())
    batch = Task.from_pairs(toy_pairs(), name="toy").tokenize(adapter)
    runner = TaskRunner(adapter, batch, "logit_diff", mlps=True, ablation="corrupted", kv_edges="per-query-head")
    _ = runner.clean, runner.corrupted
    run = adapter.run

    def without_patterns(tokens, hooks, **kw):
        return run(tokens, [(name, fn) for name, fn in hooks if not name.endswith("hook_pattern")], **kw)

    monkeypatch.setattr(adapter, "run", without_patterns)
    with pytest.raises(CircuitkitError, match=r"without calling the hooks \['blocks\.0\.attn\.hook_pattern'"):
        runner.attribute(2)


def test_eap_ig_per_query_head_of_a_bfloat16_model_agrees_with_float32():
    """The split by query head in the model's own precision: a bfloat16 grouped-query model's per-query-head
    EAP-IG scores against the same weights in float32 (bfloat16 keeps 8 bits: a few percent of the largest score),
    each key/value edge's score included."""
    from tests.conftest import gqa_bridge

    scores = {}
    for dtype in (torch.float32, torch.bfloat16):
        adapter = adapt(gqa_bridge(dtype))
        batch = Task.from_pairs(toy_pairs(), name="toy").tokenize(adapter)
        runner = TaskRunner(adapter, batch, "logit_diff", mlps=True, ablation="corrupted", kv_edges="per-query-head")
        scores[dtype], _, _ = runner.attribute(2)
        assert runner.passes == 1 + 3 * 2  # the clean run, and one copy of the pairs a point (the first corrupted)
    full, half = scores[torch.float32], scores[torch.bfloat16]
    assert torch.isfinite(half).all() and half.dtype == torch.float32
    largest = float(full.abs().max())
    # every edge within a tenth of the largest score (the grouped graph's input -> m0 differs by 5.5% here too)
    torch.testing.assert_close(half, full, atol=0.1 * largest, rtol=0)
    graph = runner.graph
    kv = [graph.receivers.index(name) for name in graph.receivers if name.endswith((":k", ":v"))]
    assert float(full[:, kv].abs().max()) > 0.5 * largest  # the key/value edges carry the largest scores here
    torch.testing.assert_close(half[:, kv], full[:, kv], atol=0.03 * largest, rtol=0)
