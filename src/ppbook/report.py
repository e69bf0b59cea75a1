"""Plumbing for chapters: tables as rendered Markdown, and human-friendly numbers.

Introduced in chapter 0; every chapter uses it.
"""

from __future__ import annotations

from typing import Iterable, Sequence


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence], align: str | None = None) -> str:
    """A GitHub-style Markdown table. ``align`` is one letter per column: l, r or c."""
    rows = [[str(c) for c in row] for row in rows]
    if any(len(r) != len(headers) for r in rows):
        raise ValueError("every row needs one cell per header")
    align = align or "l" + "r" * (len(headers) - 1)
    marks = {"l": ":--", "r": "--:", "c": ":-:"}
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(marks[a] for a in align) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def show_table(headers: Sequence[str], rows: Iterable[Sequence], align: str | None = None):
    """Display a table as the output of a notebook cell (rendered as Markdown by the book)."""
    from IPython.display import Markdown, display

    display(Markdown(markdown_table(headers, rows, align)))


def human_bytes(n: float) -> str:
    """Decimal units, as device memory is sold: 1.13 TB, 80 GB, 512 MB."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"
