"""Which action of a pipeline step waits on which: the data flow between stages.

Introduced in chapter 2 ("Naive model parallelism"): the simulator (:mod:`ppbook.planner.simulate`)
starts an action when the one it waits on has finished, and a recorded timeline
(:mod:`ppbook.timeline`) is read with the same rule to tell waiting for a peer from time a rank
spends on its own. Part of the torch-free planner.

An action is ``(stage, kind, microbatch)`` in torch's notation (``F`` forward, ``B`` full
backward, ``I`` input-gradient backward, ``W`` weight-gradient backward).
"""

from __future__ import annotations

from typing import Callable

Key = tuple[int, str, int]  # (stage, kind, microbatch)


def waits_on(stage: int, kind: str, microbatch: int, num_stages: int,
             has: Callable[[Key], bool] = lambda key: True) -> Key | None:
    """The action whose output ``stage``/``kind``/``microbatch`` needs, or ``None`` (the first forward).

    A forward needs the previous stage's forward of the same microbatch; a backward (``B`` or
    ``I``) the next stage's input gradient, from its full backward or its input-gradient pass
    (``has`` says which of the two the step holds: DualPipeV mixes both kinds), or, on the last
    stage, its own forward (the loss); a weight-gradient pass ``W`` its own ``I``.
    """
    if kind == "F":
        return (stage - 1, "F", microbatch) if stage > 0 else None
    if kind in ("B", "I"):
        if stage == num_stages - 1:
            return (stage, "F", microbatch)  # the loss needs this stage's own forward
        dep = (stage + 1, kind, microbatch)
        return dep if has(dep) else (stage + 1, "I" if kind == "B" else "B", microbatch)
    if kind == "W":
        return (stage, "I", microbatch)
    raise ValueError(f"unknown action kind {kind!r}")
