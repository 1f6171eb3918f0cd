"""The intervals in a real scan's report, in headless Chromium: the head table's cells carry them as tooltips, a
selected head's chips show them, the faithfulness curve draws its whiskers and the random sets' mark."""

from __future__ import annotations

import pytest

import circuitkit as ck
from circuitkit import RepeatedTokens, zoo
from circuitkit.report import CHROMIUM_FLAGS, build_report
from tests.conftest import require_browser
from tests.test_browser import _open


@pytest.fixture
def browser():
    executable = require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        instance = driver.chromium.launch(executable_path=executable, args=list(CHROMIUM_FLAGS))
        yield instance
        instance.close()


def test_intervals_show_in_the_page(browser, tmp_path):
    scan = ck.scan(zoo.load(), tokens=RepeatedTokens(batch=8), random_sets=4)
    path = tmp_path / "report.html"
    path.write_text(build_report(scan), encoding="utf-8")
    events = _open(browser, path)
    page = events["page"]
    try:
        cell = page.locator('#ck-table tr[data-head="0.1"] td').first
        assert "interval" in (cell.get_attribute("title") or "")
        page.click('#ck-table tr[data-head="1.3"]')
        chips = page.inner_text("#ck-detail .ck-chips")
        low, high = (float(t) for t in scan.intervals["ablation"][0][1, 3:4].tolist() +
                     scan.intervals["ablation"][1][1, 3:4].tolist())
        assert f"[{low:.3f}, {high:.3f}]" in chips
        whiskers = page.locator("#ck-sec-summary .ck-curve .ck-whisker").count()
        assert whiskers == sum(1 for p in scan.verified.curve if 0 < p.size < 8)
        assert page.locator("#ck-sec-summary .ck-curve .ck-baseline").count() == 1
        assert events["errors"] == []
    finally:
        page.close()
