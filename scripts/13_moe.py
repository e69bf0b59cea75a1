"""Mixture of experts through a pipeline: expert parallelism with all-to-all, the load-balancing
loss across pipeline stages, and DualPipeV overlapping one microbatch's all-to-all with another's
backward. Every run's losses, gradients and updated weights are checked against one process.

CPU, two processes, expert parallelism alone (EP = 2, no pipeline):
    torchrun --standalone --nproc-per-node 2 scripts/13_moe.py --pp 1 --ep 2 --runs 1F1B --check
CPU, four processes: two pipelines of two stages, each stage's experts split over the two
pipelines (PP = 2 x EP = 2); 1F1B, DualPipeV without and with the overlap, and the two ways of
getting the balancing loss wrong:
    torchrun --standalone --nproc-per-node 4 scripts/13_moe.py --pp 2 --ep 2 --check
Dropped tokens: a lower capacity factor drops more (<= 0: none dropped):
    torchrun --standalone --nproc-per-node 2 scripts/13_moe.py --pp 1 --ep 2 --capacity-factor 1.0
GPUs (NCCL), a larger model:
    torchrun --standalone --nproc-per-node 4 scripts/13_moe.py --dim 512 --expert-dim 512 --seq-len 256 --device cuda

Layout: rank = pipeline * pp + stage position; a pipeline's ranks send activations to each other
(its "pp" group), and the ranks holding the same stages in the ep pipelines exchange tokens (their
"ep" group). Pipeline i takes, of every microbatch of the batch, the i-th of ep equal parts.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed import pipelining
from torch.distributed.pipelining.schedules import OVERLAP_F_B, _wait_batch_p2p
from tqdm import tqdm

from ppbook import cli, driver, measure, moe, nccl_rules, precision, timeline
from ppbook.dist import gather_to_rank0, pick_device, schedule_backend_problem
from ppbook.models import LlamaConfig
from ppbook.stages import schedule_problem, stage_indices, stage_module
from ppbook.workload import loss_fn, make_batch

# run name -> (schedule, aux-loss handling, overlap)
RUNS = {
    "1F1B": ("1F1B", "attached", False),
    "aux-ignored": ("1F1B", "ignored", False),
    "aux-over-m": ("1F1B", "over-m", False),
    "DualPipeV": ("DualPipeV", "attached", False),
    "DualPipeV-overlap": ("DualPipeV", "attached", True),
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    cli.add_common_args(p, microbatches=8, batch_size=32, seq_len=32, layers=4, dim=64)
    cli.add_timing_args(p, steps=8)  # the overlap's prediction is checked on their mean
    p.add_argument("--pp", type=int, default=None, help="pipeline stages' ranks (default: world size / --ep)")
    p.add_argument("--ep", type=int, default=2, help="expert-parallel ranks: each holds experts / ep experts")
    p.add_argument("--runs", nargs="+", choices=list(RUNS) + ["all"], default=["all"],
                   help="what to run, one after another in this launch (aux-*: the balancing loss "
                        "ignored, or scaled by 1/m as Megatron-LM does)")
    p.add_argument("--experts", type=int, default=4)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--expert-dim", type=int, default=64, help="hidden width of each SwiGLU expert")
    p.add_argument("--capacity-factor", type=float, default=1.25, help="<= 0: no token is ever dropped")
    p.add_argument("--aux-coef", type=float, default=0.01, help="weight of the load-balancing loss")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate of the update after every step")
    p.add_argument("--overlap-before-fix", action="store_true", help=argparse.SUPPRESS)  # TURNS_BEFORE_FIX
    p.add_argument("--probe-gloo", action="store_true",
                   help="first check what all_to_all_single does on this backend (see probe_all_to_all)")
    args = p.parse_args(argv)
    if "all" in args.runs:
        args.runs = list(RUNS)
    return args


def validate(args: argparse.Namespace, world_size: int) -> None:
    if args.ep < 1 or world_size % args.ep:
        raise ValueError(f"--ep {args.ep} must divide the {world_size} processes; "
                         f"run ep x pp processes (e.g. --nproc-per-node {2 * max(1, args.ep)} for --pp 2)")
    args.pp = args.pp or world_size // args.ep
    if args.pp * args.ep != world_size:
        raise ValueError(f"--pp {args.pp} x --ep {args.ep} = {args.pp * args.ep} processes, "
                         f"but {world_size} were started; start pp x ep processes")
    cli.validate_common(args, args.pp, split_over=("--ep", args.ep))  # a microbatch is split over the ep pipelines
    if args.experts % args.ep:
        raise ValueError(f"--experts {args.experts} cannot be split evenly over --ep {args.ep} ranks; "
                         f"use a multiple of {args.ep}")
    if not 1 <= args.top_k <= args.experts:
        raise ValueError(f"--top-k {args.top_k} must be between 1 and --experts {args.experts}")
    if args.expert_dim < 1 or args.lr < 0:
        raise ValueError(f"--expert-dim must be at least 1 and --lr at least 0, got {args.expert_dim} "
                         f"and {args.lr}")
    for name in {RUNS[r][0] for r in args.runs}:
        problem = (schedule_problem(name, args.pp, args.microbatches, layers=args.layers)
                   or schedule_backend_problem(name, pick_device(0, args.device), args.pp))  # the run's backend
        if problem:
            raise ValueError(problem)


def moe_config(args) -> moe.MoEConfig:
    return moe.MoEConfig(vocab_size=args.vocab, dim=args.dim, n_layers=args.layers, n_heads=args.heads,
                         n_kv_heads=max(1, args.heads // 2), ffn_hidden_dim=LlamaConfig.ffn_hidden_dim,
                         max_seq_len=args.seq_len, n_experts=args.experts, top_k=args.top_k,
                         expert_hidden_dim=args.expert_dim, capacity_factor=args.capacity_factor,
                         aux_loss_coef=args.aux_coef)


# [start-shard]
def my_part(batch: torch.Tensor, args, ep_rank: int) -> torch.Tensor:
    """Pipeline ep_rank's share of a batch (B, T): of every one of the m microbatches,
    the ep_rank-th of ep equal parts, so that its microbatch i is part of the
    one-process microbatch i."""
    m, e = args.microbatches, args.ep
    parts = batch.view(m, e, -1, batch.shape[-1])  # (m, e, B/(m e), T)
    return parts[:, ep_rank].reshape(-1, batch.shape[-1]).contiguous()  # (B/e, T)
# [end-shard]


def reference(full, args, n_steps: int) -> tuple:
    """One process, all experts, the whole batch in the same m microbatches, each microbatch's
    loss = cross-entropy + coef x the layers' balancing losses, backpropagated, summed, / m,
    then SGD: what every run must equal. Returns the last step's gradients and the updated
    weights, by parameter name, its mean losses, and its assignments routed and kept per
    layer and expert (moe.counts)."""
    model = copy.deepcopy(full)
    device = next(model.parameters()).device
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    for step in range(n_steps):
        moe.reset_counts(model)
        opt.zero_grad(set_to_none=True)
        ce, aux = [], []
        for x, y in zip(*(t.tensor_split(args.microbatches) for t in make_batch(args, step, device))):
            main = loss_fn(model(x), y)
            balance = moe.aux_loss(model)
            (main + args.aux_coef * balance).backward()
            ce.append(main.item())
            aux.append(balance.item())
        for p in model.parameters():
            p.grad.div_(args.microbatches)
        opt.step()
    state = {n: (p.detach().cpu(), p.grad.cpu()) for n, p in model.named_parameters()}
    return state, sum(ce) / len(ce), sum(aux) / len(aux), moe.counts(model)


def shared_reference(full, args, info) -> tuple:
    """:func:`reference`, computed on rank 0 and sent to every rank (the ranks share two
    cores here: computing it on each would cost them all the time of one)."""
    box = [reference(full, args, args.warmup + args.steps) if info.rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


# [start-groups]
def groups(args, rank: int) -> tuple:
    """This rank's pipeline group and its two expert-parallel groups (every rank must
    create every group, in the same order)."""
    pp, ep = args.pp, args.ep
    pipes = [dist.new_group([i * pp + s for s in range(pp)]) for i in range(ep)]
    # the ranks holding the same stages in the ep pipelines; one group for the
    # forward's all-to-alls and one for the backward's (they may run at once)
    columns = [[dist.new_group([i * pp + s for i in range(ep)]) for _ in range(2)]
               for s in range(pp)]
    pipe, position = divmod(rank, pp)
    fwd, bwd = columns[position]
    return pipes[pipe], moe.ExpertParallel(pipe, ep, fwd, bwd, trace=[])
# [end-groups]


# [start-overlap]
def overlap_f_b(action, ctx) -> None:
    """OVERLAP_F_B: one microbatch's forward in this thread, another's backward in a
    second thread, so that while either waits in an all-to-all the other computes."""
    sched = ctx.schedule_ref
    fwd, bwd = action.sub_actions
    stages = {s.stage_index: s for s in sched._stages}
    f_stage, b_stage = stages[fwd.stage_index], stages[bwd.stage_index]
    # comm: wait for both inputs from the neighbouring ranks (none from this rank)
    if not f_stage.is_first and fwd.stage_index - 1 not in stages:
        _wait_batch_p2p(sched.fwd_recv_ops.pop((fwd.stage_index, fwd.microbatch_index)))
    if not b_stage.is_last and bwd.stage_index + 1 not in stages:
        _wait_batch_p2p(sched.bwd_recv_ops.pop((bwd.stage_index, bwd.microbatch_index)))
    # the two threads' all-to-alls take turns, in one order on every rank
    f_layers, b_layers = (moe.moe_layers(s.submod) for s in (f_stage, b_stage))
    ep = next((layer.ep for layer in f_layers.values() if layer.ep), None)
    if ep is not None and not TURNS_BEFORE_FIX:  # two per layer each way
        ep.turns = moe.Turns(fwd=2 * len(f_layers), bwd=2 * len(b_layers))
    failed = []

    def backward():
        try:
            run_backward(sched, stages, b_stage, bwd.microbatch_index)
        except BaseException as err:  # re-raised in the schedule's thread
            failed.append(err)
            if ep is not None and ep.turns:  # the forward must not wait
                ep.turns.abort()  # for a turn that never comes

    thread = threading.Thread(target=backward, name="backward")
    thread.start()  # compute: one microbatch's backward there, another's forward here
    try:
        run_forward(sched, stages, f_stage, fwd.microbatch_index, ctx)
    except BaseException:
        if ep is not None and ep.turns:
            ep.turns.abort()
        raise
    finally:
        thread.join()
        if ep is not None:
            ep.turns = None
    if failed:
        raise failed[0]
# [end-overlap]


TURNS_BEFORE_FIX = False  # the hidden --overlap-before-fix: no turns (tests, appendix A3)


PAIRS: dict[int, int] = {}  # per schedule (its id): the OVERLAP_F_B pairs run by overlap_f_b


def counted_overlap_f_b(action, ctx) -> None:
    """overlap_f_b, counted: the report says how many pairs each rank ran on two threads."""
    overlap_f_b(action, ctx)
    PAIRS[id(ctx.schedule_ref)] = PAIRS.get(id(ctx.schedule_ref), 0) + 1


# [start-halves]
def run_forward(sched, stages, stage, mb, ctx) -> None:
    """What torch's runtime does for a forward action (schedules.py, private)."""
    out = stage.forward_one_chunk(mb, ctx.arg_mbs[mb], ctx.kwarg_mbs[mb])
    sched._maybe_compute_loss(stage, out, ctx.target_mbs, mb)
    if stage.stage_index + 1 in stages:  # the V's tip: the next stage is here
        stages[stage.stage_index + 1].set_local_fwd_input(out, mb)


