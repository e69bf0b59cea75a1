"""What chapter 12's scripts share: a pipeline combined with another tool, run on the book's Llama
and checked against one process.

Introduced in chapter 12 ("Compile and activation checkpointing in a pipeline"); its scripts
``12_compile.py``, ``12_recompute.py``, ``12_fsdp.py``, ``12_tp.py`` and ``12_shapes.py`` each run
one tool and keep only that tool's code. Here: their common flags, one model identical on every
rank, the one-process reference every pipeline's gradients are compared with, a rank's stages made
by a ``prepare(stage module, stage index)`` and their schedule, one step, a timed run, and the
record's ``meta`` and JSON.
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import shlex
import sys
import time

import torch
from torch.distributed import pipelining

from ppbook import cli, measure, timeline, workload
from ppbook.dist import pick_device, schedule_backend_problem
from ppbook.models import LlamaConfig, build_model
from ppbook.planner.shapes import ModelShape
from ppbook.stages import TORCH_SCHEDULES, schedule_problem, stage_indices, stage_module

SCHEDULES = list(TORCH_SCHEDULES)  # GPipe, 1F1B, Interleaved1F1B, LoopedBFS, InterleavedZeroBubble, ...


def parser(doc: str, schedules: list[str] | None, steps: int = 2) -> argparse.ArgumentParser:
    """The flags every chapter 12 script takes: the book's common ones at chapter 12's small sizes,
    the Llama's grouped-query attention and SwiGLU width, and ``--schedules`` (default
    ``schedules``; no such flag where ``schedules`` is ``None``)."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    cli.add_common_args(p, microbatches=4, batch_size=8, seq_len=32, layers=4, dim=64)
    cli.add_timing_args(p, steps=steps)
    p.set_defaults(vocab=512)  # the book's training text and tokenizer (chapter 6)
    p.add_argument("--stages-per-rank", type=int, default=2, help="v, for the looped schedules")
    p.add_argument("--kv-heads", type=int, default=2, help="key/value heads (grouped-query attention)")
    p.add_argument("--ffn", type=int, default=176, help="SwiGLU width")
    if schedules is not None:
        p.add_argument("--schedules", nargs="+", choices=SCHEDULES, default=schedules,
                       help=f"schedules to run (default: {' '.join(schedules)})")
    return p


def validate(args: argparse.Namespace, pp: int, schedules: list[str] | None = None) -> None:
    """The common flags at ``pp`` pipeline ranks, and every schedule of ``schedules`` (default
    ``--schedules``) legal there on the run's device; raises ``ValueError`` with the fix."""
    cli.validate_common(args, pp)
    if args.heads % args.kv_heads:
        raise ValueError(f"--heads {args.heads} must be a multiple of --kv-heads {args.kv_heads}")
    device = pick_device(0, args.device)
    for name in args.schedules if schedules is None else schedules:
        problem = (schedule_problem(name, pp, args.microbatches, args.stages_per_rank, args.layers)
                   or schedule_backend_problem(name, device, pp))
        if problem:
            raise ValueError(problem)


# --- one model, one reference ------------------------------------------------------------------

def llama_config(args, max_seq_len: int | None = None) -> LlamaConfig:
    return LlamaConfig(vocab_size=args.vocab, dim=args.dim, n_layers=args.layers, n_heads=args.heads,
                       n_kv_heads=args.kv_heads, ffn_hidden_dim=args.ffn,
                       max_seq_len=max_seq_len or args.seq_len)


def llama_shape(args) -> ModelShape:
    """The script's model as the planner describes it."""
    return ModelShape("script", vocab=args.vocab, hidden=args.dim, layers=args.layers, heads=args.heads,
                      kv_heads=args.kv_heads, ffn=args.ffn)


def full_llama(args, device, max_seq_len: int | None = None):
    """The whole model, identical on every rank: built from ``--seed``."""
    return build_model(llama_config(args, max_seq_len), seed=args.seed).to(device)


def reference(full, tokens, targets, m: int, loss_fn=workload.loss_fn, **kwargs):
    """One process, the same m microbatches: the model with the gradients every pipeline must have."""
    model = copy.deepcopy(full)
    for chunks in zip(tokens.tensor_split(m), targets.tensor_split(m), *(v.tensor_split(m) for v in kwargs.values())):
        extra = dict(zip(kwargs, chunks[2:]))
        loss_fn(model(chunks[0], **extra), chunks[1]).backward()
    workload.scale_grads(model, m)  # sum, then divide by m: the schedule's arithmetic
    return model


def grad_diff(mods, ref) -> float:
    """Largest difference between this rank's gradients (DTensors gathered whole) and the reference's."""
    want = dict(ref.named_parameters())
    worst = 0.0
    for mod in mods:
        for name, p in mod.named_parameters():
            g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            # torch.compile(block) renames what it wraps, "layers.0._orig_mod.*": anything keyed by
            # names (an FQN split, a state dict) misses it. Mapped back here; block.compile() keeps names
            worst = max(worst, (g - want[name.replace("_orig_mod.", "")].grad).abs().max().item())
    return worst


