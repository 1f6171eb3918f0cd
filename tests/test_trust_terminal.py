"""Every string the terminal prints from data is printed as written: rich markup (``[bold]``), emoji codes
(``:v:``, which rich prints as an emoji) and control characters (``ESC [ 2 J`` clears a screen) in a model, role,
score or edge name reach neither rich nor the terminal; the report's HTML and SVG escape the same names."""

from __future__ import annotations

import dataclasses
import io

import pytest

from circuitkit import cli
from circuitkit._terminal import labelled, plain, visible
from circuitkit.detect.registry import ScoreDefinition
from circuitkit.report.figures import answer_diagram
from circuitkit.report.summary import answer_html, find_answer
from tests.report_fixtures import synthetic_scan

MARKUP = "[bold]loud[/bold]"
EMOJI = "m0->23.g1:v:"
SCRIPT = "<script>alert(7)</script>"
CLEAR = "\x1b[2J"
HOSTILE = f"{MARKUP} {EMOJI} {SCRIPT} {CLEAR}"


def _hostile_scan():
    """A scan whose model name, circuit role and a score's short name hold markup, an emoji code, a script tag and
    a control sequence."""
    scan = synthetic_scan(3, 4, verified=True)
    role = f"role {EMOJI} {MARKUP}"
    verified = dataclasses.replace(scan.verified, roles={role: tuple(scan.verified.heads)})
    definitions = scan.head_scores.definitions  # this synthetic scan's own dict
    definitions["induction"] = dataclasses.replace(definitions["induction"], short=f"{EMOJI}[i]")
    model = dataclasses.replace(scan.model, name=f"model {HOSTILE}")
    return dataclasses.replace(scan, model=model, verified=verified)


def _printed(renderables, *, terminal=True) -> str:
    """What the command line's output prints for ``renderables`` (on a terminal: with colours)."""
    from rich.console import Console

    output = cli._Output.__new__(cli._Output)
    output.terminal = terminal
    buffer = io.StringIO()
    output.console = Console(file=buffer, force_terminal=terminal, width=300, highlight=False,
                             color_system="truecolor" if terminal else None)
    for item in renderables:
        if isinstance(item, tuple):
            output.text(*item)
        else:
            output.print(item)
    return buffer.getvalue()


def _check_as_written(text: str) -> None:
    assert MARKUP in text and EMOJI in text and SCRIPT in text  # printed as written
    assert "\u270c" not in text  # no emoji
    assert CLEAR not in text and "\\x1b[2J" in text  # the control sequence shown, not sent


def test_the_helper_prints_data_as_written():
    from rich.console import Console

    console = Console(file=io.StringIO(), force_terminal=True, width=300)
    for renderable in (plain(HOSTILE), labelled("label", HOSTILE)):
        with console.capture() as captured:
            console.print(renderable)
        _check_as_written(captured.get())
    assert visible("a\nb\u2028c") == "a\\nb\\u2028c"


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "pipe"])
def test_answer_and_table_print_names_as_written(monkeypatch, terminal):
    scan = _hostile_scan()
    from circuitkit.report.summary import answer_lines

    lines = [tuple(line.partition(": ")[::2]) for line in answer_lines(scan)]
    if not terminal:  # the pipe branch writes to stdout itself
        buffer = io.StringIO()
        monkeypatch.setattr(cli.sys, "stdout", buffer)
        _printed([cli.ranked_table(scan), *lines], terminal=False)
        text = buffer.getvalue()
    else:
        text = _printed([cli.ranked_table(scan), *lines])
    _check_as_written(text.replace("\n", " "))
    assert "role m0->23.g1:v: [bold]loud[/bold]" in text


def test_print_answer_on_any_console_prints_names_as_written():
    from rich.console import Console

    console = Console(file=io.StringIO(), force_terminal=True, width=300)
    scan = _hostile_scan()
    with console.capture() as captured:
        cli.print_answer(console, scan)
    text = captured.get()
    assert "role m0->23.g1:v: [bold]loud[/bold]" in text and "\u270c" not in text


def test_the_progress_line_shows_control_characters(capsys):
    cli._say(f"scan: loading {HOSTILE}")
    err = capsys.readouterr().err
    assert CLEAR not in err and "\\x1b[2J" in err and MARKUP in err


def test_html_and_svg_escape_the_same_names():
    scan = _hostile_scan()
    answer = find_answer(scan)
    for text in (" ".join(answer_html(answer)), answer_diagram(answer)):
        assert "<script>alert" not in text and "role m0-&gt;23.g1:v: [bold]loud[/bold]" in text
    assert isinstance(scan.head_scores.definitions["induction"], ScoreDefinition)
    assert f"{EMOJI}[i]" in _printed([cli.ranked_table(scan)])  # the score's short name heads a column


def test_the_task_progress_line_shows_the_task_name_as_written(capsys):
    """A task's name (a file's stem, or any string) is printed in each progress line of a task scan, escaped."""
    from circuitkit.tasks.stages import task_progress

    bar = task_progress(f"task {HOSTILE}", "lines", [("nodes", 3)])
    bar.start("nodes")
    bar.advance(3)
    bar.end()
    bar.close()
    err = capsys.readouterr().err
    assert f"task {MARKUP} {EMOJI} {SCRIPT}" in err and CLEAR not in err and "\\x1b[2J" in err
    assert err.count("scan task") == 3  # the plan, the stage, the end
