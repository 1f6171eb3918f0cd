"""Shared fixtures: tiny random-init models and weights, no downloads. Every generator is seeded."""

from __future__ import annotations

import os

from circuitkit.cpu_threads import prefer_passive_waiting

prefer_passive_waiting()  # before torch loads, as the CLI: the suite's idle threads sleep, not spin, beside other work

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import settings  # noqa: E402

from circuitkit import HeadWeights  # noqa: E402

# CI runs the property tests on a fixed sequence of examples, so a CI result can be reproduced exactly;
# locally hypothesis keeps exploring new examples.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


def boot_bridge(
    *,
    n_layers: int = 2,
    n_heads: int = 4,
    d_model: int = 32,
    d_head: int = 8,
    d_vocab: int = 50,
    n_ctx: int = 64,
    attn_only: bool = True,
    n_key_value_heads: int | None = None,
    seed: int = 0,
    **extra,
):
    """A random-init TransformerLens 4.x ``TransformerBridge`` built offline (``models.bridge.native_bridge``)."""
    from circuitkit.models.bridge import native_bridge

    return native_bridge(
        n_layers=n_layers,
        n_heads=n_heads,
        d_model=d_model,
        d_head=d_head,
        d_vocab=d_vocab,
        n_ctx=n_ctx,
        attn_only=attn_only,
        n_key_value_heads=n_key_value_heads,
        seed=seed,
        **extra,
    )


def random_weights(
    n_layers: int = 3,
    n_heads: int = 4,
    d_model: int = 16,
    d_head: int = 4,
    *,
    n_kv_heads: int | None = None,
    d_vocab: int | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> HeadWeights:
    """Gaussian HeadWeights (entries N(0, 1/d_model)), optionally with W_E/W_U."""
    g = torch.Generator().manual_seed(seed)
    G = n_kv_heads or n_heads

    def randn(*shape):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) / d_model**0.5).to(dtype)

    extra = {}
    if d_vocab is not None:
        extra = {"W_E": randn(d_vocab, d_model), "W_U": randn(d_model, d_vocab)}
    return HeadWeights(
        W_Q=randn(n_layers, n_heads, d_model, d_head),
        W_K=randn(n_layers, G, d_model, d_head),
        W_V=randn(n_layers, G, d_model, d_head),
        W_O=randn(n_layers, n_heads, d_head, d_model),
        **extra,
    )


@pytest.fixture(scope="session")
def tiny_bridge():
    """2 layers x 4 heads, d_model 32, d_head 8, vocab 50, attention only."""
    return boot_bridge()


@pytest.fixture(scope="session")
def tiny_gqa_bridge():
    """As ``tiny_bridge`` but with 2 key/value groups of 2 query heads."""
    return boot_bridge(n_key_value_heads=2)


def gqa_bridge(dtype: torch.dtype = torch.float32):
    """A small random GQA model with LayerNorm and MLPs (3 layers, 2 key/value groups): the shape of a real model,
    seconds to run; in ``dtype``."""
    model = boot_bridge(n_layers=3, attn_only=False, normalization_type="LN", n_key_value_heads=2, seed=8, d_vocab=50)
    return model if dtype == torch.float32 else model.to(dtype)


def assert_close_json(a, b, path: str = "", tol: float = 1e-4) -> None:
    """Two JSON documents alike: every key, string and length equal; every number within ``tol`` (relative above
    1). Names the first path that differs."""
    import math

    if isinstance(a, dict):
        assert set(a) == set(b), path
        for key in a:
            assert_close_json(a[key], b[key], f"{path}/{key}", tol)
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_close_json(x, y, f"{path}[{i}]", tol)
    elif isinstance(a, float) and isinstance(b, (int, float)) and not isinstance(b, bool):
        assert math.isclose(a, b, rel_tol=tol, abs_tol=tol), (path, a, b)
    else:
        assert a == b, (path, a, b)


def unembedding_split_results(adapter, tokens, at):
    """For ``graph_positions`` None and ``at``: (logits, the gradient at layer 0's ``z`` of a loss read at ``at``,
    the gradient of the logits elsewhere or None), from one pass each with a zero leaf added to ``z``."""
    from circuitkit.models.adapters import HOOKS

    others = torch.tensor([p for p in range(tokens.shape[1]) if p not in at.tolist()])
    results = []
    for graph in (None, at):
        leaf = {}

        def on_z(z, hook, leaf=leaf):
            leaf["z"] = torch.zeros_like(z, requires_grad=True)
            return z + leaf["z"]

        with torch.enable_grad():
            logits = adapter.run(tokens, [(HOOKS.z(0), on_z)], graph_positions=graph)
            loss = logits[:, at].float().logsumexp(-1).sum()
            (grad,) = torch.autograd.grad(loss, leaf["z"], retain_graph=True)
            (elsewhere,) = torch.autograd.grad(logits[:, others].float().sum(), leaf["z"], allow_unused=True)
        results.append((logits.detach(), grad, elsewhere))
    return results


def mean_ablated_logits(model, tokens, heads):
    """Oracle written here, apart from circuitkit's ablation code: the logits of ``tokens`` with each of ``heads``'
    ``hook_z`` replaced by its clean mean over the batch and the positions."""
    _, cache = model.run_with_cache(tokens)

    def hook(z, hook):
        layer = int(hook.name.split(".")[1])
        z = z.clone()
        for lay, head in heads:
            if lay == layer:
                z[:, :, head] = cache[f"blocks.{layer}.attn.hook_z"][:, :, head].mean(dim=(0, 1))
        return z

    layers = sorted({layer for layer, _ in heads})
    with torch.no_grad():
        return model.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", hook) for layer in layers])


def repeated_copies_loss(logits, tokens, repeated) -> float:
    """The mean next-token cross-entropy at the ``repeated`` positions (a loop-free oracle of the scan's loss)."""
    ce = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), tokens[:, 1:], reduction="none")
    return float(ce[:, repeated].mean())


def require_browser() -> str:
    """The Chromium executable for browser tests (Playwright drives it). Missing Chromium or playwright skips
    the test locally but FAILS it under CI (``CI`` set), so a CI machine cannot silently skip the browser tests."""
    from circuitkit.report.png import find_chromium

    executable = find_chromium()
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        executable = None
    if executable is None:
        reason = "headless Chromium + playwright are needed (apt-get install chromium; pip install playwright)"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the browser test: {reason}")
        pytest.skip(reason)
    return executable


@pytest.fixture(autouse=True)
def _floating_point_state_kept():
    """Every test leaves the floating-point state as it found it: a test (or library) that leaves subnormal floats
    flushed to zero makes later ones fail far from the cause (hypothesis: "can't represent subnormal floats"). The
    state is put back, and the test that changed it fails here."""
    import sys

    def flushing() -> bool:
        return sys.float_info.min / 2 == 0.0

    before = flushing()
    yield
    if flushing() != before:
        torch.set_flush_denormal(before)
        pytest.fail(f"this test left subnormal floats {'flushed to zero' if not before else 'no longer flushed'} "
                    "(torch.set_flush_denormal or a library's floating-point flags): restore the state it found")
