"""Record chapter 13's launch several times, for the claims about step times that one build
cannot make reliably (the simulator's prediction of the overlapped run, and what the overlap buys).

A prediction of one run (DualPipeV with the overlap) from another (DualPipeV without it) carries
how two runs of one launch differ on a shared machine, and what an overlap of threads buys on a
CPU depends on what else the machine runs. A build runs beside the test suite's launches, so a
claim about these step times, asserted on the build's own launch, holds or not by the load of
the moment. Chapter 13 therefore asserts them on this record, re-analysed by the current
simulator in every build (``overlap.assess``), and reports its own launch beside it.

This runs the chapter's launch (four processes under real torchrun, gloo on the CPU) ``--launches``
times: the first half on the machine as it is, the second half beside two busy processes
(``tools/load_cores.py``), and writes the three runs the simulator is held to, with the machine's
load average at each launch's end, to ``data/recorded/moe_overlap.json.gz``:

    python tools/record_moe_overlap.py --launches 10
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from ppbook import launch, overlap  # noqa: E402

#: the chapter's launch (book/13_moe.md), plus the gloo probe, whose fastest all-to-all the
#: chapter compares with the ones inside the runs
ARGS = ["--pp", "2", "--ep", "2", "--check", "--probe-gloo"]
OUT = ROOT / "data" / "recorded" / "moe_overlap.json.gz"
KEEP = ("run", "schedule", "overlap", "median_step_seconds", "match")  # of each run, besides its records


def compact(data: dict) -> dict:
    """The launch's JSON with only what :func:`ppbook.overlap.assess` reads, times in microseconds."""
    def rounded(x):
        if isinstance(x, float):
            return round(x, 6)
        if isinstance(x, list):
            return [rounded(v) for v in x]
        if isinstance(x, dict):
            return {k: rounded(v) for k, v in x.items()}
        return x

    runs = [{**{k: r[k] for k in KEEP}, "records": rounded(r["records"])}
            for r in data["runs"] if r["run"] in overlap.SHOWN]
    return {**{k: v for k, v in data.items() if k not in ("runs", "reference")}, "runs": runs}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--launches", type=int, default=10)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    if args.launches < 2:
        p.error(f"--launches must be at least 2 (half of them under load), got {args.launches}")
    if args.out.is_dir() or not args.out.parent.is_dir():
        p.error(f"--out {args.out} must be a file in an existing folder")
    import torch

    launches, load = [], None
    try:
        for i in range(args.launches):
            loaded = i >= args.launches // 2
            if loaded and (load is None or load.poll() is not None):  # (again, if it ended by itself)
                load = subprocess.Popen([sys.executable, str(ROOT / "tools" / "load_cores.py"), "--seconds", "1200"])
            data = launch.torchrun("13_moe.py", ARGS, nproc=4, timeout=600, fork=False).data
            if not data["ok"]:
                raise SystemExit(f"launch {i}: the pipeline does not equal one process; nothing recorded")
            one = {"loaded": loaded, "load_average": [round(x, 2) for x in os.getloadavg()], "data": compact(data)}
            launches.append(one)
            a = overlap.assess(one["data"])
            print(f"launch {i}{' (loaded)' if loaded else ''}: load {one['load_average'][0]}, "
                  f"prediction {a['error_pct']['DualPipeV-overlap']:+.1f}%, replays "
                  f"{a['error_pct']['1F1B']:+.1f}% and {a['error_pct']['DualPipeV']:+.1f}%, "
                  f"overlap {100 * a['gain_vs_dualpipev']:+.1f}% shorter than DualPipeV", flush=True)
    finally:  # a failed launch must not leave the load running
        if load is not None:
            load.terminate()
            load.wait()
    meta = {"command": "torchrun --standalone --nproc-per-node 4 scripts/13_moe.py " + " ".join(ARGS),
            "recorded_by": f"python tools/record_moe_overlap.py --launches {args.launches}",
            "date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "python": platform.python_version(),
            "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} CPU cores, Linux",
            "backend": "gloo (CPU)",
            "loaded": "launches with loaded=true: two busy processes beside them (tools/load_cores.py); "
                      "load_average: the machine's 1, 5 and 15 minute load averages at the launch's end"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(args.out, "wt") as f:
        json.dump({"meta": meta, "launches": launches}, f, separators=(",", ":"))
    print(f"wrote {args.out} ({args.out.stat().st_size // 1024} kB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
