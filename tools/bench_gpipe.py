"""Benchmark: GPipe's measured busy fraction vs the simulator, and from-scratch vs ScheduleGPipe.

    make bench                      # or: .venv/bin/python tools/bench_gpipe.py --steps 9

Launches scripts/03_gpipe.py on two processes for m = 1, 2, 4, 8, writes the raw results to
_build/bench/gpipe_p2.json and prints, per m, the mean busy fraction per rank (measured and
simulated from the measured action times) and the median step time of both implementations.
Timing claims live here, not in timed tests: a shared machine's timings are not pass/fail.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from statistics import median

from ppbook import launch
from ppbook.planner import schedules
from ppbook.fit import predicted_vs_measured


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=9)  # fewer gave step-time medians that moved by 10-20%
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--out", default="_build/bench/gpipe_p2.json")
    args = p.parse_args(argv)
    run = launch.torchrun("03_gpipe.py", ["--check", "--steps", str(args.steps), "--microbatches", "1", "2", "4", "8"],
                          nproc=args.nproc, timeout=600)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(run.data, indent=1))
    runs = {(r["impl"], r["microbatches"]): r for r in run.data["runs"]}
    print(f"{'m':>3} {'measured busy':>14} {'simulated':>10} {'gap (pp)':>9} {'scratch ms':>11} {'torch ms':>9} "
          f"{'ratio':>6} {'paired':>7}")
    for m in sorted({m for _, m in runs}):
        r = runs[("torch", m)]
        measured, predicted = predicted_vs_measured(r, schedules.gpipe_order(args.nproc, m))
        scratch, torch_s = runs[("scratch", m)]["median_step_seconds"], r["median_step_seconds"]
        # the script interleaves the two implementations step by step: step k of one ran right
        # after step k of the other, so their ratio cancels the machine's slow drifts
        paired = median([a / b for a, b in zip(runs[("scratch", m)]["step_seconds"], r["step_seconds"])])
        print(f"{m:>3} {100 * measured:>13.1f}% {100 * predicted:>9.1f}% {100 * abs(measured - predicted):>9.1f} "
              f"{scratch * 1e3:>11.1f} {torch_s * 1e3:>9.1f} {scratch / torch_s:>6.2f} {paired:>7.2f}")
    print(f"raw results: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