def run_backward(sched, stages, stage, mb) -> None:
    """What torch's runtime does for a full-backward action (schedules.py, private)."""
    sched.backward_counter[stage.stage_index] += 1
    last = sched.backward_counter[stage.stage_index] == sched._n_microbatches
    stage.backward_one_chunk(mb, loss=sched._maybe_get_loss(stage, mb),
                             full_backward=True, last_backward=last)
    if stage.stage_index - 1 in stages:  # the V's tip: the previous stage is here
        grad = stage.get_local_bwd_output(mb)
        stages[stage.stage_index - 1].set_local_bwd_input(grad, mb)
# [end-halves]


def build(run: str, full, args, info, pp_group, ep, rec) -> tuple:
    """This rank's stages (only its own experts), their schedule, and the modules."""
    name, aux, overlap = RUNS[run]
    position = info.rank % args.pp
    indices = stage_indices(name, position, args.pp)  # V: [r, 2p-1-r]
    num_stages = args.pp * len(indices)
    mods, stages = [], []
    for i in indices:
        mod = moe.keep_experts(stage_module(copy.deepcopy(full), i, num_stages), ep)
        moe.set_aux_weight(mod, {"attached": args.aux_coef, "ignored": None,
                                 "over-m": args.aux_coef / args.microbatches}[aux])
        stage = pipelining.PipelineStage(mod, i, num_stages, info.device, group=pp_group,
                                         **example_args(args, i, num_stages, info.device))
        rec.attach(stage)
        mods.append(mod)
        stages.append(stage)
    cls = getattr(pipelining, f"Schedule{name}")
    single = issubclass(cls, pipelining.schedules.PipelineScheduleSingle)
    schedule = cls(stages[0] if single else stages, n_microbatches=args.microbatches, loss_fn=loss_fn)
    if overlap:
        schedule.register_custom_function(OVERLAP_F_B, counted_overlap_f_b)
    return schedule, mods, indices, num_stages


