"""Sub-commands of the `circuitkit` command; each registers itself in circuitkit.cli.COMMANDS.

``circuitkit scan [MODEL] [--out DIR] [--device D] [--seq-len N] [--batch B] [--top-k K] [--json] [--png]``:
score every head of MODEL on repeated random tokens (induction, previous-token, ...), confirm by ablation,
compute Q/K/V composition with random baselines and QK/OV spectra, print a ranked table and write
``DIR/report.html`` (offline, self-contained) and ``DIR/scores.json``. Bad input (unknown MODEL, unwritable
DIR, a sequence longer than the model's context) ends with one ``circuitkit: error: ...`` line and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from circuitkit.cli import COMMANDS
from circuitkit.errors import CircuitkitError

DEFAULT_OUT = "circuitkit-report"
COMPOSITION_MODES = ("Q", "K", "V")
# heads whose attention patterns the report shows: the best few by these scores
PATTERN_SCORES = ("induction", "previous_token", "duplicate_token")
PATTERN_HEADS_PER_SCORE = 2
TABLE_ROWS = 16
# short column headers keep the table inside 80 columns
SHORT_NAMES = {"induction": "induct", "previous_token": "prev", "duplicate_token": "dup", "current_token": "self",
               "first_token": "first", "copying": "copy"}


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"given {text!r}; expected a positive integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"given {value}; expected a positive integer")
    return value


def add_scan_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "scan",
        help="score every head, confirm by ablation, and write an offline HTML report",
        description="Score every attention head of MODEL (induction, previous-token, duplicate-token, ...), "
        "confirm by ablation, compute composition scores and QK/OV spectra, print a ranked table, and write "
        "DIR/report.html (self-contained, opens offline) and DIR/scores.json.",
    )
    parser.add_argument(
        "model",
        nargs="?",
        default=None,
        metavar="MODEL",
        help="a bundled zoo name (default: the bundled known-answer model), a local Hugging Face model "
        "directory, or a TransformerLens / Hugging Face model name (from the local cache; "
        "--allow-download to fetch it)",
    )
    parser.add_argument("--out", default=DEFAULT_OUT, metavar="DIR", help=f"output directory (default {DEFAULT_OUT})")
    parser.add_argument("--device", default=None, help="torch device, e.g. cpu or cuda (default: the model's)")
    parser.add_argument("--seq-len", type=_positive_int, default=None, metavar="N",
                        help="length of the random block that is repeated (default: 20 or what fits the context)")
    parser.add_argument("--batch", type=_positive_int, default=16, metavar="B", help="sequences per batch (16)")
    parser.add_argument("--top-k", type=_positive_int, default=5, metavar="K",
                        help="heads per score and composition edges per mode to report (5)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random tokens (0)")
    parser.add_argument("--json", action="store_true", help="print the scores JSON to stdout instead of the table")
    parser.add_argument("--allow-download", action="store_true",
                        help="let a model name be fetched from the Hugging Face hub (default: local cache only)")
    parser.add_argument("--png", action="store_true",
                        help="also export every figure as DIR/png/*.png (needs headless Chromium)")
    return parser


@dataclass(frozen=True)
class ScanOutput:
    """What :func:`scan` produced: the report's inputs, the head scores, and the files written."""

    results: Any  # circuitkit.report.ScanResults
    head_scores: Any  # circuitkit.detect.HeadScores
    report: Path
    scores: Path
    pngs: tuple[Path, ...] = ()


def prepare_out_dir(out: str | os.PathLike) -> Path:
    """Create ``out`` (and parents) and check a file can be written there; one-line error if not."""
    path = Path(out).expanduser()
    try:
        if path.exists() and not path.is_dir():
            raise CircuitkitError(
                f"--out: given {str(out)!r}, which is a file; expected a directory to write report.html into. "
                "Pass a directory path."
            )
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".circuitkit-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise CircuitkitError(
            f"--out: cannot write to {str(out)!r} ({error.strerror or type(error).__name__}); expected a writable "
            "directory. Pass --out with a path you can write."
        ) from None
    return path


