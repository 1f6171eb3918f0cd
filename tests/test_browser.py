"""The report in a real browser: headless Chromium (Debian package), every network request blocked, opened
from file://. No JavaScript errors, every plotly figure drawn, the CircuitsVis canvases not blank.

In CI (``CI`` set) a missing Chromium or Playwright is a failure; on a developer machine without Chromium the
tests skip. Playwright only drives the system Chromium (``playwright install`` is never needed).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from circuitkit.report import CHROMIUM_FLAGS, build_report, export_pngs, find_chromium, write_report
from tests.test_cli import hf_dir  # noqa: F401  (fixture: a tiny local Hugging Face GPT-2)
from tests.test_report import GZIP_MIME, synthetic_results

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# a drawn heatmap has many colours; a blank or single-colour canvas has 1-2 (background, antialiased edge)
MIN_CANVAS_COLOURS = 16
READY_TIMEOUT_MS = 60_000


def _require_browser() -> str:
    executable = find_chromium()
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        executable = None
    if executable is None:
        reason = "headless Chromium + playwright are needed (apt-get install chromium; pip install playwright)"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the browser test: {reason}")
        pytest.skip(reason)
    return executable


@pytest.fixture
def browser():
    # one browser per test: Playwright's sync API allows one driver per thread (export_pngs starts its own)
    executable = _require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        instance = driver.chromium.launch(executable_path=executable, args=list(CHROMIUM_FLAGS))
        yield instance
        instance.close()


def _open(browser, path: Path) -> dict:
    """Open ``path`` offline; return what happened: ready state, errors, blocked requests, dialogs, page."""
    page = browser.new_page()
    events: dict = {"errors": [], "blocked": [], "dialogs": [], "page": page}
    page.on("console", lambda message: message.type == "error" and events["errors"].append(message.text))
    page.on("pageerror", lambda error: events["errors"].append(str(error)))

    def dialog(d):
        events["dialogs"].append(d.message)
        d.dismiss()

    page.on("dialog", dialog)

    def route(route):
        if route.request.url.startswith("file:"):
            route.continue_()
        else:
            events["blocked"].append(route.request.url)
            route.abort()

    page.route("**/*", route)
    page.goto(path.resolve().as_uri())
    page.wait_for_function("document.documentElement.dataset.ckReady !== undefined", timeout=READY_TIMEOUT_MS)
    events["ready"] = page.evaluate("document.documentElement.dataset.ckReady")
    return events


_CANVAS_COLOURS = """() => Array.from(document.querySelectorAll('.ck-circuitsvis canvas')).map(canvas => {
    const context = canvas.getContext('2d');
    if (!context || canvas.width === 0 || canvas.height === 0) return 0;
    const pixels = context.getImageData(0, 0, canvas.width, canvas.height).data;
    const colours = new Set();
    for (let i = 0; i < pixels.length; i += 4) colours.add(pixels.slice(i, i + 4).join(','));
    return colours.size;
})"""


@pytest.mark.parametrize("compress", [True, False], ids=["gzip-inlined", "plain-inlined"])
def test_report_opens_offline_without_errors_and_draws(browser, tmp_path, compress):
    results = synthetic_results()
    path = tmp_path / "report.html"
    path.write_text(build_report(results, compress=compress), encoding="utf-8")
    events = _open(browser, path)
    page = events["page"]
    try:
        assert events["ready"] == "true", page.inner_text("#ck-status")
        assert events["errors"] == []
        assert events["blocked"] == [], "the report tried to reach the network"
        assert events["dialogs"] == [], "a token string ran as script"
        # every plotly view has its SVG
        drawn = page.evaluate(
            "Array.from(document.querySelectorAll('.ck-view[data-kind=plotly]'))"
            ".map(e => !!e.querySelector('.main-svg'))"
        )
        assert drawn and all(drawn)
        # CircuitsVis: one thumbnail per head plus the enlarged pattern, each with real content
        page.wait_for_function(
            "document.querySelectorAll('.ck-circuitsvis canvas').length > 0", timeout=READY_TIMEOUT_MS
        )
        colours = page.evaluate(_CANVAS_COLOURS)
        assert len(colours) == len(results.patterns) + 1
        assert min(colours) >= MIN_CANVAS_COLOURS, colours
        # the malicious token is shown as text, not markup
        assert page.locator("details code").nth(len(results.tokens) - 1).text_content() == results.tokens[-1]
        assert page.locator("img").count() == 0
    finally:
        page.close()


def test_a_broken_library_is_reported_as_an_error(browser, tmp_path):
    """The checks above can fail: corrupt the packed plotly.js and the page reports the failure."""
    html = build_report(synthetic_results())
    broken = re.sub(
        rf'(<script type="{GZIP_MIME}" id="ck-lib-plotly">)([^<]{{100}})', r"\1AAAA\2", html, count=1
    )
    assert broken != html
    path = tmp_path / "broken.html"
    path.write_text(broken, encoding="utf-8")
    events = _open(browser, path)
    try:
        assert events["ready"] == "error"
        assert events["errors"], "a failure must reach the console"
        assert "Could not draw" in events["page"].inner_text("#ck-status")
    finally:
        events["page"].close()


def test_png_export_of_every_figure(tmp_path):
    _require_browser()
    report = write_report(synthetic_results(), tmp_path / "report.html")
    paths = export_pngs(report, tmp_path / "png", scale=1.0)
    labels = {path.stem for path in paths}
    assert {"head-score-induction", "composition-K", "composition-graph", "spectra-OV"} <= labels
    for path in paths:
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2_000, path.name


def test_scan_report_of_a_real_model_draws(hf_dir, tmp_path, request):  # noqa: F811
    """End to end: `circuitkit scan --png` on a local Hugging Face model, then the browser checks on its report."""
    from circuitkit.cli import main

    _require_browser()
    args = ["scan", str(hf_dir), "--out", str(tmp_path), "--batch", "2", "--seq-len", "5", "--png"]
    assert main(args) == 0
    pngs = sorted(path.name for path in (tmp_path / "png").glob("*.png"))
    assert "head-score-induction.png" in pngs and "composition-graph.png" in pngs
    # the browser fixture only now: export_pngs above ran its own Playwright driver (one per thread)
    browser = request.getfixturevalue("browser")
    events = _open(browser, tmp_path / "report.html")
    page = events["page"]
    try:
        assert events["ready"] == "true"
        assert events["errors"] == [] and events["blocked"] == []
        page.wait_for_function(
            "document.querySelectorAll('.ck-circuitsvis canvas').length > 0", timeout=READY_TIMEOUT_MS
        )
        assert min(page.evaluate(_CANVAS_COLOURS)) >= MIN_CANVAS_COLOURS
    finally:
        page.close()