def example_args(args, stage_index: int, num_stages: int, device) -> dict:
    """Static shapes of the stage's input and output: without them torch 2.13 infers them
    in the first step by running each stage's forward, on empty (uninitialised) tensors
    beyond the first stage, through the router, its tallies and the all-to-alls."""
    rows = args.batch_size // (args.microbatches * args.ep)  # one microbatch of one pipeline
    like = {"device": device, "dtype": precision.param_dtype(args.dtype), "requires_grad": True}
    hidden = torch.zeros(rows, args.seq_len, args.dim, **like)
    logits = torch.zeros(rows, args.seq_len, args.vocab, **like)
    tokens = torch.zeros(rows, args.seq_len, dtype=torch.long, device=device)
    return {"input_args": (tokens if stage_index == 0 else hidden,),
            "output_args": (logits if stage_index == num_stages - 1 else hidden,)}


# [start-sync]
def sync_grads(mods, ep) -> None:
    """After the step: every gradient was summed over this rank's tokens' loss only.
    The rest of the model is replicated over the ep pipelines: average it (sum, / ep).
    An expert got the gradients of every pipeline's tokens through the all-to-all:
    divide by ep, so that both are gradients of the mean over the whole batch."""
    if ep.size == 1:
        return
    for mod in mods:
        for name, p in mod.named_parameters():
            if not moe.is_expert_param(name):
                dist.all_reduce(p.grad, group=ep.fwd_group)  # comm: replicas' sum
            p.grad.div_(ep.size)
