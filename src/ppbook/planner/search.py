"""Choosing a layout: enumerate, drop what cannot run or does not fit, predict and rank the rest.

Introduced in "Choosing a pipeline". For a model, a cluster and a global batch, a
:class:`Layout` is a tensor-parallel size ``tp`` (within a node, with sequence parallelism), a
pipeline of ``p`` ranks running one of torch's seven schedules with ``v`` stages per rank, the
first and last stages even or lightened (``balance``), ``dp`` data-parallel replicas whose state
is sharded one of four ways, microbatches of ``b`` sequences, ``m`` of them per replica and step,
and recomputation. Ranks are laid out as Megatron-LM and torchtitan lay them out: tensor parallel
innermost, then data parallel, pipeline outermost (so a data-parallel group spans ``dp x tp``
consecutive GPUs, and pipeline hand-offs cross nodes first). A mixture of experts' experts are
laid out over the same GPUs again, ``ep`` expert-parallel GPUs of ``etp`` each
(:func:`expert_layouts`: Megatron-Core's MoE parallel folding, so ``ep`` may exceed ``dp``), and
its MoE layers timed as each GPU runs them (:func:`moe_layer_seconds`). The matrix products run
in bf16 or in FP8 by recipe (``precision``: :mod:`ppbook.planner.costs`' measured speed-ups,
:class:`ppbook.planner.memory.Precision`'s bytes); the optimizer's state is Adam's unless
``optimizer`` says otherwise.

For each candidate :func:`predict` computes:

- **memory** of every GPU, by kind (:class:`RankMemory`): the training state of its stages by
  sharding mode (:func:`ppbook.planner.memory.state_bytes`), the activations of the most
  microbatches the schedule's order has in flight on it (:func:`ppbook.planner.schedules.order`),
  the last stage's logits, one layer's recomputation;
- **time**: the schedule's order simulated (:func:`ppbook.planner.simulate.simulate`) with
  per-action costs (:mod:`ppbook.planner.costs`, divided by ``tp``, plus the tensor-parallel
  collectives, plus recomputation), hand-offs as latency + bytes / bandwidth over NVLink or the
  network; an MoE action's all-to-alls in full, except in DualPipeV's overlapped pairs
  (``overlap_f_b``), where each half's hide under the other's computation
  (:func:`ppbook.planner.simulate.pair_slots`); then each rank's data-parallel traffic (:func:`ppbook.planner.traffic.data_parallel_bytes`),
  of which the part that overlaps the rank's own computation is hidden (see :func:`_dp_exposed`);
  then the optimizer's step, bound by memory bandwidth.

Candidates that violate a schedule's constraints or do not fit are dropped with the reason;
the rest are ranked by step time. For ``m`` at least ``2p`` the order is simulated at ``2p``
and ``3p`` microbatches and step time and memory are extended linearly in ``m`` (both orders
have reached their steady state; the tests check this against simulating ``m`` itself).
"""

from __future__ import annotations

import functools
import math
from dataclasses import MISSING, asdict, dataclass, field, fields, replace

from ppbook.planner import costs, memory, schedules, shapes, traffic
from ppbook.planner.fsdp_window import MAX_ACTIVE_STAGES, StageGroups, fsdp_step
from ppbook.planner.hardware import GPU, Link
from ppbook.planner.shapes import ModelShape, embedding_parameters, head_parameters, layer_parameters
from ppbook.planner.simulate import Compiled, Event, compile_order, pair_slots, run

NO_PIPELINE = "none"  # p = 1: data parallelism alone, gradient accumulation over m microbatches
BALANCES = ("even", "ends")


@dataclass(frozen=True)
class Request:
    model: ModelShape
    gpu: GPU
    gpus: int
    gpus_per_node: int
    global_batch: int      # sequences per optimizer step
    seq_len: int
    intra: Link
    inter: Link
    recipe: str = "bf16"
    kernels: str = "fused"
    sequence_parallel: bool = True     # with tp > 1: norms and dropouts split along the sequence too
    headroom: float = 0.1  # fraction of each GPU kept free (CUDA context, NCCL buffers, fragmentation)
    tps: tuple[int, ...] = ()           # tensor-parallel sizes to try (default: powers of two within a node)
    pps: tuple[int, ...] = ()           # pipeline sizes to try (default: every one that divides, up to max_p)
    eps: tuple[int, ...] = ()           # expert-parallel sizes to try (default: every one that divides the experts and,
    #                                    times etp, the tp x cp x dp GPUs it folds over: expert_layouts)
    max_p: int = 32
    max_v: int = 4
    vs: tuple[int, ...] = ()            # stages per rank to try, pinned (default: 2 to max_v for the looped schedules)
    dps: tuple[int, ...] = ()           # data-parallel sizes to try, pinned (default: whatever the GPUs leave)
    cps: tuple[int, ...] = ()           # context-parallel sizes to try (default: 1, none; searched only where given)
    max_microbatch_size: int = 8
    microbatch_sizes: tuple[int, ...] = ()   # to try (default: powers of two up to max_microbatch_size)
    schedules: tuple[str, ...] = schedules.TORCH_SCHEDULES
    shardings: tuple[str, ...] = memory.SHARDING
    recomputes: tuple[str, ...] = memory.RECOMPUTE
    balances: tuple[str, ...] = BALANCES
    measured_costs: bool = True        # use the book's H100 measurements where they match
    fsdp_reshard: str = "default"      # torchtitan's fsdp_reshard_after_forward: default, always, never
    stage_io: str = "torch"            # torch's runtime (PipelineStage buffers, its split backward's limits: see
    #                                    constraint_problem), or "freed" (Megatron-LM, DeepSpeed, Llama 3)
    overlap_f_b: bool = False          # a function is registered for DualPipeV's OVERLAP_F_B actions (DeepSeek's
    #                                    runtime); torch and torchtitan 0.3.0 register none: the halves run in turn
    # mixtures of experts as Megatron-Core folds them, FP8 and other optimizers (issue 52; see expert_layouts)
    etps: tuple[int, ...] = ()          # expert-tensor-parallel sizes to try (default: 1 and the layout's tp)
    moe_imbalance: float = 1.0          # tokens the busiest expert-parallel rank receives, over the mean (1: balanced,
    #                                    as the published benchmarks force it)
    capacity_factor: float = 0.0        # 0: dropless; else each expert takes at most this times its mean share,
    #                                    dropping the rest, so the busiest rank's load is at most this
    dispatcher: str = "alltoall"        # how tokens reach the experts: one all-to-all ("alltoall"), or DeepEP's, which
    #                                    sends a token once to each other node its experts are on ("deepep")
    precision: str = "bf16"             # the blocks' matrix products: bf16, or an FP8 recipe (memory.PRECISIONS)
    optimizer: str = "adamw"            # its state per parameter (memory.OPTIMIZER_STATE)
    framework: str = "torchtitan"      # what the reader will run: it picks the published runs that calibrate the
    #                                    printed times (ppbook.planner.calibration); the search is the same

    # every cache of the search is keyed on the request, whose model, GPU and links hash field by
    # field: hashed once (hashing it anew on every look-up took a tenth of a search)
    __hash__ = shapes.hashed_once
    __getstate__ = shapes.state_without_hash

    @property
    def usable_bytes(self) -> float:
        return self.gpu.memory_gb * memory.GB * (1 - self.headroom)


@dataclass(frozen=True)
class Layout:
    tp: int
    p: int
    dp: int
    schedule: str   # one of torch's seven, or "none" (p = 1)
    v: int          # stages per rank (1 for GPipe and 1F1B and "none", 2 for the V-shaped)
    b: int          # microbatch size (sequences)
    m: int          # microbatches per step and data-parallel replica
    sharding: str   # none, zero1, zero2, fsdp
    recompute: str  # none, selective, full
    balance: str = "even"
    ep: int = 1     # expert parallelism: each MoE layer's routed experts split over ep GPUs of tp x cp x dp
    cp: int = 1     # context parallelism: each sequence split over cp GPUs (see context_parallel_seconds)
    etp: int = 1    # expert tensor parallelism: each expert's matrices split over etp GPUs (expert_layouts)

    def label(self) -> str:
        pipe = "no pipeline" if self.schedule == NO_PIPELINE else \
            f"{self.schedule} p={self.p}" + (f" v={self.v}" if self.v > 1 else "")
        ends = " ends" if self.balance == "ends" and self.p > 1 else ""
        ep = (f" ep={self.ep}" if self.ep > 1 else "") + (f" etp={self.etp}" if self.etp > 1 else "")
        cp = f" cp={self.cp}" if self.cp > 1 else ""
        return (f"tp={self.tp}{cp} {pipe}{ends} dp={self.dp}{ep} {self.sharding} b={self.b} m={self.m} "
                f"recompute={self.recompute}")

    @property
    def num_stages(self) -> int:
        return stage_count(self.schedule, self.p, self.v)


def stage_count(schedule: str, p: int, v: int) -> int:
    """Stages of a pipeline of ``p`` ranks under ``schedule`` (``NO_PIPELINE``: one per rank)."""
    if schedule == NO_PIPELINE:
        return p
    return p * schedules.stages_per_rank(schedule, v)  # raises on an unknown schedule


MEMORY_KINDS = ("parameters", "gradients", "optimizer", "activations", "logits", "buffers")


@dataclass
class RankMemory:
    """Bytes one GPU holds at its peak, by kind (:data:`MEMORY_KINDS`): parameters (FSDP's
    gathered weights among them), gradients, optimizer state, saved activations, the last
    stage's logits and loss, and the pipeline's receive buffers."""
    rank: int
    stages: list[int]
    parameters: float
    gradients: float
    optimizer: float
    activations: float
    logits: float
    buffers: float = 0.0

    @property
    def total(self) -> float:
        return self.parameters + self.gradients + self.optimizer + self.activations + self.logits + self.buffers


