"""Record chapter 14's launches several times, idle and under load, for the claims on busy fractions.

Chapter 14 replays every measured step with the simulator and compares the busy fractions. How
close the replay comes moves from run to run on a shared host (torch's DualPipeV once missed by
11.9 points under load where it usually misses by one or two), so a claim on a live measurement
fails the build now and then. The chapter therefore shows its live numbers as reported values and
asserts on this record instead: the page's two launches (all eight schedules on two processes, the
four split-backward ones on four), each repeated ``--runs`` times under real torchrun, every other
repetition beside two busy processes (``tools/load_cores.py``), as on a loaded CI machine. The
chapter replays every recorded step with the simulator itself, so a change of the simulator is
judged on the same measurements.

    python tools/record_own_schedule.py --runs 10     # or: make record-own-schedule

Writes ``data/recorded/own_schedule.json``: ``meta`` (commands, machine, date, versions) and, per
repetition, whether it was loaded, the load average before and after, and each launch's
``--json`` result without its drawn timelines (``events``): per schedule its measured steps, with
the costs, gaps and hand-offs the simulator is fed. Floats are kept to 4 significant digits.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from ppbook import launch  # noqa: E402

SCRIPT = "14_own_schedule.py"
SPLIT = ["ZB-H2", "V-Half", "ZBVZeroBubble", "DualPipeV"]
# The chapter's two launches, with its arguments (the page checks that they still are).
LAUNCHES = {
    "p2": {"nproc": 2, "args": ["--check"]},
    "p4": {"nproc": 4, "args": ["--schedules", *SPLIT, "--layers", "8", "--microbatches", "8", "--batch-size", "16",
                                "--dim", "32", "--seq-len", "16", "--check"]},
}


def _rounded(x):
    """``x`` with every float kept to 4 significant digits (a step's replay does not need more)."""
    if isinstance(x, float):
        return float(f"{x:.4g}")
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_rounded(v) for v in x]
    return x


def record_launch(name: str) -> dict:
    spec = LAUNCHES[name]
    r = launch.torchrun(SCRIPT, spec["args"], nproc=spec["nproc"], timeout=600, check=False, fork=False)
    if r.returncode != 0 or not r.data or not r.data["match"]:
        raise SystemExit(f"{r.shell_command} failed (exit {r.returncode}); nothing recorded:\n{r.output[-3000:]}")
    data = dict(r.data)
    data["runs"] = [{k: v for k, v in run.items() if k != "events"} for run in data["runs"]]
    return _rounded(data)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=10, help="repetitions of both launches; every other one under load")
    p.add_argument("--out", type=Path, default=ROOT / "data" / "recorded" / "own_schedule.json")
    args = p.parse_args(argv)
    if args.runs < 2:
        p.error(f"--runs must be at least 2 (one idle, one loaded), got {args.runs}")
    if args.out.is_dir():
        p.error(f"--out {args.out} must be a file, not a folder")
    import torch

    from ppbook import custom_schedules
    from ppbook.planner import schedules
    from ppbook.fit import predicted_vs_measured

    runs = []
    for i in range(args.runs):
        loaded = i % 2 == 1
        load = None
        if loaded:  # two busy processes, each stopping by itself after 10 minutes at most
            load = subprocess.Popen([sys.executable, str(ROOT / "tools" / "load_cores.py"), "--seconds", "600"],
                                    stdout=subprocess.DEVNULL)
            time.sleep(1.0)
        before = os.getloadavg()
        try:
            t0 = time.perf_counter()
            run = {"loaded": loaded, "load_average_before": [round(x, 2) for x in before],
                   **{name: record_launch(name) for name in LAUNCHES}}
            run["seconds"] = round(time.perf_counter() - t0, 1)
        finally:
            if load is not None:
                load.terminate()
                load.wait()
        run["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
        runs.append(run)
        gaps = []  # what the chapter computes from the record, printed for the person recording
        for name in LAUNCHES:
            d = run[name]
            for r in d["runs"]:
                s, world, m = r["schedule"], d["world_size"], d["microbatches"]
                order = (custom_schedules.GENERATORS[s](world, m) if s in custom_schedules.GENERATORS
                         else schedules.order(s.removesuffix("-hand"), world, m, d["stages_per_rank"]))
                a, b = predicted_vs_measured(r, order)
                gaps.append(f"{s}@{world} {100 * (b - a):+.1f}")
        print(f"run {i}{' (loaded)' if loaded else ''}, {run['seconds']} s, load {run['load_average_after'][0]}: "
              + ", ".join(gaps), flush=True)
    meta = {"commands": {name: f"torchrun --standalone --nproc-per-node {spec['nproc']} scripts/{SCRIPT} "
                               + " ".join(spec["args"]) for name, spec in LAUNCHES.items()},
            "launches": LAUNCHES,
            "recorded_by": f"python tools/record_own_schedule.py --runs {args.runs}",
            "date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "python": platform.python_version(),
            "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} CPU cores, Linux",
            "backend": "gloo (CPU), real torchrun (not the build's launch server)",
            "loaded": "repetitions with loaded=true: two busy processes beside them (tools/load_cores.py); "
                      "the host is shared, so 'idle' ones see other jobs' load too (load_average_*)"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    lines = ",\n".join(json.dumps(run, separators=(",", ":")) for run in runs)  # one repetition a line
    args.out.write_text('{"meta": ' + json.dumps(meta, indent=1) + ',\n"runs": [\n' + lines + "\n]}\n")
    print(f"wrote {args.out} ({args.out.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
