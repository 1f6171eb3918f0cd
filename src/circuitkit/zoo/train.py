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

Checkpoints (a training run to track with :func:`circuitkit.track`): ``--checkpoints DIR`` saves the model every
``--every`` steps (default 100), or at the steps listed in ``--checkpoint-steps 0,200,400``, as ``DIR/step<N>/``
(``N`` = optimizer updates done; ``step0`` is the initialisation), each a directory :func:`circuitkit.track` loads.
Saving reads the weights only, so the final model is bit-identical with or without checkpoints.
``--stop N`` ends the run after ``N`` updates, the schedule unchanged: ``--checkpoints DIR --stop 800 --every 50``
saves the bundled run up to and through its phase change (:func:`train_series`, what the tests track).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from collections.abc import Callable, Collection, Iterator
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
    checkpoint_steps: Collection[int] = (),
    save_checkpoint: Callable[[int], None] | None = None,
    stop: int | None = None,
) -> dict[str, list[float]]:
    """AdamW, linear warm-up then cosine decay to 10% of ``lr``; returns the curve on a fixed evaluation batch.

    ``save_checkpoint(step)`` is called at each step of ``checkpoint_steps`` after ``step`` updates (before the
    next); it must only read the parameters. ``stop``: end after that many updates (the schedule still spans
    ``steps``), e.g. to save the first part of the bundled run only."""
    with flushing_denormals():  # tiny gradients as subnormal floats make CPU steps many times slower
        return _train_loop(forward, parameters, steps=steps, lr=lr, seed=seed, penalty=penalty, log=log,
                           checkpoint_steps=checkpoint_steps, save_checkpoint=save_checkpoint, stop=stop)


def flushes_denormals() -> bool:
    """Whether this thread's floating-point unit flushes subnormal results to zero (half the smallest normal
    float64 comes out 0; torch has no getter for its ``set_flush_denormal``)."""
    return sys.float_info.min / 2 == 0.0


@contextlib.contextmanager
def flushing_denormals() -> Iterator[None]:
    """Subnormal floats flushed to zero inside, the state found restored after (also on an error): a process-wide
    flag left set breaks what runs later (hypothesis refuses to generate subnormal floats, and any result that
    should be subnormal becomes 0)."""
    before = flushes_denormals()
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(before)


def _train_loop(
    forward: Callable[[Tensor], Tensor],
    parameters: list[torch.nn.Parameter],
    *,
    steps: int,
    lr: float,
    seed: int,
    penalty: Callable[[], Tensor] | None,
    log: Callable[[str], None],
    checkpoint_steps: Collection[int],
    save_checkpoint: Callable[[int], None] | None,
    stop: int | None,
) -> dict[str, list[float]]:
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
        if save_checkpoint is not None and step in checkpoint_steps:
            save_checkpoint(step)
        if step % LOG_EVERY == 0 or step == steps:
            with torch.no_grad():
                loss, first, repeated = _halves(forward(eval_tokens), eval_tokens, EVAL_BLOCK)
            for key, value in zip(curve, (step, float(loss), first, repeated), strict=True):
                curve[key].append(round(value, 5))
            if step % (LOG_EVERY * 10) == 0 or step == steps:
                elapsed = time.time() - start
                log(f"step {step:5d}  first copy {first:.3f}  repeated copy {repeated:.3f}  ({elapsed:.0f} s)")
        if step == steps or step == stop:
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


def save_native(model: torch.nn.Module, config: dict, directory: Path) -> None:
    """``model.safetensors`` + ``tl_config.json`` + the word tokenizer in ``directory`` (a loadable zoo-format model
    directory); the weights are copied, never changed."""
    from safetensors.torch import save_file

    from circuitkit.models.tokenizer import word_tokenizer_files

    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(directory / "model.safetensors"))
    (directory / "tl_config.json").write_text(json.dumps(config, indent=1) + "\n")
    word_tokenizer_files(config["d_vocab"], directory)


