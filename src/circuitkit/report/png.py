"""PNG export of a written report (``--png``): headless Chromium screenshots of the page's own views, so the
images are what a reader sees — the summary, the head table, the small-multiple heatmaps, the composition view
per mode, the edge graphs, the loss curve, and the head panel of the selected head.

Needs the ``chromium`` executable (Debian: ``apt-get install chromium``) and the ``playwright`` package (only
its driver; ``playwright install`` is never needed). Every network request is blocked while the page renders.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from circuitkit.errors import CircuitkitError

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--enable-unsafe-swiftshader",  # without it (or with --disable-gpu) WebGL canvases stay blank
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
)
VIEWPORT = {"width": 1400, "height": 900}
"""The page width the report is laid out for (no horizontal scroll at 1400 px)."""
READY_TIMEOUT_MS = 60_000


def find_chromium() -> str | None:
    """The Chromium executable to use: ``$CIRCUITKIT_CHROMIUM``, else ``chromium`` on ``PATH``, else None."""
    candidate = os.environ.get("CIRCUITKIT_CHROMIUM")
    if candidate:
        return candidate if Path(candidate).exists() else None
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


def require_browser(caller: str) -> str:
    """The Chromium executable, or a :class:`CircuitkitError` saying what to install."""
    executable = find_chromium()
    if executable is None:
        raise CircuitkitError(
            f"{caller}: given no Chromium (none on PATH, CIRCUITKIT_CHROMIUM unset); expected a headless browser. "
            "Install it (Debian: apt-get install chromium) or skip the PNG export."
        )
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as error:
        raise CircuitkitError(
            f"{caller}: the 'playwright' package is not installed; expected it for PNG export. "
            "pip install playwright (its browser download is not needed)."
        ) from error
    return executable


@contextlib.contextmanager
def offline_page(report: str | os.PathLike, out_dir: str | os.PathLike, *, caller: str, scale: float,
                 written_by: str) -> Iterator[tuple[Any, Path]]:
    """``(page, out)``: a headless Chromium page (Playwright) showing the written ``report`` with the network blocked
    (only ``file:`` URLs load), and ``out_dir`` created for the PNGs; the browser is closed when the block ends.
    ``scale`` (>= 0.25) and the report (a file, ``written_by`` names what writes one) are checked first."""
    from playwright.sync_api import sync_playwright

    from circuitkit import validate

    executable = require_browser(caller)
    scale = validate.real(f"{caller}: scale", scale, minimum=0.25)
    report, out = Path(report).resolve(), Path(out_dir)
    if not report.is_file():
        raise validate.fail(f"{caller}: report", str(report), f"a report.html written by {written_by}")
    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=executable, args=list(CHROMIUM_FLAGS))
        try:
            page = browser.new_page(viewport=VIEWPORT, device_scale_factor=scale)
            page.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:")
                       else route.abort())
            page.goto(report.as_uri())
            yield page, out
        finally:
            browser.close()


def export_pngs(report: str | os.PathLike, out_dir: str | os.PathLike, *, scale: float = 2.0) -> list[Path]:
    """Screenshot every exported view of a written ``report`` into ``out_dir/<view>.png``; the paths written.

    Views: each section marked for export (``summary``, ``heads``, ``scores``, ``composition-Q/K/V`` (one per
    mode), ``circuit``, ``loss``) and ``head-<layer.head>`` (the head panel of the head selected at load).
    """
    written: list[Path] = []
    with offline_page(report, out_dir, caller="export_pngs", scale=scale, written_by="save()") as (page, out):
        page.wait_for_function("document.documentElement.dataset.ckReady !== undefined", timeout=READY_TIMEOUT_MS)
        if page.evaluate("document.documentElement.dataset.ckReady") != "true":
            raise CircuitkitError(f"export_pngs: the report {str(Path(report).resolve())!r} failed to draw: "
                                  f"{page.inner_text('#ck-status')}")

        def shoot(selector: str, name: str) -> None:
            path = out / f"{name}.png"
            page.locator(selector).screenshot(path=str(path))
            written.append(path)

        for section in page.evaluate("Array.from(document.querySelectorAll('[data-png]'), e => e.dataset.png)"):
            if section == "composition":
                for mode in page.evaluate("Array.from(document.querySelectorAll('.ck-mode'), b => b.dataset.mode)"):
                    page.evaluate("m => window.circuitkitReport.showMode(m)", mode)
                    shoot("#ck-sec-composition", f"composition-{mode}")
                if not written or not written[-1].stem.startswith("composition-"):
                    shoot("#ck-sec-composition", "composition")
            else:
                shoot(f"#ck-sec-{section}", section)
        head = page.evaluate("document.getElementById('ck-detail').dataset.head || ''")
        if head:
            shoot("#ck-detail", f"head-{head}")
    return written


__all__ = ["CHROMIUM_FLAGS", "export_pngs", "find_chromium", "offline_page"]
