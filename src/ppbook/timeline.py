"""Record what every rank of a pipeline did and when, and draw it.

Introduced in chapter 2 ("Naive model parallelism"); the GPipe and schedules chapters use it.

A timeline is a list of events, one per action, in torch's notation: stage 1, forward,
microbatch 3 is ``1F3`` (``F`` forward, ``B`` full backward, ``I`` input-gradient backward,
``W`` weight-gradient backward). The recorder and the simulator (:mod:`ppbook.planner.simulate`) produce
the same format, so one plotting function draws both.

The recorder times the three methods every schedule of ``torch.distributed.pipelining`` calls on
a stage (``forward_one_chunk``, ``backward_one_chunk``, ``backward_weight_one_chunk``) by
wrapping them on the stage *instance*; torch itself is not patched. Receives are waited on
before those calls, so a recorded action is computation and the gaps are waiting. A hand-written
pipeline records its actions with :meth:`Recorder.span`.
"""

from __future__ import annotations

import functools
import time
from statistics import median_high
from contextlib import contextmanager
from dataclasses import asdict

from ppbook.planner.dataflow import waits_on
from ppbook.planner.events import Event  # the format, shared with the torch-free simulator

KIND_COLOURS = {"F": "#4C72B0", "B": "#DD8452", "I": "#C44E52", "W": "#55A868"}


class Recorder:
    """Collects this rank's events for one step at a time."""

    def __init__(self, rank: int):
        self.rank = rank
        self.events: list[Event] = []

    def start_step(self) -> None:
        """Forget the events of earlier steps."""
        self.events = []

    @contextmanager
    def span(self, stage: int, kind: str, microbatch: int):
        # perf_counter is CLOCK_MONOTONIC on Linux: one clock for every process on the host, so
        # the ranks' events line up without a per-rank offset (each rank starting its own clock
        # after a barrier skews them by the barrier's exit jitter, up to a millisecond).
        start = time.perf_counter()
        try:
            yield
        finally:
            self.events.append(Event(self.rank, stage, kind, microbatch, start, time.perf_counter()))

    def attach(self, stage) -> None:
        """Time every action a torch schedule runs on ``stage`` (a ``PipelineStage``)."""
        index = stage.stage_index

        def wrap(method, kind_of):
            @functools.wraps(method)
            def timed(chunk_id, *args, **kwargs):
                with self.span(index, kind_of(kwargs), chunk_id):
                    return method(chunk_id, *args, **kwargs)
            return timed

        stage.forward_one_chunk = wrap(stage.forward_one_chunk, lambda kw: "F")
        # full_backward=False computes only input gradients (zero-bubble schedules split B into I and W)
        stage.backward_one_chunk = wrap(stage.backward_one_chunk,
                                        lambda kw: "B" if kw.get("full_backward", True) else "I")
        stage.backward_weight_one_chunk = wrap(stage.backward_weight_one_chunk, lambda kw: "W")


def to_json(events: list[Event]) -> list[dict]:
    return [asdict(e) for e in events]


def from_json(rows: list[dict]) -> list[Event]:
    return [Event(**row) for row in rows]


def gather(recorder: Recorder) -> list[Event] | None:
    """Every rank's events on rank 0, sorted, with times from the step's first action; ``None``
    elsewhere. Ranks on one host share the clock; across hosts this assumes synchronised clocks."""
    import torch.distributed as dist

    from ppbook.dist import gather_to_rank0

    out = gather_to_rank0(to_json(recorder.events)) if dist.is_initialized() else [to_json(recorder.events)]
    if out is None:
        return None
    events = [e for rows in out for e in from_json(rows)]
    t0 = min((e.start for e in events), default=0.0)
    return sorted((Event(e.rank, e.stage, e.kind, e.microbatch, e.start - t0, e.end - t0) for e in events),
                  key=lambda e: e.start)


# ---------------------------------------------------------------------------------------------
# Reading a timeline
# ---------------------------------------------------------------------------------------------
def span(events: list[Event]) -> tuple[float, float]:
    """From the first action's start to the last action's end: the step as the pipeline saw it."""
    return min(e.start for e in events), max(e.end for e in events)


def busy_fraction(events: list[Event], rank: int) -> float:
    """Share of the step during which ``rank`` was computing (the rest is bubble or waiting)."""
    t0, t1 = span(events)
    return sum(e.duration for e in events if e.rank == rank) / (t1 - t0)


def busy_fractions(events: list[Event]) -> dict[int, float]:
    return {r: busy_fraction(events, r) for r in sorted({e.rank for e in events})}


