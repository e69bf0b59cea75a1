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
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

from ppbook import dist as ppdist
from ppbook.models import GPTConfig, build_model
from ppbook.stages import assign_layers, stage_module

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--microbatches", type=int, default=4, help="n_microbatches: the batch is cut into this many")
    p.add_argument("--batch-size", type=int, default=8, help="global batch size (divisible by --microbatches)")
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--layers", type=int, default=4, help="transformer layers in the full model")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--steps", type=int, default=3, help="optimizer steps (AdamW)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--check", action="store_true", help="fail unless the pipeline matches the one-process run")
    p.add_argument("--json", default=None, help="write machine-readable results to this path (rank 0)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds any rank waits for a peer before failing")
    return p.parse_args(argv)


def validate(args: argparse.Namespace, world_size: int) -> None:
    """Refuse bad combinations before any process group exists, in one line each."""
    for name in ("microbatches", "batch_size", "seq_len", "layers", "dim", "heads", "vocab", "steps"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.batch_size % args.microbatches:
        raise ValueError(
            f"--batch-size {args.batch_size} is not divisible by --microbatches {args.microbatches}: "
            f"every microbatch must have the same size; try --batch-size {-(-args.batch_size // args.microbatches) * args.microbatches}"
        )
    if args.layers < world_size:
        raise ValueError(
            f"{world_size} processes need at least {world_size} layers (one stage each), got --layers {args.layers}; "
            f"raise --layers or lower --nproc-per-node"
        )
    if args.dim % args.heads:
        raise ValueError(f"--dim {args.dim} must be divisible by --heads {args.heads}")


def make_batch(args: argparse.Namespace, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids and next-token targets, the same on every rank for a given step."""
    g = torch.Generator().manual_seed(args.seed * 10_000 + step)
    seq = torch.randint(0, args.vocab, (args.batch_size, args.seq_len + 1), generator=g)
    return seq[:, :-1], seq[:, 1:]  # tokens (B, T), targets (B, T)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())  # mean over the microbatch's B*T tokens


def mean_loss(mb_losses: list[torch.Tensor]) -> float:
    # equal-sized microbatches: the mean of their mean losses is the full batch's mean loss
    return torch.stack(mb_losses).mean().item()


def train_reference(model, args, device) -> list[float]:
    """The one-process run every pipeline result is compared with."""
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    losses = []
    for step in range(args.steps):
        tokens, targets = (t.to(device) for t in make_batch(args, step))
        opt.zero_grad()
        mb_losses = []
        # Same microbatches as the pipeline, gradients accumulated with the 1/m that
        # ScheduleGPipe's scale_grads applies: the full-batch mean-loss gradient, summed in the
        # same order, so float32 results agree to the last bit.
        for mb_tokens, mb_targets in zip(tokens.chunk(args.microbatches), targets.chunk(args.microbatches)):
            loss = loss_fn(model(mb_tokens), mb_targets)
            (loss / args.microbatches).backward()
            mb_losses.append(loss.detach())
        opt.step()
        losses.append(mean_loss(mb_losses))
    return losses


# [start-pipeline]
def train_pipeline(stage_mod, args, info) -> tuple[list[float], list[float]]:
    """Train this rank's stage inside the pipeline; returns (losses, seconds per step)."""
    stage = PipelineStage(stage_mod, stage_index=info.rank, num_stages=info.world_size, device=info.device)
    schedule = ScheduleGPipe(stage, n_microbatches=args.microbatches, loss_fn=loss_fn)
    opt = torch.optim.AdamW(stage_mod.parameters(), lr=args.lr)
    losses, seconds = [], []
    for step in range(args.steps):
        tokens, targets = (t.to(info.device) for t in make_batch(args, step))
        opt.zero_grad()
        t0 = time.perf_counter()
        mb_losses: list[torch.Tensor] = []
        if info.is_first and info.is_last:  # one process: a one-stage pipeline
            schedule.step(tokens, target=targets, losses=mb_losses)
        elif info.is_first:  # only stage 0 feeds the input
            schedule.step(tokens)
        elif info.is_last:  # only the last stage sees targets and the per-microbatch losses
            schedule.step(target=targets, losses=mb_losses)
        else:
            schedule.step()
        opt.step()
        seconds.append(time.perf_counter() - t0)
        losses.append(mean_loss(mb_losses) if mb_losses else float("nan"))
    return losses, seconds
# [end-pipeline]


def compare(stage_mod, reference, rank) -> dict:
    """Max difference between this stage's gradients/weights and the same-named reference ones."""
    ref = dict(reference.named_parameters())
    grad_diff = weight_diff = 0.0
    names = []
    for name, p in stage_mod.named_parameters():
        names.append(name)
        grad_diff = max(grad_diff, (p.grad - ref[name].grad).abs().max().item())
        weight_diff = max(weight_diff, (p.detach() - ref[name].detach()).abs().max().item())
    return {"rank": rank, "params": names, "max_grad_diff": grad_diff, "max_weight_diff": weight_diff}


def main(argv=None) -> int:
    args = parse_args(argv)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    try:
        validate(args, world_size)
    except ValueError as err:
        print(f"{os.path.basename(__file__)}: error: {err}", file=sys.stderr)
        return 2
    info = ppdist.setup(args.device, timeout_s=args.timeout)
    try:
        dtype = DTYPES[args.dtype]
        cfg = GPTConfig(vocab_size=args.vocab, dim=args.dim, n_layers=args.layers, n_heads=args.heads, max_seq_len=args.seq_len)
        full = build_model(cfg, seed=args.seed, dtype=dtype).to(info.device)  # identical on every rank
        reference = copy.deepcopy(full)
        ref_losses = train_reference(reference, args, info.device)

        stage_mod = stage_module(full, info.rank, info.world_size)
        losses, seconds = train_pipeline(stage_mod, args, info)

        mine = compare(stage_mod, reference, info.rank)
        mine.update(losses=losses, seconds=seconds)
        everyone = [None] * info.world_size
        torch.distributed.all_gather_object(everyone, mine)
        pipe_losses = everyone[-1]["losses"]  # the last stage computed them
        loss_diff = max(abs(a - b) for a, b in zip(pipe_losses, ref_losses))
        tol = 1e-5 if dtype == torch.float32 else 1e-10
        ok = loss_diff <= tol and all(r["max_grad_diff"] <= tol and r["max_weight_diff"] <= tol for r in everyone)
        if info.rank == 0:
            layers = assign_layers(args.layers, info.world_size)
            for r in everyone:
                print(f"stage {r['rank']}: layers {layers[r['rank']]}, {len(r['params'])} tensors, "
                      f"max |grad - ref| = {r['max_grad_diff']:.2e}, max |weight - ref| = {r['max_weight_diff']:.2e}")
            for step, (a, b) in enumerate(zip(pipe_losses, ref_losses)):
                print(f"step {step}: pipeline loss {a:.6f}   one-process loss {b:.6f}")
            print("MATCH: the pipeline reproduces the one-process run" if ok else "MISMATCH: pipeline and one-process run differ")
            if args.json:
                result = {
                    "world_size": info.world_size, "backend": info.backend, "device": str(info.device),
                    "microbatches": args.microbatches, "batch_size": args.batch_size, "dtype": args.dtype,
                    "layers_per_stage": layers, "pipeline_losses": pipe_losses, "reference_losses": ref_losses,
                    "max_loss_diff": loss_diff, "stages": everyone, "match": ok, "tolerance": tol,
                    "torch_version": torch.__version__,
                }
                with open(args.json, "w") as f:
                    json.dump(result, f, indent=1)
        return 1 if (args.check and not ok) else 0
    finally:
        ppdist.teardown()


if __name__ == "__main__":
    sys.exit(main())
