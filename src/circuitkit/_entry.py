"""The ``circuitkit`` console script: :func:`circuitkit.cli.main`, then an exit without the interpreter's teardown.

Why: a process that imported torch, transformers and TransformerLens spends over a second at exit tearing them
down (finalising every module and freeing some 400,000 objects): measured 1.6 s after those imports alone, a
fifth of the bundled model's whole ``circuitkit scan`` (benchmarks/README.md, "Time to the first answer"). Nothing
the command produced depends on that teardown: its files are written, closed and renamed into place before
``main`` returns. So the script runs what Python runs at exit that can matter (the ``atexit`` handlers, among them
``weakref.finalize`` callbacks such as temporary directories' cleanup, and ``logging``'s flush), flushes stdout and
stderr, and ends the process with ``os._exit`` and the command's exit code, as mypy's command line does. Where a
non-daemon thread is still running, or ``main`` raised anything but ``SystemExit``, the ordinary exit runs instead
(it joins the thread; it prints the traceback).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading


def exit_code(code: object) -> int:
    """The process exit status ``sys.exit(code)`` gives: 0 for None, an int as it is, anything else printed to
    stderr and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def main() -> None:
    """Run the CLI and end the process with its exit code (never returns)."""
    from circuitkit.cli import main as cli_main

    try:
        code = exit_code(cli_main())
    except SystemExit as stop:  # argparse's --help, --version and usage errors
        code = exit_code(stop.code)
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)
    atexit._run_exitfuncs()  # what an ordinary exit runs first (atexit handlers, weakref finalizers)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (| head): nothing more can be written there anyway
            pass
    os._exit(code)


if __name__ == "__main__":
    main()
