"""The schedule diagram shows exactly the schedule's actions: every block's text, colour and row,
read back from the drawn figure, name one action of the order, each action once, in the rank's order."""

from __future__ import annotations

import matplotlib

matplotlib.use("agg")  # tests only: no display

import matplotlib.pyplot as plt
import pytest
from matplotlib.colors import to_hex

from ppbook import simulate
from ppbook.diagrams import schedule
from ppbook.planner.schedules import TORCH_SCHEDULES, Action, stage_indices

KIND_OF = {to_hex(schedule.colour(k, c)): (k, c) for k in "FBIW" for c in (0, 1)}


def read_back(ax, name: str, p: int) -> dict[int, list[Action]]:
    """The actions a reader reads off ``ax``, per rank, left to right."""
    seen: dict[int, list[tuple[float, Action]]] = {}
    for bar, (row, hexcolour, text) in zip([b for b in ax.patches], schedule.drawn_blocks(ax)):
        kind, chunk = KIND_OF[hexcolour]
        lines = text.split("\n")
        microbatch = int(lines[0])
        stage = int(lines[1].removeprefix("s")) if len(lines) > 1 else row
        assert stage_indices(name, row, p).index(stage) == chunk, "a later stage is drawn lighter"
        seen.setdefault(row, []).append((bar.get_x(), Action(stage, kind, microbatch)))
    return {r: [a for _, a in sorted(acts, key=lambda x: x[0])] for r, acts in seen.items()}


@pytest.mark.parametrize("name", TORCH_SCHEDULES)
def test_figure_shows_the_schedules_actions(name):
    p, m = 2, 4
    order = simulate.torch_order(name, p, m)
    fig, ax = plt.subplots()
    schedule.draw(order, ax=ax, costs={"F": 1, "B": 2, "I": 1, "W": 1})
    assert read_back(ax, name, p) == order
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    kinds = {a.kind for acts in order.values() for a in acts}
    assert [schedule.KIND_NAMES[k] for k in "FBIW" if k in kinds] == legend[:len(kinds)]
    assert ("lighter: the rank's later stage (chunk)" in legend) == (name not in ("GPipe", "1F1B")), \
        "the shade of later stages is explained"
    assert legend[-1] == "white: idle (bubble)"
    plt.close(fig)


def test_torch_pipeline_order_grid_is_drawn_as_torch_lists_it():
    """Drawn from torch's own ``pipeline_order`` (idle steps as None, overlapped pairs as one
    step): every computation torch lists is one block, in torch's step."""
    ops = simulate.schedule_ops("DualPipeV", 2, 4, 2)
    ops[1].insert(0, None)  # an idle step, as torch pads other schedules' grids
    fig, ax = plt.subplots()
    schedule.draw(dict(enumerate(ops)), ax=ax)
    drawn = schedule.blocks(dict(enumerate(ops)))
    assert read_back(ax, "DualPipeV", 2) == simulate._from_torch(ops)
    steps = {(b.rank, b.action): b.start for b in drawn}
    for rank, acts in enumerate(ops):
        for k, entry in enumerate(acts):
            if entry is not None and entry.sub_actions:
                for sub in simulate._from_torch([[entry]])[0]:
                    assert k <= steps[(rank, sub)] < k + 1  # the pair shares torch's step k
    assert any(a is not None and a.sub_actions for acts in ops for a in acts)
    plt.close(fig)


def test_unit_steps_follow_the_data_flow():
    """Without costs, each action is one step and starts once its input exists: GPipe's last rank
    starts at step p - 1, and a rank never runs two blocks at once."""
    p, m = 4, 4
    drawn = schedule.blocks(simulate.torch_order("GPipe", p, m))
    assert min(b.start for b in drawn if b.rank == p - 1) == p - 1
    for rank in range(p):
        mine = [b for b in drawn if b.rank == rank]
        assert all(a.end <= b.start for a, b in zip(mine, mine[1:]))
