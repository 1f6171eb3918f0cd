"""The report in a real browser (headless Chromium from the Debian package, driven by Playwright), opened from
file:// with every network request blocked, at four model sizes: 2 x 4, 12 x 12, 30 x 9 (grouped-query) and
48 x 25 heads (GPT-2-XL). Checks: no JavaScript error, no request, the summary above the fold, no horizontal
scroll at 1400 px, size < 10 MB and load + draw < 3 s (CircuitsVis charts included), the head table sorts and
filters, clicking a head (row, heatmap cell, graph node, summary link) shows that head's attention pattern drawn by
CircuitsVis (its pixels read back), the circuit's CircuitsVis AttentionHeads view is drawn, hostile tokens stay
text, and without CircuitsVis the plain canvas takes over and the page says so. Screenshots go to
/tmp/report-shots/ (``cv-<size>.png``: the top of the page after clicking a head).

In CI (``CI`` set) a missing Chromium or Playwright is a failure; on a developer machine without them the tests
skip. Playwright only drives the system Chromium (``playwright install`` is never needed).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from circuitkit.ranking import head_name, top_heads
from circuitkit.report import CHROMIUM_FLAGS, MAX_REPORT_BYTES, build_report, export_pngs, save
from circuitkit.report.page import CIRCUITSVIS_ID, GZIP_MIME
from circuitkit.viz.attention import INERT_JOINER, inert_html_text
from tests.conftest import require_browser
from tests.report_fixtures import EVIL_TOKEN, SIZES, sized_scan

pytestmark = [pytest.mark.browser, pytest.mark.slow]

VIEWPORT = {"width": 1400, "height": 900}
MAX_LOAD_MS = 3_000  # issue 14: load and draw in under 3 s at 48 x 25 heads
READY_TIMEOUT_MS = 60_000
LOAD_ATTEMPTS = 3
# a drawn pattern has many colours; a blank canvas has 1-2 (background, antialiased edge)
MIN_CANVAS_COLOURS = 16
# brightness (0..255) between a cell with attention 0.9 and one near 0: CircuitsVis mixes blue (attention 1,
# brightness 85) with white (0, 255) in a perceptual colour space, so 0.9 reads about 123, 0.05 above 240
DARK_BELOW = 180
SHOTS = Path("/tmp/report-shots")


_require_browser = require_browser


@pytest.fixture
def browser():
    # one browser per test: Playwright's sync API allows one driver per thread (export_pngs starts its own)
    executable = _require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        instance = driver.chromium.launch(executable_path=executable, args=list(CHROMIUM_FLAGS))
        yield instance
        instance.close()


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """size -> (scan, path of its report.html), built once."""
    out = {}
    for size in SIZES:
        scan = sized_scan(size)
        path = tmp_path_factory.mktemp(size) / "report.html"
        path.write_text(build_report(scan), encoding="utf-8")
        out[size] = (scan, path)
    return out


def _open(browser, path: Path) -> dict:
    """Open ``path`` offline at 1400 x 900; what happened: ready state, errors, requests, dialogs, page."""
    page = browser.new_page(viewport=VIEWPORT)
    events: dict = {"errors": [], "blocked": [], "dialogs": [], "page": page}
    page.on("console", lambda message: message.type == "error" and events["errors"].append(message.text))
    page.on("pageerror", lambda error: events["errors"].append(str(error)))

    def dialog(d):
        events["dialogs"].append(d.message)
        d.dismiss()

    page.on("dialog", dialog)

    def route(route):
        if route.request.url == path.resolve().as_uri():
            route.continue_()
        else:
            events["blocked"].append(route.request.url)
            route.abort()

    page.route("**/*", route)
    page.goto(path.resolve().as_uri())
    page.wait_for_function("document.documentElement.dataset.ckReady !== undefined", timeout=READY_TIMEOUT_MS)
    events["ready"] = page.evaluate("document.documentElement.dataset.ckReady")
    return events


_CANVAS_COLOURS = """(selector) => {
    const canvas = document.querySelector(selector);
    if (!canvas || !canvas.width || !canvas.height) return 0;
    const pixels = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
    const colours = new Set();
    for (let i = 0; i < pixels.length; i += 4) colours.add(pixels.slice(i, i + 4).join(','));
    return colours.size;
}"""

# CircuitsVis canvases of a view (selector of its container): the colour count of each
_VIEW_COLOURS = """(selector) => Array.from(document.querySelectorAll(selector + ' canvas'), canvas => {
    if (!canvas.width || !canvas.height) return 0;
    const pixels = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
    const colours = new Set();
    for (let i = 0; i < pixels.length; i += 4) colours.add(pixels.slice(i, i + 4).join(','));
    return colours.size;
})"""

# mean brightness (0 dark .. 255 white) at the centre of cell (query q, key k) of the panel's CircuitsVis pattern.
# CircuitsVis paints the masked upper triangle rgb(200, 200, 200): its bounding box (keys 1..pos-1, queries
# 0..pos-2) gives the matrix's place on the canvas, whatever room the axis labels take.
_PATTERN_CELL = """([q, k, pos]) => {
    const canvas = document.querySelector('#ck-cv-pattern canvas');
    const context = canvas.getContext('2d'), W = canvas.width, H = canvas.height;
    const px = context.getImageData(0, 0, W, H).data;
    let x0 = W, x1 = -1, y0 = H, y1 = -1;
    for (let y = 0; y < H; y++) for (let x = 0; x < W; x++) {
        const o = (y * W + x) * 4;
        if (px[o] === 200 && px[o + 1] === 200 && px[o + 2] === 200) {
            x0 = Math.min(x0, x); x1 = Math.max(x1, x); y0 = Math.min(y0, y); y1 = Math.max(y1, y);
        }
    }
    const cw = (x1 - x0 + 1) / (pos - 1), ch = (y1 - y0 + 1) / (pos - 1), left = x0 - cw;
    const [r, g, b] = context.getImageData(Math.floor(left + (k + .5) * cw), Math.floor(y0 + (q + .5) * ch), 1, 1).data;
    return (r + g + b) / 3;
}"""

_CV_HEAD = "document.getElementById('ck-cv-pattern') && document.getElementById('ck-cv-pattern').dataset.head"


def _cv_head(page) -> str | None:
    """The head whose CircuitsVis pattern the panel shows, once drawn (its canvas present)."""
    page.wait_for_function("document.querySelector('#ck-cv-pattern canvas') !== null", timeout=READY_TIMEOUT_MS)
    return page.evaluate(_CV_HEAD)


def _best_load_ms(page, path: Path) -> float:
    """Milliseconds from navigation start to drawn, the best of up to :data:`LOAD_ATTEMPTS` loads: the machine's
    2 cores are shared with other test runs, and a timing limit is about the page, not the neighbours."""
    best = float(page.evaluate("document.documentElement.dataset.ckDrawMs"))
    for _ in range(LOAD_ATTEMPTS - 1):
        if best < MAX_LOAD_MS:
            break
        page.goto(path.resolve().as_uri())
        page.wait_for_function("document.documentElement.dataset.ckReady !== undefined", timeout=READY_TIMEOUT_MS)
        best = min(best, float(page.evaluate("document.documentElement.dataset.ckDrawMs")))
    return best


def _visible_heads(page) -> list[str]:
    return page.evaluate("Array.from(document.querySelectorAll('#ck-table tbody tr'))"
                         ".filter(r => !r.hidden).map(r => r.dataset.head)")


@pytest.mark.parametrize("size", list(SIZES))
def test_report_at_every_size(browser, reports, size):
    scan, path = reports[size]
    n_bytes = path.stat().st_size
    assert n_bytes < MAX_REPORT_BYTES, f"{n_bytes / 2**20:.2f} MB"
    events = _open(browser, path)
    page = events["page"]
    try:
        assert events["ready"] == "true", page.inner_text("#ck-status")
        assert events["errors"] == []
        assert events["blocked"] == [], "the report tried to load something"
        assert events["dialogs"] == [], "a token string ran as script"
        load_ms = _best_load_ms(page, path)
        if size == "48x25":
            assert load_ms < MAX_LOAD_MS
        print(f"\n{size}: {n_bytes / 2**20:.2f} MB, load + draw {load_ms:.0f} ms")
        # the answer above the fold, no horizontal scroll at 1400 px
        assert page.evaluate("document.getElementById('ck-sec-summary').getBoundingClientRect().bottom") <= 900
        assert "Induction heads" in page.inner_text("#ck-sec-summary")
        assert page.evaluate("document.documentElement.scrollWidth") <= VIEWPORT["width"]
        # one table row per head, one small multiple per column, the selected head's pattern drawn
        assert len(_visible_heads(page)) == scan.model.n_layers * scan.model.n_heads
        n_columns = len(scan.head_scores) + 2
        assert page.locator("#ck-heatmaps canvas[data-col]").count() == n_columns
        assert page.evaluate(_CANVAS_COLOURS, "#ck-comp-heads") >= MIN_CANVAS_COLOURS
        # CircuitsVis loaded once and drew the panel's pattern and the circuit's AttentionHeads (one thumbnail per
        # head of the circuit view, plus the enlarged one), none of them blank
        assert page.evaluate("document.documentElement.dataset.ckCircuitsvis") == "drawn"
        assert page.locator("canvas.ck-pattern").count() == 0, "the fallback canvas drew although CircuitsVis loaded"
        assert min(page.evaluate(_VIEW_COLOURS, "#ck-cv-pattern"), default=0) >= MIN_CANVAS_COLOURS
        circuit = page.evaluate(_VIEW_COLOURS, "#ck-cv-circuit")
        n_view = len(scan.induction_heads) + len(scan.previous_token_heads)
        assert len(circuit) == min(n_view, 8) + 1 and min(circuit) >= MIN_CANVAS_COLOURS, circuit
        # the hostile token is text, not markup
        assert page.locator("img").count() == 0
        assert page.locator(".ck-tokens code").last.text_content() == EVIL_TOKEN
        # a click on the last induction head: its pattern in the panel; the page as a reader sees it
        head = head_name(scan.induction_heads[-1])
        page.click(f'#ck-table tr[data-head="{head}"]')
        assert _cv_head(page) == head
        assert min(page.evaluate(_VIEW_COLOURS, "#ck-cv-pattern")) >= MIN_CANVAS_COLOURS
        assert page.evaluate("document.documentElement.scrollWidth") <= VIEWPORT["width"]
        assert events["errors"] == [] and events["dialogs"] == []
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.evaluate("window.scrollTo(0, 0)")
        page.screenshot(path=str(SHOTS / f"cv-{size}.png"))
        page.screenshot(path=str(SHOTS / f"cv-{size}-full.png"), full_page=True)
    finally:
        page.close()


def test_head_table_sorts_and_filters(browser, reports):
    scan, path = reports["12x12"]
    events = _open(browser, path)
    page = events["page"]
    try:
        # opens sorted by induction score, best first
        best = [head_name(h) for h, _ in top_heads(scan.head_scores["induction"], 3)]
        assert _visible_heads(page)[:3] == best
        page.click('#ck-table th[data-col="previous_token"]')
        prev = scan.head_scores["previous_token"]
        assert _visible_heads(page)[:3] == [head_name(h) for h, _ in top_heads(prev, 3)]
        assert page.get_attribute('#ck-table th[data-col="previous_token"]', "aria-sort") == "descending"
        page.click('#ck-table th[data-col="previous_token"]')
        assert _visible_heads(page)[:3] == [head_name(h) for h, _ in top_heads(prev, 3, largest=False)]
        # ablation: heads never ablated stay last in both directions
        page.click('#ck-table th[data-col="ablation"]')
        n_exact = int(scan.ablation.exact.sum())
        blank = _visible_heads(page)[n_exact:]
        assert all(not scan.ablation.exact[tuple(map(int, h.split(".")))] for h in blank)
        # filters: a layer, a head, a threshold on a column, top heads
        page.fill("#ck-filter", "3")
        assert sorted(_visible_heads(page)) == sorted(f"3.{h}" for h in range(12))
        assert page.inner_text("#ck-count").startswith("12 of 144 heads")
        page.fill("#ck-filter", "3.4 7.1")
        assert sorted(_visible_heads(page)) == ["3.4", "7.1"]
        page.fill("#ck-filter", "induct>0.5")
        assert sorted(_visible_heads(page)) == sorted(head_name(h) for h in scan.induction_heads)
        page.fill("#ck-filter", "nonsense>1")
        assert "not understood: nonsense>1" in page.inner_text("#ck-count")
        page.fill("#ck-filter", "")
        assert len(_visible_heads(page)) == 144
        assert events["errors"] == []
    finally:
        page.close()


def test_a_click_on_a_head_shows_its_pattern(browser, reports):
    scan, path = reports["12x12"]
    pos = len(scan.tokens)
    events = _open(browser, path)
    page = events["page"]
    try:
        # a table row: the previous-token head 0.1 attends to the previous position (dark), not to itself (white)
        page.click('#ck-table tr[data-head="0.1"]')
        assert _cv_head(page) == "0.1"
        assert page.get_attribute("#ck-detail", "data-head") == "0.1"
        assert page.evaluate(_PATTERN_CELL, [10, 9, pos]) < DARK_BELOW < page.evaluate(_PATTERN_CELL, [10, 10, pos])
        # a heatmap cell: head (11, 0) in the induction grid
        grid = page.locator('#ck-heatmaps canvas[data-col="induction"]')
        box = grid.bounding_box()
        grid.click(position={"x": 0.5 * box["width"] / 12, "y": 11.5 * box["height"] / 12})
        assert _cv_head(page) == "11.0"
        # the induction head attends to the token after the previous occurrence: query 30 (block of 20 after BOS)
        assert page.evaluate(_PATTERN_CELL, [30, 11, pos]) < DARK_BELOW < page.evaluate(_PATTERN_CELL, [30, 29, pos])
        # a node of the composition graph, a head named in the summary
        page.click('#ck-sec-composition .ck-node[data-head="1.3"]')
        assert _cv_head(page) == "1.3"
        page.click('#ck-sec-summary .ck-head[data-head="2.2"]')
        assert _cv_head(page) == "2.2"
        # a click inside the pattern itself selects nothing new
        page.click("#ck-cv-pattern canvas")
        assert _cv_head(page) == "2.2" and page.locator("#ck-cv-pattern").count() == 1
        assert "induction head" in page.inner_text("#ck-detail h3")
        # the panel lists the strongest incoming K edges: the planted previous-token heads
        assert "0.1" in page.inner_text("#ck-detail .ck-edges") and "1.3" in page.inner_text("#ck-detail .ck-edges")
        # zoom: a click on a layer-pair cell of the aggregate view moves the head x head window there
        layers = page.locator("#ck-comp-layers")
        box = layers.bounding_box()
        layers.click(position={"x": 9.5 * box["width"] / 12, "y": 5.5 * box["height"] / 12})
        # a window of 72 // 12 = 6 layers around (5, 9), kept inside the model
        assert "source layers 3-8, destination layers 6-11" in page.inner_text("#ck-comp-where")
        assert events["errors"] == []
    finally:
        page.close()


def test_plain_base64_report_draws_too(browser, reports, tmp_path):
    scan, _ = reports["2x4"]
    path = tmp_path / "plain.html"
    path.write_text(build_report(scan, compress=False), encoding="utf-8")
    events = _open(browser, path)
    try:
        assert events["ready"] == "true" and events["errors"] == [] and events["blocked"] == []
        assert events["page"].evaluate("document.documentElement.dataset.ckCircuitsvis") == "drawn"
        assert min(events["page"].evaluate(_VIEW_COLOURS, "#ck-cv-pattern")) >= MIN_CANVAS_COLOURS
    finally:
        events["page"].close()


def test_hostile_tokens_are_text_in_the_circuitsvis_views(browser, reports):
    _, path = reports["12x12"]
    events = _open(browser, path)
    page = events["page"]
    try:
        # what CircuitsVis is handed: the inert (and, past 12 characters, shortened) token, as the Python views make it
        handed = page.evaluate("window.circuitkitReport.cvTokens()")
        assert handed[-1] == inert_html_text(EVIL_TOKEN[:11]) + "\u2026"
        assert page.locator("#ck-cv-circuit img, #ck-cv-pattern img, img").count() == 0
        # CircuitsVis elements that write tokens with innerHTML (AttentionPatterns): the page's inert text shows the
        # token as itself (zero-width joiners aside), the raw token would become an <img> (the control: the check can
        # fail)
        for token in (EVIL_TOKEN, INNER_HTML_TOKEN, "<bos>", "a&amp;b"):
            shown = page.evaluate(_RENDER_TOKEN, [token, True])
            assert shown["images"] == 0 and token in shown["text"].replace("\xa0", " ").replace(INERT_JOINER, "")
        assert events["errors"] == [] and events["dialogs"] == []
        assert page.evaluate(_RENDER_TOKEN, [INNER_HTML_TOKEN, False])["images"] == 1
    finally:
        page.close()


# CircuitsVis turns a token's first space into &nbsp; before innerHTML ("<img&nbsp;src" is no <img>): this one's
# first space comes before the tag, so written raw it does make an <img>
INNER_HTML_TOKEN = "x <img src=x onerror=alert(2)>"

# renders CircuitsVis.AttentionPatterns (tokens written with innerHTML) of one token into a new element: with
# the page's escaping or raw; how many <img> it made and the text of its token
_RENDER_TOKEN = """async ([token, escaped]) => {
    const box = document.createElement('div');
    box.id = 'ck-test-' + document.querySelectorAll('[id^="ck-test-"]').length;
    document.body.appendChild(box);
    const shown = escaped ? window.circuitkitReport.inertText(token) : token;
    const props = {tokens: [shown, 'b'], attention: [[[1, 0], [0.5, 0.5]]]};
    CircuitsVis.render(box.id, CircuitsVis.AttentionPatterns, props);
    const drawn = () => box.querySelector('button');
    for (let i = 0; i < 100 && !drawn(); i++) await new Promise(r => setTimeout(r, 20));
    return {images: box.querySelectorAll('img').length, text: box.textContent};
}"""


def test_without_circuitsvis_the_plain_canvas_draws_and_the_page_says_so(browser, reports, tmp_path):
    """Corrupt the packed CircuitsVis bundle: the patterns fall back to the plain canvas, the status tells."""
    scan, path = reports["12x12"]
    html_text = path.read_text(encoding="utf-8")
    broken = re.sub(rf'(<script type="{GZIP_MIME}" id="{CIRCUITSVIS_ID}">)([^<]{{40}})', r"\1AAAA\2", html_text,
                    count=1)
    assert broken != html_text
    path = tmp_path / "no-circuitsvis.html"
    path.write_text(broken, encoding="utf-8")
    events = _open(browser, path)
    page = events["page"]
    try:
        assert events["ready"] == "true" and events["errors"] == [] and events["blocked"] == []
        assert page.evaluate("document.documentElement.dataset.ckCircuitsvis") == "failed"
        assert "CircuitsVis did not load" in page.inner_text("#ck-status")
        assert page.locator("#ck-cv-pattern").count() == 0
        page.click('#ck-table tr[data-head="0.1"]')
        assert page.get_attribute("#ck-pattern", "data-head") == "0.1"
        assert page.evaluate(_CANVAS_COLOURS, "#ck-pattern") >= MIN_CANVAS_COLOURS
        n_view = len(scan.induction_heads) + len(scan.previous_token_heads)
        assert page.locator("#ck-cv-circuit canvas.ck-pattern").count() == n_view
    finally:
        page.close()


def test_a_broken_blob_is_reported_as_an_error(browser, reports, tmp_path):
    """The checks above can fail: corrupt the packed patterns and the page says so."""
    html = reports["2x4"][1].read_text(encoding="utf-8")
    broken = re.sub(rf'(<script type="{GZIP_MIME}" id="ck-blob-patterns">)([^<]{{40}})', r"\1AAAA\2", html, count=1)
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


def test_png_export_follows_the_views(reports, tmp_path):
    _require_browser()
    scan, _ = reports["12x12"]
    saved = save(scan, tmp_path, png=True)
    names = {path.stem for path in saved.pngs}
    assert {"summary", "heads", "scores", "composition-Q", "composition-K", "composition-V", "circuit", "loss",
            "head-2.2"} <= names
    for path in saved.pngs:
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2_000, path.name
    # direct call, another scale
    assert [p.name for p in export_pngs(saved.report, tmp_path / "again", scale=1.0)] == [p.name for p in saved.pngs]


def test_a_task_scans_png_export_follows_its_views(tmp_path):
    """``TaskScan.save(png=True)`` (``--png`` with ``--task``): each exported section of the task's page and the
    head panel of the head selected at load (the one that ranks first), as the induction scan's export."""
    _require_browser()
    import circuitkit as ck
    from circuitkit import zoo
    from tests.test_tasks import copy_next_task

    scan = ck.scan(zoo.load(), task=copy_next_task(n=16, d_vocab=60, seed=0))
    saved = scan.save(tmp_path, png=True)
    names = [path.stem for path in saved.pngs]
    assert {"summary", "patterns", "heads", "scores", "faithfulness", "edges"} <= set(names)
    assert "task" not in names and "details" not in names  # the sections of words are not exported
    assert names[-1] == f"head-{head_name(scan.top(k=1)[0][0])}"
    for path in saved.pngs:
        data = path.read_bytes()
        assert path.parent == tmp_path / "png" and data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2_000, path.name