# [end-sync]


def compare(mods, ref: dict) -> dict:
    """Largest differences from the reference (name: (weight, gradient)), gradients split
    into the router's and the rest."""
    diff = {"router": 0.0, "other": 0.0, "weight": 0.0, "router_grad": 0.0}
    for mod in mods:
        for name, p in mod.named_parameters():
            key = "router" if ".router." in name else "other"
            weight, grad = (t.to(p.device) for t in ref[name])
            diff[key] = max(diff[key], (p.grad - grad).abs().max().item())
            if key == "router":  # the size of what is compared
                diff["router_grad"] = max(diff["router_grad"], grad.abs().max().item())
            diff["weight"] = max(diff["weight"], (p.detach() - weight).abs().max().item())
    return diff


# [start-probe]
def probe_all_to_all(info, numel: int) -> dict:
    """What all_to_all_single does on this backend, on this launch's ranks; and the
    least time one takes, back to back, for ``numel`` float32 values (a layer's)."""
    w, r = info.world_size, info.rank
    facts = {}
    x = torch.arange(2.0 * w) + 100 * r  # chunk k (two values) goes to rank k
    y = torch.empty_like(x)
    dist.all_to_all_single(y, x)
    expected = [100.0 * k + 2 * r + i for k in range(w) for i in range(2)]
    facts["equal splits"] = y.tolist() == expected
    send = [r + k + 1 for k in range(w)]  # rank r sends r + k + 1 values to rank k
    receive = [k + r + 1 for k in range(w)]
    x, y = torch.full((sum(send),), float(r)), torch.empty(sum(receive))
    work = dist.all_to_all_single(y, x, receive, send, async_op=True)  # returns at once
    work.wait()
    facts["uneven splits, asynchronous"] = y.tolist() == [float(k) for k in range(w)
                                                          for _ in range(k + r + 1)]
    # what gloo itself forgives: PPBOOK_NCCL_RULES=1 would refuse both (appendix A3)
    with nccl_rules.suspended():
        try:
            bent = torch.zeros(3, 2 * w).t()  # (2w, 3), not contiguous
            dist.all_to_all_single(torch.empty(2 * w, 3), bent)
            facts["non-contiguous input"] = "accepted"
        except (ValueError, RuntimeError) as err:
            facts["non-contiguous input"] = f"{type(err).__name__}: {err}"
        # two groups over the same ranks, one all-to-all on each from
        # two threads at once
        pair, got = [dist.new_group(list(range(w))) for _ in range(2)], {}

        def exchange(k):
            out, mine = torch.empty(2 * w), torch.full((2 * w,), 10.0 * k + r)
            dist.all_to_all_single(out, mine, group=pair[k])
            want = [10.0 * k + j for j in range(w) for _ in range(2)]
            got[k] = out.tolist() == want

        threads = [threading.Thread(target=exchange, args=(k,))
                   for k in (r % 2, 1 - r % 2)]
        [t.start() for t in threads]
        [t.join() for t in threads]
    facts["two groups, two threads at once"] = got == {0: True, 1: True}
    x = torch.zeros(numel)
    y = torch.empty_like(x)
    seconds = []
    for _ in range(100):
        start = time.perf_counter()
        dist.all_to_all_single(y, x)
        seconds.append(time.perf_counter() - start)
    # the fastest: what moving the bytes takes when both ranks have a core at once
    # (the median moves with the machine's load; the least of a hundred hardly does)
    facts["seconds back to back"] = min(seconds)
    return facts