def mean_costs(events: list[Event]) -> dict[tuple[int, str], float]:
    """Mean duration of each (stage, kind): the costs to feed the simulator."""
    sums: dict[tuple[int, str], list[float]] = {}
    for e in events:
        sums.setdefault((e.stage, e.kind), []).append(e.duration)
    return {k: sum(v) / len(v) for k, v in sums.items()}


def handoff_delays(events: list[Event]) -> list[float]:
    """For every action whose input came from another rank that was already waiting for it:
    the delay from the sender finishing to the receiver starting (one hand-off, measured)."""
    by_key = {(e.stage, e.kind, e.microbatch): e for e in events}
    num_stages = 1 + max((e.stage for e in events), default=0)
    free_at: dict[int, float] = {}
    delays = []
    for e in sorted(events, key=lambda e: e.start):
        dep = _dependency_of(e, by_key, num_stages)
        if dep is not None and dep.rank != e.rank and free_at.get(e.rank, 0.0) <= dep.end:
            delays.append(e.start - dep.end)
        free_at[e.rank] = e.end
    return delays


def comm_latency(events: list[Event]) -> float:
    """Median hand-off delay (:func:`handoff_delays`): the typical cost of one point-to-point hand-off."""
    delays = handoff_delays(events)
    return median_high(delays) if delays else 0.0


def _dependency_of(e: Event, by_key: dict, num_stages: int) -> Event | None:
    """The recorded event ``e`` waited on (:func:`ppbook.planner.dataflow.waits_on`), if it was recorded."""
    dep = waits_on(e.stage, e.kind, e.microbatch, num_stages, by_key.__contains__)
    return None if dep is None else by_key.get(dep)


def own_gaps(events: list[Event], latency: float) -> dict[tuple[int, str], list[float]]:
    """The gap before each action that did not wait for a peer (its input had arrived, given the
    hand-off ``latency``), grouped by (stage, kind): time a rank spends between actions on its own."""
    by_key = {(e.stage, e.kind, e.microbatch): e for e in events}
    num_stages = 1 + max((e.stage for e in events), default=0)
    gaps: dict[tuple[int, str], list[float]] = {}
    for rank in {e.rank for e in events}:
        mine = sorted((e for e in events if e.rank == rank), key=lambda e: e.start)
        for prev, cur in zip(mine, mine[1:]):
            dep = _dependency_of(cur, by_key, num_stages)
            if dep is None or dep.rank == rank or dep.end + latency <= prev.end:
                gaps.setdefault((cur.stage, cur.kind), []).append(cur.start - prev.end)
    return gaps


def action_overheads(steps: list[list[Event]], latency: float) -> dict[tuple[int, str], float]:
    """Median :func:`own_gaps` per (stage, kind), pooled over the timelines of several steps.

    They differ by kind: schedule bookkeeping and the loss are small, but on a busy 2-core host
    a backward whose gradient was sent while its rank was still busy can wait milliseconds for
    the sender's communication thread, which competes with the sender's compute for a core."""
    pooled: dict[tuple[int, str], list[float]] = {}
    for events in steps:
        for key, values in own_gaps(events, latency).items():
            pooled.setdefault(key, []).extend(values)
    return {key: median_high(v) for key, v in pooled.items()}


KIND_NAMES = {"F": "forward", "B": "backward (full)", "I": "backward, input gradients",
              "W": "backward, weight gradients"}
_LATER_CHUNK_TINT = 0.45  # a rank's later stages (chunks) drawn this much closer to white
_LABEL_SIZES = (7, 6, 5)  # font sizes tried, largest first; below the last a block stays unlabelled
_FOLLOW_EDGE = "#111111"  # the outline of the microbatch a figure lets the reader follow
_LATER_CHUNK_HATCH = "///"  # a rank's later stages are also hatched: told apart by more than lightness


def block_labels(events: list[Event]) -> dict[Event, list[str]]:
    """What each block of :func:`plot` may say, longest first; the first that fits is drawn.

    A rank holding one stage: ``"F3"`` then ``"3"`` (the microbatch). A rank holding several
    stages (looped and V-shaped schedules, where each stage is a *chunk* of the rank's layers):
    torch's notation ``"5F3"`` (stage 5, forward, microbatch 3), then the microbatch over the
    stage (``"3\\ns5"``), then the microbatch alone; later chunks are also tinted lighter."""
    several = {rank for (rank, _), chunk in _chunk_of(events).items() if chunk > 0}
    out = {}
    for e in events:
        if e.rank in several:
            out[e] = [e.label, f"{e.microbatch}\ns{e.stage}", str(e.microbatch)]
        else:
            out[e] = [f"{e.kind}{e.microbatch}", str(e.microbatch)]
    return out