def scan(
    model_name: str | None = None,
    *,
    out: str | os.PathLike = DEFAULT_OUT,
    device: str | None = None,
    seq_len: int | None = None,
    batch: int = 16,
    top_k: int = 5,
    seed: int = 0,
    png: bool = False,
    progress: Any = None,
    allow_download: bool = False,
) -> ScanOutput:
    """Run the whole scan and write ``out/report.html`` and ``out/scores.json``. ``progress(step)`` is told
    each step's name as it starts."""
    out_dir = prepare_out_dir(out)
    step = progress or (lambda name: None)

    step("loading the model")
    from circuitkit.models.loading import load_model

    model = load_model(model_name, device=device, allow_download=allow_download)
    from circuitkit import zoo
    from circuitkit.detect import ablation_effects, head_scores, induction_loss
    from circuitkit.report import ModelSummary, ScanResults, export_pngs, scores_json, write_report
    from circuitkit.viz.attention import token_strings

    options = {"seq_len": seq_len, "batch": batch, "seed": seed, "device": device}
    step("scoring heads on repeated random tokens")
    try:
        scores = head_scores(model, **options)
    except CircuitkitError as error:
        if seq_len is None:
            raise
        raise CircuitkitError(f"--seq-len: given {seq_len}; {error}") from None
    options["seq_len"] = scores.seq_len  # the block length actually used
    step("measuring the induction loss")
    loss = induction_loss(model, **options)
    step("ablating each head")
    ablation = ablation_effects(model, **options)

    step("composition scores and random baselines")
    from circuitkit import HeadWeights
    from circuitkit.composition import composition_baseline, composition_scores, top_edges
    from circuitkit.factored import singular_values

    weights = HeadWeights.from_model(model)
    composition, baselines, edges = {}, {}, {}
    if weights.n_layers > 1:
        for mode in COMPOSITION_MODES:
            composition[mode] = composition_scores(weights, mode).cpu()
            baselines[mode] = float(composition_baseline(weights, mode).mean)
            edges[mode] = top_edges(composition[mode], k=top_k)
    step("QK/OV spectra")
    spectra = {circuit: singular_values(weights, circuit).cpu() for circuit in ("OV", "QK")}

    chosen: list[tuple[int, int]] = []
    for name in PATTERN_SCORES:
        if name in scores:
            for head, _ in scores.top(name, PATTERN_HEADS_PER_SCORE):
                if head not in chosen:
                    chosen.append(head)
    results = ScanResults(
        model=ModelSummary.from_model(model, model_name or zoo.DEFAULT),
        head_scores={name: scores[name].detach().float().cpu() for name in scores},
        tokens=token_strings(model, scores.tokens[0]),
        patterns={head: scores.patterns_for(*head).detach().float().cpu() for head in chosen},
        composition=composition,
        baselines=baselines,
        edges=edges,
        spectra=spectra,
        ablation=ablation,
        induction_loss=loss,
        settings={
            "seq_len": scores.seq_len,
            "n_repeats": scores.n_repeats,
            "batch": batch,
            "seed": seed,
            "bos": scores.bos,
            "ablation": getattr(ablation, "method", "mean"),
        },
        top_k=top_k,
    )
    step("writing the report")
    report = write_report(results, out_dir / "report.html")
    scores_path = out_dir / "scores.json"
    scores_path.write_text(json.dumps(scores_json(results), indent=1, allow_nan=False) + "\n", encoding="utf-8")
    pngs: tuple[Path, ...] = ()
    if png:
        step("exporting PNGs")
        pngs = tuple(export_pngs(report, out_dir / "png"))
    return ScanOutput(results=results, head_scores=scores, report=report, scores=scores_path, pngs=pngs)


def ranked_table(results: Any, rows: int = TABLE_ROWS):
    """A rich Table of heads ranked by induction score (or the first score), one column per score."""
    from rich.table import Table

    from circuitkit.report import top_heads

    names = list(results.head_scores)
    key = "induction" if "induction" in names else names[0]
    n_heads = results.model.n_layers * results.model.n_heads
    table = Table(title=f"{results.model.name}: heads ranked by {key} score", title_justify="left")
    table.add_column("rank", justify="right")
    table.add_column("head", justify="right")
    for name in names:
        table.add_column(SHORT_NAMES.get(name, name), justify="right")
    delta = None if results.ablation is None else results.ablation.delta
    if delta is not None:
        table.add_column("ablated: loss rise", justify="right")
    for rank, ((layer, head), _) in enumerate(top_heads(results.head_scores[key], min(rows, n_heads)), start=1):
        cells = [f"{float(results.head_scores[name][layer, head]):.3f}" for name in names]
        if delta is not None:
            cells.append(f"{float(delta[layer, head]):+.3f}")
        table.add_row(str(rank), f"{layer}.{head}", *cells)
    return table


def run_scan(args: argparse.Namespace) -> int:
    from rich.console import Console

    err = Console(stderr=True, highlight=False)
    status = err.status("starting", spinner="dots") if err.is_terminal else None

    def progress(name: str) -> None:
        if status is not None:
            status.update(f"{name}...")
        else:
            err.print(f"[dim]circuitkit scan: {name}...[/dim]")

    if status is not None:
        status.start()
    try:
        output = scan(
            args.model,
            out=args.out,
            device=args.device,
            seq_len=args.seq_len,
            batch=args.batch,
            top_k=args.top_k,
            seed=args.seed,
            png=args.png,
            progress=progress,
            allow_download=args.allow_download,
        )
    finally:
        if status is not None:
            status.stop()
    if args.json:
        sys.stdout.write(output.scores.read_text(encoding="utf-8"))
        sys.stdout.flush()
        return 0
    console = Console(highlight=False)
    console.print(ranked_table(output.results))
    console.print(f"wrote {output.report} and {output.scores}")
    for path in output.pngs:
        console.print(f"wrote {path}")
    return 0


COMMANDS["scan"] = (add_scan_parser, run_scan)
