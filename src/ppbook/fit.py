"""Fitting the simulator to measured runs: replay a step from what was measured on it, compare.

Introduced in chapter 2 ("Naive model parallelism"), which simulates its measured timeline;
chapter 3 compares measured and simulated busy fractions, chapter 5 step times. A run is the
summary :func:`ppbook.measure.summarise_steps` writes.
"""

from __future__ import annotations

import random

from ppbook.planner import schedules, simulate


def simulator_inputs(run: dict) -> dict:
    """The measured costs, latency and overheads of a run, as keyword arguments of
    :func:`ppbook.planner.simulate.simulate`."""
    key = lambda k: (int(k[:-1]), k[-1])  # noqa: E731  "1B" -> (1, "B")
    return {"costs": {key(k): v for k, v in run["costs"].items()}, "latency": run["latency"],
            "overhead": {key(k): v for k, v in run["overheads"].items()}}


def _replays(run: dict, order: schedules.Order, draws: int, seed: int):
    """Yield (measured step summary, ranks, starts, ends): ``draws`` simulations per measured
    step, each from what was measured on that step alone (see :func:`predicted_vs_measured`).

    Each draw is what ``simulate.simulate(order, costs, overhead=gap, latency=drawn)`` returns,
    the same random draws in the same sequence (every hand-off in order, then every gap), but
    without rebuilding the order and the events each time: the order is compiled once, each
    step's costs looked up once, and a draw is one :func:`ppbook.planner.simulate.run` over flat
    lists, starts and ends in the compiled order (rank by rank, in the order each rank runs them).
    Thousands of draws replay a recorded launch, so this is most of a page's replay time."""
    rng = random.Random(seed)
    c = simulate.compile_order(order)
    for step in run["steps"]:
        inputs = simulator_inputs(step)
        handoffs = step["handoffs"] or [inputs["latency"]]
        gaps = {(int(k[:-1]), k[-1]): v for k, v in step["gaps"].items()}
        cost = simulate._cost_fn(inputs["costs"])
        costs = [cost(a) for a in c.actions]
        drawn_gaps = [gaps.get((a.stage, a.kind)) for a in c.actions]
        for _ in range(draws):  # the draws simulate() makes: every hand-off in order, then every gap
            hops = [rng.choice(handoffs) if remote else 0.0 for remote in c.remote]
            gap = [0.0 if g is None else rng.choice(g) for g in drawn_gaps]
            yield (step, c.ranks, *simulate.run(c, costs, hops, gap))


def _busy_fractions(ranks, start, end) -> list[float]:
    """:func:`ppbook.timeline.busy_fractions` of the events of one replay, rank by rank in rank
    order (each rank's durations summed in the order it ran them, as that function sums them)."""
    step = max(end) - min(start)
    busy: dict[int, float] = {}
    for r, s, e in zip(ranks, start, end):
        busy[r] = busy.get(r, 0.0) + (e - s)
    return [busy[r] / step for r in sorted(busy)]


def predicted_vs_measured(run: dict, order: schedules.Order, draws: int = 50, seed: int = 0) -> tuple[float, float]:
    """Mean busy fraction over ranks and measured steps: (measured, simulated).

    Each measured step is simulated from what was measured on it, as distributions: the mean
    time of each (stage, kind) of action, and, drawn at random for every action, a gap the rank
    spent on its own before an action of that kind and a hand-off delay. The simulator knows the
    schedule's dependencies and these three measurements, not when anything happened. On a
    shared CPU host gaps and hand-offs have long tails, and typical (median) values would hide
    them; ``draws`` Monte-Carlo runs average over the tails.
    """
    measured = [sum(step["busy"].values()) / len(step["busy"]) for step in run["steps"]]
    predicted = [sum(_busy_fractions(ranks, start, end)) / len(step["busy"])
                 for step, ranks, start, end in _replays(run, order, draws, seed)]
    return sum(measured) / len(measured), sum(predicted) / len(predicted)


def predicted_step_time(run: dict, order: schedules.Order, draws: int = 50, seed: int = 0) -> tuple[float, float]:
    """Mean step time over the measured steps, from the first action's start to the last one's
    end: (measured, simulated), simulated as in :func:`predicted_vs_measured`.
    Used from chapter 5 ("The schedules") on."""
    measured = [step["span"] for step in run["steps"]]
    predicted = [max(end) - min(start) for _, _, start, end in _replays(run, order, draws, seed)]
    return sum(measured) / len(measured), sum(predicted) / len(predicted)