def train_native(
    directory: Path,
    *,
    seed: int,
    steps: int,
    lr: float,
    head_l1: float = 0.0,
    checkpoints: Path | None = None,
    checkpoint_steps: Collection[int] = (),
    log: Callable[[str], None] = print,
    stop: int | None = None,
) -> dict[str, list[float]]:
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
    def save_checkpoint(step: int) -> None:
        assert checkpoints is not None
        save_native(model, config, checkpoints / f"step{step}")

    curve = train_loop(
        lambda t: _native_logits(model, t), list(model.parameters()), steps=steps, lr=lr, seed=seed, penalty=penalty,
        checkpoint_steps=set(checkpoint_steps), save_checkpoint=save_checkpoint if checkpoints is not None else None,
        log=log, stop=stop,
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
    from circuitkit.detect import RepeatedTokens, ablation_effects, head_scores
    from circuitkit.zoo import _LOADERS

    entry = {"description": description, "format": fmt, "induction_heads": [], "previous_token_heads": []}
    (directory / "zoo.json").write_text(json.dumps(entry))
    model = _LOADERS[fmt](directory, None)
    model.eval()
    scores = head_scores(model, RepeatedTokens(batch=32))
    for key, score in (("induction_heads", "induction"), ("previous_token_heads", "previous_token")):
        ranked = scores.top(score, k=scores[score].numel())
        entry[key] = [list(head) for head, value in ranked if value > HEAD_THRESHOLD]
    effects = ablation_effects(model, RepeatedTokens(batch=32), method="mean")
    entry["measured"] = {
        "induction": [[round(v, 4) for v in row] for row in scores["induction"].tolist()],
        "previous_token": [[round(v, 4) for v in row] for row in scores["previous_token"].tolist()],
        "mean_ablation_delta": [[round(v, 4) for v in row] for row in effects.delta.tolist()],
    }
    (directory / "zoo.json").write_text(json.dumps(entry, indent=1) + "\n")
    return entry


SERIES_STOP = 800
""":func:`train_series` saves the first 800 steps of the bundled run (same data, model, optimizer, seed and
schedule over 1200 steps): the in-context learning phase change happens between steps 500 and 700, and by step
800 the documented heads are formed (a shorter schedule, e.g. ``--steps 600``, delays the phase change past its
end, and a larger learning rate forms a third previous-token head, 0.2)."""
SERIES_EVERY = 50


def checkpoint_steps(steps: int, every: int | None = None, listed: Collection[int] | None = None) -> list[int]:
    """Steps to save at: ``listed`` (each in ``0 .. steps``), else ``0, every, 2 every, ...`` and ``steps``."""
    if listed:
        bad = [s for s in listed if not 0 <= s <= steps]
        if bad:
            raise ValueError(f"checkpoint steps {bad} are outside 0 .. {steps}")
        return sorted(set(listed))
    every = every or 100
    if every < 1:
        raise ValueError(f"--every must be >= 1, got {every}")
    return sorted(set(range(0, steps + 1, every)) | {steps})


def train_series(
    out: Path, *, stop: int | None = SERIES_STOP, every: int = SERIES_EVERY, seed: int = 0,
    name: str = "induction-2l", steps: int | None = None, lr: float | None = None,
) -> list[Path]:
    """Train ``name`` with its bundled recipe (``steps`` and ``lr`` override the schedule's length and the learning
    rate), stop after ``stop`` updates (``None``: at the end) and save a checkpoint every ``every`` steps into
    ``out/step<N>/``; the checkpoint directories, in step order. Deterministic (one thread); about 25 ms a step
    on one CPU core."""
    trainer, _ = TRAINERS[name]
    spec = SPECS[name]
    steps = steps or spec["steps"]
    saved = [s for s in checkpoint_steps(steps, every) if stop is None or s <= stop]
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    try:
        extra = {"head_l1": spec["head_l1"]} if "head_l1" in spec else {}
        with torch.random.fork_rng(devices=[]):
            trainer(out / "final", seed=seed, steps=steps, lr=lr or spec["lr"], checkpoints=out,
                    checkpoint_steps=saved, log=lambda _: None, stop=stop, **extra)
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
    return [out / f"step{step}" for step in saved]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT, help="where the model directories go (default: the package)")
    parser.add_argument("--only", choices=sorted(TRAINERS), action="append", help="train only these models")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None, help="override the number of training steps")
    parser.add_argument("--checkpoints", type=Path, default=None,
                        help="also save checkpoints as DIR/<model>/step<N>/ (for circuitkit track)")
    parser.add_argument("--every", type=int, default=None, help="checkpoint every N steps (default 100)")
    parser.add_argument("--stop", type=int, default=None,
                        help="end the run after N updates (schedule unchanged; with --checkpoints)")
    parser.add_argument("--checkpoint-steps", default=None,
                        help="checkpoint at these steps instead, comma-separated (e.g. 0,300,600,1200)")
    args = parser.parse_args(argv)
    listed = None
    if args.checkpoint_steps:
        try:
            listed = [int(part) for part in args.checkpoint_steps.split(",") if part.strip()]
        except ValueError:
            parser.error(f"--checkpoint-steps: given {args.checkpoint_steps!r}; expected integers like 0,300,600")
    if args.stop is not None and args.checkpoints is None:
        parser.error("--stop needs --checkpoints (a stopped run is not the bundled model)")
    torch.use_deterministic_algorithms(True)
    # one thread: the models are tiny, and two OpenMP threads competing with other work on a 2-core machine
    # can make each step many times slower; one thread also makes the float sums reproducible
    torch.set_num_threads(1)
    for name in args.only or sorted(TRAINERS):
        trainer, fmt = TRAINERS[name]
        spec = SPECS[name]
        # a stopped run only writes checkpoints: its last model goes beside them, never over the bundled one
        directory = args.out / name if args.stop is None else args.checkpoints / name / "final"
        directory.mkdir(parents=True, exist_ok=True)
        print(f"== {name} -> {directory}")
        extra = {"head_l1": spec["head_l1"]} if "head_l1" in spec else {}
        steps = args.steps or spec["steps"]
        if args.checkpoints is not None:
            try:
                extra["checkpoint_steps"] = checkpoint_steps(steps, args.every, listed)
            except ValueError as error:
                parser.error(str(error))
            extra["checkpoints"] = args.checkpoints / name
        if args.stop is not None:
            extra["stop"] = args.stop
            extra["checkpoint_steps"] = [s for s in extra["checkpoint_steps"] if s <= args.stop]
        curve = trainer(directory, seed=args.seed, steps=steps, lr=spec["lr"], **extra)
        if args.stop is not None:
            print(f"   stopped after {args.stop} steps; checkpoints in {args.checkpoints / name}")
            continue
        (directory / "curve.json").write_text(json.dumps(curve) + "\n")
        from circuitkit.models.tokenizer import word_tokenizer_files

        word_tokenizer_files(D_VOCAB, directory)
        entry = document_heads(name, directory, fmt, spec["description"])
        print(f"   induction heads {entry['induction_heads']}, previous-token heads {entry['previous_token_heads']}")


if __name__ == "__main__":
    main()
