"""The rendered site in headless Chromium: pages load, figures have pixels, code is highlighted,
math is typeset, and the console shows no errors beyond known harmless ones."""

from __future__ import annotations

import functools
import http.server
import json
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conftest import ROOT
# the local server make_pdf uses, and its wait for a page to settle (tools/,
# on the path from conftest)
import planner_page
from make_pdf import SETTLE_MS, Quiet, settle

pytestmark = pytest.mark.book

# Known harmless console errors of Jupyter Book 1.x pages served without a launch service.
HARMLESS = (
    "Identifier 'THEBE_JS_URL' has already been declared",
    "Got invalid theme mode",  # pydata-sphinx-theme on a first visit (empty localStorage)
)


@pytest.fixture(scope="module")
def site(built_book, chromium):
    """The built site over HTTP, and one browser context whose tabs visit it: a reader's browser,
    which keeps the theme's scripts and fonts in its cache from one page to the next (a context per
    page loaded and compiled them again, about 10 CPU-s over the walk through every page)."""
    handler = functools.partial(Quiet, directory=str(built_book))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    yield context, f"http://127.0.0.1:{httpd.server_address[1]}", built_book
    context.close()
    httpd.shutdown()


def visit(site, rel: str, tab=None):
    """Open ``rel`` in a new tab, or in ``tab`` (its listeners of this visit removed when it has
    settled); returns the page, its console errors and its failed requests."""
    context, base, _ = site
    page = tab or context.new_page()
    errors, missing = [], []
    listeners = (("console", lambda m: errors.append(m.text) if m.type == "error" else None),
                 ("pageerror", lambda e: errors.append(str(e))),
                 ("response", lambda r: missing.append(r.url) if r.status >= 400 else None))
    for event, listener in listeners:
        page.on(event, listener)
    response = page.goto(f"{base}/{rel}", wait_until="load", timeout=SETTLE_MS)
    target = redirect(site, rel)
    if target is not None:  # wait for the new page, or SETTLED would run while the old one goes
        page.wait_for_url(f"{base}/{target}", wait_until="load", timeout=SETTLE_MS)
    settle(page)
    if tab is not None:
        for event, listener in listeners:
            page.remove_listener(event, listener)
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
    share it): its title, console errors, failed requests and figures. One tab walks the book, as
    a reader clicks through it (a tab per page took twice as long: chromium starts a renderer for
    each)."""
    seen = {}
    tab = site[0].new_page()
    for rel in pages(site):
        page, errors, missing = visit(site, rel, tab)
        seen[rel] = {"title": page.title().strip(), "errors": errors, "missing": missing,
                     "images": [img.evaluate(IMAGE_STATS)
                                for img in page.query_selector_all("article img[src*='_images/']")]}
    tab.close()
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


def plan_cli(tmp_path, *args: str) -> dict:
    """``python -m ppbook.plan ... --json`` as a reader runs it (a subprocess), its JSON back."""
    out = tmp_path / f"plan{len(list(tmp_path.iterdir()))}.json"
    subprocess.run([sys.executable, "-m", "ppbook.plan", *args, "--json", str(out)], check=True, capture_output=True,
                   timeout=300)
    return json.loads(out.read_text())


def layout_words(layout: dict) -> str:
    """A layout (the page's fields) in the words of the CLI's --layout."""
    return " ".join(f"{k}={layout[f]}" for k, f in (("tp", "tp"), ("pp", "p"), ("dp", "dp"), ("ep", "ep"),
                                                     ("schedule", "schedule"),
                                                     ("v", "v"), ("b", "b"), ("m", "m"), ("sharding", "sharding"),
                                                     ("recompute", "recompute"), ("balance", "balance")))


def assert_same_plan(page, cli: dict) -> None:
    rows = planner_page.table(page)
    assert [r["label"] for r in rows] == [o["label"] for o in cli["ranked"][:len(rows)]] and len(rows) >= 2
    for r, o in zip(rows, cli["ranked"]):
        assert r["step_s"] == pytest.approx(o["step_s"], rel=1e-9)
        assert r["peak_bytes"] == pytest.approx(o["peak_gb"] * 1e9, rel=1e-9)
        assert r["bubble"] == pytest.approx(o["bubble"], rel=1e-9, abs=1e-12)


def plan_here(tmp_path, *args: str) -> dict:
    """The same request through ``ppbook.plan.main`` in this process (no interpreter to start),
    its JSON back."""
    from ppbook import plan

    out = tmp_path / f"plan{len(list(tmp_path.iterdir()))}.json"
    assert plan.main([*args, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def assert_same_layout(shown: dict, cli: dict) -> None:
    """The selected layout as drawn is the CLI's --layout: every rank's memory by kind (the bars),
    the step time, and every action of the timeline with its start and end."""
    from ppbook.planner.search import MEMORY_KINDS

    explained = cli["layout"]
    assert shown["label"] == explained["label"]
    assert shown["step_s"] == pytest.approx(explained["step_s"], rel=1e-9)
    assert shown["totals"] == pytest.approx([r["total"] for r in explained["memory"]], rel=1e-9)
    assert len(shown["parts"]) == len(explained["memory"])
    for drawn, r in zip(shown["parts"], explained["memory"]):
        assert drawn == pytest.approx([r[k] for k in MEMORY_KINDS], rel=1e-9)
    assert shown["actions"] == len(explained["timeline"]) == shown["rects"] == len(shown["events"])
    for drawn, e in zip(shown["events"], explained["timeline"]):
        assert drawn[:4] == e[:4] and drawn[4:] == pytest.approx(e[4:], rel=1e-9, abs=1e-12)
    assert shown["span"] == pytest.approx(max(e[5] for e in explained["timeline"]), rel=1e-9)
    assert (shown["handoffs"] > 0) == (shown["layout"]["p"] > 1)  # grey lines between ranks


LOOPED = ("Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble")  # the schedules whose v is the reader's


def change_each_control(page, tmp_path, args: list[str]) -> list[str]:
    """Move every control of the selected layout in turn to another value it offers that runs;
    after each move the drawing changes and is the CLI's --layout of the new layout. v is the
    reader's only on a looped schedule: one is chosen first where the layout has none. Returns
    the controls moved."""
    moved = []
    for control in ("tp", "p", "schedule", "v", "m", "sharding", "recompute", "balance"):
        if control == "v" and page.is_disabled("#ppx-v"):
            for looped in [s for s in LOOPED if s in planner_page.options(page, "schedule")]:
                planner_page.choose(page, "schedule", looped)
                if "cannot run" not in planner_page.selected(page)["stats"]:
                    break
        before = planner_page.selected(page)
        current = str(before["layout"][control])
        others = [v for v in planner_page.options(page, control) if v != current]
        # p = 1 last: with no pipeline left, the schedule and v would have nothing to offer
        for value in sorted(others, key=lambda v: control == "p" and v == "1"):
            planner_page.choose(page, control, value)
            after = planner_page.selected(page)
            if "cannot run" not in after["stats"]:
                break
        else:
            continue  # nothing else this control offers runs here
        assert after["label"] != before["label"], control
        if control != "balance":  # lightened ends can round to the even split on a short pipeline
            assert (after["totals"], after["events"]) != (before["totals"], before["events"]), control
        assert_same_layout(after, plan_here(tmp_path, *args, "--layout", layout_words(after["layout"])))
        moved.append(control)
    return moved


def assert_table_fits(page) -> None:
    """The ranked table fits the page's content column: no sideways scroll hides its last columns,
    and no cell (a step time, a schedule's name) breaks over two lines to make it fit."""
    wide, column, wrapped = page.eval_on_selector(".ppx-table-wrap", """w => [w.scrollWidth, w.clientWidth,
        [...w.querySelectorAll('tbody td')].filter(td => {
            const r = document.createRange(); r.selectNodeContents(td);
            return new Set([...r.getClientRects()].map(b => Math.round(b.top))).size > 1; }).map(td => td.textContent)]""")
    assert wide <= column, f"the layouts table is {wide} px wide in a {column} px column"
    assert not wrapped, f"cells of the layouts table break over two lines: {wrapped}"


def fetched_bytes(page) -> dict[str, int]:
    """What the browser fetched for the page, by address: the page itself and every resource
    (scripts, style sheets, fonts, images), as decoded bytes."""
    return page.evaluate("""() => Object.fromEntries(performance.getEntriesByType('navigation')
        .concat(performance.getEntriesByType('resource')).map(e => [e.name, e.decodedBodySize]))""")


def test_the_planner_page_answers_as_the_command_line(site, tmp_path):
    """A reader's session on the planner page of the built site (a desktop's 1280 x 900): a preset
    on a GPU other than the default, then a pasted config.json with its own link between nodes
    and sequence length, then every control changed. Each time the table, the memory bars and
    the timeline agree with `python -m ppbook.plan` on the same request, the drawing changes with
    them, and the table fits the page."""
    from ppbook import explorer

    page, errors, missing = visit(site, "book/explorer.html")
    assert_table_fits(page)  # the opening request
    # the weight the page states (explorer.page_weight, from the files it references) is what a
    # browser fetches for it, but for Sphinx's small scripts and the site's search index
    fetched = {url: n for url, n in fetched_bytes(page).items() if "/searchindex.js" not in url}
    assert sum(explorer.page_weight().values()) == pytest.approx(sum(fetched.values()), rel=0.1), fetched

    planner_page.request(page, model="llama3-8b", gpu="a100-80gb", gpus=16, global_batch=64)
    first = planner_page.selected(page)
    preset = ["--model", "llama3-8b", "--gpu", "a100-80gb", "--gpus", "16", "--gpus-per-node", "8",
              "--global-batch", "64", "--seq-len", "4096"]
    cli = plan_cli(tmp_path, *preset, "--layout", layout_words(first["layout"]))
    assert_same_plan(page, cli)
    assert first["label"] == cli["ranked"][0]["label"]  # the winner is selected...
    assert_same_layout(first, cli)                       # ...and drawn as the CLI explains it
    assert first["bars"] >= 3 * len(first["totals"])     # parameters, gradients, optimizer at least, per rank
    assert "a100-80gb" in page.inner_text("#ppx-header")
    assert_table_fits(page)

    config = ROOT / "data" / "configs" / "qwen2.5-7b.json"
    planner_page.request(page, config=config.read_text(), gpus=32, global_batch=128, seq_len=2048, inter="ib-hdr200")
    pasted = planner_page.selected(page)
    args = ["--model", str(config), "--gpu", "h100-sxm", "--gpus", "32", "--gpus-per-node", "8", "--global-batch",
            "128", "--seq-len", "2048", "--inter", "ib-hdr200"]
    cli = plan_cli(tmp_path, *args, "--layout", layout_words(pasted["layout"]))
    assert_same_plan(page, cli)
    assert pasted["label"] == cli["ranked"][0]["label"] != first["label"]
    assert_same_layout(pasted, cli)
    assert "nvlink-h100 / ib-hdr200" in page.inner_text("#ppx-header")
    assert_table_fits(page)
    # the timeline's legend names what it draws: the kinds of action, the hand-offs, the idle time
    kinds = {e[2] for e in pasted["events"]}
    assert {label.split()[0] for label in pasted["legend"][:len(kinds)]} == kinds
    assert ("hand-off between ranks" in pasted["legend"]) == (pasted["handoffs"] > 0)
    assert pasted["legend"][-1] == ("idle (the bubble)" if pasted["layout"]["p"] > 1 else "idle")
    # the answer as the command line prints it, and a timeline whose axis covers the whole step
    shown = planner_page.answer(page)
    assert shown["winner_reason"] == cli["winner_reason"] and shown["why_lines"] == cli["why"]
    assert shown["axis"] >= shown["step"] * (1 - 1e-12)

    moved = change_each_control(page, tmp_path, args)  # a reader changes the layout, part by part
    assert {"tp", "p", "schedule", "v", "m", "sharding", "recompute"} <= set(moved), moved

    # the reader's own GPU and links: the request the CLI gets with the same numbers
    planner_page.request(page, model="llama3-8b", gpus=16, global_batch=64)
    for field, value in (("gpu-memory", "96"), ("gpu-tflops", "800"), ("gpu-bandwidth", "3"),
                         ("intra-bandwidth", "300"), ("intra-latency", "4"), ("inter-bandwidth", "40"),
                         ("inter-latency", "9")):
        page.fill(f"#ppx-{field}", value)
    planner_page.settled(page)
    own = ["--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "16", "--gpus-per-node", "8", "--global-batch", "64",
           "--seq-len", "4096", "--gpu-memory", "96", "--gpu-tflops", "800", "--gpu-bandwidth", "3",
           "--intra-bandwidth", "300", "--intra-latency", "4", "--inter-bandwidth", "40", "--inter-latency", "9"]
    mine = planner_page.selected(page)
    cli = plan_here(tmp_path, *own, "--layout", layout_words(mine["layout"]))
    assert_same_plan(page, cli)
    assert_same_layout(mine, cli)
    assert "(modified)" in page.inner_text("#ppx-header")

    page.fill("#ppx-gpus", "12")  # a bad request: one line saying what is wrong, and no table
    page.wait_for_function("() => document.getElementById('ppx-error').textContent.length > 0",
                           timeout=planner_page.WAIT_MS)
    assert "not a whole number of nodes" in page.inner_text("#ppx-error")
    assert page.locator("#ppx-table tr").count() == 0
    assert not real_missing(missing) and not real_errors(errors), (missing, errors)
    page.close()


def test_the_planner_page_keeps_the_reader_on_the_planner(site):
    """What the page says it leaves out is one list, true of the model (context parallelism is
    modelled, not left out); the maintainer's account of how the page is built and the static
    screenshot come last, each in a collapsed block."""
    page, errors, missing = visit(site, "book/explorer.html")
    left = page.inner_text("section#what-it-leaves-out")
    assert "float8" in left and "Context and expert parallelism are modelled" in left
    assert "leaves out what that model leaves out" in left
    blocks = page.eval_on_selector_all("section#what-it-leaves-out ~ *, section#what-it-leaves-out .admonition",
                                       "es => es.map(e => e.className)")
    dropdowns = page.eval_on_selector_all(".admonition.dropdown", "es => es.map(e => e.innerText.split('\\n')[0])")
    assert any("How this page is built" in d for d in dropdowns) and any("A picture of this page" in d for d in dropdowns)
    # both come after the planner and after the list of what it leaves out
    order = page.evaluate("""() => {
        const planner = document.getElementById('ppx'), left = document.getElementById('what-it-leaves-out');
        const shot = document.getElementById('planner-screenshot');
        const after = (a, b) => !!(a.compareDocumentPosition(b) & Node.DOCUMENT_POSITION_FOLLOWING);
        return [after(planner, left), after(left, shot)]; }""")
    assert order == [True, True], (order, blocks)
    assert not real_missing(missing) and not real_errors(errors), (missing, errors)
    page.close()


def test_the_planner_page_works_from_file_urls(built_book, chromium):
    """Opened from disk, as a reader who built the book opens it: the page plans with no server
    and asks the network for nothing (every request outside file:// is refused and recorded)."""
    page = chromium.new_page()
    errors, remote = [], []
    page.on("pageerror", lambda e: errors.append(str(e)))

    def refuse(route):
        if route.request.url.startswith(("file:", "data:", "blob:", "about:")):
            route.continue_()
        else:
            remote.append(route.request.url)
            route.abort()

    page.route("**/*", refuse)
    page.goto((built_book / "book" / "explorer.html").as_uri())
    page.wait_for_function("() => document.getElementById('ppx').dataset.plans === '1'", timeout=planner_page.WAIT_MS)
    assert len(planner_page.table(page)) >= 2 and planner_page.selected(page)["actions"] > 0
    page.check("#ppx-mode-teach")  # chapter 5's view: abstract costs
    page.select_option("#ppx-t-schedule", "ZBVZeroBubble")
    assert page.eval_on_selector("#ppx-t-chart", "e => e.dataset.key").startswith("ZBVZeroBubble|4|8|2|")
    assert page.locator("#ppx-t-chart svg rect.ppx-action").count() == 3 * 2 * 4 * 8  # F, I, W on 2 stages per rank
    assert "bubble" in page.inner_text("#ppx-t-stats")
    assert not real_errors(errors), errors
    assert not remote, remote  # offline: nothing fetched
    page.close()