def _chunk_of(events: list[Event]) -> dict[tuple[int, int], int]:
    """(rank, stage) -> the stage's position among the rank's stages (0: the rank's first chunk)."""
    per_rank: dict[int, set[int]] = {}
    for e in events:
        per_rank.setdefault(e.rank, set()).add(e.stage)
    return {(r, s): i for r, stages in per_rank.items() for i, s in enumerate(sorted(stages))}


def _tint(colour: str, amount: float) -> tuple[float, float, float]:
    from matplotlib.colors import to_rgb

    return tuple(c + (1 - c) * amount for c in to_rgb(colour))


@functools.lru_cache(maxsize=None)  # one class: a panel's labels are chosen together
def _block_label_class():
    """A text that chooses, each time its axes is drawn, what to say inside its block at the final
    size of the figure (after ``tight_layout``, shared limits, ``savefig``'s dpi): one level of
    :func:`block_labels` and one font size for every block of the axes, the longest and largest
    at which every block that can hold a label holds it, so that one panel reads one way. A block
    too small for the shortest label at the smallest size stays bare: no label spills out."""
    from matplotlib.text import Text

    class BlockLabel(Text):
        extents: dict = {}  # (renderer, scale, text, size) -> (width, height) in pixels
        def __init__(self, bar, candidates, **kwargs):
            super().__init__(0, 0, candidates[0], ha="center", va="center", **kwargs)
            self.bar, self.candidates, self.fits = bar, candidates, True

        def _fits(self, renderer, text, size, box=None) -> bool:
            box = self.bar.get_window_extent(renderer) if box is None else box  # _choose passes it
            pad = 1.5 * renderer.points_to_pixels(1.0)
            self.set_text(text)
            self.set_fontsize(size)
            key = (id(renderer), renderer.points_to_pixels(1.0), text, size)  # same text, same extent
            if key not in BlockLabel.extents:
                own = super().get_window_extent(renderer)
                BlockLabel.extents[key] = (own.width, own.height)
            width, height = BlockLabel.extents[key]
            return width <= box.width - pad and height <= box.height - pad

        def draw(self, renderer):
            ax = self.axes
            key = (id(renderer), tuple(ax.bbox.bounds), ax.get_xlim(), ax.get_ylim())
            if getattr(ax, "_ppbook_label_choice", (None,))[0] != key:
                sizes = getattr(ax, "_ppbook_label_sizes", _LABEL_SIZES)
                ax._ppbook_label_choice = (key, _choose(renderer, [t for t in ax.texts if isinstance(t, BlockLabel)],
                                                        sizes))
            level, size = ax._ppbook_label_choice[1]
            self.set_position((self.bar.get_x() + self.bar.get_width() / 2, self.bar.get_y() + self.bar.get_height() / 2))
            text = self.candidates[min(level, len(self.candidates) - 1)]
            self.fits = self._fits(renderer, text, size)
            if self.fits:
                super().draw(renderer)

    def _choose(renderer, labels, sizes=_LABEL_SIZES) -> tuple[int, int]:
        """(level, size): the first, in order of preference, that every labellable block fits. A
        shorter label at a readable size beats a longer one at the smallest: the colour already
        says the kind, so ``"3"`` at 7 points reads better than ``"F3"`` at 5. And where only a few
        blocks (one in ten at most, say a sliver a noisy host recorded) would hold a label at the
        smallest size alone, those few stay bare rather than shrink the whole panel's type."""
        smallest, readable_min = sizes[-1], sizes[-2]
        boxes = {id(b): b.bar.get_window_extent(renderer) for b in labels}  # each block's, once: tried often
        able = [b for b in labels if b._fits(renderer, b.candidates[-1], smallest, boxes[id(b)])]
        legible = [b for b in able if b._fits(renderer, b.candidates[-1], readable_min, boxes[id(b)])]
        depth = max((len(b.candidates) for b in labels), default=1)

        def every(blocks, level, size):
            return all(b._fits(renderer, b.candidates[min(level, len(b.candidates) - 1)], size, boxes[id(b)])
                       for b in blocks)

        readable = [(level, size) for level in range(depth) for size in sizes[:-1]]
        for level, size in readable:
            if every(able, level, size):
                return level, size
        if legible and 10 * len(legible) >= 9 * len(able):
            for level, size in readable:
                if every(legible, level, size):
                    return level, size
        for level in range(depth):
            if every(able, level, smallest):
                return level, smallest
        return depth - 1, smallest

    return BlockLabel


