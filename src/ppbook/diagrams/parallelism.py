"""Data, tensor and pipeline parallelism side by side on one model: what each device holds, and
what crosses between devices.

Introduced in chapter 0 ("Why models outgrow one device"). One picture for one question: *if a
model of ``n_layers`` layers is trained on ``n_devices`` devices, which part of it does each device
hold, and what must the devices send each other?* The three answers come from the layer and device
counts, never from hand-typed coordinates:

- data parallelism: every device holds every layer and works on its own share of the batch; the
  devices average their gradients once per step (an all-reduce);
- tensor parallelism: every device holds a ``1/n_devices`` slice of every layer's matrices and
  works on the whole batch; the devices combine partial results inside every layer, forward and
  backward;
- pipeline parallelism: each device holds a contiguous run of layers, a stage, as the book's
  :func:`ppbook.stages.assign_layers` spreads them; a device sends its activations to the next
  one and receives their gradients back, at stage boundaries only.

    >>> from ppbook.diagrams import parallelism
    >>> fig = parallelism.draw(n_layers=8, n_devices=4)

:func:`layouts` returns what :func:`draw` draws, so a test can compare the picture with it: every
layer rectangle carries the ``gid`` ``"<kind>/device<d>/layer<l>"``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ppbook.stages import assign_layers

KINDS = ("data", "tensor", "pipeline")
TITLES = {"data": "data parallelism (DP)", "tensor": "tensor parallelism (TP)",
          "pipeline": "pipeline parallelism (PP)"}


@dataclass(frozen=True)
class Device:
    """One device of a layout: the layers it holds, which slice of each (``slice_index`` of
    ``slices``; one slice of one is the whole layer), and the data it works on."""
    index: int
    layers: tuple[int, ...]
    slice_index: int
    slices: int

    @property
    def holds(self) -> str:
        """What the device holds, in words (the text in its box)."""
        if self.slices > 1:  # every device holds the same share; where its slice sits tells them apart
            return f"1/{self.slices} of\nevery layer"
        if len(self.layers) == 1:
            return f"layer {self.layers[0]}"
        return f"layers {self.layers[0]}-{self.layers[-1]}"


@dataclass(frozen=True)
class Layout:
    """One way of dividing the model: its devices and what crosses between them."""
    kind: str
    devices: tuple[Device, ...]
    data: str  # what data each device works on
    crossing: str  # what the devices send each other, and how often

    @property
    def title(self) -> str:
        return TITLES[self.kind]


def layout(kind: str, n_layers: int, n_devices: int) -> Layout:
    """What each of ``n_devices`` devices holds of a model of ``n_layers`` layers under ``kind``
    (``"data"``, ``"tensor"`` or ``"pipeline"``), and what they exchange."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r} is not one of {', '.join(KINDS)}")
    if n_layers < 1 or n_devices < 1:
        raise ValueError(f"need at least one layer and one device, got {n_layers} layers, {n_devices} devices")
    if kind == "pipeline" and n_devices > n_layers:
        raise ValueError(f"a pipeline of {n_devices} stages needs at least {n_devices} layers, got {n_layers}; "
                         "use fewer devices or more layers")
    every = tuple(range(n_layers))
    if kind == "data":
        devices = tuple(Device(d, every, 0, 1) for d in range(n_devices))
        data = f"each GPU: its own 1/{n_devices} of the batch"
        crossing = "gradients: averaged once per step (all-reduce)"
    elif kind == "tensor":
        devices = tuple(Device(d, every, d, n_devices) for d in range(n_devices))
        data = "each GPU: the whole batch"
        crossing = "partial results: combined in every layer,\nforward and backward (all-reduce)"
    else:
        devices = tuple(Device(d, tuple(ls), 0, 1) for d, ls in enumerate(assign_layers(n_layers, n_devices)))
        data = "each GPU: every microbatch, in turn"
        crossing = "activations forward, gradients back:\nonly at stage boundaries (send/recv)"
    return Layout(kind, devices, data, crossing)


def layouts(n_layers: int, n_devices: int) -> list[Layout]:
    """The three layouts of :func:`draw`, in its order: data, tensor, pipeline."""
    return [layout(kind, n_layers, n_devices) for kind in KINDS]


BOX_W, GAP, BAR_H = 1.0, 0.45, 0.32  # a device's box width, the space between boxes, a layer's height
FORWARD, BACKWARD, BOTH = "#C44E52", "#4C72B0", "#7A5195"  # what crosses: activations, gradients, both


