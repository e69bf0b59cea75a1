"""The blog's ``Pipe(model, chunks=4, balance=[1, 1], devices=[0, 1])`` migrated to
``torch.distributed.pipelining`` (book/a1_migrating_from_pipe.md), checked against the same model in one process.

The flags keep the old argument names, so the old call translates one to one. CPU, two stages:
    torchrun --standalone --nproc-per-node 2 scripts/a1_migrate.py --chunks 4 --balance 1 1 --check
The old checkpoint="always", as activation checkpointing inside each stage:
    torchrun --standalone --nproc-per-node 2 scripts/a1_migrate.py --chunks 4 --balance 1 1 --checkpoint always --check
One process, no torchrun (a one-stage pipeline, balance=[2]):
    python scripts/a1_migrate.py --chunks 4 --balance 2 --check
GPUs (devices=[0, 1]: rank r uses cuda:r, NCCL):
    torchrun --standalone --nproc-per-node 2 scripts/a1_migrate.py --chunks 4 --balance 1 1 --check --device cuda

chunks -> n_microbatches; balance -> which layers each stage keeps; devices -> one process per
device, started by torchrun; Pipe.forward + loss.backward() -> schedule.step.
"""

from __future__ import annotations

import argparse
import copy
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
from torch.utils.checkpoint import checkpoint

from ppbook import dist as ppdist
from ppbook import cli, workload
from ppbook import precision
from ppbook.stages import assign_layers


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--chunks", type=int, default=4, help="old Pipe's chunks: today's n_microbatches")
    p.add_argument("--balance", type=int, nargs="+", default=None,
                   help="old Pipe's balance: layers per stage, one number per process (default: even split)")
    p.add_argument("--checkpoint", choices=["never", "always", "except_last"], default="never",
                   help="old Pipe's checkpoint mode; today activation checkpointing inside the stage")
    p.add_argument("--layers", type=int, default=2, help="children of the nn.Sequential model")
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=2, help="SGD steps")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=precision.dtype_choices(mixed=True), default="float32",
                   help="float32/float64: everything in that dtype; bfloat16: float32 weights, bfloat16 compute")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="old Pipe's devices: with cuda, rank r uses cuda:r")
    p.add_argument("--check", action="store_true", help="fail unless the pipeline matches the one-process run")
    p.add_argument("--json", default=None, help="write machine-readable results to this path (rank 0)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds any rank waits for a peer before failing")
    return p.parse_args(argv)


