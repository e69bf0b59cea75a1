"""GPipe two ways, from scratch (blocking receives, all forwards then all backwards) and with
``torch.distributed.pipelining.ScheduleGPipe``, swept over the number of microbatches, with a
recorded timeline of every step and a check of the gradients against one process.

CPU, two stages, m = 1, 2, 4, 8 in one launch (gloo):
    torchrun --standalone --nproc-per-node 2 scripts/03_gpipe.py --microbatches 1 2 4 8 --check
CPU, four stages:
    torchrun --standalone --nproc-per-node 4 scripts/03_gpipe.py --microbatches 1 4 8 --check
GPUs (NCCL), a larger model:
    torchrun --standalone --nproc-per-node 4 scripts/03_gpipe.py --dim 1024 --layers 8 --batch-size 64 --device cuda

With m = 1 both implementations are the naive model parallelism of chapter 2.
"""

from __future__ import annotations

import argparse
import copy
import sys

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

from ppbook import cli, driver, measure, precision, workload
from ppbook.stages import stage_module
from ppbook.timeline import Recorder

IMPLS = ("scratch", "torch")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # 8 layers: enough work per microbatch at m = 8 that gloo's hand-offs on a 2-core host do
    # not dominate what is being measured (see chapter 3)
    cli.add_common_args(p, microbatches=[1, 2, 4, 8], microbatches_help="one or more values of m to sweep",
                       batch_size=32, seq_len=64, layers=8, dim=128)
    cli.add_timing_args(p)
    p.add_argument("--impl", nargs="+", choices=IMPLS, default=list(IMPLS),
                   help="from-scratch GPipe, torch's ScheduleGPipe, or both")
    return p.parse_args(argv)


# [start-scratch]
def gpipe_step(stage_mod, tokens, targets, m, info, rec: Recorder):
    """One GPipe step by hand: m forwards, then m
    backwards; returns the last rank's m losses."""
    rank, sends, inputs, outputs, losses = info.rank, [], [], [], []
    mb_tokens, mb_targets = tokens.chunk(m), targets.chunk(m)   # m x (B/m, T)
    # (B/m, T, C)
    act_shape = (mb_tokens[0].shape[0], tokens.shape[1], stage_mod.cfg.dim)
    dtype = next(stage_mod.parameters()).dtype
    # === all forwards ===
    for i in range(m):
        if info.is_first:
            x = mb_tokens[i]
        else:
            x = torch.empty(act_shape, dtype=dtype, device=info.device)
            # comm: receive activation i (blocks)
            dist.recv(x, src=rank - 1)
            x.requires_grad_()
        with rec.span(rank, "F", i):
            # compute: forward of microbatch i
            y = stage_mod(x)
        if info.is_last:
            losses.append(workload.loss_fn(y, mb_targets[i]))
        else:
            # send without waiting: the next rank may still be busy with microbatch i-1
            # comm: send activation i
            sends.append(dist.isend(y.detach(), dst=rank + 1))
        inputs.append(x)
        outputs.append(y)
    # === all backwards ===
    for i in range(m):
        if info.is_last:
            with rec.span(rank, "B", i):
                # compute: backward of the loss as it is
                losses[i].backward()
        else:
            grad = torch.empty_like(outputs[i])
            # comm: receive d(loss)/dy of i (blocks)
            dist.recv(grad, src=rank + 1)
            with rec.span(rank, "B", i):
                # compute: backward of microbatch i
                outputs[i].backward(grad)
        if not info.is_first:
            # comm: send d(loss)/dx of i
            sends.append(dist.isend(inputs[i].grad, dst=rank - 1))
    for work in sends:
        work.wait()                                         # comm: every send delivered
    # compute: the summed gradients / m, as torch's scale_grads
    workload.scale_grads(stage_mod, m)
    return losses
# [end-scratch]


