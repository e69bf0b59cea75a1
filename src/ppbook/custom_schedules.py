"""Two schedules torch does not ship, as orders that torch's runtime runs: ZB-H2 and V-Half.

Introduced in chapter 14 ("Write your own schedule"). Plain Python, like the planner's orders
(:mod:`ppbook.planner.schedules`): an order maps each rank to the compute actions it runs, in
torch's notation (``1F3``: stage 1, forward, microbatch 3; ``I`` the input-gradient pass, ``W``
the weight-gradient pass). :func:`to_csv` writes an order in the format torch's
``_PipelineScheduleRuntime._load_csv`` reads (one row per rank, compute actions only); the
runtime inserts the sends and receives itself.

- :func:`zb_h2_order`: ZB-H2 of Qi et al. 2024 (ICLR; section 2.2), one stage per rank: more forwards
  in the warm-up (up to 2p - 1 microbatches held), weight passes pushed to fill the tail.
- :func:`v_half_order`: V-Half of Qi et al. 2024 ("Pipeline Parallelism with Controllable
  Memory"): two stages per rank in a V (r and 2p - 1 - r), built the paper's way, from a
  building block repeated every six slots and then squeezed, holding about half of 1F1B's
  activations. A variant of the authors' construction: every rank's order differs from their
  generator's, with the same peak memory and, at equal costs, the same step time.

Both are built for equal costs (F = I = W); a runtime that runs each action as soon as its
input has arrived turns any order into a timeline, whatever the real costs.
"""

from __future__ import annotations

import re

from ppbook.planner.schedules import Action, Order

Slots = dict[Action, tuple[int, int]]  # action -> (rank, time slot)


# --- ZB-H2 -------------------------------------------------------------------------------------

def zb_h2_order(p: int, m: int) -> Order:
    """ZB-H2 (Qi et al. 2024, ICLR): stage r on rank r, each backward split
    into ``I`` and ``W``.

    Built by one rule, run for a forward, an input-gradient pass and a
    weight-gradient pass of one time unit each: whenever a rank is free
    it runs, of the actions whose input has arrived, the next ``I``;
    else the next ``F``, if it holds fewer than 2p - 1 microbatches
    (forward done, weight pass not); else its oldest pending ``W``. The
    warm-up then has 2(p - r) - 1 forwards on rank r, and the weight
    passes that find no gap collect at the end. At equal costs every
    rank computes without a gap from its first action to its last: the
    paper's parallelogram.
    """
    _check(p, m)
    limit = 2 * p - 1
    end: dict[Action, float] = {}
    free = [0.0] * p
    forwards, backwards = [0] * p, [0] * p  # next F and next I per rank
    weights: list[list[int]] = [[] for _ in range(p)]  # W's pending
    order: Order = {r: [] for r in range(p)}

    def arrived(a: Action) -> float | None:
        """When the input of ``a`` is there; None: not known yet."""
        mb = a.microbatch
        if a.kind == "F":
            return 0.0 if a.stage == 0 else end.get(Action(a.stage - 1, "F", mb))
        if a.stage == p - 1:  # the loss: this stage's own forward
            return end.get(Action(a.stage, "F", mb))
        return end.get(Action(a.stage + 1, "I", mb))

    def proposal(r: int) -> tuple[float, int, Action] | None:
        options = []  # (when its input is there, rank by the rule, action)
        if backwards[r] < forwards[r]:
            a = Action(r, "I", backwards[r])
            if (t := arrived(a)) is not None:
                options.append((t, 0, a))
        held = forwards[r] - (backwards[r] - len(weights[r]))
        if forwards[r] < m and held < limit:
            a = Action(r, "F", forwards[r])
            if (t := arrived(a)) is not None:
                options.append((t, 1, a))
        if weights[r]:
            options.append((free[r], 2, Action(r, "W", weights[r][0])))
        now = [o for o in options if o[0] <= free[r]]
        if now:  # something can run at once: the rule decides
            return free[r], r, min(now, key=lambda o: o[1])[2]
        if options:  # wait for the first input to arrive
            t, _, a = min(options, key=lambda o: (o[0], o[1]))
            return t, r, a
        return None

    for _ in range(3 * p * m):
        t, r, a = min(filter(None, map(proposal, range(p))))
        end[a] = free[r] = t + 1.0
        order[r].append(a)
        if a.kind == "F":
            forwards[r] += 1
        elif a.kind == "I":
            backwards[r] += 1
            weights[r].append(a.microbatch)
        else:
            weights[r].pop(0)
    return order


