"""Timing pipeline steps: every rank starts each step together, and each step's timeline is summarised.

Introduced in chapter 2 ("Naive model parallelism"); the GPipe, splitting and schedules chapters
time their steps with it. A step's summary holds what the simulator needs to replay it
(:mod:`ppbook.fit`), but this module does not simulate.
"""

from __future__ import annotations

import time
from statistics import median_high
from typing import Callable

import torch
import torch.distributed as dist

from ppbook import timeline


def timed_steps(step_fn: Callable[[], object], recorder, warmup: int, steps: int, device: torch.device) -> list[dict] | None:
    """Run ``step_fn`` warmup + steps times, all ranks starting each step together after a barrier.

    Returns, on rank 0, one record per measured step: its time (the slowest rank's, from the
    barrier to that rank's last action) and every rank's recorded events. ``None`` on other ranks.
    """
    records = []
    for i in range(warmup + steps):
        dist.barrier()
        recorder.start_step()
        t0 = time.perf_counter()
        step_fn()
        seconds = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        events = timeline.gather(recorder)
        if i >= warmup and events is not None:
            records.append({"seconds": seconds.item(), "events": timeline.to_json(events)})
    return records if dist.get_rank() == 0 else None


def summarise_steps(records: list[dict]) -> dict:
    """Median step (time and timeline), the mean busy fraction per rank, measured action costs,
    and each step's own summary (:func:`step_summary`)."""
    median = sorted(records, key=lambda r: r["seconds"])[len(records) // 2]
    all_events = [timeline.from_json(r["events"]) for r in records]
    steps = [step_summary(ev, r["seconds"]) for ev, r in zip(all_events, records)]
    busy = {r: sum(step["busy"][r] for step in steps) / len(steps) for r in steps[0]["busy"]}
    latency = median_high([timeline.comm_latency(ev) for ev in all_events])
    return {
        "step_seconds": [r["seconds"] for r in records],
        "median_step_seconds": median["seconds"],
        "events": median["events"],
        "busy": busy,
        "costs": {f"{s}{k}": c for (s, k), c in timeline.mean_costs([e for ev in all_events for e in ev]).items()},
        "latency": latency,
        "overheads": {f"{s}{k}": g for (s, k), g in timeline.action_overheads(all_events, latency).items()},
        "steps": steps,
    }


def step_summary(events: list, seconds: float) -> dict:
    """One measured step: its busy fractions and the simulator inputs measured on it alone."""
    latency = timeline.comm_latency(events)
    t0, t1 = timeline.span(events)
    return {
        "seconds": seconds,
        "span": t1 - t0,
        "busy": {str(r): b for r, b in timeline.busy_fractions(events).items()},
        "costs": {f"{s}{k}": c for (s, k), c in timeline.mean_costs(events).items()},
        "handoffs": timeline.handoff_delays(events),
        "gaps": {f"{s}{k}": g for (s, k), g in timeline.own_gaps(events, latency).items()},
        "latency": latency,
        "overheads": {f"{s}{k}": g for (s, k), g in timeline.action_overheads([events], latency).items()},
    }
