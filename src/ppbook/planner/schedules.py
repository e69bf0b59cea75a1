"""torch's seven pipeline schedules as pure functions: where their stages go, which microbatch
counts they accept, and the order of actions each rank runs.

Introduced in chapter 5 ("The schedules"); the simulator and the planner use it. Every function
here is plain Python: ``tests/test_planner_schedules.py`` checks each against torch 2.13 itself
(the schedule classes built on mock stages), on a grid of pipeline sizes, microbatch counts and
stages per rank.

An action is ``(stage, kind, microbatch)`` in torch's notation: ``1F3`` is stage 1's forward of
microbatch 3; ``B`` a full backward, ``I`` the gradient with respect to the input alone, ``W``
the weight gradient that follows it. An *order* maps each rank to the compute actions it runs,
in order; communication is left out (a rank receives what an action needs before running it).

The orders of the looped and V-shaped schedules follow torch's
``_calculate_single_rank_operations`` of each class (``torch/distributed/pipelining/schedules.py``,
BSD licence), with its padding (``None`` slots) dropped: the padding aligns ranks on a step grid
and does not change the order in which a rank computes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Action:
    stage: int
    kind: str  # "F", "B" (full backward), "I" (input gradient) or "W" (weight gradient)
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"


Order = dict[int, list[Action]]  # rank -> the actions it runs, in order

# The seven schedule classes of torch 2.13, by the name after "Schedule".
TORCH_SCHEDULES: tuple[str, ...] = ("GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble",
                                    "ZBVZeroBubble", "DualPipeV")
# How each places its stages: "single" (stage r on rank r: torch's PipelineScheduleSingle), "loop"
# (r, r + p, ...: the multi-stage default) or "v" (r and 2p - 1 - r). tests/test_planner_schedules.py
# checks this against torch's class hierarchy and stage-to-rank maps.
PLACEMENT: dict[str, str] = {"GPipe": "single", "1F1B": "single", "Interleaved1F1B": "loop", "LoopedBFS": "loop",
                             "InterleavedZeroBubble": "loop", "ZBVZeroBubble": "v", "DualPipeV": "v"}
# The schedules that split each backward into I and W (torch keeps part of each microbatch's
# activations until the step ends: ppbook.planner.memory.block_residual_values)
SPLIT_BACKWARD: tuple[str, ...] = ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")


def _known(name: str) -> None:
    if name not in PLACEMENT:
        raise ValueError(f"unknown schedule {name!r}; choose one of {', '.join(TORCH_SCHEDULES)}")


def placement(name: str) -> str:
    """How schedule ``Schedule<name>`` places stages on ranks: ``"single"``, ``"loop"`` or ``"v"``."""
    _known(name)
    return PLACEMENT[name]


def stages_per_rank(name: str, v: int = 2) -> int:
    """Stages each rank holds under ``Schedule<name>``: one, ``v`` for the looped ones, two for the V-shaped."""
    return {"single": 1, "loop": v, "v": 2}[placement(name)]


def stage_to_rank(name: str, p: int, v: int = 2) -> dict[int, int]:
    """Which rank holds each stage: torch's
    ``generate_stage_to_rank_mapping`` (loop or v style)."""
    n = p * stages_per_rank(name, v)
    if placement(name) == "v":
        return {s: s if s < p else 2 * p - 1 - s for s in range(n)}
    return {s: s % p for s in range(n)}


def stage_indices(name: str, rank: int, p: int, v: int = 2) -> list[int]:
    """The stages rank ``rank`` of ``p`` holds under schedule ``name`` (``v`` stages per rank for the
    looped ones; the V-shaped ones always hold two)."""
    return [s for s, r in stage_to_rank(name, p, v).items() if r == rank]


def assign_layers(n_layers: int, num_stages: int) -> list[list[int]]:
    """Split ``range(n_layers)`` into ``num_stages`` contiguous runs whose sizes differ by at most one.

    When the division is uneven the earlier stages get the extra layer, because the last stage
    also carries the norm and the (often large) output head. No layer is ever dropped:
    ``sum(assign_layers(12, 5), [])`` is ``list(range(12))``.

    >>> assign_layers(12, 5)
    [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9], [10, 11]]
    """
    if num_stages < 1:
        raise ValueError(f"num_stages must be at least 1, got {num_stages}")
    if n_layers < num_stages:
        raise ValueError(
            f"cannot give {num_stages} stages at least one layer each from {n_layers} layers; "
            f"use at most {n_layers} stages or a model with at least {num_stages} layers"
        )
    base, extra = divmod(n_layers, num_stages)
    out, start = [], 0
    for stage in range(num_stages):
        size = base + (1 if stage < extra else 0)
        out.append(list(range(start, start + size)))
        start += size
    return out


def schedule_problem(name: str, p: int, m: int, v: int = 2, layers: int | None = None) -> str | None:
    """Why torch's ``Schedule<name>`` cannot run ``m`` microbatches on ``p`` ranks (``v`` stages
    per rank for the looped schedules), as one line that says how to fix it; ``None`` if it can.

    Torch 2.13 raises some of these itself, mid-way through building the schedule, in its own
    words; a wrong stage placement it does not check at all.
    """
    if placement(name) == "loop" and v < 2:
        return f"{name} needs at least 2 stages per rank, got --stages-per-rank {v}; use 2 or more, or Schedule1F1B"
    total = p * stages_per_rank(name, v)
    if layers is not None and layers < total:
        return (f"{name} on {p} processes has {total} stages of at least one layer each, but --layers is {layers}; "
                f"raise --layers to {total} or more")
    if name == "1F1B" and m < p:
        return f"Schedule1F1B needs at least as many microbatches as stages ({p}), got --microbatches {m}; use {p} or more"
    if name == "DualPipeV" and m < total:
        return (f"ScheduleDualPipeV needs at least as many microbatches as stages (2 x {p} = {total}), "
                f"got --microbatches {m}; use {total} or more")
    if name in ("Interleaved1F1B", "InterleavedZeroBubble"):
        rounds = max(1, m // p)
        if m % rounds:
            ok = sorted({k for k in range(1, 4 * m + 1) if k % max(1, k // p) == 0} - {m}, key=lambda k: abs(k - m))[:2]
            return (f"Schedule{name} splits the microbatches into m // p = {rounds} rounds of equal size, so "
                    f"--microbatches {m} must be a multiple of {rounds}; try {' or '.join(map(str, sorted(ok)))}")
    return None


# --- the orders ----------------------------------------------------------------------------------

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


def _looped_bfs(rank: int, p: int, m: int, v: int) -> list[Action]:
    """Breadth first (Lamy-Poirier 2023): each local stage's forwards for every microbatch, then
    the backwards in reverse, last stage first."""
    stages = range(rank, p * v, p)
    acts = [Action(s, "F", i) for s in stages for i in range(m)]
    return acts + [Action(s, "B", i) for s in reversed(stages) for i in reversed(range(m))]


def _warmup_ops(rank: int, v: int, per_round: int, p: int, m: int, factor: int) -> int:
    """torch's ``_get_warmup_ops``: forwards before the first backward on ``rank``."""
    return min((v - 1) * per_round + factor * (p - 1 - rank), m * v)


