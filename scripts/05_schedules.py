"""Training one model with each of the seven schedules of ``torch.distributed.pipelining``:
each one's stage placement, recorded timeline, step time and saved activations per stage over
time, with its losses, gradients and SGD-updated weights checked against one process.

CPU, two processes, all seven schedules in one launch (gloo):
    torchrun --standalone --nproc-per-node 2 scripts/05_schedules.py --check
CPU, four processes, two schedules, eight microbatches:
    torchrun --standalone --nproc-per-node 4 scripts/05_schedules.py --schedules 1F1B DualPipeV --microbatches 8 --check
GPUs (NCCL), a larger model:
    torchrun --standalone --nproc-per-node 4 scripts/05_schedules.py --dim 1024 --layers 16 --batch-size 64 --device cuda

Placement: GPipe and 1F1B put stage r on rank r; the looped schedules (Interleaved1F1B,
LoopedBFS, InterleavedZeroBubble) put stages r, r + p, ... on rank r (--stages-per-rank of
them); the V-shaped ones (ZBVZeroBubble, DualPipeV) stages r and 2p - 1 - r.
"""

from __future__ import annotations

import argparse
import copy
import sys

import torch
import torch.distributed as dist
from torch.distributed import pipelining
from tqdm import tqdm

from ppbook import activations, timeline
from ppbook import cli, driver, measure, workload
from ppbook import precision
from ppbook.dist import gather_to_rank0, pick_device, schedule_backend_problem
from ppbook.stages import TORCH_SCHEDULES, schedule_problem, stage_indices, stage_module

SCHEDULE_NAMES = list(TORCH_SCHEDULES)  # GPipe, 1F1B, Interleaved1F1B, LoopedBFS, ...


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # 8 layers: room for 2 stages per rank on 4 processes; 8 microbatches: every schedule runs at p = 2 and 4
    cli.add_common_args(p, microbatches=8, batch_size=32, seq_len=64, layers=8, dim=128, mixed_precision=True)
    cli.add_timing_args(p, steps=3)
    p.add_argument("--schedules", nargs="+", choices=SCHEDULE_NAMES + ["all"], default=["all"],
                   help="which schedule classes to run, one after another in this launch")
    p.add_argument("--stages-per-rank", type=int, default=2, help="v, for the looped schedules")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate of the update after every step")
    args = p.parse_args(argv)
    if "all" in args.schedules:
        args.schedules = SCHEDULE_NAMES
    return args


def validate(args: argparse.Namespace, world_size: int) -> None:
    cli.validate_common(args, world_size)
    if args.lr < 0:
        raise ValueError(f"--lr must be at least 0, got {args.lr}")
    for name in args.schedules:  # torch's own errors come mid-way, or never (a wrong placement)
        problem = (schedule_problem(name, world_size, args.microbatches, args.stages_per_rank, args.layers)
                   or schedule_backend_problem(name, pick_device(0, args.device), world_size))
        if problem:
            raise ValueError(problem)


# [start-build]
def build(name: str, full, args, info, probes) -> tuple:
    """This rank's stages of the full model, placed
    as schedule ``name`` needs, and the schedule."""
    p = info.world_size
    indices = stage_indices(name, info.rank, p, args.stages_per_rank)  # V: [r, 2p-1-r]
    num_stages = p * len(indices)
    mods, stages = [], []
    for i in indices:
        # layers of stage i of num_stages
        mod = stage_module(copy.deepcopy(full), i, num_stages)
        stage = pipelining.PipelineStage(
            mod, stage_index=i, num_stages=num_stages, device=info.device
        )
        for probe in probes:  # the timeline recorder and the activation probe
            probe.attach(stage)
        mods.append(mod)
        stages.append(stage)
    cls = getattr(pipelining, f"Schedule{name}")
    single = issubclass(cls, pipelining.schedules.PipelineScheduleSingle)
    schedule = cls(
        stages[0] if single else stages,
        n_microbatches=args.microbatches,
        loss_fn=workload.loss_fn,
    )
    return schedule, mods, indices, num_stages
# [end-build]


def sgd_reference_model(full, args, n_steps: int) -> tuple:
    """One process, the same batches cut into the same m microbatches, the same SGD updates:
    every schedule's last loss, gradients and weights must equal these."""
    model = copy.deepcopy(full)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    for i in range(n_steps):
        opt.zero_grad(set_to_none=True)
        device = next(model.parameters()).device
        with precision.autocast(device, args.dtype):  # one region per step: autocast caches cast weights
            loss = workload.reference_backward(model, *workload.make_batch(args, i, device), args.microbatches)
        opt.step()
    return model, loss


