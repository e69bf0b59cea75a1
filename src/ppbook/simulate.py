"""A dependency-driven simulator of pipeline schedules.

Introduced in chapter 3 ("GPipe and the bubble"); the schedules chapter extends it.

A schedule is, for each rank, the *order* in which it runs its actions. The simulator gives
each action a cost and starts it as soon as (a) its rank has finished the previous action in
that order and (b) its inputs have arrived: a forward needs the previous stage's forward of the
same microbatch, a backward the next stage's backward (or, on the last stage, its own forward),
each delayed by a communication latency when the two stages sit on different ranks. It produces
:class:`ppbook.timeline.Event` lists, the same format the recorder writes, so the same code draws
measured and simulated timelines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from ppbook.timeline import Event


@dataclass(frozen=True)
class Action:
    stage: int
    kind: str  # "F" or "B" (later: "I", "W")
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"


Order = dict[int, list[Action]]  # rank -> the actions it runs, in order


def gpipe_order(p: int, m: int) -> Order:
    """GPipe (Huang et al. 2019): every forward, then every backward; stage r on rank r."""
    return {r: [Action(r, "F", i) for i in range(m)] + [Action(r, "B", i) for i in range(m)] for r in range(p)}


def one_f_one_b_order(p: int, m: int) -> Order:
    """1F1B as ``torch.distributed.pipelining.Schedule1F1B`` runs it: stage r warms up with
    min(m, p - r) forwards, then alternates one backward and one forward, then drains."""
    order = {}
    for r in range(p):
        warmup = min(m, p - r)
        acts = [Action(r, "F", i) for i in range(warmup)]
        for i in range(m - warmup):
            acts += [Action(r, "B", i), Action(r, "F", warmup + i)]
        acts += [Action(r, "B", i) for i in range(m - warmup, m)]
        order[r] = acts
    return order


SCHEDULES: dict[str, Callable[[int, int], Order]] = {"GPipe": gpipe_order, "1F1B": one_f_one_b_order}

Costs = Mapping[str, float] | Mapping[tuple[int, str], float] | Callable[[Action], float]


def _cost_fn(costs: Costs) -> Callable[[Action], float]:
    if callable(costs):
        return costs
    def cost(a: Action) -> float:
        if (a.stage, a.kind) in costs:
            return costs[(a.stage, a.kind)]
        if a.kind in costs:
            return costs[a.kind]
        raise KeyError(f"no cost given for {a.kind} on stage {a.stage}")
    return cost


def _dependency(a: Action, num_stages: int) -> Action | None:
    if a.kind == "F":
        return Action(a.stage - 1, "F", a.microbatch) if a.stage > 0 else None
    if a.kind in ("B", "I"):
        if a.stage == num_stages - 1:
            return Action(a.stage, "F", a.microbatch)  # the loss needs this stage's own forward
        return Action(a.stage + 1, a.kind if a.kind == "B" else "I", a.microbatch)
    if a.kind == "W":
        return Action(a.stage, "I", a.microbatch)
    raise ValueError(f"unknown action kind {a.kind!r}")


def simulate(order: Order, costs: Costs, latency: float | Callable[[Action, Action], float] = 0.0,
             overhead: float | Costs = 0.0) -> list[Event]:
    """Run ``order`` with the given per-action ``costs`` and point-to-point ``latency``; each
    action after a rank's first also waits ``overhead`` after the rank's previous action
    (a number, or per kind / per (stage, kind) like ``costs``; missing entries count as zero).
    ``latency`` may be a function of (sending action, receiving action), e.g. to draw each
    hand-off from a measured distribution.

    ``costs`` maps a kind (``{"F": 1, "B": 2}``) or a (stage, kind) pair to seconds, or is a
    function of the :class:`Action`. Raises ``ValueError`` if the order deadlocks (an action
    waits for one that its rank can never reach).
    """
    cost = _cost_fn(costs)
    if isinstance(overhead, (int, float)):
        gap = lambda a: float(overhead)  # noqa: E731
    else:
        given = _cost_fn(overhead)

        def gap(a: Action) -> float:
            try:
                return given(a)
            except KeyError:
                return 0.0
    num_stages = 1 + max(a.stage for acts in order.values() for a in acts)
    rank_of = {a.stage: r for r, acts in order.items() for a in acts}
    done: dict[Action, Event] = {}
    position = {r: 0 for r in order}
    free_at = {r: 0.0 for r in order}
    remaining = sum(len(acts) for acts in order.values())
    while remaining:
        progressed = False
        for r, acts in order.items():
            while position[r] < len(acts):
                a = acts[position[r]]
                dep = _dependency(a, num_stages)
                if dep is not None and dep not in done:
                    break
                hop = 0.0 if dep is None or rank_of[dep.stage] == r else \
                    (latency(dep, a) if callable(latency) else latency)
                ready = 0.0 if dep is None else done[dep].end + hop
                start = max(free_at[r] + (gap(a) if position[r] else 0.0), ready)
                done[a] = Event(r, a.stage, a.kind, a.microbatch, start, start + cost(a))
                free_at[r] = done[a].end
                position[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = {r: str(acts[position[r]]) for r, acts in order.items() if position[r] < len(acts)}
            raise ValueError(f"schedule deadlocks: each rank waits on an action no rank can run: {stuck}")
    return sorted(done.values(), key=lambda e: (e.start, e.rank))
