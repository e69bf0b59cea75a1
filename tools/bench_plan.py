"""Benchmark: the planner's time model on CPU. Step times of real pipeline runs at two model
widths, measured, against the simulator fed with each action's measured time and hand-offs as
latency + bytes / bandwidth from gloo's measured link (not the measured hand-off delays).

    make bench-plan              # or: .venv/bin/python tools/bench_plan.py

1. tools/gloo_link.py times ping-pongs between two processes; ppbook.hardware.fit_link fits
   latency and bandwidth.
2. scripts/05_schedules.py runs GPipe and 1F1B on two processes at --dim 128 and --dim 512
   (a boundary message of 128 KiB and of 512 KiB, float32), three measured steps each.
3. For each run, simulate(order, measured per-action costs, latency = link.time(message bytes),
   overhead = measured per-action gaps) predicts the mean step time. Target: within 10%.
Raw JSON in _build/bench/plan.json. Timing claims live here, not in timed tests.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ppbook import launch, timeline, torch_orders
from ppbook.planner import simulate
from ppbook.planner import hardware, traffic

ROOT = Path(__file__).resolve().parents[1]


def predicted_span(run: dict, order, link: hardware.Link, message_bytes: int) -> float:
    costs = {(int(k[:-1]), k[-1]): v for k, v in run["costs"].items()}
    overheads = {(int(k[:-1]), k[-1]): v for k, v in run["overheads"].items()}
    events = simulate.simulate(order, costs, latency=lambda dep, a: link.time(message_bytes), overhead=overheads)
    t0, t1 = timeline.span(events)
    return t1 - t0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--widths", type=int, nargs="+", default=[128, 512])
    p.add_argument("--out", default="_build/bench/plan.json")
    args = p.parse_args(argv)
    ping = launch.torchrun(ROOT / "tools" / "gloo_link.py", [], nproc=2, timeout=300).data
    link = hardware.fit_link(ping["sizes"], ping["one_way_seconds"], "gloo")
    print(f"gloo on this machine: latency {link.latency * 1e6:.0f} us, bandwidth {link.bandwidth / 1e9:.2f} GB/s")
    m, batch, seq = 8, 32, 64
    rows, raw = [], {"link": link.__dict__, "ping": ping, "runs": {}}
    for dim in args.widths:
        run = launch.torchrun("05_schedules.py", ["--schedules", "GPipe", "1F1B", "--dim", str(dim), "--layers", "4",
                                                  "--microbatches", str(m), "--batch-size", str(batch), "--seq-len", str(seq),
                                                  "--steps", str(args.steps), "--warmup", "1"], nproc=2, timeout=1200).data
        raw["runs"][dim] = run
        message = traffic.boundary_bytes(batch // m, seq, dim, 4)
        for r in run["runs"]:
            order = torch_orders.torch_order(r["schedule"], 2, m, run["stages_per_rank"])
            measured = sum(s["span"] for s in r["steps"]) / len(r["steps"])
            free = hardware.Link("free", 0.0, float("inf"))  # the same prediction with hand-offs costing nothing
            rows.append((dim, message, r["schedule"], measured, predicted_span(r, order, link, message),
                         predicted_span(r, order, free, message)))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(raw, indent=1))
    print(f"{'dim':>5} {'message':>9} {'schedule':>9} {'measured ms':>12} {'predicted ms':>13} {'difference':>11} "
          f"{'hand-offs ms':>13}")
    worst = 0.0
    for dim, message, name, measured, predicted, free in rows:
        worst = max(worst, abs(predicted / measured - 1))
        print(f"{dim:>5} {message / 1024:>7.0f}Ki {name:>9} {measured * 1e3:>12.1f} {predicted * 1e3:>13.1f} "
              f"{100 * (predicted / measured - 1):>+10.1f}% {(predicted - free) * 1e3:>13.1f}")
    print(f"largest difference {100 * worst:.1f}% (target: within 10%); raw results: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
