"""Naive model parallelism: the model cut into one stage per process, the whole batch passed
from stage to stage with blocking send/recv, and a timeline of who computed when.

CPU, two stages (gloo):
    torchrun --standalone --nproc-per-node 2 scripts/02_naive.py --check
CPU, four stages:
    torchrun --standalone --nproc-per-node 4 scripts/02_naive.py --layers 4 --check
GPUs (NCCL):
    torchrun --standalone --nproc-per-node 4 scripts/02_naive.py --check --device cuda

Each step sends the whole batch forward through the stages and the gradient back. Only one
rank computes at any moment; the recorded timeline and each rank's busy fraction show it.
"""

from __future__ import annotations

import argparse
import copy
import sys

import torch
import torch.distributed as dist

from ppbook import cli, measure, precision, workload
from ppbook.stages import stage_module
from ppbook.timeline import Recorder


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    cli.add_common_args(p, microbatches=1, microbatches_help="always 1: naive model parallelism does not split the batch",
                       batch_size=16, seq_len=64, dim=128)
    cli.add_timing_args(p)
    return p.parse_args(argv)


def validate(args: argparse.Namespace, world_size: int) -> None:
    cli.validate_common(args, world_size)
    if args.microbatches != 1:
        raise ValueError(f"naive model parallelism runs the whole batch at once: --microbatches must be 1, "
                         f"got {args.microbatches}; scripts/03_gpipe.py splits it")


# [start-naive]
def naive_step(stage_mod, tokens, targets, info, rec: Recorder):
    """One training step of naive model parallelism;
    returns the loss on the last rank."""
    rank, loss = info.rank, None
    # (B, T, C) between stages
    act_shape = (tokens.shape[0], tokens.shape[1], stage_mod.cfg.dim)
    dtype = next(stage_mod.parameters()).dtype
    # === forward: wait for the previous stage, compute, hand on ===
    if info.is_first:
        x = tokens                                         # (B, T) token ids
    else:
        x = torch.empty(act_shape, dtype=dtype, device=info.device)
        dist.recv(x, src=rank - 1)                         # comm: receive activation
        # we will need d(loss)/dx for the previous stage
        x.requires_grad_()
    with rec.span(rank, "F", 0):
        # compute: forward, (B, T, C) or (B, T, vocab)
        y = stage_mod(x)
    if not info.is_last:
        dist.send(y.detach(), dst=rank + 1)                # comm: send activation
    # === backward: wait for the next stage's gradient, compute, hand back ===
    if info.is_last:
        loss = workload.loss_fn(y, targets)
        with rec.span(rank, "B", 0):
            # compute: backward from the loss
            loss.backward()
    else:
        grad = torch.empty_like(y)
        dist.recv(grad, src=rank + 1)                      # comm: receive d(loss)/dy
        with rec.span(rank, "B", 0):
            y.backward(grad)                               # compute: backward
    if not info.is_first:
        dist.send(x.grad, dst=rank - 1)                    # comm: send d(loss)/dx
    return loss
# [end-naive]


def body(args: argparse.Namespace, info) -> int:
    full = workload.full_model(args, info.device)  # identical on every rank
    tokens, targets = workload.make_batch(args, 0, info.device)
    reference = copy.deepcopy(full)
    ref_loss = workload.reference_backward(reference, tokens, targets, 1)

    stage_mod = stage_module(full, info.rank, info.world_size)
    rec = Recorder(info.rank)
    losses = []

    def step():
        stage_mod.zero_grad(set_to_none=True)
        losses.append(naive_step(stage_mod, tokens, targets, info, rec))

    records = measure.timed_steps(step, rec, args.warmup, args.steps, info.device)
    check = [None] * info.world_size
    loss = losses[-1].item() if info.is_last else None
    dist.all_gather_object(check, {"rank": info.rank, "loss": loss, **workload.compare(stage_mod, reference)})
    tol = precision.tolerance(args.dtype)
    ok = abs(check[-1]["loss"] - ref_loss) <= tol and all(c["max_grad_diff"] <= tol for c in check)
    if info.rank == 0:
        summary = measure.summarise_steps(records)
        print(f"naive model parallelism on {info.world_size} processes, batch {args.batch_size}: "
              f"median step {summary['median_step_seconds'] * 1e3:.1f} ms")
        for r, b in summary["busy"].items():
            print(f"  rank {r} busy {100 * b:.0f}% of the step")
        print("MATCH: gradients equal the one-process run" if ok else "MISMATCH: gradients differ from the one-process run")
        cli.write_json(args.json, {"world_size": info.world_size, "batch_size": args.batch_size, "microbatches": 1,
                                  "reference_loss": ref_loss, "stages": check, "match": ok, **summary})
    return 1 if (args.check and not ok) else 0


def main(argv=None) -> int:
    return cli.run("02_naive.py", parse_args(argv), validate, body)


if __name__ == "__main__":
    sys.exit(main())
