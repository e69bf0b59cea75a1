"""List the script lines that chapters show (every `{literalinclude}`, resolved as Sphinx does)
and that are longer than the page's code width, so they would hide behind a scroll bar.

    python tools/long_listings.py            # lines over 88 characters, by file; exit 1 if any
    python tools/long_listings.py --width 100
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_notebooks import ROOT, listings  # noqa: E402

WIDTH = 88  # what sphinx-book-theme shows of a code block without scrolling, at its default width


def long_lines(width: int = WIDTH, root: Path = ROOT) -> list[tuple[str, int, int]]:
    """``(file, line number, length)`` of every shown line longer than ``width``, once each."""
    found = set()
    for page in sorted((root / "book").glob("*.md")):
        for source, first, text in listings(page):
            for k, line in enumerate(text.splitlines()):
                if len(line) > width:
                    found.add((str(source.relative_to(root)), first + k, len(line)))
    return sorted(found)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--width", type=int, default=WIDTH, help="the longest line a listing may show")
    args = p.parse_args(argv)
    rows = long_lines(args.width)
    for path, number, length in rows:
        print(f"{path}:{number}: {length} characters")
    print(f"{len(rows)} shown lines over {args.width} characters")
    return 1 if rows else 0


if __name__ == "__main__":
    sys.exit(main())
