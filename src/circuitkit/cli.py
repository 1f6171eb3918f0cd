"""The ``circuitkit`` command line: argument parsing, then ``circuitkit.scan(...).save(...)``.

``circuitkit scan [MODEL] [--out DIR] [--device D] [--device-map auto] [--block-len N] [--batch B] [--seed S]
[--ablate top|all|none] [--ablate-top K] [--top-k K] [--json] [--png] [--allow-download]``

Every error is one ``circuitkit: error: ...`` line on stderr and exit code 2 (argparse's own errors too);
Ctrl-C is one ``circuitkit: interrupted`` line and exit code 130, with earlier outputs left intact (the
report and scores are replaced together or not at all).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from circuitkit import __version__
from circuitkit.errors import CircuitkitError
from circuitkit.validate import MAX_SEED

DEFAULT_OUT = "circuitkit-report"
TABLE_ROWS = 16


class _Parser(argparse.ArgumentParser):
    """argparse, but its errors are one line and exit code 2 like every other circuitkit error."""

    def error(self, message: str) -> NoReturn:
        raise _UsageError(message)


class _UsageError(Exception):
    pass


def _int_in(low: int, high: int | None = None):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"given {text!r}; expected an integer") from None
        if value < low or (high is not None and value > high):
            bound = f">= {low}" if high is None else f"in [{low}, {high}]"
            raise argparse.ArgumentTypeError(f"given {value}; expected an integer {bound}")
        return value

    return parse


def _out_dir(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("given an empty path; expected a directory to write the report into")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="circuitkit",
        description="Score attention heads (induction, previous-token, composition, QK/OV spectra) and write an "
        "offline report.",
    )
    parser.add_argument("--version", action="version", version=f"circuitkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    scan = sub.add_parser(
        "scan",
        help="score every head, check the important ones causally, and write an offline HTML report",
        description="Score every attention head of MODEL on repeated random tokens, estimate every head's causal "
        "effect by attribution and ablate the important ones exactly, compute composition scores, edge-level "
        "evidence and QK/OV spectra, print a ranked table, and write DIR/report.html (self-contained, opens "
        "offline) and DIR/scores.json.",
    )
    scan.add_argument(
        "model", nargs="?", default=None, metavar="MODEL",
        help="a bundled zoo name (default: the bundled known-answer model), a local Hugging Face model directory, "
        "or a Hugging Face / TransformerLens model name from the local cache (--allow-download to fetch it)",
    )
    scan.add_argument("--out", type=_out_dir, default=DEFAULT_OUT, metavar="DIR",
                      help=f"output directory (default {DEFAULT_OUT})")
    scan.add_argument("--device", default=None, help="torch device, e.g. cpu or cuda (default: the model's)")
    scan.add_argument("--device-map", default=None, metavar="MAP",
                      help="shard the model over devices: 'auto' (accelerate decides), or a JSON object "
                      "module -> device")
    scan.add_argument("--block-len", "--seq-len", dest="block_len", type=_int_in(2), default=None, metavar="N",
                      help="length of the random block that is repeated (default: 20 or what fits the context)")
    scan.add_argument("--batch", type=_int_in(1), default=16, metavar="B", help="sequences per batch (16)")
    scan.add_argument("--seed", type=_int_in(0, MAX_SEED), default=0, help="seed of the random tokens (0)")
    scan.add_argument("--ablate", choices=("top", "all", "none"), default="top",
                      help="exact ablation of the top heads by attribution plus the detected circuit (top, the "
                      "default), of every head (all), or none")
    scan.add_argument("--ablate-top", type=_int_in(1), default=16, metavar="K",
                      help="heads ranked by |attribution| to ablate exactly with --ablate top (16)")
    scan.add_argument("--ablation-method", choices=("mean", "zero"), default="mean",
                      help="replace a head's output by its mean (default) or by zeros")
    scan.add_argument("--top-k", type=_int_in(1), default=5, metavar="K",
                      help="heads per score and composition edges per mode to list (5)")
    scan.add_argument("--no-circuit", action="store_true", help="skip edge attribution and path patching")
    scan.add_argument("--json", action="store_true", help="print the scores JSON to stdout instead of the table")
    scan.add_argument("--allow-download", action="store_true",
                      help="let a model name be fetched from the Hugging Face hub (default: local cache only)")
    scan.add_argument("--png", action="store_true",
                      help="also export every figure as DIR/png/*.png (needs headless Chromium)")
    return parser


def _device_map(text: str | None) -> Any:
    if text is None or text in ("auto", "balanced", "balanced_low_0", "sequential"):
        return text
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise CircuitkitError(
            f"--device-map: given {text!r}; expected 'auto', 'balanced', 'sequential' or a JSON object mapping "
            'module names to devices, e.g. \'{"": "cpu"}\'.'
        )
    return value


def run_scan(args: argparse.Namespace) -> int:
    import circuitkit as ck
    from circuitkit.detect.tokens import RepeatedTokens
    from circuitkit.report.saving import prepare_directory

    out = prepare_directory(args.out, where="--out", probe=True)
    model = args.model
    device_map = _device_map(args.device_map)
    if device_map is not None:
        from circuitkit.models.loading import load_model

        if model is None:
            raise CircuitkitError("--device-map: given with the bundled model; expected a Hugging Face MODEL to shard.")
        model = load_model(model, device_map=device_map, allow_download=args.allow_download)
    progress = True  # a bar on a terminal, one line per stage in a log or a pipe
    result = ck.scan(
        model,
        tokens=RepeatedTokens(block_len=args.block_len, batch=args.batch, seed=args.seed),
        ablate=args.ablate,
        ablate_top=args.ablate_top,
        ablation_method=args.ablation_method,
        top_k=args.top_k,
        circuit=not args.no_circuit,
        device=args.device,
        progress=progress,
        name=args.model,
        allow_download=args.allow_download,
    )
    saved = result.save(out, png=args.png)
    if args.json:
        sys.stdout.write(saved.scores.read_text(encoding="utf-8"))
        sys.stdout.flush()
        return 0
    from rich.console import Console

    console = Console(highlight=False)
    console.print(ranked_table(result))
    print_answer(console, result)
    console.print(f"wrote {saved.report} and {saved.scores}")
    for path in saved.pngs:
        console.print(f"wrote {path}")
    return 0


def ranked_table(scan: Any, rows: int = TABLE_ROWS):
    """A rich Table of heads ranked by induction score (or the first score): one column per registered score
    (its short name), then the attribution estimate and the exact ablation effect where computed."""
    from rich import box
    from rich.table import Table

    from circuitkit.ranking import head_name, top_heads

    scores = scan.head_scores
    names = list(scores)
    key = "induction" if "induction" in names else names[0]
    m = scan.model
    table = Table(
        title=f"{m.name}: heads ranked by {key} score",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        collapse_padding=True,
        pad_edge=False,
        caption="attrib: estimated, ablated: exact rise of the repeated-copies loss (nats) when the head is removed; "
        "blank: not ablated",
        caption_justify="left",
    )
    table.add_column("rank", justify="right", min_width=4, no_wrap=True)
    table.add_column("head", justify="right", min_width=4, no_wrap=True)
    for name in names:
        table.add_column(scores.definitions[name].short, justify="right", min_width=6, no_wrap=True)
    effects = [(label, e) for label, e in (("attrib", scan.attribution), ("ablated", scan.ablation)) if e is not None]
    for label, _ in effects:
        table.add_column(label, justify="right", min_width=len(label), no_wrap=True)
    for rank, (head, _) in enumerate(top_heads(scores[key], min(rows, m.n_layers * m.n_heads)), start=1):
        cells = [f"{float(scores[name][head]):.3f}" for name in names]
        for _, effect in effects:
            value = float(effect.effect[head])
            cells.append("" if value != value else f"{value:+.2f}")
        table.add_row(str(rank), head_name(head), *cells)
    return table


def print_answer(console: Any, scan: Any) -> None:
    """The report's answer box in a few lines (circuit, roles, exact edge effects, faithfulness, loss): the same
    :class:`circuitkit.report.summary.Answer` the HTML writes."""
    from rich.markup import escape

    from circuitkit.report.summary import answer_lines

    for line in answer_lines(scan):
        label, _, rest = line.partition(": ")
        console.print(f"[bold]{escape(label)}:[/bold] {escape(rest)}" if rest else escape(line))


COMMANDS = {"scan": run_scan}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return 0
        return COMMANDS[args.command](args)
    except _UsageError as error:
        print(f"circuitkit: error: {error}", file=sys.stderr)
        return 2
    except CircuitkitError as error:
        print(f"circuitkit: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("circuitkit: interrupted (outputs from earlier runs are left as they were)", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

