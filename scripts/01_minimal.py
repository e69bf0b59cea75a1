"""The whole pipeline program a reader writes: a small transformer built from one seed on every
process, cut into one stage per process, trained with ``torch.distributed.pipelining``. It
imports nothing but torch and the standard library: copy it into your own project.

CPU, one process and one stage (no torchrun: the reference the pipeline must equal):
    python scripts/01_minimal.py
CPU, two stages (gloo):
    torchrun --standalone --nproc-per-node 2 scripts/01_minimal.py
GPUs, two stages, one GPU per process (NCCL):
    torchrun --standalone --nproc-per-node 2 scripts/01_minimal.py --device cuda
GPUs, one machine of eight, eight stages (each stage needs a layer of its own):
    torchrun --standalone --nproc-per-node 8 scripts/01_minimal.py --device cuda --layers 8

Each process torchrun starts finds its RANK, WORLD_SIZE and LOCAL_RANK in its environment; it
reads them, joins the process group, keeps its stage of the model and trains it. Started with
plain ``python``, where those variables are absent, it is rank 0 of a world of one: a one-stage
pipeline that holds the whole model. The last stage prints the loss of every step;
``--json PATH`` writes the losses and every parameter after training (rank 0 gathers them),
which tests/test_minimal_pipeline.py compares with one process.
"""

# [start-program]
import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe


class Model(nn.Module):
    """Embedding, layers (a ModuleDict), norm, head; forward skips what is None."""

    def __init__(self, vocab: int, dim: int, heads: int, n_layers: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleDict({str(i): nn.TransformerEncoderLayer(
            dim, heads, 4 * dim, dropout=0.0, batch_first=True, bias=False)
            for i in range(n_layers)})
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, h):                                 # (B, T) ids or (B, T, C)
        if self.embed is not None:
            h = self.embed(h)                             # (B, T, C)
        T = h.shape[1]
        causal = nn.Transformer.generate_square_subsequent_mask(T, device=h.device)
        for layer in self.layers.values():
            h = layer(h, src_mask=causal, is_causal=True)  # (B, T, C)
        if self.norm is not None:
            h = self.norm(h)
        return self.head(h) if self.head is not None else h  # (B, T, vocab) at the end


def cut(model: Model, stage: int, num_stages: int) -> Model:
    """Keep stage ``stage``'s run of layers (names unchanged), delete the rest."""
    n = len(model.layers)
    first, last = stage * n // num_stages, (stage + 1) * n // num_stages
    for name in list(model.layers):
        if not first <= int(name) < last:
            del model.layers[name]
    if stage != 0:
        model.embed = None                                # only stage 0 embeds tokens
    if stage != num_stages - 1:
        model.norm = model.head = None                    # the last stage has the head
    return model


def loss_fn(logits, targets):                             # (B/m, T, vocab), (B/m, T)
    return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def train(args: argparse.Namespace) -> None:
    # === who am I: torchrun gives every process three variables ===
    rank = int(os.environ.get("RANK", 0))              # its place among all processes
    world_size = int(os.environ.get("WORLD_SIZE", 1))  # how many: one stage each
    local_rank = int(os.environ.get("LOCAL_RANK", 0))  # its place on this machine
    # plain python: a world of one, met in memory instead of at torchrun's address
    alone = {} if "RANK" in os.environ else dict(
        store=dist.HashStore(), rank=0, world_size=1)
    if args.device == "cuda":
        device = torch.device("cuda", local_rank)      # one GPU per process
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device, **alone)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", **alone)
    # === the full model from one seed on every rank, then keep this rank's stage ===
    torch.manual_seed(args.seed)
    full = Model(args.vocab, args.dim, args.heads, args.layers)
    stage_mod = cut(full, rank, world_size).to(device)
    stage = PipelineStage(stage_mod, stage_index=rank, num_stages=world_size,
                          device=device)               # its neighbours: r-1, r+1
    schedule = ScheduleGPipe(stage, n_microbatches=args.microbatches,
                             loss_fn=loss_fn)
    opt = torch.optim.AdamW(stage_mod.parameters(), lr=args.lr)  # this stage's
    # === one batch, the same on every rank: tokens and the tokens that follow ===
    rows = torch.randint(args.vocab, (args.batch_size, args.seq_len + 1),
                         generator=torch.Generator().manual_seed(args.seed))
    x = rows[:, :-1].contiguous().to(device)           # (B, T) inputs and targets:
    y = rows[:, 1:].contiguous().to(device)            # contiguous, on the device
    losses = []
    # === train: every step runs m forwards and m backwards on every stage ===
    for step in range(args.steps):
        opt.zero_grad()
        mb_losses = []                                 # filled by the last stage
        inputs = (x,) if rank == 0 else ()             # the batch enters at stage 0
        target = y if rank == world_size - 1 else None  # the loss at the last
        # compute: F and B of each microbatch
        # comm: activations to rank r+1, gradients to rank r-1
        schedule.step(*inputs, target=target, losses=mb_losses)
        opt.step()                                     # compute: update this stage
        if mb_losses:                                  # only the last stage has them
            losses.append(torch.stack(mb_losses).mean().item())
            print(f"step {step}: loss {losses[-1]:.4f}")
    report(args, rank, world_size, stage_mod, losses)  # comm: --json, on rank 0
    dist.destroy_process_group()