def make_runner(impl, m, full, tokens, targets, info):
    """This rank's stage for one implementation and m, and a function that runs one step of it."""
    stage_mod = stage_module(copy.deepcopy(full), info.rank, info.world_size)
    rec = Recorder(info.rank)
    if impl == "torch":
        # [start-torch]
        stage = PipelineStage(
            stage_mod,
            stage_index=info.rank,
            num_stages=info.world_size,
            device=info.device,
        )
        rec.attach(stage)  # time every action the schedule runs on this stage
        schedule = ScheduleGPipe(stage, n_microbatches=m, loss_fn=workload.loss_fn)
        # [end-torch]
    losses = []

    def step():
        stage_mod.zero_grad(set_to_none=True)
        out = gpipe_step(stage_mod, tokens, targets, m, info, rec) if impl == "scratch" else \
            driver.schedule_step(schedule, info, tokens, targets)
        losses.append(out)

    return stage_mod, rec, step, losses


def rounds(configs: list, warmup: int, steps: int) -> list[tuple]:
    """The order in which the steps run: round after round, one step of every configuration per
    round, the ``warmup`` rounds first (unmeasured: allocator and caches settle). Each entry is
    (configuration, whether it is a warm-up step)."""
    return [(config, i < warmup) for i in range(warmup + steps) for config in configs]


def run_configs(full, reference, tokens, targets, args, info) -> list[dict] | None:
    """Every m and implementation, their measured steps interleaved in rounds (m = 1 scratch,
    m = 1 torch, m = 2 scratch, ...): every configuration, the naive m = 1 included, sees the same
    moments of a shared machine's noise, and round i of one compares with round i of another."""
    runners = {(m, impl): make_runner(impl, m, full, tokens, targets, info)
               for m in args.microbatches for impl in args.impl}
    records = {key: [] for key in runners}
    for key, warm in rounds(list(runners), args.warmup, args.steps):
        _, rec, step, _ = runners[key]
        records[key] += measure.timed_steps(step, rec, int(warm), int(not warm), info.device) or []
    out = []
    tol = precision.tolerance(args.dtype)
    for (m, impl), (stage_mod, _, _, losses) in runners.items():
        loss = workload.mean_loss(losses[-1]) if info.is_last else None
        check = [None] * info.world_size
        dist.all_gather_object(check, {"rank": info.rank, "loss": loss, **workload.compare(stage_mod, reference[m][0])})
        if info.rank == 0:
            ok = abs(check[-1]["loss"] - reference[m][1]) <= tol and all(c["max_grad_diff"] <= tol for c in check)
            out.append({"impl": impl, "microbatches": m, "match": ok, "stages": check,
                        "reference_loss": reference[m][1], **measure.summarise_steps(records[(m, impl)])})
    return out if info.rank == 0 else None


def body(args: argparse.Namespace, info) -> int:
    full = workload.full_model(args, info.device)  # identical on every rank
    tokens, targets = workload.make_batch(args, 0, info.device)
    reference = {}
    for m in args.microbatches:  # one-process reference gradients, one per m (same microbatches)
        model = copy.deepcopy(full)
        reference[m] = (model, workload.reference_backward(model, tokens, targets, m))
    runs = run_configs(full, reference, tokens, targets, args, info) or []
    if info.rank != 0:
        return 0
    for r in runs:
        busy = ", ".join(f"rank {k} {100 * v:.0f}%" for k, v in r["busy"].items())
        print(f"{r['impl']:>7} m={r['microbatches']:<2} step {r['median_step_seconds'] * 1e3:7.1f} ms   busy: {busy}   "
              f"{'MATCH' if r['match'] else 'MISMATCH'}")
    ok = all(r["match"] for r in runs)
    print("MATCH: every run's gradients equal the one-process run" if ok else "MISMATCH in at least one run")
    cli.write_json(args.json, {"world_size": info.world_size, "batch_size": args.batch_size, "dtype": args.dtype,
                              "layers": args.layers, "dim": args.dim, "seq_len": args.seq_len, "runs": runs,
                              "match": ok, "torch_version": torch.__version__})
    return 1 if (args.check and not ok) else 0


def main(argv=None) -> int:
    return cli.run("03_gpipe.py", parse_args(argv), cli.validate_common, body)


if __name__ == "__main__":
    sys.exit(main())
