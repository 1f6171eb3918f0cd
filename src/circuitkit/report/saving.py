"""Writing a scan: ``report.html`` and ``scores.json``, replaced together or not at all (:func:`save`).

Why the care: a scan of a large model takes minutes; a Ctrl-C, a full disk or a crash while writing must not
leave a report that disagrees with its scores, or half a file. The protocol:

1. both files are written to temporary files in the output directory (same file system, so a rename is
   atomic), flushed and ``fsync``-ed — any failure or ``KeyboardInterrupt`` here deletes the temporaries and
   leaves the previous pair untouched;
2. with SIGINT, SIGTERM and SIGHUP deferred, the previous files are hard-linked to backups, then each temporary
   is renamed over its target (``os.replace``); if the second rename fails, the first target is restored from its
   backup;
3. the directory is ``fsync``-ed and the backups removed.

Termination signals: for the whole of :func:`write_together`, SIGTERM and SIGHUP (whose default action would end
the process on the spot, leaving temporaries behind) raise an exception instead, so the temporaries are removed;
inside step 2 all three signals wait until both renames are done. Then the signal takes its course: the handler
that was installed before runs, or, where that was the default action, the process ends by that signal (exit
status 128 + the signal's number, as without circuitkit).

What remains possible: a hard kill (SIGKILL, power loss) *between* the two renames of step 2, a window of two
system calls, leaves the new report beside the old scores; a hard kill before step 2 leaves hidden
``.ck-tmp-*`` files beside the previous pair, which are never read.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import tempfile
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from circuitkit import validate
from circuitkit.errors import CircuitkitError

if TYPE_CHECKING:
    from circuitkit.scan_record import SavedReport
    from circuitkit.scan_record import ScanRecord as Scan

REPORT_NAME = "report.html"
SCORES_NAME = "scores.json"
TEMP_PREFIX = ".ck-tmp-"
RESULT_MARKERS = {"scan": (SCORES_NAME,), "track": ("track.json", "track-step*.json")}
"""The files that say which kind of result a directory holds (``report.html`` is written by both): a directory
holds one kind, so a scan's report never sits beside a track's records or the other way round."""


def scores_text(scan: Scan) -> str:
    """``scores.json`` as text: :func:`~circuitkit.report.data.scan_json`, indented, UTF-8, final newline."""
    from circuitkit.report.data import scan_json

    return json.dumps(scan_json(scan), indent=1, ensure_ascii=False, allow_nan=False) + "\n"


def save(scan: Scan, out_dir: str | os.PathLike, *, png: bool = False) -> SavedReport:
    """Write ``out_dir/report.html`` and ``out_dir/scores.json`` (together or not at all, see the module
    docstring); with ``png``, every section as ``out_dir/png/<section>.png`` (needs headless Chromium)."""
    from circuitkit.report.data import check_scan  # imported here: prepare_directory (--out) needs no torch
    from circuitkit.report.page import build_report
    from circuitkit.scan_record import SavedReport

    check_scan("save: scan", scan)
    png = validate.boolean("save: png", png)
    out = prepare_directory(out_dir, kind="scan")
    files = {REPORT_NAME: build_report(scan).encode("utf-8"), SCORES_NAME: scores_text(scan).encode("utf-8")}
    write_together(out, files)
    pngs: tuple[Path, ...] = ()
    if png:
        from circuitkit.report.png import export_pngs

        pngs = tuple(export_pngs(out / REPORT_NAME, out / "png"))
    return SavedReport(report=out / REPORT_NAME, scores=out / SCORES_NAME, pngs=pngs)


def prepare_directory(out_dir: str | os.PathLike, *, where: str = "save: out_dir", probe: bool = False,
                      kind: str | None = None) -> Path:
    """``out_dir`` checked (a non-empty path that is not a file) and created with its parents; with ``probe``, an
    empty file is written there and removed, so that an unwritable directory fails before any work (the CLI
    checks ``--out`` before the scan runs); with ``kind`` (``"scan"`` or ``"track"``), a directory that holds the
    other kind of result is refused (:func:`check_kind`). Errors name ``where``."""
    if not isinstance(out_dir, (str, os.PathLike)) or isinstance(os.fspath(out_dir), bytes):
        raise validate.fail(where, out_dir, "a directory path (str or os.PathLike)")
    text = os.fspath(out_dir)
    if not text.strip() or "\0" in text:
        raise validate.fail(where, text, "a non-empty directory path without NUL characters")
    out = Path(text).expanduser()
    from circuitkit.models.files import check_path_length

    check_path_length(out, where)
    dangling = _dangling_link(out)
    if dangling is not None:
        raise validate.fail(where, text, "a directory path",
                            f"{str(dangling)!r} is a symlink to {os.readlink(dangling)!r}, which does not exist; "
                            "create its target or remove the link.")
    if out.exists() and not out.is_dir():
        raise validate.fail(where, text, f"a directory to write report.html into, not {_what_is(out)}",
                            "Pick another path.")
    if kind is not None:
        check_kind(out, kind, where)
    for name in (REPORT_NAME, SCORES_NAME):
        target = out / name
        if os.path.lexists(target) and not (target.is_file() or _dangling_link(target) == target):
            raise validate.fail(where, text, f"a directory where {name} can be written",
                                f"{str(target)!r} is {_what_is(target)}; move it away or pick another path.")
        if (name == REPORT_NAME or kind != "track") and target.is_file() and not _written_by_circuitkit(target):
            raise validate.fail(where, text, f"a directory without a {name} of its own, or one circuitkit wrote",
                                f"{str(target)!r} was not written by circuitkit and saving would replace it; move "
                                "it away or pick another path.")
    try:
        out.mkdir(parents=True, exist_ok=True)
        if probe:
            check = out / f"{TEMP_PREFIX}write-test"
            check.write_bytes(b"")
            check.unlink()
    except (OSError, ValueError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        missing = _first_missing(out)
        if missing is not None and missing.parent.exists() and not missing.parent.is_dir():
            reason = f"cannot create {missing.name!r} in {str(missing.parent)!r}, which is {_what_is(missing.parent)}"
        elif missing is not None:
            reason = f"cannot create {missing.name!r} in {str(missing.parent)!r}: {reason}"
        else:
            reason = f"cannot write to it: {reason}"
        raise validate.fail(where, text, f"a writable directory ({reason})") from None
    return out


OWN_MARKERS = {REPORT_NAME: (b"<title>circuitkit",), SCORES_NAME: (b'"circuitkit_version"', b'"format": "circuitkit-')}
"""What every ``report.html`` (scan, task scan, track: the title, in the first :data:`HEAD_BYTES`) and every
``scores.json`` (the induction scan's version key, a task scan's format) circuitkit writes holds: a file of those
names without it is the user's, and saving never replaces it."""
HEAD_BYTES = 4096
SCAN_BYTES = 2**30
"""The most of a ``scores.json`` read for its marker: a file larger than this without one is not circuitkit's."""


