"""Helper of tools/bench_plan.py: time gloo ping-pongs between two processes on this machine.

    torchrun --standalone --nproc-per-node 2 tools/gloo_link.py --json out.json

Rank 0 sends a float32 tensor of each size to rank 1, which sends it back; half the median
round trip is the one-way time. ppbook.planner.hardware.fit_link turns the times into latency + bandwidth.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist

from ppbook import dist as ppdist

SIZES = [4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20]  # bytes


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", required=True)
    p.add_argument("--reps", type=int, default=30)
    args = p.parse_args(argv)
    info = ppdist.setup("cpu", timeout_s=120)
    peer = 1 - info.rank
    one_way = []
    for size in SIZES:
        buf = torch.zeros(size // 4)
        times = []
        for _ in range(args.reps + 3):
            dist.barrier()
            t0 = time.perf_counter()
            if info.rank == 0:  # comm: ping, then pong
                dist.send(buf, peer)
                dist.recv(buf, peer)
            else:
                dist.recv(buf, peer)
                dist.send(buf, peer)
            times.append(time.perf_counter() - t0)
        one_way.append(sorted(times[3:])[len(times[3:]) // 2] / 2)
    if info.rank == 0:
        with open(args.json, "w") as f:
            json.dump({"sizes": SIZES, "one_way_seconds": one_way}, f)
    ppdist.teardown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
