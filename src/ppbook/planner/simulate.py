"""A dependency-driven simulator of pipeline schedules.

Introduced in chapter 2 ("Naive model parallelism"), which replays its measured timeline; chapter 3
("GPipe and the bubble") and the schedules chapter extend it, and the planner simulates every
candidate with it.

A schedule is, for each rank, the *order* in which it runs its actions
(:func:`ppbook.planner.schedules.order`). The simulator gives each action a cost and starts it as
soon as (a) its rank has finished the previous action in that order and (b) its inputs have
arrived: a forward needs the previous stage's forward of the same microbatch, a backward the next
stage's backward (or, on the last stage, its own forward), each delayed by a communication latency
when the two stages sit on different ranks (the rule is :func:`ppbook.planner.dataflow.waits_on`,
which also reads recorded timelines). It produces :class:`ppbook.planner.events.Event` lists, the
same format the recorder writes, so the same code draws measured and simulated timelines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from ppbook.planner.dataflow import waits_on
from ppbook.planner.events import Event
from ppbook.planner.schedules import Action, Order

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


def _dependency(a: Action, num_stages: int, present: set[Action] | None = None) -> Action | None:
    """The action ``a`` waits on (:func:`ppbook.planner.dataflow.waits_on`), among ``present`` if given."""
    has = (lambda key: True) if present is None else (lambda key: Action(*key) in present)
    dep = waits_on(a.stage, a.kind, a.microbatch, num_stages, has)
    return None if dep is None else Action(*dep)


@dataclass(frozen=True)
class Compiled:
    """An order as flat lists the simulator walks quickly: every action once (rank by rank, in
    order), the index of the action it waits on (-1: none), and whether that one runs on
    another rank (a hand-off)."""
    actions: tuple[Action, ...]
    ranks: tuple[int, ...]          # the rank of each action
    rank_slices: tuple[tuple[int, int, int], ...]  # (rank, first index, end index)
    dep: tuple[int, ...]
    remote: tuple[bool, ...]


def compile_order(order: Order) -> Compiled:
    actions, ranks, slices = [], [], []
    for r, acts in order.items():
        slices.append((r, len(actions), len(actions) + len(acts)))
        actions += acts
        ranks += [r] * len(acts)
    index = {(a.stage, a.kind, a.microbatch): i for i, a in enumerate(actions)}
    num_stages = 1 + max(a.stage for a in actions)
    has = index.__contains__
    dep, remote = [], []
    for i, a in enumerate(actions):
        d = waits_on(a.stage, a.kind, a.microbatch, num_stages, has)
        j = -1 if d is None else index[d]
        dep.append(j)
        remote.append(j >= 0 and ranks[j] != ranks[i])
    return Compiled(tuple(actions), tuple(ranks), tuple(slices), tuple(dep), tuple(remote))


def run(c: Compiled, cost: list[float], hop: list[float] | None = None,
        gap: list[float] | None = None) -> tuple[list[float], list[float]]:
    """Start and end times of every action of ``c``: ``cost[i]`` seconds each, ``hop[i]`` seconds
    of hand-off when its input comes from another rank, ``gap[i]`` seconds after the rank's
    previous action. A ``ValueError`` if the order deadlocks."""
    n = len(c.actions)
    start, end = [0.0] * n, [-1.0] * n
    position = [lo for _, lo, _ in c.rank_slices]
    free_at = [0.0] * len(c.rank_slices)
    remaining = n
    while remaining:
        progressed = False
        for k, (_, lo, hi) in enumerate(c.rank_slices):
            i = position[k]
            while i < hi:
                j = c.dep[i]
                if j >= 0 and end[j] < 0:
                    break
                ready = 0.0 if j < 0 else end[j] + (hop[i] if hop is not None and c.remote[i] else 0.0)
                t = max(free_at[k] + (gap[i] if gap is not None and i > lo else 0.0), ready)
                start[i], end[i] = t, t + cost[i]
                free_at[k] = end[i]
                i += 1
                remaining -= 1
                progressed = True
            position[k] = i
        if not progressed:
            stuck = {r: str(c.actions[position[k]]) for k, (r, _, hi) in enumerate(c.rank_slices) if position[k] < hi}
            raise ValueError(f"schedule deadlocks: each rank waits on an action no rank can run: {stuck}")
    return start, end


def pair_slots(f: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    """The two slots of a DualPipeV pair (``OVERLAP_F_B``) run on a GPU as DeepSeek-V3's DualPipe
    runs its forward-and-backward chunk pairs (DeepSeek-AI 2024, section 3.2.1), from each half's
    ``(compute, all-to-all)`` seconds. The two computations share the GPU and take turns; while
    one half computes, the other half's dispatch and combine run on the SMs set aside for
    communication. So the forward's computation runs beside the backward's all-to-alls, and the
    backward's computation beside the forward's:

        pair = max(F compute, B all-to-all) + max(B compute, F all-to-all)

    returned as (the forward's slot, the backward's slot). It is at least both computations
    (``F compute + B compute``) and at least each half alone (compute plus its own
    all-to-all, :func:`ppbook.overlap.pair_cost`'s terms): the form the chapter-13 pair takes when
    the halves alternate by whole chunks, each layer's pieces in the same proportions. An action
    outside a pair hides nothing: it pays its computation and its all-to-alls one after the
    other."""
    (cf, af), (cb, ab) = f, b
    return max(cf, ab), max(cb, af)


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
    c = compile_order(order)
    hops = [(latency(c.actions[c.dep[i]], a) if callable(latency) else latency) if c.remote[i] else 0.0
            for i, a in enumerate(c.actions)]
    start, end = run(c, [cost(a) for a in c.actions], hops, [gap(a) for a in c.actions])
    events = [Event(r, a.stage, a.kind, a.microbatch, s, e) for a, r, s, e in zip(c.actions, c.ranks, start, end)]
    return sorted(events, key=lambda e: (e.start, e.rank))


def peak_in_flight(order: Order, by: str = "stage") -> dict[int, int]:
    """Per stage (or per rank, ``by="rank"``, counting a microbatch once per stage it is held on), the most microbatches whose activations it holds at once under ``order``: from
    a microbatch's forward until the pass that frees its saved tensors (a full backward ``B``, or
    the weight-gradient pass ``W`` that follows an ``I``). A rank runs its actions one at a time,
    so this follows from the order alone, whatever the timings."""
    held: dict[int, int] = {}
    peak: dict[int, int] = {}
    for rank, acts in order.items():
        for a in acts:
            key = a.stage if by == "stage" else rank
            held[key] = held.get(key, 0) + {"F": 1, "B": -1, "W": -1}.get(a.kind, 0)
            peak[key] = max(peak.get(key, 0), held[key])
    return dict(sorted(peak.items()))


def messages(order: Order) -> int:
    """Point-to-point hand-offs in one step: actions whose input comes from another rank."""
    num_stages = 1 + max(a.stage for acts in order.values() for a in acts)
    present = {a for acts in order.values() for a in acts}
    rank_of = {a.stage: r for r, acts in order.items() for a in acts}
    return sum(1 for r, acts in order.items() for a in acts
               if (dep := _dependency(a, num_stages, present)) is not None and rank_of[dep.stage] != r)
