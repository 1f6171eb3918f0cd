"""The ``circuitkit`` command line: argument parsing, then ``circuitkit.scan(...).save(...)`` (the ranked table and
the answer printed) or ``circuitkit.track(...)``.

``circuitkit scan [MODEL] [--out DIR] [--device D] [--device-map auto] [--block-len N] [--batch B] [--seed S]
[--ablate top|all|none] [--ablate-top K] [--quick] [--sort COLUMN] [--top-k K] [--json] [--png] [--allow-download]``

``circuitkit track CKPT...|RUN_DIR [--out DIR] [--steps N,N,...] [--no-merge]`` / ``circuitkit track --merge DIR``

Every option either applies to the run or is refused: an option the run would not use (``--sort`` with a task,
``--pairs`` without one, ``--ablate-top`` with ``--quick``, ...; :data:`SCAN_UNUSED`) is an error before the model
loads, as is everything that can be checked from the arguments and files.

Every error is one ``circuitkit: error: ...`` line on stderr and exit code 2 (argparse's own errors too);
Ctrl-C is one ``circuitkit: interrupted`` line and exit code 130, with earlier outputs left intact (the
report and scores are replaced together or not at all).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from circuitkit import __version__
from circuitkit._terminal import labelled, plain, visible
from circuitkit.errors import CircuitkitError

# Nothing above imports torch: argument and path errors are answered in a fraction of a second. The constants
# below mirror their homes (validate.MAX_SEED, pipeline.DEFAULT_ABLATE_TOP); a test checks they agree.
MAX_SEED = 2**63 - 1

DEFAULT_OUT = "circuitkit-report"
TABLE_ROWS = 16


class _Parser(argparse.ArgumentParser):
    """argparse, but its errors are one line and exit code 2 like every other circuitkit error."""

    def error(self, message: str) -> NoReturn:
        import re

        choice = re.search(r"invalid choice: '(.*?)' \(choose from (.*)\)$", message)
        if choice:  # the closest choice too: "argument --ablate: invalid choice: 'al' (...); did you mean 'all'?"
            message += _did_you_mean(choice.group(1), re.findall(r"'(.*?)'", choice.group(2)), quote=True)
        raise _UsageError(message)

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        """argparse's, with the closest option named for an unrecognized one (``--qiuck``: did you mean --quick?)."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            sub = _subcommands(self).get(getattr(parsed, "command", None), self)  # the options where it was given
            flags = [flag for action in sub._actions for flag in action.option_strings]
            first = next((e.split("=", 1)[0] for e in extras if e.startswith("-")), "")
            self.error(f"unrecognized arguments: {' '.join(extras)}{_did_you_mean(first, flags) if first else '.'}")
        return parsed


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
    scan.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                      help="the weights' dtype (default float32): bfloat16 / float16 halve the memory; measurements "
                      "stay within about 0.02 of float32 on the bundled model")
    scan.add_argument("--device-map", default=None, metavar="MAP",
                      help="shard the model over devices: 'auto' (accelerate decides), or a JSON object "
                      "module -> device")
    scan.add_argument("--block-len", "--seq-len", dest="block_len", type=_int_in(2), default=None, metavar="N",
                      help="length of the random block that is repeated (default: 20 or what fits the context)")
    scan.add_argument("--batch", type=_int_in(1), default=16, metavar="B", help="sequences per batch (16)")
    scan.add_argument("--seed", type=_int_in(0, MAX_SEED), default=0, help="seed of the random tokens (0)")
    scan.add_argument("--ablate", choices=("top", "all", "none"), default=None,
                      help="exact ablation of the top heads by attribution plus the detected circuit (top, the "
                      "default), of every head (all), or none; with --task: each head patched alone against its "
                      "EAP-IG score, the top by |score| or all (off by default)")
    # pipeline.DEFAULT_ABLATE_TOP, not imported: --help stays free of torch (a test checks they agree)
    scan.add_argument("--ablate-top", type=_int_in(1), default=8, metavar="K",
                      help="heads ranked by |attribution| (with --task: |EAP-IG score|) to ablate exactly with "
                      "--ablate top (8)")
    scan.add_argument("--ablation-method", choices=("mean", "zero"), default="mean",
                      help="replace a head's output by its mean (default) or by zeros; with --task, given: how "
                      "nodes outside the circuit are replaced, mean being the mean over the corrupted prompts "
                      "(default there: the task's own, the corrupted prompt's values; repeated-tokens: the clean "
                      "mean, as the induction scan's mean)")
    scan.add_argument("--top-k", type=_int_in(1), default=5, metavar="K",
                      help="heads per score and composition edges per mode to list (5)")
    scan.add_argument("--no-circuit", action="store_true",
                      help="skip the circuit search (faithfulness) and the edge evidence that serves it (edge "
                      "attribution and path patching)")
    scan.add_argument("--quick", action="store_true",
                      help="scores, attribution, composition and spectra only: no exact ablation and no edge "
                      "evidence (the same as --ablate none --no-circuit); with --task: the node circuit only, no "
                      "edge circuit, EAP-IG with one point (3 passes instead of 9) and, on the held-out pairs, the "
                      "circuit's own faithfulness and necessity rather than its whole curve")
    scan.add_argument("--no-edges", action="store_true",
                      help="the circuit of heads without its edges: no edge attribution and path patching (with "
                      "--task: no edge circuit)")
    scan.add_argument("--sort", default=None, metavar="COLUMN",
                      help="sort the table by this column, largest first: a score's short or full name (induct, "
                      "prev, dup, self, first, copy, ...), attrib, or ablated (alias: ablate); default: induction")
    scan.add_argument("--json", action="store_true", help="print the scores JSON to stdout instead of the table")
    scan.add_argument("--allow-download", action="store_true",
                      help="let a model name be fetched from the Hugging Face hub (default: local cache only)")
    scan.add_argument("--png", action="store_true",
                      help="also export every figure as DIR/png/*.png (needs headless Chromium)")
    # tasks.BUILT_IN, not imported: --help stays free of torch (a test checks they agree)
    scan.add_argument("--task", default="induction", metavar="TASK",
                      help="the behaviour whose circuit to find: induction (default: repeated random tokens), ioi, "
                      "greater-than, docstring, repeated-tokens (induction as a task), or a file of "
                      "clean/corrupted pairs (.jsonl, .csv, .json)")
    scan.add_argument("--pairs", type=_int_in(2, 10_000), default=None, metavar="N",
                      help="prompt pairs a built-in task writes (default: the task's own: 32; repeated-tokens 16, "
                      "the induction scan's batch)")
    # graph.task.METRIC_NAMES and ALIASES, not imported: --help stays free of torch (a test checks they agree)
    scan.add_argument("--metric", choices=TASK_METRICS, default=None,
                      help="a task's metric instead of its own: logit_diff, prob_diff, answer_logprob (alias loss), "
                      "neg_kl (alias kl), next_token_logprob (a task with scored positions); a metric function of "
                      "your own: circuitkit.tasks.scan_task in Python")
    scan.add_argument("--holdout", type=_holdout, default=None,
                      metavar="F", help="a task's pairs held out for evaluation, in [0, 1) (0.5; 0: no split)")
    scan.add_argument("--target-on", choices=("discovery", "evaluation"), default=None,
                      help="the pairs --target applies to (discovery: the ones the circuit is searched on)")
    # graph.runner.IG_POINTS, not imported: --help stays free of torch
    scan.add_argument("--ig-points", choices=("left", "right"), default=None,
                      help="where a task's EAP-IG takes its gradients on the path from the corrupted to the clean "
                      "input: left (default: 0, 1/n, .., (n-1)/n, as EAP-IG's code) or right (1/n, .., 1)")
    # graph.nodes.KV_EDGES, not imported: --help stays free of torch
    scan.add_argument("--kv-edges", choices=("grouped", "per-query-head"), default=None,
                      help="a task's key/value edges on a grouped-query model: one per key/value head (grouped, "
                      "default) or one per query head (per-query-head, as EAP-IG's graph; edge-patching passes cost a "
                      "copy of the pairs per query head of a group)")
    # tasks.circuit.NODE_RANKINGS, not imported: --help stays free of torch
    scan.add_argument("--node-ranking", choices=("joint", "eap-ig"), default=None,
                      help="what orders a task's nodes for its node circuit: their shares along the joint path from "
                      "every node patched to none (joint, default: the induction scan's ranking; 6 passes) or their "
                      "EAP-IG scores (eap-ig)")
    # tasks.search.EDGE_SEARCH_NAMES, not imported: --help stays free of torch
    scan.add_argument("--edge-search", choices=("ranked", "refined"), default=None,
                      help="how a task's edge circuit is found: the smallest top-k set by EAP-IG score (ranked, "
                      "default) or that set with its dangling edges pruned, then refined by exact drops within a "
                      "30-pass budget (refined)")
    # circuits.search.SEARCH_NAMES, not imported: --help stays free of torch
    scan.add_argument("--search", choices=("ranked", "refined", "masks"), default=None,
                      help="how the circuit is chosen: the smallest top-n set (ranked, default; a task ranks by "
                      "EAP-IG score), that set refined by exact drops and swaps (refined) or learned masks, every "
                      "step an exact set (masks)")
    scan.add_argument("--search-passes", type=_passes, default=None, metavar="N",
                      help="the refined search's pass budget: it stops before a round that would pass N passes of "
                      "the batch or pairs, keeping the circuit so far (default: none, until no member can go)")
    scan.add_argument("--prepend-bos", choices=("auto", "yes", "no"), default="auto",
                      help="a task's text prompts: the tokenizer's own BOS rule (auto, default), its BOS first (yes) "
                      "or the text's tokens alone (no)")
    scan.add_argument("--target", type=_fraction("a faithfulness", "0.8", one=True), default=0.8, metavar="F",
                      help="the faithfulness the circuit must reach, in (0, 1] (0.8)")
    # uncertainty.DEFAULT_RESAMPLES / DEFAULT_LEVEL, not imported: --help stays free of torch
    scan.add_argument("--resamples", type=_int_in(2, 1_000_000), default=1000, metavar="N",
                      help="bootstrap resamples behind every interval (1000; no extra forward pass)")
    scan.add_argument("--ci-level", type=_fraction("a confidence level", "0.95", one=False), default=0.95, metavar="F",
                      help="the intervals' confidence level, in (0, 1) (0.95)")
    scan.add_argument("--random-sets", type=_int_in(0, 10_000), default=0, metavar="N",
                      help="also measure N random head sets of the circuit's size per kind (2N passes; default 0)")
    scan.add_argument("--stability", type=_int_in(0, 10_000), default=0, metavar="N",
                      help="rerun the circuit search on N bootstrap resamples of the batch: each head's inclusion "
                      "frequency and the circuits' mean Jaccard (each about one circuit search; default 0)")
    add_track_parser(sub)  # defined with run_track below (kept apart from the scan's arguments)
    return parser