# [end-probe]


def cores() -> int:
    """The cores this process may run on (its affinity where the system has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def cpu_ticks() -> tuple[int, int] | None:
    """(idle, total) clock ticks of the cores this process may run on, since boot, from Linux's
    /proc/stat (None elsewhere): over a step, the share of those cores that nobody used, this
    job and every other process on the machine included."""
    mine = {f"cpu{c}" for c in os.sched_getaffinity(0)} if hasattr(os, "sched_getaffinity") else None
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    idle = total = 0
    for line in lines:
        name, *ticks = line.split()
        if name.startswith("cpu") and name != "cpu" and (mine is None or name in mine):
            ticks = [int(t) for t in ticks]
            idle += ticks[3] + ticks[4]  # idle and iowait
            total += sum(ticks[:8])  # user nice system idle iowait irq softirq steal
    return (idle, total) if total else None


class Run:
    """One run of the launch (a schedule, a way of handling the balancing loss, the overlap
    or not): this rank's stages and optimizer, trained one step at a time."""

    def __init__(self, run, full, args, info, pp_group, ep):
        self.name, self.args, self.info, self.ep = run, args, info, ep
        self.rec = timeline.Recorder(info.rank)
        self.schedule, self.mods, self.indices, num_stages = build(run, full, args, info, pp_group, ep, self.rec)
        self.holds = {"holds_first": 0 in self.indices, "holds_last": num_stages - 1 in self.indices}
        self.opt = torch.optim.SGD([p for mod in self.mods for p in mod.parameters()], lr=args.lr)
        self.ce_losses, self.records = [], []

    def step(self, step: int, ref) -> None:
        args, ep = self.args, self.ep
        tokens, targets = (my_part(t, args, ep.rank).to(self.info.device) for t in make_batch(args, step))
        for mod in self.mods:
            moe.reset_counts(mod)
        self.opt.zero_grad(set_to_none=True)
        dist.barrier()
        self.rec.start_step()
        ep.trace.clear()
        t0, cpu0, ticks0 = time.perf_counter(), time.process_time(), cpu_ticks()
        mb_losses = driver.schedule_step(self.schedule, self.info, tokens, targets, **self.holds)
        seconds, cpu, ticks = time.perf_counter() - t0, time.process_time() - cpu0, cpu_ticks()  # cpu: all threads
        idle = (None if ticks is None or ticks0 is None or ticks[1] <= ticks0[1]
                else (ticks[0] - ticks0[0]) / (ticks[1] - ticks0[1]))  # the machine's, the same on every rank
        sync_grads(self.mods, ep)
        last = step == args.warmup + args.steps - 1
        if last:
            self.diff = compare(self.mods, ref)  # the last step's gradients
        self.opt.step()
        if last:
            self.diff["weight"] = compare(self.mods, ref)["weight"]  # and updated weights
        self.ce_losses.append(sum(loss.item() for loss in mb_losses) / len(mb_losses) if mb_losses else None)
        rows = gather_to_rank0((timeline.to_json(self.rec.events), list(ep.trace), seconds, cpu, idle))
        if step >= args.warmup and rows is not None:
            self.records.append(step_record(rows))


