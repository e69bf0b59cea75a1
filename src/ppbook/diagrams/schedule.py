"""A schedule's order drawn as rows per rank, every block labelled with its microbatch.

Introduced in chapter 5 ("The schedules"). One picture for one question:
*which pass does each rank run, on which microbatch, in what order?* The blocks come from the
schedule's own order, never from hand-typed coordinates:

- a ppbook order, ``{rank: [Action, ...]}`` (:func:`ppbook.torch_orders.torch_order` builds it with
  torch's own schedule classes; :func:`ppbook.planner.schedules.order` without torch), or
- torch's ``schedule.pipeline_order`` itself, ``{rank: [_Action | None, ...]}`` (``None`` is a step
  in which the rank idles; an ``OVERLAP_F_B`` pair becomes its two sub-actions, communication and
  gradient-reduction actions are left out). Beware: torch 2.13's ``Schedule1F1B.pipeline_order``
  is wrong for the last rank (see :func:`ppbook.torch_orders.torch_order`), its ``step`` is right.

Where the blocks go along the row:

- ``costs`` given (``{"F": 1, "I": 1, "W": 1, "B": 2}``, or per ``(stage, kind)``, as for
  :func:`ppbook.planner.simulate.simulate`): the order is simulated with them, so block widths are times
  and white space is idle time (a timeline);
- no ``costs``, torch's ``pipeline_order``: one block per step, where torch put it (an overlapped
  pair shares its step);
- no ``costs``, a plain order: every action costs one step and starts when its input is ready
  (the same simulator with unit costs), so the rows line up as the data flow allows.

Colours, labels and legend are the timelines' (:mod:`ppbook.timeline`, one piece of code for
both): forward (F), full backward (B = I + W), input-gradient pass (I), weight-gradient pass (W);
a rank's later chunks (looped and V-shaped schedules) drawn lighter and hatched. Each block names its
microbatch, in the longest form that fits every block of its panel at a readable size (``F3``
or ``3``; on a rank holding several stages ``5F3``, ``3`` over ``s5``, or ``3``), chosen when the
figure is drawn, so no label spills out of a small block. The legend is drawn in the figure, once,
beside its top panel.

    >>> from ppbook import torch_orders
    >>> from ppbook.diagrams import schedule
    >>> ax = schedule.draw(torch_orders.torch_order("ZBVZeroBubble", 2, 4), title="ZBVZeroBubble")

:func:`blocks` returns what :func:`draw` draws, so a test can compare the picture with the order.
"""

from __future__ import annotations

from dataclasses import dataclass

from ppbook import timeline
from ppbook.planner.events import Event
from ppbook.planner.schedules import Action
from ppbook.planner.simulate import simulate

_TORCH_KINDS = {"FORWARD": "F", "FULL_BACKWARD": "B", "BACKWARD_INPUT": "I", "BACKWARD_WEIGHT": "W"}


@dataclass(frozen=True)
class Block:
    """One drawn block: a rank's action, where it sits on the row (``start``, ``end``), and which of
    the rank's chunks (0 for its first stage, 1 for its second, ...) it belongs to."""
    rank: int
    stage: int
    kind: str
    microbatch: int
    start: float
    end: float
    chunk: int

    @property
    def action(self) -> Action:
        return Action(self.stage, self.kind, self.microbatch)

    @property
    def event(self) -> Event:
        """The block as a timeline event, for :mod:`ppbook.timeline`'s colours and labels."""
        return Event(self.rank, self.stage, self.kind, self.microbatch, self.start, self.end)


def _as_actions(entry) -> list[Action] | None:
    """A ppbook Action, a torch ``_Action`` (its sub-actions for an overlapped pair) or ``None``."""
    if entry is None:
        return None
    if isinstance(entry, Action):
        return [entry]
    subs = getattr(entry, "sub_actions", None)
    if subs:
        return [a for sub in subs for a in _as_actions(sub) or ()]
    kind = _TORCH_KINDS.get(entry.computation_type.name)
    return [] if kind is None else [Action(entry.stage_index, kind, entry.microbatch_index)]


