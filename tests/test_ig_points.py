"""EAP-IG's sample points: ``left`` (EAP-IG's own, ``alpha = k / steps``, ``k = 0 .. steps - 1``) and ``right``
(``k = 1 .. steps``), checked against autograd run by hand at each point of the path (a dense oracle)."""

from __future__ import annotations

import pytest
import torch

from circuitkit import CircuitkitError
from circuitkit.graph.runner import TaskRunner, ig_alphas
from circuitkit.models.adapters import HOOKS, adapt
from circuitkit.tasks import Task
from tests.conftest import boot_bridge
from tests.test_tasks import toy_pairs

N_LAYERS = 3


@pytest.fixture(scope="module", params=["mha-mlp", "gqa-mlp"])
def runner(request):
    kv = 2 if request.param == "gqa-mlp" else None
    model = boot_bridge(attn_only=False, n_layers=N_LAYERS, n_key_value_heads=kv, d_vocab=50, seed=3)
    adapter = adapt(model)
    pairs = [p for p in toy_pairs(9, d_vocab=50) if len(p[0]) == 6]  # one length: no padding in the oracle
    task = Task.from_pairs(pairs, name="toy")
    return TaskRunner(adapter, task.tokenize(adapter), "logit_diff", mlps=True, ablation="corrupted")


def _gradients_at(runner, alpha: float) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
    """dM/dz per layer ``[pair, pos, head, d_head]`` and dM/d(final residual stream) ``[pair, pos, d_model]`` with
    the input embeddings set to ``e' + alpha (e - e')``; ``M``: the mean logit difference over the pairs."""
    model, batch = runner.adapter.model, runner.batch
    kept: dict[str, torch.Tensor] = {}

    def keep(name):
        def hook(x, hook):
            kept[name] = x.detach().clone()
        return hook

    with torch.no_grad():
        model.run_with_hooks(batch.clean, fwd_hooks=[(HOOKS.resid_pre(0), keep("clean"))])
        model.run_with_hooks(batch.corrupted, fwd_hooks=[(HOOKS.resid_pre(0), keep("corrupted"))])
    leaves: dict[str, torch.Tensor] = {}

    def interpolate(x, hook):
        return kept["corrupted"] + alpha * (kept["clean"] - kept["corrupted"])

    def leaf(name):
        def hook(x, hook):
            leaves[name] = torch.zeros_like(x, requires_grad=True)
            return x + leaves[name]
        return hook

    hooks = [(HOOKS.resid_pre(0), interpolate)]
    hooks += [(HOOKS.z(layer), leaf(f"z{layer}")) for layer in range(N_LAYERS)]
    hooks += [(f"blocks.{N_LAYERS - 1}.hook_resid_post", leaf("final"))]
    with torch.enable_grad():
        logits = model.run_with_hooks(batch.clean, fwd_hooks=hooks)
        rows = torch.arange(batch.n_pairs)
        last = logits[rows, batch.last]
        m = (last[rows, batch.answers[:, 0]] - last[rows, batch.wrongs[:, 0]]).mean()
        names = [f"z{layer}" for layer in range(N_LAYERS)] + ["final"]
        grads = torch.autograd.grad(m, [leaves[n] for n in names])
    return {layer: grads[layer] for layer in range(N_LAYERS)}, grads[-1]


def _oracle(runner, alphas: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """Heads' node scores ``[layer, head]`` and every sender's score into the logits ``[sender]``: the difference
    clean - corrupted times the mean over ``alphas`` of the gradient (the Riemann sum of EAP-IG's path integral)."""
    model, batch = runner.adapter.model, runner.batch
    z: dict[str, dict[int, torch.Tensor]] = {"clean": {}, "corrupted": {}}

    def keep(store, layer):
        def hook(x, hook):
            store[layer] = x.detach().clone()
        return hook

    for which, tokens in (("clean", batch.clean), ("corrupted", batch.corrupted)):
        with torch.no_grad():
            model.run_with_hooks(tokens, fwd_hooks=[(HOOKS.z(layer), keep(z[which], layer))
                                                    for layer in range(N_LAYERS)])
    points = [_gradients_at(runner, a) for a in alphas]
    heads = torch.stack([
        torch.einsum("bphd,bphd->h", z["clean"][layer] - z["corrupted"][layer],
                     sum(p[0][layer] for p in points) / len(points)) for layer in range(N_LAYERS)])
    final = sum(p[1] for p in points) / len(points)  # [pair, pos, d_model]
    delta = (runner.outputs(runner.clean) - runner.outputs(runner.corrupted)).float()  # [sender, pair, pos, d]
    into_logits = torch.einsum("sbpd,bpd->s", delta, final)
    return heads, into_logits


def _head_scores(runner, node_scores: torch.Tensor) -> torch.Tensor:
    H = runner.spec.n_heads
    return torch.stack([torch.stack([node_scores[runner.graph.sender_index(layer, h)] for h in range(H)])
                        for layer in range(N_LAYERS)])


def test_the_points_of_each_rule():
    assert ig_alphas(5, "left").tolist() == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.8])
    assert ig_alphas(5, "right").tolist() == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    assert ig_alphas(1, "left").tolist() == [0.0] and ig_alphas(1, "right").tolist() == [1.0]
    with pytest.raises(CircuitkitError, match="'middle'.*'left', 'right'"):
        ig_alphas(3, "middle")
    for bad in (0, -2, 2.5, "3", True):
        with pytest.raises(CircuitkitError, match="integrated gradients: steps"):
            ig_alphas(bad, "left")


