"""Your first pipeline: the GPT-style model cut into one stage per process, trained with
``ScheduleGPipe``, and checked against the same model trained in one process.

CPU, two stages (gloo):
    torchrun --standalone --nproc-per-node 2 scripts/01_first_pipeline.py --microbatches 4 --check
CPU, one process (a one-stage pipeline, no torchrun needed):
    python scripts/01_first_pipeline.py --check
GPUs, four stages on one node (NCCL):
    torchrun --standalone --nproc-per-node 4 scripts/01_first_pipeline.py --check --device cuda

Every rank builds the *full* model from the same seed, trains a private copy of it in one
process as the reference, then deletes what its stage does not own and trains that stage in
the pipeline. With ``--check`` each rank compares its stage's losses, gradients and weights
with the reference's and the script fails if any differ beyond float tolerance.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

from ppbook import cli, driver, workload
from ppbook import precision
from ppbook.stages import assign_layers, stage_module


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    cli.add_common_args(p, mixed_precision=True)
    p.add_argument("--steps", type=int, default=3, help="optimizer steps (AdamW)")
    p.add_argument("--lr", type=float, default=1e-3)
    return p.parse_args(argv)


# [start-pipeline]
def train_pipeline(stage_mod, args, info) -> tuple[list[float], list[float]]:
    """Train this rank's stage inside the pipeline;
    returns (losses, seconds per step)."""
    stage = PipelineStage(
        stage_mod, stage_index=info.rank, num_stages=info.world_size, device=info.device
    )
    schedule = ScheduleGPipe(
        stage, n_microbatches=args.microbatches, loss_fn=workload.loss_fn
    )
    opt = torch.optim.AdamW(stage_mod.parameters(), lr=args.lr)
    losses, seconds = [], []
    for step in range(args.steps):
        tokens, targets = workload.make_batch(args, step, info.device)
        opt.zero_grad()
        t0 = time.perf_counter()
        # a no-op unless --dtype bfloat16
        with precision.autocast(info.device, args.dtype):
            # input on stage 0, targets on the last
            mb_losses = driver.schedule_step(schedule, info, tokens, targets)
        opt.step()
        seconds.append(time.perf_counter() - t0)
        losses.append(workload.mean_loss(mb_losses) if mb_losses else float("nan"))
    return losses, seconds
# [end-pipeline]


def body(args: argparse.Namespace, info) -> int:
    full = workload.full_model(args, info.device)  # identical on every rank
    reference = copy.deepcopy(full)
    with precision.autocast(info.device, args.dtype, cache=False):  # around several steps: no cache
        ref_losses = workload.adamw_reference_losses(reference, args, info.device)

    stage_mod = stage_module(full, info.rank, info.world_size)
    losses, seconds = train_pipeline(stage_mod, args, info)

    mine = {"rank": info.rank, **workload.compare(stage_mod, reference), "losses": losses, "seconds": seconds}
    everyone = [None] * info.world_size
    dist.all_gather_object(everyone, mine)
    pipe_losses = everyone[-1]["losses"]  # the last stage computed them
    loss_diff = max(abs(a - b) for a, b in zip(pipe_losses, ref_losses))
    tol = precision.tolerance(args.dtype)
    ok = loss_diff <= tol and all(r["max_grad_diff"] <= tol and r["max_weight_diff"] <= tol for r in everyone)
    if info.rank == 0:
        layers = assign_layers(args.layers, info.world_size)
        for r in everyone:
            print(f"stage {r['rank']}: layers {layers[r['rank']]}, {len(r['params'])} tensors, "
                  f"max |grad - ref| = {r['max_grad_diff']:.2e}, max |weight - ref| = {r['max_weight_diff']:.2e}")
        for step, (a, b) in enumerate(zip(pipe_losses, ref_losses)):
            print(f"step {step}: pipeline loss {a:.6f}   one-process loss {b:.6f}")
        print("MATCH: the pipeline reproduces the one-process run" if ok else "MISMATCH: pipeline and one-process run differ")
        cli.write_json(args.json, {
            "world_size": info.world_size, "backend": info.backend, "device": str(info.device),
            "microbatches": args.microbatches, "batch_size": args.batch_size, "dtype": args.dtype,
            "layers_per_stage": layers, "pipeline_losses": pipe_losses, "reference_losses": ref_losses,
            "max_loss_diff": loss_diff, "stages": everyone, "match": ok, "tolerance": tol,
            "torch_version": torch.__version__,
        })
    return 1 if (args.check and not ok) else 0


def main(argv=None) -> int:
    return cli.run("01_first_pipeline.py", parse_args(argv), cli.validate_common, body)


if __name__ == "__main__":
    sys.exit(main())