def step_record(rows) -> dict:
    """One measured step on rank 0: every rank's actions and all-to-alls, in seconds from
    the step's first action, its time (the slowest rank's) and each rank's processor time."""
    t0 = min(e["start"] for events, *_ in rows for e in events)
    events = [timeline.Event(**{**e, "start": e["start"] - t0, "end": e["end"] - t0})
              for events, *_ in rows for e in events]
    comm = [{"rank": r, "kind": kind, "start": s - t0, "end": e - t0, "bytes": nbytes}
            for r, (_, trace, *_) in enumerate(rows) for kind, s, e, nbytes in trace]
    return {"seconds": max(row[2] for row in rows), "comm": comm,
            "cpu_seconds": [row[3] for row in rows],  # each rank's processor time, all threads
            "cores": cores(),  # that the processes may run on: their share of them is what an overlap can use
            "idle_share": rows[0][4],  # of those cores over rank 0's step: left unused by every process
            "events": timeline.to_json(sorted(events, key=lambda e: e.start))}


def report(r: Run) -> dict | None:
    run, mods, indices, ce_losses, diff, records, args, info, ep = (
        r.name, r.mods, r.indices, r.ce_losses, r.diff, r.records, r.args, r.info, r.ep)
    aux_sum = sum(layer.aux_sum for mod in mods for layer in moe.moe_layers(mod).values())
    mine = {"rank": info.rank, "pipeline": ep.rank, "stages": indices, "ce": ce_losses[-1],
            "aux": float(aux_sum) / args.microbatches, "diff": diff,
            "counts": {k: v for mod in mods for k, v in moe.counts(mod).items()},
            "pairs": PAIRS.get(id(r.schedule), 0)}
    rows = gather_to_rank0(mine)
    if rows is None:
        return None
    per_pipe = [[r for r in rows if r["pipeline"] == i] for i in range(args.ep)]
    ce = sum(r["ce"] for r in rows if r["ce"] is not None) / args.ep  # mean over the pipelines
    aux = sum(r["aux"] for r in rows) / args.ep  # each pipeline's layers, summed; mean over pipelines
    counts = {}
    for r in rows:  # summed over the pipelines: every token of the step's batch
        for layer, c in r["counts"].items():
            into = counts.setdefault(layer, {"routed": [0] * args.experts, "kept": [0] * args.experts})
            for key in ("routed", "kept"):
                into[key] = [a + b for a, b in zip(into[key], c[key])]
    worst = {k: max(r["diff"][k] for r in rows) for k in ("router", "other", "weight", "router_grad")}
    return {"run": run, "schedule": RUNS[run][0], "aux": RUNS[run][1], "overlap": RUNS[run][2],
            "placement": {r["rank"]: r["stages"] for r in rows}, "pipelines": len(per_pipe),
            "ce": ce, "aux_loss": aux, "max_diff": worst, "counts": dict(sorted(counts.items(), key=lambda kv: int(kv[0]))),
            "records": records, "pairs_on_two_threads": {r["rank"]: r["pairs"] for r in rows},
            **measure.summarise_steps(records)}


