"""The verified circuit's answer as a reader sees it, in headless Chromium at 1400 x 900: on the bundled model
(2 x 4, a real scan) and on a 30 x 9 grouped-query synthetic scan, the answer box names the circuit, its
faithfulness and draws the faithfulness curve, above the fold, with no script error."""

from __future__ import annotations

from pathlib import Path

import pytest

import circuitkit as ck
from circuitkit import RepeatedTokens, zoo
from circuitkit.report import CHROMIUM_FLAGS, build_report
from tests.conftest import require_browser
from tests.report_fixtures import sized_scan

pytestmark = [pytest.mark.browser, pytest.mark.slow]

VIEWPORT = {"width": 1400, "height": 900}
READY_TIMEOUT_MS = 60_000
SHOTS = Path("/tmp/report-shots")


@pytest.fixture(scope="module")
def scans():
    return {"2x4": ck.scan(zoo.load(), tokens=RepeatedTokens(batch=8), name=zoo.DEFAULT),
            "30x9": sized_scan("30x9", verified=True)}


@pytest.mark.parametrize("size", ["2x4", "30x9"])
def test_the_answer_names_the_circuit_its_faithfulness_and_the_curve(scans, size, tmp_path):
    executable = require_browser()
    from playwright.sync_api import sync_playwright

    scan = scans[size]
    path = tmp_path / "report.html"
    path.write_text(build_report(scan), encoding="utf-8")
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=executable, args=list(CHROMIUM_FLAGS))
        try:
            page = browser.new_page(viewport=VIEWPORT)
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(path.resolve().as_uri())
            page.wait_for_function("document.documentElement.dataset.ckReady !== undefined",
                                   timeout=READY_TIMEOUT_MS)
            SHOTS.mkdir(exist_ok=True)
            page.screenshot(path=str(SHOTS / f"answer-{size}.png"))
            text = " ".join(page.inner_text("#ck-sec-summary").split())
            verified = scan.verified
            names = [f"{a}.{b}" for a, b in verified.heads]
            assert f"Circuit: {len(names)} of {scan.model.n_layers * scan.model.n_heads} heads" in text
            assert all(name in text for name in names)
            assert f"Faithfulness: {verified.faithfulness:.2f}" in text
            assert "exact effect on the loss, path patching" in text
            curve = page.locator("#ck-sec-summary svg.ck-curve")
            assert curve.is_visible() and curve.locator("circle").count() == len(verified.curve)
            box = curve.bounding_box()
            assert box["y"] + box["height"] <= VIEWPORT["height"]  # the curve above the fold
            assert errors == []
        finally:
            browser.close()
