"""The release report is a web page: open the quickstart's in a real browser, as its reader does.

Headless Chromium (Debian's `chromium`, driven by Playwright) loads report.html at 1280 px. The page fails on a
console error, a script error, a failed request or an image that did not decode, and on a main table wider than
its box (the reader would scroll sideways to find the p99). A wide section table may scroll, but only inside a
box of its own, never the page. A screenshot of the whole page is kept for a person to look at.

Without Chromium or Playwright the tests skip and say why. CI installs both and sets COMPRESS_REQUIRE_BROWSER=1,
so there a missing browser fails instead of skipping.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.quickstart_run import first_quickstart_run

WIDTH = 1280
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def _browser() -> str:
    """The Chromium executable, or a skip (a failure where CI asked for the browser) naming what is missing."""
    found = next((path for path in map(shutil.which, BROWSERS) if path), None)
    missing = []
    if found is None:
        missing.append("no Chromium on PATH (Debian: apt-get install chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("Playwright is not installed (pip install -e '.[browser]')")
    if missing:
        if os.environ.get("COMPRESS_REQUIRE_BROWSER") == "1":
            pytest.fail("the browser test must run here: " + "; ".join(missing))
        pytest.skip("; ".join(missing))
    return found


def open_in_browser(page_file: Path, screenshot: Path) -> dict:
    """What a reader's browser meets on ``page_file`` at 1280 px: errors, broken images, widths; and a screenshot."""
    from playwright.sync_api import sync_playwright

    problems: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=_browser(), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": WIDTH, "height": 900})
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
                    if m.type in ("error", "assert") else None)
            page.on("pageerror", lambda e: problems.append(f"script error: {e}"))
            page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url[:120]}"))
            page.goto(page_file.resolve().as_uri(), wait_until="load")
            facts = page.evaluate("""() => {
                const box = t => t.parentElement;
                const tables = [...document.querySelectorAll('table')].map(t => ({
                    main: t.classList.contains('main'), width: t.scrollWidth, box: box(t).clientWidth,
                    scrolls: getComputedStyle(box(t)).overflowX === 'auto'}));
                return {
                    images: [...document.images].map(i => i.alt),
                    broken: [...document.images].filter(i => !i.complete || i.naturalWidth === 0)
                                                .map(i => i.alt || i.src.slice(0, 60)),
                    page_width: document.documentElement.scrollWidth, window_width: window.innerWidth,
                    tables: tables};
            }""")
            page.screenshot(path=str(screenshot), full_page=True)
            facts["browser"] = browser.version
        finally:
            browser.close()
    return {**facts, "problems": problems}


def verdicts(facts: dict) -> list[str]:
    """Every way the page fails its reader; [] when it reads well at 1280 px."""
    found = list(facts["problems"])
    found += [f"broken image: {name}" for name in facts["broken"]]
    if facts["page_width"] > facts["window_width"]:
        found.append(f"the page scrolls sideways: {facts['page_width']} px in a {facts['window_width']} px window")
    main = [t for t in facts["tables"] if t["main"]]
    if len(main) != 1:
        found.append(f"{len(main)} main tables (one expected)")
    found += [f"the main table is {t['width']} px in a {t['box']} px box" for t in main if t["width"] > t["box"]]
    found += [f"a {t['width']} px table in a {t['box']} px box that does not scroll"
              for t in facts["tables"] if not t["main"] and t["width"] > t["box"] and not t["scrolls"]]
    return found


_HEALTHY = {"problems": [], "broken": [], "images": ["a.png"], "page_width": 1280, "window_width": 1280,
            "tables": [{"main": True, "width": 1200, "box": 1200, "scrolls": True}]}


@pytest.mark.slow
def test_the_browser_check_fails_a_page_with_an_error_a_broken_image_and_wide_tables(tmp_path):
    """The check's known answer: a page with each fault is told each one."""
    _browser()
    cells = "".join(f"<td>{'w' * 40}</td>" for _ in range(8))
    page = tmp_path / "bad.html"
    page.write_text(f"""<!doctype html><html><head><title>bad</title></head><body>
<script>console.error("drawn wrong"); undefinedFunction();</script>
<img alt="missing plot" src="data:image/png;base64,AAAA"><img alt="gone" src="gone.png">
<table class="main"><tr>{cells}</tr></table><div><table><tr>{cells}</tr></table></div>
<div style="overflow-x: auto"><table><tr>{cells}</tr></table></div></body></html>""")
    found = verdicts(open_in_browser(page, tmp_path / "bad.png"))
    assert any("console error: drawn wrong" in f for f in found)
    assert any(f.startswith("script error:") and "undefinedFunction" in f for f in found)
    assert "broken image: missing plot" in found and "broken image: gone" in found
    assert any(f.startswith("request failed:") and f.endswith("gone.png") for f in found)
    assert any(f.startswith("the page scrolls sideways") for f in found)
    assert any(f.startswith("the main table is") for f in found)
    assert sum("does not scroll" in f for f in found) == 1  # the wide table in a scroll box of its own is allowed
    assert not any("main tables" in f for f in found)
    assert verdicts({**_HEALTHY, "tables": []}) == ["0 main tables (one expected)"]
    assert verdicts(_HEALTHY) == []
    assert (tmp_path / "bad.png").stat().st_size > 0


@pytest.mark.slow
def test_the_quickstart_report_reads_in_chromium_at_1280_px(tmp_path):
    _browser()
    run_dir = tmp_path / "quickstart"
    first_quickstart_run(run_dir)
    out = Path(os.environ.get("COMPRESS_BROWSER_OUT") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    screenshot = out / "report-1280px.png"
    facts = open_in_browser(run_dir / "bench" / "report" / "report.html", screenshot)
    found = verdicts(facts)
    main = next((t for t in facts["tables"] if t["main"]), {"width": "?", "box": "?"})
    summary = (f"the quickstart report opened in Chromium {facts['browser']} at {WIDTH} px: "
               f"{len(facts['problems'])} console/script/request errors, {len(facts['broken'])} broken of "
               f"{len(facts['images'])} images, page {facts['page_width']} px wide, main table "
               f"{main['width']} px in its {main['box']} px box; screenshot {screenshot}")
    (out / "report-in-browser.json").write_text(json.dumps({**facts, "verdicts": found, "summary": summary}, indent=1))
    assert "accuracy_vs_p99.png" in facts["images"]  # the picture a release is decided on is there, and drawn
    assert found == [], "\n".join(found)
    assert screenshot.stat().st_size > 10_000  # a drawn page, not a blank one
