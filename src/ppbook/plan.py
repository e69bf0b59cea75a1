"""Choosing a pipeline: enumerate layouts and schedules, drop what cannot run, rank the rest.

Introduced in "Choosing a pipeline". For a model, a cluster and a global batch, the planner
enumerates the pipeline size p, the data-parallel size dp (tensor-parallel size tp given),
whether dp replicates or shards the training state, the microbatch size b and count m, the
stages per rank v, recomputation and torch's seven schedules. It drops each candidate that
violates a schedule's constraints (:func:`ppbook.stages.schedule_problem`) or does not fit
(:mod:`ppbook.memory`), and ranks the rest by predicted step time: torch's order of actions,
simulated (:func:`ppbook.simulate.simulate`) with per-action times measured on an H100
(``data/gpu/h100_llama3_costs.json``), hand-offs as latency + bytes / bandwidth
(:mod:`ppbook.network`), then the data-parallel gradient traffic, not overlapped.

    python -m ppbook.plan --model llama3-8b --gpus 8 --gpus-per-node 8 --gpu-memory 80 --global-batch 64 --seq-len 8192
    python -m ppbook.plan --model llama3-70b --gpus 64 --gpus-per-node 8 --gpu-memory 80 --global-batch 1024 --seq-len 8192 --why
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ppbook import memory, network, simulate, stages, traffic
from ppbook.planner import schedules
from ppbook.stages import assign_layers

COSTS_FILE = Path(__file__).resolve().parents[2] / "data" / "gpu" / "h100_llama3_costs.json"
MODELS = {"llama3-8b": "Llama-3.1-8B", "llama3-70b": "Llama-3.1-70B", "llama3-405b": "Llama-3.1-405B"}
SPLIT_BACKWARD = ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")  # I and W passes
NO_PIPELINE = "none"  # p = 1: data parallelism alone, gradient accumulation over m microbatches


@dataclass(frozen=True)
class Request:
    model: str
    gpus: int
    gpus_per_node: int
    gpu_memory_gb: float
    global_batch: int       # sequences per step
    seq_len: int
    tp: int = 1
    precision: str = "bf16"
    intra: str = "nvlink-h100"
    inter: str = "ib-ndr400"
    headroom: float = 0.1   # fraction of each GPU kept free (CUDA context, NCCL buffers, fragmentation)
    max_microbatch_size: int = 4
    max_v: int = 4
    max_p: int = 16
    schedules: tuple[str, ...] = tuple(stages.TORCH_SCHEDULES)


@dataclass(frozen=True)
class Candidate:
    schedule: str
    p: int
    dp: int
    v: int        # stages per rank (1 for GPipe and 1F1B, 2 for the V-shaped schedules)
    b: int        # microbatch size (sequences)
    m: int        # microbatches per step and data-parallel rank
    shard: bool   # dp shards the optimizer state, gradients and weights (FSDP / ZeRO) instead of replicating
    recompute: bool

    def label(self) -> str:
        v = f" v={self.v}" if self.v > 1 else ""
        return (f"{self.schedule} p={self.p}{v} dp={self.dp}{' shard' if self.shard else ''} "
                f"b={self.b} m={self.m}{' recompute' if self.recompute else ''}")


@dataclass
class Outcome:
    candidate: Candidate
    step_s: float = 0.0        # predicted step time
    pipeline_s: float = 0.0    # of which the pipeline's forward and backward passes
    dp_s: float = 0.0          # of which the data-parallel gradient (and FSDP weight) traffic
    bubble: float = 0.0        # idle fraction of the pipeline part, mean over ranks
    memory_gb: float = 0.0     # the fullest GPU's peak
    why_not: str | None = None
    detail: dict = field(default_factory=dict)


# --- inputs ------------------------------------------------------------------------------------------
def validate(req: Request) -> None:
    """One line saying what is wrong with ``req`` and how to fix it."""
    if req.model not in MODELS:
        raise ValueError(f"--model {req.model!r} is not one the planner has costs for; use one of {', '.join(MODELS)}")
    for name, value in (("--gpus", req.gpus), ("--gpus-per-node", req.gpus_per_node), ("--global-batch", req.global_batch),
                        ("--seq-len", req.seq_len), ("--tp", req.tp), ("--max-microbatch-size", req.max_microbatch_size),
                        ("--max-v", req.max_v), ("--max-p", req.max_p)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    if req.gpu_memory_gb <= 0:
        raise ValueError(f"--gpu-memory must be positive (GB), got {req.gpu_memory_gb}")
    if not 0 <= req.headroom < 1:
        raise ValueError(f"--headroom is a fraction of the GPU's memory kept free, in [0, 1); got {req.headroom}")
    if req.gpus % req.tp:
        raise ValueError(f"--gpus {req.gpus} is not a multiple of --tp {req.tp}; use a tensor-parallel size that divides it")
    if req.tp > req.gpus_per_node:
        raise ValueError(f"--tp {req.tp} spans more than one node of {req.gpus_per_node} GPUs; keep --tp <= --gpus-per-node")
    if req.gpus > req.gpus_per_node and req.gpus % req.gpus_per_node:
        raise ValueError(f"--gpus {req.gpus} is not a whole number of nodes of {req.gpus_per_node}; use a multiple")
    seqs = sorted({r["seq_len"] for r in _rows() if r["model"] == req.model})
    if req.seq_len not in seqs:
        raise ValueError(f"no H100 costs at --seq-len {req.seq_len} (the measured file has {', '.join(map(str, seqs))}); "
                         "use one of those or record costs at your length")
    for s in req.schedules:
        if s not in stages.TORCH_SCHEDULES:
            raise ValueError(f"unknown schedule {s!r}; use some of {', '.join(stages.TORCH_SCHEDULES)}")
    for name in (req.intra, req.inter):
        if name not in network.LINKS:
            raise ValueError(f"unknown link {name!r}; use one of {', '.join(network.LINKS)}")


_ROWS: list[dict] | None = None


def _rows() -> list[dict]:
    global _ROWS
    if _ROWS is None:
        _ROWS = json.loads(COSTS_FILE.read_text())["rows"]
    return _ROWS


def part_costs(model: str, part: str, seq_len: int, b: int) -> dict[str, float]:
    """Seconds of F, I, W and B for one block (``part="block"``) or the head with its loss, at
    microbatch size ``b``: the H100 row measured at ``b`` if there is one, else the one-sequence
    row times ``b`` (the GPU is saturated at these sizes: two sequences cost 1.8 to 2.0 times one)."""
    rows = [r for r in _rows() if r["model"] == model and r["part"] == part and r["seq_len"] == seq_len]
    row = next((r for r in rows if r["microbatch"] == b), None)
    scale = 1
    if row is None:
        row, scale = next(r for r in rows if r["microbatch"] == 1), b
    return {"F": scale * row["F_ms"] / 1e3, "I": scale * row["I_ms"] / 1e3,
            "W": scale * row["W_ms_est"] / 1e3, "B": scale * row["B_ms"] / 1e3}


# --- enumeration ---------------------------------------------------------------------------------------
def candidates(req: Request) -> list[Candidate]:
    """Every combination the planner considers, constraints not yet checked."""
    cfg = memory.LLAMA_SIZES[MODELS[req.model]]
    out = []
    ranks = req.gpus // req.tp
    for p in (d for d in range(1, ranks + 1) if ranks % d == 0 and d <= min(cfg.n_layers, req.max_p)):
        dp = ranks // p
        for b in (x for x in (1, 2, 4, 8, 16) if x <= req.max_microbatch_size):
            if req.global_batch % (dp * b):
                continue
            m = req.global_batch // (dp * b)
            names = [NO_PIPELINE] if p == 1 else list(req.schedules)
            for name in names:
                placement = "single" if name == NO_PIPELINE else stages.placement(name)
                vs = [v for v in range(2, req.max_v + 1)] if placement == "loop" else [2] if placement == "v" else [1]
                for v in vs:
                    for shard in ((False, True) if dp > 1 else (False,)):
                        for recompute in (False, True):
                            out.append(Candidate(name, p, dp, v, b, m, shard, recompute))
    return out


def constraint_problem(c: Candidate, req: Request) -> str | None:
    cfg = memory.LLAMA_SIZES[MODELS[req.model]]
    if c.schedule == NO_PIPELINE:
        return None
    return stages.schedule_problem(c.schedule, c.p, c.m, c.v, cfg.n_layers)


# --- prediction -----------------------------------------------------------------------------------------
def _num_stages(c: Candidate) -> int:
    return c.p * (1 if c.schedule == NO_PIPELINE else stages.stages_per_rank(c.schedule, c.v))


def _stage_layers(c: Candidate, req: Request) -> list[int]:
    cfg = memory.LLAMA_SIZES[MODELS[req.model]]
    return [len(x) for x in assign_layers(cfg.n_layers, _num_stages(c))]


def stage_costs(c: Candidate, req: Request) -> dict[tuple[int, str], float]:
    """Seconds of each (stage, kind): its blocks, plus the head and loss on the last stage; with
    recomputation, the input-gradient (or full) backward also runs the forward again; with tensor
    parallelism, compute divides by tp and each block adds two all-reduces of the activation in
    its forward and two in its backward (Megatron-LM's layout, Shoeybi et al. 2019)."""
    block = part_costs(req.model, "block", req.seq_len, c.b)
    head = part_costs(req.model, "head+loss", req.seq_len, c.b)
    cfg = memory.LLAMA_SIZES[MODELS[req.model]]
    tp_comm = 0.0
    if req.tp > 1:
        act = traffic.boundary_bytes(c.b, req.seq_len, cfg.dim, 2)
        tp_comm = 2 * network.LINKS[req.intra].allreduce(act, req.tp)
    layers = _stage_layers(c, req)
    out = {}
    for s, n in enumerate(layers):
        last = s == len(layers) - 1
        for kind in ("F", "I", "W", "B"):
            t = n * block[kind] + (head[kind] if last else 0.0)
            if c.recompute and kind in ("I", "B"):
                t += n * block["F"]
            t = t / req.tp + (n * tp_comm if kind in ("F", "I", "B") else 0.0)
            out[(s, kind)] = t
    return out


@functools.lru_cache(maxsize=512)
def _order_cached(name: str, p: int, m: int, v: int) -> simulate.Order:
    if name == NO_PIPELINE:
        return simulate.one_f_one_b_order(1, m)  # gradient accumulation: F0 B0 F1 B1 ...
    return schedules.order(name, p, m, v)  # torch's order, without torch


def _order(c: Candidate, m: int) -> simulate.Order:
    return _order_cached(c.schedule, c.p, m, c.v)


def _simulated_ms(c: Candidate) -> list[int]:
    """Microbatch counts to simulate: ``m`` itself when below 2p, else 2p and 3p, from which step
    time and memory are inter- or extrapolated linearly in m (both orders have reached their
    steady state; tests/test_plan.py checks the result against simulating m itself)."""
    if c.m < 2 * c.p or c.schedule == NO_PIPELINE:
        return [c.m]
    return [2 * c.p, 3 * c.p]


def _span_at(c: Candidate, req: Request, m: int, costs) -> float:
    """Simulated time of the pipeline's passes for ``m`` microbatches, hand-offs over the layout's links."""
    cfg = memory.LLAMA_SIZES[MODELS[req.model]]
    order = _order(c, m)
    rank_of = {a.stage: r for r, acts in order.items() for a in acts}
    link = network.handoff_latency(traffic.boundary_bytes(c.b, req.seq_len, cfg.dim, 2) // req.tp, rank_of, c.dp,
                                   req.tp, req.gpus_per_node, network.LINKS[req.intra], network.LINKS[req.inter])
    return max(e.end for e in simulate.simulate(order, costs, latency=link))


def _held_at(c: Candidate, req: Request, m: int) -> tuple[dict[int, int], int]:
    """Per rank, the peak bytes of saved activations for ``m`` microbatches, and how many
    microbatches' logits the last stage holds at once: from the order alone, no simulation."""
    cfg = memory.LLAMA_SIZES[MODELS[req.model]]
    order = _order(c, m)
    n = _num_stages(c)
    dt = memory.PRECISIONS[req.precision].activation_bytes
    layers = _stage_layers(c, req)
    per_mb = {s: memory.stage_activation_bytes(cfg, c.b, req.seq_len, layers[s], s == 0, s == n - 1, dt, c.recompute)
              // req.tp for s in range(n)}
    residual = {}
    if c.schedule in SPLIT_BACKWARD:  # torch 2.13 keeps these until step returns (see memory.block_residual_bytes)
        for s in range(n):
            full = c.recompute or s == n - 1  # an upper bound where the formula is not exact
            residual[s] = per_mb[s] if full else layers[s] * memory.block_residual_bytes(cfg, c.b, req.seq_len, dt) // req.tp
    return memory.peak_activation_bytes(order, per_mb, residual, by="rank"), simulate.peak_in_flight(order)[n - 1]


def _extrapolate(points: list[tuple[int, float]], m: int) -> float:
    if len(points) == 1:
        return points[0][1]
    (m1, y1), (m2, y2) = points
    return y1 + (y2 - y1) * (m - m1) / (m2 - m1)


def _rank_state(c: Candidate, req: Request, owned: list[int], layers: list[int]) -> tuple[float, float, float]:
    """(resident bytes, weight bytes, gradient bytes) of the training state of the stages
    ``owned`` by one GPU. Replicated: weights, gradients and optimizer state whole. Sharded over dp
    (FSDP / ZeRO-3 with the weights gathered once for the step, as with pipelining one does not
    re-gather per microbatch): gathered weights and accumulated gradients whole, plus the shards of
    all three."""
    cfg = memory.LLAMA_SIZES[MODELS[req.model]]
    pr = memory.PRECISIONS[req.precision]
    n = len(layers)
    params = sum(memory.stage_parameters(cfg, layers[s], s == 0, s == n - 1) for s in owned) / req.tp
    w, g, o = params * pr.weight_bytes, params * pr.grad_bytes, params * pr.optimizer_bytes
    return (w + g + (w + g + o) / c.dp if c.shard else w + g + o), w, g


def _owned(c: Candidate, rank: int) -> list[int]:
    return [0] if c.schedule == NO_PIPELINE else stages.stage_indices(c.schedule, rank, c.p, c.v)


def predict(c: Candidate, req: Request, usable_gb: float | None = None) -> Outcome:
    """Step time, bubble and the fullest GPU's memory of one candidate (constraints assumed met).
    With ``usable_gb``, a candidate whose memory exceeds it is returned with ``why_not`` and no
    simulation (memory follows from the order alone)."""
    cfg = memory.LLAMA_SIZES[MODELS[req.model]]
    ms = _simulated_ms(c)
    held = [_held_at(c, req, m) for m in ms]
    n = _num_stages(c)
    layers = _stage_layers(c, req)
    dt = memory.PRECISIONS[req.precision].activation_bytes
    intra, inter = network.LINKS[req.intra], network.LINKS[req.inter]
    dp_link = network.group_link(c.dp * req.tp, req.gpus_per_node, intra, inter)
    worst_mem, worst_dp = 0.0, 0.0
    for rank in range(c.p):
        stages = _owned(c, rank)
        state, w, g = _rank_state(c, req, stages, layers)
        if c.shard:  # all-gather of the weights, reduce-scatter of the gradients (ppbook.traffic)
            sync = traffic.fsdp_bytes_per_rank(w, g, c.dp) / dp_link.bandwidth + 3 * (c.dp - 1) * dp_link.latency
        else:
            sync = dp_link.allreduce(g, c.dp)
        act = _extrapolate([(m, h[0].get(rank, 0)) for m, h in zip(ms, held)], c.m)
        if c.recompute:
            act += memory.recompute_transient_bytes(cfg, c.b, req.seq_len, dt) / req.tp
        count = _extrapolate([(m, h[1]) for m, h in zip(ms, held)], c.m)
        logits = count * memory.logits_bytes(cfg, c.b, req.seq_len, dt, 4) / req.tp if n - 1 in stages else 0.0
        worst_mem = max(worst_mem, state + act + logits)
        worst_dp = max(worst_dp, sync)
    if usable_gb is not None and worst_mem / 1e9 > usable_gb:
        return Outcome(c, step_s=float("inf"), memory_gb=worst_mem / 1e9,
                       why_not=f"does not fit: needs {worst_mem / 1e9:.0f} GB at its peak of the {usable_gb:.0f} GB usable")
    costs = stage_costs(c, req)
    span = _extrapolate([(m, _span_at(c, req, m, costs)) for m in ms], c.m)
    work = sum(costs[(a.stage, a.kind)] for acts in _order(c, ms[-1]).values() for a in acts) / ms[-1] * c.m
    bubble = max(0.0, 1 - work / (c.p * span))
    return Outcome(c, step_s=span + worst_dp, pipeline_s=span, dp_s=worst_dp, bubble=bubble, memory_gb=worst_mem / 1e9)


def lower_bound(c: Candidate, req: Request) -> float:
    """A step time no simulation can beat: the busiest rank's compute alone."""
    costs = stage_costs(c, req)
    per_rank = [0.0] * c.p
    split = c.schedule in SPLIT_BACKWARD
    for r in range(c.p):
        owned = _owned(c, r)
        per_rank[r] = sum(costs[(s, "F")] + (costs[(s, "I")] + costs[(s, "W")] if split else costs[(s, "B")]) for s in owned)
    return c.m * max(per_rank)


def plan(req: Request, keep_all: bool = False, slack: float = 0.05) -> tuple[list[Outcome], list[Outcome]]:
    """(ranked, dropped): feasible candidates fastest first, and the others with why they were
    dropped. Unless ``keep_all``, candidates whose lower bound is more than ``slack`` above the
    best step time found are not simulated (they cannot come within ``slack`` of the winner) and
    are left out of both lists."""
    validate(req)
    dropped, fits = [], []
    usable = req.gpu_memory_gb * (1 - req.headroom)
    cfg = memory.LLAMA_SIZES[MODELS[req.model]]
    pr = memory.PRECISIONS[req.precision]
    for c in candidates(req):
        problem = constraint_problem(c, req)
        if problem:
            dropped.append(Outcome(c, why_not=problem))
            continue
        # memory before any simulation: the training state, plus on rank 0 min(m, p) microbatches
        # of its smallest stage (every one of torch's seven schedules fills the pipeline before
        # rank 0 sees a backward: tests/test_plan.py checks it), one microbatch elsewhere
        layers = _stage_layers(c, req)
        n = len(layers)
        floor = 0.0
        for r in range(c.p):
            owned = _owned(c, r)
            state = _rank_state(c, req, owned, layers)[0]
            acts = [memory.stage_activation_bytes(cfg, c.b, req.seq_len, layers[s], s == 0, s == n - 1,
                                                  pr.activation_bytes, c.recompute) / req.tp for s in owned]
            held = min(c.m, c.p) * min(acts) if r == 0 else max(acts)
            floor = max(floor, state + held)
        if floor / 1e9 > usable:
            dropped.append(Outcome(c, memory_gb=floor / 1e9, why_not=(
                f"does not fit: training state plus the fewest activations it can hold need {floor / 1e9:.0f} GB "
                f"of the {usable:.0f} GB usable")))
            continue
        fits.append(c)
    fits.sort(key=lambda c: lower_bound(c, req))
    ranked: list[Outcome] = []
    best = float("inf")
    for c in fits:
        if not keep_all and lower_bound(c, req) > best * (1 + slack):
            break
        out = predict(c, req, usable)
        if out.why_not:
            dropped.append(out)
            continue
        ranked.append(out)
        best = min(best, out.step_s)
    ranked.sort(key=lambda o: o.step_s)
    return ranked, dropped


def why_winner(ranked: list[Outcome]) -> str:
    """One sentence on why the first candidate beats the runner-up and the best of another schedule."""
    if not ranked:
        return "nothing fits: see --why for each candidate's reason"
    win = ranked[0]
    lead = "no pipeline (data parallelism alone)" if win.candidate.schedule == NO_PIPELINE else win.candidate.label()
    parts = [f"{lead}{': ' + win.candidate.label() if win.candidate.schedule == NO_PIPELINE else ''} is predicted fastest at {win.step_s:.2f} s per step "
             f"(bubble {100 * win.bubble:.1f}%, data-parallel traffic {win.dp_s:.2f} s, {win.memory_gb:.0f} GB on the fullest GPU)"]
    other = next((o for o in ranked[1:] if o.candidate.schedule != win.candidate.schedule), None)
    if len(ranked) > 1:
        r = ranked[1]
        parts.append(f"the runner-up {r.candidate.label()} takes {100 * (r.step_s / win.step_s - 1):.1f}% longer")
    if other is not None and other is not ranked[1]:
        parts.append(f"the best {other.candidate.schedule} ({other.candidate.label()}) {100 * (other.step_s / win.step_s - 1):.1f}% longer")
    return "; ".join(parts) + "."


def outcome_json(o: Outcome) -> dict:
    return {**asdict(o.candidate), "step_s": o.step_s, "pipeline_s": o.pipeline_s, "dp_s": o.dp_s,
            "bubble": o.bubble, "memory_gb": o.memory_gb, "why_not": o.why_not}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ppbook.plan", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help=f"one of {', '.join(MODELS)}")
    p.add_argument("--gpus", type=int, required=True)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--gpu-memory", type=float, default=80, help="GB per GPU, as sold (80 for an H100)")
    p.add_argument("--global-batch", type=int, required=True, help="sequences per optimizer step")
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size, taken as given (within a node)")
    p.add_argument("--precision", choices=list(memory.PRECISIONS), default="bf16")
    p.add_argument("--intra", default="nvlink-h100", help=f"link within a node: {', '.join(network.LINKS)}")
    p.add_argument("--inter", default="ib-ndr400", help="link between nodes")
    p.add_argument("--headroom", type=float, default=0.1, help="fraction of each GPU's memory kept free")
    p.add_argument("--max-microbatch-size", type=int, default=4)
    p.add_argument("--max-v", type=int, default=4, help="most stages per rank tried for the looped schedules")
    p.add_argument("--max-p", type=int, default=16, help="largest pipeline size tried (Llama 3 405B used 16)")
    p.add_argument("--schedules", nargs="+", default=list(stages.TORCH_SCHEDULES), help="schedules to consider (default: all seven)")
    p.add_argument("--top", type=int, default=10, help="rows of the table")
    p.add_argument("--why", action="store_true", help="print one line per dropped candidate saying why")
    p.add_argument("--json", help="write every candidate and its outcome to this path")
    return p.parse_args(argv)


def request_from(args: argparse.Namespace) -> Request:
    return Request(args.model, args.gpus, args.gpus_per_node, args.gpu_memory, args.global_batch, args.seq_len,
                   args.tp, args.precision, args.intra, args.inter, args.headroom, args.max_microbatch_size,
                   args.max_v, args.max_p, tuple(args.schedules))


def main(argv=None) -> int:
    args = parse_args(argv)
    req = request_from(args)
    try:
        validate(req)
        if args.top < 1:
            raise ValueError(f"--top must be at least 1, got {args.top}")
        if args.json and not Path(args.json).resolve().parent.is_dir():
            raise ValueError(f"--json {args.json}: its folder does not exist; create it or pick another path")
    except ValueError as e:
        print(f"ppbook.plan: error: {e}", file=sys.stderr)
        return 2
    ranked, dropped = plan(req)
    print(f"{'':>3} {'schedule':>21} {'p':>3} {'v':>2} {'dp':>3} {'state':>9} {'b':>2} {'m':>4} {'recomp':>6} "
          f"{'step s':>7} {'bubble':>7} {'dp s':>6} {'GB/GPU':>7}")
    for i, o in enumerate(ranked[:args.top], 1):
        c = o.candidate
        print(f"{i:>3} {c.schedule:>21} {c.p:>3} {c.v:>2} {c.dp:>3} {'sharded' if c.shard else 'replica':>9} {c.b:>2} "
              f"{c.m:>4} {'yes' if c.recompute else 'no':>6} {o.step_s:>7.2f} {100 * o.bubble:>6.1f}% {o.dp_s:>6.2f} "
              f"{o.memory_gb:>7.1f}")
    print(f"{len(ranked)} candidates ranked, {len(dropped)} dropped (--why lists them); the rest cannot come "
          "within 5% of the winner (their busiest GPU's compute alone takes longer)")
    print(why_winner(ranked))
    if args.why:
        for o in dropped:
            print(f"dropped {o.candidate.label()}: {o.why_not}")
    if args.json:
        Path(args.json).write_text(json.dumps({"request": asdict(req), "ranked": [outcome_json(o) for o in ranked],
                                               "dropped": [outcome_json(o) for o in dropped],
                                               "winner_reason": why_winner(ranked)}, indent=1))
    return 0 if ranked else 1


if __name__ == "__main__":
    raise SystemExit(main())
