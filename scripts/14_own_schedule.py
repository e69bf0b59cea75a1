"""Writing your own pipeline schedule: 1F1B and interleaved 1F1B by hand, with point-to-point
sends and receives, and two schedules torch does not ship (ZB-H2, V-Half) handed to torch's
runtime as a list of actions per rank. Every one is run next to torch's own schedules, with a
recorded timeline, and its gradients are checked against one process.

CPU, two processes, all eight in one launch (gloo):
    torchrun --standalone --nproc-per-node 2 scripts/14_own_schedule.py --check
CPU, four processes:
    torchrun --standalone --nproc-per-node 4 scripts/14_own_schedule.py --layers 8 --check
Run your own order: a CSV with one line of actions per rank, as torch's runtime reads it.
ppbook.custom_schedules.to_csv writes one from any order; V-Half's on 2 ranks, 8 microbatches:
    from ppbook.custom_schedules import to_csv, v_half_order
    open("my_order.csv", "w").write(to_csv(v_half_order(2, 8)))
then:
    torchrun --standalone --nproc-per-node 2 scripts/14_own_schedule.py --csv my_order.csv --check
The deadlock of blocking sends that are not paired with a receive (an error after --timeout s):
    torchrun --standalone --nproc-per-node 2 scripts/14_own_schedule.py --mistake unpaired --timeout 5
An order torch's runtime accepts that runs one backward twice:
    torchrun --standalone --nproc-per-node 2 scripts/14_own_schedule.py --mistake repeated-backward
GPUs (NCCL), a larger model:
    torchrun --standalone --nproc-per-node 4 scripts/14_own_schedule.py --dim 1024 --layers 16 --batch-size 64 --device cuda

Placement: stage r on rank r for 1F1B and ZB-H2; stages r, r + p, ... for interleaved 1F1B
(--stages-per-rank of them); stages r and 2p - 1 - r for V-Half, ZBVZeroBubble and DualPipeV.
A CSV's placement is read from it: each rank holds the stages its line names.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed import pipelining
from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime
from tqdm import tqdm

from ppbook import activations, cli, custom_schedules, driver, measure, precision, timeline, workload
from ppbook.dist import gather_to_rank0, pick_device, schedule_backend_problem
from ppbook.planner.schedules import Action, Order
from ppbook.stages import schedule_problem, stage_indices, stage_module

# The eight schedules, in the chapter's order: each hand-written one next to the torch schedule
# it must equal, then the two custom orders next to torch's two V-shaped schedules.
SCHEDULES = ("1F1B-hand", "1F1B", "Interleaved1F1B-hand", "Interleaved1F1B",
             "ZB-H2", "V-Half", "ZBVZeroBubble", "DualPipeV")
HAND = {"1F1B-hand": "1F1B", "Interleaved1F1B-hand": "Interleaved1F1B"}  # and the torch schedule it equals
CUSTOM = custom_schedules.GENERATORS  # ZB-H2 and V-Half: orders for torch's runtime
PLACED_AS = {**HAND, "ZB-H2": "GPipe", "V-Half": "ZBVZeroBubble"}  # stage r on rank r; a V
MISTAKES = ("none", "unpaired", "repeated-backward")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    cli.add_common_args(p, microbatches=8, batch_size=16, seq_len=32, layers=4, dim=64)
    cli.add_timing_args(p, steps=3)
    p.add_argument("--schedules", nargs="+", choices=list(SCHEDULES) + ["all"], default=["all"],
                   help="which schedules to run, one after another in this launch")
    p.add_argument("--stages-per-rank", type=int, default=2, help="v, for interleaved 1F1B")
    p.add_argument("--csv", default=None,
                   help="also run this order (one line of actions per rank, e.g. 0F0,0F1,...) on torch's runtime")
    p.add_argument("--mistake", choices=MISTAKES, default="none",
                   help="unpaired: the hand-written 1F1B with blocking sends (it deadlocks); repeated-backward: "
                        "V-Half with one backward run twice (torch's runtime accepts it, the step fails)")
    p.add_argument("--exchange-before-fix", action="store_true", help=argparse.SUPPRESS)  # exchange_before_fix
    args = p.parse_args(argv)
    if "all" in args.schedules:
        args.schedules = list(SCHEDULES)
    if args.mistake != "none":  # one run, of the schedule the mistake is made in
        args.schedules = ["1F1B-hand" if args.mistake == "unpaired" else "V-Half"]
    return args


def read_csv(path: str) -> Order:
    """The order in a --csv file; a ValueError naming the file and the bad cell."""
    try:
        return custom_schedules.from_csv(Path(path).read_text())
    except ValueError as err:
        raise ValueError(f"--csv {path}: {err}") from None


def validate(args: argparse.Namespace, world_size: int) -> None:
    cli.validate_common(args, world_size)
    m, v = args.microbatches, args.stages_per_rank
    for name in args.schedules:  # torch's own errors come mid-way, or never (a wrong placement)
        problem = (schedule_problem(PLACED_AS.get(name, name), world_size, m, v, args.layers)
                   or schedule_backend_problem(PLACED_AS.get(name, name), pick_device(0, args.device), world_size))
        if problem:
            raise ValueError(problem.replace(PLACED_AS.get(name, name), name, 1) if name in CUSTOM else problem)
    if args.mistake != "none" and (world_size < 2 or m < 2):
        raise ValueError(f"--mistake {args.mistake} needs 2 or more processes and --microbatches 2 or more "
                         f"(got {world_size} and {m}): it breaks what passes between ranks and microbatches")
    if world_size < 2 and "Interleaved1F1B-hand" in args.schedules:
        raise ValueError("Interleaved1F1B-hand sends between ranks and needs at least 2 processes; "
                         "run it under torchrun --nproc-per-node 2 or more")
    if args.csv:
        if not Path(args.csv).is_file():
            raise ValueError(f"--csv {args.csv}: no such file")
        order = read_csv(args.csv)
        problem = custom_schedules.order_problem(order, world_size, m, args.layers)
        if problem:
            raise ValueError(f"--csv {args.csv}: {problem}")


# --- by hand --------------------------------------------------------------------------------------

def plan_1f1b(rank: int, p: int, m: int) -> tuple[int, list, list]:
    """1F1B on rank ``rank`` of ``p``: p - rank - 1 forwards before
    the first backward, then one forward and one backward at a time,
    all on stage ``rank``, microbatches in order. Returns (warm-up
    forwards, [(stage, microbatch)] of the forwards, and of the
    backwards)."""
    forwards = [(rank, i) for i in range(m)]
    return min(p - rank - 1, m), forwards, forwards


def plan_interleaved(rank: int, p: int, m: int, v: int) -> tuple[int, list, list]:
    """Interleaved 1F1B on rank ``rank``, which holds stages rank, rank + p, ...
    (Narayanan et al. 2021; torch's flexible version): microbatches go through this
    rank's stages in rounds of m // (m // p); forwards take the stages in order,
    backwards in reverse; the warm-up is one round per extra stage plus two
    forwards per rank downstream."""
    per_round = m // max(1, m // p)  # microbatches per round
    warmup = min((v - 1) * per_round + 2 * (p - 1 - rank), v * m)
    forwards, backwards, seen_f, seen_b = [], [], {}, {}
    for k in range(v * m):
        stage = (k // per_round) % v * p + rank
        forwards.append((stage, seen_f.setdefault(stage, [0])[0]))
        seen_f[stage][0] += 1
        stage = (v - 1 - (k // per_round) % v) * p + rank
        backwards.append((stage, seen_b.setdefault(stage, [0])[0]))
        seen_b[stage][0] += 1
    return warmup, forwards, backwards


def lockstep(plans, num_stages: int) -> list[list]:
    """Every rank's plan (``plans[r]``, as :func:`plan_1f1b` returns) on
    one clock: at each tick a rank runs its next action if what it
    needs arrived at an earlier tick (else it waits: ``None``), and
    what an action sends travels in that tick. Returns per rank, per
    tick, ("F", k), ("B", k) or None. A message's sender and receiver
    post it in the same tick, so their batches pair one to one: on
    NCCL, where a rank's batches run one after the other and a large
    send ends only once its receive runs, none waits on a later one."""
    acts = []
    for warmup, forwards, backwards in plans:  # hand_step's order
        seq = [("F", k) for k in range(warmup)]
        for k in range(len(forwards) - warmup):
            seq += [("F", warmup + k), ("B", k)]
        rest = range(len(forwards) - warmup, len(backwards))
        acts.append(seq + [("B", k) for k in rest])
    arrived, pos, ticks = {}, [0] * len(plans), [[] for _ in plans]
    while any(pos[r] < len(acts[r]) for r in range(len(plans))):
        t, sent = len(ticks[0]), []
        for r, seq in enumerate(acts):
            if pos[r] == len(seq):
                ticks[r].append(None)
                continue
            kind, k = seq[pos[r]]
            s, i = plans[r][1 if kind == "F" else 2][k]
            needs = (("x", s, i) if kind == "F" and s > 0 else ("dy", s, i)
                     if kind == "B" and s < num_stages - 1 else None)
            if needs is not None and arrived.get(needs, t) >= t:
                ticks[r].append(None)  # its input is not here yet
                continue
            ticks[r].append((kind, k))
            pos[r] += 1
            if kind == "F" and s < num_stages - 1:
                sent.append(("x", s + 1, i))  # an activation for stage s + 1
            if kind == "B" and s > 0:
                sent.append(("dy", s - 1, i))  # a gradient for stage s - 1
        if all(tk[-1] is None for tk in ticks) and pos != [len(a) for a in acts]:
            raise ValueError("these plans wait on each other: no rank can "
                             "run its next action")
        arrived.update((key, t) for key in sent)
    return ticks


# [start-exchange]
def exchange(sends, recvs, sent, paired=True):
    """Post ``sends`` and ``recvs``, lists of (tensor, peer rank), and
    wait for the receives; the sends' handles go to ``sent``.

    Paired, they are posted together (``batch_isend_irecv``: one
    group on NCCL, with one work for all of it) and waited for when
    the batch receives: two ranks that send to each other at the same
    moment both go on; sends alone finish while this rank computes.
    Unpaired, each send, then each receive, blocks: on gloo a send
    waits until its peer receives, so two neighbours that both send
    first wait for each other forever (on NCCL a send returns once
    enqueued, and the GPU waits instead, or not, by message size)."""
    if not paired:
        for t, peer in sends:
            dist.send(t, peer)
        for t, peer in recvs:
            dist.recv(t, peer)
        return
    ops = [dist.P2POp(dist.isend, t, peer) for t, peer in sends]
    ops += [dist.P2POp(dist.irecv, t, peer) for t, peer in recvs]
    works = dist.batch_isend_irecv(ops) if ops else []
    if len(works) == len(ops):  # gloo: a work per operation
        sent += works[:len(sends)]  # the sends': waited at the end
        works = works[len(sends):]
    # NCCL returns ONE work for the whole batch: wait on every work
    # of a batch that receives, as torch's schedules do
    for work in works:
        work.wait()
# [end-exchange]


def exchange_before_fix(sends, recvs, sent, paired=True):
    """:func:`exchange` as it was: it waited on the works after the sends'
    ones, of which NCCL, which returns one work for the batch, has none, so
    the receives were read before they arrived. Run by the hidden flag
    --exchange-before-fix, for appendix A3 and the tests (PPBOOK_NCCL_RULES=1
    makes gloo return one work too)."""
    if not paired:
        return exchange(sends, recvs, sent, paired)
    ops = [dist.P2POp(dist.isend, t, peer) for t, peer in sends]
    ops += [dist.P2POp(dist.irecv, t, peer) for t, peer in recvs]
    works = dist.batch_isend_irecv(ops) if ops else []
    sent += works[:len(sends)]
    for work in works[len(sends):]:
        work.wait()


# [start-hand]
def hand_step(mods, plans, tokens, targets, info, rec, paired=True):
    """One step of 1F1B by hand (of interleaved 1F1B when a rank holds
    several stages): ``plans`` holds every rank's plan (warm-up count,
    the (stage, microbatch) of each forward and backward). The ranks
    run them on one clock (:func:`lockstep`): a message is posted by
    its sender and its receiver in the same tick's batch."""
    me, p = info.rank, info.world_size
    _, forwards, backwards = plans[me]
    m = len(forwards) // len(mods)
    num_stages = p * len(mods)  # stage s sits on rank s mod p
    mb_tokens, mb_targets = tokens.chunk(m), targets.chunk(m)  # m x (B/m, T)
    x, y, dy, losses = {}, {}, {}, {}  # by (stage, microbatch)
    sent = []  # handles of the sends in flight
    some = next(iter(mods.values()))
    dtype = next(some.parameters()).dtype
    ticks = lockstep(plans, num_stages)
    forwards_of, backwards_of = [pl[1] for pl in plans], [pl[2] for pl in plans]

    def forward(k):  # returns what to send on
        s, i = forwards[k]
        inp = mb_tokens[i] if s == 0 else x[s, i].requires_grad_()
        with rec.span(s, "F", i):
            y[s, i] = mods[s](inp)  # compute: forward
            if s == num_stages - 1:
                losses[i] = workload.loss_fn(y[s, i], mb_targets[i])
        return [] if s == num_stages - 1 else [(y[s, i].detach(), (s + 1) % p)]

    def backward(k):  # returns the input gradient to send back
        s, i = backwards[k]
        with rec.span(s, "B", i):
            # compute: backward (the last stage's from its loss)
            losses[i].backward() if s == num_stages - 1 else y[s, i].backward(dy[s, i])
        return [] if s == 0 else [(x[s, i].grad, (s - 1) % p)]

    def incoming(t):  # what the neighbours send this rank at tick t
        recvs = []
        for peer in sorted({(me - 1) % p, (me + 1) % p} - {me}):
            act = ticks[peer][t]
            if act is None:
                continue
            plan = forwards_of if act[0] == "F" else backwards_of
            s, i = plan[peer][act[1]]
            if act[0] == "F" and s + 1 < num_stages and (s + 1) % p == me:
                shape = (*mb_tokens[i].shape, some.cfg.dim)  # (B/m, T, C)
                x[s + 1, i] = torch.empty(shape, dtype=dtype, device=info.device)
                recvs.append((x[s + 1, i], peer))
            if act[0] == "B" and s > 0 and (s - 1) % p == me:
                dy[s - 1, i] = torch.empty_like(y[s - 1, i])
                recvs.append((dy[s - 1, i], peer))
        return recvs

    # === one clock for all ranks: one action, then the exchange of what it sent ===
    for t, act in enumerate(ticks[me]):
        sends = ([] if act is None else forward(act[1]) if act[0] == "F"
                 else backward(act[1]))
        recvs = incoming(t)
        if sends or recvs:
            # comm: this tick's messages, in one batch on both sides
            exchange(sends, recvs, sent, paired)
    for work in sent:
        work.wait()  # comm: every send delivered
    for mod in mods.values():
        workload.scale_grads(mod, m)  # the summed gradients / m
    return [losses[i] for i in sorted(losses)]