# --- V-Half ------------------------------------------------------------------------------------

def v_half_order(p: int, m: int) -> Order:
    """V-Half (Qi et al. 2024): stages r and 2p - 1 - r on rank r, each backward split into
    ``I`` and ``W``, about half of 1F1B's activation memory.

    Built as the paper builds its schedules, in time slots of one pass each: (1) the V-Half
    building block gives each rank the slots of one microbatch's four passes (forward and input
    gradient of each of its two stages), repeated every six slots; (2) weight passes fill the
    free slots, oldest first; (3) squeezed: in slot order, every pass moves to the earliest
    free slot its inputs allow, unless that raises its rank's peak memory; then once more
    with the weight passes taken out (each free slot runs one pending weight pass) and put
    back in the free slots. The order of each rank is its slots, in time order.
    """
    _check(p, m)
    slots = _squeeze(_fill_weights(_v_half_block(p, m), p), p)
    slots = _fill_weights(_squeeze({a: s for a, s in slots.items() if a.kind != "W"}, p), p)
    order: Order = {r: [] for r in range(p)}
    for a, (r, _) in sorted(slots.items(), key=lambda item: item[1][1]):
        order[r].append(a)
    return order


def _v_half_block(p: int, m: int) -> Slots:
    """The V-Half building block (Qi et al. 2024; the offsets of the
    authors' generator, ``stable_pattern_v_half``): on rank r,
    microbatch k's forward of stage r at slot 2r, forward of stage
    2p-1-r at 3p-2-r, input gradient of stage 2p-1-r at 3p+d+2r-1 and
    of stage r at 6p+d-r-2 (d = 3 for even p, 0 for odd), plus 6k.
    Two slots in every six stay free, for the weight passes."""
    d = 3 if p % 2 == 0 else 0
    slots: Slots = {}
    for r in range(p):
        first, second = r, 2 * p - 1 - r  # the V: stages r and 2p-1-r
        for k in range(m):
            block = ((2 * r, Action(first, "F", k)),
                     (3 * p - 2 - r, Action(second, "F", k)),
                     (3 * p + d + 2 * r - 1, Action(second, "I", k)),
                     (6 * p + d - r - 2, Action(first, "I", k)))
            for t, a in block:
                slots[a] = (r, t + 6 * k)  # (rank, time slot)
    return slots


def _fill_weights(slots: Slots, p: int) -> Slots:
    """Each rank's weight passes in its free slots, in the order of their input-gradient passes."""
    slots = dict(slots)
    for r in range(p):
        line = {t: a for a, (rank, t) in slots.items() if rank == r}
        pending, t = [], 0
        todo = sum(1 for a in line.values() if a.kind == "I")
        while todo:
            if t in line:
                if line[t].kind == "I":
                    pending.append(line[t])
            elif pending:
                i = pending.pop(0)
                slots[Action(i.stage, "W", i.microbatch)] = (r, t)
                todo -= 1
            t += 1
    return slots


def _peak_held(line: dict[int, Action]) -> int:
    """The most microbatch-stages a rank holds at once (forward done, weight pass not), its
    passes at the given slots; without weight passes in ``line``, every free slot runs one."""
    explicit = any(a.kind == "W" for a in line.values())
    held = peak = waiting = 0
    for t in range(max(line) + 1):
        a = line.get(t)
        if a is None:
            if not explicit and waiting:
                held, waiting = held - 1, waiting - 1
        elif a.kind == "F":
            held += 1
        elif a.kind == "I":
            waiting += 1
        else:
            held -= 1
        peak = max(peak, held)
    return peak


