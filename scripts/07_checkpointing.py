"""Checkpointing a pipeline: every rank saves its stage with torch.distributed.checkpoint, a resume
(at the same or another number of stages, or in one process) continues bit for bit, and a rank
killed mid-run costs only the steps since the last checkpoint.

CPU, two stages, a checkpoint every 2 steps, the newest 2 kept (gloo):
    torchrun --standalone --nproc-per-node 2 scripts/07_checkpointing.py --steps 6 --save-dir ckpt --save-every 2 --check
Resume from the newest checkpoint at four stages (resharding), and at three (uneven stages):
    torchrun --standalone --nproc-per-node 4 scripts/07_checkpointing.py --steps 9 --save-dir ckpt --resume --check
One process, no process group at all (the whole model):
    python scripts/07_checkpointing.py --steps 9 --save-dir ckpt --resume --check
Survive a crash: rank 1 SIGKILLs itself in step 5, torchrun restarts the group once, and the
restarted ranks resume from the newest complete checkpoint:
    torchrun --standalone --nproc-per-node 2 --max-restarts 1 scripts/07_checkpointing.py \\
        --steps 8 --save-dir ckpt --save-every 2 --resume --kill-rank 1 --kill-at-step 5 --check
    (the same with PPBOOK_KILL=1:5 in the environment; PPBOOK_KILL=1:4:save kills rank 1 during the
    save after step 4, before the commit)
Hugging Face in and out (needs safetensors): start from a Llama folder saved by transformers (its
shape comes from its config.json; each rank reads only its own tensors), and write the trained
model as a folder that LlamaForCausalLM.from_pretrained loads, each rank its own stage's file:
    torchrun --standalone --nproc-per-node 2 scripts/07_checkpointing.py --from-hf hf-in --steps 4 \\
        --save-dir ckpt-llama --save-every 4 --to-hf hf-out --check
    (hf-in from save_pretrained, or `hf download TinyLlama/TinyLlama-1.1B-Chat-v1.0 --local-dir hf-in`
    with --seq-len 128; the book's own Llama from the seed instead: --model llama). Loads: Llama 1
    and 2, TinyLlama, Llama 3.0, and Llama 3.1, 3.2 and 3.3 (rope_type "llama3"); other rotary
    scalings and other architectures are refused in one line. A folder whose head is tied to its
    embedding (tie_word_embeddings, as Llama 3.2 1B and 3B) stays tied: the first and last stages
    hold a copy each and add their gradients every step, and --to-hf writes it tied. Memory: with
    --check every rank also trains the whole model in one process (weights, gradients, two Adam
    moments: 16 bytes a parameter in float32, about 18 GB for TinyLlama's 1.1B parameters); leave
    --check out on a large model.
GPUs (NCCL): add --device cuda.

``--check`` trains the full model in one process from step 0 on every rank and fails unless this
run's weights, optimizer state and learning rates equal it to the last bit.
``--optim-state nested`` saves the optimizer state the default (nested) way: the pitfall.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
from tqdm import tqdm  # not tqdm.auto: under a notebook it warns with the build machine's path

from ppbook import checkpoint as ckpt
from ppbook import dist as ppdist
from ppbook import cli, driver, hf, workload
from ppbook import precision
from ppbook.models import LlamaConfig, build_model
from ppbook.stages import assign_layers, stage_module
from ppbook.training import warmup_cosine

SCRIPT = "07_checkpointing.py"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    cli.add_common_args(p, mixed_precision=True)
    p.add_argument("--model", choices=["gpt", "llama"], default="gpt", help="the book's GPT or Llama (--from-hf: Llama)")
    p.add_argument("--from-hf", default=None, metavar="DIR",
                   help="start from the weights of a Hugging Face Llama folder (config.json, *.safetensors), "
                        "each rank reading only its stage's tensors; the model's shape comes from its config.json "
                        "(a head tied to the embedding stays tied: its two copies get the sum of their gradients)")
    p.add_argument("--to-hf", default=None, metavar="DIR",
                   help="after the run, write the last step's checkpoint as a Hugging Face folder that "
                        "transformers loads (model.safetensors, config.json)")
    p.add_argument("--steps", type=int, default=6, help="train until this many optimizer steps are done in all")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (AdamW)")
    p.add_argument("--lr-warmup", type=int, default=2, help="steps of linear warm-up, then cosine decay")
    p.add_argument("--lr-horizon", type=int, default=100, help="steps over which the cosine decays to 10%%")
    p.add_argument("--save-dir", default=None, help="folder of the checkpoints (step-NNNNNN sub-folders)")
    p.add_argument("--save-every", type=int, default=0, help="save after every this many steps (0: never)")
    p.add_argument("--keep", type=int, default=2, help="keep the newest this many checkpoints")
    p.add_argument("--resume", nargs="?", const="latest", default=None,
                   help="resume from the newest checkpoint in --save-dir (none yet: start fresh), or from this folder")
    p.add_argument("--optim-state", choices=["flat", "nested"], default="flat",
                   help="optimizer state layout in the checkpoint; nested is the default of get_state_dict and fails")
    kill = os.environ.get("PPBOOK_KILL", "")  # RANK:STEP or RANK:STEP:save
    parts = kill.split(":") if kill else []
    if parts and not (len(parts) in (2, 3) and all(x.isdigit() for x in parts[:2]) and parts[2:] in ([], ["save"])):
        p.error(f"PPBOOK_KILL={kill!r}: expected RANK:STEP or RANK:STEP:save, e.g. PPBOOK_KILL=1:5")
    p.add_argument("--kill-rank", type=int, default=int(parts[0]) if parts else None,
                   help="fault injection: this rank SIGKILLs itself (first attempt only; env PPBOOK_KILL)")
    p.add_argument("--kill-at-step", type=int, default=int(parts[1]) if len(parts) > 1 else None,
                   help="... at the start of this step (1-based)")
    p.add_argument("--kill-during-save", action="store_true", default=len(parts) > 2 and parts[2] == "save",
                   help="... instead during the save after that step, after writing its shard, before the commit")
    return p.parse_args(argv)


def validate(args: argparse.Namespace, world_size: int) -> None:
    args.hf_tied = False
    if args.from_hf:  # the model's shape is the folder's: a folder the book's Llama cannot load is refused here
        cfg, args.hf_tied = hf.read_folder(args.from_hf)
        args.model, args.vocab, args.dim, args.layers, args.heads = "llama", cfg.vocab_size, cfg.dim, cfg.n_layers, cfg.n_heads
        if args.seq_len > cfg.max_seq_len:
            raise ValueError(f"--seq-len {args.seq_len} exceeds the {cfg.max_seq_len} positions of {args.from_hf}")
    cli.validate_common(args, world_size)
    if args.to_hf and args.model != "llama":
        raise ValueError("--to-hf writes a Llama as a Hugging Face folder: add --model llama (or --from-hf)")
    if args.save_every < 0 or args.keep < 1 or args.lr_warmup < 0 or args.lr_horizon < 1:
        raise ValueError(f"--save-every must be at least 0, --keep and --lr-horizon at least 1, --lr-warmup at least 0; "
                         f"got {args.save_every}, {args.keep}, {args.lr_horizon}, {args.lr_warmup}")
    if args.save_every and not args.save_dir:
        raise ValueError("--save-every needs --save-dir: where should the checkpoints go?")
    if args.save_dir and os.path.exists(args.save_dir) and not os.path.isdir(args.save_dir):
        raise ValueError(f"--save-dir {args.save_dir} is a file; give a folder (it is created if missing)")
    if (args.kill_rank is None) != (args.kill_at_step is None):
        raise ValueError("fault injection needs both --kill-rank and --kill-at-step (or PPBOOK_KILL=RANK:STEP)")
    if args.kill_rank is not None:
        if not 0 <= args.kill_rank < world_size or not 1 <= args.kill_at_step <= args.steps:
            raise ValueError(f"--kill-rank must be in [0, {world_size}) and --kill-at-step in [1, {args.steps}], "
                             f"got {args.kill_rank} and {args.kill_at_step}")
        if args.kill_during_save and not (args.save_every and args.kill_at_step % args.save_every == 0):
            raise ValueError(f"--kill-during-save needs a save after step {args.kill_at_step}: make it a multiple "
                             f"of --save-every {args.save_every}")
    rank = int(os.environ.get("RANK", "0"))
    if args.save_dir and args.save_every and rank == 0:  # rank 0 commits: one job per folder while it lives
        args.writer_lock = ckpt.lock_writer(args.save_dir)  # held until this process ends, however it ends
    # Resolved before any process group exists: a corrupted checkpoint is refused in one line.
    quiet = rank != 0
    args.resume_path = ckpt.find_resume(args.save_dir, args.resume, report=(lambda _: None) if quiet else print)


def make_optimizer(model, args):
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    # the horizon, not --steps: a run stopped early and resumed follows the same schedule
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: warmup_cosine(s, args.lr_warmup, args.lr_horizon))
    return optimizer, scheduler


def first_attempt() -> bool:
    # torchrun counts restarts; the injected fault must not fire again in the restarted group
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0


def maybe_kill(args, info, step: int, during_save: bool) -> None:
    if (args.kill_rank == info.rank and args.kill_at_step == step and args.kill_during_save == during_save
            and first_attempt()):
        where = f"during the save after step {step}, its shard written, before the commit" if during_save \
            else f"at the start of step {step}"
        print(f"[fault injection] rank {info.rank}: SIGKILL {where}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


def llama_config(args) -> LlamaConfig:
    if args.from_hf:
        return hf.read_config(args.from_hf)[0]
    kv_heads = args.heads // 2 if args.heads % 2 == 0 else args.heads  # grouped-query attention when it can
    return LlamaConfig(vocab_size=args.vocab, dim=args.dim, n_layers=args.layers, n_heads=args.heads,
                       n_kv_heads=kv_heads, max_seq_len=args.seq_len)


# [start-tied]
def add_tied_grads(model, pair) -> None:
    """A head tied to the embedding is two copies, on the first and the last
    stage (chapter 4): give each the sum of both gradients, the gradient of
    one shared matrix, so that the copies stay equal to the last bit."""
    emb, head = getattr(model, "tok_embeddings", None), getattr(model, "output", None)
    if emb is not None and head is not None:  # one stage holds both copies
        total = emb.weight.grad + head.weight.grad
        emb.weight.grad, head.weight.grad = total, total.clone()
    elif emb is not None or head is not None:  # the first or the last stage
        mine = emb if emb is not None else head  # a middle stage holds neither
        dist.all_reduce(mine.weight.grad, group=pair)  # comm: add the two copies
# [end-tied]


# [start-build]
def build(args, info, staged: bool):
    """This rank's stage (or, not staged, the full model), from the
    seed or from a Hugging Face folder; float32 under --dtype bfloat16."""
    dtype = precision.param_dtype(args.dtype)
    rank, p = (info.rank, info.world_size) if staged else (0, 1)
    if args.from_hf:  # reads only this stage's tensors from the safetensors
        return hf.load_stage(args.from_hf, rank, p, dtype=dtype, device=info.device)
    if args.model == "gpt":
        model = workload.full_model(args, info.device)
    else:
        model = build_model(llama_config(args), args.seed, dtype).to(info.device)
    return stage_module(model, rank, p) if staged else model
# [end-build]


def reference_digest(args, info) -> dict[str, str]:
    """The full model trained in one process from step 0, uninterrupted: what every run must equal."""
    device = info.device
    model = build(args, info, staged=False)
    optimizer, scheduler = make_optimizer(model, args)
    for step in range(args.steps):
        tokens, targets = workload.make_batch(args, step, device)
        optimizer.zero_grad(set_to_none=True)
        with precision.autocast(device, args.dtype):  # one region per step: autocast caches cast weights
            workload.reference_backward(model, tokens, targets, args.microbatches)
        if args.hf_tied:
            add_tied_grads(model, None)
        optimizer.step()
        scheduler.step()
    return ckpt.digest(model, optimizer)


def body(args: argparse.Namespace, info) -> int:
    staged = dist.is_initialized()  # False: one plain process, the whole model, no process group
    if not staged:
        # torchrun gives each rank one thread; with more, matrix products add up in another order
        # and the last bits differ from a checkpoint written under torchrun
        torch.set_num_threads(1)
    log = tqdm.write if info.is_last else (lambda _: None)  # the last stage sees the losses
    model = build(args, info, staged)
    options = ckpt.FLAT if args.optim_state == "flat" else ckpt.NESTED
    # [start-resume]
    optimizer, scheduler = make_optimizer(model, args)
    train = {"step": 0, "data_position": 0}
    # any number of stages wrote it; we ask for our tensors by name
    if args.resume_path is not None:
        train = ckpt.load(args.resume_path, model, optimizer, scheduler, options=options)
        log(f"resumed from {args.resume_path} at step {train['step']} "
            f"(saved by {train['world_size']} ranks, loaded by {info.world_size})")
    # [end-resume]
    # the two ranks that hold a copy of a tied matrix (every rank must call new_group)
    pair = dist.new_group([0, info.world_size - 1]) if args.hf_tied and staged and info.world_size > 1 else None
    if staged:
        stage = PipelineStage(model, stage_index=info.rank, num_stages=info.world_size, device=info.device)
        schedule = ScheduleGPipe(stage, n_microbatches=args.microbatches, loss_fn=workload.loss_fn)
    step, position, losses, saved = train["step"], train["data_position"], {}, []
    start = step
    for _ in tqdm(range(step, args.steps), disable=not info.is_last or None, desc="steps"):
        maybe_kill(args, info, step + 1, during_save=False)
        tokens, targets = workload.make_batch(args, position, info.device)  # (B, T) each: batch number `position`
        optimizer.zero_grad(set_to_none=True)
        with precision.autocast(info.device, args.dtype):  # a no-op unless --dtype bfloat16
            if staged:
                mb_losses = driver.schedule_step(schedule, info, tokens, targets)
                loss = workload.mean_loss(mb_losses) if mb_losses else None
            else:
                loss = workload.reference_backward(model, tokens, targets, args.microbatches)
        if args.hf_tied:
            add_tied_grads(model, pair)
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        step, position = step + 1, position + 1
        losses[step] = loss
        if loss is not None:
            log(f"step {step}: loss {loss:.6f}  lr {lr:.2e}")
        # [start-save]
        if args.save_every and step % args.save_every == 0:
            t0 = time.perf_counter()
            path = ckpt.save(
                args.save_dir,
                step,
                model,
                optimizer,
                scheduler,
                {"data_position": position},
                keep=args.keep,
                options=options,
                before_commit=lambda tmp: maybe_kill(
                    args, info, step, during_save=True
                ),
            )
            saved.append({"path": str(path), "seconds": time.perf_counter() - t0})
            log(f"saved {path} (newest {args.keep} kept)")
        # [end-save]

    if args.to_hf:  # every rank writes its own stage's file, in parallel: nothing is gathered
        rope = hf.read_rope(args.from_hf) if args.from_hf else None  # a Llama 3.1's scaling stays
        hf.save_stages(model, llama_config(args), args.to_hf, tied=args.hf_tied, rope=rope)
    mine = {"digest": ckpt.digest(model, optimizer), "rng": torch.rand(1).item(), "losses": losses}
    everyone = ppdist.gather_to_rank0(mine) if staged else [mine]
    ok = None
    if args.check:
        ref = reference_digest(args, info)
        ok = all(ref[k] == v for k, v in mine["digest"].items())
        if staged:
            flags = [None] * info.world_size
            dist.all_gather_object(flags, ok)
            ok = all(flags)
    if info.rank != 0:
        return 0 if ok in (None, True) else 1
    if args.to_hf:
        print(f"wrote {args.to_hf}: step {args.steps} as Hugging Face safetensors, one file per stage, and config.json"
              + (" (head tied to the embedding)" if args.hf_tied else ""))
    merged = {k: v for e in everyone for k, v in e["digest"].items()}
    if ok is not None:
        print("MATCH: bitwise equal to the full model trained in one process without interruption" if ok
              else "MISMATCH: this run differs from the uninterrupted one-process run")
    cli.write_json(args.json, {
        "world_size": info.world_size, "process_group": staged, "layers_per_stage": assign_layers(args.layers, info.world_size),
        "start_step": start, "steps": args.steps, "dtype": args.dtype, "model": args.model, "to_hf": args.to_hf, "tied": args.hf_tied, "resumed_from": str(args.resume_path) if args.resume_path else None,
        "losses": {str(k): v for k, v in everyone[-1]["losses"].items()}, "saved": saved,
        "digest": merged, "rng_after": [e["rng"] for e in everyone], "match": ok, "torch_version": torch.__version__})
    return 1 if ok is False else 0


def main(argv=None) -> int:
    try:
        return cli.run(SCRIPT, parse_args(argv), validate, body, process_group=False)
    except ckpt.CheckpointError as err:  # found at load time (e.g. a file changed after validation)
        print(f"{SCRIPT}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