# --- a rank's stages, its schedule, a step ------------------------------------------------------

def build_stages(name, full, args, rank, pp, device, prepare=lambda mod, index: mod, group=None):
    """This rank's stages of ``full`` for schedule ``name`` (its placement), each made by
    ``prepare(stage module, stage index)``, and the schedule; ``mods`` keep the parameter names."""
    indices = stage_indices(name, rank, pp, args.stages_per_rank)  # V: [r, 2p-1-r], looped: [r, r+p, ...]
    num_stages = pp * len(indices)
    mods, stages = [], []
    for i in indices:
        mod = stage_module(copy.deepcopy(full), i, num_stages)
        mods.append(mod)
        stages.append(pipelining.PipelineStage(prepare(mod, i), i, num_stages, device, group=group))
    return mods, stages, indices, num_stages


def make_schedule(name, stages, m, loss_fn=workload.loss_fn, **kwargs):
    cls = getattr(pipelining, f"Schedule{name}")
    single = issubclass(cls, pipelining.schedules.PipelineScheduleSingle)
    return cls(stages[0] if single else stages, n_microbatches=m, loss_fn=loss_fn, **kwargs)


def step(schedule, indices, num_stages, tokens, targets, **kwargs) -> list:
    """One ``schedule.step`` from this rank: the inputs where the first stage is, the targets
    where the last is; ``kwargs`` (cut into microbatches) go to every stage."""
    losses = []
    first, last = 0 in indices, num_stages - 1 in indices
    args = (tokens,) if first else ()
    extra = {"target": targets, "losses": losses} if last else {}
    schedule.step(*args, **kwargs, **extra)
    return losses


def stepper(schedule, mods, indices, num_stages, tokens, targets, **kwargs):
    """A function that runs one :func:`step` from fresh gradients: what :func:`timed` times."""
    def run_step():
        for mod in mods:
            mod.zero_grad(set_to_none=True)
        step(schedule, indices, num_stages, tokens, targets, **kwargs)
    return run_step


def costs_by_kind(events) -> dict:
    """Mean seconds of this run's F, B, I and W actions, over every rank and stage."""
    out = {}
    for kind in "FBIW":
        durations = [e.duration for e in events if e.kind == kind]
        if durations:
            out[kind] = sum(durations) / len(durations)
    return out


def timed(run_step, args, info, recorder) -> dict | None:
    """The median step, and the mean seconds of each kind of action: over the whole run
    (``costs``) and per stage (``stage_costs``, keyed ``"0F"``, ``"1B"``, ...)."""
    records = measure.timed_steps(run_step, recorder, args.warmup, args.steps, info.device)
    if records is None:
        return None
    events = [e for r in records for e in timeline.from_json(r["events"])]
    median = sorted(r["seconds"] for r in records)[len(records) // 2]
    return {"step_seconds": median, "costs": costs_by_kind(events),
            "stage_costs": {f"{s}{k}": c for (s, k), c in sorted(timeline.mean_costs(events).items())}}


# --- the record ---------------------------------------------------------------------------------

def begin(info) -> float:
    """Before a script's first run: one thread per rank on a CPU (the same kernels, hence the same
    bits, on every rank and launcher); the start time for :func:`finish`."""
    if info.device.type == "cpu":
        torch.set_num_threads(1)
    return time.perf_counter()


def argv_of(args) -> list[str]:
    """The command line this run was given, without --json (for the record's meta)."""
    argv = list(getattr(args, "argv", sys.argv[1:]))
    if "--json" in argv:
        i = argv.index("--json")
        del argv[i:i + 2]
    return [shlex.quote(a) for a in argv]


def finish(script: str, args, info, result: dict, t0: float, ok: bool) -> int:
    """Rank 0: the run's ``meta`` (its command, torch, the machine), the sizes, ``match``, written
    to ``--json``; the exit status (1 if ``--check`` and not ``ok``)."""
    result["meta"] = {"command": f"torchrun --standalone --nproc-per-node {info.world_size} scripts/{script} "
                      + " ".join(a for a in argv_of(args) if a),
                      "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "python": platform.python_version(),
                      "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, {platform.system()}",
                      "backend": f"{info.backend} ({info.device.type})",
                      "load_average": [round(x, 2) for x in os.getloadavg()]}  # of the machine, at the end
    result.update(world_size=info.world_size, microbatches=args.microbatches, batch_size=args.batch_size,
                  seq_len=args.seq_len, layers=args.layers, dim=args.dim, heads=args.heads, kv_heads=args.kv_heads,
                  ffn=args.ffn, vocab=args.vocab, seconds=time.perf_counter() - t0, torch_version=torch.__version__,
                  match=ok)
    print("MATCH: every run equals the one-process run" if ok else "MISMATCH in at least one run")
    cli.write_json(args.json, result)
    return 1 if (args.check and not ok) else 0