def validate(args: argparse.Namespace, world_size: int) -> None:
    """The old Pipe checked balance against the model and devices; so does this, in one line each."""
    for name in ("chunks", "layers", "dim", "batch_size", "steps"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.batch_size % args.chunks:
        raise ValueError(f"--batch-size {args.batch_size} is not divisible by --chunks {args.chunks}; "
                         f"today every microbatch must have the same size (try --batch-size "
                         f"{-(-args.batch_size // args.chunks) * args.chunks})")
    if args.balance is not None:
        if len(args.balance) != world_size:
            raise ValueError(f"--balance has {len(args.balance)} entries but there are {world_size} processes: "
                             f"one stage per process, so launch torchrun --nproc-per-node {len(args.balance)}")
        if sum(args.balance) != args.layers or min(args.balance) < 1:
            raise ValueError(f"--balance {' '.join(map(str, args.balance))} must give every one of the "
                             f"{args.layers} layers to a stage, at least one each (sum {args.layers})")
    elif args.layers < world_size:
        raise ValueError(f"{world_size} processes need at least {world_size} layers; raise --layers")
    if args.checkpoint == "except_last":
        raise ValueError("--checkpoint except_last has no equivalent today (it skipped the last microbatch); "
                         "use --checkpoint always (recompute every microbatch) or never")
    ppdist.pick_device(0, args.device)


# [start-model]
def build_model(args: argparse.Namespace) -> nn.Sequential:
    """The kind of model the old Pipe took: an
    nn.Sequential, cut between its children."""
    torch.manual_seed(args.seed)
    blocks = [
        nn.Sequential(nn.Linear(args.dim, args.dim), nn.Tanh())
        for _ in range(args.layers - 1)
    ]
    return nn.Sequential(
        *blocks, nn.Linear(args.dim, args.dim)
    ).to(precision.param_dtype(args.dtype))
# [end-model]


# [start-balance]
def layers_of_stages(
    balance: list[int] | None, n_layers: int, num_stages: int
) -> list[list[int]]:
    """balance=[1, 1] -> [[0], [1]]: the children each
    stage keeps. Without a balance, an even split."""
    if balance is None:
        return assign_layers(n_layers, num_stages)
    starts = [sum(balance[:i]) for i in range(len(balance))]
    return [list(range(s, s + n)) for s, n in zip(starts, balance)]


def keep_only(model: nn.Sequential, owned: list[int]) -> nn.Sequential:
    """This stage: the children it owns, the others
    replaced by Identity so names stay ("1.weight")."""
    for i in range(len(model)):
        if i not in owned:
            model[i] = nn.Identity()
    return model
# [end-balance]


class Checkpointed(nn.Module):
    """checkpoint="always": keep no activations inside the stage; recompute them in backward."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.module, x, use_reentrant=False)


def make_batch(args: argparse.Namespace, step: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(args.seed * 10_000 + step)
    x = torch.randn(args.batch_size, args.dim, generator=g, dtype=precision.param_dtype(args.dtype))
    return x.to(device), torch.sin(x).to(device)  # inputs (B, D), targets (B, D)


def mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(output, target)  # mean over the microbatch


# [start-after]
def train_pipeline(
    stage_mod: nn.Module, args, info
) -> tuple[list[float], torch.Tensor | None]:
    """What replaces ``Pipe(...)``, ``pipe(x)`` and ``loss.backward()``: returns the
    losses and the last stage's output of the first step (the old
    ``pipe(x).local_value()``)."""
    stage = PipelineStage(
        stage_mod, stage_index=info.rank, num_stages=info.world_size, device=info.device
    )
    # chunks -> n_microbatches
    schedule = ScheduleGPipe(stage, n_microbatches=args.chunks, loss_fn=mse)
    opt = torch.optim.SGD(stage_mod.parameters(), lr=args.lr)
    losses, first_output = [], None
    for step in range(args.steps):
        x, y = make_batch(args, step, info.device)
        opt.zero_grad()
        mb_losses = []
        # a no-op unless --dtype bfloat16
        with precision.autocast(info.device, args.dtype):
            if info.is_first and info.is_last:
                out = schedule.step(x, target=y, losses=mb_losses)
            elif info.is_first:
                # only stage 0 gets the input
                out = schedule.step(x)
            elif info.is_last:
                # only the last stage the target
                out = schedule.step(target=y, losses=mb_losses)
            else:
                out = schedule.step()
        opt.step()
        if step == 0 and info.is_last:
            # (B, D), merged from the microbatches
            first_output = out.detach()
        losses.append(workload.mean_loss(mb_losses) if mb_losses else float("nan"))
    return losses, first_output
# [end-after]


def sgd_reference_losses(model: nn.Module, args, device) -> tuple[list[float], torch.Tensor]:
    """The same model in one process, same microbatches in the same order, their gradients
    summed and then divided by chunks, as the schedule's ``scale_grads`` does."""
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    losses, first_output = [], None
    for step in range(args.steps):
        x, y = make_batch(args, step, device)
        opt.zero_grad()
        outs, mb_losses = [], []
        for xc, yc in zip(x.chunk(args.chunks), y.chunk(args.chunks)):
            with precision.autocast(device, args.dtype):
                out = model(xc)
                mse(out, yc).backward()
                mb_losses.append(mse(out, yc))
            outs.append(out.detach())
        workload.scale_grads(model, args.chunks)
        opt.step()
        first_output = torch.cat(outs) if step == 0 else first_output
        losses.append(workload.mean_loss(mb_losses))
    return losses, first_output


def body(args: argparse.Namespace, info) -> int:
    full = build_model(args).to(info.device)                      # identical on every rank: one seed
    reference = copy.deepcopy(full)
    ref_losses, ref_output = sgd_reference_losses(reference, args, info.device)

    layers = layers_of_stages(args.balance, args.layers, info.world_size)
    stage_seq = keep_only(full, layers[info.rank])
    stage_mod = Checkpointed(stage_seq) if args.checkpoint == "always" else stage_seq
    losses, output = train_pipeline(stage_mod, args, info)

    mine = {"rank": info.rank, "layers": layers[info.rank], **workload.compare(stage_seq, reference)}
    if info.is_last:
        mine["losses"] = losses
        mine["max_output_diff"] = (output - ref_output).abs().max().item()
    everyone = [None] * info.world_size
    dist.all_gather_object(everyone, mine)
    last = everyone[-1]
    tol = precision.tolerance(args.dtype)
    loss_diff = max(abs(a - b) for a, b in zip(last["losses"], ref_losses))
    ok = (loss_diff <= tol and last["max_output_diff"] <= tol
          and all(r["max_grad_diff"] <= tol and r["max_weight_diff"] <= tol for r in everyone))
    if info.rank == 0:
        for r in everyone:
            print(f"stage {r['rank']} (rank {r['rank']}): layers {r['layers']}, "
                  f"max |grad - ref| = {r['max_grad_diff']:.1e}, max |weight - ref| = {r['max_weight_diff']:.1e}")
        print(f"max |output - ref| = {last['max_output_diff']:.1e}; losses {last['losses']} vs {ref_losses}")
        print("MATCH: the pipeline reproduces the one-process run" if ok else "MISMATCH")
        cli.write_json(args.json, {
            "world_size": info.world_size, "dtype": args.dtype, "chunks": args.chunks, "balance": args.balance,
            "checkpoint": args.checkpoint, "layers_per_stage": layers, "pipeline_losses": last["losses"],
            "reference_losses": ref_losses, "max_loss_diff": loss_diff, "max_output_diff": last["max_output_diff"],
            "stages": everyone, "match": ok, "tolerance": tol, "torch_version": torch.__version__,
        })
    return 1 if (args.check and not ok) else 0


def main(argv=None) -> int:
    return cli.run("a1_migrate.py", parse_args(argv), validate, body)


if __name__ == "__main__":
    sys.exit(main())
