"""Edge attribution of a bfloat16 model whose attention norm is ``torch.nn.LayerNorm`` (GPT-NeoX, OPT, Phi,
StableLM, XGLM; Nemotron's 1 + w LayerNorm): the receivers' gradients are pulled back through the norm outside the
forward pass, and such a module refuses a float32 input beside its bfloat16 weights. Both edge attributions (the
induction scan's and a task's EAP-IG) run, and agree with the same model in float32 to bfloat16's precision."""

from __future__ import annotations

import pytest
import torch

from circuitkit.models import load_model
from tests.test_families import CONFIGS

FAMILIES = ("GPT-NeoX / Pythia", "OPT", "Phi", "StableLM", "XGLM", "Nemotron")
AGREE = 0.1
"""Largest difference from float32, relative to the largest score: bfloat16 keeps 8 bits of mantissa, and every
activation, weight and gradient of the pass is rounded to it."""
PAIRS = [([5, 9, 12, 7, 30, 9], [5, 11, 12, 7, 30, 9], [12], [5]),
         ([6, 13, 8, 40, 6, 13], [6, 21, 8, 40, 6, 13], [8], [6])]


@pytest.fixture(scope="module", params=FAMILIES, ids=lambda n: n.split(" ")[0].lower())
def models(request, tmp_path_factory):
    import transformers

    config_class, model_class, sizes = CONFIGS[request.param]
    torch.manual_seed(1)
    config = getattr(transformers, config_class)(**sizes)
    config._attn_implementation = "eager"
    directory = tmp_path_factory.mktemp("family")
    getattr(transformers, model_class)(config).eval().save_pretrained(str(directory), safe_serialization=True)
    return load_model(str(directory)), load_model(str(directory)).to(torch.bfloat16)


def _close(half: torch.Tensor, full: torch.Tensor) -> None:
    scale = float(full.nan_to_num().abs().max())
    assert scale > 0 and bool(torch.isfinite(half[torch.isfinite(full)]).all())
    assert float((half.float() - full).nan_to_num().abs().max()) <= AGREE * scale


def test_the_induction_scans_edge_attribution(models):
    import circuitkit as ck
    from circuitkit.detect import RepeatedTokens

    full, half = models
    tokens = RepeatedTokens(block_len=5, batch=2, seed=0)
    _close(ck.edge_attribution(half, tokens=tokens).scores, ck.edge_attribution(full, tokens=tokens).scores)


def test_a_tasks_eap_ig(models):
    from circuitkit.graph.runner import TaskRunner
    from circuitkit.models.adapters import adapt
    from circuitkit.tasks import Task

    scores = []
    for model in models:
        adapter = adapt(model)
        runner = TaskRunner(adapter, Task.from_pairs(PAIRS).tokenize(adapter), "logit_diff", mlps=True,
                            ablation="corrupted")
        scores.append(runner.edge_gradients(2)[0])
    _close(scores[1], scores[0])
