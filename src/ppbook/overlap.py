"""The simulator taught two things a mixture of experts brings: the all-to-all inside every
action, and DualPipeV's overlapped pairs.

Introduced in chapter 13 ("Mixture of experts through a pipeline"). The book's simulator
(:mod:`ppbook.planner.simulate`) runs one action at a time per rank. ``ScheduleDualPipeV`` also emits
pairs (``OVERLAP_F_B``: one microbatch's forward and another's backward), which a registered
function may run at once. Here an order keeps those pairs: each rank's list holds single actions
and ``(forward, backward)`` tuples; a pair starts when both its inputs are there and occupies its
rank until both halves are done.

An action of a mixture-of-experts stage is compute interleaved with all-to-alls (two per layer
in the forward, two in the backward). :func:`split_costs` reads, from a recorded step, how long
each kind of action computed and how long it spent inside all-to-alls; :func:`pair_cost` says
what a pair then costs: one after the other (torch's default), or overlapped on one core, where
the two halves' computations take turns and each one's all-to-all waits hide under the other's
computation. Everything here is plain Python, like the planner.

What a real overlap hides depends on the hardware. :func:`cpu_pair_cost` is the model for
threads on a CPU that other processes share: the halves hide, of what :func:`pair_cost` says a
perfect overlap hides, the share of the cores left idle while the job ran without the overlap,
and nothing more. :func:`predicted_step_time` with ``pair=`` predicts an overlapped run that way
from a run without the overlap (:func:`pair_split`, :func:`idle_share`).
"""

from __future__ import annotations

import dataclasses
import random
from statistics import median_high
from typing import Callable

from ppbook import timeline, torch_orders
from ppbook.planner import schedules
from ppbook.planner.dataflow import waits_on
from ppbook.planner.schedules import Action

Item = tuple[Action, ...]  # one action, or a (forward, backward) pair run at once
PairOrder = dict[int, list[Item]]

#: How far a simulated mean step time may be from the measured one, as a share of the measured:
#: the same for a replay (every input measured on the run itself) and for the overlapped run
#: predicted from the run without the overlap (its pairs from :func:`cpu_pair_cost`). A
#: prediction from one run of another also carries how two runs of one launch differ on a
#: shared machine, which a replay does not. Chapter 13 holds the simulator to this bound on
#: every launch of ``data/recorded/moe_overlap.json.gz`` (half of them beside two busy
#: processes), not on the build's own launch, whose step times depend on what else the machine
#: runs at that moment.
STEP_TOLERANCE = 0.15


def pair_order(name: str, p: int, m: int, v: int = 2) -> PairOrder:
    """Each rank's compute actions as torch's ``Schedule<name>`` runs them, with DualPipeV's
    ``OVERLAP_F_B`` pairs kept as ``(forward, backward)`` (built on mock stages, no process
    group; see :func:`ppbook.torch_orders.torch_order`, which flattens the pairs)."""
    if name == "1F1B":
        return {r: [(a,) for a in acts] for r, acts in torch_orders.torch_order(name, p, m).items()}
    kinds = {"FORWARD": "F", "FULL_BACKWARD": "B", "BACKWARD_INPUT": "I", "BACKWARD_WEIGHT": "W"}
    out: PairOrder = {}
    for rank, acts in enumerate(torch_orders.schedule_ops(name, p, m, schedules.stages_per_rank(name, v))):
        out[rank] = []
        for a in acts:
            if a is None:
                continue
            subs = [s for s in (a.sub_actions or (a,)) if s.computation_type.name in kinds]
            if subs:
                out[rank].append(tuple(Action(s.stage_index, kinds[s.computation_type.name], s.microbatch_index)
                                       for s in subs))
    return out


def flatten(order: PairOrder) -> schedules.Order:
    """The same order with every pair run one half after the other (torch's default runtime)."""
    return {r: [a for item in items for a in item] for r, items in order.items()}


def pairs(order: PairOrder) -> int:
    return sum(len(item) == 2 for items in order.values() for item in items)


# ---------------------------------------------------------------------------------------------
# What an action is made of
# ---------------------------------------------------------------------------------------------
def comm_inside(e: timeline.Event, comm: list[dict]) -> list[dict]:
    """The all-to-alls ``e`` ran: on its rank, within its span, and of its direction (the
    backward's carry ``-grad`` in their kind), so that an overlapped forward and backward, which
    run at the same time, each get their own."""
    backward = e.kind != "F"
    return [c for c in comm if c["rank"] == e.rank and c["kind"].endswith("-grad") == backward
            and e.start - 1e-6 <= c["start"] and c["end"] <= e.end + 1e-6]


