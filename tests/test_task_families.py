"""Node circuits on families whose heads do not add into the residual stream (a norm or a scale after attention):
the task scan's node circuit, its faithfulness and necessity, against a hand-written z-patching computation on the
Hugging Face model alone (plain PyTorch forward pre-hooks on each layer's ``o_proj``: its input is every head's
``z``, concatenated), and the answer says the edges were not measured.

    faithfulness(C) = (m_C - m_all) / (m_clean - m_all)     necessity = m_clean - m_{only C patched}
"""

from __future__ import annotations

import pytest
import torch

from circuitkit.models import load_model
from circuitkit.tasks import Task, scan_task
from tests.test_families import CONFIGS

FAITH_TOL = 1e-4
"""The bridge runs Hugging Face's own modules (logits agree to <= 2e-7); the ratio divides by a gap of ~0.1."""
FAMILIES = ("Gemma 2", "Gemma 3", "OLMo 2", "EXAONE 4", "Granite")
PAIRS = [([5, 9, 12, 7, 30, 9], [5, 11, 12, 7, 30, 9], [12], [5]),
         ([6, 13, 8, 40, 6, 13], [6, 21, 8, 40, 6, 13], [8], [6]),
         ([17, 3, 25, 33, 17, 3], [17, 44, 25, 33, 17, 3], [25], [17]),
         ([50, 8, 61, 2, 50, 8], [50, 19, 61, 2, 50, 8], [61], [50])]
"""Equal lengths (the hand computation runs one unpadded batch); the last token is the same in both prompts."""


@pytest.fixture(scope="module", params=FAMILIES, ids=lambda n: n.lower().replace(" ", "-"))
def family_model(request, tmp_path_factory):
    import transformers

    config_class, model_class, sizes = CONFIGS[request.param]
    torch.manual_seed(1)
    config = getattr(transformers, config_class)(**sizes)
    config._attn_implementation = "eager"
    hf = getattr(transformers, model_class)(config).eval()
    directory = tmp_path_factory.mktemp("family")
    hf.save_pretrained(str(directory), safe_serialization=True)
    return request.param, hf, load_model(str(directory))