BUILT_IN_TASKS = ("induction", "ioi", "greater-than", "docstring", "repeated-tokens")
TASK_METRICS = ("logit_diff", "prob_diff", "answer_logprob", "neg_kl", "next_token_logprob", "loss", "kl")


def _real(text: str, accepted: Any, expected: str) -> float:
    """``text`` as a float that ``accepted(value)`` holds true of (text that is no number: NaN, which none of these
    accepts), else refused in one line: ``given ...; expected {expected}``."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not accepted(value):
        raise argparse.ArgumentTypeError(f"given {text!r}; expected {expected}")
    return value


def _passes(text: str) -> float:
    """An argparse type: a pass budget, a finite number of passes above 0."""
    return _real(text, lambda v: math.isfinite(v) and 0.0 < v <= 1e9, "a number of passes above 0, e.g. 40")


def _fraction(what: str, example: str, *, one: bool):
    """An argparse type: a float in ``(0, 1]`` (``one``) or ``(0, 1)``, refused in one line naming ``what``."""
    interval = "(0, 1]" if one else "(0, 1)"

    def parse(text: str) -> float:
        return _real(text, lambda v: 0.0 < v <= 1.0 if one else 0.0 < v < 1.0, f"{what} in {interval}, e.g. {example}")

    return parse


# ---------------------------------------------------------------------- which options each scan uses
INDUCTION, BUILT_IN_TASK, TASK_FILE = "induction", "built-in task", "task file"
"""The three kinds of scan: the induction scan (no --task, or --task induction), a built-in task, a task file."""
TASK_SCANS = (BUILT_IN_TASK, TASK_FILE)
TASK_SUFFIXES = (".jsonl", ".csv", ".json")

SCAN_UNUSED: dict[str, tuple[tuple[str, ...], str]] = {
    # option (its dest) -> (the scans it has no effect on, why). Every other option applies to every scan. An
    # option given to a scan that does not use it is refused before the model loads; tests/test_cli_flags.py
    # checks every option of the parser, with and without --task.
    "block_len": (TASK_SCANS, "a task brings its own prompts"),
    "batch": (TASK_SCANS, "a task's pairs are its batch; --pairs sets how many a built-in task writes"),
    "seed": ((TASK_FILE,), "a task file's pairs are read as written; --seed seeds the random tokens and the "
             "pairs a built-in task writes"),
    "top_k": (TASK_SCANS, "a task scan's answer lists its own top heads and edges"),
    "no_circuit": (TASK_SCANS, "a task scan is a circuit search; --no-edges or --quick skips its edge circuit"),
    "sort": (TASK_SCANS, "a task scan prints its answer, not a table of heads"),
    "pairs": ((INDUCTION, TASK_FILE), "it sets how many pairs a built-in task (ioi, greater-than, docstring) "
              "writes"),
    "prepend_bos": ((INDUCTION,), "the induction batch sets its own BOS; the option says how a task's text prompts "
                    "are tokenized"),
    "metric": ((INDUCTION,), "the induction scan reads the repeated-copies loss"),
    "holdout": ((INDUCTION,), "a task's pairs are split into discovery and evaluation sets; the induction batch is "
                "not"),
    "target_on": ((INDUCTION,), "it says which of a task's two sets the target applies to"),
    "ig_points": ((INDUCTION,), "the induction scan's attribution is not EAP-IG along a task's input path"),
    "kv_edges": ((INDUCTION,), "the induction scan has no task edge graph"),
    "edge_search": ((INDUCTION,), "the induction scan has no task edge circuit to search"),
    "node_ranking": ((INDUCTION,), "the induction scan ranks its heads by the joint path already"),
}


def _holdout(text: str) -> float:
    """An argparse type: a task's held-out share, a float in ``[0, 1)``."""
    return _real(text, lambda v: 0.0 <= v < 1.0, "a share of the pairs in [0, 1), e.g. 0.5")


