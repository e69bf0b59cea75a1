"""Pretrain the book's Llama model through a pipeline: real text, AdamW, linear warmup then
cosine decay, gradient clipping by the global norm, and evaluation on held-out text through
the pipeline (forward only).

CPU, two stages, GPipe (gloo; the first run trains and caches the BPE tokenizer):
    torchrun --standalone --nproc-per-node 2 scripts/06_train.py --steps 200 --eval-every 50
CPU, three stages, 1F1B, checked against the same model trained in one process:
    torchrun --standalone --nproc-per-node 3 scripts/06_train.py --schedule 1f1b --steps 5 --check
One process, no torchrun (a one-stage pipeline):
    python scripts/06_train.py --steps 20
Mixed precision (float32 weights and AdamW state, bfloat16 compute), checked against one process
under the same precision:
    torchrun --standalone --nproc-per-node 2 scripts/06_train.py --dtype bfloat16 --steps 5 --check
GPUs, one node with 8 GPUs (NCCL), a bigger model and batch:
    torchrun --standalone --nproc-per-node 8 scripts/06_train.py --device cuda --layers 32 --dim 1024 \\
        --heads 16 --kv-heads 4 --vocab 8192 --seq-len 512 --batch-size 64 --microbatches 32 --schedule 1f1b \\
        --dtype bfloat16
The seed's Hugging Face path (needs `pip install datasets` and a network; not run by the book):
    torchrun --standalone --nproc-per-node 4 scripts/06_train.py --dataset HuggingFaceFW/fineweb-edu \\
        --dataset-config sample-10BT --tokenizer-file tokenizer.json --vocab 128256

Every rank loads the same data and builds the full model from ``--seed``, then keeps its stage.
The last stage shows a progress bar with the running loss; ``--json`` writes every step's loss,
learning rate and gradient norms (global and per stage) and every evaluation.
``--check`` accepts differences up to ``ppbook.precision.tolerance(dtype)``: 1e-5 in float32; 2e-2
under bfloat16, a few rounding units of bfloat16 (2^-8), because pipeline and reference do the same
operations but a GPU library may pick another kernel (another rounding) for another shape; on a CPU
they agree to the last bit.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from tqdm import tqdm

from ppbook import data as ppdata
from ppbook import dist as ppdist
from ppbook import cli, driver
from ppbook import precision
from ppbook.models import LlamaConfig, build_model
from ppbook.stages import assign_layers, stage_module
from ppbook.training import TokenMeanLoss, TrainState, clip_grad_norm_global, warmup_cosine

SCHEDULE_CLASSES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    cli.add_common_args(p, batch_size=16, seq_len=64, layers=4, dim=64, mixed_precision=True)
    p.set_defaults(vocab=512)
    p.add_argument("--kv-heads", type=int, default=2, help="key/value heads (grouped-query attention)")
    p.add_argument("--schedule", choices=sorted(SCHEDULE_CLASSES), default="gpipe")
    p.add_argument("--steps", type=int, default=40, help="optimizer steps")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (AdamW)")
    p.add_argument("--min-lr-ratio", type=float, default=0.1, help="final learning rate as a fraction of --lr")
    p.add_argument("--warmup-steps", type=int, default=10, help="linear warmup, then cosine decay to the last step")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0, help="clip gradients to this global norm (0: no clipping)")
    p.add_argument("--eval-every", type=int, default=20, help="evaluate every this many steps (0: only at the end)")
    p.add_argument("--eval-batches", type=int, default=4, help="held-out batches per evaluation (0: all)")
    p.add_argument("--eval-impl", choices=["schedule", "stages"], default="schedule",
                   help="forward only with schedule.eval (torch 2.13 has it) or by sending through the stages by hand")
    p.add_argument("--data", default=None, help="a UTF-8 text file (default: the corpus shipped with the book)")
    p.add_argument("--tokenizer-file", default=None, help="a Hugging Face tokenizer.json (default: BPE trained on the data)")
    p.add_argument("--cache-dir", default=None, help="where the trained tokenizer is cached (default: _build/cache)")
    p.add_argument("--dataset", default=None, help="a Hugging Face datasets name instead of --data (downloads it)")
    p.add_argument("--dataset-config", default=None)
    p.add_argument("--text-field", default="text")
    return p.parse_args(argv)


def validate(args: argparse.Namespace, world_size: int) -> None:
    cli.validate_common(args, world_size)
    if args.schedule == "1f1b" and args.microbatches < world_size:
        raise ValueError(f"1F1B needs at least as many microbatches as stages: --microbatches {args.microbatches} < "
                         f"{world_size} stages; raise --microbatches or use --schedule gpipe")
    if args.heads % args.kv_heads:
        raise ValueError(f"--heads {args.heads} must be divisible by --kv-heads {args.kv_heads}")
    for name in ("lr", "clip", "min_lr_ratio", "weight_decay"):
        if getattr(args, name) < 0 or (name == "lr" and args.lr == 0):
            raise ValueError(f"--{name.replace('_', '-')} must be {'positive' if name == 'lr' else 'at least 0'}, "
                             f"got {getattr(args, name)}")
    if args.warmup_steps < 1 or args.eval_every < 0 or args.eval_batches < 0:
        raise ValueError("--warmup-steps must be at least 1, --eval-every and --eval-batches at least 0")
    if args.dataset and not args.tokenizer_file:
        raise ValueError("--dataset needs --tokenizer-file (the model's tokenizer.json)")
    # the data, before any process group: a missing file or a mismatched tokenizer is one line
    if args.dataset:  # pragma: no cover (network)
        args.dataset_ = ppdata.load_hub(args.dataset, args.tokenizer_file, args.seq_len, args.vocab,
                                        config=args.dataset_config, text_field=args.text_field)
    else:
        args.dataset_ = ppdata.load_local(args.seq_len, args.vocab, args.data, args.tokenizer_file, args.cache_dir)
    if len(args.dataset_.eval[0]) < args.batch_size:  # evaluation runs whole batches through the same schedule
        raise ValueError(f"only {len(args.dataset_.eval[0])} held-out rows of --seq-len {args.seq_len}, fewer than "
                         f"--batch-size {args.batch_size}; lower --batch-size or give more text with --data")
    ppdata.Batches(*args.dataset_.train, args.batch_size, args.seed)  # enough training rows


def llama_config(args) -> LlamaConfig:
    ffn = -(-8 * args.dim // 3 // 16) * 16  # SwiGLU width: about 8/3 * dim, a multiple of 16
    return LlamaConfig(vocab_size=args.vocab, dim=args.dim, n_layers=args.layers, n_heads=args.heads,
                       n_kv_heads=args.kv_heads, ffn_hidden_dim=ffn, max_seq_len=args.seq_len)


def optimizer_and_scheduler(params, args):
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: warmup_cosine(s, args.warmup_steps, args.steps, args.min_lr_ratio))
    return opt, sched


def held_out_batches(dataset, args, device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The held-out batches, on the stage's device: evaluation hands them to the schedule."""
    return [ppdist.on_device(device, *batch)  # tokens (B, T), targets (B, T)
            for batch in ppdata.eval_batches(*dataset.eval, args.batch_size, args.eval_batches)]