def plot(events: list[Event], ax=None, title: str | None = None, labels: bool = True, time_unit: str = "ms",
         legend: bool | str = True, follow: int | None = None, label_sizes: tuple[int, ...] | None = None):
    """A per-rank Gantt chart: one row per rank, one bar per action, white gaps are idle time.

    Each block names its microbatch (and, on a rank holding several stages, its stage: see
    :func:`block_labels`) where it fits; ``labels=False`` leaves the blocks bare. ``legend`` puts
    the colours' meaning in the figure, once per figure, beside its top panel (a figure of several
    timelines gets one legend for the kinds of all of them; ``"top"``: above the panels, in rows,
    which leaves the panels the figure's whole width). ``follow`` outlines every block of that
    microbatch, so a reader can follow it through the pipeline (:func:`style_blocks`);
    ``label_sizes`` are the font sizes the labels may take, largest first (default 7, 6, 5)."""
    import matplotlib.pyplot as plt

    scale = {"s": 1.0, "ms": 1e3}[time_unit]
    ax = ax or plt.gca()
    t0, t1 = span(events)
    ranks = sorted({e.rank for e in events})
    chunk = _chunk_of(events)
    bars = []
    for e in events:
        x, w = (e.start - t0) * scale, e.duration * scale
        (bar,) = ax.barh(e.rank, w, left=x, height=0.8, color=block_colour(e, chunk), edgecolor="white",
                         linewidth=0.5)
        bars.append(bar)
    style_blocks(ax, bars, events, follow)
    if labels:
        label_blocks(ax, bars, events, label_sizes)
    ax.set_yticks(ranks, [f"rank {r}" for r in ranks])
    ax.set_ylim(max(ranks) + 0.6, min(ranks) - 0.6)
    # Axes made with sharex=True share one x-limit: setting it to this timeline's span would cut
    # every longer timeline drawn before (the last one drawn wins). Extend it, never shrink it.
    ax._ppbook_drawn_end = (t1 - t0) * scale
    ax.set_xlim(0, max(getattr(a, "_ppbook_drawn_end", 0.0) for a in ax.get_shared_x_axes().get_siblings(ax)))
    ax.set_xlabel(f"time ({time_unit})")
    if title:
        ax.set_title(title, fontsize=10, loc="left")
    ax._ppbook_kinds = {e.kind for e in events}
    ax._ppbook_chunked = len(chunk) > len(ranks)
    ax._ppbook_labelled = labels
    if legend:
        figure_legend(ax.figure, "top" if legend == "top" else None)
    return ax


def block_colour(e: Event, chunk: dict[tuple[int, int], int]):
    """The colour of ``e``'s block: its kind's, lighter on a rank's later stages (``chunk`` as
    :func:`_chunk_of` gives it)."""
    later = chunk[(e.rank, e.stage)] > 0
    return _tint(KIND_COLOURS[e.kind], _LATER_CHUNK_TINT) if later else KIND_COLOURS[e.kind]


def style_blocks(ax, bars, events: list[Event], follow: int | None = None) -> None:
    """What a block shows besides its colour, as :func:`plot` draws it: a rank's later stages
    (chunks) hatched as well as lighter, so they are told apart without reading shades; and, with
    ``follow``, a dark outline around every block of that microbatch, drawn over its neighbours, so
    that one microbatch can be followed from rank to rank (the legend says which)."""
    chunk = _chunk_of(events)
    for e, bar in zip(events, bars, strict=True):
        if chunk[(e.rank, e.stage)] > 0:
            bar.set_hatch(_LATER_CHUNK_HATCH)
            bar.set_hatchcolor("white")
        if follow is not None and e.microbatch == follow:
            bar.set_edgecolor(_FOLLOW_EDGE)
            bar.set_linewidth(1.6)
            bar.set_zorder(2)
    ax._ppbook_followed = follow if any(e.microbatch == follow for e in events) else None


def followed_bars(ax) -> list:
    """The bars of ``ax`` outlined by :func:`style_blocks` (those of the followed microbatch)."""
    from matplotlib.colors import same_color

    return [b for b in ax.patches if same_color(b.get_edgecolor(), _FOLLOW_EDGE)]