def run_schedule(name, full, reference, ref_loss, args, info) -> dict | None:
    rec, probe = timeline.Recorder(info.rank), activations.ActivationProbe(info.rank)
    schedule, mods, indices, num_stages = build(name, full, args, info, [rec, probe])
    holds = {"holds_first": 0 in indices, "holds_last": num_stages - 1 in indices}
    opt = torch.optim.SGD([p for mod in mods for p in mod.parameters()], lr=args.lr)  # this rank's stages
    losses = []

    def step():
        opt.zero_grad(set_to_none=True)
        tokens, targets = workload.make_batch(args, len(losses), info.device)  # (B, T) each, a new batch each step
        with precision.autocast(info.device, args.dtype):  # a no-op unless --dtype bfloat16
            losses.append(driver.schedule_step(schedule, info, tokens, targets, **holds))
        opt.step()

    records = measure.timed_steps(step, rec, args.warmup, args.steps, info.device)
    # one more step with the probe counting saved tensors (its hooks cost time, so not timed)
    probe.enabled = True
    dist.barrier()
    rec.start_step()
    probe.start_step()
    step()
    rows = gather_to_rank0((timeline.to_json(rec.events), activations.to_json(probe.events)))
    loss = workload.mean_loss(losses[-1]) if holds["holds_last"] else None
    diffs = [workload.compare(mod, reference) for mod in mods]
    check = gather_to_rank0({"rank": info.rank, "stages": indices, "loss": loss,
                             "losses": [workload.mean_loss(mb) for mb in losses] if holds["holds_last"] else None,
                             "max_grad_diff": max(d["max_grad_diff"] for d in diffs),
                             "max_weight_diff": max(d["max_weight_diff"] for d in diffs)})
    if info.rank != 0:
        return None
    events = [e for r in rows for e in timeline.from_json(r[0])]
    memory = [e for r in rows for e in activations.from_json(r[1])]
    t0 = min(e.start for e in events)
    pipeline_loss = next(c["loss"] for c in check if c["loss"] is not None)
    tol = precision.tolerance(args.dtype)
    ok = abs(pipeline_loss - ref_loss) <= tol and all(max(c["max_grad_diff"], c["max_weight_diff"]) <= tol for c in check)
    return {"schedule": name, "num_stages": num_stages, "placement": {c["rank"]: c["stages"] for c in check},
            "match": ok, "loss": pipeline_loss, "reference_loss": ref_loss,
            "max_grad_diff": max(c["max_grad_diff"] for c in check),
            "max_weight_diff": max(c["max_weight_diff"] for c in check), "steps_trained": len(losses),
            "losses": next(c["losses"] for c in check if c["losses"] is not None),  # one per step trained
            "memory": {"events": timeline.to_json([timeline.Event(e.rank, e.stage, e.kind, e.microbatch,
                                                                  e.start - t0, e.end - t0) for e in events]),
                       "saved": activations.to_json([activations.MemoryEvent(e.rank, e.stage, e.microbatch,
                                                                             e.time - t0, e.delta) for e in memory]),
                       "peak_in_flight": activations.peak_in_flight(memory),  # any saved bytes
                       "peak_in_flight_most": activations.peak_in_flight(memory, fraction=0.5),
                       "peak_bytes": activations.peak_bytes(memory),
                       "residual_bytes": sum(activations.residual_bytes(memory).values())},
            **measure.summarise_steps(records)}


def body(args: argparse.Namespace, info) -> int:
    full = workload.full_model(args, info.device)  # identical on every rank
    # every schedule trains from the same weights for warmup + timed steps + the probed step
    reference, ref_loss = sgd_reference_model(full, args, args.warmup + args.steps + 1)
    runs = [run_schedule(name, full, reference, ref_loss, args, info)
            for name in tqdm(args.schedules, desc="schedules", disable=info.rank != 0)]
    if info.rank != 0:
        return 0
    for r in runs:
        inflight = " ".join(f"{s}:{n}" for s, n in r["memory"]["peak_in_flight_most"].items())
        print(f"{r['schedule']:>21}  step {r['median_step_seconds'] * 1e3:7.1f} ms   "
              f"peak microbatches held per stage {inflight:<24} {'MATCH' if r['match'] else 'MISMATCH'}")
    ok = all(r["match"] for r in runs)
    print("MATCH: every schedule's losses, gradients and updated weights equal the one-process run" if ok
          else "MISMATCH in at least one run")
    cli.write_json(args.json, {"world_size": info.world_size, "microbatches": args.microbatches,
                              "stages_per_rank": args.stages_per_rank, "batch_size": args.batch_size,
                              "layers": args.layers, "dim": args.dim, "seq_len": args.seq_len, "dtype": args.dtype,
                              "runs": runs, "match": ok, "torch_version": torch.__version__})
    return 1 if (args.check and not ok) else 0


def main(argv=None) -> int:
    return cli.run("05_schedules.py", parse_args(argv), validate, body)


if __name__ == "__main__":
    sys.exit(main())