def _search_options(args: argparse.Namespace) -> dict[str, float] | None:
    """``--search-passes N`` as the refined search's options (None where not given)."""
    return None if args.search_passes is None else {"max_passes": args.search_passes}


def _given_split(args: argparse.Namespace) -> dict[str, Any]:
    """``holdout``, ``target_on``, ``ig_points``, ``kv_edges``, ``edge_search``, ``search`` and its options and
    ``node_ranking`` where the command line gave them (else the task scan's own defaults)."""
    return {key: value for key, value in (("holdout", args.holdout), ("target_on", args.target_on),
                                          ("ig_points", args.ig_points), ("kv_edges", args.kv_edges),
                                          ("edge_search", args.edge_search), ("search", args.search),
                                          ("node_ranking", args.node_ranking),
                                          ("search_options", _search_options(args)))
            if value is not None}


def _refuse_task_family(args: argparse.Namespace) -> None:
    """A task on a family that cannot run one (a bidirectional model), said before the model loads."""
    from circuitkit.models.families import task_refusal

    reason = task_refusal(args.model) if args.task != "induction" and args.model else None
    if reason:
        raise CircuitkitError(f"--task {args.task}: {reason}; expected a causal language model (GPT-2, Llama, ...).")


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _task_kind(text: str) -> str:
    """Which scan ``--task`` asks for (:data:`INDUCTION`, :data:`BUILT_IN_TASK`, :data:`TASK_FILE`); a task that is
    not built in must be a task file that exists (said before torch loads, with the closest names)."""
    if text == "induction":
        return INDUCTION
    if text in BUILT_IN_TASKS:
        return BUILT_IN_TASK
    from pathlib import Path

    path = Path(text)
    if path.suffix.lower() not in TASK_SUFFIXES:
        raise CircuitkitError(f"--task: given {text!r}; expected one of {', '.join(BUILT_IN_TASKS)} or a task file "
                              f"(.jsonl, .csv or .json) of clean/corrupted pairs{_did_you_mean(text, BUILT_IN_TASKS)}")
    if not path.is_file():
        raise CircuitkitError(f"--task: {text!r}: no such file; expected a task file of clean/corrupted pairs"
                              f"{_did_you_mean(text, _task_files_beside(path), quote=True)}")
    return TASK_FILE


