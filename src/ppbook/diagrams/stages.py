"""Devices as boxes holding their layers, activations forward and gradients back (chapters 1 and 2).

Introduced in chapter 1 ("Your first pipeline"). The boxes are filled from a real split of a
chapter's model (:func:`held_parts` of each stage module), the arrows from the number of stages,
and chapter 2's moments from the simulated order of naive model parallelism, so the picture
cannot drift from the code. Every artist that carries meaning has a ``gid`` (``"stage-0"``,
``"activation"``, ``"gradient"``, ``"busy"``, ``"microbatch-3"`` ...), which
:func:`shown` reads back from the drawn figure: the tests check what the figure shows, not
what was meant to be drawn.
"""

from __future__ import annotations

from collections import Counter

from ppbook.planner.schedules import gpipe_order
from ppbook.planner.simulate import simulate
from ppbook.timeline import KIND_COLOURS  # the timelines' colours: F and B look the same everywhere
BOX_FACE = "#F2F2F2"
IDLE_FACE = "#FFFFFF"
TEXT = "#222222"


def held_parts(module) -> list[str]:
    """The parts a stage module holds, in order: its direct children that are not ``None``, a
    ``ModuleDict`` or ``ModuleList`` spelt out by key (``["embed", "layers.0", "layers.1"]``)."""
    import torch.nn as nn

    parts = []
    for name, child in module.named_children():  # a part set to None is not a child
        if isinstance(child, (nn.ModuleDict, nn.ModuleList)):
            parts += [f"{name}.{key}" for key, _ in child.named_children()]
        else:
            parts.append(name)
    return parts


def naive_moments(num_stages: int) -> list[tuple[int, str, str]]:
    """``(rank, kind, action)`` of naive model parallelism, one per moment: the whole batch
    (microbatch 0) runs forward down the stages and backward up them, from the simulated order
    with equal times (:func:`ppbook.planner.simulate.simulate`, chapter 2)."""
    events = simulate(gpipe_order(num_stages, 1), {"F": 1.0, "B": 1.0})
    moments = sorted(events, key=lambda e: e.start)
    if [e.start for e in moments] != list(range(len(moments))):
        raise AssertionError("naive model parallelism should run one action per moment")
    return [(e.rank, e.kind, f"{e.stage}{e.kind}{e.microbatch}") for e in moments]


def _device_box(ax, x: float, y: float, w: float, h: float, rank: int, parts: list[str], face=BOX_FACE):
    from matplotlib.patches import FancyBboxPatch

    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08", facecolor=face,
                                edgecolor="#555555", linewidth=1.2, gid=f"box-{rank}"))
    ax.text(x + w / 2, y + h - 0.12, f"device {rank} (rank {rank})", ha="center", va="top", fontsize=9,
            fontweight="bold", color=TEXT, gid=f"device-{rank}")
    ax.text(x + w / 2, y + h - 0.38, "\n".join(parts), ha="center", va="top", fontsize=8, family="monospace",
            color=TEXT, linespacing=1.35, gid=f"stage-{rank}")


def _arrow(ax, start, end, kind: str, label: str, label_at, colour: str, gid: str, rad: float = 0.0):
    from matplotlib.patches import FancyArrowPatch

    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=14, linewidth=1.8, color=colour,
                                 connectionstyle=f"arc3,rad={rad}", gid=gid))
    ax.text(*label_at, label, ha="center", va="center", fontsize=8, color=colour, gid=f"{gid}-label")


def pipeline_figure(stages: list[list[str]], microbatches: int = 1, ax=None):
    """Chapter 1's picture: one box per device holding ``stages[r]`` (its parts, from
    :func:`held_parts`), the batch cut into ``microbatches`` numbered pieces entering device 0,
    an arrow of activations (F) from each device to the next and one of gradients (B) back, and
    the loss taken on the last device. Returns the figure."""
    import matplotlib.pyplot as plt

    p = len(stages)
    if p < 1 or microbatches < 1:
        raise ValueError(f"need at least one stage and one microbatch, got {p} and {microbatches}")
    w, gap = 2.3, 1.5
    h = 0.75 + 0.22 * max(len(s) for s in stages)
    x0 = 1.6  # the microbatches' column is left of it
    width = x0 + p * w + (p - 1) * gap + 1.6
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(0.85 * width, 0.85 * (h + 0.45) + 0.2))
    mid = h / 2
    # the batch, cut into numbered microbatches (all enter device 0, one after another)
    size = min(0.3, (h - 0.2) / microbatches)
    top = mid + size * microbatches / 2
    for j in range(microbatches):
        y = top - (j + 1) * size
        ax.add_patch(plt.Rectangle((0.35, y), 0.5, size * 0.9, facecolor="#FFFFFF", edgecolor="#555555",
                                   gid=f"microbatch-{j}"))
        ax.text(0.6, y + size * 0.45, str(j), ha="center", va="center", fontsize=8, color=TEXT,
                gid=f"microbatch-{j}-label")
    ax.text(0.6, top + 0.12, f"m = {microbatches}\nmicrobatches", ha="center", va="bottom", fontsize=8, color=TEXT)
    ax.annotate("", (x0 - 0.05, mid), (0.9, mid), arrowprops=dict(arrowstyle="-|>", color="#555555"))
    for r, parts in enumerate(stages):
        _device_box(ax, x0 + r * (w + gap), 0, w, h, r, parts)
    for r in range(p - 1):
        right, left = x0 + r * (w + gap) + w, x0 + (r + 1) * (w + gap)
        centre = (right + left) / 2
        _arrow(ax, (right + 0.08, mid + 0.35), (left - 0.08, mid + 0.35), "F", "activations\n(F)",
               (centre, mid + 0.75), KIND_COLOURS["F"], "activation")
        _arrow(ax, (left - 0.08, mid - 0.35), (right + 0.08, mid - 0.35), "B", "gradients\n(B)",
               (centre, mid - 0.75), KIND_COLOURS["B"], "gradient")
    end = x0 + p * w + (p - 1) * gap
    ax.text(end + 0.85, mid, "loss of\neach\nmicrobatch", ha="center", va="center", fontsize=8, color=TEXT,
            gid="loss")
    ax.annotate("", (end + 0.35, mid), (end + 0.08, mid), arrowprops=dict(arrowstyle="-|>", color="#555555"))
    ax.set_xlim(0, width)
    ax.set_ylim(-0.15, h + 0.3)
    ax.set_aspect("equal")
    ax.axis("off")
    return fig if fig is not None else ax.figure