def _written_by_circuitkit(path: Path) -> bool:
    """Whether the file ``path`` (a ``report.html`` or ``scores.json``) holds circuitkit's marker (:data:`OWN_MARKERS`);
    read in chunks, a report's head only, a ``scores.json`` up to :data:`SCAN_BYTES`."""
    markers = OWN_MARKERS[path.name]
    longest = max(len(m) for m in markers)
    try:
        with open(path, "rb") as file:
            if path.name == REPORT_NAME:
                head = file.read(HEAD_BYTES)
                return any(m in head for m in markers)
            tail, read = b"", 0
            while read < SCAN_BYTES and (chunk := file.read(1 << 20)):
                read += len(chunk)
                window = tail + chunk
                if any(m in window for m in markers):
                    return True
                tail = window[-longest:]
    except OSError:
        return False
    return False


def check_kind(out: Path, kind: str, where: str) -> None:
    """Refuse ``out`` if it holds a result of another kind than ``kind`` (:data:`RESULT_MARKERS`)."""
    kind = validate.option(f"{where}: kind", kind, tuple(RESULT_MARKERS))
    if not out.is_dir():
        return
    for other, patterns in RESULT_MARKERS.items():
        if other == kind:
            continue
        found = sorted(path.name for pattern in patterns for path in out.glob(pattern))
        if found:
            raise validate.fail(where, str(out), f"a directory for a {kind}, not one holding a {other} ({found[0]})",
                                f"A directory holds one kind of result: write the {kind} to another directory.")


def _dangling_link(path: Path) -> Path | None:
    """The first of ``path`` and its ancestors that is a symlink to nothing, or None."""
    for candidate in (path, *path.parents):
        if os.path.islink(candidate) and not os.path.exists(candidate):
            return candidate
    return None


def _first_missing(path: Path) -> Path | None:
    """The outermost ancestor of ``path`` (or ``path``) that does not exist, or None if it exists."""
    missing = None
    for candidate in (path, *path.parents):
        if os.path.lexists(candidate):
            break
        missing = candidate
    return missing


def _what_is(path: Path) -> str:
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "unreadable"
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISREG, "a file"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device")):
        if test(mode):
            return name
    return "not a regular file"


def write_together(out: Path, files: dict[str, bytes]) -> None:
    """Replace ``out/<name>`` by ``payload`` for every item, all or none (see the module docstring)."""
    with _termination_unwinds(out) as progress:
        temps: dict[str, Path] = {}
        try:
            for name, payload in files.items():
                temps[name] = write_temp(out, name, payload)
            _commit(out, temps, progress)
        except OSError as error:
            raise CircuitkitError(
                f"save: cannot write {str(out)!r} ({error.strerror or error}); expected a writable directory. The "
                "previous report and scores (if any) are unchanged."
            ) from error
        finally:
            # every temporary of this writer, also one whose path was lost to an exception (a signal) arriving
            # between its creation and its entry in ``temps``
            for path in {*temps.values(), *_own_temporaries(out, files)}:
                with contextlib.suppress(OSError):
                    path.unlink(missing_ok=True)