def _task_files_beside(path: Any) -> list[str]:
    """The task files in ``path``'s folder, written as ``path`` is (for a suggestion); [] if it cannot be read."""
    import os

    folder = path.parent
    try:
        names = [entry.name for entry in os.scandir(folder) if entry.name.lower().endswith(TASK_SUFFIXES)]
    except OSError:
        return []
    return [str(folder / name) if str(folder) != "." else name for name in names[:1000]]


def _did_you_mean(text: str, choices: Sequence[str], *, quote: bool = False) -> str:
    """``"; did you mean X?"`` for the choice closest to ``text`` (difflib, similarity >= 0.6), else ``"."``."""
    import difflib

    by_lower = {choice.lower(): choice for choice in reversed(choices)}  # case aside: --QUICK is --quick
    close = difflib.get_close_matches(text.lower(), list(by_lower), n=1, cutoff=0.6)
    if not close:
        return "."
    best = by_lower[close[0]]
    return f"; did you mean {best!r}?" if quote else f"; did you mean {best}?"


def _given(args: argparse.Namespace) -> frozenset[str]:
    """The options the command line set (:func:`given_options`, kept by :func:`main`); for a namespace built
    elsewhere, the options whose value is not the parser's default."""
    given = getattr(args, "_given", None)
    if given is not None:
        return given
    defaults = vars(build_parser().parse_args([args.command]))
    return frozenset(k for k, v in vars(args).items() if k in defaults and v != defaults[k])


def _refuse(dest: str, context: str, why: str, instead: str = "") -> NoReturn:
    flag = _flag(dest)
    raise CircuitkitError(f"{flag}: given {context}, which does not use it ({why}); expected {flag} left out"
                          f"{instead}.")


def refuse_unused_scan_options(args: argparse.Namespace, kind: str) -> None:
    """Refuse, in one line before the model loads, an option the scan of this ``kind`` would not use: one that
    :data:`SCAN_UNUSED` lists for it, or one that another option turns off."""
    given = _given(args)
    for dest, (kinds, why) in SCAN_UNUSED.items():
        if dest in given and kind in kinds:
            if kind == INDUCTION:
                _refuse(dest, "for the induction scan (no --task)", why,
                        f", or a built-in task: --task {' | '.join(BUILT_IN_TASKS[1:])}")
            _refuse(dest, f"with --task {args.task}", why)
    if "device" in given and args.device_map is not None:
        _refuse("device", "with --device-map", "the map places the model's parts on devices")
    if "search_passes" in given and args.search != "refined":
        _refuse("search_passes", f"with --search {args.search or 'ranked'}", "it is the refined search's pass "
                "budget (the ranked circuit takes none; the masks search's cost is its steps)")
    if kind != INDUCTION:
        if "ablate_top" in given and args.ablate != "top":
            _refuse("ablate_top", f"with --ablate {args.ablate or 'none'}", "it counts the heads a task scan patches "
                    "alone under --ablate top (off by default with a task)")
        if args.quick and "no_edges" in given:
            _refuse("no_edges", "with --quick", "a quick task scan measures no edge circuit")
        if args.edge_search not in (None, "ranked") and (args.quick or args.no_edges):
            _refuse("edge_search", "with --quick" if args.quick else "with --no-edges", "no edge circuit is "
                    "measured to search")
        return
    if "ablate_top" in given and _ablate_mode(args) != "top":
        _refuse("ablate_top", "with --quick" if args.quick else f"with --ablate {args.ablate}",
                "it counts the heads ablated exactly under --ablate top")
    skipped = _skipped_flag(args)
    if skipped is not None:
        for dest in ("target", "random_sets", "stability", "no_edges", "search", "search_passes"):
            if dest in given:
                _refuse(dest, f"with {skipped}", "there is no circuit search")
    if args.json and "sort" in given:
        _refuse("sort", "with --json", "--json prints the scores JSON, not the table")


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


def _say(text: str) -> None:
    """A progress line on stderr (stdout stays the table, or the JSON under --json); names from data escaped."""
    print(visible(text), file=sys.stderr, flush=True)