def label_blocks(ax, bars, events: list[Event], sizes: tuple[int, ...] | None = None) -> None:
    """Label each of ``bars`` (drawn for ``events``, in the same order) with its microbatch, as
    :func:`plot` does: for any chart whose bars are a timeline's actions (chapter 13 draws
    overlapped pairs in half rows). The labels choose what fits when the figure is drawn, at one
    of ``sizes`` (points, largest first; at least two)."""
    if sizes is not None:
        if len(sizes) < 2 or list(sizes) != sorted(sizes, reverse=True):
            raise ValueError(f"label sizes {sizes!r}: give two or more font sizes, largest first, e.g. (9, 8, 7)")
        ax._ppbook_label_sizes = tuple(sizes)
    texts, chunk = block_labels(events), _chunk_of(events)
    BlockLabel = _block_label_class()
    for e, bar in zip(events, bars, strict=True):
        label = BlockLabel(bar, texts[e], color="#222222" if chunk[(e.rank, e.stage)] > 0 else "white", clip_on=True)
        label.set_in_layout(False)  # it fits inside its block: it never widens the figure
        ax.add_artist(label)


def figure_legend(fig, where: str | None = None) -> None:
    """One legend for every timeline of ``fig``: the kinds drawn, the tint (and hatching) of later
    chunks where a rank holds several stages, the outline of a followed microbatch, and idle time.
    ``where``: ``"right"`` (the default) beside the top-right timeline, outside its axes; ``"top"``
    above all panels, in rows (it needs ``layout="constrained"``, which makes room for it); the
    figure keeps the last choice. :func:`plot` calls it; a chart drawn otherwise sets
    ``ax._ppbook_kinds`` (the kinds drawn), ``ax._ppbook_chunked`` and ``ax._ppbook_labelled`` on
    its axes and calls it too."""
    from matplotlib.patches import Patch

    if where not in (None, "right", "top"):
        raise ValueError(f"legend place {where!r}: use 'right' or 'top'")
    where = fig._ppbook_legend_where = where or getattr(fig, "_ppbook_legend_where", "right")
    drawn = [a for a in fig.axes if hasattr(a, "_ppbook_kinds")]
    for holder in [*drawn, fig]:
        if getattr(holder, "_ppbook_legend", None) is not None:
            holder._ppbook_legend.remove()
            holder._ppbook_legend = None
    kinds = set().union(*(a._ppbook_kinds for a in drawn))
    handles = [Patch(color=KIND_COLOURS[k], label=f"{k}: {KIND_NAMES[k]}") for k in "FBIW" if k in kinds]
    if any(a._ppbook_chunked for a in drawn):
        handles.append(Patch(facecolor=_tint(KIND_COLOURS["F"], _LATER_CHUNK_TINT), hatch=_LATER_CHUNK_HATCH,
                             edgecolor="white", label="lighter, hatched: the rank's later stage (chunk)"))
    followed = {a._ppbook_followed for a in drawn if getattr(a, "_ppbook_followed", None) is not None}
    for k in sorted(followed):
        handles.append(Patch(facecolor="white", edgecolor=_FOLLOW_EDGE, linewidth=1.6,
                             label=f"outlined: microbatch {k}"))
    handles.append(Patch(facecolor="white", edgecolor="#999999", label="white: idle (bubble)"))
    title = None
    if any(a._ppbook_labelled for a in drawn):
        title = "a block's label: pass and microbatch\n(F3 = forward of microbatch 3" + (
            ";\n5F3, or 3 over s5 = on stage 5)" if any(a._ppbook_chunked for a in drawn) else ")")
    if where == "top":
        if title:
            title = " ".join(title.split("\n"))
        fig._ppbook_legend = fig.legend(handles=handles, loc="outside upper left", ncol=3, fontsize=8,
                                        frameon=False, title=title, title_fontsize=8, alignment="left")
        return
    # the top panel, the rightmost of those on top (a grid of panels): its legend lies outside it
    top = max(drawn, key=lambda a: (round(a.get_position().y1, 3), a.get_position().x1))
    top._ppbook_legend = top.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7,
                                    frameon=False, title=title, title_fontsize=7, alignment="left")


def cut_bars(fig) -> list[str]:
    """Every bar of ``fig`` that ends beyond its axis's right x-limit, as ``"title: label"``
    (empty when every drawn timeline ends within its axis). Chapters check their timeline
    figures with it, so that a figure cannot hide the end of a schedule."""
    from matplotlib.patches import Rectangle

    cut = []
    for ax in fig.axes:
        right = ax.get_xlim()[1]
        for bar in ax.patches:
            if isinstance(bar, Rectangle) and bar.get_x() + bar.get_width() > right * (1 + 1e-9) + 1e-12:
                cut.append(f"{ax.get_title(loc='left')}: bar ending at {bar.get_x() + bar.get_width():g}")
    return cut