def split_costs(events: list[timeline.Event], comm: list[dict]) -> dict[tuple[int, str], tuple[float, float]]:
    """Per (stage, kind): the mean time computing and the mean time inside all-to-alls."""
    return _split([(events, comm)], lambda e: True)


def _split(steps, keep: Callable[[timeline.Event], bool]) -> dict[tuple[int, str], tuple[float, float]]:
    sums: dict[tuple[int, str], list[float]] = {}
    for events, comm in steps:
        for e in filter(keep, events):
            inside = sum(c["end"] - c["start"] for c in comm_inside(e, comm))
            acc = sums.setdefault((e.stage, e.kind), [0.0, 0.0, 0])
            acc[0] += e.duration - inside
            acc[1] += inside
            acc[2] += 1
    return {k: (c / n, a / n) for k, (c, a, n) in sums.items()}


def comm_share(events: list[timeline.Event], comm: list[dict]) -> float:
    """Share of all the actions' time spent inside all-to-alls."""
    total = sum(e.duration for e in events)
    return sum(c["end"] - c["start"] for e in events for c in comm_inside(e, comm)) / total


def pair_cost(f: tuple[float, float], b: tuple[float, float], overlap: bool) -> float:
    """Time of a forward and a backward, each ``(compute, all-to-all)``: one after
    the other, or overlapped on one core, where the computations take turns (they add
    up) and each half's all-to-alls can hide under the other's computation (DualPipe's
    F&B chunk, DeepSeek-V3). The planner's pair on a GPU,
    :func:`ppbook.planner.simulate.pair_slots`, alternates the halves by whole
    chunks: ``max(cf, ab) + max(cb, af)``, never less than this."""
    (cf, af), (cb, ab) = f, b
    if not overlap:
        return cf + af + cb + ab
    return max(cf + cb, cf + af, cb + ab)


def pair_split(steps: list[tuple[list[timeline.Event], list[dict]]], order: PairOrder) -> dict:
    """Per (stage, kind): the mean (compute, all-to-all) of the actions that ``order`` pairs, over
    recorded steps (events, all-to-alls) that ran each pair's halves one after the other: what a
    pair is made of, measured without the overlap."""
    paired = {(a.stage, a.kind, a.microbatch) for items in order.values() for item in items
              if len(item) == 2 for a in item}
    return _split(steps, lambda e: (e.stage, e.kind, e.microbatch) in paired)


def cpu_pair_cost(f: tuple[float, float], b: tuple[float, float],
                  free: float) -> float:
    """A pair overlapped on a CPU shared with other processes, from its halves'
    (compute, all-to-all) measured without the overlap. Its two threads run at
    once only on a core nobody else uses, a share ``free`` of the time (0: every
    core busy, 1: a core for each); so they hide that share of what a perfect
    overlap (:func:`pair_cost`) hides, and nothing more. On a busy core an
    all-to-all's wait is mostly its peer waiting for its own turn on a core:
    computing meanwhile takes that turn from someone else."""
    one_after_the_other = pair_cost(f, b, overlap=False)
    perfect = pair_cost(f, b, overlap=True)
    hidden = min(1.0, max(0.0, free)) * (one_after_the_other - perfect)
    return one_after_the_other - hidden


def busy_share(records: list[dict]) -> float:
    """Mean share of the cores' time that a run's processes kept busy (all their threads),
    from step records with ``cpu_seconds`` per rank, ``seconds`` and ``cores``."""
    return sum(sum(r["cpu_seconds"]) / (r["cores"] * r["seconds"]) for r in records) / len(records)


def idle_share(records: list[dict]) -> float:
    """Mean share of the cores' time that nobody used during a run's steps: neither the run's
    processes nor any other on the machine (``idle_share`` of each step record, read from the
    operating system). Where the records lack it (a system without Linux's /proc/stat), what
    the run's own processes left: 1 - :func:`busy_share`, which takes a core that another
    process keeps busy for a free one."""
    if all(r.get("idle_share") is not None for r in records):
        return sum(r["idle_share"] for r in records) / len(records)
    return 1 - busy_share(records)


