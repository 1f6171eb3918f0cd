"""Paths given for the output (``--out``, ``save``) and the model: over-long names, unwritable parents, dangling
symlinks, directories or special files where a file goes. Each is one true line, never ``OSError`` or a line
that names the wrong cause ("File exists" for a dangling link, "Operation not permitted" for a directory)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from circuitkit import CircuitkitError
from circuitkit.cli import main
from circuitkit.report.saving import prepare_directory


def _dangling(tmp: Path) -> Path:
    os.symlink(tmp / "nowhere", tmp / "out")
    return tmp / "out"


def _dangling_parent(tmp: Path) -> Path:
    os.symlink(tmp / "nowhere", tmp / "link")
    return tmp / "link" / "out"


def _report_is_a_directory(tmp: Path) -> Path:
    (tmp / "out" / "report.html").mkdir(parents=True)
    return tmp / "out"


def _scores_is_a_fifo(tmp: Path) -> Path:
    (tmp / "out").mkdir()
    os.mkfifo(tmp / "out" / "scores.json")
    return tmp / "out"


def _scores_is_a_socket(tmp: Path) -> Path:
    (tmp / "out").mkdir()
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp / "out" / "scores.json"))
    server.close()
    return tmp / "out"


def _under_a_file(tmp: Path) -> Path:
    (tmp / "file").write_text("x")
    return tmp / "file" / "out"


CASES = {
    # case: (path maker, words the one line must contain)
    "name-over-NAME_MAX": (lambda t: t / ("x" * 300), ("300 bytes", "shorter name")),
    "path-over-PATH_MAX": (lambda t: t.joinpath(*["d" * 200] * 25), ("bytes", "shorter path")),
    "dangling-symlink": (_dangling, ("symlink to", "does not exist")),
    "dangling-symlink-parent": (_dangling_parent, ("symlink to", "does not exist")),
    "report.html-is-a-directory": (_report_is_a_directory, ("report.html", "is a directory")),
    "scores.json-is-a-fifo": (_scores_is_a_fifo, ("scores.json", "is a FIFO")),
    "scores.json-is-a-socket": (_scores_is_a_socket, ("scores.json", "is a socket")),
    "under-a-file": (_under_a_file, ("cannot create 'out'", "which is a file")),
    "read-only-file-system": (lambda t: Path("/sys/circuitkit-out"), ("cannot create 'circuitkit-out' in '/sys'",)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_out_path_is_one_true_line(tmp_path, case):
    make, words = CASES[case]
    with pytest.raises(CircuitkitError) as info:
        prepare_directory(make(tmp_path), where="--out", probe=True)
    message = str(info.value)
    assert "\n" not in message and message.startswith("--out") and "Errno" not in message
    for word in words:
        assert word in message, message


def test_unwritable_parent_names_the_parent(tmp_path, monkeypatch):
    """(As root every directory is writable, so the refusal is simulated at mkdir.)"""
    def refuse(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "mkdir", refuse)
    with pytest.raises(CircuitkitError, match=f"cannot create 'out' in '{tmp_path}': Permission denied"):
        prepare_directory(tmp_path / "out", where="--out")


@pytest.mark.parametrize("case", ["name-over-NAME_MAX", "dangling-symlink", "report.html-is-a-directory"])
def test_cli_says_one_line_and_exits_2(tmp_path, capsys, case):
    make, words = CASES[case]
    code = main(["scan", "--out", str(make(tmp_path))])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and all(word in err for word in words)


def test_cli_over_long_model_name_is_one_line(tmp_path, capsys):
    code = main(["scan", "m" * 300, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "300 bytes" in err and "Errno" not in err


def test_dangling_report_link_is_replaced_not_refused(tmp_path):
    """A dangling report.html symlink is replaced by the rename (nothing is written through it)."""
    (tmp_path / "out").mkdir()
    os.symlink(tmp_path / "gone", tmp_path / "out" / "report.html")
    assert prepare_directory(tmp_path / "out", probe=True) == tmp_path / "out"


@pytest.mark.parametrize("name, content", [("report.html", "MY THESIS\n"), ("scores.json", '{"mine": 1}\n'),
                                           ("scores.json", "")])
def test_a_report_or_scores_file_circuitkit_did_not_write_is_never_replaced(tmp_path, capsys, name, content):
    """``--out .`` in a folder of one's own: a ``report.html`` or ``scores.json`` there that circuitkit did not
    write is refused in one line and left as it was; a folder a scan (or a task scan) was saved in is written
    again, either kind over the other."""
    import circuitkit as ck

    out = tmp_path / "mine"
    out.mkdir()
    (out / name).write_text(content, encoding="utf-8")
    code = main(["scan", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "not written by circuitkit" in err and name in err
    assert (out / name).read_text(encoding="utf-8") == content
    with pytest.raises(CircuitkitError, match="not written by circuitkit"):
        prepare_directory(out, kind="scan")
    (out / name).unlink()
    model = ck.zoo.load()
    ck.scan(model, progress=False).save(out)
    task = ck.scan(model, task=ck.tasks.repeated_tokens(model), edges=False, progress=False)
    task.save(out)  # a task scan over a scan
    assert ck.Scan.load(out).to_json() == task.to_json()
    ck.scan(model, progress=False).save(out)  # and a scan over a task scan
    assert "circuit" in ck.Scan.load(out).to_json()
