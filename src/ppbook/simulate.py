"""A dependency-driven simulator of pipeline schedules.

Introduced in chapter 2 ("Naive model parallelism"), which replays its measured timeline; chapter 3
("GPipe and the bubble") and the schedules chapter extend it.

A schedule is, for each rank, the *order* in which it runs its actions. The simulator gives
each action a cost and starts it as soon as (a) its rank has finished the previous action in
that order and (b) its inputs have arrived: a forward needs the previous stage's forward of the
same microbatch, a backward the next stage's backward (or, on the last stage, its own forward),
each delayed by a communication latency when the two stages sit on different ranks (the rule is
:func:`ppbook.dataflow.waits_on`, which also reads recorded timelines). It produces
:class:`ppbook.timeline.Event` lists, the same format the recorder writes, so the same code draws
measured and simulated timelines.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Mapping

from ppbook.dataflow import waits_on
from ppbook.stages import stages_per_rank
from ppbook.timeline import Event


@dataclass(frozen=True)
class Action:
    stage: int
    kind: str  # "F", "B" (full backward), "I" (input gradient) or "W" (weight gradient)
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


# The two orders written out here, by the name torch's schedule class has after "Schedule".
HAND_WRITTEN_ORDERS: dict[str, Callable[[int, int], Order]] = {"GPipe": gpipe_order, "1F1B": one_f_one_b_order}


def torch_order(name: str, p: int, m: int, v: int = 2) -> Order:
    """Each rank's compute actions, in order, as torch's schedule class ``Schedule<name>`` builds
    them (with mock stages: no process group). An overlapped forward-backward of DualPipeV
    becomes its two sub-actions, which the runtime runs one after the other; communication and
    gradient-reduction actions are left out.

    ``Schedule1F1B`` is the exception: torch 2.13 describes it with ``_get_pipeline_order``,
    which is wrong for the last rank only (p - 1 - rank == 0, no warm-up forwards: rank 1 of 2 at
    m = 4 starts with ``1F1`` and lists a microbatch 4 that does not exist; ranks before it are
    right), while its ``step`` runs :func:`one_f_one_b_order`; so
    that is what this returns. Torch's own errors (m too small, m not a multiple of the rounds)
    pass through as ``ValueError``.
    """
    return {rank: list(acts) for rank, acts in _torch_order(name, p, m, v).items()}  # a copy: callers may edit


@functools.lru_cache(maxsize=256)
def _torch_order(name: str, p: int, m: int, v: int) -> Order:  # some orders take torch seconds to build at p = 8
    if name == "1F1B":
        if m < p:
            raise ValueError(f"Number of microbatches ({m}) must be greater than or equal to the number of stages ({p}).")
        return one_f_one_b_order(p, m)
    return _from_torch(schedule_ops(name, p, m, stages_per_rank(name, v)))


def schedule_ops(name: str, p: int, m: int, per_rank: int) -> list[list]:
    """Each rank's actions as torch's ``Schedule<name>`` lists them in ``pipeline_order``: what
    torch's ``_schedule_visualizer.get_schedule_ops(name, p, m, num_stages_per_rank=per_rank)``
    returns, built the same way (the class instantiated on mock stages), but with a plain
    ``NonCallableMagicMock(spec=PipelineStage)``: torch makes its mock with ``create_autospec``,
    which takes about 80 ms per call, most of the time of a small order.
    ``tests/test_schedules.py`` checks that both give the same actions."""
    from unittest import mock

    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class
    from torch.distributed.pipelining.stage import PipelineStage

    schedule_class = get_schedule_class(name)
    stage = mock.NonCallableMagicMock(spec=PipelineStage)
    stage.group_rank, stage.group_size, stage.submod, stage.num_stages = 0, p, None, per_rank * p
    single = issubclass(schedule_class, PipelineScheduleSingle)
    schedule = schedule_class(stage if single else [stage] * per_rank, m)
    return [schedule.pipeline_order[rank] for rank in range(p)]


def _from_torch(ops) -> Order:
    kinds = {"FORWARD": "F", "FULL_BACKWARD": "B", "BACKWARD_INPUT": "I", "BACKWARD_WEIGHT": "W"}
    order: Order = {}
    for rank, acts in enumerate(ops):
        flat = [sub for a in acts if a is not None for sub in (a.sub_actions or (a,))]
        order[rank] = [Action(a.stage_index, kinds[a.computation_type.name], a.microbatch_index)
                       for a in flat if a.computation_type.name in kinds]
    return order


def zb_h1_order(p: int, m: int) -> Order:
    """ZB-H1 (Qi et al. 2023): 1F1B with each backward split into I and W, and W passes moved
    into the bubbles. This is torch's ``ScheduleInterleavedZeroBubble`` (which implements the
    paper's ZB-H1, "ZB1P") given one stage per rank instead of several, built with mock stages."""
    from unittest import mock

    from torch.distributed.pipelining.schedules import ScheduleInterleavedZeroBubble
    from torch.distributed.pipelining.stage import PipelineStage

    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.group_rank, stage.group_size, stage.submod, stage.num_stages = 0, p, None, p
    schedule = ScheduleInterleavedZeroBubble([stage], m)
    return _from_torch([schedule.pipeline_order[r] for r in range(p)])

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
    """The action ``a`` waits on (:func:`ppbook.dataflow.waits_on`), among ``present`` if given."""
    has = (lambda key: True) if present is None else (lambda key: Action(*key) in present)
    dep = waits_on(a.stage, a.kind, a.microbatch, num_stages, has)
    return None if dep is None else Action(*dep)


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
    present = {a for acts in order.values() for a in acts}
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
                dep = _dependency(a, num_stages, present)
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