def _inputs(a: Action, num_stages: int) -> list[Action]:
    if a.kind == "F":
        return [Action(a.stage - 1, "F", a.microbatch)] if a.stage else []
    if a.kind == "I":
        last = a.stage == num_stages - 1
        return [Action(a.stage, "F", a.microbatch) if last else Action(a.stage + 1, "I", a.microbatch)]
    return [Action(a.stage, "I", a.microbatch)]


def _squeeze(slots: Slots, p: int) -> Slots:
    """Move every pass, in slot order, to the earliest free slot after its inputs and after the
    same pass of the previous microbatch, if its rank's peak memory does not grow."""
    slots = dict(slots)
    lines = {r: {t: a for a, (rank, t) in slots.items() if rank == r} for r in range(p)}
    for a in sorted(slots, key=lambda a: (slots[a][1], slots[a][0])):
        r, t = slots[a]
        after = [slots[d][1] for d in _inputs(a, 2 * p)]
        if a.microbatch:
            after.append(slots[Action(a.stage, a.kind, a.microbatch - 1)][1])
        peak = _peak_held(lines[r])
        for s in range(max(after, default=-1) + 1, t):
            if s in lines[r]:
                continue
            trial = {**lines[r], s: a}
            del trial[t]
            if _peak_held(trial) <= peak:
                lines[r], slots[a] = trial, (r, s)
                break
    return slots


GENERATORS = {"ZB-H2": zb_h2_order, "V-Half": v_half_order}  # name -> order(p, m)


# --- checks torch's runtime does not make ---------------------------------------------------------

def order_problem(order: Order, p: int, m: int, layers: int | None = None) -> str | None:
    """Why ``order`` cannot be one training step of ``m`` microbatches on ``p`` ranks, as one
    line; ``None`` when it can. Checked: one line per rank, every stage on one rank, each
    (stage, microbatch) run once forward and once backward (``B``, or ``I`` then ``W``), after
    its forward, microbatches 0 to m - 1, no more stages than ``layers``, and no deadlock (each
    rank waits only on actions some rank reaches). Torch's runtime counts *distinct*
    microbatches per stage, so a repeated action, or one for a microbatch that does not exist
    in place of one that does, passes its check and fails during the step."""
    from ppbook.planner.simulate import simulate

    if sorted(order) != list(range(p)):
        return f"the order has lines for ranks {sorted(order)}, but there are {p} ranks: give one line per rank"
    rank_of: dict[int, int] = {}
    for r, acts in order.items():
        for a in acts:
            if rank_of.setdefault(a.stage, r) != r:
                return f"stage {a.stage} is on rank {rank_of[a.stage]} and on rank {r}: put each stage on one rank"
    num_stages = 1 + max(rank_of)
    if sorted(rank_of) != list(range(num_stages)):
        return f"stages {sorted(set(range(num_stages)) - set(rank_of))} have no actions: every stage needs some"
    if layers is not None and layers < num_stages:
        return f"the order has {num_stages} stages but the model {layers} layers: raise --layers to {num_stages}"
    for r, acts in order.items():
        seen: set = set()
        for a in acts:
            key = (a.stage, a.kind, a.microbatch)
            if not 0 <= a.microbatch < m:
                return f"rank {r} runs {a}, but the microbatches are 0 to {m - 1}"
            if key in seen:
                return f"rank {r} runs {a} twice: every action runs once"
            needs = {"B": "F", "I": "F", "W": "I"}.get(a.kind)
            if needs and (a.stage, needs, a.microbatch) not in seen:
                return f"rank {r} runs {a} before {a.stage}{needs}{a.microbatch}: put the {needs} first"
            seen.add(key)
    for s in range(num_stages):
        acts = {(a.kind, a.microbatch) for a in order[rank_of[s]] if a.stage == s}
        for i in range(m):
            if ("F", i) not in acts or not (("B", i) in acts or {("I", i), ("W", i)} <= acts):
                return f"stage {s} does not run microbatch {i} forward and backward (B, or I and W): add it"
    try:
        simulate(order, {"F": 1, "B": 2, "I": 1, "W": 1})
    except ValueError as err:
        return str(err)
    return None


