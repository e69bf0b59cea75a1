"""One action of a pipeline step, timed: the timeline format the recorder and the simulator share.

Introduced in chapter 2 ("Naive model parallelism"). The simulator (:mod:`ppbook.planner.simulate`)
produces these events and the recorder (:mod:`ppbook.timeline`, which re-exports :class:`Event`)
writes them, so one plotting function draws measured and simulated steps. Part of the torch-free
planner.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Event:
    rank: int
    stage: int
    kind: str  # "F", "B", "I" or "W"
    microbatch: int
    start: float  # seconds; after gather(), from the first action of the step on any rank
    end: float

    @property
    def label(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"

    @property
    def duration(self) -> float:
        return self.end - self.start
