"""How many glued numbers each paragraph of a page's prose carries (../shared/STYLE.md, rule 2b).

A paragraph of prose carries the few numbers that make its point; tables hold the rest, and how a
result was checked goes into a collapsed block. This reads a MyST page and yields its paragraphs
of prose, main line only: outside code cells, tables, math, figures and every other directive,
except the admonitions a reader sees open (``{note}``, ``{admonition}``, ``{exercise}`` ...), and
never inside a collapsed block (``{dropdown}``, ``{toggle}``, or any directive with
``:class: dropdown``). A list item is a paragraph of its own.

    python tools/prose_numbers.py book/01_first_pipeline.md           # paragraphs over the limit
    python tools/prose_numbers.py book/*.md --limit 3 --summary       # counts per page
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

LIMIT = 3  # glued numbers a paragraph of prose may carry in the chapters that hold to it
GLUE = re.compile(r"\{glue(?::[a-z]*)?\}`[^`]+`")
FENCE = re.compile(r"^(\s*)(`{3,}|:{3,})\s*(\{([^}]+)\})?")
# directives whose body is prose a reader sees open
OPEN_PROSE = {"note", "tip", "important", "warning", "admonition", "seealso", "hint", "attention", "caution",
              "danger", "error", "exercise", "epigraph", "sidebar", "margin", "topic", "prf:definition"}
COLLAPSED = {"dropdown", "toggle", "solution"}
LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")


def paragraphs(text: str):
    """``(line number, paragraph)`` for every paragraph of main-line prose in a MyST page."""
    lines = text.split("\n")
    i = 0
    if lines and lines[0].strip() == "---":  # front matter
        i = 1
        while i < len(lines) and lines[i].strip() != "---":
            i += 1
        i += 1
    stack: list[tuple[str, int, bool]] = []  # (fence char, length, prose inside)
    current: list[str] = []
    start = 0

    def flush():
        nonlocal current
        if current:
            yield start, " ".join(s.strip() for s in current)
        current = []

    while i < len(lines):
        line = lines[i]
        m = FENCE.match(line)
        inside_prose = all(p for _, _, p in stack)
        if m:
            char, length = m.group(2)[0], len(m.group(2))
            rest = line[m.end():].strip()
            if stack and char == stack[-1][0] and length >= stack[-1][1] and not m.group(3) and not rest:
                yield from flush()
                stack.pop()
                i += 1
                continue
            yield from flush()
            name = (m.group(4) or "").strip()
            prose = name in OPEN_PROSE and name not in COLLAPSED
            if prose:  # options right below the opener: a :class: dropdown collapses it
                j = i + 1
                while j < len(lines) and lines[j].strip().startswith(":") and not FENCE.match(lines[j]):
                    if re.match(r"\s*:class:.*\bdropdown\b", lines[j]):
                        prose = False
                    j += 1
                i = j
            else:
                i += 1
            stack.append((char, length, prose))
            continue
        if not inside_prose:
            i += 1
            continue
        stripped = line.strip()
        if (not stripped or stripped.startswith(("|", "#", "%", "+++", "<!--", "$$"))
                or re.match(r"^\(\S+\)=$", stripped)
                or re.match(r"^:\w[\w-]*:", stripped)):
            yield from flush()
        elif LIST_ITEM.match(line):
            yield from flush()
            start, current = i + 1, [line]
        else:
            if not current:
                start = i + 1
            current.append(line)
        i += 1
    yield from flush()


def glued_numbers(paragraph: str) -> int:
    return len(GLUE.findall(paragraph))


def over_limit(text: str, limit: int = LIMIT) -> list[tuple[int, int, str]]:
    """``(line, count, paragraph)`` for every paragraph carrying more than ``limit`` glued values."""
    return [(line, n, par) for line, par in paragraphs(text) if (n := glued_numbers(par)) > limit]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="prose_numbers.py", description=__doc__.split("\n")[0])
    p.add_argument("pages", nargs="+", type=Path)
    p.add_argument("--limit", type=int, default=LIMIT)
    p.add_argument("--summary", action="store_true", help="one line per page: paragraphs, glued values, over the limit")
    args = p.parse_args(argv)
    bad = 0
    for page in args.pages:
        text = page.read_text("utf8")
        over = over_limit(text, args.limit)
        bad += len(over)
        if args.summary:
            pars = list(paragraphs(text))
            print(f"{page.name}: {len(pars)} paragraphs, {sum(glued_numbers(t) for _, t in pars)} glued values, "
                  f"{len(over)} over {args.limit}")
        else:
            for line, n, par in over:
                print(f"{page}:{line}: {n} glued values: {par[:160]}...")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
