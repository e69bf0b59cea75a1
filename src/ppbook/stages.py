"""Which layers each pipeline stage owns, and how to cut a stage out of the full model.

Introduced in chapter 0 ("Why models outgrow one device"), which cuts a model too big for one
device into stages; chapter 1 trains them; chapter 4 compares other balancing policies; chapter 5
places several stages per rank (:func:`stage_indices`).

These are pure functions: they run, and are tested, without any process group.
"""

from __future__ import annotations

import torch.nn as nn


def assign_layers(n_layers: int, num_stages: int) -> list[list[int]]:
    """Split ``range(n_layers)`` into ``num_stages`` contiguous runs whose sizes differ by at most one.

    When the division is uneven the earlier stages get the extra layer, because the last stage
    also carries the norm and the (often large) output head. No layer is ever dropped:
    ``sum(assign_layers(12, 5), [])`` is ``list(range(12))``.

    >>> assign_layers(12, 5)
    [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9], [10, 11]]
    """
    if num_stages < 1:
        raise ValueError(f"num_stages must be at least 1, got {num_stages}")
    if n_layers < num_stages:
        raise ValueError(
            f"cannot give {num_stages} stages at least one layer each from {n_layers} layers; "
            f"use at most {n_layers} stages or a model with at least {num_stages} layers"
        )
    base, extra = divmod(n_layers, num_stages)
    out, start = [], 0
    for stage in range(num_stages):
        size = base + (1 if stage < extra else 0)
        out.append(list(range(start, start + size)))
        start += size
    return out


def stage_module(model: nn.Module, stage_index: int, num_stages: int,
                 layers: list[int] | None = None) -> nn.Module:
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
    model: nn.Module, layers: list[int], embedding: bool, head: bool
) -> nn.Module:
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


# ---------------------------------------------------------------------------------------------
# Which stages each rank holds, per schedule class of torch.distributed.pipelining
# ---------------------------------------------------------------------------------------------
# The seven schedule classes of torch 2.13, by the name after "Schedule".
TORCH_SCHEDULES: tuple[str, ...] = ("GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble",
                                    "ZBVZeroBubble", "DualPipeV")
# Torch builds these classes' stage-to-rank map with generate_stage_to_rank_mapping(style="v")
# inside __init__ and exposes no attribute that says so before a schedule exists.
_V_SHAPED = ("ZBVZeroBubble", "DualPipeV")


def placement(name: str) -> str:
    """How schedule ``Schedule<name>`` places stages on ranks: ``"single"`` (stage r on rank r;
    torch's single-stage base class), ``"loop"`` (r, r + p, ...; torch's multi-stage default) or
    ``"v"`` (r and 2p - 1 - r). Introduced in chapter 5 ("The schedules")."""
    from torch.distributed.pipelining import schedules

    if name not in TORCH_SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; choose one of {', '.join(TORCH_SCHEDULES)}")
    if issubclass(getattr(schedules, f"Schedule{name}"), schedules.PipelineScheduleSingle):
        return "single"
    return "v" if name in _V_SHAPED else "loop"


def stages_per_rank(name: str, v: int = 2) -> int:
    """Stages each rank holds under ``Schedule<name>``: one, ``v`` for the looped ones, two for the V-shaped."""
    return {"single": 1, "loop": v, "v": 2}[placement(name)]


def stage_indices(name: str, rank: int, p: int, v: int = 2) -> list[int]:
    """The stages rank ``rank`` of ``p`` holds under schedule
    ``name`` (``v`` stages per rank for the looped ones; the V-shaped
    ones always hold two), from torch's own stage-to-rank map."""
    from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping

    style = placement(name)
    to_rank = generate_stage_to_rank_mapping(
        p, p * stages_per_rank(name, v), style="v" if style == "v" else "loop"
    )
    return [stage for stage, r in sorted(to_rank.items()) if r == rank]


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


def schedule_problem(name: str, p: int, m: int, v: int = 2, layers: int | None = None) -> str | None:
    """Why torch's ``Schedule<name>`` cannot run ``m`` microbatches on ``p`` ranks (``v`` stages
    per rank for the looped schedules), as one line that says how to fix it; ``None`` if it can.

    Torch 2.13 raises some of these itself, mid-way through building the schedule, in its own
    words; a wrong stage placement it does not check at all.
    """
    if placement(name) == "loop" and v < 2:
        return f"{name} needs at least 2 stages per rank, got --stages-per-rank {v}; use 2 or more, or Schedule1F1B"
    total = p * stages_per_rank(name, v)
    if layers is not None and layers < total:
        return (f"{name} on {p} processes has {total} stages of at least one layer each, but --layers is {layers}; "
                f"raise --layers to {total} or more")
    if name == "1F1B" and m < p:
        return f"Schedule1F1B needs at least as many microbatches as stages ({p}), got --microbatches {m}; use {p} or more"
    if name == "DualPipeV" and m < total:
        return (f"ScheduleDualPipeV needs at least as many microbatches as stages (2 x {p} = {total}), "
                f"got --microbatches {m}; use {total} or more")
    if name in ("Interleaved1F1B", "InterleavedZeroBubble"):
        rounds = max(1, m // p)
        if m % rounds:
            ok = sorted({k for k in range(1, 4 * m + 1) if k % max(1, k // p) == 0} - {m}, key=lambda k: abs(k - m))[:2]
            return (f"Schedule{name} splits the microbatches into m // p = {rounds} rounds of equal size, so "
                    f"--microbatches {m} must be a multiple of {rounds}; try {' or '.join(map(str, sorted(ok)))}")
    return None
