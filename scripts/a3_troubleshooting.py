"""Make one common pipelining mistake on purpose and let torch 2.13 report it (book/a3_troubleshooting.md).

Each ``--mistake`` breaks exactly one rule and skips the book's own argument checks, so what
you see is torch's own message, the one you would meet in your own code. CPU, two processes:
    torchrun --standalone --nproc-per-node 2 scripts/a3_troubleshooting.py --mistake indivisible
    torchrun --standalone --nproc-per-node 2 scripts/a3_troubleshooting.py --mistake hang --timeout 5 --dump-dir _build/a3/flight
    TORCH_LOGS=+pp torchrun --standalone --nproc-per-node 2 scripts/a3_troubleshooting.py --mistake hang --timeout 5
Every mistake exits non-zero; ``--mistake none`` is the same pipeline done right and exits 0
(so is ``target-not-last``: a target given to a rank that is not last is ignored).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys

import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleZBVZeroBubble

from ppbook import dist as ppdist
from ppbook import errors, timeline
from ppbook import cli, driver, workload
from ppbook.stages import placement_problem, stage_module

MISTAKES = ("none", "indivisible", "too-few-microbatches", "wrong-v-placement", "shape-mismatch",
            "target-not-last", "target-positional", "no-target", "hang")
SPARE_BYTES = 2 << 30  # wrong-v-placement: at most 2 GiB more address space than after start-up


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    cli.add_common_args(p, batch_size=8, seq_len=8, layers=4, dim=16)
    p.add_argument("--mistake", choices=MISTAKES, required=True, help="which rule to break")
    p.add_argument("--dump-dir", default=None,
                   help="hang: each rank writes what it completed to DIR/rankN.json (DIR is made if missing)")
    p.add_argument("--no-placement-check", action="store_true",
                   help="wrong-v-placement: skip the book's placement check and let torch run the step (its "
                        "outcome depends on timing: a garbage allocation, or a wait until --timeout)")
    return p.parse_args(argv)


def validate(args: argparse.Namespace, num_stages: int) -> None:
    # deliberately NOT cli.validate_common: it would refuse the mistakes before torch sees them
    if num_stages != 2:
        raise ValueError(f"every mistake is staged on exactly 2 processes, got {num_stages}; use --nproc-per-node 2")
    if args.dump_dir and os.path.exists(args.dump_dir) and not os.path.isdir(args.dump_dir):
        raise ValueError(f"--dump-dir {args.dump_dir} is a file, not a folder; give a folder (made if missing)")
    if args.batch_size % args.microbatches or args.layers < 4 or args.timeout <= 0:
        raise ValueError("start from a correct set-up: --batch-size divisible by --microbatches, --layers at least 4, "
                         "--timeout positive; --mistake then breaks one rule")
    ppdist.pick_device(0, args.device)  # --device cuda with too few GPUs: one line, before any process group


def wrong_v_placement(args, info, tokens, targets) -> int:
    p = info.world_size
    # the mistake: interleaved (0, 2), (1, 3), not stages.stage_indices's V
    mine = (info.rank, info.rank + p)
    stages = [
        PipelineStage(
            stage_module(workload.full_model(args, info.device), s, 2 * p),
            s,
            2 * p,
            info.device,
        )
        for s in mine
    ]
    schedule = ScheduleZBVZeroBubble(
        stages, n_microbatches=args.microbatches, loss_fn=workload.loss_fn
    )
    # Torch checks nothing here; the book's check compares the stages with
    # the map the schedule will send by, before any message is sent.
    problem = placement_problem(schedule)
    if problem and not args.no_placement_check:
        raise ValueError(problem)
    # Unchecked, the ranks exchange the wrong messages: one may read a
    # garbage object size and try to allocate it, or both may wait.
    # Bound this process's memory so that allocation fails at once.
    limit = _address_space() + SPARE_BYTES
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    driver.schedule_step(schedule, info, tokens, targets)
    return 0


def _address_space() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * resource.getpagesize()


def hang(schedule, stage, info, tokens, targets, dump_dir: str | None) -> int:
    """Step 0 runs on both ranks; at step 1 the last rank calls a barrier
    instead of ``step`` (as code that evaluates on the last rank only
    would). Both ranks wait for each other until the process group's
    timeout; each then prints what it last did, like a flight recorder."""
    rec = timeline.Recorder(info.rank)
    rec.attach(stage)
    step = 0
    try:
        for step in range(2):
            rec.start_step()
            if step == 1 and info.is_last:
                # the mistake: a collective rank 0 never joins
                dist.barrier()
            else:
                driver.schedule_step(schedule, info, tokens, targets)
    except Exception as err:
        done = " ".join(e.label for e in rec.events) or "nothing"
        message = errors.without_source_path(str(err).splitlines()[0])
        # one write of the whole line: both ranks may report at the same moment, and
        # print() writes the newline separately, so two ranks' lines could run into one
        sys.stdout.write(
            f"[flight record] rank {info.rank}, step {step}: completed {done}; then "
            f"{type(err).__name__}: {message[:150]}\n"
        )
        sys.stdout.flush()
        if dump_dir:  # one file per rank, readable after every process has died
            os.makedirs(dump_dir, exist_ok=True)
            cli.write_json(
                os.path.join(dump_dir, f"rank{info.rank}.json"),
                {
                    "rank": info.rank,
                    "step": step,
                    "completed": timeline.to_json(rec.events),
                    "error": f"{type(err).__name__}: {message}",
                },
            )
        raise
    return 0


def body(args: argparse.Namespace, info) -> int:
    tokens, targets = workload.make_batch(args, 0, info.device)         # (B, T) each
    if args.mistake == "indivisible":
        tokens, targets = tokens[:-1], targets[:-1]               # the mistake: B-1 rows, not a multiple of m
    if args.mistake == "wrong-v-placement":
        return wrong_v_placement(args, info, tokens, targets)
    if args.mistake == "shape-mismatch" and info.is_last:
        args.dim *= 2                                             # the mistake: stage 1 built for another width
    stage_mod = stage_module(workload.full_model(args, info.device), info.rank, info.world_size)
    stage = PipelineStage(stage_mod, info.rank, info.world_size, info.device)
    m = 1 if args.mistake == "too-few-microbatches" else args.microbatches
    make = Schedule1F1B if args.mistake == "too-few-microbatches" else ScheduleGPipe
    schedule = make(stage, n_microbatches=m, loss_fn=workload.loss_fn)  # 1F1B refuses m < number of stages
    if args.mistake == "hang":
        return hang(schedule, stage, info, tokens, targets, args.dump_dir)
    if args.mistake == "target-not-last":
        schedule.step(tokens, target=targets)                     # every rank passes input and target
    elif args.mistake == "target-positional" and info.is_first:
        schedule.step(tokens, targets)                            # the mistake: targets become a 2nd input
    elif args.mistake == "no-target" and info.is_last:
        schedule.step()                                           # the mistake: the last rank has no target
    else:
        driver.schedule_step(schedule, info, tokens, targets)
    if info.rank == 0:
        print(f"--mistake {args.mistake}: the step completed on every rank")
        cli.write_json(args.json, {"mistake": args.mistake, "completed": True})
    return 0


def main(argv=None) -> int:
    return cli.run("a3_troubleshooting.py", parse_args(argv), validate, body)


if __name__ == "__main__":
    sys.exit(main())