def run_scan(args: argparse.Namespace) -> int:
    import time

    from circuitkit.models.locate import check_model_name
    from circuitkit.report.saving import prepare_directory

    started = time.perf_counter()
    # What the arguments and the file system decide, before torch loads (a fraction of a second).
    check_model_name(args.model, allow_download=args.allow_download)  # a typo answered before torch loads
    kind = _task_kind(args.task)
    refuse_unused_scan_options(args, kind)
    _refuse_task_family(args)
    ablate = _ablate_mode(args)
    circuit = not (args.no_circuit or args.quick)
    if args.sort is not None and kind == INDUCTION:
        sort_column(args.sort, ablated=ablate != "none")
    device_map = _device_map(args.device_map)
    if device_map is not None and args.model is None:
        raise CircuitkitError("--device-map: given with the bundled model; expected a Hugging Face MODEL to shard.")
    out = prepare_directory(args.out, where="--out", probe=True, kind="scan")
    from circuitkit import zoo

    name = args.model or zoo.DEFAULT
    # What needs torch but no model: the device, the task file read and checked (its tokens need the model).
    task = None
    if kind == TASK_FILE:
        _say(f"scan: reading the task file {args.task}")
        task = _with_ablation(args, _load_task_file(args.task))
    _say(f"scan: loading {name}" + (" (the bundled model)" if args.model is None else ""))
    import circuitkit as ck
    from circuitkit.detect.tokens import RepeatedTokens
    from circuitkit.memory import check_memory
    from circuitkit.models.loading import load_model
    from circuitkit.validate import device as check_device

    check_device("--device", args.device)
    model = None
    if kind == INDUCTION and device_map is None:
        # the bundled model, or a Llama / Qwen2 / Mistral directory, runs as circuitkit's own model where it can:
        # the same figures without importing TransformerLens and transformers (seconds of the whole command)
        from circuitkit.models.loading import own_model

        model = own_model(args.model, device=args.device, dtype=args.dtype)
    if model is None:
        with _quiet_loading(args.allow_download):
            if device_map is not None:
                model = load_model(args.model, device_map=device_map, allow_download=args.allow_download,
                                   dtype=args.dtype)
            else:
                model = load_model(args.model, device=args.device, allow_download=args.allow_download,
                                   dtype=args.dtype)
    own_decoder = type(model).__name__ == "DecoderModel"
    runs_as = f" ({model.cfg.family}, run by circuitkit's own decoder)" if own_decoder else ""
    _say(f"scan: loaded {name} in {time.perf_counter() - started:.1f} s{runs_as}")
    if kind != INDUCTION:
        return _run_task_scan(args, model, name, out, task)
    check_memory(model, args.batch, args.block_len, circuit=circuit, device=args.device)
    result = ck.scan(
        model,
        tokens=RepeatedTokens(block_len=args.block_len, batch=args.batch, seed=args.seed),
        ablate=ablate,
        ablate_top=args.ablate_top if ablate == "top" else None,
        ablation_method=args.ablation_method,
        top_k=args.top_k,
        circuit=circuit,
        device=args.device,
        progress=True,  # a bar on a terminal, one line per stage in a log or a pipe
        name=name,
        allow_download=args.allow_download,
        target=args.target,
        n_resamples=args.resamples,
        ci_level=args.ci_level,
        random_sets=args.random_sets,
        stability=args.stability,
        edges=not args.no_edges,
        search=args.search,
        search_options=_search_options(args),
    )
    saved = result.save(out, png=args.png)
    if args.json:
        sys.stdout.write(saved.scores.read_text(encoding="utf-8"))
        sys.stdout.flush()
        return 0
    output = _Output()
    output.print(ranked_table(result, sort=args.sort))
    print_answer(output, result, skipped=_skipped_flag(args))
    output.text(f"wrote {saved.report} and {saved.scores}", "")
    for path in saved.pngs:
        output.text(f"wrote {path}", "")
    return 0


def _load_task_file(path: str) -> Any:
    """The task file read and checked by :func:`circuitkit.tasks.load_task` (everything but its tokens)."""
    from circuitkit.tasks import load_task

    return load_task(path)


def _with_ablation(args: argparse.Namespace, task: Any) -> Any:
    """``task`` with ``--ablation-method`` as its ablation where the option was given (a task patches nodes from
    the corrupted prompt by default)."""
    if "ablation_method" not in _given(args):
        return task
    import dataclasses

    return dataclasses.replace(task, ablation=args.ablation_method)


def _run_task_scan(args: argparse.Namespace, model: Any, name: str, out: Any, task: Any = None) -> int:
    """``--task``: the task's circuit (:func:`circuitkit.tasks.scan_task`; ``--quick``: the node circuit only), its
    answer printed, the pair of files written. ``task``: the task file already read, else the built-in task is
    written for the model's tokenizer here."""
    from circuitkit import tasks

    if task is None:
        task = _with_ablation(args, tasks.get_task(args.task, model, n=args.pairs, seed=args.seed))
    _say(f"scan: task {task.name!r}, {task.n_pairs} pairs, metric {args.metric or task.metric}, ablation "
         f"{task.ablation}")
    result = tasks.scan_task(model, task, target=args.target, edges=not args.no_edges, quick=args.quick,
                             device=args.device, name=name, n_resamples=args.resamples, ci_level=args.ci_level,
                             progress=True,  # a bar on a terminal, one line per stage in a log or a pipe
                             prepend_bos={"auto": None, "yes": True, "no": False}[args.prepend_bos],
                             metric=args.metric, random_sets=args.random_sets, stability=args.stability,
                             ablate=args.ablate or "none",
                             ablate_top=args.ablate_top if args.ablate == "top" else None, **_given_split(args))
    saved = result.save(out, png=args.png)
    if args.json:
        sys.stdout.write(saved.scores.read_text(encoding="utf-8"))
        sys.stdout.flush()
        return 0
    output = _Output()
    for line in result.answer().splitlines():
        label, _, rest = line.partition(": ")
        output.text(label, rest)
    if args.quick and result.circuit is not None:
        output.text("Edge circuit skipped (--quick); run without --quick to measure the edge circuit.", "")
    output.text(f"wrote {saved.report} and {saved.scores}", "")
    for path in saved.pngs:
        output.text(f"wrote {path}", "")
    return 0