def _interleaved(rank: int, p: int, m: int, v: int, zero_bubble: bool) -> list[Action]:
    """torch's ``_get_1f1b_rank_ops`` for Interleaved1F1B (depth first, Narayanan et al. 2021)
    and, with ``zero_bubble``, InterleavedZeroBubble (ZB-H1's I/W split, Qi et al. 2023)."""
    rounds = max(1, m // p)
    per_round = m // rounds
    warmup = _warmup_ops(rank, v, per_round, p, m, 1 if zero_bubble else 2)
    fwd_bwd = v * m - warmup
    total = warmup + fwd_bwd + warmup  # warm-up, steady 1F1B, cool-down (as many as the warm-up)

    def fwd_stage(step: int) -> int:
        return (step // per_round) % v * p + rank

    def bwd_stage(step: int) -> int:
        return (v - 1 - ((step - warmup) // per_round) % v) * p + rank

    count = {kind: [0] * v for kind in "FBIW"}  # per local stage (stage // p)

    def take(stage: int, kind: str) -> Action:
        counts = count[kind]
        i = counts[stage // p]
        counts[stage // p] = i + 1
        return Action(stage, kind, i)

    back = "I" if zero_bubble else "B"
    backward_ops: list[int] = []
    weights = 0
    acts: list[Action] = []

    def maybe_weight(op: int) -> None:
        nonlocal weights
        if zero_bubble and op - warmup >= rank:  # num_1f1b_microbatches = rank
            acts.append(take(bwd_stage(backward_ops[weights]), "W"))
            weights += 1

    for op in range(total):
        if op < warmup:
            acts.append(take(fwd_stage(op), "F"))
            continue
        if op < warmup + fwd_bwd:
            acts.append(take(fwd_stage(op), "F"))
        acts.append(take(bwd_stage(op), back))
        backward_ops.append(op)
        maybe_weight(op)
    while zero_bubble and weights < len(backward_ops):
        acts.append(take(bwd_stage(backward_ops[weights]), "W"))
        weights += 1
    return acts


def _zbv(rank: int, p: int, m: int) -> list[Action]:
    """torch's ScheduleZBVZeroBubble (the zero-bubble authors' ZB-V): two stages per rank in a V,
    each backward split into I and W, built for max(2p - 1, m) microbatches and cut to m."""
    n_micro = max(2 * p - 1, m)
    s0, s1 = rank, 2 * p - 1 - rank
    acts: list[Action] = []
    f0 = f1 = b0 = b1 = 0
    for _ in range(2 * (p - rank) - 1):
        acts.append(Action(s0, "F", f0)); f0 += 1
    for _ in range(rank):
        acts.append(Action(s1, "F", f1)); f1 += 1
        acts.append(Action(s0, "F", f0)); f0 += 1
    for _ in range(p - rank):
        acts.append(Action(s1, "F", f1)); f1 += 1
        acts += [Action(s1, "I", b1), Action(s1, "W", b1)]; b1 += 1
    while f1 < f0 or f0 < n_micro:
        if f0 < n_micro:
            acts.append(Action(s0, "F", f0)); f0 += 1
        acts += [Action(s0, "I", b0), Action(s0, "W", b0)]; b0 += 1
        acts.append(Action(s1, "F", f1)); f1 += 1
        acts += [Action(s1, "I", b1), Action(s1, "W", b1)]; b1 += 1
    w0, w1 = b0, b1
    for _ in range(rank):
        acts.append(Action(s0, "I", b0)); b0 += 1
        acts.append(Action(s1, "I", b1)); b1 += 1
    for _ in range(p - rank):
        acts.append(Action(s0, "I", b0)); b0 += 1
        acts.append(Action(s0, "W", w0)); w0 += 1
    acts += [Action(s1, "W", i) for i in range(w1, b1)]
    acts += [Action(s0, "W", i) for i in range(w0, b0)]
    return [a for a in acts if a.microbatch < m]


def _dualpipev(rank: int, p: int, m: int, pairs: list[Action] | None = None) -> list[Action]:
    """torch's ScheduleDualPipeV (DeepSeek-V3's DualPipe cut in half): two stages per rank in a V;
    an overlapped forward-backward (``OVERLAP_F_B``) becomes its two sub-actions, F then B, which
    torch's runtime runs one after the other. The forward of each such pair is appended to
    ``pairs`` when given (:func:`overlapped_forwards`)."""
    s0, s1 = rank, 2 * p - 1 - rank
    count: dict[tuple[int, str], int] = {}
    queue: list[tuple[int, int]] = []  # (stage, microbatch) of I passes whose W is pending
    acts: list[Action] = []

    def add(stage: int, kind: str) -> None:
        key = (stage, "I" if kind == "B" else kind)
        i = count.get(key, 0)
        acts.append(Action(stage, kind, i))
        if kind == "B":  # a full backward counts as an I and a W
            count[(stage, "I")] = i + 1
            count[(stage, "W")] = count.get((stage, "W"), 0) + 1
        else:
            if kind == "I":
                queue.append((stage, i))
            count[key] = i + 1

    def weight() -> None:
        if queue:
            stage, i = queue.pop(0)
            acts.append(Action(stage, "W", i))
            count[(stage, "W")] = count.get((stage, "W"), 0) + 1

    def overlap(forward: int, backward: int) -> None:
        add(forward, "F")
        if pairs is not None:
            pairs.append(acts[-1])
        add(backward, "B")

    for _ in range((p - rank - 1) * 2):                      # 1: F0
        add(s0, "F")
    for _ in range(rank + 1):                                # 2: F0 F1
        add(s0, "F"); add(s1, "F")
    for _ in range(p - rank - 1):                            # 3: I1 W1 F1
        add(s1, "I"); weight(); add(s1, "F")
    for i in range(m - 2 * p + rank + 1):                    # 4: F0B1 F1B0, overlapped
        if i == 0 and rank == p - 1:
            add(s0, "F"); add(s1, "B")
        else:
            overlap(s0, s1)
        overlap(s1, s0)
    for _ in range(p - rank - 1):                            # 5: B1 F1B0
        add(s1, "B"); overlap(s1, s0)
    zero_bubble = False
    for i in range(rank + 1):                                # 6: B1 B0, the second half split
        if i == (rank + 1) // 2 and rank % 2 == 1:
            zero_bubble = True
        add(s1, "I" if zero_bubble else "B")
        if i == (rank + 1) // 2 and rank % 2 == 0:
            zero_bubble = True
        add(s0, "I" if zero_bubble else "B")
    for _ in range(p - rank - 1):                            # 7: W0 B0
        weight(); add(s0, "I" if zero_bubble else "B")
    for _ in range(rank + 1):                                # 8: W0
        weight()
    return acts


def overlapped_forwards(name: str, p: int, m: int, v: int = 2) -> frozenset[Action]:
    """The forwards that torch's ``Schedule<name>`` runs in an ``OVERLAP_F_B`` pair (DualPipeV's
    steady state; none for the other schedules): in :func:`order`, each is followed on its rank
    by the backward it is paired with. Every other action of the order runs alone (DualPipeV's
    warm-up forwards and cool-down backwards)."""
    if name != "DualPipeV":
        return frozenset()
    pairs: list[Action] = []
    for r in range(p):
        _dualpipev(r, p, m, pairs)
    return frozenset(a for a in pairs if a.microbatch < m)


HAND_WRITTEN_ORDERS: dict[str, Callable[[int, int], Order]] = {"GPipe": gpipe_order, "1F1B": one_f_one_b_order}


def order(name: str, p: int, m: int, v: int = 2) -> Order:
    """Each rank's compute actions under torch's ``Schedule<name>`` with ``p`` ranks, ``m``
    microbatches and ``v`` stages per rank (looped schedules; the V-shaped hold two): torch's own
    order, without building torch's schedule. A constraint torch enforces (:func:`schedule_problem`)
    is a ``ValueError``."""
    _known(name)
    if p < 1 or m < 1:
        raise ValueError(f"need p >= 1 and m >= 1, got p = {p}, m = {m}")
    problem = schedule_problem(name, p, m, v)
    if problem:
        raise ValueError(problem)
    if name in HAND_WRITTEN_ORDERS:
        return HAND_WRITTEN_ORDERS[name](p, m)
    build = {"LoopedBFS": lambda r: _looped_bfs(r, p, m, v),
             "Interleaved1F1B": lambda r: _interleaved(r, p, m, v, False),
             "InterleavedZeroBubble": lambda r: _interleaved(r, p, m, v, True),
             "ZBVZeroBubble": lambda r: _zbv(r, p, m),
             "DualPipeV": lambda r: _dualpipev(r, p, m)}[name]
    return {r: build(r) for r in range(p)}
