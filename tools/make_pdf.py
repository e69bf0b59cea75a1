"""Build a PDF of the book, offline.

Jupyter Book's own `pdfhtml` builder needs pyppeteer, which downloads a Chromium build, and
`pdflatex` needs a TeX installation; neither is available offline. Instead:

1. `jupyter-book build --builder singlehtml`: the whole book as one HTML page. It uses the same
   execution cache as `make book` (`execute_notebooks: cache`), so after `make book` nothing
   executes again;
2. Debian's chromium (driven by playwright with `executable_path`, never `playwright install`)
   opens that page, waits until MathJax has typeset the math and the planner page has drawn, and
   prints it to PDF.

    python tools/make_pdf.py                       # -> _build/pdf/book.pdf
    python tools/make_pdf.py --path-output DIR     # a build made with --path-output DIR
"""

from __future__ import annotations

import argparse
import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]

# On paper nothing scrolls: wrap long code lines and tables' cells instead of cutting them off.
# And no shadows: chromium prints each blurred box-shadow (the theme's, on code cells and
# admonitions, some `!important`, hence the selector that outranks them) as a 300 dpi soft mask,
# about 540 images that made half of the PDF's bytes and a fifth of its printing time.
PRINT_CSS = """@media print {
  pre, div.highlight pre { white-space: pre-wrap !important; overflow-wrap: anywhere; }
  div.cell_output, div.highlight, .table-wrapper { overflow: visible !important; }
  table { font-size: 80%; }
  :is(#ppbook-print, html) * { box-shadow: none !important; }
}"""


# A page is ready to print or test once it has loaded, MathJax has typeset it (printing earlier
# shows raw TeX), its fonts and images are in, and the planner, where there is one, has drawn.
# Not playwright's "networkidle": the 1.5 MB single page never reached it in CI (no request was
# pending; the state is not reliable), and a wait for an event that never comes is a flake.
SETTLED = """async () => {
  if (document.querySelector('script[src*=mathjax]')) {
    while (!(window.MathJax && MathJax.startup && MathJax.startup.promise))
      await new Promise(r => setTimeout(r, 50));
    await MathJax.startup.promise;
  }
  await document.fonts.ready;
  await Promise.all([...document.images].filter(i => !i.complete).map(i => new Promise(r => {
    i.addEventListener('load', r); i.addEventListener('error', r); })));
  const planner = document.getElementById('ppx');
  while (planner && planner.dataset.plans === undefined) await new Promise(r => setTimeout(r, 50));
  return true;
}"""
SETTLE_MS = 600_000  # a generous bound for a loaded 2-core machine; typical: under 10 s


def settle(page) -> None:
    """Wait until `page` (after its load event) is typeset and drawn; see SETTLED. A page that
    redirects (the site's index.html) is waited for at its target first (`page.wait_for_url`):
    evaluated while it navigates away, SETTLED dies with its context."""
    page.set_default_timeout(SETTLE_MS)
    page.evaluate(SETTLED)


class Quiet(http.server.SimpleHTTPRequestHandler):
    """Serves the built site without a log line per request."""

    def log_message(self, *args):
        pass


def chromium_path() -> str | None:
    """Debian's chromium, or ``PPBOOK_CHROMIUM`` (tools/ensure_chromium.sh installs it)."""
    for exe in (os.environ.get("PPBOOK_CHROMIUM"), "/usr/bin/chromium", "/usr/bin/chromium-browser",
                shutil.which("chromium")):
        if exe and os.access(exe, os.X_OK):
            return exe
    return None


def build_singlehtml(root: Path, path_output: Path | None) -> Path:
    cmd = [str(Path(sys.executable).with_name("jupyter-book")), "build", str(root), "--builder", "singlehtml",
           "-W", "-n", "--keep-going"]
    if path_output is not None:
        cmd += ["--path-output", str(path_output)]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    log = (path_output or root) / "_build" / "pdf" / "singlehtml.log"  # the test reads it: nothing re-executed
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"the singlehtml build failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}")
    # where Sphinx read the pages again (no HTML build's parsed pages to start from), myst-nb has
    # written _build/jupyter_execute/ without outputs; `make notebooks` reads glued values from
    # there, so write them (again) from the execution cache
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from build_book import write_executed

    write_executed(root, (path_output or root) / "_build")
    import yaml

    master = yaml.safe_load((root / "_toc.yml").read_text())["root"]  # index.html only redirects there
    return (path_output or root) / "_build" / "singlehtml" / f"{master}.html"


def print_pdf(html: Path, pdf: Path, chromium: str) -> Path:
    from playwright.sync_api import sync_playwright

    pdf.parent.mkdir(parents=True, exist_ok=True)
    site = html.parent  # the singlehtml folder: the first parent with _static
    while not (site / "_static").is_dir():
        site = site.parent
    # Sphinx writes the single page at the root document's path (book/00_intro.html) but links
    # its assets as if it sat at the root: print a copy that does.
    printable = site / "print.html"
    shutil.copy(html, printable)

    handler = functools.partial(Quiet, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)  # MathJax loads its fonts over HTTP
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=FLAGS)
        page = browser.new_page()
        page.goto(f"http://127.0.0.1:{httpd.server_address[1]}/{printable.name}", wait_until="load",
                  timeout=SETTLE_MS)
        settle(page)
        page.add_style_tag(content=PRINT_CSS)
        page.emulate_media(media="print")
        page.pdf(path=str(pdf), format="A4", print_background=True,
                 margin={"top": "15mm", "bottom": "15mm", "left": "12mm", "right": "12mm"})
        browser.close()
    httpd.shutdown()
    return pdf


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--path-output", type=Path, default=None,
                   help="the folder the book was built into with --path-output (default: the repository)")
    p.add_argument("--out", type=Path, default=None, help="the PDF to write (default: <build>/_build/pdf/book.pdf)")
    args = p.parse_args(argv)
    chromium = chromium_path()
    if chromium is None:
        print("make_pdf.py: error: no chromium found; run `bash tools/ensure_chromium.sh` (Debian) or set "
              "PPBOOK_CHROMIUM=/path/to/chromium", file=sys.stderr)
        return 2
    try:
        html = build_singlehtml(ROOT, args.path_output)
    except RuntimeError as exc:
        print(f"make_pdf.py: error: {exc}", file=sys.stderr)
        return 1
    pdf = args.out or (args.path_output or ROOT) / "_build" / "pdf" / "book.pdf"
    print_pdf(html, pdf, chromium)
    print(f"wrote {pdf}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
