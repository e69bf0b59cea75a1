"""Plumbing shared by the companion scripts: flags, data, loss, the one-process reference.

Introduced in chapter 1 ("Your first pipeline"); every companion script uses it, so that each
script holds only the technique it teaches.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from statistics import median_high
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ppbook import dist as ppdist
from ppbook import simulate, timeline
from ppbook.models import GPTConfig, build_model

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def add_common_args(p: argparse.ArgumentParser, microbatches: int | list[int] = 4,
                    microbatches_help: str = "n_microbatches: the batch is cut into this many",
                    batch_size: int = 8, seq_len: int = 32, layers: int = 4, dim: int = 64) -> None:
    """The model, data and run flags every script shares (defaults run in seconds on a CPU).

    A list default for ``microbatches`` makes ``--microbatches`` take several values (a sweep).
    """
    nargs = "+" if isinstance(microbatches, list) else None
    p.add_argument("--microbatches", type=int, nargs=nargs, default=microbatches, help=microbatches_help)
    p.add_argument("--batch-size", type=int, default=batch_size, help="global batch size (divisible by --microbatches)")
    p.add_argument("--seq-len", type=int, default=seq_len)
    p.add_argument("--layers", type=int, default=layers, help="transformer layers in the full model")
    p.add_argument("--dim", type=int, default=dim)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--check", action="store_true", help="fail unless the pipeline matches the one-process run")
    p.add_argument("--json", default=None, help="write machine-readable results to this path (rank 0)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds any rank waits for a peer before failing")


def validate_common(args: argparse.Namespace, num_stages: int) -> None:
    """Refuse bad combinations in one line each, before any process group exists."""
    for name in ("batch_size", "seq_len", "layers", "dim", "heads", "vocab"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.timeout <= 0:
        raise ValueError(f"--timeout must be positive, got {args.timeout}")
    ppdist.pick_device(0, args.device)  # --device cuda without a GPU: one line now, not a traceback later
    for m in args.microbatches if isinstance(args.microbatches, list) else [args.microbatches]:
        if m < 1:
            raise ValueError(f"--microbatches must be at least 1, got {m}")
        if args.batch_size % m:
            raise ValueError(
                f"--batch-size {args.batch_size} is not divisible by --microbatches {m}: every microbatch must "
                f"have the same size; try --batch-size {-(-args.batch_size // m) * m}")
    if args.layers < num_stages:
        raise ValueError(
            f"{num_stages} processes need at least {num_stages} layers (one stage each), got --layers {args.layers}; "
            f"raise --layers or lower --nproc-per-node")
    if args.dim % args.heads:
        raise ValueError(f"--dim {args.dim} must be divisible by --heads {args.heads}")
    if args.json and not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
        raise ValueError(f"--json {args.json}: its folder does not exist; create it or pick another path")
    if getattr(args, "steps", 1) < 1 or getattr(args, "warmup", 0) < 0:
        raise ValueError(f"--steps must be at least 1 and --warmup at least 0, got {args.steps} and "
                         f"{getattr(args, 'warmup', 0)}")


def run(script: str, args: argparse.Namespace, validate: Callable[[argparse.Namespace, int], None],
        body: Callable[[argparse.Namespace, ppdist.DistInfo], int], process_group: bool = True) -> int:
    """Validate, set up the process group, run ``body``, tear down; bad input is one line and exit 2.

    With ``process_group=False`` a plain ``python script.py`` (no torchrun) runs ``body`` without
    any process group (chapter 7 loads a pipeline's checkpoint that way).
    """
    try:
        validate(args, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError as err:
        print(f"{script}: error: {err}", file=sys.stderr)
        return 2
    if not process_group and not ppdist.launched_by_torchrun():
        dev = ppdist.pick_device(0, args.device)
        return body(args, ppdist.DistInfo(0, 1, 0, dev, "none"))
    info = ppdist.setup(args.device, timeout_s=args.timeout)
    try:
        return body(args, info)
    finally:
        ppdist.teardown()


def schedule_step(schedule, info: ppdist.DistInfo, tokens, targets, forward_only: bool = False,
                  holds_first: bool | None = None, holds_last: bool | None = None) -> list[torch.Tensor]:
    """One ``schedule.step`` from any rank; returns the per-microbatch losses (last stage only).

    Only the rank holding the first stage is given the input and only the one holding the last
    stage the targets (in one process, a one-stage pipeline, both); the ranks in between take part
    with neither. By default rank 0 holds the first stage and the last rank the last;
    ``holds_first``/``holds_last`` say otherwise (a V-shaped schedule puts both on rank 0).
    With ``forward_only`` it calls ``schedule.eval`` instead (no backward; chapter 6).
    """
    first = info.is_first if holds_first is None else holds_first
    last = info.is_last if holds_last is None else holds_last
    losses: list[torch.Tensor] = []
    run = schedule.eval if forward_only else schedule.step
    if first and last:
        run(tokens, target=targets, losses=losses)
    elif first:
        run(tokens)
    elif last:
        run(target=targets, losses=losses)
    else:
        run()
    return losses


def gpt_config(args: argparse.Namespace) -> GPTConfig:
    return GPTConfig(vocab_size=args.vocab, dim=args.dim, n_layers=args.layers, n_heads=args.heads,
                     max_seq_len=args.seq_len)


def full_model(args: argparse.Namespace, device: torch.device) -> nn.Module:
    """The whole model, identical on every rank: built from ``--seed``."""
    return build_model(gpt_config(args), seed=args.seed, dtype=DTYPES[args.dtype]).to(device)


def make_batch(args: argparse.Namespace, step: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids and next-token targets, the same on every rank for a given step."""
    g = torch.Generator().manual_seed(args.seed * 10_000 + step)
    seq = torch.randint(0, args.vocab, (args.batch_size, args.seq_len + 1), generator=g)
    return seq[:, :-1].contiguous().to(device), seq[:, 1:].contiguous().to(device)  # tokens (B, T), targets (B, T)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())  # mean over the microbatch's B*T tokens


def mean_loss(mb_losses: list[torch.Tensor]) -> float:
    # equal-sized microbatches: the mean of their mean losses is the full batch's mean loss
    return torch.stack([loss.detach() for loss in mb_losses]).mean().item()


def reference_backward(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor, m: int) -> float:
    """The one-process run every pipeline is compared with: the same m microbatches, in the same
    order, each contributing loss / m (what ScheduleGPipe's scale_grads does), so float results
    agree to the last bit. Returns the batch's mean loss."""
    mb_losses = []
    for mb_tokens, mb_targets in zip(tokens.chunk(m), targets.chunk(m)):
        loss = loss_fn(model(mb_tokens), mb_targets)
        (loss / m).backward()
        mb_losses.append(loss)
    return mean_loss(mb_losses)


def train_reference(model: nn.Module, args: argparse.Namespace, device: torch.device | str) -> list[float]:
    """The one-process training run: same model, same microbatches, ``args.steps`` AdamW steps at
    ``args.lr``; returns each step's mean loss."""
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    losses = []
    for step in range(args.steps):
        tokens, targets = make_batch(args, step, device)
        opt.zero_grad()
        losses.append(reference_backward(model, tokens, targets, args.microbatches))
        opt.step()
    return losses


def compare(stage_mod: nn.Module, reference: nn.Module) -> dict:
    """Largest difference between this stage's gradients and weights and the same-named reference ones."""
    # remove_duplicate=False: a weight shared by two modules (tied embeddings) is listed under both
    # names, so a stage that holds it as "output.weight" finds it in the full model too
    ref = dict(reference.named_parameters(remove_duplicate=False))
    names = [n for n, _ in stage_mod.named_parameters()]
    params = list(stage_mod.parameters())
    return {
        "params": names,
        "max_grad_diff": max((p.grad - ref[n].grad).abs().max().item() for n, p in zip(names, params)),
        "max_weight_diff": max((p.detach() - ref[n].detach()).abs().max().item() for n, p in zip(names, params)),
    }


def tolerance(dtype_name: str) -> float:
    return 1e-5 if dtype_name == "float32" else 1e-10


def write_json(path: str | None, data: dict) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(data, f, indent=1)


def add_timing_args(p: argparse.ArgumentParser, steps: int = 3) -> None:
    p.add_argument("--steps", type=int, default=steps, help="measured steps per configuration")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured steps first (allocator, caches)")


def timed_steps(step_fn: Callable[[], object], recorder, warmup: int, steps: int, device: torch.device) -> list[dict] | None:
    """Run ``step_fn`` warmup + steps times, all ranks starting each step together after a barrier.

    Returns, on rank 0, one record per measured step: its time (the slowest rank's, from the
    barrier to that rank's last action) and every rank's recorded events. ``None`` on other ranks.
    """
    records = []
    for i in range(warmup + steps):
        dist.barrier()
        recorder.start_step()
        t0 = time.perf_counter()
        step_fn()
        seconds = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        events = timeline.gather(recorder)
        if i >= warmup and events is not None:
            records.append({"seconds": seconds.item(), "events": timeline.to_json(events)})
    return records if dist.get_rank() == 0 else None


def summarise_steps(records: list[dict]) -> dict:
    """Median step (time and timeline), the mean busy fraction per rank, measured action costs,
    and each step's own summary (:func:`step_summary`)."""
    median = sorted(records, key=lambda r: r["seconds"])[len(records) // 2]
    all_events = [timeline.from_json(r["events"]) for r in records]
    steps = [step_summary(ev, r["seconds"]) for ev, r in zip(all_events, records)]
    busy = {r: sum(step["busy"][r] for step in steps) / len(steps) for r in steps[0]["busy"]}
    latency = median_high([timeline.comm_latency(ev) for ev in all_events])
    return {
        "step_seconds": [r["seconds"] for r in records],
        "median_step_seconds": median["seconds"],
        "events": median["events"],
        "busy": busy,
        "costs": {f"{s}{k}": c for (s, k), c in timeline.mean_costs([e for ev in all_events for e in ev]).items()},
        "latency": latency,
        "overheads": {f"{s}{k}": g for (s, k), g in timeline.action_overheads(all_events, latency).items()},
        "steps": steps,
    }


def step_summary(events: list, seconds: float) -> dict:
    """One measured step: its busy fractions and the simulator inputs measured on it alone."""
    latency = timeline.comm_latency(events)
    t0, t1 = timeline.span(events)
    return {
        "seconds": seconds,
        "span": t1 - t0,
        "busy": {str(r): b for r, b in timeline.busy_fractions(events).items()},
        "costs": {f"{s}{k}": c for (s, k), c in timeline.mean_costs(events).items()},
        "handoffs": timeline.handoff_delays(events),
        "gaps": {f"{s}{k}": g for (s, k), g in timeline.own_gaps(events, latency).items()},
        "latency": latency,
        "overheads": {f"{s}{k}": g for (s, k), g in timeline.action_overheads([events], latency).items()},
    }


def simulator_inputs(run: dict) -> dict:
    """The measured costs, latency and overheads of a run, as keyword arguments of
    :func:`ppbook.simulate.simulate`."""
    key = lambda k: (int(k[:-1]), k[-1])  # noqa: E731  "1B" -> (1, "B")
    return {"costs": {key(k): v for k, v in run["costs"].items()}, "latency": run["latency"],
            "overhead": {key(k): v for k, v in run["overheads"].items()}}


def _simulated_steps(run: dict, order: simulate.Order, draws: int, seed: int):
    """Yield (measured step summary, simulated events), ``draws`` simulations per measured step,
    each from what was measured on that step alone (see :func:`predicted_vs_measured`)."""
    rng = random.Random(seed)
    for step in run["steps"]:
        inputs = simulator_inputs(step)
        handoffs = step["handoffs"] or [inputs["latency"]]
        gaps = {(int(k[:-1]), k[-1]): v for k, v in step["gaps"].items()}

        def gap(action):
            return rng.choice(gaps[(action.stage, action.kind)]) if (action.stage, action.kind) in gaps else 0.0

        for _ in range(draws):
            yield step, simulate.simulate(order, inputs["costs"], overhead=gap,
                                          latency=lambda sent, received: rng.choice(handoffs))


def predicted_vs_measured(run: dict, order: simulate.Order, draws: int = 50, seed: int = 0) -> tuple[float, float]:
    """Mean busy fraction over ranks and measured steps: (measured, simulated).

    Each measured step is simulated from what was measured on it, as distributions: the mean
    time of each (stage, kind) of action, and, drawn at random for every action, a gap the rank
    spent on its own before an action of that kind and a hand-off delay. The simulator knows the
    schedule's dependencies and these three measurements, not when anything happened. On a
    shared CPU host gaps and hand-offs have long tails, and typical (median) values would hide
    them; ``draws`` Monte-Carlo runs average over the tails.
    """
    measured = [sum(step["busy"].values()) / len(step["busy"]) for step in run["steps"]]
    predicted = [sum(timeline.busy_fractions(events).values()) / len(step["busy"])
                 for step, events in _simulated_steps(run, order, draws, seed)]
    return sum(measured) / len(measured), sum(predicted) / len(predicted)


def predicted_step_time(run: dict, order: simulate.Order, draws: int = 50, seed: int = 0) -> tuple[float, float]:
    """Mean step time over the measured steps, from the first action's start to the last one's
    end: (measured, simulated), simulated as in :func:`predicted_vs_measured`.
    Introduced in chapter 5 ("The schedules")."""
    measured = [step["span"] for step in run["steps"]]
    predicted = [timeline.span(events)[1] - timeline.span(events)[0]
                 for _, events in _simulated_steps(run, order, draws, seed)]
    return sum(measured) / len(measured), sum(predicted) / len(predicted)
