"""Beyond a chain of layers: a skip connection that crosses stage boundaries, passed between
stages as a tuple of tensors, and tied input/output embeddings kept equal across the first and
last stage; each trained for a few AdamW steps and checked against the one-process model.

CPU, two stages (gloo), all three variants in one launch:
    torchrun --standalone --nproc-per-node 2 scripts/08_beyond_chain.py --check
CPU, four stages (the skip tensor rides through the two middle stages):
    torchrun --standalone --nproc-per-node 4 scripts/08_beyond_chain.py --check
What torch refuses: a stage that returns a dict (the run fails with torch's error):
    torchrun --standalone --nproc-per-node 2 scripts/08_beyond_chain.py --stage-output dict
GPUs (NCCL), a larger model:
    torchrun --standalone --nproc-per-node 4 scripts/08_beyond_chain.py --dim 1024 --layers 8 --device cuda

Variants: ``skip`` (a long skip connection), ``tied`` (and tied embeddings, gradients summed
across first and last stage), ``tied-nosync`` (the same without the sum: the copies drift apart).
"""

from __future__ import annotations

import argparse
import copy
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

from ppbook import cli, driver, workload
from ppbook import precision
from ppbook.skip import build_skip_model, sync_tied_grads, tied_group_ranks, tied_parameter
from ppbook.stages import stage_module

VARIANTS = ("skip", "tied", "tied-nosync")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    cli.add_common_args(p, mixed_precision=True)
    p.add_argument("--steps", type=int, default=3, help="optimizer steps (AdamW)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--stage-output", choices=["tuple", "dict"], default="tuple",
                   help="how a stage hands (h, skip) on; 'dict' shows what torch refuses")
    return p.parse_args(argv)


class DictOutput(nn.Module):
    """The stage as many people first write it: named outputs in a dict. Pipelining refuses it."""

    def __init__(self, stage_mod: nn.Module):
        super().__init__()
        self.stage_mod = stage_mod

    def forward(self, *args):
        h, skip = self.stage_mod(*args)
        return {"h": h, "skip": skip}


# [start-train]
def train_pipeline(stage_mod, args, info, tied_group, sync: bool) -> list[float]:
    """Train this rank's stage; the stage passes the
    tuple (h, skip) on, the last returns logits."""
    stage = PipelineStage(
        stage_mod, stage_index=info.rank, num_stages=info.world_size, device=info.device
    )
    schedule = ScheduleGPipe(
        stage, n_microbatches=args.microbatches, loss_fn=workload.loss_fn
    )
    opt = torch.optim.AdamW(stage_mod.parameters(), lr=args.lr)
    losses = []
    for step in range(args.steps):
        tokens, targets = workload.make_batch(args, step, info.device)  # (B, T), (B, T)
        opt.zero_grad()
        # a no-op unless --dtype bfloat16
        with precision.autocast(info.device, args.dtype):
            mb_losses = driver.schedule_step(schedule, info, tokens, targets)
        if sync:
            # comm: first + last stage's tied grads
            sync_tied_grads(stage_mod, tied_group)
        opt.step()
        losses.append(workload.mean_loss(mb_losses) if mb_losses else float("nan"))
    return losses
# [end-train]


def run_variant(variant, args, info, tied_group) -> dict | None:
    tie = variant != "skip"
    full = build_skip_model(workload.gpt_config(args), args.seed, tie, precision.param_dtype(args.dtype)).to(info.device)
    reference = copy.deepcopy(full)  # one process; a tied weight stays one Parameter here
    with precision.autocast(info.device, args.dtype, cache=False):  # around several steps: no cache
        ref_losses = workload.adamw_reference_losses(reference, args, info.device)
    stage_mod = stage_module(full, info.rank, info.world_size)
    if args.stage_output == "dict" and stage_mod.output is None:
        stage_mod = DictOutput(stage_mod)
    losses = train_pipeline(stage_mod, args, info, tied_group, sync=variant == "tied")
    copy_of_tied = tied_parameter(stage_mod)
    mine = {"rank": info.rank, **workload.compare(stage_mod, reference), "losses": losses,
            "tied_copy": copy_of_tied.detach().cpu() if copy_of_tied is not None else None}
    everyone = [None] * info.world_size
    dist.all_gather_object(everyone, mine)
    if info.rank != 0:
        return None
    copies = [r.pop("tied_copy") for r in everyone]
    # the two copies of a tied weight: the first stage's embedding and the last stage's head
    copy_diff = (copies[0] - copies[-1]).abs().max().item() if tie else None
    pipe_losses = everyone[-1]["losses"]
    loss_diff = max(abs(a - b) for a, b in zip(pipe_losses, ref_losses))
    tol = precision.tolerance(args.dtype)
    ok = loss_diff <= tol and all(r["max_grad_diff"] <= tol and r["max_weight_diff"] <= tol for r in everyone)
    return {"variant": variant, "pipeline_losses": pipe_losses, "reference_losses": ref_losses,
            "max_loss_diff": loss_diff, "tied_copy_diff": copy_diff, "stages": everyone, "match": ok}


def body(args: argparse.Namespace, info) -> int:
    # every rank creates every group, members or not; only the first and last stage use this one
    ranks = tied_group_ranks(info.world_size)
    group = dist.new_group(ranks)
    tied_group = group if info.rank in ranks else None
    runs = [run_variant(v, args, info, tied_group) for v in args.variants]
    if info.rank != 0:
        return 0
    for r in runs:
        tied = "" if r["tied_copy_diff"] is None else f"   embedding vs head copy {r['tied_copy_diff']:.2e}"
        worst = max(s["max_weight_diff"] for s in r["stages"])
        print(f"{r['variant']:>11}: losses {', '.join(f'{x:.4f}' for x in r['pipeline_losses'])}   "
              f"max |weight - ref| {worst:.2e}{tied}   {'MATCH' if r['match'] else 'MISMATCH'}")
    # without the sum the copies must drift apart, unless one process holds the one shared weight
    expected = {r["variant"]: r["variant"] != "tied-nosync" or info.world_size == 1 for r in runs}
    ok = all(r["match"] == expected[r["variant"]] for r in runs)
    print("as expected: tuples and summed tied gradients reproduce one process" if ok else "UNEXPECTED result")
    cli.write_json(args.json, {"world_size": info.world_size, "microbatches": args.microbatches, "dtype": args.dtype,
                              "steps": args.steps, "tolerance": precision.tolerance(args.dtype), "runs": runs,
                              "as_expected": ok, "torch_version": torch.__version__})
    return 1 if (args.check and not ok) else 0


def main(argv=None) -> int:
    return cli.run("08_beyond_chain.py", parse_args(argv), cli.validate_common, body)


if __name__ == "__main__":
    sys.exit(main())