# [end-hand]


# --- on torch's runtime and torch's own schedules ---------------------------------------------------

def custom_order(name: str, args, p: int) -> Order:
    """The order of a custom run: a generator's, or the CSV's; with --mistake repeated-backward,
    V-Half with the input-gradient pass of stage 0, microbatch 1, run twice in a row."""
    if name in CUSTOM:
        order = CUSTOM[name](p, args.microbatches)
    else:
        order = read_csv(args.csv)
    if args.mistake == "repeated-backward":
        acts = order[0]
        i = acts.index(Action(0, "I", 1))
        order[0] = acts[:i + 1] + [acts[i]] + acts[i + 1:]
    return order


def build(name: str, full, args, info, probes) -> tuple:
    """This rank's stages of the full model, placed as schedule ``name`` needs, and the schedule
    (``None`` for a hand-written one: its step is :func:`hand_step`)."""
    p, v, m = info.world_size, args.stages_per_rank, args.microbatches
    order = custom_order(name, args, p) if name in CUSTOM or name == args.csv else None
    if order is not None:  # each rank holds the stages its line of the order names
        indices = sorted({a.stage for a in order[info.rank]})
        num_stages = 1 + max(a.stage for acts in order.values() for a in acts)
    else:
        indices = stage_indices(PLACED_AS.get(name, name), info.rank, p, v)
        num_stages = p * len(indices)
    mods = {i: stage_module(copy.deepcopy(full), i, num_stages) for i in indices}
    if name in HAND:
        return None, mods, indices, num_stages
    stages = [pipelining.PipelineStage(mods[i], stage_index=i, num_stages=num_stages, device=info.device)
              for i in indices]
    for stage in stages:
        for probe in probes:  # the timeline recorder and the activation probe
            probe.attach(stage)
    if order is None:
        cls = getattr(pipelining, f"Schedule{name}")
        single = issubclass(cls, pipelining.schedules.PipelineScheduleSingle)
        return cls(stages[0] if single else stages, n_microbatches=m, loss_fn=workload.loss_fn), mods, indices, num_stages
    # [start-runtime]
    schedule = _PipelineScheduleRuntime(
        stages, n_microbatches=m, loss_fn=workload.loss_fn
    )
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "order.csv"
        # one line of actions per rank: 0F0,0F1,...
        path.write_text(custom_schedules.to_csv(order))
        # checks the order, reads which rank holds which stage from it,
        # and inserts the sends and receives
        schedule._load_csv(str(path))
    # [end-runtime]
    return schedule, mods, indices, num_stages


