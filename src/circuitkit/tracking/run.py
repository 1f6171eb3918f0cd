"""``circuitkit.track(checkpoints) -> Track``: score every head along a training run, one checkpoint at a time.

The loop: resolve the checkpoints and their steps (:mod:`circuitkit.tracking.sources`), then for each, in step
order: load it, check it has the first one's architecture and vocabulary, measure it on the one token batch
(:mod:`circuitkit.tracking.measure`: one forward pass plus weight-only composition), write its record, drop the
model. Memory is one model's at a time (plus the records: kilobytes per checkpoint). With ``out``, every record is
written as it is finished and ``track.json`` rewritten, so an interrupted track leaves a valid ``track.json`` of
the checkpoints done, and a rerun with the same settings skips them (``resume``).
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import os
from collections.abc import Sequence
from typing import Any

import torch

from circuitkit import validate
from circuitkit.detect.tokens import RepeatedTokens, TokenBatch, as_batch
from circuitkit.errors import CircuitkitError
from circuitkit.models.contract import adapt
from circuitkit.tracking import sources as _sources
from circuitkit.tracking.measure import architecture, measure
from circuitkit.tracking.result import (
    RECORD_FORMAT,
    TRACK_NAME,
    Track,
    dumps,
    from_records,
    read_records,
    record_name,
)

DEFAULT_TOP_K = 10
GC_MIN_BYTES = 32 * 2**20
"""A dropped checkpoint of at least this many parameter bytes is collected at once (a TransformerBridge holds
reference cycles, so ``del`` alone does not free it); smaller ones are left to Python's cyclic collector, since a
full collection costs ~0.1-0.5 s, more than measuring a toy model."""


def _settings(tokens: Any, keep: tuple[str, ...] | None, top_k: int) -> dict[str, Any]:
    if tokens is None or isinstance(tokens, RepeatedTokens):
        spec = tokens or RepeatedTokens()
        described = {"block_len": spec.block_len, "n_repeats": spec.n_repeats, "batch": spec.batch,
                     "seed": spec.seed, "bos": spec.bos,
                     "token_range": list(spec.token_range) if spec.token_range else None}
    elif isinstance(tokens, TokenBatch):
        described = {"given": "TokenBatch", "block_len": tokens.block_len, "n_repeats": tokens.n_repeats,
                     "bos": tokens.bos, "sha256": _sha(tokens)}
    else:
        raise validate.fail("track: tokens", tokens, "a circuitkit.RepeatedTokens spec, a TokenBatch, or None")
    return {"tokens": described, "scores": list(keep) if keep is not None else None, "top_k": top_k}


def _keep(scores: Any) -> tuple[str, ...] | None:
    if scores is None:
        return None
    from circuitkit.detect.registry import score_names

    if isinstance(scores, str) or not isinstance(scores, Sequence):
        raise validate.fail("track: scores", scores, "a list of registered score names, or None for all")
    known = score_names()
    unknown = [name for name in scores if name not in known]
    if unknown:
        raise validate.fail("track: scores", unknown, f"registered score names, from {list(known)}")
    return tuple(dict.fromkeys(scores))


def _sha(batch: TokenBatch) -> str:
    return hashlib.sha256(batch.tokens.detach().cpu().to(torch.int64).numpy().tobytes()).hexdigest()


def _parameter_bytes(model: Any) -> int:
    parameters = getattr(model, "parameters", None)
    if not callable(parameters):
        return 0
    return sum(p.numel() * p.element_size() for p in parameters())


def track(
    checkpoints: Any,
    *,
    steps: Sequence[int] | None = None,
    labels: Sequence[str] | None = None,
    tokens: RepeatedTokens | TokenBatch | None = None,
    scores: Sequence[str] | None = None,
    top_k: int = DEFAULT_TOP_K,
    out: str | os.PathLike | None = None,
    resume: bool = True,
    write_track: bool = True,
    device: str | torch.device | None = None,
    allow_download: bool = False,
    progress: bool | None = None,
) -> Track:
    """Score every head of every checkpoint of a training run on the same token batch.

    Args:
        checkpoints: models, checkpoint directories, zoo / hub names or ``"hub-name@revision"`` (e.g.
            ``"EleutherAI/pythia-70m@step1000"``, from the local Hugging Face cache), or one directory holding
            ``step<N>/`` / ``checkpoint-<N>/`` subdirectories (:mod:`circuitkit.tracking.sources`).
        steps: the training step of each checkpoint (default: read from its name); labels: its label (default:
            its name).
        tokens: the batch (a :class:`~circuitkit.RepeatedTokens` spec, default ``RepeatedTokens()``, built once
            from the first checkpoint loaded, or a built ``TokenBatch``).
        scores: names of registered scores to keep (default: all; ``induction`` and ``previous_token`` always).
        top_k: composition edges kept per mode (Q, K, V) per checkpoint.
        out: directory for the streamed records (``track-step<N>.json``), ``track.json`` and ``report.html``.
        resume: with ``out``, skip checkpoints whose record there was measured with the same settings from the
            same source (in-memory models are always measured).
        write_track: with ``out``, also write ``track.json`` + ``report.html`` (``False``: the records only, for
            one job of many; assemble with :func:`circuitkit.tracking.merge` / ``circuitkit track --merge``).
        device: where each checkpoint runs; allow_download: fetch uncached hub checkpoints.
        progress: a progress bar over checkpoints (``None``: when interactive).

    Returns:
        :class:`Track`. Cost per checkpoint: one forward pass (see :mod:`circuitkit.tracking.measure`).
    """
    sources = _sources.resolve(checkpoints, steps, labels)
    keep = _keep(scores)
    top_k = validate.integer("track: top_k", top_k, minimum=0)
    settings = _settings(tokens, keep, top_k)
    resume = validate.boolean("track: resume", resume)
    write_track = validate.boolean("track: write_track", write_track)
    allow_download = validate.boolean("track: allow_download", allow_download)
    device = validate.device("track: device", device)
    if progress is not None:
        progress = validate.boolean("track: progress", progress)
    out_dir = None
    if out is not None:
        from circuitkit.report.saving import prepare_directory

        out_dir = prepare_directory(out, where="track: out", probe=True)
    previous = read_records(out_dir) if out_dir is not None and resume else {}

    from tqdm.auto import tqdm

    bar = tqdm(total=len(sources), desc="track", unit="checkpoint", disable=not progress if progress is not None
               else None)
    done: list[dict[str, Any]] = []
    batch: TokenBatch | None = tokens if isinstance(tokens, TokenBatch) else None
    finished = False
    try:
        for source in sources:
            bar.set_postfix_str(source.label, refresh=False)
            old = previous.get(source.step)
            if (old is not None and source.where is not None and old.get("settings") == settings
                    and old.get("source") == source.where and old.get("label") == source.label):
                _check_same(done, old)
                done.append(old)
                bar.update(1)
                continue
            record = _measure_one(source, batch, tokens, settings, keep, top_k, device, allow_download,
                                  done[0] if done else None)
            batch = record.pop("_batch")
            _check_same(done, record)
            done.append(record)
            if out_dir is not None:
                from circuitkit.report.saving import write_together

                write_together(out_dir, {record_name(source.step): dumps(record)})
                if write_track:
                    write_together(out_dir, {TRACK_NAME: dumps(from_records(done, complete=False).to_json())})
            bar.update(1)
        finished = True
    finally:
        bar.close()
        if out_dir is not None and write_track and done and not finished:
            with contextlib.suppress(Exception):  # the interruption itself is what the caller must see
                from_records(done, complete=False).save(out_dir)
    result = from_records(done)
    if out_dir is not None and write_track:
        result.save(out_dir)
    return result


def _measure_one(source, batch, tokens, settings, keep, top_k, device, allow_download, first) -> dict[str, Any]:
    model = _sources.load(source, device=device, allow_download=allow_download)
    large = source.where is not None and _parameter_bytes(model) >= GC_MIN_BYTES
    try:
        adapter = adapt(model, device)
        arch = architecture(adapter)
        if first is not None:  # before the batch meets the model: another vocabulary would fail there, less clearly
            _check_architecture(source.label, source.step, arch, first)
        batch = as_batch(batch if batch is not None else tokens, adapter)
        with torch.no_grad():
            measured = measure(adapter, batch, keep=keep, top_k=top_k)
    finally:
        del model
        if large:
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    from circuitkit import __version__

    return {"format": RECORD_FORMAT, "circuitkit_version": __version__, "label": source.label, "step": source.step,
            "source": source.where, "settings": settings, "model": arch, "tokens_sha256": _sha(batch), **measured,
            "_batch": batch}


def _check_architecture(label: str, step: int, arch: dict[str, Any], first: dict[str, Any]) -> None:
    if arch != first["model"]:
        expected = first["model"]
        differ = {k: (arch.get(k), expected.get(k)) for k in expected if arch.get(k) != expected.get(k)}
        shown = ", ".join(f"{k} = {mine} (expected {theirs})" for k, (mine, theirs) in differ.items())
        raise CircuitkitError(
            f"track: checkpoint {label!r} (step {step}) has {shown}, unlike the first checkpoint "
            f"{first['label']!r} (step {first['step']}); expected checkpoints of one architecture and vocabulary in "
            "one track (track each model separately)."
        )


def _check_same(done: list[dict[str, Any]], record: dict[str, Any]) -> None:
    if not done:
        return
    first = done[0]
    _check_architecture(record["label"], record["step"], record["model"], first)
    if record.get("tokens_sha256") != first.get("tokens_sha256"):
        raise CircuitkitError(
            f"track: checkpoint {record['label']!r} (step {record['step']}) was measured on another token batch "
            f"than {first['label']!r}; expected one batch (its records in the output directory come from other "
            "settings: remove them or pass resume=False)."
        )


__all__ = ["DEFAULT_TOP_K", "track"]