# ---------------------------------------------------------------------------------------------
# The simulator
# ---------------------------------------------------------------------------------------------
def simulate_pairs(order: PairOrder, cost: Callable[[Action], float],
                   pair: Callable[[Action, Action], float] | None = None,
                   latency: Callable[[Action, Action], float] = lambda sent, received: 0.0,
                   overhead: Callable[[Action], float] = lambda a: 0.0) -> list[timeline.Event]:
    """Run ``order``: each item starts when its rank has finished the previous one (plus
    ``overhead`` of its first action) and every input it needs has arrived (``latency`` after
    the action it waits on, when that ran on another rank). A single action lasts ``cost(a)``.
    A pair is one block: overlapped, both halves span ``pair(f, b)``; without ``pair``, the
    forward runs and then the backward, ``cost`` each (torch's default runtime). Either way
    its outputs leave when the whole block is done, as torch's runtime sends them after the
    ``OVERLAP_F_B`` action. Returns the events; a ``ValueError`` if the order deadlocks."""
    actions = {a: r for r, items in order.items() for item in items for a in item}
    num_stages = 1 + max(a.stage for a in actions)
    present = {(a.stage, a.kind, a.microbatch) for a in actions}
    done: dict[Action, float] = {}  # when an action's output is available
    free = {r: 0.0 for r in order}
    position = {r: 0 for r in order}
    events = []
    # what each item waits on depends on the order alone: found once, not at every retry
    item_deps = {r: [[(Action(*d), a) for a in item
                      if (d := waits_on(a.stage, a.kind, a.microbatch, num_stages, present.__contains__)) is not None]
                     for item in items] for r, items in order.items()}
    remaining = sum(len(items) for items in order.values())
    while remaining:
        progressed = False
        for r, items in order.items():
            while position[r] < len(items):
                item = items[position[r]]
                deps = item_deps[r][position[r]]
                if any(d not in done for d, _ in deps):
                    break  # an input is not there yet: try the other ranks
                ready = {a: done[d] + (latency(d, a) if actions[d] != r else 0.0) for d, a in deps}
                after = free[r] + (overhead(item[0]) if position[r] else 0.0)
                if len(item) == 1:
                    start = max(after, ready.get(item[0], 0.0))
                    spans = [(start, start + cost(item[0]))]
                elif pair is not None:  # overlapped: one block, once both inputs are there
                    start = max(after, *ready.values())
                    spans = [(start, start + pair(*item))] * 2
                else:  # one half after the other, each once its own input is there
                    f, b = item
                    start = max(after, ready.get(f, 0.0))
                    middle = max(start + cost(f) + overhead(b), ready.get(b, 0.0))
                    spans = [(start, start + cost(f)), (middle, middle + cost(b))]
                block_end = max(e for _, e in spans)
                for a, (s, e) in zip(item, spans):
                    done[a] = block_end
                    events.append(timeline.Event(r, a.stage, a.kind, a.microbatch, s, e))
                free[r] = block_end
                position[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = {r: str(items[position[r]]) for r, items in order.items() if position[r] < len(items)}
            raise ValueError(f"schedule deadlocks: each rank waits on an action no rank can run: {stuck}")
    return sorted(events, key=lambda e: (e.start, e.rank))


def by_pipeline(events: list[timeline.Event], p: int, comm: list[dict] | None = None) -> list[tuple]:
    """A step of several pipelines side by side (rank = pipeline * p + position), as one
    (events, all-to-alls) per pipeline, each with the ranks of its positions (0 to p - 1)."""
    out = []
    for i in range(1 + max(e.rank for e in events) // p):
        mine = [dataclasses.replace(e, rank=e.rank % p) for e in events if e.rank // p == i]
        calls = [{**c, "rank": c["rank"] % p} for c in comm or [] if c["rank"] // p == i]
        out.append((mine, calls))
    return out


def step_inputs(events: list[timeline.Event], order: PairOrder) -> dict:
    """What one recorded step measured, for a replay of ``order`` (the order it ran, pairs kept):
    the mean duration per (stage, kind, in a pair or not) and of each kind of pair as a block
    (``("pair", forward's stage, backward's stage)``); for every item that waited for an
    input from another rank, the delay from that input's end to the item's start (a hand-off);
    for every other item, the gap after its rank's previous item, per (stage, kind) of its first
    action."""
    by_key = {(e.stage, e.kind, e.microbatch): e for e in events}
    in_pair = {a for items in order.values() for item in items if len(item) == 2 for a in item}
    durations: dict[tuple, list[float]] = {}
    for item in (item for items in order.values() for item in items):
        got = [by_key[(a.stage, a.kind, a.microbatch)] for a in item]
        for a, e in zip(item, got):
            durations.setdefault((a.stage, a.kind, a in in_pair), []).append(e.duration)
        if len(item) == 2:  # the block: from the first half's start to the last one's end
            durations.setdefault(("pair", item[0].stage, item[1].stage), []).append(
                max(e.end for e in got) - min(e.start for e in got))
    rank_of = {a: r for r, items in order.items() for item in items for a in item}
    num_stages = 1 + max(a.stage for a in rank_of)
    gaps: dict[tuple[int, str], list[float]] = {}
    handoffs = []
    for r, items in order.items():
        prev_end = None
        for item in items:
            got = [by_key[(a.stage, a.kind, a.microbatch)] for a in item]
            start, end = min(e.start for e in got), max(e.end for e in got)
            deps = [Action(*d) for a in item
                    if (d := waits_on(a.stage, a.kind, a.microbatch, num_stages, by_key.__contains__)) is not None]
            remote = [by_key[(d.stage, d.kind, d.microbatch)].end for d in deps if rank_of[d] != r]
            if remote and (prev_end is None or max(remote) >= prev_end):
                handoffs.append(start - max(remote))
            elif prev_end is not None:
                gaps.setdefault((item[0].stage, item[0].kind), []).append(start - prev_end)
            if len(item) == 2 and got[1].start >= got[0].end:  # run one after the other
                gaps.setdefault((item[1].stage, item[1].kind), []).append(got[1].start - got[0].end)
            prev_end = end
    t0, t1 = timeline.span(events)
    return {"costs": {k: sum(v) / len(v) for k, v in durations.items()}, "gaps": gaps,
            "handoffs": handoffs, "span": t1 - t0}


def predicted_step_time(steps: list[list[timeline.Event]], order: PairOrder, overlapped: bool,
                        draws: int = 50, seed: int = 0,
                        pair: Callable[[Action, Action], float] | None = None) -> tuple[float, float]:
    """Mean step time over measured steps (each a list of events, of one pipeline or of several
    side by side), from the first action's start to the last one's end: (measured, simulated).
    As :func:`ppbook.fit.predicted_step_time`, each step is replayed from what was measured on
    it alone (:func:`step_inputs`, each pipeline from its own actions): every action lasts its
    kind's mean time (in a pair or alone), and gaps and hand-offs are drawn at random from those
    measured; a pair is a block of its measured mean time if ``overlapped``, else its halves run
    one after the other. With ``pair``, an overlapped pair is not replayed but predicted: a block
    of ``pair(forward, backward)`` (e.g. :func:`cpu_pair_cost` of what was measured without the
    overlap). The step ends with the slowest pipeline."""
    rng = random.Random(seed)
    measured, predicted = [], []
    for events in steps:
        t0, t1 = timeline.span(events)
        measured.append(t1 - t0)
        inputs = [step_inputs(mine, order) for mine, _ in by_pipeline(events, len(order))]
        for _ in range(draws):
            predicted.append(max(_span(_simulate_drawn(got, order, overlapped, rng, pair)) for got in inputs))
    return sum(measured) / len(measured), sum(predicted) / len(predicted)


def _span(events: list[timeline.Event]) -> float:
    t0, t1 = timeline.span(events)
    return t1 - t0


def _block(got: dict, overlapped: bool, pair) -> Callable[[Action, Action], float] | None:
    """How long an overlapped pair lasts in a replay: as measured on the step, or ``pair``'s."""
    if not overlapped:
        return None
    return pair or (lambda f, b: got["costs"][("pair", f.stage, b.stage)])


def _simulate_drawn(got: dict, order: PairOrder, overlapped: bool, rng, pair=None) -> list[timeline.Event]:
    in_pair = {a for items in order.values() for item in items if len(item) == 2 for a in item}
    handoffs = got["handoffs"] or [0.0]

    def gap(a: Action) -> float:
        drawn = got["gaps"].get((a.stage, a.kind))
        return max(0.0, rng.choice(drawn)) if drawn else 0.0

    return simulate_pairs(order, lambda a: got["costs"][(a.stage, a.kind, a in in_pair)],
                          pair=_block(got, overlapped, pair),
                          latency=lambda sent, received: max(0.0, rng.choice(handoffs)), overhead=gap)


def replay(events: list[timeline.Event], order: PairOrder, overlapped: bool,
           pair: Callable[[Action, Action], float] | None = None) -> list[timeline.Event]:
    """One simulated step from one recorded step (:func:`step_inputs`, every pipeline), with
    each pipeline's typical gap and hand-off (the medians) instead of draws: the simulated
    timeline drawn beside the recorded one, ranks numbered as recorded. ``pair``: as in
    :func:`predicted_step_time`."""
    p, out = len(order), []
    in_pair = {a for items in order.values() for item in items if len(item) == 2 for a in item}
    for i, (mine, _) in enumerate(by_pipeline(events, p)):
        got = step_inputs(mine, order)
        gaps = {k: max(0.0, median_high(v)) for k, v in got["gaps"].items()}
        handoff = max(0.0, median_high(got["handoffs"])) if got["handoffs"] else 0.0
        sim = simulate_pairs(order, lambda a: got["costs"][(a.stage, a.kind, a in in_pair)],
                             pair=_block(got, overlapped, pair),
                             latency=lambda sent, received: handoff,
                             overhead=lambda a: gaps.get((a.stage, a.kind), 0.0))
        out += [dataclasses.replace(e, rank=e.rank + i * p) for e in sim]
    return sorted(out, key=lambda e: (e.start, e.rank))


def pair_stats(steps: list[tuple[list[timeline.Event], list[dict]]], order: PairOrder) -> dict:
    """Over recorded steps (events, all-to-alls), the pairs of ``order``: the mean block (first
    half's start to last half's end), the mean time one half computed and spent inside
    all-to-alls, and the median time of one all-to-all inside a pair."""
    blocks, compute, inside, calls = [], [], [], []
    pipelines = [one for events, comm in steps for one in by_pipeline(events, len(order), comm)]
    for events, comm in pipelines:
        by_key = {(e.stage, e.kind, e.microbatch): e for e in events}
        for item in (item for items in order.values() for item in items if len(item) == 2):
            got = [by_key[(a.stage, a.kind, a.microbatch)] for a in item]
            blocks.append(max(e.end for e in got) - min(e.start for e in got))
            for e in got:
                mine = comm_inside(e, comm)
                waited = sum(c["end"] - c["start"] for c in mine)
                compute.append(e.duration - waited)
                inside.append(waited)
                calls += [c["end"] - c["start"] for c in mine]
    mean = lambda v: sum(v) / len(v)  # noqa: E731
    return {"block": mean(blocks), "compute": mean(compute), "all_to_all": mean(inside),
            "per_call": median_high(calls), "pairs": len(blocks)}


def median_comm(comm: list[dict]) -> float:
    """The median duration of one all-to-all."""
    return median_high([c["end"] - c["start"] for c in comm]) if comm else 0.0


def plot(events: list[timeline.Event], comm: list[dict] | None = None, ax=None, title: str | None = None):
    """A per-rank chart where a forward and a backward that run at once are both visible:
    forwards in the upper half of a rank's row, backward passes in the lower half, and every
    all-to-all as a black tick on the half of the action that ran it."""
    import matplotlib.pyplot as plt

    ax = ax or plt.gca()
    t0, _ = timeline.span(events)
    ranks = sorted({e.rank for e in events})
    for e in events:
        y = e.rank - 0.2 if e.kind == "F" else e.rank + 0.2
        ax.barh(y, e.duration * 1e3, left=(e.start - t0) * 1e3, height=0.38, color=timeline.KIND_COLOURS[e.kind],
                edgecolor="white", linewidth=0.3)
    for c in comm or []:
        y = c["rank"] + (0.2 if c["kind"].endswith("-grad") else -0.2)
        ax.barh(y, (c["end"] - c["start"]) * 1e3, left=(c["start"] - t0) * 1e3, height=0.12, color="black")
    ax.set_yticks(ranks, [f"rank {r}" for r in ranks])
    ax.set_ylim(max(ranks) + 0.6, min(ranks) - 0.6)
    ax.set_xlim(0, max(ax.get_xlim()[1], (max(e.end for e in events) - t0) * 1e3))
    ax.set_xlabel("time (ms)")
    if title:
        ax.set_title(title, fontsize=10, loc="left")
    return ax


# ---------------------------------------------------------------------------------------------
# One launch, assessed
# ---------------------------------------------------------------------------------------------
#: The runs of chapter 13's launch that the simulator is held to: 1F1B and DualPipeV replayed,
#: DualPipeV with the overlap predicted from DualPipeV without it.
SHOWN = ("1F1B", "DualPipeV", "DualPipeV-overlap")


def assess(data: dict, draws: int = 10) -> dict:
    """What chapter 13 reads from one launch of ``scripts/13_moe.py`` (its ``--json``): for each
    run of :data:`SHOWN`, the measured and simulated mean step (:func:`predicted_step_time`; the
    overlapped run predicted with :func:`cpu_pair_cost` from DualPipeV's pairs and the cores left
    idle while DualPipeV ran), each error in percent of the measured; the prediction from one
    minus DualPipeV's own busy share instead; the bracket of a share of 0 (nothing hidden) and 1
    (a perfect overlap); the measured gain over DualPipeV's median step; and the pairs' inside
    (:func:`pair_stats`) without and with the overlap. The same function serves the launch the
    page makes and every launch recorded in ``data/recorded/moe_overlap.json.gz``.

    ``pair(share)`` in the result is the CPU model's pair cost for that free share, for drawing."""
    runs = {r["run"]: r for r in data["runs"]}
    p, m = data["pp"], data["microbatches"]
    orders = {n: pair_order(runs[n]["schedule"], p, m) for n in SHOWN}
    order = orders["DualPipeV"]

    def steps(name):
        return [timeline.from_json(rec["events"]) for rec in runs[name]["records"]]

    def recs(name):
        return [(timeline.from_json(r["events"]), r["comm"]) for r in runs[name]["records"]]

    split = pair_split(recs("DualPipeV"), order)  # (compute, all-to-all) of each half, not overlapped
    busy = {n: busy_share(runs[n]["records"]) for n in SHOWN}
    idle = {n: idle_share(runs[n]["records"]) for n in SHOWN}
    free = idle["DualPipeV"]

    def pair(share: float) -> Callable[[Action, Action], float]:
        return lambda f, b: cpu_pair_cost(split[(f.stage, f.kind)], split[(b.stage, b.kind)], share)

    sim = {n: predicted_step_time(steps(n), orders[n], False, draws=draws) for n in SHOWN[:2]}
    overlapped = steps(SHOWN[2])
    sim[SHOWN[2]] = predicted_step_time(overlapped, order, True, draws=draws, pair=pair(free))
    measured = sim[SHOWN[2]][0]
    ends = {share: predicted_step_time(overlapped, order, True, draws=draws, pair=pair(share))[1]
            for share in (0.0, 1.0)}
    busy_model = predicted_step_time(overlapped, order, True, draws=draws, pair=pair(1 - busy["DualPipeV"]))[1]
    serial, both = pair_stats(recs("DualPipeV"), order), pair_stats(recs(SHOWN[2]), order)
    halves = (serial["compute"], serial["all_to_all"])  # a typical half, not overlapped
    median = {n: runs[n]["median_step_seconds"] for n in SHOWN}
    return {
        "orders": orders, "pair": pair, "free": free, "busy": busy, "idle": idle,
        "cpu_seconds": {n: sum(sum(r["cpu_seconds"]) for r in runs[n]["records"]) / len(runs[n]["records"])
                        for n in SHOWN},
        "cores": runs["1F1B"]["records"][0]["cores"],
        "measured": {n: a for n, (a, _) in sim.items()}, "simulated": {n: b for n, (_, b) in sim.items()},
        "error_pct": {n: 100 * (b / a - 1) for n, (a, b) in sim.items()},
        "busy_model_error_pct": 100 * (busy_model / measured - 1),
        "nothing_hidden": ends[0.0], "perfect": ends[1.0],
        "in_bracket": ends[1.0] * (1 - STEP_TOLERANCE) <= measured <= ends[0.0] * (1 + STEP_TOLERANCE),
        "gain_vs_nothing_hidden": 1 - measured / ends[0.0],
        "median": median, "gain_vs_dualpipev": 1 - median[SHOWN[2]] / median["DualPipeV"],
        "in_all_to_alls": {n: sum(comm_share(e, c) for e, c in recs(n)) / len(runs[n]["records"]) for n in SHOWN},
        "per_call": median_comm([c for rec in runs["1F1B"]["records"] for c in rec["comm"]]),
        "serial": serial, "overlapped": both,
        "pair_perfect": pair_cost(halves, halves, overlap=True),
        "pair_modelled": cpu_pair_cost(halves, halves, free),
    }