def make_step(name, full, args, info, probes, tokens, targets, paired=True) -> tuple:
    """This rank's stages for schedule ``name`` and a function that runs one step of it (each
    microbatch's loss, on the last stage, appended to the list it returns with them)."""
    schedule, mods, indices, num_stages = build(name, full, args, info, probes)
    holds = {"holds_first": 0 in indices, "holds_last": num_stages - 1 in indices}
    rec = probes[0]
    if schedule is None:
        plans = [plan_1f1b(r, info.world_size, args.microbatches) if name == "1F1B-hand" else
                 plan_interleaved(r, info.world_size, args.microbatches, args.stages_per_rank)
                 for r in range(info.world_size)]
    losses = []

    def step():
        for mod in mods.values():
            mod.zero_grad(set_to_none=True)
        if schedule is None:
            losses.append(hand_step(mods, plans, tokens, targets, info, rec, paired))
        else:
            losses.append(driver.schedule_step(schedule, info, tokens, targets, **holds))

    return step, losses, mods, indices, num_stages, holds, schedule is not None


def run_schedule(name, full, reference, ref_loss, tokens, targets, args, info) -> tuple:
    """Time ``name`` on this rank, count its saved activations on one more step, and compare its
    gradients with the one-process run; returns (summary on rank 0 or None, this rank's gradients)."""
    rec, probe = timeline.Recorder(info.rank), activations.ActivationProbe(info.rank)
    step, losses, mods, indices, num_stages, holds, on_torch = make_step(name, full, args, info, [rec, probe], tokens, targets)
    records = measure.timed_steps(step, rec, args.warmup, args.steps, info.device)
    memory = None
    if on_torch:  # one more step counting saved tensors (the probe's hooks cost time)
        probe.enabled = True
        dist.barrier()
        probe.start_step()
        step()
        memory = gather_to_rank0(activations.to_json(probe.events))
    grads = {n: prm.grad.detach().clone() for mod in mods.values() for n, prm in mod.named_parameters()}
    diffs = [workload.compare(mod, reference) for mod in mods.values()]
    check = gather_to_rank0({"rank": info.rank, "stages": indices,
                             "loss": workload.mean_loss(losses[-1]) if holds["holds_last"] else None,
                             "max_grad_diff": max(d["max_grad_diff"] for d in diffs)})
    if info.rank != 0:
        return None, grads
    pipeline_loss = next(c["loss"] for c in check if c["loss"] is not None)
    worst = max(c["max_grad_diff"] for c in check)
    tol = precision.tolerance(args.dtype)
    saved = [e for rows in memory for e in activations.from_json(rows)] if memory else []
    return {"schedule": name, "num_stages": num_stages, "placement": {c["rank"]: c["stages"] for c in check},
            "match": abs(pipeline_loss - ref_loss) <= tol and worst <= tol, "loss": pipeline_loss,
            "reference_loss": ref_loss, "max_grad_diff": worst,
            "memory": {"peak_in_flight": activations.peak_in_flight(saved),
                       "peak_in_flight_most": activations.peak_in_flight(saved, fraction=0.5),
                       "peak_bytes_by_rank": activations.peak_bytes(saved, by="rank")} if memory else None,
            **measure.summarise_steps(records)}, grads


