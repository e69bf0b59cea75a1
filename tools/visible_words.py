"""What a reader sees on a built page without opening anything, counted (issue 50).

The core path (the introduction and chapters 1, 2, 3 and 5) is a first read of about ninety
minutes: its pages hold a budget of visible words, code and outputs included, and none of their
paragraphs of prose carries more than three numbers (../STYLE.md, 2b and 2d). This counts both on
the built HTML, the way a reader meets the page:

- **visible words**: the article's text less what stays collapsed (dropdown admonitions, exercise
  solutions, hidden cells and hidden inputs), split on white space;
- **heavy paragraphs**: paragraphs and list items of prose (outside code, outputs and tables)
  with more than three numbers, any numbers, glued or typed; a number that names a figure,
  a table, an exercise or a chapter, or a GPU, rank, stage, node, step, layer or microbatch,
  does not count.

The same rules as the project's reviewers' counter, so their numbers and the build's agree.

    python tools/visible_words.py _build/html/book 00_intro.html 01_first_pipeline.html
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from bs4 import BeautifulSoup

#: The pages a newcomer reads first, in order, and their budgets in visible words.
CORE_PATH = ("00_intro", "01_first_pipeline", "02_naive", "03_gpipe", "05_schedules")
CORE_BUDGET = 12_000
PAGE_BUDGET = {"05_schedules": 3_500}
NUMBER_LIMIT = 3  # numbers a paragraph of prose may carry

NUM = re.compile(r"(?<![\w.])[-+]?\d+(?:[.,]\d+)*(?:\s?%|x|×)?(?![\w])")
SKIP_ID = re.compile(r"^(?:Fig(?:ure)?\.?|Exercise|Table|Chapter|Eq\.?)$")
SKIP_UNIT = re.compile(r"^(GPU|rank|stage|node|step|layer|microbatch)s?$", re.I)
COLLAPSED = ["details", ".dropdown", ".tag_hide-cell", ".tag_hide-input .cell_input", ".tag_remove-cell",
             ".headerlink", "script", "style"]


def visible(article):
    """``article`` (a BeautifulSoup element) with everything a reader must open removed, in place."""
    for sel in COLLAPSED:
        for el in article.select(sel):
            el.decompose()
    return article


def numbers(text: str) -> int:
    """How many numbers ``text`` carries, less those that name a figure, table, exercise, chapter
    or a unit of the machine (``Fig. 3``, ``rank 2``)."""
    n = 0
    words = text.split()
    for i, w in enumerate(words):
        if NUM.fullmatch(w.strip("():;,.[]")):
            prev = words[i - 1] if i else ""
            if SKIP_ID.match(prev) or SKIP_UNIT.match(prev):
                continue
            n += 1
    return n


def count(html: str) -> tuple[int, list[str]]:
    """Visible words of a built page's HTML, and its paragraphs of prose with too many numbers."""
    soup = BeautifulSoup(html, "html.parser")
    art = visible(soup.find("article") or soup)
    words = len(art.get_text(" ").split())
    heavy = []
    for p in art.find_all(["p", "li"]):
        if p.find_parent(["pre", "code", "table"]) or p.find_parent(class_="output"):
            continue
        if p.name == "li" and p.find("p"):  # the item's paragraphs are counted themselves
            continue
        text = " ".join(p.get_text(" ").split())
        if numbers(text) > NUMBER_LIMIT:
            heavy.append(text)
    return words, heavy


def page(path: Path) -> tuple[int, list[str]]:
    return count(Path(path).read_text("utf8"))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2:
        print("usage: visible_words.py HTMLDIR PAGE.html...", file=sys.stderr)
        return 2
    folder, total = Path(argv[0]), [0, 0]
    for name in argv[1:]:
        if not (folder / name).is_file():
            print(f"visible_words.py: error: {folder / name} does not exist; build the book first (make book)",
                  file=sys.stderr)
            return 2
        w, h = page(folder / name)
        total[0] += w
        total[1] += len(h)
        print(f"{name:32} {w:7} words {len(h):4} heavy")
    print(f"{'total':32} {total[0]:7} words {total[1]:4} heavy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
