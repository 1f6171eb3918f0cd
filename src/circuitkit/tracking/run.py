"""``circuitkit.track(checkpoints) -> Track``: score every head along a training run, one checkpoint at a time.

The loop: resolve the checkpoints and their steps (:mod:`circuitkit.tracking.sources`), then for each, in step
order: load it, check it has the first one's architecture and vocabulary, measure it on the one token batch
(:mod:`circuitkit.tracking.measure`: one forward pass plus weight-only composition), write its record, drop the
model. Memory is one model's at a time (plus the records: kilobytes per checkpoint). With ``out``, every record is
written as it is finished, together with ``track.json`` and ``report.html`` (one atomic replacement of the three,
signals deferred between the renames: :func:`circuitkit.report.saving.write_together`), so an interrupted track
leaves a ``track.json`` and a report of the same checkpoints done, and a rerun with the same settings skips them
(``resume``) unless the checkpoint changed on disk since (its fingerprint, :mod:`circuitkit.tracking.fingerprint`).

A track is one experiment: one architecture and family, one vocabulary, one token batch, one score set (the
registry's names are part of the settings). Records that differ are refused, never mixed; a record already in
``out`` for a step, written from another checkpoint (two jobs given the same step), is refused too. In-memory
models are measured in eval mode and given back as they were (:func:`circuitkit.models.state.caller_state`).
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
from circuitkit.models.adapters import adapt
from circuitkit.models.state import caller_state
from circuitkit.tracking import sources as _sources
from circuitkit.tracking.fingerprint import fingerprint
from circuitkit.tracking.measure import architecture, measure
from circuitkit.tracking.result import (
    RECORD_FORMAT,
    REPORT_NAME,
    TRACK_NAME,
    Track,
    dumps,
    from_records,
    read_records,
    record_file,
    record_name,
    same_run,
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
    from circuitkit.detect.registry import score_names

    return {"tokens": described, "scores": list(keep) if keep is not None else None, "top_k": top_k,
            "registry": list(score_names())}


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
    task: Any = None,
    target: float | None = None,
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
        task: a task (a :class:`~circuitkit.tasks.Task` or a task file's path, read before any checkpoint loads)
            measured at every checkpoint too: its mean clean and corrupted metric, each head's EAP-IG node score
            and DLA, its node circuit at ``target`` and that circuit's faithfulness on the held-out pairs
            (:mod:`circuitkit.tracking.task_figures`).
        target: the task's node-circuit faithfulness target (default 0.8; only with ``task``).

    Returns:
        :class:`Track`. Cost per checkpoint: one forward pass (see :mod:`circuitkit.tracking.measure`), plus with
        a task a task scan without its edge circuit (:mod:`circuitkit.tracking.task_figures`).
    """
    sources = _sources.resolve(checkpoints, steps, labels)
    keep = _keep(scores)
    top_k = validate.integer("track: top_k", top_k, minimum=0)
    settings = _settings(tokens, keep, top_k)
    tracked = _tracked_task(task, target)
    if tracked is not None:
        settings["task"] = tracked.settings
    resume = validate.boolean("track: resume", resume)
    write_track = validate.boolean("track: write_track", write_track)
    allow_download = validate.boolean("track: allow_download", allow_download)
    device = validate.device("track: device", device)
    if progress is not None:
        progress = validate.boolean("track: progress", progress)
    out_dir = None
    if out is not None:
        from circuitkit.report.saving import prepare_directory

        out_dir = prepare_directory(out, where="track: out", probe=True, kind="track")
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
            stamp = fingerprint(source.where)
            if (old is not None and source.where is not None and old.get("settings") == settings
                    and old.get("source") == source.where and old.get("label") == source.label
                    and stamp is not None and old.get("fingerprint") == stamp):
                _check_same(done, old)
                done.append(old)
                bar.update(1)
                continue
            record = _measure_one(source, batch, tokens, settings, keep, top_k, device, allow_download,
                                  done[0] if done else None, tracked)
            record["fingerprint"] = stamp
            batch = record.pop("_batch")
            _check_same(done, record)
            done.append(record)
            if out_dir is not None:
                _write(out_dir, record, done if write_track else None)
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


def _write(out_dir, record: dict[str, Any], done: list[dict[str, Any]] | None) -> None:
    """The record, and with ``done`` the ``track.json`` + ``report.html`` of every record so far, replaced
    together. A record of this step already there from another checkpoint is refused, not replaced."""
    from circuitkit.report.saving import check_kind, write_together
    from circuitkit.report.track_page import build_track_report

    check_kind(out_dir, "track", "track: out")  # a scan may have been saved there since the track began
    there = record_file(out_dir, record["step"], "track")
    if there is not None and (there["source"] != record["source"] or there["label"] != record["label"]):
        raise CircuitkitError(
            f"track: {str(out_dir / record_name(record['step']))!r} already holds step {record['step']} of "
            f"checkpoint {there['label']!r} ({there['source']}); expected one checkpoint per step, but "
            f"{record['label']!r} ({record['source']}) was given the same step. Give each job its own steps, or "
            "remove the old record."
        )
    files = {record_name(record["step"]): dumps(record)}
    if done is not None:
        partial = from_records(done, complete=False)
        files[TRACK_NAME] = dumps(partial.to_json())
        files[REPORT_NAME] = build_track_report(partial).encode()
    write_together(out_dir, files)


def _tracked_task(task: Any, target: Any) -> Any:
    """The task to measure at every checkpoint, read and checked now (before any checkpoint loads), or None."""
    if task is None:
        if target is not None:
            raise validate.fail("track: target", target, "None without a task (it is the task's node-circuit "
                                "faithfulness target)")
        return None
    from circuitkit.tracking.task_figures import DEFAULT_TASK_TARGET, prepare_task

    return prepare_task(task, target=DEFAULT_TASK_TARGET if target is None else target)


def _measure_one(source, batch, tokens, settings, keep, top_k, device, allow_download, first,
                 tracked=None) -> dict[str, Any]:
    model = _sources.load(source, device=device, allow_download=allow_download)
    large = source.where is not None and _parameter_bytes(model) >= GC_MIN_BYTES
    try:
        with caller_state(model, "track"):
            adapter = adapt(model, device)
            arch = architecture(adapter)
            if first is not None:  # before the batch meets the model: another vocabulary would fail there
                _check_architecture(source.label, source.step, arch, first)
            batch = as_batch(batch if batch is not None else tokens, adapter)
            with torch.no_grad():
                measured = measure(adapter, batch, keep=keep, top_k=top_k)
            if tracked is not None:  # outside no_grad: EAP-IG and DLA take gradients
                from circuitkit.tracking.task_figures import measure_task

                measured["task"] = measure_task(model, tracked, device=device)
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
    same_run([first, record], "track")
    if record.get("tokens_sha256") != first.get("tokens_sha256"):
        raise CircuitkitError(
            f"track: checkpoint {record['label']!r} (step {record['step']}) was measured on another token batch "
            f"than {first['label']!r}; expected one batch (its records in the output directory come from other "
            "settings: remove them or pass resume=False)."
        )


__all__ = ["DEFAULT_TOP_K", "track"]
