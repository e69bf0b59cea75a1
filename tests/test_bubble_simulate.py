import math

import pytest

from ppbook import bubble, timeline, torch_orders
from ppbook.planner import schedules, simulate
from ppbook.planner.schedules import Action


@pytest.mark.parametrize("p", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("m", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("schedule", ["GPipe", "1F1B"])
@pytest.mark.parametrize("f,b", [(1.0, 1.0), (1.0, 2.0)])
def test_simulator_reproduces_the_closed_forms(p, m, schedule, f, b):
    """Equal stage costs, no latency: step = (m + p - 1)(F + B), each rank busy m (F + B)."""
    if schedule == "1F1B" and m < p:
        pytest.skip("1F1B needs m >= p")
    events = simulate.simulate(schedules.HAND_WRITTEN_ORDERS[schedule](p, m), {"F": f, "B": b})
    t0, t1 = timeline.span(events)
    assert math.isclose(t1 - t0, (m + p - 1) * (f + b))
    for rank, busy in timeline.busy_fractions(events).items():
        assert math.isclose(busy, bubble.busy_fraction(p, m))
        assert math.isclose(1 - busy, bubble.bubble_fraction(p, m))
    naive = simulate.simulate(schedules.gpipe_order(p, 1), {"F": f * m, "B": b * m})
    assert math.isclose(timeline.span(naive)[1] / (t1 - t0), bubble.speedup_over_naive(p, m))


def test_the_two_conventions_differ():
    assert math.isclose(bubble.bubble_fraction(4, 8), 3 / 11)   # 27.3% of step time
    assert math.isclose(bubble.bubble_overhead(4, 8), 3 / 8)    # 37.5% over the ideal
    for p in range(1, 9):
        for m in range(1, 33):
            frac, over = bubble.bubble_fraction(p, m), bubble.bubble_overhead(p, m)
            assert math.isclose(frac, over / (1 + over))        # the same bubble, two denominators


def test_min_microbatches_and_errors():
    assert bubble.min_microbatches_for_fraction(4, 0.1) == 27
    assert bubble.bubble_fraction(4, 27) <= 0.1 < bubble.bubble_fraction(4, 26)
    with pytest.raises(ValueError):
        bubble.bubble_fraction(0, 4)
    with pytest.raises(ValueError):
        bubble.min_microbatches_for_fraction(4, 1.5)


def test_gpipe_order_matches_torchs_description():
    """Same action order as torch 2.13's description of ScheduleGPipe. (Its description of
    Schedule1F1B is wrong for the last rank -- rank 1 of 2 starts with 1F1 and lists a
    microbatch 4 at m=4 -- so one_f_one_b_order follows Schedule1F1B's step code, and test_scripts.py checks it
    against a recorded Schedule1F1B run.)"""
    from torch.distributed.pipelining.schedules import ScheduleGPipe

    for p, m in ((2, 4), (4, 4), (4, 8), (3, 5)):
        sched = ScheduleGPipe.__new__(ScheduleGPipe)  # only the two fields the description reads
        sched._num_stages, sched._n_microbatches = p, m
        theirs = sched._get_pipeline_order()
        kinds = {"FORWARD": "F", "FULL_BACKWARD": "B"}
        for r in range(p):
            torch_actions = [Action(a.stage_index, kinds[a.computation_type.name], a.microbatch_index)
                             for a in theirs[r] if a is not None and a.computation_type.name in kinds]
            assert torch_actions == schedules.gpipe_order(p, m)[r], (p, m, r)


def test_latency_and_per_stage_costs():
    events = simulate.simulate(schedules.gpipe_order(2, 1), {(0, "F"): 1, (1, "F"): 2, (0, "B"): 3, (1, "B"): 4},
                               latency=0.5)
    by = {e.label: e for e in events}
    assert by["1F0"].start == 1.5 and by["1B0"].start == 3.5 and by["0B0"].start == 8.0
    assert timeline.span(events)[1] == 11.0


def test_deadlock_is_reported():
    order = {0: [Action(0, "B", 0), Action(0, "F", 0)], 1: [Action(1, "F", 0), Action(1, "B", 0)]}
    with pytest.raises(ValueError, match="deadlocks"):
        simulate.simulate(order, {"F": 1, "B": 1})


def test_recorded_events_round_trip_and_comm_latency():
    events = simulate.simulate(schedules.gpipe_order(2, 4), {"F": 1.0, "B": 2.0}, latency=0.25)
    assert timeline.from_json(timeline.to_json(events)) == events
    assert math.isclose(timeline.comm_latency(events), 0.25)
    costs = timeline.mean_costs(events)
    assert costs[(0, "F")] == 1.0 and costs[(1, "B")] == 2.0


def test_overheads_per_kind_are_measured_and_replayed():
    """Gaps a rank spends on its own before each kind of action are recovered from a timeline
    and, fed back, reproduce it exactly."""
    order = schedules.gpipe_order(2, 4)
    gaps = {(0, "F"): 0.1, (0, "B"): 0.7, (1, "F"): 0.2, (1, "B"): 0.3}
    events = simulate.simulate(order, {"F": 1.0, "B": 2.0}, latency=0.25, overhead=gaps)
    measured = timeline.action_overheads([events], timeline.comm_latency(events))
    for key, value in measured.items():
        assert math.isclose(value, gaps[key]), key
    again = simulate.simulate(order, timeline.mean_costs(events), latency=0.25, overhead=measured)
    assert [(e.label, round(e.start, 9)) for e in again] == [(e.label, round(e.start, 9)) for e in events]


def test_latency_can_be_drawn_per_handoff():
    order = schedules.gpipe_order(2, 2)
    slow_second = lambda sent, received: 5.0 if sent.microbatch == 1 and sent.kind == "F" else 0.0  # noqa: E731
    events = simulate.simulate(order, {"F": 1.0, "B": 1.0}, latency=slow_second)
    by = {e.label: e for e in events}
    assert by["1F1"].start == by["0F1"].end + 5.0
    assert timeline.handoff_delays(events) == [0.0, 5.0, 0.0, 0.0]


def test_predicted_vs_measured_on_a_simulated_run():
    """A 'measured' run that is itself a simulation is predicted exactly."""
    from ppbook import fit, measure

    order = schedules.gpipe_order(2, 4)
    events = simulate.simulate(order, {"F": 1.0, "B": 2.0}, latency=0.25)
    step = measure.step_summary(events, seconds=timeline.span(events)[1])
    measured, predicted = fit.predicted_vs_measured({"steps": [step, step]}, order, draws=5)
    assert math.isclose(measured, predicted)
    assert math.isclose(measured, sum(timeline.busy_fractions(events).values()) / 2)


def test_replays_draw_what_simulate_draws():
    """fit's replays skip simulate() for speed (the order compiled once, no events per draw);
    they must give exactly what simulate() gives with the same draws: busy fractions and step
    times of a step with long-tailed gaps and hand-offs, bit for bit, on a looped and a V order."""
    import random

    from ppbook import fit, measure

    for order in (schedules.order("Interleaved1F1B", 2, 4, 2), torch_orders.torch_order("ZBVZeroBubble", 2, 4)):
        rng = random.Random(1)
        costs = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0}
        events = simulate.simulate(order, costs, latency=lambda s, r: rng.choice([0.1, 0.2, 3.0]),
                                   overhead=lambda a: rng.choice([0.0, 0.05, 1.5]))
        step = measure.step_summary(events, seconds=timeline.span(events)[1])
        assert step["gaps"] and len(set(step["handoffs"])) > 1  # distributions to draw from

        def reference(draws=7, seed=3):  # simulate() itself, with fit's draws in fit's order
            rng = random.Random(seed)
            gaps = {(int(k[:-1]), k[-1]): v for k, v in step["gaps"].items()}
            inputs = fit.simulator_inputs(step)
            for _ in range(draws):
                yield simulate.simulate(order, inputs["costs"], latency=lambda s, r: rng.choice(step["handoffs"]),
                                        overhead=lambda a: rng.choice(gaps[(a.stage, a.kind)])
                                        if (a.stage, a.kind) in gaps else 0.0)

        busy = [sum(timeline.busy_fractions(ev).values()) / 2 for ev in reference()]
        spans = [timeline.span(ev)[1] - timeline.span(ev)[0] for ev in reference()]
        assert fit.predicted_vs_measured({"steps": [step]}, order, draws=7, seed=3)[1] == sum(busy) / len(busy)
        assert fit.predicted_step_time({"steps": [step]}, order, draws=7, seed=3)[1] == sum(spans) / len(spans)


def test_plot_on_shared_axes_never_cuts_an_earlier_longer_timeline():
    """Item 14 of issue 13: with sharex=True the last timeline drawn used to set the shared
    x-limit, cutting every longer one drawn before it."""
    import matplotlib.pyplot as plt

    long = simulate.simulate(torch_orders.torch_order("GPipe", 4, 8), {"F": 1.0, "B": 2.0})
    short = simulate.simulate(torch_orders.torch_order("GPipe", 2, 2), {"F": 1.0, "B": 2.0})
    fig, axes = plt.subplots(2, 1, sharex=True)
    timeline.plot(long, ax=axes[0], labels=False, time_unit="s")
    timeline.plot(short, ax=axes[1], labels=False, time_unit="s")
    assert axes[1].get_xlim()[1] == timeline.span(long)[1]
    assert timeline.cut_bars(fig) == []
    axes[0].set_xlim(0, timeline.span(short)[1])  # what plot used to do: the check must see it
    assert timeline.cut_bars(fig)
    plt.close(fig)
