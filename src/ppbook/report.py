"""Plumbing for chapters: tables as rendered Markdown, and human-friendly numbers.

Introduced in chapter 0; every chapter uses it.
"""

from __future__ import annotations

import math
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


# A bound a sentence states must stay true as printed: "at most" shows a maximum rounded up,
# "at least" a minimum rounded down (rounding to the nearest can cross the bound).

def round_up(x: float, digits: int = 1) -> float:
    """``x`` rounded up to ``digits`` decimals: what "at most" or "within" may print of a maximum."""
    return math.ceil(round(x * 10**digits, 9)) / 10**digits  # round(): 0.3 * 10 is 3.0000000000000004


def round_down(x: float, digits: int = 1) -> float:
    """``x`` rounded down to ``digits`` decimals: what "at least" may print of a minimum."""
    return math.floor(round(x * 10**digits, 9)) / 10**digits


def round_up_sig(x: float, sig: int = 2) -> float:
    """``x`` (>= 0) rounded up to ``sig`` significant digits, for the e-format of small differences."""
    if x <= 0:
        return 0.0 if x == 0 else -round_down_sig(-x, sig)
    e = math.floor(math.log10(x)) - (sig - 1)
    return float(_times_ten_to(math.ceil(round(_times_ten_to(x, -e), 9)), e))


def round_down_sig(x: float, sig: int = 2) -> float:
    """``x`` (> 0) rounded down to ``sig`` significant digits."""
    e = math.floor(math.log10(x)) - (sig - 1)
    return float(_times_ten_to(math.floor(round(_times_ten_to(x, -e), 9)), e))


def _times_ten_to(x: float, e: int) -> float:
    """x * 10**e, dividing for a negative e so that 3 x 10^-5 prints as 3e-05 (not 2.9999999999999997e-05)."""
    return x * 10**e if e >= 0 else x / 10**-e