def _layer_colour(layer: int, n_layers: int):
    import matplotlib

    return matplotlib.colormaps["viridis"](0.15 + 0.7 * layer / max(1, n_layers - 1))


def draw_layout(ax, lay: Layout, n_layers: int) -> None:
    """One panel: the devices as boxes side by side, each holding its layers (layer 0 at the
    bottom, the same colour for a layer in every panel), the data each works on below it, and
    what crosses between the devices under that."""
    from matplotlib.patches import FancyArrowPatch, Rectangle

    height = n_layers * BAR_H + 0.2
    for dev in lay.devices:
        x0 = dev.index * (BOX_W + GAP)
        ax.add_patch(Rectangle((x0, 0), BOX_W, height, fill=False, linewidth=1.2, edgecolor="#333333",
                               gid=f"{lay.kind}/device{dev.index}"))
        ax.text(x0 + BOX_W / 2, height + 0.12, f"GPU {dev.index}", ha="center", va="bottom", fontsize=8,
                fontweight="bold")
        width = (BOX_W - 0.2) / dev.slices
        for layer in dev.layers:
            # a slice sits where it would in the whole layer: the outline shows the rest is elsewhere
            if dev.slices > 1:
                ax.add_patch(Rectangle((x0 + 0.1, 0.1 + layer * BAR_H), BOX_W - 0.2, BAR_H * 0.8, fill=False,
                                       linestyle=":", linewidth=0.6, edgecolor="#888888"))
            ax.add_patch(Rectangle((x0 + 0.1 + dev.slice_index * width, 0.1 + layer * BAR_H), width, BAR_H * 0.8,
                                   facecolor=_layer_colour(layer, n_layers), edgecolor="white", linewidth=0.4,
                                   gid=f"{lay.kind}/device{dev.index}/layer{layer}"))
        ax.text(x0 + BOX_W / 2, -0.12, dev.holds, ha="center", va="top", fontsize=7)
    n = len(lay.devices)
    right = n * BOX_W + (n - 1) * GAP
    if lay.kind == "pipeline":  # a hand-off between consecutive stages, at the height of their boundary
        for a, b in zip(lay.devices, lay.devices[1:]):
            y = 0.1 + (a.layers[-1] + 0.9) * BAR_H
            x1, x2 = a.index * (BOX_W + GAP) + BOX_W, b.index * (BOX_W + GAP)
            ax.add_patch(FancyArrowPatch((x1, y), (x2, y), arrowstyle="-|>", mutation_scale=11, linewidth=1.4,
                                         color=FORWARD))
            ax.add_patch(FancyArrowPatch((x2, y - 0.17), (x1, y - 0.17), arrowstyle="-|>", mutation_scale=11,
                                         linewidth=1.4, color=BACKWARD))
    else:  # every device talks to every other: one bracket under them all
        ax.add_patch(FancyArrowPatch((0.1, -1.05), (right - 0.1, -1.05), arrowstyle="<|-|>", mutation_scale=8,
                                     color=BOTH if lay.kind == "tensor" else BACKWARD))
    ax.text(right / 2, -0.72, lay.data, ha="center", va="top", fontsize=7, color="#555555")
    ax.text(right / 2, -1.2, lay.crossing, ha="center", va="top", fontsize=7)
    ax.set_title(lay.title, fontsize=9)
    ax.set_xlim(-0.15, right + 0.15)
    ax.set_ylim(-1.85, height + 0.45)
    ax.set_aspect("auto")
    ax.axis("off")


def draw(n_layers: int = 8, n_devices: int = 4, axes=None):
    """Data, tensor and pipeline parallelism of one ``n_layers``-layer model on ``n_devices``
    devices, one panel each (on ``axes``, three matplotlib axes, or a new figure). Returns the figure."""
    import matplotlib.pyplot as plt

    if axes is None:
        fig, axes = plt.subplots(1, 3, figsize=(10, 3.6))
    else:
        fig = axes[0].figure
    from matplotlib.lines import Line2D

    for ax, lay in zip(axes, layouts(n_layers, n_devices)):
        draw_layout(ax, lay, n_layers)
    handles = [Line2D([], [], color=c, marker=">", label=t) for c, t in
               ((FORWARD, "activations (forward)"), (BACKWARD, "gradients (backward)"), (BOTH, "both"))]
    handles.append(Line2D([], [], color="none", label=f"colour bars: layers 0 (bottom) to {n_layers - 1}"))
    fig.legend(handles=handles, loc="lower center", ncol=4, frameon=False, fontsize=7.5)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig
