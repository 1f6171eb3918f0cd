"""The ``circuitkit`` command line.

Sub-commands are registered in :data:`COMMANDS`; each takes parsed arguments and returns an exit code.
Bad input is reported as one line on stderr (``circuitkit: error: ...``) with a non-zero exit code,
never as a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from circuitkit import __version__
from circuitkit.errors import CircuitkitError

Command = Callable[[argparse.Namespace], int]
COMMANDS: dict[str, tuple[Callable[[argparse._SubParsersAction], argparse.ArgumentParser], Command]] = {}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="circuitkit",
        description="Score attention heads (induction, previous-token, composition, QK/OV spectra) and "
        "write an offline report.",
    )
    parser.add_argument("--version", action="version", version=f"circuitkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (add_parser, _) in COMMANDS.items():
        add_parser(sub).set_defaults(command=name)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    _register_commands()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    _, run = COMMANDS[args.command]
    try:
        return run(args)
    except CircuitkitError as error:
        print(f"circuitkit: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("circuitkit: interrupted", file=sys.stderr)
        return 130


def _register_commands() -> None:
    """Import the modules that register sub-commands (kept out of ``import circuitkit``)."""
    import circuitkit.cli_commands  # noqa: F401


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