def naive_figure(stages: list[list[str]], ax=None):
    """Chapter 2's picture: the devices holding ``stages[r]`` on top, then one row per moment of
    naive model parallelism (:func:`naive_moments`): the one device that works is filled and
    labelled with its action (``1F0``: stage 1, forward, microbatch 0, the whole batch), every
    other device is idle; an arrow carries the activation to the next device, or the gradient
    back. Returns the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    p = len(stages)
    if p < 1:
        raise ValueError("need at least one stage")
    moments = naive_moments(p)
    w, gap, row = 2.25, 0.4, 0.55
    h = 0.55 + 0.2 * max(len(s) for s in stages)
    x0 = 1.2
    width = x0 + p * w + (p - 1) * gap + 0.2
    height = h + 0.3 + row * len(moments)
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(0.8 * width, 0.8 * height + 0.5))
    for r, parts in enumerate(stages):
        _device_box(ax, x0 + r * (w + gap), 0, w, h, r, parts)
    centres = []
    for t, (rank, kind, action) in enumerate(moments):
        y = -0.3 - (t + 1) * row
        ax.text(x0 - 0.15, y + row * 0.42, f"moment {t + 1}", ha="right", va="center", fontsize=8, color=TEXT)
        for r in range(p):
            x = x0 + r * (w + gap)
            busy = r == rank
            ax.add_patch(plt.Rectangle((x + 0.15, y), w - 0.3, row * 0.84, facecolor=KIND_COLOURS[kind] if busy
                                       else IDLE_FACE, edgecolor="#999999", linewidth=0.8,
                                       gid="busy" if busy else "idle"))
            ax.text(x + w / 2, y + row * 0.42, action if busy else "idle", ha="center", va="center", fontsize=8,
                    color="white" if busy else "#999999", fontweight="bold" if busy else "normal",
                    gid=f"action-{t}" if busy else None)
        centres.append((x0 + rank * (w + gap) + w / 2, y + row * 0.42))
    for t in range(len(moments) - 1):
        (r0, k0, _), (r1, k1, _) = moments[t], moments[t + 1]
        if r0 == r1:
            continue  # the last device turns its forward into the loss and starts the backward
        (xa, ya), (xb, yb) = centres[t], centres[t + 1]
        side = (w - 0.3) / 2 - 0.05
        start = (xa + side, ya) if r1 > r0 else (xa - side, ya)
        end = (xb - side, yb) if r1 > r0 else (xb + side, yb)
        kind = "activation" if k1 == "F" else "gradient"
        _arrow(ax, start, end, k1, "", (0, 0), KIND_COLOURS[k1], kind, rad=-0.25 if r1 > r0 else 0.25)
    ax.legend(handles=[Patch(color=KIND_COLOURS["F"], label="F: forward (arrow: activation)"),
                       Patch(color=KIND_COLOURS["B"], label="B: backward (arrow: gradient)"),
                       Patch(facecolor=IDLE_FACE, edgecolor="#999999", label="idle")],
              loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=3, fontsize=8, frameon=False)
    ax.set_xlim(0, width)
    ax.set_ylim(-0.4 - row * len(moments), h + 0.15)
    ax.set_aspect("equal")
    ax.axis("off")
    return fig if fig is not None else ax.figure


def shown(fig) -> dict:
    """What a figure drawn here shows, read back from its artists: each device's parts (one per
    line of its box), the arrows by kind, the busy and idle cells, the numbered microbatches and
    the actions in order."""
    texts, patches = {}, Counter()
    for ax in fig.axes:
        for artist in ax.texts:
            if artist.get_gid():
                texts[artist.get_gid()] = artist.get_text()
        for patch in ax.patches:
            if patch.get_gid():
                patches[patch.get_gid().split("-")[0] if patch.get_gid().startswith("microbatch") else
                        patch.get_gid()] += 1
    stages = sorted((int(k.split("-")[1]), v.split("\n")) for k, v in texts.items() if k.startswith("stage-"))
    actions = sorted((int(k.split("-")[1]), v) for k, v in texts.items() if k.startswith("action-"))
    microbatches = sorted(int(v) for k, v in texts.items() if k.startswith("microbatch-") and k.endswith("-label"))
    return {"stages": [parts for _, parts in stages], "activation": patches["activation"],
            "gradient": patches["gradient"], "busy": patches["busy"], "idle": patches["idle"],
            "microbatches": microbatches, "actions": [a for _, a in actions], "loss": "loss" in texts}
