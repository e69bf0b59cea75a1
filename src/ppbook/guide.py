"""Which of torch's seven schedules to use, for a pipeline of ``p`` ranks and ``m`` microbatches:
the reader's guide of chapter 5 ("The schedules"), as one small pure function.

Introduced in chapter 5; ``tests/test_schedules_guide.py`` checks that it picks what the planner
of chapter 10 (:mod:`ppbook.planner.search`) ranks best among the same schedules.

The guide assumes equal stages and describes one rank's share of the model by five numbers: the
time of its forward ``f``, input-gradient pass ``i`` and weight-gradient pass ``w`` (the full
backward is ``B = I + W``) for one microbatch, what one microbatch saves for its backward
(``activation``), and what torch's split backward keeps of that after ``W`` until ``step``
returns (``residual``, measured in chapter 5; zero for the schedules that do not split the
backward), and, for the rank that holds the last stage, what the loss needs besides (``head``: the
logits and their gradients; the V-shaped schedules put it on rank 0, the rank that holds the most
activations). For every schedule that accepts ``p`` and ``m`` it

- simulates the schedule's order (:func:`ppbook.planner.schedules.order`, torch's order as pure
  Python, tested equal to torch's) with those costs, each chunk ``1/v`` of them, and a hand-off
  ``latency``;
- counts the most activation memory a rank holds at once, from the same order, with the
  zero-bubble remainder (:func:`ppbook.planner.search.rank_saved_bytes`, the planner's own count);

and picks the fastest schedule whose memory fits the ``budget`` (ties: less memory, then fewer
messages). Any unit works as long as times share one unit and memory another.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from ppbook.planner import costs, hardware, memory, schedules, search, shapes
from ppbook.planner.simulate import messages, simulate


@dataclass(frozen=True)
class Inputs:
    """What the guide needs to know. Times per microbatch of one rank's share of the model."""
    p: int
    m: int
    f: float
    i: float
    w: float
    latency: float = 0.0           # one hand-off between ranks, in the unit of f
    activation: float = 1.0        # saved for the backward, one microbatch of a rank's share
    residual: float = 0.0          # of that, kept after W until the step ends (torch's split backward)
    head: float = 0.0              # what the rank holding the last stage needs besides (logits, the loss's backward)
    budget: float = math.inf       # memory a rank can spare for these, in the unit of activation
    schedules: tuple[str, ...] = schedules.TORCH_SCHEDULES
    v: int = 2                     # stages per rank of the looped schedules


@dataclass(frozen=True)
class Option:
    name: str
    step: float                    # simulated step, first action to last
    memory: float                  # the fullest rank's saved activations at its peak
    messages: int                  # point-to-point hand-offs per step
    fits: bool

    def key(self) -> tuple:
        return (self.step, self.memory, self.messages)


# [start-guide]
@functools.lru_cache(maxsize=1024)
def simulated(name: str, p: int, m: int, v: int, fiw: tuple, latency: float):
    """(step, messages) of torch's order for ``name``, simulated with F, I, W = ``fiw``
    per rank's share (a chunk costs 1/n of it) and ``latency`` per hand-off."""
    n = schedules.stages_per_rank(name, v)
    order = schedules.order(name, p, m, v)
    f, i, w = (x / n for x in fiw)
    events = simulate(order, {"F": f, "I": i, "W": w, "B": i + w}, latency=latency)
    step = max(e.end for e in events) - min(e.start for e in events)
    return step, messages(order)


def options(inp: Inputs) -> list[Option]:
    """Every schedule of ``inp.schedules`` that can run ``inp.p`` and ``inp.m``, fitting
    ones first, each group fastest first."""
    out = []
    for name in inp.schedules:
        if schedules.schedule_problem(name, inp.p, inp.m, inp.v):
            continue  # torch refuses this p and m
        fiw = (inp.f, inp.i, inp.w)
        step, sent = simulated(name, inp.p, inp.m, inp.v, fiw, inp.latency)
        # per rank: microbatches in flight x activation, plus split ones' remainder
        n = schedules.stages_per_rank(name, inp.v)
        stages = inp.p * n
        per_mb, rest = [inp.activation / n] * stages, [inp.residual / n] * stages
        held = search.rank_saved_bytes(name, inp.p, inp.m, inp.v, per_mb, rest)
        last = schedules.stage_to_rank(name, inp.p, inp.v)[stages - 1]
        held[last] += inp.head  # the loss; the V-shaped schedules put it on rank 0
        peak = max(held)
        out.append(Option(name, step, peak, sent, peak <= inp.budget))
    return sorted(out, key=lambda o: (not o.fits, o.key()))
