"""The schedule diagram shows exactly the schedule's actions: every block's text, colour and row,
read back from the drawn figure, name one action of the order, each action once, in the rank's order.
The labels are the timelines' (they choose their form when the figure is drawn): whatever form a
block shows (``5F3``, ``F3``, ``3`` over ``s5``, ``3``), what it says must agree with its colour and row."""

from __future__ import annotations

import matplotlib

matplotlib.use("agg")  # tests only: no display

import re

import matplotlib.pyplot as plt
import pytest
from matplotlib.colors import to_hex

from ppbook import timeline, torch_orders
from ppbook.diagrams import schedule
from ppbook.planner.schedules import TORCH_SCHEDULES, Action, stage_indices

KIND_OF = {to_hex(schedule.colour(k, c)): (k, c) for k in "FBIW" for c in (0, 1)}


LABEL = re.compile(r"^(?:(\d+)?([FBIW]))?(\d+)(?:\ns(\d+))?$")  # 5F3, F3, 3 over s5, 3


def read_back(ax, name: str, p: int) -> dict[int, list[Action]]:
    """The actions a reader reads off ``ax``, per rank, left to right: the microbatch from the
    text, the kind from the colour (and the text, where it names it), the stage from the text
    where it names it, else from the row and the shade (a rank's later stage is lighter)."""
    ax.figure.canvas.draw()  # the labels choose their form at draw time
    seen: dict[int, list[tuple[float, Action]]] = {}
    bars = [b for b in ax.patches]
    drawn = schedule.drawn_blocks(ax)
    assert len(drawn) == len(bars), "every bar carries a label"
    for bar, (row, hexcolour, text) in zip(bars, drawn):
        kind, chunk = KIND_OF[hexcolour]
        said = LABEL.match(text)
        assert said, f"block {text!r} names its microbatch (the figure is large enough for every label)"
        stage_a, kind_said, microbatch, stage_b = said.groups()
        assert kind_said in (None, kind), "the text's pass is the colour's"
        held = stage_indices(name, row, p)
        stage = int(stage_a or stage_b) if (stage_a or stage_b) else held[chunk]
        assert held.index(stage) == chunk, "a later stage is drawn lighter"
        seen.setdefault(row, []).append((bar.get_x(), Action(stage, kind, int(microbatch))))
    return {r: [a for _, a in sorted(acts, key=lambda x: x[0])] for r, acts in seen.items()}


@pytest.mark.parametrize("name", TORCH_SCHEDULES)
def test_figure_shows_the_schedules_actions(name):
    p, m = 2, 4
    order = torch_orders.torch_order(name, p, m)
    fig, ax = plt.subplots(figsize=(10, 2))
    schedule.draw(order, ax=ax, costs={"F": 1, "B": 2, "I": 1, "W": 1})
    assert read_back(ax, name, p) == order
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    kinds = {a.kind for acts in order.values() for a in acts}
    assert [f"{k}: {timeline.KIND_NAMES[k]}" for k in "FBIW" if k in kinds] == legend[:len(kinds)]
    assert ("lighter, hatched: the rank's later stage (chunk)" in legend) == (name not in ("GPipe", "1F1B")), \
        "the shade of later stages is explained"
    assert legend[-1] == "white: idle (bubble)"
    plt.close(fig)


@pytest.mark.parametrize("width, form", [(3, r"\d+"), (4.5, r"\d+\ns\d+"), (7, r"\d+[FBIW]\d+")])
def test_narrower_figures_say_less_but_still_show_the_order(width, form):
    """A narrower figure makes every block of the panel say less (``3``, then ``3`` over ``s5``,
    then ``5F3``), never spill: what is left, with the colour and shade, still reads as the order."""
    order = torch_orders.torch_order("ZBVZeroBubble", 2, 4)
    fig, ax = plt.subplots(figsize=(width, 2))
    schedule.draw(order, ax=ax, costs={"F": 1, "B": 2, "I": 1, "W": 1})
    assert read_back(ax, "ZBVZeroBubble", 2) == order
    assert all(re.fullmatch(form, text) for _, _, text in schedule.drawn_blocks(ax)), "one form per panel"
    plt.close(fig)


def test_torch_pipeline_order_grid_is_drawn_as_torch_lists_it():
    """Drawn from torch's own ``pipeline_order`` (idle steps as None, overlapped pairs as one
    step): every computation torch lists is one block, in torch's step."""
    ops = torch_orders.schedule_ops("DualPipeV", 2, 4, 2)
    ops[1].insert(0, None)  # an idle step, as torch pads other schedules' grids
    fig, ax = plt.subplots(figsize=(14, 2))
    schedule.draw(dict(enumerate(ops)), ax=ax)
    drawn = schedule.blocks(dict(enumerate(ops)))
    assert read_back(ax, "DualPipeV", 2) == torch_orders._from_torch(ops)
    steps = {(b.rank, b.action): b.start for b in drawn}
    for rank, acts in enumerate(ops):
        for k, entry in enumerate(acts):
            if entry is not None and entry.sub_actions:
                for sub in torch_orders._from_torch([[entry]])[0]:
                    assert k <= steps[(rank, sub)] < k + 1  # the pair shares torch's step k
    assert any(a is not None and a.sub_actions for acts in ops for a in acts)
    plt.close(fig)


def test_unit_steps_follow_the_data_flow():
    """Without costs, each action is one step and starts once its input exists: GPipe's last rank
    starts at step p - 1, and a rank never runs two blocks at once."""
    p, m = 4, 4
    drawn = schedule.blocks(torch_orders.torch_order("GPipe", p, m))
    assert min(b.start for b in drawn if b.rank == p - 1) == p - 1
    for rank in range(p):
        mine = [b for b in drawn if b.rank == rank]
        assert all(a.end <= b.start for a, b in zip(mine, mine[1:]))
