"""Drive the planner page (book/explorer.md) as a reader would, in playwright: pick a model or
paste a config.json, fill in the cluster and batch, read back what it shows. Shared by the
browser test (tests/test_browser.py) and the screenshot in the page (tools/screenshot_planner.py).

    python tools/screenshot_planner.py     # after make book: book/images/planner.png
"""

from __future__ import annotations

WAIT_MS = 120_000  # a plan takes under a second in Chromium; generous for a loaded machine


def request(page, model: str | None = None, config: str | None = None, gpu: str = "h100-sxm", gpus: int = 8,
            gpus_per_node: int = 8, global_batch: int = 64, seq_len: int = 4096, intra: str | None = None,
            inter: str | None = None, framework: str | None = None) -> None:
    """Enter a request: a preset ``model`` or the text of a ``config`` (config.json), a GPU preset,
    the links within and between nodes (presets; left alone where not given), the framework that
    calibrates the times (left alone where not given), and wait until the page has planned exactly it."""
    if config is not None:
        page.select_option("#ppx-model", "config.json")
        page.fill("#ppx-config", config)
    else:
        page.select_option("#ppx-model", model)
    if page.input_value("#ppx-gpu") != gpu:
        page.select_option("#ppx-gpu", gpu)  # both links follow the GPU (its node's and its usual network)
    for side, link in (("intra", intra), ("inter", inter)):
        if link is not None and page.input_value(f"#ppx-{side}") != link:
            page.select_option(f"#ppx-{side}", link)
    if framework is not None and page.input_value("#ppx-framework") != framework:
        page.select_option("#ppx-framework", framework)
    for field, value in (("gpus", gpus), ("gpus-per-node", gpus_per_node), ("global-batch", global_batch),
                         ("seq-len", seq_len)):
        page.fill(f"#ppx-{field}", str(value))
    name = model if config is None else "config.json"
    # the page's key of what it planned last; a link not given may be anything
    expected = [name, gpu, gpus, gpus_per_node, global_batch, seq_len, intra, inter, framework]
    page.wait_for_function("""want => {
        const got = JSON.parse(document.getElementById('ppx').dataset.request || 'null');
        return got !== null && want.every((x, i) => x === null || x === got[i]); }""", arg=expected, timeout=WAIT_MS)
    settled(page)


def settled(page) -> None:
    """Wait until no plan is pending (the form replans 250 ms after the last keystroke)."""
    page.wait_for_function("""() => new Promise(done => {
        const root = document.getElementById('ppx'), before = root.dataset.plans;
        setTimeout(() => done(root.dataset.plans === before), 600); })""", timeout=WAIT_MS)


def table(page) -> list[dict]:
    """The ranked table's rows: label, step time, peak bytes and bubble, at full precision."""
    return page.eval_on_selector_all("#ppx-table tbody tr", """rows => rows.map(r => ({
        label: r.dataset.label, step_s: Number(r.dataset.stepS), peak_bytes: Number(r.dataset.peakBytes),
        bubble: Number(r.dataset.bubble)}))""")


def selected(page) -> dict:
    """The selected layout: its label and fields (tp, p, dp, schedule, v, b, m, sharding,
    recompute, balance), step time, memory per rank (totals, and each kind the bars draw), the
    timeline drawn (every action's rank, stage, kind, microbatch, start and end, and its legend)
    and the line under the controls."""
    return page.evaluate("""() => {
        const $ = id => document.getElementById(id);
        return {label: $('ppx').dataset.layout, layout: JSON.parse($('ppx').dataset.layoutFields || 'null'), step_s: Number($('ppx-layout-stats').dataset.stepS),
                totals: JSON.parse($('ppx-memory').dataset.totals || 'null'),
                parts: JSON.parse($('ppx-memory').dataset.parts || 'null'),
                events: JSON.parse($('ppx-timeline').dataset.events || 'null'),
                stats: $('ppx-layout-stats').textContent,
                span: Number($('ppx-timeline').dataset.span), actions: Number($('ppx-timeline').dataset.actions),
                handoffs: Number($('ppx-timeline').dataset.handoffs),
                bars: $('ppx-memory').querySelectorAll('rect[class^=ppx-]').length,
                rects: $('ppx-timeline').querySelectorAll('rect.ppx-action').length,
                legend: JSON.parse($('ppx-timeline').dataset.legend || '[]')}; }""")


def answer(page) -> dict:
    """What the page answers above the layout: the calibration and caution lines, the summary, the
    answer (the tie, the winner, the margin) and the why-lines, as text, and the answer and why-lines
    as the port computed them (the command line's JSON has the same)."""
    return page.evaluate("""() => {
        const $ = id => document.getElementById(id), root = $('ppx');
        return {calibration: $('ppx-calibration').textContent, caution: $('ppx-caution').textContent,
                summary: $('ppx-summary').textContent, answer: $('ppx-answer').innerText, why: $('ppx-why').innerText,
                winner_reason: JSON.parse(root.dataset.answer || 'null'), why_lines: JSON.parse(root.dataset.why || 'null'),
                dropped: $('ppx-dropped').textContent,
                tied: [...document.querySelectorAll('#ppx-table tbody tr')].map(r => r.dataset.tied === '1'),
                cells: [...document.querySelectorAll('#ppx-table tbody tr')].map(r => [...r.children].map(td => td.textContent)),
                head: [...document.querySelectorAll('#ppx-table thead th')].map(th => th.textContent),
                axis: Number($('ppx-timeline').dataset.axis), step: Number($('ppx-timeline').dataset.step)}; }""")


def options(page, control: str) -> list[str]:
    """The values a control of the selected layout offers now."""
    return page.eval_on_selector_all(f"#ppx-{control} option", "os => os.map(o => o.value)")


def choose(page, control: str, value) -> None:
    """Change one control of the selected layout (tp, p, schedule, v, m, sharding, recompute,
    balance); the page redraws at once."""
    page.select_option(f"#ppx-{control}", str(value))
