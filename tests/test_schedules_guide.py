"""Chapter 5's reader's guide (ppbook.guide) picks what chapter 10's planner ranks best among the
same schedules, on the guide's own inputs; and it counts torch's zero-bubble remainder."""

from __future__ import annotations

import math

import pytest

from ppbook import guide
from ppbook.planner import schedules, search


def planner_best(req: search.Request, tp: int, p: int, m: int, names) -> str:
    """The schedule the planner ranks first among ``names`` for this pipeline (memory checked)."""
    ranked = []
    for name in names:
        layout = search.Layout(tp, p, 1, name, schedules.stages_per_rank(name), 1, m, "none", "none")
        narrowed = search.with_layout(req, global_batch=m)
        if search.constraint_problem(layout, narrowed):
            continue
        pred = search.predict(layout, narrowed)
        if pred.why_not is None:
            ranked.append((pred.step_s, name))
    return min(ranked)[1]


@pytest.mark.parametrize("model, tp, p, m", guide.EXAMPLES)
def test_guide_picks_what_the_planner_ranks_best(model, tp, p, m):
    """Chapter 5's planner-sized rows (the 70B is chapter 10's sweep): the same pick as the planner's."""
    req = guide.example_request(model, tp, p, m)
    inputs = guide.from_planner(req, tp, p, m)
    assert guide.pick(inputs).name == planner_best(req, tp, p, m, inputs.schedules)


def test_the_70b_pick_changes_when_the_remainder_stops_fitting():
    """The case the guide exists for: ZBV wins while its remainder fits, and is not picked once it does not."""
    ms = [m for model, _, _, m in guide.EXAMPLES if model == "llama3-70b"]
    picks = {m: guide.pick(guide.from_planner(guide.example_request("llama3-70b", 8, 8, m), 8, 8, m)).name
             for m in ms}
    assert picks[min(picks)] == "ZBVZeroBubble" and picks[max(picks)] != "ZBVZeroBubble"


def test_remainder_grows_with_m_only_under_the_split_backward():
    base = dict(p=4, f=1.0, i=1.0, w=1.0, residual=0.25)
    mem = {(name, m): o.memory for m in (8, 16) for o in guide.options(guide.Inputs(m=m, **base))
           for name in [o.name]}
    for name in schedules.TORCH_SCHEDULES:
        grows = mem[name, 16] > mem[name, 8]
        # GPipe and LoopedBFS hold every microbatch; the zero-bubble ones keep a remainder of each
        # (DualPipeV splits only its last backwards, so its peak does not grow)
        assert grows == (name in ("GPipe", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble")), name
    # without the remainder ZBV holds 1F1B's peak, with it more
    free = {o.name: o.memory for o in guide.options(guide.Inputs(m=16, **{**base, "residual": 0.0}))}
    assert free["ZBVZeroBubble"] == free["1F1B"] < mem["ZBVZeroBubble", 16]


def test_budget_decides_and_nothing_fitting_is_one_clear_error():
    roomy = guide.pick(guide.Inputs(4, 8, 1.0, 1.0, 1.0))
    assert roomy.name in schedules.SPLIT_BACKWARD and math.isinf(guide.Inputs(4, 8, 1, 1, 1).budget)
    tight = guide.pick(guide.Inputs(4, 8, 1.0, 1.0, 1.0, residual=0.5, budget=4))
    assert tight.memory <= 4 and tight.name not in ("GPipe", "LoopedBFS")
    with pytest.raises(ValueError, match="no schedule fits 1 .*lower m or raise the budget"):
        guide.pick(guide.Inputs(4, 8, 1.0, 1.0, 1.0, budget=1))


def test_against_1f1b_sets_the_pick_beside_1f1b():
    """What chapter 5's tables show: the pick, its gain over 1F1B's step, ZBV's memory, messages."""
    inp = guide.Inputs(4, 8, 1.0, 1.0, 1.0, residual=0.25, budget=8)
    row, by = guide.against_1f1b(inp), {o.name: o for o in guide.options(inp)}
    assert row["pick"] == guide.pick(inp)
    assert math.isclose(row["gain"], 1 - by[row["pick"].name].step / by["1F1B"].step) and row["gain"] > 0
    assert row["zbv"] == by["ZBVZeroBubble"].memory > by["1F1B"].memory
    assert math.isclose(row["messages"], row["pick"].messages / by["1F1B"].messages)
    tight = guide.against_1f1b(guide.Inputs(4, 8, 1.0, 1.0, 1.0, residual=0.25, budget=4))
    assert tight["pick"].name == "1F1B" and tight["gain"] == 0.0 and tight["messages"] == 1.0
