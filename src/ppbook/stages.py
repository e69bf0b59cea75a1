"""Which layers each pipeline stage owns, and how to cut a stage out of the full model.

Introduced in chapter 0 ("Why models outgrow one device"), which cuts a model too big for one
device into stages; chapter 1 trains them; chapter 4 compares other balancing policies; chapter 5
places several stages per rank (:func:`stage_indices`).

The pure functions (which layers and stages each rank owns, the schedules' constraints) live in
the torch-free planner, :mod:`ppbook.planner.schedules`, and are imported from here; this module
adds what works on a model or a schedule object. All run, and are tested, without any process
group.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ppbook.planner.schedules import (TORCH_SCHEDULES, assign_layers, placement, schedule_problem,  # noqa: F401
                                      stage_indices, stages_per_rank)

if TYPE_CHECKING:
    import torch.nn as nn


def stage_module(model: "nn.Module", stage_index: int, num_stages: int,
                 layers: list[int] | None = None) -> "nn.Module":
    """Turn the full model into stage ``stage_index``
    of ``num_stages``, in place, and return it.

    The stage keeps its layers under their original names (``layers.5`` stays
    ``layers.5``), the first stage keeps the embedding, the last keeps the norm and
    output head; everything else is deleted or set to ``None`` so ``forward`` skips it.
    ``layers`` overrides which layers the stage owns (a balanced assignment, chapter 4);
    by default :func:`assign_layers`.
    """
    if not 0 <= stage_index < num_stages:
        raise ValueError(f"stage_index must be in [0, {num_stages}), got {stage_index}")
    if layers is None:
        layers = assign_layers(len(model.layers), num_stages)[stage_index]
    return keep_parts(
        model, layers, embedding=stage_index == 0, head=stage_index == num_stages - 1
    )


def keep_parts(
    model: "nn.Module", layers: list[int], embedding: bool, head: bool
) -> "nn.Module":
    """Delete, in place, every layer not in ``layers``, and the embedding and the head
    (norm and output) unless asked to keep them; the parts kept keep their names."""
    owned = {str(i) for i in layers}
    missing = owned - set(model.layers.keys())
    if missing:
        raise ValueError(
            f"layers {sorted(map(int, missing))} are not in the model, "
            f"which has layers {list(map(int, model.layers.keys()))}"
        )
    for name in list(model.layers.keys()):
        if name not in owned:
            del model.layers[name]
    if not embedding:
        model.tok_embeddings = None
    if not head:
        model.norm = None
        model.output = None
    return model


def placement_problem(schedule) -> str | None:
    """Why the stages given to a multi-stage ``schedule`` on
    this rank are not where it will send their messages, as
    one line with the fix; ``None`` when they are.

    Torch 2.13 builds the schedule's stage-to-rank map in its
    constructor (``stage_index_to_group_rank``: r, r + p, ...
    looped; r and 2p - 1 - r V-shaped) and sends every message
    by it, without checking that the stages it was given are
    those the map puts on this rank (the troubleshooting
    appendix). This reads the map and the stages
    (``schedule._stages``, private) before any message is sent.
    """
    to_rank = getattr(schedule, "stage_index_to_group_rank", None)
    held = [s.stage_index for s in getattr(schedule, "_stages", [])]
    if not to_rank or not held:
        return None  # one stage per rank: stage r on rank r
    rank = schedule._stages[0].group_rank
    wrong = [s for s in held if to_rank.get(s) != rank]
    if not wrong:
        return None
    expected = sorted(s for s, r in to_rank.items() if r == rank)
    name = type(schedule).__name__
    return (
        f"rank {rank} holds stages {held}, but {name} sends the "
        f"messages of stage {wrong[0]} to rank {to_rank.get(wrong[0])}, "
        f"and torch does not check this: build stages {expected} "
        f"on rank {rank} (ppbook.stages.stage_indices)"
    )