# [start-eval]
@torch.no_grad()
def forward_only_by_hand(
    stage_mod, info, tokens, targets, m, loss_fn
) -> list[torch.Tensor]:
    """Forward only, for any torch version: each
    stage receives, computes, sends; no backward."""
    losses = []
    # (B/m, T) each
    for mb_tokens, mb_targets in zip(tokens.chunk(m), targets.chunk(m)):
        if info.is_first:
            x = mb_tokens
        else:
            x = torch.empty(*mb_tokens.shape, stage_mod.cfg.dim, device=info.device,
                            dtype=next(stage_mod.parameters()).dtype)  # (B/m, T, C)
            # comm: activation from the previous stage
            dist.recv(x, src=info.rank - 1)
        y = stage_mod(x)                                     # compute: forward only
        if info.is_last:
            losses.append(loss_fn(y, mb_targets))
        else:
            # comm: activation to the next stage
            dist.send(y, dst=info.rank + 1)
    return losses


def evaluate(schedule, stage_mod, info, batches, loss_fn, args) -> float | None:
    """Token-mean loss over the held-out batches,
    through the pipeline (last stage; else None)."""
    total, count = 0.0, 0
    for tokens, targets in batches:
        n = loss_fn.set_batch(targets)  # this batch's scored tokens
        if args.eval_impl == "schedule":
            with torch.no_grad(), precision.autocast(info.device, args.dtype):
                losses = driver.schedule_step(
                    schedule, info, tokens, targets, forward_only=True
                )
        else:
            with precision.autocast(info.device, args.dtype):
                losses = forward_only_by_hand(
                    stage_mod, info, tokens, targets, args.microbatches, loss_fn
                )
        if info.is_last:
            total += torch.stack(losses).sum().item() * n
            count += n
    return total / count if info.is_last else None