def _skipped_flag(args: argparse.Namespace) -> str | None:
    """The flag that skipped the circuit search, if one did."""
    return "--quick" if args.quick else "--no-circuit" if args.no_circuit else None


class _quiet_loading:
    """Hugging Face's own ``Loading weights`` bars off while a model loads (circuitkit prints one line instead);
    left on where a download may run (its bars say how far it is)."""

    def __init__(self, allow_download: bool) -> None:
        self.active = not allow_download

    def __enter__(self) -> None:
        if self.active:
            from transformers.utils import logging as hf_logging

            self.was = hf_logging.is_progress_bar_enabled()
            hf_logging.disable_progress_bar()

    def __exit__(self, *exc: Any) -> None:
        if self.active and self.was:
            from transformers.utils import logging as hf_logging

            hf_logging.enable_progress_bar()


class _Output:
    """The table and the answer on stdout. On a terminal: a rich Console at the terminal's width, the answer's
    lines wrapped between items (:func:`wrap_items`). Without one (a pipe, a file): nothing wrapped and no
    trailing spaces; each line is as long as its content."""

    def __init__(self) -> None:
        from rich.console import Console

        self.terminal = sys.stdout.isatty()
        self.console = Console(highlight=False) if self.terminal else Console(
            highlight=False, width=10_000, soft_wrap=True, color_system=None, force_terminal=False)

    def print(self, renderable: Any) -> None:
        if self.terminal:
            self.console.print(renderable)
            return
        with self.console.capture() as captured:
            self.console.print(renderable)
        text = "\n".join(line.rstrip() for line in captured.get().splitlines())
        sys.stdout.write(text + "\n")
        sys.stdout.flush()

    def text(self, label: str, rest: str) -> None:
        """A ``label: rest`` line, the label in bold on a terminal (data printed as written: :mod:`_terminal`)."""
        label, rest = visible(label), visible(rest)
        if not self.terminal:
            sys.stdout.write((f"{label}: {rest}" if rest else label) + "\n")
            return
        width = self.console.width
        lines = wrap_items(f"{label}: {rest}" if rest else label, width)
        first = lines[0]
        if rest and first.startswith(f"{label}: "):
            first = labelled(label, first[len(label) + 2:])
        else:
            first = plain(first)
        for line in [first, *(plain(line) for line in lines[1:])]:
            self.console.print(line, soft_wrap=True)


ITEM_BREAKS = ("; ", ", ", ": ")
"""Where a terminal line of the answer may wrap: after these separators (between items), before words only where
one item is wider than the terminal."""


