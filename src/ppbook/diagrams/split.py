"""A model's chain of units cut into stages, one row per way of cutting it, drawn from the stages.

Introduced in chapter 4 ("Splitting a model"). A row lists the units (embedding, layers, final
norm, output head) that each stage really holds, read from the stage modules' parameter names,
never typed: :func:`units` on a stage cut by hand (``ppbook.stages.stage_module``) or on a
submodule of the tracer's ``Pipe`` (``pipe.get_stage_module(i)``), which keeps the names.

    >>> rows = {"by hand": [units(stage_module(model, s, 2), order) for s in range(2)]}
    >>> draw(rows)
"""

from __future__ import annotations

# one colour per stage: none of the timeline's colours, which mean F, B, I and W
STAGE_COLOURS = ["#8172B3", "#64B5CD", "#CCB974", "#937860", "#DA8BC3", "#8C8C8C"]
SHORT = {"tok_embeddings": "embedding", "wte": "embedding", "wpe": "positions", "output": "output",
         "lm_head": "output", "norm": "norm", "ln_f": "norm"}


def unit_of(parameter_name: str) -> str:
    """The unit a parameter belongs to: ``layers.3.attention.wq.weight`` -> ``layers.3``,
    ``tok_embeddings.weight`` -> ``tok_embeddings``."""
    parts = parameter_name.split(".")
    return ".".join(parts[:2]) if parts[0] in ("layers", "blocks", "h") and len(parts) > 1 else parts[0]


def units(module, order: list[str] | None = None) -> list[str]:
    """The units ``module`` holds parameters of, in ``order`` (the full model's :func:`units`)
    where given, else in the module's own order."""
    found = list(dict.fromkeys(unit_of(name) for name, _ in module.named_parameters()))
    if order is None:
        return found
    missing = [u for u in found if u not in order]
    if missing:
        raise ValueError(f"units {missing} are not in the model's order {order}; pass the full model's units(...)")
    return sorted(found, key=order.index)


def label(unit: str) -> str:
    """A unit's name in the diagram: ``layers.3`` -> ``layer 3``."""
    head, _, index = unit.partition(".")
    return f"layer {index}" if index else SHORT.get(head, head)


def _text_colour(colour: str) -> str:
    """White on a dark box, near-black on a light one, so a unit's name reads on every stage colour."""
    from matplotlib.colors import to_rgb

    r, g, b = to_rgb(colour)
    return "white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.6 else "#222222"


def _shade(colour: str, amount: float = 0.35) -> tuple[float, float, float]:
    """``colour`` this much closer to black: a light stage colour still reads as text on white."""
    from matplotlib.colors import to_rgb

    return tuple(c * (1 - amount) for c in to_rgb(colour))


def draw(rows: dict[str, list[list[str]]], ax=None, title: str | None = None):
    """One row per way of splitting (``{"by hand": [[units of stage 0], [units of stage 1]], ...}``):
    the units as boxes along the row, coloured by stage, a gap where one stage hands its activations
    to the next (an arrow forward) and receives their gradients back (an arrow back), each stage
    named above its boxes. Returns ``ax``."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    ax = ax or plt.gca()
    gap, width, height = 1.0, 1.0, 0.56
    longest = 0.0
    for y, (name, stages) in enumerate(rows.items()):
        x = 0.0
        for s, stage in enumerate(stages):
            colour = STAGE_COLOURS[s % len(STAGE_COLOURS)]
            first = x
            for unit in stage:
                ax.add_patch(FancyBboxPatch((x + 0.04, y - height / 2), width - 0.08, height,
                                            boxstyle="round,pad=0.01,rounding_size=0.06", facecolor=colour,
                                            edgecolor="white"))
                ax.text(x + width / 2, y, label(unit), ha="center", va="center", fontsize=7.5,
                        color=_text_colour(colour))
                x += width
            ax.text((first + x) / 2, y - height / 2 - 0.06, f"stage {s}", ha="center", va="bottom", fontsize=8,
                    color=_shade(colour), fontweight="bold")
            if s < len(stages) - 1:  # forward above the row's middle, backward below it
                for dy, (tail, head), words, va in ((-0.09, (x + 0.08, x + gap - 0.08), "activations", "bottom"),
                                                    (0.09, (x + gap - 0.08, x + 0.08), "gradients", "top")):
                    ax.annotate("", xy=(head, y + dy), xytext=(tail, y + dy),
                                arrowprops={"arrowstyle": "-|>", "color": "#555555", "lw": 1.2})
                    ax.text(x + gap / 2, y + dy + (-0.05 if va == "bottom" else 0.05), words, ha="center", va=va,
                            fontsize=6.5, color="#555555")
                x += gap
        longest = max(longest, x)
    ax.set_yticks(range(len(rows)), list(rows))
    ax.tick_params(axis="y", length=0)
    ax.set_ylim(len(rows) - 0.45, -0.75)
    ax.set_xlim(-0.1, longest + 0.1)
    ax.set_xticks([])
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    if title:
        ax.set_title(title, fontsize=10, loc="left")
    return ax
