"""Record what every rank of a pipeline did and when, and draw it.

Introduced in chapter 2 ("Naive model parallelism"); the GPipe and schedules chapters use it.

A timeline is a list of events, one per action, in torch's notation: stage 1, forward,
microbatch 3 is ``1F3`` (``F`` forward, ``B`` full backward, ``I`` input-gradient backward,
``W`` weight-gradient backward). The recorder and the simulator (:mod:`ppbook.simulate`) produce
the same format, so one plotting function draws both.

The recorder times the three methods every schedule of ``torch.distributed.pipelining`` calls on
a stage (``forward_one_chunk``, ``backward_one_chunk``, ``backward_weight_one_chunk``) by
wrapping them on the stage *instance*; torch itself is not patched. Receives are waited on
before those calls, so a recorded action is computation and the gaps are waiting. A hand-written
pipeline records its actions with :meth:`Recorder.span`.
"""

from __future__ import annotations

import functools
import time
from statistics import median_high
from contextlib import contextmanager
from dataclasses import asdict

from ppbook.dataflow import waits_on
from ppbook.planner.events import Event  # the format, shared with the torch-free simulator

KIND_COLOURS = {"F": "#4C72B0", "B": "#DD8452", "I": "#C44E52", "W": "#55A868"}


class Recorder:
    """Collects this rank's events for one step at a time."""

    def __init__(self, rank: int):
        self.rank = rank
        self.events: list[Event] = []

    def start_step(self) -> None:
        """Forget the events of earlier steps."""
        self.events = []

    @contextmanager
    def span(self, stage: int, kind: str, microbatch: int):
        # perf_counter is CLOCK_MONOTONIC on Linux: one clock for every process on the host, so
        # the ranks' events line up without a per-rank offset (each rank starting its own clock
        # after a barrier skews them by the barrier's exit jitter, up to a millisecond).
        start = time.perf_counter()
        try:
            yield
        finally:
            self.events.append(Event(self.rank, stage, kind, microbatch, start, time.perf_counter()))

    def attach(self, stage) -> None:
        """Time every action a torch schedule runs on ``stage`` (a ``PipelineStage``)."""
        index = stage.stage_index

        def wrap(method, kind_of):
            @functools.wraps(method)
            def timed(chunk_id, *args, **kwargs):
                with self.span(index, kind_of(kwargs), chunk_id):
                    return method(chunk_id, *args, **kwargs)
            return timed

        stage.forward_one_chunk = wrap(stage.forward_one_chunk, lambda kw: "F")
        # full_backward=False computes only input gradients (zero-bubble schedules split B into I and W)
        stage.backward_one_chunk = wrap(stage.backward_one_chunk,
                                        lambda kw: "B" if kw.get("full_backward", True) else "I")
        stage.backward_weight_one_chunk = wrap(stage.backward_weight_one_chunk, lambda kw: "W")


def to_json(events: list[Event]) -> list[dict]:
    return [asdict(e) for e in events]


def from_json(rows: list[dict]) -> list[Event]:
    return [Event(**row) for row in rows]


def gather(recorder: Recorder) -> list[Event] | None:
    """Every rank's events on rank 0, sorted, with times from the step's first action; ``None``
    elsewhere. Ranks on one host share the clock; across hosts this assumes synchronised clocks."""
    import torch.distributed as dist

    from ppbook.dist import gather_to_rank0

    out = gather_to_rank0(to_json(recorder.events)) if dist.is_initialized() else [to_json(recorder.events)]
    if out is None:
        return None
    events = [e for rows in out for e in from_json(rows)]
    t0 = min((e.start for e in events), default=0.0)
    return sorted((Event(e.rank, e.stage, e.kind, e.microbatch, e.start - t0, e.end - t0) for e in events),
                  key=lambda e: e.start)


# ---------------------------------------------------------------------------------------------
# Reading a timeline
# ---------------------------------------------------------------------------------------------
def span(events: list[Event]) -> tuple[float, float]:
    """From the first action's start to the last action's end: the step as the pipeline saw it."""
    return min(e.start for e in events), max(e.end for e in events)


def busy_fraction(events: list[Event], rank: int) -> float:
    """Share of the step during which ``rank`` was computing (the rest is bubble or waiting)."""
    t0, t1 = span(events)
    return sum(e.duration for e in events if e.rank == rank) / (t1 - t0)


def busy_fractions(events: list[Event]) -> dict[int, float]:
    return {r: busy_fraction(events, r) for r in sorted({e.rank for e in events})}


def mean_costs(events: list[Event]) -> dict[tuple[int, str], float]:
    """Mean duration of each (stage, kind): the costs to feed the simulator."""
    sums: dict[tuple[int, str], list[float]] = {}
    for e in events:
        sums.setdefault((e.stage, e.kind), []).append(e.duration)
    return {k: sum(v) / len(v) for k, v in sums.items()}


def handoff_delays(events: list[Event]) -> list[float]:
    """For every action whose input came from another rank that was already waiting for it:
    the delay from the sender finishing to the receiver starting (one hand-off, measured)."""
    by_key = {(e.stage, e.kind, e.microbatch): e for e in events}
    num_stages = 1 + max((e.stage for e in events), default=0)
    free_at: dict[int, float] = {}
    delays = []
    for e in sorted(events, key=lambda e: e.start):
        dep = _dependency_of(e, by_key, num_stages)
        if dep is not None and dep.rank != e.rank and free_at.get(e.rank, 0.0) <= dep.end:
            delays.append(e.start - dep.end)
        free_at[e.rank] = e.end
    return delays


def comm_latency(events: list[Event]) -> float:
    """Median hand-off delay (:func:`handoff_delays`): the typical cost of one point-to-point hand-off."""
    delays = handoff_delays(events)
    return median_high(delays) if delays else 0.0


def _dependency_of(e: Event, by_key: dict, num_stages: int) -> Event | None:
    """The recorded event ``e`` waited on (:func:`ppbook.dataflow.waits_on`), if it was recorded."""
    dep = waits_on(e.stage, e.kind, e.microbatch, num_stages, by_key.__contains__)
    return None if dep is None else by_key.get(dep)


def own_gaps(events: list[Event], latency: float) -> dict[tuple[int, str], list[float]]:
    """The gap before each action that did not wait for a peer (its input had arrived, given the
    hand-off ``latency``), grouped by (stage, kind): time a rank spends between actions on its own."""
    by_key = {(e.stage, e.kind, e.microbatch): e for e in events}
    num_stages = 1 + max((e.stage for e in events), default=0)
    gaps: dict[tuple[int, str], list[float]] = {}
    for rank in {e.rank for e in events}:
        mine = sorted((e for e in events if e.rank == rank), key=lambda e: e.start)
        for prev, cur in zip(mine, mine[1:]):
            dep = _dependency_of(cur, by_key, num_stages)
            if dep is None or dep.rank == rank or dep.end + latency <= prev.end:
                gaps.setdefault((cur.stage, cur.kind), []).append(cur.start - prev.end)
    return gaps


def action_overheads(steps: list[list[Event]], latency: float) -> dict[tuple[int, str], float]:
    """Median :func:`own_gaps` per (stage, kind), pooled over the timelines of several steps.

    They differ by kind: schedule bookkeeping and the loss are small, but on a busy 2-core host
    a backward whose gradient was sent while its rank was still busy can wait milliseconds for
    the sender's communication thread, which competes with the sender's compute for a core."""
    pooled: dict[tuple[int, str], list[float]] = {}
    for events in steps:
        for key, values in own_gaps(events, latency).items():
            pooled.setdefault(key, []).extend(values)
    return {key: median_high(v) for key, v in pooled.items()}


def plot(events: list[Event], ax=None, title: str | None = None, labels: bool = True, time_unit: str = "ms"):
    """A per-rank Gantt chart: one row per rank, one bar per action, white gaps are idle time."""
    import matplotlib.pyplot as plt

    scale = {"s": 1.0, "ms": 1e3}[time_unit]
    ax = ax or plt.gca()
    t0, t1 = span(events)
    ranks = sorted({e.rank for e in events})
    for e in events:
        x, w = (e.start - t0) * scale, e.duration * scale
        ax.barh(e.rank, w, left=x, height=0.8, color=KIND_COLOURS[e.kind], edgecolor="white", linewidth=0.5)
        if labels and w > 0.035 * (t1 - t0) * scale:
            ax.text(x + w / 2, e.rank, e.label, ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(ranks, [f"rank {r}" for r in ranks])
    ax.set_ylim(max(ranks) + 0.6, min(ranks) - 0.6)
    # Axes made with sharex=True share one x-limit: setting it to this timeline's span would cut
    # every longer timeline drawn before (the last one drawn wins). Extend it, never shrink it.
    ax._ppbook_drawn_end = (t1 - t0) * scale
    ax.set_xlim(0, max(getattr(a, "_ppbook_drawn_end", 0.0) for a in ax.get_shared_x_axes().get_siblings(ax)))
    ax.set_xlabel(f"time ({time_unit})")
    if title:
        ax.set_title(title, fontsize=10, loc="left")
    return ax


def cut_bars(fig) -> list[str]:
    """Every bar of ``fig`` that ends beyond its axis's right x-limit, as ``"title: label"``
    (empty when every drawn timeline ends within its axis). Chapters check their timeline
    figures with it, so that a figure cannot hide the end of a schedule."""
    from matplotlib.patches import Rectangle

    cut = []
    for ax in fig.axes:
        right = ax.get_xlim()[1]
        for bar in ax.patches:
            if isinstance(bar, Rectangle) and bar.get_x() + bar.get_width() > right * (1 + 1e-9) + 1e-12:
                cut.append(f"{ax.get_title(loc='left')}: bar ending at {bar.get_x() + bar.get_width():g}")
    return cut