def _pair_tensors() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:data:`PAIRS` as tensors: clean and corrupted prompts ``[pair, pos]``, first answer and wrong ``[pair]``."""
    return (torch.tensor([p[0] for p in PAIRS]), torch.tensor([p[1] for p in PAIRS]),
            torch.tensor([p[2][0] for p in PAIRS]), torch.tensor([p[3][0] for p in PAIRS]))


def _by_hand(hf, patched: torch.Tensor) -> float:
    """Mean logit(answer) - logit(wrong) at the last token with each head where ``patched`` [layer, head] is True
    given its ``z`` from the corrupted prompt (recorded on the corrupted prompts first)."""
    clean, corrupted, answers, wrongs = _pair_tensors()
    layers = hf.model.layers
    n_heads = hf.config.num_attention_heads
    kept: dict[int, torch.Tensor] = {}

    def record(layer):
        def hook(module, args):
            kept[layer] = args[0].detach().clone()
        return hook

    def patch(layer):
        def hook(module, args):
            z = args[0].view(*args[0].shape[:2], n_heads, -1).clone()
            theirs = kept[layer].view_as(z)
            z[:, :, patched[layer]] = theirs[:, :, patched[layer]]
            return (z.view_as(args[0]),)
        return hook

    with torch.no_grad():
        handles = [layer.self_attn.o_proj.register_forward_pre_hook(record(i)) for i, layer in enumerate(layers)]
        hf(corrupted)
        for h in handles:
            h.remove()
        handles = [layer.self_attn.o_proj.register_forward_pre_hook(patch(i)) for i, layer in enumerate(layers)]
        logits = hf(clean).logits[:, -1]
        for h in handles:
            h.remove()
    rows = torch.arange(len(PAIRS))
    return float((logits[rows, answers] - logits[rows, wrongs]).mean())


def test_node_circuit_equals_hand_written_z_patching(family_model):
    name, hf, bridge = family_model
    task = Task.from_pairs(PAIRS, name="copy")
    result = scan_task(bridge, task, target=0.5, n_resamples=20)
    c = result.circuit
    assert c is not None, result.circuit_error
    L, H = hf.config.num_hidden_layers, hf.config.num_attention_heads
    outside = torch.ones(L, H, dtype=torch.bool)
    for layer, head in c.heads:
        outside[layer, head] = False
    m_clean = _by_hand(hf, torch.zeros(L, H, dtype=torch.bool))
    m_all = _by_hand(hf, torch.ones(L, H, dtype=torch.bool))
    m_circuit = _by_hand(hf, outside)
    assert float(result.clean.mean()) == pytest.approx(m_clean, abs=1e-5)
    assert c.node_corrupted == pytest.approx(m_all, abs=1e-5)
    assert c.faithfulness == pytest.approx((m_circuit - m_all) / (m_clean - m_all), abs=FAITH_TOL)
    assert c.necessity == pytest.approx(m_clean - _by_hand(hf, ~outside), abs=1e-5)
    # no edge was measured, and the answer and the record say so
    assert c.edges == () and c.edge_faithfulness is None and result.dla is None
    assert result.settings["edges"] is False and "z @ W_O" in result.settings["edges_not_measured"]
    assert "Edge circuit: not measured" in result.answer() and "no edge" not in result.answer()
    assert result.to_json()["circuit"]["edges"] == []


def test_node_scores_are_the_first_order_estimate_of_patching_a_head(family_model):
    """With one IG step the node score is plain attribution patching at ``z``: ``(z - z') . dM/dz`` at the clean
    run, checked against a finite-difference-free oracle: autograd on the Hugging Face model through the same
    pre-hooks."""
    from circuitkit.graph.runner import TaskRunner
    from circuitkit.models.adapters import adapt

    _, hf, bridge = family_model
    task = Task.from_pairs(PAIRS, name="copy")
    adapter = adapt(bridge)
    runner = TaskRunner(adapter, task.tokenize(adapter), "logit_diff", mlps=False, ablation="corrupted")
    scores = runner.node_gradients(1, "right")  # at the clean run
    clean, corrupted, answers, wrongs = _pair_tensors()
    layers = hf.model.layers
    n_heads = hf.config.num_attention_heads
    z_corr, z_clean = {}, {}

    def record(store, i):
        def hook(module, args):
            store[i] = args[0]
            if args[0].requires_grad:
                args[0].retain_grad()
        return hook

    with torch.no_grad():
        handles = [layer.self_attn.o_proj.register_forward_pre_hook(record(z_corr, i)) for i, layer in
                   enumerate(layers)]
        hf(corrupted)
        for h in handles:
            h.remove()
    handles = [layer.self_attn.o_proj.register_forward_pre_hook(record(z_clean, i)) for i, layer in
               enumerate(layers)]
    logits = hf(clean).logits[:, -1]
    for h in handles:
        h.remove()
    rows = torch.arange(len(PAIRS))
    (logits[rows, answers] - logits[rows, wrongs]).mean().backward()
    hf.zero_grad(set_to_none=True)
    for i in range(len(layers)):
        delta = (z_clean[i] - z_corr[i]).detach()
        per = (delta * z_clean[i].grad).view(*delta.shape[:2], n_heads, -1).sum(dim=(0, 1, 3))
        for h in range(n_heads):
            assert float(scores[runner.graph.sender_index(i, h)]) == pytest.approx(float(per[h]), abs=1e-5)


def test_a_bidirectional_model_is_refused_before_it_loads(tmp_path, monkeypatch, capsys):
    import transformers

    import circuitkit as ck
    from circuitkit import CircuitkitError, cli
    from circuitkit.models import loading

    config_class, model_class, sizes = CONFIGS["BERT"]
    getattr(transformers, model_class)(getattr(transformers, config_class)(**sizes)).save_pretrained(str(tmp_path))

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(loading, "load_model", never)
    with pytest.raises(CircuitkitError, match="bidirectional"):
        ck.scan(str(tmp_path), task="ioi")
    assert cli.main(["scan", str(tmp_path), "--task", "ioi", "--out", str(tmp_path / "o")]) == 2
    assert "bidirectional" in capsys.readouterr().err


def test_the_family_table_says_what_a_task_scan_measures():
    from circuitkit.models.families import FAMILIES

    by_name = {f.name: f.task_circuits for f in FAMILIES}
    assert by_name["Llama"] == "nodes and edges"
    assert by_name["Gemma 2"].startswith("nodes (no edges") and by_name["Granite"].startswith("nodes (no edges")
    assert by_name["BERT"].startswith("no (bidirectional")


def test_the_induction_answer_claims_no_edge_finding_without_a_patched_edge():
    import dataclasses

    from circuitkit.report.summary import answer_parts, find_answer
    from tests.report_fixtures import synthetic_scan

    answer = find_answer(synthetic_scan(3, 4, verified=True))
    assert len(answer.circuit) > 1

    def edges_line(a) -> str:
        return " ".join(str(v) for label, parts in answer_parts(a) if label == "Edges" for _, v in parts)

    silent = dataclasses.replace(answer, edges=(), n_silent=3)
    assert "carries a measurable effect (3 path-patched)" in edges_line(silent)
    unmeasured = dataclasses.replace(answer, edges=(), n_silent=0)
    assert edges_line(unmeasured).startswith("not measured") and "carries" not in edges_line(unmeasured)
