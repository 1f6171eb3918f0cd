"""The saved report reads without JavaScript (a preview, a mail, a reader that runs no script): the answer and the
table of every head are plain HTML, checked against the saved scores.json, and the page does not claim to be
drawing figures it cannot draw."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest

import circuitkit as ck
from circuitkit.report.summary import answer_lines


class _PlainPage(HTMLParser):
    """The page as a reader without scripts sees it: its text outside ``<script>``/``<style>``, and the rows of the
    head table (``#ck-table``) as lists of cell texts."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.text: list[str] = []
        self.rows: list[list[str]] = []
        self._hidden = 0
        self._in_table = False
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style"):
            self._hidden += 1
        elif tag == "table" and dict(attrs).get("id") == "ck-table":
            self._in_table = True
        elif self._in_table and tag == "tr":
            self.rows.append([])
        elif self._in_table and tag in ("td", "th"):
            self._cell = []
        if tag in ("p", "div", "li", "tr", "h1", "h2", "section", "br"):
            self.text.append("\n")

    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self._hidden -= 1
        elif tag == "table" and self._in_table:
            self._in_table = False
        elif self._in_table and tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data):
        if self._hidden:
            return
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)


def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    scan = ck.scan()  # the bundled known-answer model
    out = tmp_path_factory.mktemp("report")
    scan.save(out)
    page = _PlainPage()
    page.feed((out / "report.html").read_text(encoding="utf-8"))
    return scan, page, json.loads((out / "scores.json").read_text(encoding="utf-8"))


def test_the_answer_reads_without_scripts(saved):
    scan, page, scores = saved
    text = _squash("".join(page.text))
    for line in answer_lines(scan):  # the answer the terminal prints, sentence for sentence
        assert _squash(line) in text, line
    circuit = scores["circuit"]["heads"]
    assert circuit, "the bundled model has a known circuit"
    sentence = re.search(r"Circuit: [^\n]*", "".join(page.text)).group(0)
    assert all(head in sentence for head in circuit)
    assert f"{scores['circuit']['faithfulness']:.2f}" in text


def test_the_page_does_not_claim_to_draw_without_scripts(saved):
    _, page, _ = saved
    text = _squash("".join(page.text))
    assert "Drawing the figures" not in text
    assert "Without JavaScript the answer and the table of all heads read as plain text" in text


def test_every_head_row_reads_without_scripts_and_matches_scores_json(saved):
    scan, page, scores = saved
    header, *rows = page.rows
    names = list(scores["head_scores"])
    assert header[0] == "head" and len(header) == 1 + len(names) + 2  # the scores, attribution, exact ablation
    n_layers, n_heads = scan.model.n_layers, scan.model.n_heads
    assert [row[0] for row in rows] == [f"{layer}.{head}" for layer in range(n_layers) for head in range(n_heads)]

    def cell(value):
        return "" if value is None else f"{value:.3f}"

    for row in rows:
        layer, head = map(int, row[0].split("."))
        expected = [cell(scores["head_scores"][name][layer][head]) for name in names]
        expected.append(cell(scores["attribution"]["effect"][layer][head]))
        expected.append(cell(scores["ablation"]["effect"][layer][head]))  # blank where the head was not ablated
        assert row[1:] == expected, row[0]