@dataclass
class Prediction:
    layout: Layout
    step_s: float = math.inf
    pipeline_s: float = 0.0      # the slowest rank's pipeline passes (simulated)
    dp_exposed_s: float = 0.0    # data-parallel traffic not hidden behind computation
    optimizer_s: float = 0.0
    bubble: float = 0.0          # idle fraction of the pipeline part, mean over ranks
    tokens_per_s_per_gpu: float = 0.0
    mfu: float = 0.0             # model FLOPs (6 per parameter a token uses, plus attention) / peak
    memory: list[RankMemory] = field(default_factory=list)
    why_not: str | None = None
    estimated: bool = False      # action times estimated from FLOPs (not measured)
    detail: dict = field(default_factory=dict)

    @property
    def peak_bytes(self) -> float:
        return max((r.total for r in self.memory), default=0.0)

    @property
    def peak_gb(self) -> float:
        return self.peak_bytes / memory.GB


# --- layers per stage ---------------------------------------------------------------------------------

@functools.lru_cache(maxsize=256)
def end_weights(req: Request) -> tuple[int, int]:
    """How many layers the first and last stages give up under ``balance="ends"``: the embedding
    in layers' worth of parameters, the head and its loss in layers' worth of time (Llama 3
    removed one layer from each end of its 405B pipeline)."""
    shape = req.model
    per_layer = layer_parameters(shape, shape.layers - 1)
    first = round(embedding_parameters(shape) / per_layer)
    head = costs.head_costs(shape, req.gpu, 1, req.seq_len, req.measured_costs)
    layer = costs.layer_costs(shape, req.gpu, 1, req.seq_len, shape.moe, req.measured_costs)
    last = round((head.F + head.B) / (layer.F + layer.B))
    return first, last


def stage_layers(n_layers: int, num_stages: int, first_less: int = 0, last_less: int = 0) -> list[list[int]]:
    """Contiguous layers per stage, as even as possible once the first stage counts ``first_less``
    layers it does not have and the last ``last_less`` (each stage keeps at least one layer)."""
    if num_stages == 1:
        return [list(range(n_layers))]
    units = n_layers + first_less + last_less
    sizes = [len(s) for s in schedules.assign_layers(units, num_stages)]
    sizes[0] = max(1, sizes[0] - first_less)
    sizes[-1] = max(1, sizes[-1] - last_less)
    # the units given back go to the middle stages, one each, from the front
    missing, i = n_layers - sum(sizes), 1
    while missing > 0 and num_stages > 2:
        sizes[i] += 1
        missing -= 1
        i = i + 1 if i + 1 < num_stages - 1 else 1
    if missing:  # two stages: nowhere else to put them
        sizes[0] += missing
    if sum(sizes) != n_layers or min(sizes) < 1:
        return schedules.assign_layers(n_layers, num_stages)
    out, start = [], 0
    for n in sizes:
        out.append(list(range(start, start + n)))
        start += n
    return out


def layers_of(layout: Layout, req: Request) -> list[list[int]]:
    first, last = end_weights(req) if layout.balance == "ends" else (0, 0)
    return _stage_layers_cached(req.model.layers, layout.num_stages, first, last)


@functools.lru_cache(maxsize=4096)
def _stage_layers_cached(n_layers: int, num_stages: int, first: int, last: int) -> list[list[int]]:
    return stage_layers(n_layers, num_stages, first, last)


# --- enumeration ---------------------------------------------------------------------------------------

def tensor_parallel_sizes(req: Request) -> list[int]:
    """Sizes within a node that divide the GPUs, the heads, the key/value heads and the MLP."""
    shape = req.model
    options = req.tps or tuple(2 ** k for k in range(0, 8) if 2 ** k <= req.gpus_per_node)
    return [t for t in options if req.gpus % t == 0 and t <= req.gpus_per_node and shape.heads % t == 0
            and (shape.mla or shape.kv_heads % t == 0) and (shape.ffn % t == 0)]


