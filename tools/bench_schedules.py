"""Benchmark: each of the seven schedules' measured step time vs the simulator's prediction.

    make bench-schedules            # or: .venv/bin/python tools/bench_schedules.py --steps 9

Launches scripts/05_schedules.py once on two processes for all seven schedule classes (m = 8,
two stages per rank for the looped ones), writes the raw results to
_build/bench/schedules_p2.json and prints, per schedule, the mean step time (first action to
last) measured and simulated from each step's measured action times, gaps and hand-offs, and
the relative difference. The target is 10%. Timing claims live here, not in timed tests.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ppbook import launch, torch_orders
from ppbook.fit import predicted_step_time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=9)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--out", default="_build/bench/schedules_p2.json")
    args = p.parse_args(argv)
    run = launch.torchrun("05_schedules.py", ["--check", "--steps", str(args.steps), "--microbatches",
                                              str(args.microbatches)], nproc=args.nproc, timeout=600)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(run.data, indent=1))
    print(f"{'schedule':>22} {'measured ms':>12} {'simulated ms':>13} {'difference':>11}")
    worst = 0.0
    for r in run.data["runs"]:
        order = torch_orders.torch_order(r["schedule"], args.nproc, args.microbatches, run.data["stages_per_rank"])
        measured, predicted = predicted_step_time(r, order)
        worst = max(worst, abs(predicted / measured - 1))
        print(f"{r['schedule']:>22} {measured * 1e3:>12.1f} {predicted * 1e3:>13.1f} {100 * (predicted / measured - 1):>+10.1f}%")
    print(f"largest difference {100 * worst:.1f}% (target: within 10%); raw results: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