def dropped(counts: dict) -> list[int]:
    """Assignments dropped per layer (routed beyond an expert's capacity), from moe.counts."""
    return [sum(c["routed"]) - sum(c["kept"]) for c in counts.values()]


def body(args: argparse.Namespace, info) -> int:
    global TURNS_BEFORE_FIX
    TURNS_BEFORE_FIX = args.overlap_before_fix
    torch.set_num_threads(1)  # one process per core; the overlap's second thread shares it
    full = moe.build_moe_model(moe_config(args), seed=args.seed,
                               dtype=precision.param_dtype(args.dtype)).to(info.device)
    cfg = moe_config(args)
    rows = args.batch_size // (args.microbatches * args.ep)  # sequences per microbatch
    numel = rows * cfg.n_experts * moe.capacity(args.seq_len, cfg.top_k, cfg.n_experts,
                                                 cfg.capacity_factor) * args.dim
    probe = probe_all_to_all(info, numel) if args.probe_gloo else None
    ref, ref_ce, ref_aux, ref_counts = shared_reference(full, args, info)
    pp_group, ep = groups(args, info.rank)
    runs = [Run(run, full, args, info, pp_group, ep) for run in args.runs]
    # the runs take turns, one step each: a change in the machine's load hits them all alike
    for step in tqdm(range(args.warmup + args.steps), desc="steps", disable=info.rank != 0):
        for run in runs:
            run.step(step, ref)
    runs = [report(run) for run in runs]
    if info.rank != 0:
        return 0
    tol = precision.tolerance(args.dtype)
    for r in runs:
        diffs = [v for k, v in r["max_diff"].items() if k != "router_grad"]
        r["same_drops"] = r["counts"] == ref_counts  # every layer's routed and kept, per expert
        r["match"] = (max(diffs) <= tol and abs(r["ce"] - ref_ce) <= tol
                      and abs(r["aux_loss"] - ref_aux) <= tol and r["same_drops"])
        print(f"{r['run']:>18}  step {r['median_step_seconds'] * 1e3:7.1f} ms  loss {r['ce']:.5f} "
              f"+ {args.aux_coef} x {r['aux_loss']:.4f}  router grad diff {r['max_diff']['router']:.1e}  "
              f"dropped {dropped(r['counts'])} (one process {dropped(ref_counts)})  "
              f"{'MATCH' if r['match'] else 'MISMATCH'}")
    expected = {r["run"]: r["aux"] == "attached" for r in runs}  # the pitfalls must not match
    ok = all(r["match"] == expected[r["run"]] for r in runs)
    print("as expected: the attached balancing loss equals one process, the pitfalls do not" if ok
          else "UNEXPECTED: a run that should match one process did not, or a pitfall did")
    cli.write_json(args.json, {"world_size": info.world_size, "pp": args.pp, "ep": args.ep,
                               "microbatches": args.microbatches, "batch_size": args.batch_size,
                               "seq_len": args.seq_len, "dim": args.dim, "layers": args.layers,
                               "experts": args.experts, "top_k": args.top_k, "expert_dim": args.expert_dim,
                               "capacity_factor": args.capacity_factor, "aux_coef": args.aux_coef,
                               "capacity": moe.capacity(args.seq_len, args.top_k, args.experts,
                                                        args.capacity_factor),
                               "reference": {"ce": ref_ce, "aux_loss": ref_aux, "counts": ref_counts},
                               "runs": runs, "ok": ok,
                               "probe": probe, "backend": info.backend,
                               "dtype": args.dtype, "torch_version": torch.__version__})
    return 1 if (args.check and not ok) else 0


def main(argv=None) -> int:
    return cli.run("13_moe.py", parse_args(argv), validate, body)


if __name__ == "__main__":
    sys.exit(main())