def largest_difference(a: dict, b: dict) -> float:
    """The largest difference between two runs' gradients on this rank (same parameter names)."""
    return max((a[n] - b[n]).abs().max().item() for n in a)


def body(args: argparse.Namespace, info) -> int:
    global exchange
    if args.exchange_before_fix:
        exchange = exchange_before_fix
    full = workload.full_model(args, info.device)  # identical on every rank
    tokens, targets = workload.make_batch(args, 0, info.device)  # (B, T) each: every step, the same batch
    if args.mistake != "none":  # one step of one run, which fails: its error is the result
        name = args.schedules[0]
        rec = timeline.Recorder(info.rank)
        step = make_step(name, full, args, info, [rec], tokens, targets, paired=args.mistake != "unpaired")[0]
        try:
            step()
        except Exception:  # what this rank completed, like a flight record, then the error itself
            done = " ".join(e.label for e in rec.events)
            sys.stdout.write(f"rank {info.rank} completed: {done}\n")  # one write: ranks do not interleave
            sys.stdout.flush()
            raise
        return 0
    reference = copy.deepcopy(full)  # the one-process run: same microbatches, gradients summed, / m
    ref_loss = workload.reference_backward(reference, tokens, targets, args.microbatches)
    names = list(args.schedules) + ([args.csv] if args.csv else [])
    runs, grads = [], {}
    for name in tqdm(names, desc="schedules", disable=info.rank != 0):
        summary, grads[name] = run_schedule(name, full, reference, ref_loss, tokens, targets, args, info)
        runs.append(summary)
    # hand-written vs torch's schedule, parameter by parameter on each rank: bitwise?
    pairs = {hand: largest_difference(grads[hand], grads[ref]) for hand, ref in HAND.items()
             if hand in grads and ref in grads}
    pairs = gather_to_rank0(pairs)
    if info.rank != 0:
        return 0
    hand_vs_torch = {hand: max(r[hand] for r in pairs) for hand in pairs[0]}
    for r in runs:
        busy = ", ".join(f"rank {k} {100 * b:.0f}%" for k, b in r["busy"].items())
        print(f"{r['schedule']:>21}  step {r['median_step_seconds'] * 1e3:7.1f} ms   busy {busy:<22} "
              f"{'MATCH' if r['match'] else 'MISMATCH'}")
    for hand, diff in hand_vs_torch.items():
        print(f"{hand} vs {HAND[hand]}: largest gradient difference {diff:.1e}"
              + (" (bitwise equal)" if diff == 0 else ""))
    ok = all(r["match"] for r in runs)
    print("MATCH: every schedule's loss and gradients equal the one-process run" if ok else
          "MISMATCH in at least one run")
    cli.write_json(args.json, {"world_size": info.world_size, "microbatches": args.microbatches,
                              "stages_per_rank": args.stages_per_rank, "batch_size": args.batch_size,
                              "layers": args.layers, "dim": args.dim, "seq_len": args.seq_len, "dtype": args.dtype,
                              "runs": runs, "hand_vs_torch": hand_vs_torch, "match": ok,
                              "torch_version": torch.__version__})
    return 1 if (args.check and not ok) else 0


def main(argv=None) -> int:
    return cli.run("14_own_schedule.py", parse_args(argv), validate, body)


if __name__ == "__main__":
    sys.exit(main())