def main(argv=None) -> int:
    args = parse_args(argv)  # the flags and their checks follow main in the file
    try:
        validate(args, int(os.environ.get("WORLD_SIZE", 1)))
    except ValueError as err:
        if os.environ.get("RANK", "0") == "0":  # every rank fails it: one prints it
            print(f"01_minimal.py: error: {err}", file=sys.stderr)
        return 2
    train(args)
    return 0
# [end-program]


# === the flags, their checks, and the JSON the book's tests read ===
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=4, help="transformer layers in the full model")
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=8, help="divisible by --microbatches")
    p.add_argument("--microbatches", type=int, default=4, help="m: the batch is cut into this many")
    p.add_argument("--steps", type=int, default=3, help="optimizer steps (AdamW)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cpu: gloo; cuda: NCCL, one GPU per process")
    p.add_argument("--json", default=None, help="write losses and parameters to this path (rank 0)")
    return p.parse_args(argv)


def validate(args: argparse.Namespace, world_size: int) -> None:
    """Refuse a bad combination in one line, before any process group exists."""
    for name in ("layers", "dim", "heads", "vocab", "seq_len", "batch_size", "microbatches", "steps"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.batch_size % args.microbatches:
        raise ValueError(f"--batch-size {args.batch_size} is not divisible by --microbatches {args.microbatches}: "
                         f"every microbatch must have the same size; try --batch-size "
                         f"{-(-args.batch_size // args.microbatches) * args.microbatches}")
    if args.layers < world_size:
        raise ValueError(f"{world_size} processes need at least {world_size} layers (one stage each), got "
                         f"--layers {args.layers}; raise --layers or lower --nproc-per-node")
    if args.dim % args.heads:
        raise ValueError(f"--dim {args.dim} must be divisible by --heads {args.heads}")
    if args.device == "cuda":
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        procs = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        if gpus < procs:
            fix = "drop --device cuda" if gpus == 0 else f"use --nproc-per-node {gpus} or fewer"
            raise ValueError(f"--device cuda: found {gpus} GPU(s) for {procs} process(es) on this machine (one "
                             f"GPU each: NCCL refuses two processes on one GPU); {fix}")
    if args.json and not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
        raise ValueError(f"--json {args.json}: its folder does not exist; create it or pick another path")


def report(args, rank: int, world_size: int, stage_mod: nn.Module, losses: list[float]) -> None:
    """Gather every stage's parameters and the last stage's losses on rank 0 and write ``--json``."""
    mine = {"losses": losses, "layers": list(stage_mod.layers),
            "params": {n: p.detach().cpu().tolist() for n, p in stage_mod.named_parameters()}}
    everyone = [None] * world_size if rank == 0 else None
    dist.gather_object(mine, everyone, dst=0)
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump({"world_size": world_size, "microbatches": args.microbatches, "device": args.device,
                       "torch_version": torch.__version__, "losses": everyone[-1]["losses"],
                       "layers_per_stage": [[int(i) for i in e["layers"]] for e in everyone],
                       "params": {n: v for e in everyone for n, v in e["params"].items()}}, f)


if __name__ == "__main__":
    sys.exit(main())