def blocks(order, costs=None, latency: float = 0.0) -> list[Block]:
    """The blocks :func:`draw` draws for ``order`` (see the module's docstring for the three
    placements), sorted by rank and start."""
    steps = {rank: [_as_actions(e) for e in acts] for rank, acts in order.items()}
    plain = {rank: [a for e in acts if e for a in e] for rank, acts in steps.items()}
    grid = costs is None and any(not isinstance(e, Action) for acts in order.values() for e in acts)
    placed: list[tuple[int, Action, float, float]] = []
    if grid:  # torch's step grid: step k is [k, k + 1), a pair shares its step
        for rank, acts in steps.items():
            for k, entry in enumerate(acts):
                for j, a in enumerate(entry or ()):
                    placed.append((rank, a, k + j / len(entry), k + (j + 1) / len(entry)))
    else:
        events = simulate(plain, costs if costs is not None else (lambda a: 1.0), latency=latency)
        placed = [(e.rank, Action(e.stage, e.kind, e.microbatch), e.start, e.end) for e in events]
    held = {rank: sorted({a.stage for a in acts}) for rank, acts in plain.items()}
    out = [Block(rank, a.stage, a.kind, a.microbatch, s, e, held[rank].index(a.stage)) for rank, a, s, e in placed]
    return sorted(out, key=lambda b: (b.rank, b.start))


def colour(kind: str, chunk: int = 0):
    """The block colour of ``kind`` on a rank's ``chunk`` (0: its first stage; later ones lighter),
    as :func:`ppbook.timeline.block_colour` gives it."""
    return timeline.block_colour(Event(0, chunk, kind, 0, 0.0, 0.0), {(0, chunk): chunk})


def draw(order, ax=None, costs=None, latency: float = 0.0, title: str | None = None, legend: bool | str = True,
         xlabel: str | None = None, follow: int | None = None, label_sizes: tuple[int, ...] | None = None):
    """Draw ``order`` on ``ax`` (rows per rank, rank 0 on top), each block labelled with its
    microbatch (and stage) as the timelines are (:func:`ppbook.timeline.label_blocks`). With
    ``legend`` the figure gets one legend for every schedule drawn on it so far
    (:func:`ppbook.timeline.figure_legend`), beside its top panel (``"top"``: above the panels):
    leave it on for every panel, the last call places it. ``follow`` outlines every block of one
    microbatch, and ``label_sizes`` sets the labels' font sizes, as for
    :func:`ppbook.timeline.plot`. Returns ``ax``. Axes that share their x axis keep the longest
    drawn row in view (each draw extends the limit, never shrinks it)."""
    import matplotlib.pyplot as plt

    ax = ax or plt.gca()
    drawn = blocks(order, costs, latency)
    events = [b.event for b in drawn]
    chunk = {(b.rank, b.stage): b.chunk for b in drawn}
    bars = [ax.barh(b.rank, b.end - b.start, left=b.start, height=0.8, color=timeline.block_colour(e, chunk),
                    edgecolor="white", linewidth=0.6)[0] for b, e in zip(drawn, events)]
    timeline.style_blocks(ax, bars, events, follow)
    timeline.label_blocks(ax, bars, events, label_sizes)
    ranks = sorted({b.rank for b in drawn})
    ax.set_yticks(ranks, [f"rank {r}" for r in ranks])
    ax.set_ylim(max(ranks) + 0.6, min(ranks) - 0.6)
    ax._ppbook_drawn_end = max(b.end for b in drawn)
    ax.set_xlim(0, max(getattr(a, "_ppbook_drawn_end", 0.0) for a in ax.get_shared_x_axes().get_siblings(ax)))
    ax.set_xlabel(xlabel if xlabel is not None else ("time" if costs is not None else "step"))
    if title:
        ax.set_title(title, fontsize=10, loc="left")
    ax._ppbook_kinds = {b.kind for b in drawn}  # what timeline.figure_legend reads
    ax._ppbook_chunked = any(b.chunk for b in drawn)
    ax._ppbook_labelled = True
    if legend:
        timeline.figure_legend(ax.figure, "top" if legend == "top" else None)
    return ax


def drawn_blocks(ax) -> list[tuple[int, str, str]]:
    """What a reader sees on ``ax``, once its figure is drawn (the labels choose their text then):
    for every bar, (row, colour as hex, the text drawn inside it, ``""`` where none fits). Tests
    compare it with :func:`blocks`."""
    from matplotlib.colors import to_hex

    said = {id(t.bar): t.get_text() if t.fits else "" for t in ax.texts if hasattr(t, "bar")}
    return [(int(round(bar.get_y() + bar.get_height() / 2)), to_hex(bar.get_facecolor()), said.get(id(bar), ""))
            for bar in ax.patches if id(bar) in said]
