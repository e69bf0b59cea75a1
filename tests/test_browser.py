"""The rendered site in headless Chromium: pages load, figures have pixels, code is highlighted,
math is typeset, and the console shows no errors beyond known harmless ones."""

from __future__ import annotations

import functools
import http.server
import re
import threading
from pathlib import Path

import pytest

from conftest import ROOT, missing_tool
# Debian's chromium and the flags it runs with: one definition, shared with `make pdf` (tools/,
# on the path from conftest)
from make_pdf import FLAGS, SETTLE_MS, Quiet, chromium_path, settle

pytestmark = pytest.mark.book

# Known harmless console errors of Jupyter Book 1.x pages served without a launch service.
HARMLESS = (
    "Identifier 'THEBE_JS_URL' has already been declared",
    "Got invalid theme mode",  # pydata-sphinx-theme on a first visit (empty localStorage)
)


@pytest.fixture(scope="module")
def site(built_book):
    exe = chromium_path()
    if exe is None:
        missing_tool("chromium", "run tools/ensure_chromium.sh or set PPBOOK_CHROMIUM")
    from playwright.sync_api import sync_playwright

    handler = functools.partial(Quiet, directory=str(built_book))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=FLAGS)
        yield browser, f"http://127.0.0.1:{httpd.server_address[1]}", built_book
        browser.close()
    httpd.shutdown()


def visit(site, rel: str):
    browser, base, _ = site
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors, missing = [], []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("response", lambda r: missing.append(r.url) if r.status >= 400 else None)
    response = page.goto(f"{base}/{rel}", wait_until="load", timeout=SETTLE_MS)
    target = redirect(site, rel)
    if target is not None:  # wait for the new page, or SETTLED would run while the old one goes
        page.wait_for_url(f"{base}/{target}", wait_until="load", timeout=SETTLE_MS)
    settle(page)
    assert response.status == 200, rel
    return page, errors, missing


def redirect(site, rel: str) -> str | None:
    """Where the page at `rel` sends the browser with a meta refresh (Jupyter Book's index.html
    does), as a path from the site's root; None for a page that stays."""
    m = re.search(r'http-equiv="Refresh" content="0; url=([^"]+)"', (site[2] / rel).read_text())
    return None if m is None else str(Path(rel).parent / m.group(1)).removeprefix("./")


def real_missing(missing: list[str]) -> list[str]:
    return [u for u in missing if not u.endswith("/favicon.ico")]


def real_errors(errors: list[str]) -> list[str]:
    return [e for e in errors if not any(h in e for h in HARMLESS)
            and not ("Failed to load resource" in e and "404" in e)]  # favicon.ico: see real_missing


def pages(site) -> list[str]:
    root = site[2]
    return ["index.html"] + sorted(str(p.relative_to(root)) for p in (root / "book").glob("*.html"))


# Every figure's size and how many colours it has (sampling every 7th pixel), drawn on a canvas.
IMAGE_STATS = """(im) => {
    const c = document.createElement('canvas');
    c.width = im.naturalWidth; c.height = im.naturalHeight;
    const ctx = c.getContext('2d'); ctx.drawImage(im, 0, 0);
    const d = ctx.getImageData(0, 0, c.width, c.height).data;
    const colours = new Set();
    for (let i = 0; i < d.length; i += 4 * 7) colours.add(d[i] << 16 | d[i+1] << 8 | d[i+2]);
    return {w: im.naturalWidth, h: im.naturalHeight, colours: colours.size};
}"""


@pytest.fixture(scope="module")
def every_page(site) -> dict[str, dict]:
    """Each page visited once (a visit waits for typesetting and drawing, so the tests below
    share it): its title, console errors, failed requests and figures."""
    seen = {}
    for rel in pages(site):
        page, errors, missing = visit(site, rel)
        seen[rel] = {"title": page.title().strip(), "errors": errors, "missing": missing,
                     "images": [img.evaluate(IMAGE_STATS)
                                for img in page.query_selector_all("article img[src*='_images/']")]}
        page.close()
    return seen


def test_every_page_loads_without_console_errors(every_page):
    for rel, seen in every_page.items():
        assert seen["title"], rel
        assert not real_missing(seen["missing"]), (rel, real_missing(seen["missing"]))
        assert not real_errors(seen["errors"]), (rel, real_errors(seen["errors"]))


def test_the_site_root_sends_readers_to_the_first_page(site):
    import yaml

    first = yaml.safe_load((ROOT / "_toc.yml").read_text())["root"]
    assert redirect(site, "index.html") == f"{first}.html"


def test_figures_have_real_pixels(every_page):
    checked = 0
    for rel, seen in every_page.items():
        for stats in seen["images"]:
            assert stats["w"] > 100 and stats["h"] > 100, (rel, stats)
            assert stats["colours"] > 20, (rel, stats)  # a plot, not a blank or single-colour image
            checked += 1
    assert checked >= 1


def test_code_is_highlighted_and_math_typeset(site):
    page, _, _ = visit(site, "book/00_intro.html")
    keyword_colour = page.eval_on_selector("div.highlight pre span.k", "e => getComputedStyle(e).color")
    text_colour = page.eval_on_selector("div.highlight pre", "e => getComputedStyle(e).color")
    assert keyword_colour != text_colour
    page.wait_for_selector("mjx-container", timeout=15000)
    assert page.locator("mjx-container").count() >= 1
    assert "$$" not in page.inner_text("article")
    # tables printed by cells are rendered as tables, not as Markdown source
    assert page.locator("article table").count() >= 2
    assert "|:--" not in page.inner_text("article")
    page.close()


def test_schedule_explorer_redraws_when_a_control_moves(site):
    """The explorer works offline, with no kernel: moving a control redraws the chart from the
    precomputed simulations (and nothing is fetched beyond the page's own files)."""
    page, errors, missing = visit(site, "book/explorer.html")

    def drawing():
        return (page.inner_text("#ppx-stats"), page.eval_on_selector("#ppx-chart", "e => e.innerHTML"))

    stats, svg = drawing()
    assert "step time" in stats and "bubble" in stats and "peak microbatches" in stats
    assert page.locator("#ppx-chart svg rect").count() >= 2 * 8 * 2  # p = 2, m = 8: F and B each
    page.select_option("#ppx-schedule", "ZBVZeroBubble")
    zbv = drawing()
    assert zbv != (stats, svg)
    assert page.locator("#ppx-chart svg rect").count() == 3 * 2 * 2 * 8  # F, I, W on 2 stages per rank
    page.focus("#ppx-p")
    page.keyboard.press("ArrowRight")  # a reader moving the slider: p = 2 -> 3
    assert drawing() != zbv
    assert page.eval_on_selector("#ppx-chart", "e => e.dataset.key").startswith("ZBVZeroBubble|3|8|")
    assert not real_missing(missing) and not real_errors(errors), (missing, errors)
    page.close()
