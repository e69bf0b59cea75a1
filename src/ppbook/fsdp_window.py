"""FSDP2's all-gathers in one pipeline step, counted from the schedule's order, with the unshard
window torch's pipelining runtime adds.

Introduced in chapter 12 ("A pipeline among the tools it is combined with"). The count lives in
the torch-free planner (:mod:`ppbook.planner.fsdp_window`), whose search uses it; this module
keeps the name chapter 12 and its script import it by.
"""

from __future__ import annotations

from ppbook.planner.fsdp_window import (MAX_ACTIVE_STAGES, StageGroups, StepCount, fsdp_step,
                                        with_unshard_window)

__all__ = ["MAX_ACTIVE_STAGES", "StageGroups", "StepCount", "fsdp_step", "with_unshard_window"]