# [end-guide]


def pick(inp: Inputs) -> Option:
    """The fastest schedule that fits (:func:`options`); ``ValueError`` if none fits."""
    ranked = options(inp)
    if not ranked or not ranked[0].fits:
        least = min(ranked, key=lambda o: o.memory) if ranked else None
        raise ValueError(f"no schedule fits {inp.budget:g} of activation memory at p = {inp.p}, m = {inp.m}"
                         + (f"; the least, {least.name}, needs {least.memory:g}: lower m or raise the budget"
                            if least else "; choose another m"))
    return ranked[0]


def against_1f1b(inp: Inputs) -> dict:
    """The guide's pick for ``inp`` beside 1F1B, as chapter 5's tables show it: the pick
    (an :class:`Option`), how much shorter its step is than 1F1B's (a fraction), what
    ZBVZeroBubble would hold (its memory, with the remainder) and the pick's messages per step
    over 1F1B's."""
    ranked = options(inp)
    by = {o.name: o for o in ranked}
    return {"pick": ranked[0], "gain": 1 - ranked[0].step / by["1F1B"].step, "zbv": by["ZBVZeroBubble"].memory,
            "messages": ranked[0].messages / by["1F1B"].messages}


# The planner-sized examples chapter 5 shows and tests/test_schedules_guide.py checks against the
# planner: (model preset, tensor-parallel size, pipeline ranks p, microbatches m), on H100s, eight per
# node, one 8192-token sequence per microbatch. The 70B is chapter 10's sweep ("Where interleaving
# and zero bubble pay").
EXAMPLES: tuple[tuple[str, int, int, int], ...] = (
    ("llama3-70b", 8, 8, 16), ("llama3-70b", 8, 8, 64), ("llama3-70b", 8, 8, 128), ("llama3-8b", 1, 8, 16))


def example_request(model: str, tp: int, p: int, m: int) -> search.Request:
    """The planner's request for one of :data:`EXAMPLES`: ``tp x p`` H100s (eight per node, NVLink
    inside, InfiniBand NDR400 between), ``m`` sequences of 8192 tokens per step."""
    return search.Request(shapes.PRESETS[model], hardware.GPUS["h100-sxm"], tp * p, 8, m, 8192,
                          hardware.LINKS["nvlink-h100"], hardware.LINKS["ib-ndr400"])


def from_planner(req: search.Request, tp: int, p: int, m: int, b: int = 1) -> Inputs:
    """The guide's inputs for a pipeline of ``p`` ranks of ``tp`` GPUs each, no data parallelism,
    no recomputation, ``m`` microbatches of ``b`` sequences, from the planner's cost and memory
    models of ``req`` (its model, GPU and links): one rank's share is ``layers / p`` layers; a
    hand-off crosses the network when a node holds at most one rank; the budget is the usable
    memory less the fullest rank's weights, gradients, optimizer state and receive buffers under 1F1B."""
    shape, tokens = req.model, b * req.seq_len
    share = shape.layers / p / tp   # layers per rank, each split over tp GPUs
    layer = costs.layer_costs(shape, req.gpu, b, req.seq_len, shape.moe, req.measured_costs)
    dt = memory.RECIPES[req.recipe].activation_bytes
    activation = memory.layer_activation_bytes(shape, tokens, dt, req.kernels) * share
    residual = memory.values_bytes(memory.block_residual_values(shape), tokens, dt) * share
    link = req.intra if tp * 2 <= req.gpus_per_node else req.inter
    base = search.Layout(tp, p, 1, "1F1B", 1, b, m, "none", "none")
    rest = max(r.total - r.activations - r.logits
               for r in search.rank_memory(base, search.with_layout(req, global_batch=m * b)))
    head = (memory.logits_bytes(shape, tokens, dt) + memory.loss_backward_bytes(shape, tokens)) / tp
    return Inputs(p, m, layer.F * share, layer.I * share, layer.W * share,
                  latency=link.time(search.stage_boundary_bytes(req, b, tp)), activation=activation,
                  residual=residual, head=head, budget=req.usable_bytes - rest)
