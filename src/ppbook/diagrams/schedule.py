"""A schedule's order drawn as rows per rank, every block labelled with its microbatch.

Introduced in chapter 5 ("The schedules"); chapter 3 uses it too. One picture for one question:
*which pass does each rank run, on which microbatch, in what order?* The blocks come from the
schedule's own order, never from hand-typed coordinates:

- a ppbook order, ``{rank: [Action, ...]}`` (:func:`ppbook.simulate.torch_order` builds it with
  torch's own schedule classes; :func:`ppbook.planner.schedules.order` without torch), or
- torch's ``schedule.pipeline_order`` itself, ``{rank: [_Action | None, ...]}`` (``None`` is a step
  in which the rank idles; an ``OVERLAP_F_B`` pair becomes its two sub-actions, communication and
  gradient-reduction actions are left out). Beware: torch 2.13's ``Schedule1F1B.pipeline_order``
  is wrong for the last rank (see :func:`ppbook.simulate.torch_order`), its ``step`` is right.

Where the blocks go along the row:

- ``costs`` given (``{"F": 1, "I": 1, "W": 1, "B": 2}``, or per ``(stage, kind)``, as for
  :func:`ppbook.simulate.simulate`): the order is simulated with them, so block widths are times
  and white space is idle time (a timeline);
- no ``costs``, torch's ``pipeline_order``: one block per step, where torch put it (an overlapped
  pair shares its step);
- no ``costs``, a plain order: every action costs one step and starts when its input is ready
  (the same simulator with unit costs), so the rows line up as the data flow allows.

Colours: forward (F), full backward (B = I + W), input-gradient pass (I), weight-gradient pass (W),
the same as :data:`ppbook.timeline.KIND_COLOURS`, and the legend's words are the timelines'. The
legend is drawn in the figure. On schedules
where a rank holds several stages (looped and V-shaped), each block is labelled
``microbatch`` over ``s<stage>`` and a rank's later chunks are drawn in a lighter shade.

    >>> from ppbook import simulate
    >>> from ppbook.diagrams import schedule
    >>> ax = schedule.draw(simulate.torch_order("ZBVZeroBubble", 2, 4), title="ZBVZeroBubble")

:func:`blocks` returns what :func:`draw` draws, so a test can compare the picture with the order.
"""

from __future__ import annotations

from dataclasses import dataclass

from ppbook.planner.schedules import Action
from ppbook.planner.simulate import simulate
from ppbook.timeline import KIND_COLOURS
from ppbook.timeline import KIND_NAMES as _NAMES

KIND_NAMES = {k: f"{k}: {name}" for k, name in _NAMES.items()}  # the legend's words, as the timelines'
_TORCH_KINDS = {"FORWARD": "F", "FULL_BACKWARD": "B", "BACKWARD_INPUT": "I", "BACKWARD_WEIGHT": "W"}
LIGHTER = 0.45  # how far a rank's later chunks are mixed towards white (as in ppbook.timeline)


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
    multi: bool  # the rank holds several stages: the label names the stage too

    @property
    def label(self) -> str:
        return f"{self.microbatch}\ns{self.stage}" if self.multi else str(self.microbatch)

    @property
    def action(self) -> Action:
        return Action(self.stage, self.kind, self.microbatch)


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
    multi = any(len(s) > 1 for s in held.values())
    out = [Block(rank, a.stage, a.kind, a.microbatch, s, e, held[rank].index(a.stage), multi)
           for rank, a, s, e in placed]
    return sorted(out, key=lambda b: (b.rank, b.start))


def colour(kind: str, chunk: int = 0) -> tuple[float, float, float]:
    """The block colour of ``kind``; a rank's later chunks lighter."""
    from matplotlib.colors import to_rgb

    base = to_rgb(KIND_COLOURS[kind])
    mix = LIGHTER if chunk else 0.0
    return tuple(c + (1 - c) * mix for c in base)


def legend_handles(kinds, multi: bool = False) -> list:
    """Legend entries for the passes in ``kinds`` (and, when ``multi``, for the shade of later chunks)."""
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=colour(k), label=KIND_NAMES[k]) for k in "FBIW" if k in set(kinds)]
    if multi:
        handles.append(Patch(facecolor=colour("F", 1), label="lighter: the rank's later stage (chunk)"))
    handles.append(Patch(facecolor="white", edgecolor="#999999", label="white: idle (bubble)"))
    return handles


def draw(order, ax=None, costs=None, latency: float = 0.0, title: str | None = None, legend: bool = True,
         fontsize: float = 6.0, xlabel: str | None = None):
    """Draw ``order`` on ``ax`` (rows per rank, rank 0 on top), each block labelled with its
    microbatch (and stage), the legend beside the axis unless ``legend=False`` (then draw one for
    the whole figure with :func:`legend_handles`). Returns ``ax``. Axes that share their x axis
    keep the longest drawn row in view (each draw extends the limit, never shrinks it)."""
    import matplotlib.pyplot as plt

    ax = ax or plt.gca()
    drawn = blocks(order, costs, latency)
    for b in drawn:
        ax.barh(b.rank, b.end - b.start, left=b.start, height=0.8, color=colour(b.kind, b.chunk),
                edgecolor="white", linewidth=0.6)
        text = "white" if b.chunk == 0 else "black"
        ax.text((b.start + b.end) / 2, b.rank, b.label, ha="center", va="center", fontsize=fontsize,
                color=text, linespacing=0.9)
    ranks = sorted({b.rank for b in drawn})
    ax.set_yticks(ranks, [f"rank {r}" for r in ranks])
    ax.set_ylim(max(ranks) + 0.6, min(ranks) - 0.6)
    ax._ppbook_drawn_end = max(b.end for b in drawn)
    ax.set_xlim(0, max(getattr(a, "_ppbook_drawn_end", 0.0) for a in ax.get_shared_x_axes().get_siblings(ax)))
    ax.set_xlabel(xlabel if xlabel is not None else ("time" if costs is not None else "step"))
    if title:
        ax.set_title(title, fontsize=10, loc="left")
    if legend:
        ax.legend(handles=legend_handles({b.kind for b in drawn}, drawn[0].multi), loc="upper left",
                  bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=7)
    return ax


def drawn_blocks(ax) -> list[tuple[int, str, str]]:
    """What a reader sees on ``ax``: for every bar, (row, colour as hex, the text at its centre).
    Tests compare it with :func:`blocks`."""
    from matplotlib.colors import to_hex
    from matplotlib.patches import Rectangle

    texts = {(round(t.get_position()[0], 9), round(t.get_position()[1], 9)): t.get_text() for t in ax.texts}
    out = []
    for bar in ax.patches:
        if isinstance(bar, Rectangle):
            centre = (round(bar.get_x() + bar.get_width() / 2, 9), round(bar.get_y() + bar.get_height() / 2, 9))
            out.append((int(round(centre[1])), to_hex(bar.get_facecolor()), texts.get(centre, "")))
    return out