def wrap_items(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` characters, broken only after ``"; "``, ``", "`` or ``": "`` (so
    ``0.1 -> 1.3 K +0.16`` or ``1.1 induction`` stays on one line); an item wider than ``width`` alone is broken
    between words. Continuation lines are indented by two spaces. Joining the lines with spaces and collapsing
    whitespace gives back ``text``."""
    import re
    import textwrap

    width = max(int(width), 20)
    items = [item for item in re.split(r"(?<=[;,:]) ", text) if item]
    lines: list[str] = []
    current = ""
    for item in items:
        candidate = f"{current} {item}" if current else item
        indent = 2 if lines else 0
        if len(candidate) + indent <= width:
            current = candidate
            continue
        if current:
            lines.append(current)
        if len(item) + 2 > width:  # one item wider than the terminal: break it between words
            parts = textwrap.wrap(item, width - 2, break_long_words=False, break_on_hyphens=False)
            lines.extend(parts[:-1])
            current = parts[-1]
        else:
            current = item
    if current:
        lines.append(current)
    return [line if i == 0 else "  " + line for i, line in enumerate(lines)]


def _ablate_mode(args: argparse.Namespace) -> str:
    """``--ablate`` as given, ``"none"`` under ``--quick``, else ``"top"``; ``--quick`` with exact ablation is a
    contradiction, refused."""
    if args.quick and args.ablate not in (None, "none"):
        raise CircuitkitError(
            f"--quick: given with --ablate {args.ablate}; expected --quick alone (it skips exact ablation) or "
            f"--ablate {args.ablate} without --quick."
        )
    return args.ablate or ("none" if args.quick else "top")


SCORE_COLUMNS = {"induction": "induct", "previous_token": "prev", "duplicate_token": "dup",
                 "current_token": "self", "first_token": "first", "copying": "copy"}
"""The registered head scores (full name -> short name), mirrored from :mod:`circuitkit.detect.registry` so that
``--sort`` is checked before torch loads (a test checks they agree)."""
EFFECT_COLUMNS = {"attrib": "attribution", "ablated": "ablation"}
"""Table columns of causal effects -> the scan result's attribute holding them."""
_COLUMN_ALIASES = {"attribution": "attrib", "ablate": "ablated", "ablation": "ablated", "exact": "ablated"}


def sort_column(text: str, *, ablated: bool = True, scores: Any = None) -> str:
    """The table column ``--sort`` names: a head score's full name (``"induction"``) or short name
    (``"induct"``), ``"attrib"`` or ``"ablated"`` (aliases ``attribution``, ``ablate``, ``ablation``, ``exact``).

    Returns the score's full name or the effect column's label. ``scores`` (a scan's ``head_scores``) limits
    the score names to those the scan computed; without it, the registered scores (:data:`SCORE_COLUMNS`) are the
    choices.
    ``ablated=False`` (``--ablate none``, ``--quick``) refuses ``ablated``: that column is empty."""
    if scores is not None:
        shorts = {name: scores.definitions[name].short for name in scores}
    else:
        shorts = dict(SCORE_COLUMNS)
    by_short = {short: name for name, short in shorts.items()}
    key = text.strip().lower()
    key = _COLUMN_ALIASES.get(key, key)
    if key in shorts:
        return key
    if key in by_short:
        return by_short[key]
    if key in EFFECT_COLUMNS:
        if key == "ablated" and not ablated:
            raise CircuitkitError(
                f"--sort: given {text!r}, but this scan ablates no head exactly (--ablate none or --quick); "
                "expected another column, or --ablate top|all."
            )
        return key
    choices = sorted({*by_short, *EFFECT_COLUMNS})
    close = _did_you_mean(key, [*choices, *shorts, *_COLUMN_ALIASES])
    raise CircuitkitError(f"--sort: given {text!r}; expected a column of the table: {', '.join(choices)}{close}")


def ranked_table(scan: Any, rows: int = TABLE_ROWS, sort: str | None = None):
    """A rich Table of the ``rows`` first heads, largest first by ``sort`` (a column :func:`sort_column` reads;
    default the induction score, or the first score): one column per registered score (its short name), then
    the attribution estimate and the exact ablation effect where computed. Heads without a value in the sort
    column (not ablated) come last."""
    from rich import box
    from rich.table import Table

    from circuitkit.ranking import head_name, top_heads

    scores = scan.head_scores
    names = list(scores)
    effects = [(label, e) for label, e in (("attrib", scan.attribution), ("ablated", scan.ablation)) if e is not None]
    if sort is None:
        key = "induction" if "induction" in names else names[0]
    else:
        key = sort_column(sort, ablated=scan.ablation is not None, scores=scores)
    if key in EFFECT_COLUMNS:
        effect = getattr(scan, EFFECT_COLUMNS[key])
        if effect is None:
            raise CircuitkitError(f"--sort: given {sort!r}, but this scan has no {key} column; expected another.")
        ranking = effect.effect
        title = f"heads ranked by {key} (loss rise, nats)"
    else:
        ranking = scores[key]
        title = f"heads ranked by {key} score"
    m = scan.model
    table = Table(
        title=plain(f"{m.name}: {title}"),
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
        table.add_column(plain(scores.definitions[name].short), justify="right", min_width=6, no_wrap=True)
    for label, _ in effects:
        table.add_column(label, justify="right", min_width=len(label), no_wrap=True)
    for rank, (head, _) in enumerate(top_heads(ranking, min(rows, m.n_layers * m.n_heads)), start=1):
        cells = [f"{float(scores[name][head]):.3f}" for name in names]
        for _, effect in effects:
            value = float(effect.effect[head])
            cells.append("" if value != value else f"{value:+.2f}")
        table.add_row(str(rank), head_name(head), *cells)
    return table


# ---------------------------------------------------------------------- circuitkit track
DEFAULT_TRACK_OUT = "circuitkit-track"


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"given {text!r}; expected integers separated by commas") from None
    if not values:
        raise argparse.ArgumentTypeError(f"given {text!r}; expected at least one step")
    return values


def add_track_parser(sub: Any) -> None:
    """``circuitkit track CKPT... --out DIR`` / ``circuitkit track DIR`` / ``circuitkit track --merge DIR``."""
    track = sub.add_parser(
        "track",
        help="score every head along a training run (checkpoints) and locate the in-context learning phase change",
        description="Score every head of each checkpoint on the same repeated random tokens, one checkpoint at a "
        "time, and locate the in-context learning phase change. Writes DIR/track-step<N>.json per checkpoint (a "
        "rerun skips finished ones), DIR/track.json and DIR/report.html. Scale out: run one process per checkpoint "
        "with --no-merge into one DIR (e.g. a job array), then `circuitkit track --merge DIR`.",
    )
    track.add_argument("checkpoints", nargs="*", metavar="CKPT",
                       help="checkpoint directories (named step<N> or checkpoint-<N>), hub 'name@revision' (from "
                       "the local cache), or one directory holding step<N>/ or checkpoint-<N>/ subdirectories")
    track.add_argument("--out", type=_out_dir, default=None, metavar="DIR",
                       help=f"output directory (default {DEFAULT_TRACK_OUT})")
    track.add_argument("--merge", type=_out_dir, default=None, metavar="DIR",
                       help="assemble DIR/track.json and DIR/report.html from the per-checkpoint records in DIR")
    track.add_argument("--steps", type=_int_list, default=None, metavar="N,N,...",
                       help="the training step of each CKPT (default: read from its name)")
    track.add_argument("--block-len", type=_int_in(2), default=None, metavar="N",
                       help="length of the random block that is repeated (default: 20 or what fits the context)")
    track.add_argument("--batch", type=_int_in(1), default=16, metavar="B", help="sequences per batch (16)")
    track.add_argument("--seed", type=_int_in(0, MAX_SEED), default=0, help="seed of the random tokens (0)")
    track.add_argument("--top-k", type=_int_in(0), default=10, metavar="K",
                       help="composition edges kept per mode per checkpoint (10)")
    track.add_argument("--device", default=None, help="torch device, e.g. cpu or cuda")
    track.add_argument("--no-resume", action="store_true", help="measure every checkpoint again")
    track.add_argument("--no-merge", action="store_true",
                       help="write only the per-checkpoint records (one job of many; merge later with --merge)")
    track.add_argument("--allow-download", action="store_true",
                       help="let hub checkpoints be fetched (default: local Hugging Face cache only)")
    track.add_argument("--png", action="store_true",
                       help="also export every figure as DIR/png/*.png (needs headless Chromium)")
    track.add_argument("--task", default=None, metavar="FILE",
                       help="also measure a task (a .jsonl, .csv or .json file of clean/corrupted pairs) at every "
                       "checkpoint: its metric, each head's EAP-IG score and DLA, its node circuit (faithfulness "
                       "0.8) and that circuit on held-out pairs")
    track.add_argument("--target", type=_fraction("a faithfulness", "0.8", one=True), default=None, metavar="F",
                       help="with --task: the faithfulness its node circuit must reach, in (0, 1] (0.8)")


TRACK_MERGE_USES = ("merge", "png")
"""The options ``track --merge DIR`` uses: it assembles records already measured, so every option of the
measurement is refused beside it (checkpoints and --out in a line of their own)."""


def refuse_unused_track_options(args: argparse.Namespace) -> None:
    """Refuse, before any checkpoint loads, a track option that this run would not use."""
    given = _given(args)
    if args.merge is not None:
        if args.checkpoints or args.out is not None:
            raise CircuitkitError("track --merge: given checkpoints or --out too; expected only the directory of "
                                  "records (track --merge DIR).")
        for dest in sorted(given - {"checkpoints", "out", *TRACK_MERGE_USES}):
            _refuse(dest, "with --merge", "--merge assembles the records already measured")
    if args.target is not None and args.task is None:
        _refuse("target", "without --task", "--target is the task's node-circuit faithfulness")
    if args.no_merge and "png" in given:
        _refuse("png", "with --no-merge", "--no-merge writes no report; pass --png to track --merge")


def run_track(args: argparse.Namespace) -> int:
    refuse_unused_track_options(args)
    from circuitkit.detect.tokens import RepeatedTokens
    from circuitkit.report.track_page import sentences
    from circuitkit.tracking import merge, track

    if args.merge is not None:
        result = merge(args.merge)
        saved = result.save(args.merge, png=args.png)
    else:
        if not args.checkpoints:
            raise CircuitkitError("track: given no checkpoints; expected CKPT... (checkpoint directories or "
                                  "hub name@revision) or one directory holding step<N>/ subdirectories.")
        out = args.out or DEFAULT_TRACK_OUT
        result = track(
            args.checkpoints[0] if len(args.checkpoints) == 1 and args.steps is None else args.checkpoints,
            steps=args.steps,
            tokens=RepeatedTokens(block_len=args.block_len, batch=args.batch, seed=args.seed),
            top_k=args.top_k, out=out, resume=not args.no_resume, write_track=not args.no_merge,
            device=args.device, allow_download=args.allow_download, progress=sys.stderr.isatty(),
            **({} if args.task is None else {"task": args.task}),
            **({} if args.target is None else {"target": args.target}),
        )
        if args.no_merge:
            print(f"wrote {len(result.checkpoints)} checkpoint record(s) into {out}; assemble them with "
                  f"circuitkit track --merge {out}")
            return 0
        saved = result.save(out, png=args.png) if args.png else None
        if saved is None:
            from pathlib import Path

            from circuitkit.tracking.result import REPORT_NAME, TRACK_NAME, SavedTrack

            saved = SavedTrack(track=Path(out) / TRACK_NAME, report=Path(out) / REPORT_NAME)
    for line in sentences(result):
        print(visible(line))
    if getattr(result, "task", None) is not None:
        from circuitkit.report.track_page import task_table

        for line in task_table(result):
            print(visible(line))
    print(f"wrote {saved.track} and {saved.report}")
    for path in saved.pngs:
        print(f"wrote {path}")
    return 0


def print_answer(output: Any, scan: Any, skipped: str | None = None) -> None:
    """The report's answer box in a few lines (circuit, roles, exact edge effects, faithfulness, loss): the same
    :class:`circuitkit.report.summary.Answer` the HTML writes; ``skipped``: the flag that skipped the circuit
    search (named in the line that says so). ``output``: the CLI's :class:`_Output`, or a rich Console."""
    from circuitkit.report.summary import answer_lines

    for line in answer_lines(scan, skipped):
        label, _, rest = line.partition(": ")
        if isinstance(output, _Output):
            output.text(label, rest)
        else:
            output.print(labelled(label, rest))


COMMANDS = {"scan": run_scan, "track": run_track}


_UNSET = object()


def given_options(argv: Sequence[str]) -> frozenset[str]:
    """The options (dests) the command line ``argv`` sets, whatever their value: ``argv`` parsed again with every
    subcommand's defaults unset (an option left at its default is not "given"; ``--batch 16`` is)."""
    parser = build_parser()
    for sub in _subcommands(parser).values():
        for action in sub._actions:
            if action.default is not argparse.SUPPRESS:
                action.default = _UNSET
    args = parser.parse_args(argv)
    return frozenset(k for k, v in vars(args).items() if v is not _UNSET and k != "command")


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The subcommands' parsers by name (``scan``, ``track``); {} for a parser without subcommands."""
    action = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    return dict(action.choices) if action is not None else {}


def main(argv: Sequence[str] | None = None) -> int:
    from circuitkit.cpu_threads import prefer_passive_waiting

    prefer_passive_waiting()  # before torch loads: idle OpenMP threads sleep, not spin, beside other work
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return 0
        args._given = given_options(argv)
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