def _temp_prefix(name: str) -> str:
    """Temporaries of this process and thread start so: ``.ck-tmp-<name>.<pid>-<thread>.``."""
    return f"{TEMP_PREFIX}{name}.{os.getpid()}-{threading.get_ident()}." if name else TEMP_PREFIX


def _own_temporaries(out: Path, names: Iterable[str]) -> list[Path]:
    """The temporaries this process and thread wrote for ``names`` in ``out`` (backups excluded)."""
    prefixes = tuple(_temp_prefix(name) for name in names)
    try:
        return [out / n for n in os.listdir(out) if n.startswith(prefixes) and ".old." not in n]
    except OSError:
        return []


def write_temp(out: Path, name: str, payload: bytes) -> Path:
    """``payload`` in a new hidden file in ``out``, flushed to disk; its path."""
    fd, temp = tempfile.mkstemp(prefix=_temp_prefix(name), dir=out)
    path = Path(temp)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(path, 0o644)
    except BaseException:
        with contextlib.suppress(OSError):
            path.unlink()
        raise
    return path


def _commit(out: Path, temps: dict[str, Path], progress: dict[str, bool] | None = None) -> None:
    backups: dict[str, Path] = {}
    done: list[str] = []
    with _signals_deferred():
        try:
            for name in temps:
                target = out / name
                if target.exists():
                    backup = out / f"{TEMP_PREFIX}{name}.old.{os.getpid()}.{secrets.token_hex(4)}"
                    os.link(target, backup)
                    backups[name] = backup
            for name, temp in temps.items():
                os.replace(temp, out / name)
                done.append(name)
            if progress is not None:
                progress["committed"] = True
            _fsync_directory(out)  # before a deferred signal is delivered
        except BaseException:
            for name in done:  # put back what was already replaced
                with contextlib.suppress(OSError):
                    if name in backups:
                        os.replace(backups.pop(name), out / name)
                    else:
                        (out / name).unlink()
            raise
        finally:
            for backup in backups.values():
                with contextlib.suppress(OSError):
                    backup.unlink()


def _fsync_directory(out: Path) -> None:
    with contextlib.suppress(OSError):  # not every platform lets a directory be opened (Windows)
        fd = os.open(out, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


TERMINATION_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))
"""Signals whose default action ends the process at once (SIGHUP does not exist on Windows)."""
DEFERRED_SIGNALS = (signal.SIGINT, *TERMINATION_SIGNALS)


class _Terminated(BaseException):
    """A termination signal turned into an exception, so that ``finally`` clauses remove the temporaries."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_terminated(signum: int, frame: object) -> None:
    raise _Terminated(signum)


@contextlib.contextmanager
def _termination_unwinds(out: Path) -> Iterator[dict[str, bool]]:
    """SIGTERM / SIGHUP raise :class:`_Terminated` inside the block (unless they were ignored); once the block has
    unwound, the signal takes its course: the handler installed before runs, or the default action ends the
    process by that signal. Main thread only (elsewhere Python delivers no signals)."""
    progress = {"committed": False}
    if threading.current_thread() is not threading.main_thread():
        yield progress
        return
    previous = {}
    for number in TERMINATION_SIGNALS:
        if signal.getsignal(number) is not signal.SIG_IGN:
            previous[number] = signal.signal(number, _raise_terminated)
    try:
        yield progress
    except _Terminated as caught:
        for number, handler in previous.items():
            signal.signal(number, handler)
        _deliver(caught.signum, previous.get(caught.signum, signal.SIG_DFL))
        if not progress["committed"]:  # the caller's handler returned: say the save did not happen
            raise CircuitkitError(
                f"save: interrupted by signal {signal.Signals(caught.signum).name} before {str(out)!r} was "
                "written; the previous report and scores (if any) are unchanged. Save again."
            ) from None
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _deliver(signum: int, handler: Any) -> None:
    if callable(handler):
        handler(signum, None)
    elif handler in (signal.SIG_DFL, None):
        os.kill(os.getpid(), signum)  # the default action: the process ends by this signal
        raise SystemExit(128 + signum)  # not reached on POSIX


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP until the block is done, then deliver the first one received to the handler
    that was installed before (main thread only: elsewhere Python delivers no signals anyway)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = {number: signal.signal(number, lambda number, frame: received.append(number))
                for number in DEFERRED_SIGNALS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        if received:
            number = received[0]
            handler = previous[number]
            if callable(handler):
                handler(number, None)
            elif handler == signal.SIG_DFL:
                if number == signal.SIGINT:
                    raise KeyboardInterrupt
                raise _Terminated(number)


__all__ = ["REPORT_NAME", "SCORES_NAME", "save", "scores_text", "write_together"]
