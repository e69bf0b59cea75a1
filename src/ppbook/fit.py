"""Fitting the simulator to measured runs: replay a step from what was measured on it, compare.

Introduced in chapter 2 ("Naive model parallelism"), which simulates its measured timeline;
chapter 3 compares measured and simulated busy fractions, chapter 5 step times. A run is the
summary :func:`ppbook.measure.summarise_steps` writes.
"""

from __future__ import annotations

import random

from ppbook import timeline
from ppbook.planner import schedules, simulate


def simulator_inputs(run: dict) -> dict:
    """The measured costs, latency and overheads of a run, as keyword arguments of
    :func:`ppbook.planner.simulate.simulate`."""
    key = lambda k: (int(k[:-1]), k[-1])  # noqa: E731  "1B" -> (1, "B")
    return {"costs": {key(k): v for k, v in run["costs"].items()}, "latency": run["latency"],
            "overhead": {key(k): v for k, v in run["overheads"].items()}}


def _simulated_steps(run: dict, order: schedules.Order, draws: int, seed: int):
    """Yield (measured step summary, simulated events), ``draws`` simulations per measured step,
    each from what was measured on that step alone (see :func:`predicted_vs_measured`)."""
    rng = random.Random(seed)
    for step in run["steps"]:
        inputs = simulator_inputs(step)
        handoffs = step["handoffs"] or [inputs["latency"]]
        gaps = {(int(k[:-1]), k[-1]): v for k, v in step["gaps"].items()}

        def gap(action):
            return rng.choice(gaps[(action.stage, action.kind)]) if (action.stage, action.kind) in gaps else 0.0

        for _ in range(draws):
            yield step, simulate.simulate(order, inputs["costs"], overhead=gap,
                                          latency=lambda sent, received: rng.choice(handoffs))


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
    predicted = [sum(timeline.busy_fractions(events).values()) / len(step["busy"])
                 for step, events in _simulated_steps(run, order, draws, seed)]
    return sum(measured) / len(measured), sum(predicted) / len(predicted)


def predicted_step_time(run: dict, order: schedules.Order, draws: int = 50, seed: int = 0) -> tuple[float, float]:
    """Mean step time over the measured steps, from the first action's start to the last one's
    end: (measured, simulated), simulated as in :func:`predicted_vs_measured`.
    Used from chapter 5 ("The schedules") on."""
    measured = [step["span"] for step in run["steps"]]
    predicted = [timeline.span(events)[1] - timeline.span(events)[0]
                 for _, events in _simulated_steps(run, order, draws, seed)]
    return sum(measured) / len(measured), sum(predicted) / len(predicted)
