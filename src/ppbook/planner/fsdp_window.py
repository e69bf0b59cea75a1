"""FSDP2's all-gathers in one pipeline step, counted from the schedule's order: the planner's
count, and the unshard window torch's pipelining runtime adds.

Introduced in chapter 12 ("FSDP2 and tensor parallelism inside a pipeline's stages"), which checks it
against :mod:`ppbook.fsdp_probe`'s measurements. Part of the torch-free planner, whose search
counts FSDP's all-gathers with it. A stage is described
by the bytes of its parameter groups (one per ``fully_shard`` call: each block, then the stage's
root group).

What FSDP2 does inside a ``PipelineStage`` (chapter 9): a group is all-gathered when it is used
while sharded; after a forward a block's group is freed again if ``reshard_after_forward``, the
root group is not (FSDP never frees the root after forward); after a backward nothing is freed
until the step's end, because the stage switches resharding after backward off. That is
:func:`ppbook.planner.traffic.fsdp_gathers`, per group.

Torch's runtime for schedules with several stages per rank (``_PipelineScheduleRuntime``: the
looped and V-shaped schedules, not GPipe and 1F1B) adds to each rank's actions an ``UNSHARD``
of a stage before it is needed and a ``RESHARD`` once it is not among the next
``max_active_stages`` (3 in torch 2.13) distinct stages the rank will run
(``_add_unshard_reshard`` in ``torch/distributed/pipelining/schedules.py``). An ``UNSHARD``
gathers every group of the stage that is sharded, a ``RESHARD`` frees every group. With at most
three stages per rank nothing is freed early; with more, a stage leaves the window and is
gathered again when it comes back: more all-gathers, fewer bytes held at once.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_ACTIVE_STAGES = 3  # torch 2.13's default in _add_unshard_reshard


@dataclass(frozen=True)
class StageGroups:
    """One stage's FSDP parameter groups, in bytes (unsharded): its blocks, and the root group
    (embedding, final norm, head; 0 when the stage holds none of them)."""
    blocks: tuple[int, ...]
    root: int = 0


def with_unshard_window(actions: list[tuple[int, str]], max_active_stages: int = MAX_ACTIVE_STAGES
                        ) -> list[tuple[int, str]]:
    """A rank's compute actions ``(stage, kind)`` with ``(stage, "UNSHARD")`` and
    ``(stage, "RESHARD")`` inserted as torch's runtime inserts them: before each action, the next
    ``max_active_stages`` distinct stages are gathered (in the order they will run), the others
    freed; at the end every stage is freed."""
    # the next distinct stages from each action on, built from the end (torch scans forward from
    # every action: the same lists, without its quadratic cost on long orders)
    upcoming_at: list[tuple[int, ...]] = [()] * len(actions)
    upcoming: tuple[int, ...] = ()
    for i in range(len(actions) - 1, -1, -1):
        stage = actions[i][0]
        upcoming = (stage, *(s for s in upcoming if s != stage))[:max_active_stages]
        upcoming_at[i] = upcoming
    active: list[int] = []
    out: list[tuple[int, str]] = []
    for (stage, kind), upcoming in zip(actions, upcoming_at):
        for s in [s for s in active if s not in upcoming]:  # evict in the order they were gathered
            active.remove(s)
            out.append((s, "RESHARD"))
        for s in upcoming:
            if s not in active:
                active.append(s)
                out.append((s, "UNSHARD"))
        out.append((stage, kind))
    out += [(s, "RESHARD") for s in active]
    return out


@dataclass(frozen=True)
class StepCount:
    all_gathers: int
    gathered_bytes: int  # the unsharded bytes of every group gathered, summed over the step


def fsdp_step(actions: list[tuple[int, str]], stages: dict[int, StageGroups], reshard_after_forward: bool,
              window: bool, max_active_stages: int = MAX_ACTIVE_STAGES) -> StepCount:
    """All-gathers of one rank in one step, and the bytes they gather: ``actions`` its compute
    actions ``(stage, kind)`` in order (kinds F, B, I, W), ``stages`` its stages' groups,
    ``window`` whether torch's runtime adds its unshard window (several stages per rank)."""
    lowered = with_unshard_window(actions, max_active_stages) if window else list(actions)
    gathered: set[tuple[int, int]] = set()  # (stage, group); group -1 is the root
    gathers = nbytes = 0
    groups = {s: [(s, b) for b in range(len(g.blocks))] + ([(s, -1)] if g.root else []) for s, g in stages.items()}

    for stage, kind in lowered:
        keys = groups[stage]
        if kind == "RESHARD":
            gathered.difference_update(keys)
            continue
        for key in keys:  # UNSHARD or a compute action: gather what is sharded
            if key not in gathered:
                gathers += 1
                nbytes += stages[stage].root if key[1] == -1 else stages[stage].blocks[key[1]]
                gathered.add(key)
        if kind == "F" and reshard_after_forward:
            gathered.difference_update(k for k in keys if k[1] != -1)  # blocks freed, never the root
    return StepCount(gathers, nbytes)
