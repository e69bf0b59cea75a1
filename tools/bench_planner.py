"""How long the planner takes to answer: every published run of chapter 10 asked again, under its
framework's options and with every option, timed (a benchmark, not a test: a shared machine's
timings are not pass/fail). Target: each request answered in under 10 s on 2 CPU cores.

    make bench-planner        # or: .venv/bin/python tools/bench_planner.py
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from ppbook.planner import published, search  # noqa: E402


def main() -> int:
    data = published.load()
    rows = []
    for row in data["runs"]:
        for constrained in (True, False):
            for cached in vars(search).values():  # each request from a cold start, as the command line answers it
                if hasattr(cached, "cache_clear"):
                    cached.cache_clear()
            req = published.request(row, data, constrained=constrained)
            t0 = time.perf_counter()
            ranked, dropped = search.plan(req)
            seconds = time.perf_counter() - t0
            rows.append({"run": row["id"], "constrained": constrained, "seconds": seconds, "ranked": len(ranked),
                         "dropped": len(dropped), "gpus": row["gpus"]})
            print(f"{row['id']:>24} {'framework options' if constrained else 'every option':>17} "
                  f"{seconds:6.2f} s  ({len(ranked)} ranked, {len(dropped)} dropped)", flush=True)
    worst = max(r["seconds"] for r in rows)
    print(f"slowest request: {worst:.2f} s (target: under 10 s on 2 cores)")
    out = ROOT / "_build" / "bench" / "planner.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
