"""Write the compute orders of torch's schedule classes that the planner simulates, so that
``python -m ppbook.plan`` answers in seconds instead of building each order with torch's
``_schedule_visualizer`` (0.2 to 1 s apiece on two cores).

    .venv/bin/python tools/cache_orders.py        # writes data/orders/torch_orders.json.gz

For every schedule that torch builds (GPipe and 1F1B have pure generators in ppbook.simulate),
p in 2, 4, 8, 16, m in 2p and 3p (the planner extrapolates linearly from these two) and v in
2..4 (looped) or 2 (V-shaped). The file records torch's version: the planner ignores a cache
written by another version. tests/test_plan.py checks entries against torch_order.
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

import torch

from ppbook import plan, simulate, stages


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=str(plan.ORDERS_FILE))
    args = p.parse_args(argv)
    orders = {}
    for name, placement in ((n, stages.placement(n)) for n in stages.TORCH_SCHEDULES):
        if name in simulate.HAND_WRITTEN_ORDERS:
            continue
        for pp in (2, 4, 8, 16):
            for m in (2 * pp, 3 * pp):
                for v in ((2, 3, 4) if placement == "loop" else (2,)):
                    if stages.schedule_problem(name, pp, m, v):
                        continue
                    order = simulate.torch_order(name, pp, m, v)
                    orders[plan.order_key(name, pp, m, v)] = {str(r): " ".join(map(str, acts)) for r, acts in order.items()}
                    print(name, pp, m, v, flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(args.out, "wt") as f:
        json.dump({"torch": torch.__version__, "orders": orders}, f)
    print(f"{len(orders)} orders written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