# [end-eval]


def train(args, info, dataset) -> tuple[TrainState, precision.MasterWeights]:
    """The pipelined run. Returns the loop's state (metrics included) and this rank's stage with
    its float32 weights (``.module``, ``.named_parameters()``)."""
    # [start-setup]
    full = build_model(
        llama_config(args), seed=args.seed, dtype=precision.param_dtype(args.dtype)
    )  # same on every rank
    stage_mod = stage_module(full, info.rank, info.world_size).to(info.device)
    # bfloat16: the stage computes with bfloat16 copies, AdamW steps float32 masters
    master = precision.MasterWeights(stage_mod, args.dtype)
    stage = PipelineStage(
        stage_mod, stage_index=info.rank, num_stages=info.world_size, device=info.device
    )
    loss_fn = TokenMeanLoss()
    schedule = SCHEDULE_CLASSES[args.schedule](
        stage,
        n_microbatches=args.microbatches,
        loss_fn=loss_fn,
        # the loss is already divided by the batch's tokens
        scale_grads=False,
    )
    params = master.parameters()  # the stage's own parameters in float32
    optimizer, scheduler = optimizer_and_scheduler(params, args)
    batches = ppdata.Batches(*dataset.train, args.batch_size, args.seed)
    held_out = held_out_batches(dataset, args, info.device)
    state = TrainState()
    # [end-setup]
    # [start-loop]
    bar = tqdm(
        range(state.step, args.steps),
        desc=f"{args.schedule} p={info.world_size}",
        disable=not info.is_last or bool(os.environ.get("TQDM_DISABLE")),
        dynamic_ncols=True,
    )
    running = None
    for step in bar:
        t0 = time.perf_counter()
        # (B, T) each, the same batch on every rank
        tokens, targets = ppdist.on_device(info.device, *batches.next())
        # how many tokens count in this batch
        loss_fn.set_batch(targets)
        optimizer.zero_grad(set_to_none=True)
        # bfloat16 compute, float32 weights
        with precision.autocast(info.device, args.dtype):
            mb_losses = driver.schedule_step(schedule, info, tokens, targets)
        master.gradients_to_masters()
        # comm: all-reduce of squared norms
        norm, stage_norm = clip_grad_norm_global(params, args.clip)
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        master.masters_to_compute()  # one cast per weight per step
        scheduler.step()
        record = {"step": step, "lr": lr, "grad_norm": norm, "stage_norm": stage_norm,
                  "seconds": time.perf_counter() - t0}
        # only the last stage has the loss
        if info.is_last:
            record["loss"] = torch.stack(mb_losses).sum().item()  # = the batch's token mean
            running = (
                record["loss"]
                if running is None
                else 0.9 * running + 0.1 * record["loss"]
            )
            bar.set_postfix(loss=f"{running:.3f}", lr=f"{lr:.1e}")
        state.train.append(record)
        state.step, state.data = step + 1, batches.state_dict()
        if ((args.eval_every and state.step % args.eval_every == 0)
                or state.step == args.steps):
            state.eval.append({
                "step": state.step,
                "loss": evaluate(schedule, stage_mod, info, held_out, loss_fn, args),
            })
    # [end-loop]
    return state, master


