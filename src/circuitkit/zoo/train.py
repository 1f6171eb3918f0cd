"""Train the bundled zoo models, deterministically, on random token blocks repeated twice.

Run ``python -m circuitkit.zoo.train`` (under a minute on 2 CPU cores) or
``python -m circuitkit.zoo.train --out /tmp/zoo`` to regenerate the models elsewhere.

Data: every step draws one block length ``T`` uniformly from ``[MIN_BLOCK, MAX_BLOCK]`` (a varying length
stops a head from solving the task by position alone), then ``BATCH`` sequences ``<bos> block block`` with
each block ``T`` distinct random ids from ``1 .. d_vocab - 1``. The loss is next-token cross-entropy on every
position. The first copy is unpredictable (loss about ``log(d_vocab - 1)``); the second copy becomes
predictable only once a previous-token head in layer 0 and an induction head in layer 1 form, which shows
as a sudden drop of the repeated-copy loss (the induction phase change) in ``curve.json``.

After training the script measures the heads with :func:`circuitkit.head_scores` on the saved model as
loaded back by :func:`circuitkit.zoo.load`, and writes those whose score exceeds :data:`HEAD_THRESHOLD`
into ``zoo.json``; the tests confirm them by ablation.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from circuitkit.detect.tokens import random_blocks
from circuitkit.zoo import ROOT

D_VOCAB = 64
N_CTX = 64
MIN_BLOCK, MAX_BLOCK = 4, 24
BATCH = 64
LOG_EVERY = 25
EVAL_BLOCK = 20
HEAD_THRESHOLD = 0.3
"""A head is documented as an induction / previous-token head when its score is above this."""

SPECS = {
    "induction-2l": dict(
        steps=1200,
        lr=3e-3,
        head_l1=3e-4,
        description=(
            "2-layer, 4-head attention-only transformer (no LayerNorm, no MLP; d_model 64, d_head 16, vocab 64, "
            "context 64) trained on '<bos> block block' random tokens until induction heads formed."
        ),
    ),
}


def repeated_batch(generator: torch.Generator, batch: int, block: int, d_vocab: int = D_VOCAB) -> Tensor:
    """``[batch, 1 + 2 * block]``: BOS (0) then a block of distinct ids in ``1 .. d_vocab - 1``, twice."""
    ids = random_blocks(torch.arange(1, d_vocab), batch, block, generator)
    return torch.cat([torch.zeros(batch, 1, dtype=torch.long), ids, ids], dim=1)


def _halves(logits: Tensor, tokens: Tensor, block: int) -> tuple[Tensor, float, float]:
    losses = -logits[:, :-1].log_softmax(-1).gather(-1, tokens[:, 1:, None])[..., 0]
    # prediction index t-1 for token t; first copy t = 2..block, second copy t = block+2..2*block
    first = losses[:, 1:block].mean()
    repeated = losses[:, block + 1 :].mean()
    return losses.mean(), float(first), float(repeated)


def train_loop(
    forward: Callable[[Tensor], Tensor],
    parameters: list[torch.nn.Parameter],
    *,
    steps: int,
    lr: float,
    seed: int,
    penalty: Callable[[], Tensor] | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, list[float]]:
    """AdamW, linear warm-up then cosine decay to 10% of ``lr``; returns the curve on a fixed evaluation batch."""
    torch.set_flush_denormal(True)  # tiny gradients as subnormal floats make CPU steps many times slower
    generator = torch.Generator().manual_seed(seed)
    eval_tokens = repeated_batch(torch.Generator().manual_seed(seed + 1), 64, EVAL_BLOCK)
    optimizer = torch.optim.AdamW(parameters, lr=lr, weight_decay=0.01)
    warmup = 50
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: min(1.0, (s + 1) / warmup) * (0.55 + 0.45 * math.cos(math.pi * min(s, steps) / steps)),
    )
    curve: dict[str, list[float]] = {"step": [], "loss": [], "first_half": [], "repeated_half": []}
    start = time.time()
    for step in range(steps + 1):
        if step % LOG_EVERY == 0 or step == steps:
            with torch.no_grad():
                loss, first, repeated = _halves(forward(eval_tokens), eval_tokens, EVAL_BLOCK)
            for key, value in zip(curve, (step, float(loss), first, repeated), strict=True):
                curve[key].append(round(value, 5))
            if step % (LOG_EVERY * 10) == 0 or step == steps:
                elapsed = time.time() - start
                log(f"step {step:5d}  first copy {first:.3f}  repeated copy {repeated:.3f}  ({elapsed:.0f} s)")
        if step == steps:
            break
        block = int(torch.randint(MIN_BLOCK, MAX_BLOCK + 1, (1,), generator=generator))
        tokens = repeated_batch(generator, BATCH, block)
        logits = forward(tokens)
        loss = -logits[:, :-1].log_softmax(-1).gather(-1, tokens[:, 1:, None]).mean()
        if penalty is not None:
            loss = loss + penalty()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
    return curve


# ---------------------------------------------------------------------- the two models
def native_config() -> dict:
    return dict(
        n_layers=2,
        n_heads=4,
        d_model=64,
        d_head=16,
        d_vocab=D_VOCAB,
        n_ctx=N_CTX,
        attn_only=True,
        normalization_type=None,
        positional_embedding_type="standard",
        act_fn="gelu",
    )


def head_norm_penalty(out_weights: list[Tensor], n_heads: int, strength: float) -> Callable[[], Tensor]:
    """``strength * sum_heads ||W_O[head]||_F`` (a group lasso over heads): heads the task does not need are
    switched off, so the trained circuit uses few heads and ablation can tell them apart."""

    def penalty() -> Tensor:
        total = sum(w.view(w.shape[0], n_heads, -1).norm(dim=(0, 2)).sum() for w in out_weights)
        return strength * total

    return penalty


def train_native(directory: Path, *, seed: int, steps: int, lr: float, head_l1: float = 0.0) -> dict[str, list[float]]:
    from safetensors.torch import save_file
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge.sources.native import NativeModel, initialize_native_model

    config = native_config()
    cfg = TransformerBridgeConfig(**config, seed=seed)
    torch.manual_seed(seed)
    model = NativeModel(cfg)  # the plain torch module, trained without the bridge's hooks
    initialize_native_model(model, cfg)
    model.train()
    out_weights = [block.attn.o.weight for block in model.layers] if head_l1 else []
    penalty = head_norm_penalty(out_weights, config["n_heads"], head_l1) if head_l1 else None
    curve = train_loop(
        lambda t: _native_logits(model, t), list(model.parameters()), steps=steps, lr=lr, seed=seed, penalty=penalty
    )
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(directory / "model.safetensors"))
    (directory / "tl_config.json").write_text(json.dumps(config, indent=1) + "\n")
    return curve


def _native_logits(model, tokens: Tensor) -> Tensor:
    out = model(tokens)
    return out if isinstance(out, Tensor) else out.logits


TRAINERS = {"induction-2l": (train_native, "tl-native")}


def document_heads(name: str, directory: Path, fmt: str, description: str) -> dict:
    """Load the saved model back, score its heads, and write ``zoo.json``."""
    from circuitkit.detect import ablation_effects, head_scores
    from circuitkit.zoo import _LOADERS

    entry = {"description": description, "format": fmt, "induction_heads": [], "previous_token_heads": []}
    (directory / "zoo.json").write_text(json.dumps(entry))
    model = _LOADERS[fmt](directory, None)
    model.eval()
    scores = head_scores(model, batch=32)
    for key, score in (("induction_heads", "induction"), ("previous_token_heads", "previous_token")):
        ranked = scores.top(score, k=scores[score].numel())
        entry[key] = [list(head) for head, value in ranked if value > HEAD_THRESHOLD]
    effects = ablation_effects(model, method="mean", batch=32)
    entry["measured"] = {
        "induction": [[round(v, 4) for v in row] for row in scores["induction"].tolist()],
        "previous_token": [[round(v, 4) for v in row] for row in scores["previous_token"].tolist()],
        "mean_ablation_delta": [[round(v, 4) for v in row] for row in effects.delta.tolist()],
    }
    (directory / "zoo.json").write_text(json.dumps(entry, indent=1) + "\n")
    return entry


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT, help="where the model directories go (default: the package)")
    parser.add_argument("--only", choices=sorted(TRAINERS), action="append", help="train only these models")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None, help="override the number of training steps")
    args = parser.parse_args(argv)
    torch.use_deterministic_algorithms(True)
    # one thread: the models are tiny, and two OpenMP threads competing with other work on a 2-core machine
    # can make each step many times slower; one thread also makes the float sums reproducible
    torch.set_num_threads(1)
    for name in args.only or sorted(TRAINERS):
        trainer, fmt = TRAINERS[name]
        spec = SPECS[name]
        directory = args.out / name
        directory.mkdir(parents=True, exist_ok=True)
        print(f"== {name} -> {directory}")
        extra = {"head_l1": spec["head_l1"]} if "head_l1" in spec else {}
        curve = trainer(directory, seed=args.seed, steps=args.steps or spec["steps"], lr=spec["lr"], **extra)
        (directory / "curve.json").write_text(json.dumps(curve) + "\n")
        from circuitkit.models.tokenizer import word_tokenizer_files

        word_tokenizer_files(D_VOCAB, directory)
        entry = document_heads(name, directory, fmt, spec["description"])
        print(f"   induction heads {entry['induction_heads']}, previous-token heads {entry['previous_token_heads']}")


if __name__ == "__main__":
    main()