def test_every_engine_reads_one_path():
    """The induction scan's interior points are Python's ``k / steps`` rounded to each precision (what its passes
    used before they read :mod:`circuitkit.ig_path`), and :func:`along` is ``x' + alpha (x - x')`` point by point."""
    from circuitkit.ig_path import along

    for steps in (1, 2, 3, 7, 10, 64, 999):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            got = ig_alphas(steps, "interior").to(dtype)
            want = torch.tensor([k / steps for k in range(1, steps)], dtype=dtype)
            assert torch.equal(got, want), (steps, dtype)
    assert ig_alphas(4, "interior").tolist() == [0.25, 0.5, 0.75]
    g = torch.Generator().manual_seed(0)
    start, end = torch.randn(2, 3, 5, generator=g), torch.randn(2, 3, 5, generator=g)
    alphas = ig_alphas(4, "left")
    stacked = along(start[None], end[None], alphas)
    assert stacked.shape == (4, 2, 3, 5)
    for i, a in enumerate(alphas.tolist()):
        torch.testing.assert_close(stacked[i], start + a * (end - start), rtol=0, atol=0)
        torch.testing.assert_close(along(start, end, a), stacked[i], rtol=0, atol=0)
    torch.testing.assert_close(stacked[0], start, rtol=0, atol=0)  # alpha = 0: the baseline itself
    half = along(start.bfloat16()[None], end.bfloat16()[None], alphas)
    assert half.dtype == torch.bfloat16  # interpolated in the run's own precision


def test_one_left_point_is_the_gradient_at_the_corrupted_input(runner):
    """``steps=1``, EAP-IG's points: the gradient at ``alpha = 0`` (the corrupted input) times the difference."""
    heads, into_logits = _oracle(runner, [0.0])
    torch.testing.assert_close(_head_scores(runner, runner.node_gradients(1, "left")), heads, atol=2e-5, rtol=1e-4)
    scores, _ = runner.edge_gradients(1, "left")
    torch.testing.assert_close(scores[:, runner.graph.logits_index], into_logits, atol=2e-5, rtol=1e-4)
    clean_heads, _ = _oracle(runner, [1.0])  # and not the clean point's (the test can tell them apart)
    assert (clean_heads - heads).abs().max() > 1e-3


@pytest.mark.parametrize("points", ["left", "right"])
def test_both_point_sets_equal_the_riemann_sum(runner, points):
    steps = 3
    alphas = [(k + (points == "right")) / steps for k in range(steps)]
    heads, into_logits = _oracle(runner, alphas)
    torch.testing.assert_close(_head_scores(runner, runner.node_gradients(steps, points)), heads,
                               atol=2e-5, rtol=1e-4)
    scores, _ = runner.edge_gradients(steps, points)
    torch.testing.assert_close(scores[:, runner.graph.logits_index], into_logits, atol=2e-5, rtol=1e-4)


def test_scan_task_records_its_points_and_refuses_others():
    from circuitkit.tasks import scan_task

    model = boot_bridge(attn_only=True, n_layers=2, d_vocab=50, seed=3)
    task = Task.from_pairs(toy_pairs(), name="toy")
    with pytest.raises(CircuitkitError, match="ig_points.*'both'.*'left', 'right'"):
        scan_task(model, task, ig_points="both")
    result = scan_task(model, task, steps=1, edges=False, ig_points="right", n_resamples=20)
    assert result.settings["ig_points"] == "right"
    assert scan_task(model, task, steps=1, edges=False, n_resamples=20).settings["ig_points"] == "left"