def train_one_process(args, dataset, device) -> tuple[dict, torch.nn.Module]:
    """The same model trained in one process: same seed, same batches in the same order, the same
    microbatches, the same loss, ``clip_grad_norm_`` and optimizer."""
    model = build_model(llama_config(args), seed=args.seed, dtype=precision.param_dtype(args.dtype)).to(device)
    master = precision.MasterWeights(model, args.dtype)
    optimizer, scheduler = optimizer_and_scheduler(master.parameters(), args)
    batches = ppdata.Batches(*dataset.train, args.batch_size, args.seed)
    held_out = held_out_batches(dataset, args, device)
    loss_fn, m = TokenMeanLoss(), args.microbatches
    out = {"loss": [], "grad_norm": [], "eval": []}
    for step in range(args.steps):
        tokens, targets = ppdist.on_device(device, *batches.next())
        loss_fn.set_batch(targets)
        optimizer.zero_grad(set_to_none=True)
        mb_losses = []
        for mb_tokens, mb_targets in zip(tokens.chunk(m), targets.chunk(m)):
            with precision.autocast(device, args.dtype):
                mb_losses.append(loss_fn(model(mb_tokens), mb_targets))
            mb_losses[-1].backward()
        master.gradients_to_masters()
        out["grad_norm"].append(torch.nn.utils.clip_grad_norm_(master.parameters(), args.clip or float("inf")).item())
        out["loss"].append(torch.stack(mb_losses).sum().item())
        optimizer.step()
        master.masters_to_compute()
        scheduler.step()
        if (args.eval_every and (step + 1) % args.eval_every == 0) or step + 1 == args.steps:
            with torch.no_grad(), precision.autocast(device, args.dtype):
                total, count = 0.0, 0
                for tokens, targets in held_out:
                    n = loss_fn.set_batch(targets)
                    total += torch.stack([loss_fn(model(t), g)
                                          for t, g in zip(tokens.chunk(m), targets.chunk(m))]).sum().item() * n
                    count += n
                out["eval"].append(total / count)
    return out, master


def body(args: argparse.Namespace, info) -> int:
    dataset = args.dataset_
    t0 = time.perf_counter()
    state, stage_master = train(args, info, dataset)
    seconds = time.perf_counter() - t0
    mine = {"rank": info.rank, "stage_norms": [r["stage_norm"] for r in state.train],
            "params": [n for n, _ in stage_master.named_parameters()]}
    if args.check:
        ref, ref_master = train_one_process(args, dataset, info.device)
        ref_params = dict(ref_master.named_parameters())  # float32 masters on both sides
        mine["max_weight_diff"] = max((p.detach() - ref_params[n].detach()).abs().max().item()
                                      for n, p in stage_master.named_parameters())
    everyone = [None] * info.world_size
    dist.all_gather_object(everyone, mine)
    last = [None] * info.world_size
    dist.all_gather_object(last, state.to_json() if info.is_last else None)
    metrics = last[-1]  # the last stage's records carry the losses
    if info.rank != 0:
        return 0
    out = {
        "world_size": info.world_size, "schedule": args.schedule, "microbatches": args.microbatches,
        "batch_size": args.batch_size, "seq_len": args.seq_len, "steps": args.steps, "dtype": args.dtype,
        "layers_per_stage": assign_layers(args.layers, info.world_size), "data": dataset.describe(),
        "train": metrics["train"], "eval": metrics["eval"], "stages": everyone, "seconds": seconds,
        "clip": args.clip, "torch_version": torch.__version__,
    }
    print(f"{args.steps} steps in {seconds:.1f} s on {info.world_size} stage(s), {args.schedule}, "
          f"m={args.microbatches}: train loss {out['train'][0]['loss']:.3f} -> {out['train'][-1]['loss']:.3f}, "
          f"eval loss {out['eval'][0]['loss']:.3f} (step {out['eval'][0]['step']}) -> "
          f"{out['eval'][-1]['loss']:.3f} (step {out['eval'][-1]['step']})")
    ok = True
    if args.check:
        tol = precision.tolerance(args.dtype)
        losses = [r["loss"] for r in out["train"]]
        diffs = {"loss": max(abs(a - b) for a, b in zip(losses, ref["loss"])),
                 "grad_norm": max(abs(r["grad_norm"] - b) / b for r, b in zip(out["train"], ref["grad_norm"])),
                 "eval": max(abs(e["loss"] - b) for e, b in zip(out["eval"], ref["eval"])),
                 "weight": max(s["max_weight_diff"] for s in everyone)}
        ok = all(v <= tol for v in diffs.values())
        out.update(reference=ref, diffs=diffs, tolerance=tol)
        print(f"one-process reference: max |loss diff| {diffs['loss']:.1e}, max relative grad-norm diff "
              f"{diffs['grad_norm']:.1e}, max |eval diff| {diffs['eval']:.1e}, max |weight diff| {diffs['weight']:.1e}")
        print("MATCH: the pipeline trains like one process" if ok else "MISMATCH: pipeline and one-process run differ")
    out["match"] = ok if args.check else None
    cli.write_json(args.json, out)
    return 1 if (args.check and not ok) else 0


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # no tokenizer threads competing with the ranks
    return cli.run("06_train.py", args, validate, body)


if __name__ == "__main__":
    sys.exit(main())