def mismatched_messages(order: Order) -> list[tuple[int, int]]:
    """The pairs (sender, receiver) of ranks whose messages the receiver does not expect in the
    order they are sent, if every rank sends an output right after computing it and receives an
    input right before the action that needs it. With no message tags (NCCL has none) the
    receiver takes them in the order they come, so a hand-written schedule needs this empty."""
    rank_of = {a.stage: r for r, acts in order.items() for a in acts}
    last = max(rank_of)
    sent: dict[tuple[int, int], list] = {}
    expected: dict[tuple[int, int], list] = {}
    for r, acts in order.items():
        for a in acts:
            if a.kind == "F" and a.stage < last and rank_of[a.stage + 1] != r:
                sent.setdefault((r, rank_of[a.stage + 1]), []).append((a.stage, "F", a.microbatch))
            if a.kind == "F" and a.stage > 0 and rank_of[a.stage - 1] != r:
                expected.setdefault((rank_of[a.stage - 1], r), []).append((a.stage - 1, "F", a.microbatch))
            if a.kind in "BI" and a.stage > 0 and rank_of[a.stage - 1] != r:
                sent.setdefault((r, rank_of[a.stage - 1]), []).append((a.stage, "B", a.microbatch))
            if a.kind in "BI" and a.stage < last and rank_of[a.stage + 1] != r:
                expected.setdefault((rank_of[a.stage + 1], r), []).append((a.stage + 1, "B", a.microbatch))
    return sorted(pair for pair in set(sent) | set(expected) if sent.get(pair) != expected.get(pair))


def runtime_lowering(order: Order, m: int) -> dict:
    """What torch's ``_PipelineScheduleRuntime`` makes of ``order`` for ``m`` microbatches,
    without any process group (the runtime built on mock stages, as torch's own schedule
    visualizer does): each rank's actions with the sends and receives it inserts, as strings.
    Its own checks raise as they would in a real run (``AssertionError``)."""
    from unittest import mock

    from torch.distributed.pipelining.schedules import _Action, _ComputationType, _PipelineScheduleRuntime
    from torch.distributed.pipelining.stage import PipelineStage

    p = len(order)
    num_stages = 1 + max(a.stage for acts in order.values() for a in acts)
    stage = mock.NonCallableMagicMock(spec=PipelineStage)
    stage.group_rank, stage.group_size, stage.submod, stage.num_stages = 0, p, None, num_stages
    runtime = _PipelineScheduleRuntime([stage], n_microbatches=m)
    actions = {r: [_Action(a.stage, _ComputationType.from_str(a.kind), a.microbatch) for a in order[r]]
               for r in range(p)}
    runtime._prepare_schedule_with_comms(actions)
    return {r: [str(a) for a in acts] for r, acts in runtime.pipeline_order_with_comms.items()}


# --- torch's CSV format --------------------------------------------------------------------------

def to_csv(order: Order) -> str:
    """``order`` as torch's compute-only CSV: one line per rank, its actions separated by commas
    (``_PipelineScheduleRuntime._load_csv`` reads it)."""
    return "".join(",".join(map(str, order[r])) + "\n" for r in sorted(order))


ACTION_CELL = re.compile(r"(\d+)([FBIW])(\d+)")  # stage, kind, microbatch: torch's notation, e.g. 1F3


def from_csv(text: str) -> Order:
    """The order a compute-only CSV describes (the inverse of :func:`to_csv`); a ``ValueError``
    naming the line and the cell that is not an action in torch's notation."""
    order: Order = {}
    for r, line in enumerate(text.strip().splitlines()):
        order[r] = []
        for cell in filter(None, (c.strip() for c in line.split(","))):
            m = ACTION_CELL.fullmatch(cell)
            if m is None:
                raise ValueError(f"line {r + 1} (rank {r}), cell {cell!r} is not an action: write stage, kind "
                                 f"(F, B, I or W) and microbatch, as 1F3")
            order[r].append(Action(int(m.group(1)), m.group(2), int(m.group(3))))
    return order


def _check(p: int, m: int) -> None:
    if p < 1 or m < 1:
        raise ValueError(f"need p >= 1 and m >= 1, got p = {p}, m = {m}")
