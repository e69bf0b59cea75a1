"""The screenshot in the planner page (book/images/planner.png), taken from the built site opened
from file:// (as a reader who built the book opens it): Qwen2.5-7B's config.json pasted, 16 H100s,
the first pipelined layout of the table selected.

    make book && .venv/bin/python tools/screenshot_planner.py [--site _build/html] [--out book/images/planner.png]
    .venv/bin/python tools/screenshot_planner.py --standalone    # without a built site: the planner's own
                                                                  # fragment on a bare page (no theme)
"""

from __future__ import annotations

import argparse
import struct
import sys
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import planner_page  # noqa: E402

from ppbook import explorer  # noqa: E402
from make_pdf import FLAGS, chromium_path  # noqa: E402

CONFIG = ROOT / "data" / "configs" / "qwen2.5-7b.json"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--site", default=str(ROOT / "_build" / "html"))
    ap.add_argument("--out", default=str(ROOT / "book" / "images" / "planner.png"))
    ap.add_argument("--standalone", action="store_true",
                    help="take it from the planner's own HTML fragment (ppbook.explorer.page) on a bare page, "
                         "without building the book (the theme's fonts and column are absent)")
    args = ap.parse_args()
    if args.standalone:
        import tempfile

        args.site = tempfile.mkdtemp(prefix="planner-page-")
        (Path(args.site) / "book").mkdir()
        (Path(args.site) / "book" / "explorer.html").write_text(
            '<!doctype html><html><head><meta charset="utf-8"><title>planner</title></head>'
            '<body style="font-family: sans-serif; font-size: 15px; max-width: 880px; margin: 8px">'
            f"{explorer.page()}</body></html>")
    page_path = Path(args.site) / "book" / "explorer.html"
    if not page_path.is_file():
        print(f"screenshot_planner: error: no {page_path}; run `make book` first (or give --site)", file=sys.stderr)
        return 2
    exe = chromium_path()
    if exe is None:
        print("screenshot_planner: error: no chromium; run tools/ensure_chromium.sh", file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=FLAGS)
        # tall enough that the planner needs no scrolling (the theme's sticky bars would cross it)
        page = browser.new_page(viewport={"width": 900, "height": 1800}, device_scale_factor=1)
        page.goto(page_path.as_uri())
        planner_page.request(page, config=CONFIG.read_text(), gpu="h100-sxm", gpus=16, global_batch=64, seq_len=4096)
        rows = planner_page.table(page)
        pipelined = next(i for i, r in enumerate(rows) if " p=" in r["label"])
        page.click(f"#ppx-table tbody tr:nth-child({pipelined + 1})")
        planner_page.settled(page)
        page.add_style_tag(content=".skip-link, .bd-header, .bd-header-article { display: none !important; }")
        page.locator("#ppx").scroll_into_view_if_needed()
        page.mouse.move(0, 0)  # no row highlighted by the pointer
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        png = page.locator("#ppx").screenshot()
        browser.close()
    Path(args.out).write_bytes(with_text(png, DIGEST_KEY, explorer.source_digest()))
    print(f"wrote {args.out}: {rows[pipelined]['label']}")
    return 0


DIGEST_KEY = "ppbook-planner-digest"  # tests/test_explorer.py compares it with the page's code


def with_text(png: bytes, key: str, value: str) -> bytes:
    """``png`` with a tEXt chunk ``key``: ``value`` before its IEND chunk."""
    body = b"tEXt" + key.encode("latin-1") + b"\0" + value.encode("latin-1")
    chunk = struct.pack(">I", len(body) - 4) + body + struct.pack(">I", zlib.crc32(body))
    end = png.rindex(b"IEND") - 4  # the IEND chunk's length field
    return png[:end] + chunk + png[end:]


def text_chunks(png: bytes) -> dict[str, str]:
    """The tEXt chunks of a PNG file, by key."""
    out, at = {}, 8
    while at < len(png):
        (length,) = struct.unpack(">I", png[at:at + 4])
        kind, data = png[at + 4:at + 8], png[at + 8:at + 8 + length]
        if kind == b"tEXt":
            key, _, value = data.partition(b"\0")
            out[key.decode("latin-1")] = value.decode("latin-1")
        at += 12 + length
    return out


if __name__ == "__main__":
    raise SystemExit(main())
