"""Each rank's order of actions as torch's own schedule classes build it, to check the torch-free
planner's orders and the simulator against.

Introduced in chapter 5 ("The schedules"). The orders as pure functions and the simulator live
in the torch-free planner (:mod:`ppbook.planner.schedules`, :mod:`ppbook.planner.simulate`), which
the chapters import directly; what needs torch is here: :func:`torch_order` and
:func:`schedule_ops` instantiate torch's ``Schedule<name>`` on mock stages (no process group),
:func:`zb_h1_order` builds ZB-H1 from torch's zero-bubble schedule at one stage per rank.
"""

from __future__ import annotations

import functools

from ppbook.planner.schedules import Action, Order, one_f_one_b_order, stages_per_rank


def torch_order(name: str, p: int, m: int, v: int = 2) -> Order:
    """Each rank's compute actions, in order, as torch's schedule class ``Schedule<name>`` builds
    them (with mock stages: no process group). An overlapped forward-backward of DualPipeV
    becomes its two sub-actions, which the runtime runs one after the other; communication and
    gradient-reduction actions are left out.

    ``Schedule1F1B`` is the exception: torch 2.13 describes it with ``_get_pipeline_order``,
    which is wrong for the last rank only (p - 1 - rank == 0, no warm-up forwards: rank 1 of 2 at
    m = 4 starts with ``1F1`` and lists a microbatch 4 that does not exist; ranks before it are
    right), while its ``step`` runs :func:`one_f_one_b_order`; so
    that is what this returns. Torch's own errors (m too small, m not a multiple of the rounds)
    pass through as ``ValueError``.
    """
    return {rank: list(acts) for rank, acts in _torch_order(name, p, m, v).items()}  # a copy: callers may edit


@functools.lru_cache(maxsize=256)
def _torch_order(name: str, p: int, m: int, v: int) -> Order:  # some orders take torch seconds to build at p = 8
    if name == "1F1B":
        if m < p:
            raise ValueError(f"Number of microbatches ({m}) must be greater than or equal to the number of stages ({p}).")
        return one_f_one_b_order(p, m)
    return _from_torch(schedule_ops(name, p, m, stages_per_rank(name, v)))


def schedule_ops(name: str, p: int, m: int, per_rank: int) -> list[list]:
    """Each rank's actions as torch's ``Schedule<name>`` lists them in ``pipeline_order``: what
    torch's ``_schedule_visualizer.get_schedule_ops(name, p, m, num_stages_per_rank=per_rank)``
    returns, built the same way (the class instantiated on mock stages), but with a plain
    ``NonCallableMagicMock(spec=PipelineStage)``: torch makes its mock with ``create_autospec``,
    which takes about 80 ms per call, most of the time of a small order.
    ``tests/test_schedules.py`` checks that both give the same actions."""
    from unittest import mock

    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class
    from torch.distributed.pipelining.stage import PipelineStage

    schedule_class = get_schedule_class(name)
    stage = mock.NonCallableMagicMock(spec=PipelineStage)
    stage.group_rank, stage.group_size, stage.submod, stage.num_stages = 0, p, None, per_rank * p
    single = issubclass(schedule_class, PipelineScheduleSingle)
    schedule = schedule_class(stage if single else [stage] * per_rank, m)
    return [schedule.pipeline_order[rank] for rank in range(p)]


def _from_torch(ops) -> Order:
    kinds = {"FORWARD": "F", "FULL_BACKWARD": "B", "BACKWARD_INPUT": "I", "BACKWARD_WEIGHT": "W"}
    order: Order = {}
    for rank, acts in enumerate(ops):
        flat = [sub for a in acts if a is not None for sub in (a.sub_actions or (a,))]
        order[rank] = [Action(a.stage_index, kinds[a.computation_type.name], a.microbatch_index)
                       for a in flat if a.computation_type.name in kinds]
    return order


def zb_h1_order(p: int, m: int) -> Order:
    """ZB-H1 (Qi et al. 2023): 1F1B with each backward split into I and W, and W passes moved
    into the bubbles. This is torch's ``ScheduleInterleavedZeroBubble`` (which implements the
    paper's ZB-H1, "ZB1P") given one stage per rank instead of several, built with mock stages."""
    from unittest import mock

    from torch.distributed.pipelining.schedules import ScheduleInterleavedZeroBubble
    from torch.distributed.pipelining.stage import PipelineStage

    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.group_rank, stage.group_size, stage.submod, stage.num_stages = 0, p, None, p
    schedule = ScheduleInterleavedZeroBubble([stage], m)
    return _from_torch([schedule.pipeline_order[r] for r in range(p)])

