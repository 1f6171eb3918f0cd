"""The notebook views in a real browser: a hostile token or head name renders as text and runs no script.

Headless Chromium (Debian package) driven by Playwright, every non-file request blocked, the view's offline
``local_src`` (what Jupyter shows) opened from file://. The hostile strings would set ``window.__ckPwned`` if
they ever reached the page as markup. In CI (``CI`` set) a missing Chromium or Playwright is a failure; on a
developer machine without them the test skips (the pattern of ``tests/test_browser.py``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from circuitkit.report import CHROMIUM_FLAGS
from circuitkit.viz import attention_heads, attention_patterns
from circuitkit.viz.attention import INERT_JOINER
from tests.conftest import require_browser

pytestmark = [pytest.mark.browser, pytest.mark.slow]

RENDER_TIMEOUT_MS = 60_000
HOSTILE_TOKEN = '</script><img src=x onerror="window.__ckPwned = 1">'
HOSTILE_SPAN = "<img/src=y/onerror=window.__ckPwned=2>&amp;\u2028"  # no spaces: CircuitsVis turns them into &nbsp;
HOSTILE_NAME = '</script><svg onload="window.__ckPwned = 3">'


_require_browser = require_browser


def _patterns(n_heads: int, pos: int) -> np.ndarray:
    causal = np.tril(np.ones((pos, pos)))
    return np.broadcast_to(causal / causal.sum(-1, keepdims=True), (n_heads, pos, pos)).copy()


VIEWS = {
    "attention_patterns": lambda: attention_patterns(_patterns(2, 3), ["ok", HOSTILE_TOKEN, HOSTILE_SPAN]),
    "attention_heads": lambda: attention_heads(
        _patterns(2, 3), ["ok", HOSTILE_TOKEN, HOSTILE_SPAN], head_names=[HOSTILE_NAME, "plain"]
    ),
}


@pytest.mark.parametrize("view", list(VIEWS))
def test_hostile_strings_render_as_text_and_run_no_script(view, tmp_path: Path):
    executable = _require_browser()
    from playwright.sync_api import sync_playwright

    page_file = tmp_path / "view.html"
    page_file.write_text(f"<!doctype html><html><body>{VIEWS[view]().local_src}</body></html>", encoding="utf-8")
    blocked: list[str] = []
    errors: list[str] = []
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=executable, args=list(CHROMIUM_FLAGS))
        try:
            page = browser.new_page()
            page.on("pageerror", lambda error: errors.append(str(error)))

            def route(route):
                if route.request.url.startswith("file:") and route.request.url.endswith("view.html"):
                    route.continue_()
                else:  # the network, and the hostile <img src=x> if it ever became an element
                    blocked.append(route.request.url)
                    route.abort()

            page.route("**/*", route)
            page.goto(page_file.resolve().as_uri())
            # rendered once a plain string is on the page as text (attention_heads draws tokens on a canvas)
            marker = "plain" if view == "attention_heads" else "ok"
            page.wait_for_function(f"document.body.innerText.includes('{marker}')", timeout=RENDER_TIMEOUT_MS)
            page.wait_for_timeout(300)  # let an injected element's onerror/onload fire, if there were one
            text = page.evaluate("document.body.innerText")
            pwned = page.evaluate("window.__ckPwned")
            injected = page.evaluate("document.querySelectorAll('body img, body svg[onload]').length")
        finally:
            browser.close()
    assert pwned is None, f"a hostile string ran script (window.__ckPwned = {pwned})"
    assert injected == 0, "a hostile string became an element"
    # CircuitsVis shows spaces in tokens as non-breaking spaces; the zero-width joiners that keep "<" and "&" inert
    # are not drawn
    text = text.replace("\xa0", " ").replace(INERT_JOINER, "")
    if view == "attention_patterns":
        assert HOSTILE_TOKEN in text and HOSTILE_SPAN in text  # shown verbatim, as text
    else:
        assert HOSTILE_NAME in text
    assert not errors, errors
    assert all(not url.endswith("/x") and not url.endswith("/y") for url in blocked), blocked
