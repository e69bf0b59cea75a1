"""How long each page of the last build took to execute, against the book's budget.

The house style asks for about a minute per page on two CPU cores. That is a budget kept by
measuring, not a test: a test that fails on time fails on a loaded machine, and a red CI blocks
every landing. So `make book` writes the times (myst-nb records each notebook's
``execution_seconds`` in the jupyter-cache beside the HTML), the site shows them on the "How long
each page takes to execute" page, and this report says which pages are over budget:

    make book && make page-times                 # the repository's build
    python tools/page_times.py --path-output DIR # a build made with --path-output DIR

It prints one line per page, slowest first, writes ``_build/bench/page_times.json``, and exits 1
when a page is over budget (for a person or a scheduled job to act on, not for CI).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Seconds a page may take on 2 CPU cores: about a minute, with room for a shared host.
PAGE_BUDGET_S = 120.0


def page_seconds(html: Path) -> dict[str, float]:
    """Execution seconds of every page of the book built into ``html`` (its _build/html)."""
    from jupyter_cache import get_cache

    cache = get_cache(html.parent / ".jupyter_cache")
    return {Path(r.uri).stem: r.data["execution_seconds"] for r in cache.list_cache_records()}


def over_budget(seconds: dict[str, float], budget: float = PAGE_BUDGET_S) -> dict[str, float]:
    return {page: s for page, s in seconds.items() if s > budget}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--path-output", type=Path, default=ROOT,
                   help="the folder the book was built into with --path-output (default: the repository)")
    p.add_argument("--budget", type=float, default=PAGE_BUDGET_S, help="seconds per page (default: %(default)s)")
    args = p.parse_args(argv)
    html = args.path_output / "_build" / "html"
    if not (html.parent / ".jupyter_cache").is_dir():
        print(f"page_times.py: error: no execution cache under {html.parent}; run `make book` first", file=sys.stderr)
        return 2
    seconds = page_seconds(html)
    for page, s in sorted(seconds.items(), key=lambda kv: -kv[1]):
        print(f"{page:>28}  {s:7.1f} s{'  OVER BUDGET' if s > args.budget else ''}")
    over = over_budget(seconds, args.budget)
    print(f"total {sum(seconds.values()):.0f} s over {len(seconds)} pages; budget {args.budget:.0f} s per page: "
          + (f"{len(over)} over" if over else "every page within"))
    out = args.path_output / "_build" / "bench" / "page_times.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"budget_s": args.budget, "seconds": seconds}, indent=1))
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
