"""Which action of a pipeline step waits on which: the data flow between stages.

Introduced in chapter 2 ("Naive model parallelism"). The rule lives in the torch-free planner
(:mod:`ppbook.planner.dataflow`), whose simulator uses it; this module keeps the name the
chapters and the recorder import it by.
"""

from __future__ import annotations

from ppbook.planner.dataflow import Key, waits_on

__all__ = ["Key", "waits_on"]
