"""Driving a ``torch.distributed.pipelining`` schedule from any rank.

Introduced in chapter 1 ("Your first pipeline"): each rank passes ``step`` only what its stages
need (the inputs on the first stage, the targets on the last).
"""

from __future__ import annotations

import torch

from ppbook import dist as ppdist


def schedule_step(
    schedule,
    info: ppdist.DistInfo,
    tokens,
    targets,
    forward_only: bool = False,
    holds_first: bool | None = None,
    holds_last: bool | None = None,
) -> list[torch.Tensor]:
    """One ``schedule.step`` from any rank; returns
    the per-microbatch losses (last stage only).

    Only the rank holding the first stage is given the input and only the one holding
    the last stage the targets (in one process, a one-stage pipeline, both); the ranks
    in between take part with neither. By default rank 0 holds the first stage and the
    last rank the last; ``holds_first``/``holds_last`` say otherwise (a V-shaped
    schedule puts both on rank 0). With ``forward_only`` it calls ``schedule.eval``
    instead (no backward; chapter 6).
    """
    first = info.is_first if holds_first is None else holds_first
    last = info.is_last if holds_last is None else holds_last
    losses: list[torch.Tensor] = []
    run = schedule.eval if forward_only else schedule.step
    if first and last:
        run(tokens, target=targets, losses=losses)
    elif first:
        run(tokens)
    elif last:
        run(target=targets, losses=losses)
    else:
        run()
    return losses