def expert_parallel_sizes(req: Request, dp: int, tp: int = 1, cp: int = 1, etp: int = 1) -> list[int]:
    """Expert-parallel sizes for a layout of ``tp x cp x dp`` GPUs per pipeline stage whose experts
    are split ``etp`` ways: those that divide the routed experts and whose ``ep x etp`` divides the
    ``tp x cp x dp`` GPUs they fold over (:func:`expert_layouts`; 1 alone for a dense model)."""
    if not req.model.moe:
        return [1]
    ranks = tp * cp * dp
    return [e for e in (req.eps or range(1, ranks // etp + 1)) if req.model.experts % e == 0 and ranks % (e * etp) == 0]


def expert_layouts(req: Request, tp: int, cp: int, dp: int) -> list[tuple[int, int]]:
    """The ``(ep, etp)`` of the experts for a dense part of ``tp x cp x dp`` GPUs per pipeline stage,
    laid out as Megatron-Core's "MoE parallel folding" lays them (Liu et al. 2025, arXiv 2504.14960;
    the Megatron-Core MoE report, arXiv 2603.07685): attention runs on ``tp x cp x dp``, and the
    same GPUs are cut again for the experts into ``etp x ep x edp``, expert tensor parallelism
    innermost, then expert parallelism, then the experts' data parallelism (Megatron-Core's rank
    order ``tp-ep-dp-pp`` for experts). So ``ep`` may exceed ``dp``: it folds over the tensor- and
    context-parallel GPUs too, up to ``tp x cp x dp / etp``, and an expert-parallel group is ``ep``
    GPUs at a stride of ``etp``, within a node while ``etp x ep`` fits in one. torchtitan 0.3.0 lays
    experts out the same way, borrowing ``ep`` from ``dp_shard x cp x tp`` (``ParallelDims``:
    ``efsdp = dp_shard x cp x tp / ep``, ``ep`` innermost), with no expert tensor parallelism
    (``etp`` 1) once ``ep > 1``. Tried: ``etp`` 1 and the layout's ``tp`` (or ``etps``), each with
    every ``ep`` that divides the experts (or ``eps``); a dense model gets ``(1, 1)``."""
    if not req.model.moe:
        return [(1, 1)]
    etps = [e for e in (req.etps or sorted({1, tp})) if e <= req.gpus_per_node and req.model.expert_ffn % e == 0]
    return [(ep, etp) for etp in etps for ep in expert_parallel_sizes(req, dp, tp, cp, etp)]


def edp_size(layout: Layout) -> int:
    """The experts' data-parallel size: the ``tp x cp x dp`` GPUs of a stage over ``etp x ep``, the
    GPUs that hold the same experts and reduce (and shard) their gradients and state."""
    return layout.tp * layout.cp * layout.dp // (layout.etp * layout.ep)


def expert_share(layout: Layout) -> float:
    """The share of a stage's routed-expert parameters per tensor-parallel rank (:class:`_Tables`'
    ``experts``, a stage's experts over ``tp``) that one GPU holds: ``tp / (etp x ep)``."""
    return layout.tp / (layout.etp * layout.ep)


def pipeline_sizes(req: Request, ranks: int) -> list[int]:
    """Pipeline sizes for ``ranks`` GPUs per tensor-parallel slot: those that divide them, up to
    ``max_p`` and the layers (only ``pps`` when given)."""
    return [d for d in range(1, ranks + 1) if ranks % d == 0 and d <= min(req.model.layers, req.max_p)
            and (not req.pps or d in req.pps)]


def candidates(req: Request) -> list[Layout]:
    """Every combination considered, constraints not yet checked."""
    out = []
    for tp in tensor_parallel_sizes(req):
        for cp in context_parallel_sizes(req, tp):
            ranks = req.gpus // (tp * cp)
            for p in pipeline_sizes(req, ranks):
                dp = ranks // p
                if req.dps and dp not in req.dps:
                    continue
                for ep, etp in expert_layouts(req, tp, cp, dp):
                    out += _candidates_of(req, tp, p, dp, ep, cp, etp)
    return out


def context_parallel_sizes(req: Request, tp: int) -> list[int]:
    """Context-parallel sizes for tensor-parallel size ``tp``: 1 (none) unless ``cps`` pins some, those
    whose ``tp x cp`` divides the GPUs. Context parallelism is searched only where asked for: it pays
    for sequences long enough that a microbatch of one does not fit, or for a batch too small to give
    every replica a sequence."""
    return [c for c in (req.cps or (1,)) if req.gpus % (tp * c) == 0]


def stages_per_rank_tried(req: Request, kind: str) -> list[int]:
    """The values of v tried for a schedule of placement ``kind`` (``single`` also for no pipeline):
    the pinned ``vs`` where given (a looped schedule takes each of 2 or more, beyond ``max_v``), else
    2 to ``max_v`` for a looped schedule, 2 for a V-shaped one, 1 otherwise."""
    if kind == "loop":
        return [v for v in req.vs if v >= 2] if req.vs else list(range(2, req.max_v + 1))
    v = 2 if kind == "v" else 1
    return [v] if not req.vs or v in req.vs else []


def _candidates_of(req: Request, tp: int, p: int, dp: int, ep: int, cp: int = 1, etp: int = 1) -> list[Layout]:
    out = []
    for b in req.microbatch_sizes or (x for x in (1, 2, 4, 8, 16, 32) if x <= req.max_microbatch_size):
        if req.global_batch % (dp * b):
            continue
        m = req.global_batch // (dp * b)
        for name in [NO_PIPELINE] if p == 1 else list(req.schedules):
            kind = "single" if name == NO_PIPELINE else schedules.placement(name)
            for v in stages_per_rank_tried(req, kind):
                for sharding in (req.shardings if dp > 1 else ("none",)):
                    for recompute in req.recomputes:
                        for balance in (req.balances if p > 1 else ("even",)):
                            out.append(Layout(tp, p, dp, name, v, b, m, sharding, recompute, balance, ep, cp, etp))
    return out


def constraint_problem(layout: Layout, req: Request) -> str | None:
    """Why ``layout`` cannot run (its schedule's constraints; selective checkpointing under torch's
    split backward), as one line naming the fix; ``None`` if it can."""
    if layout.cp > 1 and req.seq_len % (2 * layout.cp):
        return (f"context parallelism of {layout.cp} cuts each sequence into {2 * layout.cp} chunks (two per GPU, "
                f"balancing causal attention), and {req.seq_len} tokens do not split so; use a sequence length that "
                f"is a multiple of {2 * layout.cp}, or another cp")
    if layout.schedule == NO_PIPELINE:
        return None
    if layout.recompute == "selective" and _torch_split_backward(layout, req):
        return (f"selective checkpointing cannot run under Schedule{layout.schedule}: torch 2.13's weight-gradient "
                "pass runs a second backward through each block, which selective checkpointing refuses ('Trying to "
                "backward an extra time', chapter 12); use recompute none or full, or a schedule without the I/W split")
    return planner_words(schedules.schedule_problem(layout.schedule, layout.p, layout.m, layout.v, req.model.layers))


# the schedule's refusals name the book's scripts' flags; the planner's name its own layout's keys
PLANNER_WORDS = ((r"got --stages-per-rank (\d+); use 2 or more, or Schedule1F1B", r"got v=\1; use v=2 or more, or 1F1B"),
                 (r"but --layers is (\d+); raise --layers to \d+ or more", r"but the model has \1 layers; use a smaller pp or v"),
                 (r"got --microbatches (\d+); use (\d+) or more", r"got m=\1; use m=\2 or more"),
                 (r"--microbatches (\d+) must be a multiple of (\d+); try (\d+) or (\d+)",
                  r"m=\1 must be a multiple of \2; try m=\3 or m=\4"))


def planner_words(problem: str | None) -> str | None:
    """A schedule's refusal (:func:`schedules.schedule_problem`, worded for the scripts' flags) in the
    planner's words: ``m`` (microbatches: the global batch / (dp x b)), ``v``, the model's layers."""
    import re

    if problem is None:
        return None
    for script_words, words in PLANNER_WORDS:
        problem = re.sub(script_words, words, problem)
    if "m=" in problem:
        problem += " (m = global batch / (dp x b))"
    return problem


def _torch_split_backward(layout: Layout, req: Request) -> bool:
    """Whether torch's own runtime (``stage_io="torch"``) runs ``layout``'s schedule with its backward
    split into I and W: the weight pass then differentiates each group of parameters apart
    (:func:`ppbook.planner.shapes.block_weight_groups`)."""
    return layout.schedule in schedules.SPLIT_BACKWARD and req.stage_io == "torch"


def request_problem(req: Request) -> str | None:
    """Why no layout of ``req`` can be planned, in one line that names the fix; ``None`` if some can."""
    return memory.kernels_problem(req.model, req.kernels) or divisibility_problem(req) or moe_fp8_problem(req)


def divisibility_problem(req: Request) -> str | None:
    """Why no layout divides the global batch, naming the fix; ``None`` when one does."""
    dps = set()
    for tp in tensor_parallel_sizes(req):
        for cp in context_parallel_sizes(req, tp):
            ranks = req.gpus // (tp * cp)
            dps |= {ranks // p for p in pipeline_sizes(req, ranks)}
    if not tensor_parallel_sizes(req):
        return (f"no tensor-parallel size divides both the {req.gpus} GPUs and the model's {req.model.heads} heads / "
                f"{req.model.kv_heads} key/value heads / MLP width {req.model.ffn}; use another number of GPUs")
    if not any(context_parallel_sizes(req, tp) for tp in tensor_parallel_sizes(req)):
        return (f"no context-parallel size of {list(req.cps)} times a tensor-parallel size divides the {req.gpus} GPUs; "
                "use other --cp sizes")
    if not dps:
        return (f"no pipeline size of {list(req.pps)} divides the GPUs per tensor-parallel slot and is at most the "
                f"model's {req.model.layers} layers (and max_p {req.max_p}); try other pipeline sizes")
    if not any(req.global_batch % dp == 0 for dp in dps):
        smallest = min(dps)
        return (f"--global-batch {req.global_batch} is not a multiple of any data-parallel size these GPUs allow "
                f"({', '.join(map(str, sorted(dps)))}); use a multiple of {smallest}, e.g. "
                f"{-(-req.global_batch // smallest) * smallest}, or split each sequence over GPUs with context "
                "parallelism (--cp 2 halves the data-parallel sizes)")
    return None


# --- orders, cached ---------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=4096)
def _order(name: str, p: int, m: int, v: int) -> schedules.Order:
    if name == NO_PIPELINE:
        return schedules.one_f_one_b_order(1, m)  # gradient accumulation: F0 B0 F1 B1 ...
    return schedules.order(name, p, m, v)


@functools.lru_cache(maxsize=4096)
def _compiled(name: str, p: int, m: int, v: int) -> Compiled:
    return compile_order(_order(name, p, m, v))


@functools.lru_cache(maxsize=8192)
def _pipeline_run(name: str, p: int, m: int, v: int, stage_cost: tuple, hop_intra: float, hop_inter: float,
                  node_of_rank: tuple[int, ...]) -> tuple[tuple[float, ...], tuple[float, ...], float]:
    """(end of each rank's last action, each rank's busy seconds, span) of one simulated step.
    Cached: layouts that differ only in sharding simulate the same pipeline."""
    c = _compiled(name, p, m, v)
    cost = _action_costs(name, p, m, v, c, dict(stage_cost))
    hop = [(hop_intra if node_of_rank[c.ranks[c.dep[i]]] == node_of_rank[c.ranks[i]] else hop_inter)
           if c.remote[i] else 0.0 for i in range(len(c.actions))]
    start, end = run(c, cost, hop)
    ends, busy = [0.0] * p, [0.0] * p
    for r, s, e in zip(c.ranks, start, end):
        ends[r] = max(ends[r], e)
        busy[r] += e - s
    return tuple(ends), tuple(busy), max(ends)


def _hops(layout: Layout, req: Request) -> tuple[float, float, tuple[int, ...]]:
    """A hand-off's seconds within a node and between nodes, and each pipeline rank's node."""
    boundary = traffic.boundary_bytes(layout.b, req.seq_len, req.model.hidden,
                                      memory.RECIPES[req.recipe].activation_bytes) / layout.tp / layout.cp
    nodes = tuple(node_of(r, layout.dp * layout.cp, layout.tp, req.gpus_per_node) for r in range(layout.p))
    return req.intra.time(boundary), req.inter.time(boundary), nodes


def timeline(layout: Layout, req: Request) -> list[Event]:
    """One step of ``layout`` simulated at its own ``m`` (not extrapolated), for drawing: every
    action's start and end in seconds, hand-offs included (the planner page draws these)."""
    stage_cost, _ = _stage_costs(layout, req)
    hop_intra, hop_inter, nodes = _hops(layout, req)
    c = _compiled(layout.schedule, layout.p, layout.m, layout.v)
    hop = [(hop_intra if nodes[c.ranks[c.dep[i]]] == nodes[c.ranks[i]] else hop_inter) if c.remote[i] else 0.0
           for i in range(len(c.actions))]
    start, end = run(c, _action_costs(layout.schedule, layout.p, layout.m, layout.v, c, stage_cost), hop)
    return [Event(r, a.stage, a.kind, a.microbatch, s, e) for a, r, s, e in zip(c.actions, c.ranks, start, end)]


SIMULATED_ACTIONS = 4_000  # a step of up to this many actions is simulated as it is


def _simulated_ms(layout: Layout) -> list[int]:
    """Microbatch counts to simulate: ``m`` itself while its step has at most
    :data:`SIMULATED_ACTIONS` actions (or m is below 2p), else 2p and 3p, from which
    :func:`_extrapolate` extends."""
    per_microbatch = layout.num_stages * (3 if layout.schedule in schedules.SPLIT_BACKWARD else 2)
    if layout.schedule == NO_PIPELINE or layout.m < 2 * layout.p or layout.m * per_microbatch <= SIMULATED_ACTIONS:
        return [layout.m]
    return [2 * layout.p, 3 * layout.p]


def _extrapolate(points: list[tuple[int, float]], m: int, least_slope: float | None = None) -> float:
    """The value at ``m`` on the line through two simulated points, rising at least
    ``least_slope`` per microbatch. For times, that least slope is the busiest rank's work per
    microbatch: in the steady state every rank waits on it. Between 2p and 3p a pipeline of
    unequal stages has not settled yet, and the line through them alone is up to 5% optimistic
    at m = 16p; with the floor, within 1.2% of simulating m itself (tests/test_plan.py)."""
    if len(points) == 1:
        return points[0][1]
    (m1, y1), (m2, y2) = points
    slope = (y2 - y1) / (m2 - m1)
    return y2 + (slope if least_slope is None else max(slope, least_slope)) * (m - m2)


@functools.lru_cache(maxsize=4096)
def in_flight(name: str, p: int, m: int, v: int) -> tuple[tuple[int, ...], ...]:
    """Per rank, per stage it holds: the most microbatches held at once, and (split backward) the
    microbatches whose residual stays until the step ends; as a tuple per rank of
    (stage, peak held, held at the peak that are residuals only)."""
    order = _order(name, p, m, v)
    out = []
    for rank in sorted(order):
        stages = sorted({a.stage for a in order[rank]})
        local = {s: i for i, s in enumerate(stages)}
        held, residual = [0] * len(stages), [0] * len(stages)
        total, best, best_held, best_residual = 0, 0, list(held), list(residual)
        for a in order[rank]:
            kind = a.kind
            if kind == "F":
                held[local[a.stage]] += 1
                total += 1
                if total >= best:  # the most held at once: the peak
                    best, best_held, best_residual = total, list(held), list(residual)
            elif kind == "B" or kind == "W":
                i = local[a.stage]
                held[i] -= 1
                total -= 1
                if kind == "W":
                    residual[i] += 1
        out.append(tuple((s, best_held[i], best_residual[i]) for i, s in enumerate(stages)))
    return tuple(out)


# --- prediction -----------------------------------------------------------------------------------------

OVERLAPS_ALL_TO_ALL = ("DualPipeV",)  # schedules whose runtime overlaps one microbatch's all-to-all with another's work


def _stage_costs(layout: Layout, req: Request, layers: list[list[int]] | None = None) -> tuple[dict, bool]:
    """Seconds of each (stage, kind) for one microbatch, and whether any came from FLOPs."""
    return _stage_costs_cached(req, layout.tp, layout.num_stages, layout.balance, layout.b, layout.recompute,
                               layout.ep, layout.schedule in OVERLAPS_ALL_TO_ALL and req.overlap_f_b,
                               _torch_split_backward(layout, req), layout.cp, layout.etp)


def alltoall_seconds(req: Request, nbytes: float, ep: int, tp: int) -> float:
    """Seconds of one all-to-all in which each of ``ep`` ranks sends its ``nbytes`` spread evenly
    over the group. The group is ``ep`` GPUs at a stride of ``tp`` (the expert-tensor-parallel size
    ``etp`` under :func:`expert_layouts`, innermost), ``ep x tp`` consecutive GPUs: within a node it
    runs over the node's link; across nodes, the share for other nodes crosses the network while
    the rest crosses NVLink at the same time, and the slower of the two counts."""
    if ep <= 1:
        return 0.0
    if ep * tp <= req.gpus_per_node:
        return req.intra.alltoall(nbytes, ep)
    local = max(1, req.gpus_per_node // tp)  # group members on one node
    within = nbytes * (local - 1) / ep / req.intra.bandwidth
    across = nbytes * (ep - local) / ep / req.inter.bandwidth
    return (ep - 1) * req.inter.latency + max(within, across)


@functools.lru_cache(maxsize=16384)
def _stage_costs_cached(req: Request, tp: int, num_stages: int, balance: str, b: int, recompute: str, ep: int = 1,
                        overlap: bool = False, split: bool = False, cp: int = 1, etp: int = 1) -> tuple[dict, bool]:
    """Recomputation runs each recomputed block's forward again in the backward: once, or, with
    full checkpointing under torch's split backward (``split``), once in I and once more per
    group of parameters in W (:func:`ppbook.planner.shapes.block_weight_groups`), on every stage
    but the first, whose backward torch runs whole in W (chapter 12 measured both). Context
    parallelism (``cp``) divides each GPU's computation and its tensor- and expert-parallel traffic
    by ``cp`` and adds :func:`context_parallel_seconds` to every layer. An MoE layer's seconds are
    :func:`moe_layer_seconds`'."""
    shape = req.model
    first, last = end_weights(req) if balance == "ends" else (0, 0)
    layers = _stage_layers_cached(shape.layers, num_stages, first, last)
    layout = Layout(tp, 1, 1, NO_PIPELINE, 1, b, 1, "none", recompute, balance)
    dense = costs.layer_costs_at(shape, req.gpu, layout.b, req.seq_len, req.precision, req.measured_costs)
    head = costs.head_costs(shape, req.gpu, layout.b, req.seq_len, req.measured_costs)
    estimated = not (dense.measured and head.measured)
    act_bytes = memory.RECIPES[req.recipe].activation_bytes
    tp_link = req.intra
    # sequence parallelism: per block, per microbatch, two all-gathers and two reduce-scatters forward, the same backward
    tp_half = 0.0
    if tp > 1:
        nbytes = traffic.boundary_bytes(layout.b, req.seq_len, shape.hidden, act_bytes) / cp
        tp_half = 2 * tp_link.allreduce(nbytes, tp)
    cp_f, cp_b = context_parallel_seconds(req, b, tp, cp, recompute)
    out = {}
    n = len(layers)
    redo = {"none": 0.0, "full": dense.F, "selective": dense.F * selective_share(shape, False)}
    per_group = split and recompute == "full"
    # one layer's seconds per pass, dense and MoE, and its weight pass with recomputation per group
    groups = shapes.block_weight_groups(shape, False)
    per_layer = {False: ((dense.F / (tp * cp) + tp_half) + cp_f,
                         ((dense.I + redo[layout.recompute]) / (tp * cp) + tp_half) + cp_b,
                         (dense.W + 0.0) / (tp * cp), (dense.W + (groups * dense.F if per_group else 0.0)) / (tp * cp))}
    a2a = 0.0
    if shape.moe:
        moe = moe_layer_seconds(req, tp, cp, b, ep, etp)
        a2a = moe["dispatch"]  # the expert-parallel traffic of one direction, what DualPipeV's pairs may hide
        comm = moe["tp"] + a2a
        redo_moe = {"none": 0.0, "full": moe["compute_F"] + a2a,  # the forward again, its all-to-alls included
                    "selective": moe["compute_F"] * selective_share(shape, True)}[recompute]
        groups_moe = shapes.block_weight_groups(shape, True)
        per_layer[True] = (moe["compute_F"] + comm + cp_f, moe["compute_I"] + redo_moe + comm + cp_b, moe["compute_W"],
                           moe["compute_W"] + (groups_moe * moe["compute_F"] if per_group else 0.0))
    for s, owned in enumerate(layers):
        f = i = w = 0.0
        n_moe = sum(1 for index in owned if index >= shape.dense_layers) if shape.moe else 0
        for is_moe, count in ((False, len(owned) - n_moe), (True, n_moe)):
            if count:
                lf, li, lw, lw_redo = per_layer[is_moe]
                f += count * lf
                i += count * li
                w += count * (lw_redo if s > 0 else lw)
        if s == n - 1:
            f, i, w = f + head.F / (tp * cp), i + head.I / (tp * cp), w + head.W / (tp * cp)
        out[(s, "F")], out[(s, "I")], out[(s, "W")], out[(s, "B")] = f, i, w, i + w
        if overlap:  # the all-to-all seconds inside the forward and the backward (its I), for the pairs
            out[(s, "F_a2a")] = out[(s, "B_a2a")] = n_moe * a2a
    return out, estimated


def _action_costs(name: str, p: int, m: int, v: int, c: Compiled, costs: dict) -> list[float]:
    """Seconds of every action of ``c``: its stage's cost for its kind, except in a DualPipeV pair
    run overlapped (``costs`` holding the all-to-all seconds, ``F_a2a`` and ``B_a2a``), where the
    forward and the backward that follows it take :func:`ppbook.planner.simulate.pair_slots`:
    each half's all-to-alls hidden under the other half's computation. Unpaired actions (the
    warm-up forwards, the cool-down backwards) pay their all-to-alls in full."""
    cost = [costs[(a.stage, a.kind)] for a in c.actions]
    if not any(k[1] == "F_a2a" for k in costs):
        return cost
    paired = _overlapped(name, p, m, v)
    for i, a in enumerate(c.actions):
        if a in paired:
            bwd = c.actions[i + 1]
            af, ab = costs[(a.stage, "F_a2a")], costs[(bwd.stage, "B_a2a")]
            cost[i], cost[i + 1] = pair_slots((cost[i] - af, af), (cost[i + 1] - ab, ab))
    return cost


@functools.lru_cache(maxsize=1024)
def _overlapped(name: str, p: int, m: int, v: int) -> frozenset:
    return schedules.overlapped_forwards(name, p, m, v)


def context_parallel_seconds(req: Request, b: int, tp: int, cp: int, recompute: str) -> tuple[float, float]:
    """(forward, backward) seconds context parallelism adds to one layer and microbatch: Llama 3's
    all-gather-based context parallelism (Dubey et al. 2024, section 3.3.2), in which each of the
    ``cp`` GPUs holds ``1/cp`` of every sequence (two chunks, balancing causal attention) and
    all-gathers the layer's keys and values before attention. The gathered keys and values are
    not kept for the backward (a GPU keeps its ``1/cp`` share; :func:`_transient` counts one
    layer's gathered K, V), so the backward gathers them again and reduce-scatters their
    gradients dK, dV (the same bytes): two transfers, three where full recomputation reruns the
    forward, its gather included. Ring attention (Liu et al. 2023, "Ring Attention with Blockwise
    Transformers") moves the same bytes, K and V passed around the ring in the forward and again
    in the backward with their gradients, and torch's own context parallelism (2.13) does the
    same, gathering K and V again in its backward. Modelled as not hidden (ring attention
    overlaps its transfers with attention's computation, so this is an upper bound there; torch
    passes dK, dV in float32, twice the bytes counted here). The bytes are K and V at the width
    attention uses them (:func:`ppbook.planner.memory.attention_widths`: grouped-query
    attention's ``kv_heads`` heads; multi-head latent attention's decompressed heads, keys of
    ``qk_nope_head_dim + qk_rope_head_dim`` and values of ``v_head_dim`` per head, as
    Megatron-LM's MLA hands them to attention). The group is ``cp`` consecutive tensor-parallel
    groups (tensor parallel innermost, then context parallel, as Megatron-LM orders them)."""
    if cp <= 1:
        return 0.0, 0.0
    _, k, v, _ = memory.attention_widths(req.model)
    nbytes = b * req.seq_len * (k + v) / tp * memory.RECIPES[req.recipe].activation_bytes  # a whole sequence's K, V
    link = req.intra if tp * cp <= req.gpus_per_node else req.inter
    gather = link.gather(nbytes, cp)
    # backward: K, V gathered again and dK, dV reduce-scattered; full recomputation's forward gathers once more
    return gather, gather * (3 if recompute == "full" else 2)


@functools.lru_cache(maxsize=256)
def selective_share(shape: ModelShape, moe: bool) -> float:
    """The share of a layer's forward FLOPs that selective recomputation runs again: the matrix
    products it does not keep (for a Llama block the key, output and up projections)."""
    q, k, v, out = memory.attention_widths(shape)
    h = shape.hidden
    width = shape.expert_ffn if moe else shape.ffn
    routed = (shape.top_k + shape.shared_experts) if moe else 1
    if shapes.gated(shape):
        redone = h * k + out * h + routed * h * width           # wk, wo, the up projection
    else:
        redone = out * h + routed * width * h                     # wo, fc2
    flops = costs.layer_flops(shape, 1, 1, moe)["F"]
    return min(1.0, 2 * redone / flops)


def _owned(layout: Layout, rank: int) -> list[int]:
    if layout.schedule == NO_PIPELINE:
        return [0]
    return _stage_indices(layout.schedule, rank, layout.p, layout.v)


@functools.lru_cache(maxsize=65536)
def _stage_indices(name: str, rank: int, p: int, v: int) -> list[int]:
    return schedules.stage_indices(name, rank, p, v)


@dataclass(frozen=True)
class _Tables:
    """Per stage, what does not depend on the schedule or the sharding: activation bytes per
    microbatch, split-backward residual bytes, parameters, and the parameters of its blocks."""
    per_mb: tuple[float, ...]
    residual: tuple[float, ...]
    params: tuple[float, ...]
    block_params: tuple[float, ...]
    blocks: tuple[int, ...]
    experts: tuple[float, ...]   # the routed experts' share of params (what expert parallelism divides)
    linear: tuple[float, ...] = ()  # the params of its blocks' linear layers (what an FP8 recipe runs in FP8)


def stage_boundary_bytes(req: Request, b: int, tp: int, cp: int = 1) -> float:
    """Bytes of one microbatch's activation at a stage boundary, on one GPU: ``b x s x h`` values,
    split over the tensor-parallel ranks when sequence parallelism splits the sequence (and over
    the context-parallel ranks, whose ``1/cp`` of each sequence it is)."""
    whole = traffic.boundary_bytes(b, req.seq_len, req.model.hidden, memory.RECIPES[req.recipe].activation_bytes) / cp
    return whole / tp if req.sequence_parallel else whole


@functools.lru_cache(maxsize=8192)
def _tables(req: Request, num_stages: int, balance: str, b: int, recompute: str, tp: int, cp: int = 1,
            etp: int = 1) -> _Tables:
    shape = req.model
    first, last = end_weights(req) if balance == "ends" else (0, 0)
    layers = _stage_layers_cached(shape.layers, num_stages, first, last)
    dt = memory.RECIPES[req.recipe].activation_bytes
    tokens = b * req.seq_len
    n = len(layers)
    per_mb, residual, params, block_params = [], [], [], []
    whole = 0.0 if req.sequence_parallel or tp == 1 else \
        memory.replicated_values(shape, req.kernels, recompute) * tokens * dt * (1 - 1 / tp)
    boundary = stage_boundary_bytes(req, b, tp, cp)
    # context parallelism: a GPU keeps its 1/cp of each sequence's activations (keys and values gathered per layer
    # are transient: _transient)
    for s, owned in enumerate(layers):
        per_mb.append(memory.stage_activation_bytes(shape, owned, tokens, s == 0, s == n - 1, dt, req.kernels,
                                                    recompute, req.seq_len) / (tp * cp) + len(owned) * whole / cp
                      + memory.held_io_bytes(boundary, s == 0, s == n - 1, req.stage_io)
                      + _moe_fp8_activation_bytes(req, owned, tokens, recompute, tp, cp, etp))
        residual.append(len(owned) * memory.values_bytes(memory.block_residual_values(shape), tokens, dt) / (tp * cp))
        total = memory.stage_parameters(shape, owned, s == 0, s == n - 1) / tp
        params.append(total)
        block_params.append(memory.stage_parameters(shape, owned, False, False) / tp)
    experts = tuple(sum(shapes.routed_expert_parameters(shape, i) for i in owned) / tp for owned in layers)
    linear = tuple(sum(shapes.linear_parameters(shape, i) for i in owned) / tp for owned in layers)
    return _Tables(tuple(per_mb), tuple(residual), tuple(params), tuple(block_params),
                   tuple(len(x) for x in layers), experts, linear)


def rank_saved_bytes(schedule: str, p: int, m: int, v: int, per_mb, residual) -> list[float]:
    """Per pipeline rank, what its stages keep for their backward at the rank's peak under
    ``schedule``'s order at ``m`` microbatches: each stage's microbatches in flight times its bytes
    per microbatch (``per_mb[s]``), plus, under the schedules that split the backward, what each
    microbatch past its weight pass leaves behind until the step ends (``residual[s]``: torch's
    input-gradient pass ran with ``retain_graph=True``). Chapter 12 measures it on torch's stages."""
    split = schedule in schedules.SPLIT_BACKWARD
    return [sum(count * per_mb[s] + (res * residual[s] if split else 0.0) for s, count, res in peak)
            for peak in in_flight(schedule, p, m, v)]


@functools.lru_cache(maxsize=16384)
def _rank_activations(req: Request, schedule: str, p: int, m: int, v: int, b: int, balance: str, recompute: str,
                      tp: int, cp: int = 1, etp: int = 1) -> tuple[tuple[float, float], ...]:
    """Per pipeline rank, (activation bytes, logits bytes) at its peak: the microbatches its
    stages hold at once under the schedule's order, times each stage's bytes per microbatch,
    plus one layer's recomputation and, on the last stage, one loss backward. Independent of the
    sharding, so cached across it."""
    shape = req.model
    stages = stage_count(schedule, p, v)
    t = _tables(req, stages, balance, b, recompute, tp, cp, etp)
    dt = memory.RECIPES[req.recipe].activation_bytes
    tokens = b * req.seq_len
    logits = memory.logits_bytes(shape, tokens, dt) / (tp * cp)
    loss_backward = memory.loss_backward_bytes(shape, tokens) / (tp * cp)
    transient = _transient(req, b, recompute, tp, cp, etp)
    probe = Layout(tp, p, 1, schedule, v, b, m, "none", recompute, balance)
    ms = _simulated_ms(probe)
    peaks = [in_flight(schedule, p, mm, v) for mm in ms]
    # what a microbatch leaves after its weight pass is torch's (retain_graph=True in its input-gradient
    # pass); a runtime that frees its stage I/O is modelled as keeping none of it
    residual = t.residual if req.stage_io == "torch" else tuple(0.0 for _ in t.residual)
    kept = [rank_saved_bytes(schedule, p, mm, v, t.per_mb, residual) for mm in ms]
    out = []
    for rank in range(p):
        acts_points = [(mm, at_m[rank]) for mm, at_m in zip(ms, kept)]
        logit_points = [(mm, logits * sum(count for s, count, _ in peak[rank] if s == stages - 1))
                        for mm, peak in zip(ms, peaks)]
        holds_last = any(s == stages - 1 for s, _, _ in peaks[0][rank])
        out.append((_extrapolate(acts_points, m) + transient,
                    _extrapolate(logit_points, m) + (loss_backward if holds_last else 0.0)))
    return tuple(out)


def _rank_state(layout: Layout, req: Request, stages: list[int]) -> tuple[float, float, memory.State]:
    """(parameters outside the routed experts, routed-expert parameters, training state) of one
    GPU holding ``stages``. Expert parallelism keeps ``1/ep`` of each MoE layer's routed experts
    on a GPU, and their state is sharded over the ``dp / ep`` replicas that hold the same experts;
    the rest is sharded over all ``dp``. Context parallelism replicates the parameters over its ``cp``
    GPUs, and the sharding modes shard over ``dp x cp`` (torchtitan's FSDP over ``dp_shard x cp``,
    Megatron-LM's distributed optimizer over its data-parallel group with context parallelism).
    (Parameters do not depend on the microbatch or the recomputation, so the result is cached
    without them.)"""
    return _rank_state_cached(req, layout.num_stages, layout.balance, layout.tp, tuple(stages), layout.sharding,
                              layout.dp * layout.cp, layout.ep, layout.p, layout.etp)


@functools.lru_cache(maxsize=65536)
def _rank_state_cached(req: Request, num_stages: int, balance: str, tp: int, stages: tuple[int, ...], sharding: str,
                       dp: int, ep: int, p: int, etp: int = 1) -> tuple[float, float, memory.State]:
    """(See :func:`_rank_state`.) The routed experts a GPU holds are ``1 / (etp x ep)`` of its stages'
    (:func:`expert_layouts`), their state sharded over the ``edp`` GPUs that hold the same
    (:func:`edp_size`); an FP8 recipe adds :func:`_fp8_weight_bytes`."""
    t = _tables(req, num_stages, balance, 1, "none", tp)
    layout = Layout(tp, p, dp, NO_PIPELINE, 1, 1, 1, sharding, "none", balance, ep, 1, etp)  # what the state depends on
    params = sum(t.params[s] for s in stages)
    experts = sum(t.experts[s] for s in stages)
    dense, local = params - experts, experts * expert_share(layout)
    recipe = _recipe(req)
    gathered = unsharded = 0.0
    if layout.sharding == "fsdp":
        pipelined = layout.p > 1
        blocks = sum(t.blocks[s] for s in stages)
        in_blocks = sum(t.block_params[s] for s in stages) - experts + local
        gathered, unsharded = memory.fsdp_gathered(
            in_blocks / blocks, dense + local - in_blocks, blocks, pipelined,
            memory.reshards_after_forward(req.fsdp_reshard, pipelined))
        if pipelined and len(stages) > MAX_ACTIVE_STAGES:
            # torch's runtime gathers a rank's next MAX_ACTIVE_STAGES stages and frees the others
            # (ppbook.planner.fsdp_window); their gradients stay unsharded, accumulated, until the step's end
            sizes = sorted((_fsdp_share(t, s, expert_share(layout)) for s in stages), reverse=True)
            gathered = sum(sizes[:MAX_ACTIVE_STAGES])
    state = memory.state_bytes(dense, recipe, layout.sharding, layout.dp, gathered, unsharded)
    if local:
        own = memory.state_bytes(local, recipe, layout.sharding, edp_size(layout))
        state = memory.State(state.parameters + own.parameters, state.gradients + own.gradients,
                             state.optimizer + own.optimizer)
    if req.precision != "bf16":
        fp8 = _fp8_weight_bytes(req, t, stages, layout, gathered / (dense + local) if layout.sharding == "fsdp" else 1.0)
        state = memory.State(state.parameters + fp8, state.gradients, state.optimizer)
    return dense, local, state


def _fsdp_share(t: _Tables, stage: int, share: float) -> float:
    """Parameters of ``stage`` one GPU gathers under FSDP (its routed experts' ``share``,
    :func:`expert_share`)."""
    return t.params[stage] - t.experts[stage] + t.experts[stage] * share


@functools.lru_cache(maxsize=16384)
def _fsdp_gathered_per_step(name: str, p: int, m: int, v: int, rank: int, reshard: bool,
                            groups: tuple[tuple[int, float, float, int], ...]) -> float:
    """Parameters one pipeline rank all-gathers in one step under FSDP2 inside ``PipelineStage``
    (torch's unshard window included for the multi-stage schedules), from its order:
    :func:`ppbook.planner.fsdp_window.fsdp_step`. ``groups``: per stage (index, parameters in its blocks,
    in its root group, blocks)."""
    stages = {s: StageGroups(tuple([blocks_params / n] * n), root) for s, blocks_params, root, n in groups}
    actions = [(a.stage, a.kind) for a in _order(name, p, m, v)[rank]]
    return fsdp_step(actions, stages, reshard, window=schedules.placement(name) != "single").gathered_bytes


def fsdp_gathers_factor(layout: Layout, req: Request, t: _Tables, rank: int) -> float:
    """How many times over a pipeline rank all-gathers its parameters in one step under FSDP
    (1.0: each once), counted from the schedule's order at the simulated microbatch counts and
    extended linearly to ``m``."""
    stages = _owned(layout, rank)
    groups = tuple((s, _fsdp_share(t, s, expert_share(layout)) - (t.params[s] - t.block_params[s]),
                    t.params[s] - t.block_params[s], t.blocks[s]) for s in stages)
    reshard = memory.reshards_after_forward(req.fsdp_reshard, True)
    points = [(mm, _fsdp_gathered_per_step(layout.schedule, layout.p, mm, layout.v, rank, reshard, groups))
              for mm in _simulated_ms(layout)]
    return _extrapolate(points, layout.m) / sum(_fsdp_share(t, s, expert_share(layout)) for s in stages)


def memory_floor(layout: Layout, req: Request) -> float:
    """A lower bound of rank 0's peak, from sizes alone: its training state, plus min(m, p) of its
    stages' microbatches (every one of torch's seven schedules runs that many forwards on rank 0
    before its first backward: tests/test_plan.py checks it), plus one layer's recomputation."""
    t = _tables(req, layout.num_stages, layout.balance, layout.b, layout.recompute, layout.tp, layout.cp, layout.etp)
    stages = _owned(layout, 0)
    _, _, state = _rank_state(layout, req, stages)
    return state.total + min(layout.m, layout.p) * min(t.per_mb[s] for s in stages) + \
        _transient(req, layout.b, layout.recompute, layout.tp, layout.cp, layout.etp)


@functools.lru_cache(maxsize=4096)
def _transient(req: Request, b: int, recompute: str, tp: int, cp: int = 1, etp: int = 1) -> float:
    """One layer's recomputation at the peak of a backward, on one GPU; with context parallelism, its
    ``1/cp`` share, plus the keys and values of a whole sequence the layer gathers."""
    dt = memory.RECIPES[req.recipe].activation_bytes
    out = memory.recompute_transient_bytes(req.model, b * req.seq_len, dt, req.kernels, recompute, req.seq_len) / (tp * cp)
    if recompute != "none" and (req.model.moe or req.precision != "bf16"):  # what the rebuilt layer keeps beyond it
        layer = [req.model.layers - 1]
        out += (_moe_fp8_activation_bytes(req, layer, b * req.seq_len, "none", tp, cp, etp)
                - _moe_fp8_activation_bytes(req, layer, b * req.seq_len, recompute, tp, cp, etp))
    if cp > 1:
        _, k, v, _ = memory.attention_widths(req.model)
        out += b * req.seq_len * (k + v) / tp * dt
    return out


def rank_memory(layout: Layout, req: Request, layers: list[list[int]] | None = None) -> list[RankMemory]:
    """Every pipeline rank's peak memory, by kind (the GPUs of one rank's tensor-parallel group
    hold the same)."""
    held = _rank_activations(req, layout.schedule, layout.p, layout.m, layout.v, layout.b, layout.balance,
                             layout.recompute, layout.tp, layout.cp, layout.etp)
    boundary, n = stage_boundary_bytes(req, layout.b, layout.tp, layout.cp), layout.num_stages
    out = []
    for rank in range(layout.p):
        stages = _owned(layout, rank)
        _, _, state = _rank_state(layout, req, stages)
        acts, logits = held[rank]
        buffers = sum(memory.stage_buffer_bytes(boundary, layout.m, s == 0, s == n - 1, req.stage_io) for s in stages)
        out.append(RankMemory(rank, stages, state.parameters, state.gradients, state.optimizer, acts, logits, buffers))
    return out


def _dp_exposed(layout: Layout, req: Request, params: float, busy: float, last_backward: float,
                first_forward: float, experts: float = 0.0, gathers: float = 1.0) -> tuple[float, float]:
    """(seconds of data-parallel traffic per step for this rank, seconds of it not hidden).

    The model of overlap, as the frameworks overlap:
    - replicated and ZeRO-1 (and ZeRO-2 with one microbatch): the gradients are reduced while the
      last microbatch's backward runs (DDP's and Megatron-LM's buckets), so only what outlasts
      that backward shows; ZeRO's all-gather of the updated weights overlaps the next step's
      first forward;
    - ZeRO-2 with several microbatches keeps only its shard of the gradients, so it
      reduce-scatters every microbatch's, overlapped with the backwards (about two thirds of the
      computation);
    - FSDP without a pipeline: each block's all-gathers and reduce-scatter overlap the
      neighbouring blocks' computation (prefetching), so traffic shows only where it outlasts the
      computation of the whole step;
    - FSDP inside ``PipelineStage``: the all-gathers overlap computation the same way, but the
      reduce-scatter runs after the step's last backward (``perform_reduce_grad``): not hidden.

    ``params`` are reduced among all ``dp`` replicas; ``experts`` (a GPU's routed experts under
    expert parallelism) among the ``dp / ep`` replicas that hold the same experts. Under FSDP inside
    a pipeline, ``gathers`` says how many times over the rank gathers its weights in a step
    (:func:`fsdp_gathers_factor`: once, unless it reshards after forward or torch's unshard window
    frees stages); without one, FSDP gathers each block for every microbatch's forward, and again
    for its backward when it reshards after forward.
    """
    if layout.dp == 1:
        return 0.0, 0.0
    recipe = memory.RECIPES[req.recipe]
    span = layout.dp * layout.tp
    link = req.intra if span <= req.gpus_per_node else req.inter
    groups = [(params, layout.dp)] + ([(experts, edp_size(layout))] if experts else [])

    def allreduce(nbytes_per_param: int) -> float:
        return sum(link.allreduce(n_params * nbytes_per_param, n) for n_params, n in groups)

    def gather(nbytes_per_param: int) -> float:
        return sum(link.gather(n_params * nbytes_per_param, n) for n_params, n in groups)

    if layout.sharding == "none":
        reduce = allreduce(recipe.grad_bytes)
        return reduce, max(0.0, reduce - last_backward)
    if layout.sharding in ("zero1", "zero2"):
        reduces = layout.m if layout.sharding == "zero2" and layout.m > 1 else 1
        rs, ag = reduces * gather(recipe.grad_bytes), gather(recipe.weight_bytes)
        if reduces > 1:  # every microbatch reduces, overlapped with the backwards (about 2/3 of the work)
            return rs + ag, max(0.0, rs - 2 * busy / 3) + max(0.0, ag - first_forward)
        return rs + ag, max(0.0, rs - last_backward) + max(0.0, ag - first_forward)
    if layout.p == 1:  # FSDP alone: gathered for the forward (and the backward), reduced, every microbatch
        per_microbatch = 2 if memory.reshards_after_forward(req.fsdp_reshard, False) else 1
        total = layout.m * (per_microbatch * gather(recipe.weight_bytes) + gather(recipe.grad_bytes))
        return total, max(0.0, total - busy)
    # inside PipelineStage: the all-gathers the order makes, then one reduce-scatter at the step's end
    ag, rs = gathers * gather(recipe.weight_bytes), gather(recipe.grad_bytes)
    return ag + rs, max(0.0, ag - busy) + rs


@functools.lru_cache(maxsize=256)
def model_flops_per_token(shape: ModelShape, seq_len: int) -> float:
    """Training FLOPs per token: 6 per parameter a token uses in matrix products, plus causal
    attention's score and value products, three times their forward (the convention of MFU)."""
    products = sum(costs.layer_flops(shape, 1, seq_len, shape.moe and i >= shape.dense_layers)["W"]
                   for i in range(shape.layers)) + 2 * shape.hidden * shape.vocab
    attention = sum(costs.layer_flops(shape, 1, seq_len)["F"] - costs.layer_flops(shape, 1, seq_len)["W"]
                    for _ in range(shape.layers))
    return 3 * products + 3 * attention


def predict(layout: Layout, req: Request, check_memory: bool = True, mem: list[RankMemory] | None = None) -> Prediction:
    """Memory and step time of one layout (constraints assumed met). A layout that does not fit
    comes back with ``why_not`` and without simulating its steps."""
    layers = layers_of(layout, req)
    mem = mem or rank_memory(layout, req, layers)
    pred = Prediction(layout, memory=mem)
    worst = max(mem, key=lambda r: r.total)
    if check_memory and worst.total > req.usable_bytes:
        kinds = {k: getattr(worst, k) for k in MEMORY_KINDS}
        big = max(kinds, key=kinds.get)
        pred.why_not = (f"does not fit: rank {worst.rank} needs {worst.total / memory.GB:.1f} GB of the "
                        f"{req.usable_bytes / memory.GB:.1f} GB usable, {kinds[big] / memory.GB:.1f} GB of it {big}")
        return pred
    stage_cost, pred.estimated = _stage_costs(layout, req, layers)
    ms = _simulated_ms(layout)
    costs_key = tuple(sorted(stage_cost.items()))
    runs = [_pipeline_run(layout.schedule, layout.p, m, layout.v, costs_key, *_hops(layout, req)) for m in ms]
    busy = {r: _extrapolate([(m, run_[1][r]) for m, run_ in zip(ms, runs)], layout.m) for r in range(layout.p)}
    bottleneck = 0.0 if len(ms) == 1 else max((runs[1][1][r] - runs[0][1][r]) / (ms[1] - ms[0]) for r in range(layout.p))
    span = _extrapolate([(m, run_[2]) for m, run_ in zip(ms, runs)], layout.m, bottleneck)
    end = {r: _extrapolate([(m, run_[0][r]) for m, run_ in zip(ms, runs)], layout.m, bottleneck) for r in range(layout.p)}
    step, exposed_worst, traffic_worst, critical = 0.0, 0.0, 0.0, {}
    t = _tables(req, layout.num_stages, layout.balance, layout.b, layout.recompute, layout.tp)
    # gradients are reduced, and state sharded, over the dp x cp GPUs that hold the same parameters
    replicas = replace(layout, dp=layout.dp * layout.cp, cp=1)
    for r in range(layout.p):
        stages = _owned(layout, r)
        params, experts, _ = _rank_state(layout, req, stages)
        # the rank's last backward passes (one per stage it holds) and its first forward
        last_backward = sum(stage_cost[(s, "B")] for s in stages)
        first_forward = stage_cost[(stages[0], "F")]
        gathers = fsdp_gathers_factor(layout, req, t, r) if layout.sharding == "fsdp" and layout.p > 1 else 1.0
        total, exposed = _dp_exposed(replicas, req, params, busy[r], last_backward, first_forward, experts, gathers)
        opt = _optimizer_seconds(params, replicas, req, experts)
        if end[r] + exposed + opt > step:  # the rank that finishes last sets the step: keep its parts
            critical = {"rank": r, "end_s": end[r], "busy_s": busy[r], "dp_exposed_s": exposed, "optimizer_s": opt}
        step = max(step, end[r] + exposed + opt)
        exposed_worst, traffic_worst = max(exposed_worst, exposed), max(traffic_worst, total)
        pred.optimizer_s = max(pred.optimizer_s, opt)
    pred.step_s, pred.pipeline_s, pred.dp_exposed_s = step, span, exposed_worst
    pred.bubble = max(0.0, 1 - sum(busy.values()) / (layout.p * span)) if span else 0.0
    tokens = req.global_batch * req.seq_len
    pred.tokens_per_s_per_gpu = tokens / step / req.gpus
    pred.mfu = pred.tokens_per_s_per_gpu * model_flops_per_token(req.model, req.seq_len) / (req.gpu.bf16_tflops * 1e12)
    pred.detail = {"dp_traffic_s": traffic_worst, "layers_per_stage": [len(x) for x in layers], "critical": critical}
    return pred


def _optimizer_seconds(params: float, layout: Layout, req: Request, experts: float = 0.0) -> float:
    """Adam's update of this rank's share, bound by memory bandwidth: read the gradient, the
    master weights and both moments, write them back and the bf16 weights. (Routed experts are
    sharded over the ``dp / ep`` replicas holding them.)"""
    recipe = _recipe(req)
    sharded = layout.sharding != "none"
    share = (params / layout.dp if sharded else params) + (experts / edp_size(layout) if sharded else experts)
    moved = share * (recipe.grad_bytes + 2 * recipe.optimizer_bytes + recipe.weight_bytes)
    return moved / (req.gpu.hbm_tb_s * 1e12)


def node_of(pp_rank: int, dp: int, tp: int, gpus_per_node: int) -> int:
    """The node of pipeline rank ``pp_rank``'s first GPU, tensor parallel innermost, then data
    parallel, pipeline outermost (global rank = pp_rank * dp * tp + dp_rank * tp + tp_rank)."""
    return pp_rank * dp * tp // gpus_per_node


def lower_bound(layout: Layout, req: Request) -> float:
    """A step time no simulation can beat: the busiest rank's computation alone."""
    return layout.m * _busiest(req, layout.schedule, layout.p, layout.v, layout.num_stages, layout.balance,
                               layout.b, layout.recompute, layout.tp, layout.ep, layout.cp, layout.etp)


@functools.lru_cache(maxsize=16384)
def _busiest(req: Request, schedule: str, p: int, v: int, num_stages: int, balance: str, b: int, recompute: str,
             tp: int, ep: int = 1, cp: int = 1, etp: int = 1) -> float:
    probe = Layout(tp, p, 1, schedule, v, b, 1, "none", recompute, balance, ep, cp, etp)
    stage_cost, _ = _stage_costs(probe, req, layers_of(probe, req))
    split = schedule in schedules.SPLIT_BACKWARD
    # a DualPipeV pair may hide its all-to-alls (simulate.pair_slots): the bound counts computation only there
    hidden = {s: stage_cost.get((s, "F_a2a"), 0.0) + stage_cost.get((s, "B_a2a"), 0.0) for s in range(num_stages)}
    return max(sum(stage_cost[(s, "F")] + (stage_cost[(s, "I")] + stage_cost[(s, "W")] if split else stage_cost[(s, "B")])
                   - hidden[s] for s in _owned(probe, r)) for r in range(p))


SLACK = 0.05  # the search lists the layouts within this fraction of the winner's step time
# the global batches ppbook.plan.pipeline_pays asks about, as multiples of the request's (the page ports it)
MULTIPLES = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1, 2, 4, 8, 16, 32)


def request_defaults() -> dict:
    """Every default of :class:`Request` (what the planner page fills in, never typed twice)."""
    return {f.name: list(f.default) if isinstance(f.default, tuple) else f.default
            for f in fields(Request) if f.default is not MISSING}


def plan(req: Request, keep_all: bool = False, slack: float = SLACK) -> tuple[list[Prediction], list[Prediction]]:
    """(ranked, dropped): the layouts that fit, fastest first, and the others with why they were
    dropped. Candidates are visited in the order of their lower bound (the busiest rank's
    computation alone); unless ``keep_all``, the search stops at the first whose bound is more
    than ``slack`` above the best step time found: none after it can come within ``slack`` of
    the winner, so they are neither checked nor listed."""
    dropped, valid = [], []
    for layout in candidates(req):
        problem = constraint_problem(layout, req)
        if problem:
            dropped.append(Prediction(layout, why_not=problem))
            continue
        valid.append((lower_bound(layout, req), layout))
    valid.sort(key=lambda x: x[0])
    ranked: list[Prediction] = []
    best = math.inf
    for bound, layout in valid:
        if not keep_all and bound > best * (1 + slack):
            break
        floor = memory_floor(layout, req)
        if floor > req.usable_bytes:  # cannot fit, whatever its order holds: no order needed
            dropped.append(Prediction(layout, why_not=(
                f"does not fit: rank 0's state and the {min(layout.m, layout.p)} microbatches every schedule "
                f"holds there before its first backward need {floor / memory.GB:.1f} GB of the "
                f"{req.usable_bytes / memory.GB:.1f} GB usable")))
            continue
        mem = rank_memory(layout, req)
        if max(r.total for r in mem) > req.usable_bytes:
            dropped.append(predict(layout, req, mem=mem))  # the reason, from the memory alone
            continue
        pred = predict(layout, req, check_memory=False, mem=mem)
        ranked.append(pred)
        best = min(best, pred.step_s)
    ranked.sort(key=lambda o: o.step_s)
    return ranked, dropped


def closest(dropped: list[Prediction], req: Request) -> Prediction | None:
    """Of the layouts :func:`plan` dropped, the one that needs the least memory, with its memory
    counted (what to show when nothing fits). The search drops most layouts on their memory's lower
    bound without counting it; when it counted none, the layout with the lowest bound is counted
    now. ``None`` when every layout was refused for another reason."""
    counted = [o for o in dropped if o.memory]
    if not counted:
        unfit = [o.layout for o in dropped if (o.why_not or "").startswith("does not fit")]
        if unfit:
            counted = [predict(min(unfit, key=lambda lay: memory_floor(lay, req)), req)]
    return min(counted, key=lambda o: o.peak_bytes, default=None)


def prediction_json(pred: Prediction) -> dict:
    return {**asdict(pred.layout), "label": pred.layout.label(), "step_s": pred.step_s,
            "pipeline_s": pred.pipeline_s, "dp_exposed_s": pred.dp_exposed_s, "optimizer_s": pred.optimizer_s,
            "bubble": pred.bubble, "tokens_per_s_per_gpu": pred.tokens_per_s_per_gpu, "mfu": pred.mfu,
            "peak_gb": pred.peak_gb, "estimated": pred.estimated, "why_not": pred.why_not,
            "memory": [{**asdict(r), "total": r.total} for r in pred.memory], "detail": pred.detail}


def with_layout(req: Request, **fixed) -> Request:
    """``req`` narrowed to the layouts that have the ``fixed`` values (tp, schedules, ...)."""
    return replace(req, **fixed)


# --- mixtures of experts as frameworks lay them out, FP8, other optimizers (issue 52) -----------------------------

@functools.lru_cache(maxsize=64)
def _recipe(req: Request) -> memory.Recipe:
    """The request's memory recipe with its optimizer's state (:func:`ppbook.planner.memory.recipe_for`)."""
    return memory.recipe_for(req.recipe, req.optimizer)


def expert_load(req: Request) -> float:
    """Tokens the busiest expert-parallel rank receives over the mean: ``moe_imbalance``, capped by a
    ``capacity_factor`` where one is set (an expert then drops the tokens beyond it)."""
    return min(req.moe_imbalance, req.capacity_factor) if req.capacity_factor > 0 else req.moe_imbalance


@functools.lru_cache(maxsize=16384)
def moe_layer_seconds(req: Request, tp: int, cp: int, b: int, ep: int, etp: int) -> dict[str, float]:
    """One MoE layer's seconds on the busiest GPU for one microbatch of ``b`` sequences, laid out as
    :func:`expert_layouts` lays experts (``ep`` and ``etp`` over the ``tp x cp x dp`` GPUs):

    - ``compute_F``, ``compute_I``, ``compute_W``: attention, the router and the shared experts as
      a dense layer's pass, divided over ``tp x cp``
      (:func:`ppbook.planner.costs.moe_dense_costs`), plus the GPU's own routed experts
      (:func:`ppbook.planner.costs.expert_costs`). A GPU's ``b s / (tp cp)`` tokens each go to
      ``top_k`` experts; its ``E / ep`` experts, each split ``etp`` ways, receive the copies of
      ``etp x ep`` GPUs' tokens: ``etp x`` its own copies in all, at ``1/etp`` of each expert's
      width (the same FLOPs whatever the layout), ``etp ep b s k / (tp cp E)`` to each expert,
      which sets the grouped products' efficiency. The busiest rank receives :func:`expert_load`
      times the mean, and the layer waits for it;
    - ``dispatch``: the expert-parallel traffic of one direction (the forward, or the input-gradient
      pass): an all-to-all that dispatches the token copies and one that combines the outputs
      (:func:`alltoall_seconds`, at a stride of ``etp``: within a node while ``etp x ep`` GPUs fit
      in one, across nodes otherwise; with DeepEP, :func:`deepep_seconds`), the busiest rank's
      bytes; with ``etp > 1`` also the all-gather of the received tokens over the ``etp`` GPUs
      that split each expert and the reduce-scatter of their outputs (Megatron-Core's all-to-all
      dispatcher);
    - ``tp``: tensor parallelism's collectives that remain: attention's all-gather and
      reduce-scatter (sequence parallelism), and the shared experts' where there are any; the
      routed experts' tokens move by ``dispatch`` instead.

    The traffic is bf16 whatever the precision (DeepSeek-V3 dispatches in FP8; not modelled)."""
    shape, gpu = req.model, req.gpu
    dt = memory.RECIPES[req.recipe].activation_bytes
    load = expert_load(req)
    dense = costs.moe_dense_costs(shape, gpu, b, req.seq_len, req.precision, tp * cp)
    own = b * req.seq_len / (tp * cp)                                # this GPU's tokens
    copies = own * shape.top_k * etp * load                           # routed copies its experts process
    experts = costs.expert_costs(shape, gpu, copies, copies * ep / shape.experts, etp, req.precision)
    sent = traffic.expert_dispatch_bytes(b, req.seq_len, shape.hidden, shape.top_k, dt, tp) / cp * load
    if req.dispatcher == "deepep":
        dispatch = 2 * deepep_seconds(req, sent, ep, etp)
    else:
        dispatch = 2 * alltoall_seconds(req, sent, ep, etp)
    if etp > 1:
        link = req.intra if etp <= req.gpus_per_node else req.inter
        dispatch += 2 * link.gather(etp * sent, etp)
    tp_part = 0.0
    if tp > 1:
        half = req.intra.allreduce(traffic.boundary_bytes(b, req.seq_len, shape.hidden, dt) / cp, tp)
        tp_part = half * (2 if shape.shared_experts else 1)
    return {"compute_F": dense.F + experts.F, "compute_I": dense.I + experts.I,
            "compute_W": dense.W + experts.W, "dispatch": dispatch, "tp": tp_part}


DISPATCHERS = ("alltoall", "deepep")


def remote_nodes(experts: int, top_k: int, nodes: int) -> float:
    """Other nodes a token's ``top_k`` experts are on, on average, when ``experts`` are spread evenly
    over ``nodes`` and a token picks ``top_k`` different experts at random (a node holds none of
    them with probability ``C(E - E/n, k) / C(E, k)``)."""
    if nodes <= 1:
        return 0.0
    per_node = experts / nodes
    miss = 1.0
    for i in range(top_k):
        miss *= max(0.0, (experts - per_node - i) / (experts - i))
    return (nodes - 1) * (1 - miss)


def deepep_seconds(req: Request, nbytes: float, ep: int, stride: int) -> float:
    """Seconds of one DeepEP dispatch (or combine) of ``nbytes`` of token copies per GPU: DeepEP's
    normal kernels send a token once over the network to each other node that holds any of its
    experts, then forward it over NVLink to the GPUs of that node that need it (Zhao et al. 2025,
    deepseek-ai/DeepEP; the DeepSeek-V3 report, section 3.2.2). Across nodes each token crosses
    :func:`remote_nodes` times instead of ``top_k x`` the other nodes' share; within a node the
    copies cross NVLink as in an all-to-all, and the slower of the two counts. Within one node it is
    :func:`alltoall_seconds`."""
    if ep * stride <= req.gpus_per_node or ep <= 1:
        return alltoall_seconds(req, nbytes, ep, stride)
    shape = req.model
    local = max(1, req.gpus_per_node // stride)        # group members on one node
    nodes = ep // local
    per_token = nbytes / shape.top_k                    # one copy of a GPU's tokens
    within = nbytes * (local - 1) / ep / req.intra.bandwidth
    across = per_token * remote_nodes(shape.experts, shape.top_k, nodes) / req.inter.bandwidth
    return (nodes - 1) * req.inter.latency + (local - 1) * req.intra.latency + max(within, across)


def _moe_fp8_activation_bytes(req: Request, owned: list[int], tokens: int, recompute: str, tp: int, cp: int,
                              etp: int) -> float:
    """Bytes one stage holding ``owned`` layers keeps per microbatch on the busiest GPU beyond the
    count of :func:`ppbook.planner.memory.stage_activation_bytes` (divided over ``tp x cp``): its
    MoE layers' experts at :func:`expert_load` and gathered over ``etp``
    (:func:`ppbook.planner.memory.expert_activation_extra`), less what an FP8 recipe saves by
    keeping the inputs of its linear layers in FP8 (:func:`ppbook.planner.memory.fp8_saved_values`).
    0 for a dense model in bf16."""
    shape = req.model
    precision = memory.precision_of(req.precision)
    if not shape.moe and not precision.fp8:
        return 0.0
    dt = memory.RECIPES[req.recipe].activation_bytes
    own = tokens / (tp * cp)
    load = expert_load(req)
    n_moe = sum(1 for i in owned if shape.moe and i >= shape.dense_layers)
    out = n_moe * own * memory.expert_activation_extra(shape, req.kernels, recompute, etp, load) * dt if n_moe else 0.0
    if precision.fp8:
        values = ((len(owned) - n_moe) * memory.fp8_saved_values(shape, req.kernels, recompute, False)
                  + n_moe * memory.fp8_saved_values(shape, req.kernels, recompute, True, etp, load))
        out -= own * values * (dt - precision.saved_input_bytes)
    return out


def _fp8_weight_bytes(req: Request, t: _Tables, stages, layout: Layout, gathered_share: float = 1.0) -> float:
    """Bytes an FP8 recipe keeps on one GPU beyond bf16 training's state: the FP8 copies of the
    weights of its linear layers (:attr:`ppbook.planner.memory.Precision.weight_copy_bytes`; under
    FSDP, of the ``gathered_share`` of its weights gathered at its peak) and, for delayed scaling,
    each FP8 tensor's history of maxima (three a linear layer, each expert's its own). The master
    weights, gradients and optimizer state are bf16 training's."""
    precision = memory.precision_of(req.precision)
    if not precision.fp8:
        return 0.0
    shape = req.model
    experts = sum(t.experts[s] for s in stages)
    linear = sum(t.linear[s] for s in stages) - experts + experts * expert_share(layout)
    copies = linear * precision.weight_copy_bytes * gathered_share
    if not precision.amax_history:
        return copies
    first, last = end_weights(req) if layout.balance == "ends" else (0, 0)
    layers = _stage_layers_cached(shape.layers, len(t.params), first, last)
    tensors = 0
    for s in stages:
        for i in layers[s]:
            moe = shape.moe and i >= shape.dense_layers
            groups = shapes.block_weight_groups(shape, moe) - 2 - (1 if moe else 0)  # linear layers: no norms, router
            if moe:  # the routed experts' matrices: one GEMM per local expert
                matrices = 3 if shapes.gated(shape) else 2
                groups += matrices * (shape.experts // layout.ep - 1)
            tensors += 3 * groups
    return copies + tensors * precision.amax_history * 4


def moe_fp8_problem(req: Request) -> str | None:
    """Why the request's precision, optimizer or expert options cannot be planned, in one line with
    the fix; ``None`` if they can (all defaults can)."""
    if req.precision not in memory.PRECISIONS:
        return f"unknown precision {req.precision!r}; use one of {', '.join(memory.PRECISIONS)}"
    problem = costs.precision_problem(req.precision, req.gpu.name)
    if problem:
        return problem
    if req.precision != "bf16" and memory.RECIPES[req.recipe].activation_bytes != 2:
        return f"--precision {req.precision} runs beside bf16 weights and activations; use --recipe bf16 or bf16-grads"
    if req.optimizer not in memory.OPTIMIZER_STATE:
        return f"unknown optimizer {req.optimizer!r}; use one of {', '.join(memory.OPTIMIZER_STATE)}"
    if req.dispatcher not in DISPATCHERS:
        return f"unknown dispatcher {req.dispatcher!r}; use one of {', '.join(DISPATCHERS)}"
    if not (math.isfinite(req.moe_imbalance) and req.moe_imbalance >= 1):
        return (f"--moe-imbalance is the busiest expert-parallel rank's tokens over the mean, at least 1; "
                f"got {req.moe_imbalance}")
    if not (math.isfinite(req.capacity_factor) and req.capacity_factor >= 0):
        return f"--capacity-factor must be 0 (dropless) or a positive number; got {req.capacity_factor}"
    if req.model.moe and req.etps and not any(e <= req.gpus_per_node and req.model.expert_ffn % e == 0 for e in req.etps):
        return (f"--etp: none of {list(req.etps)} divides the experts' width {req.model.expert_ffn} within a node of "
                f"{req.gpus_per_node}; try --etp 1")
    return None
