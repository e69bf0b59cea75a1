"""A pipeline among the tools it is combined with: torch.compile, activation checkpointing,
FSDP2, tensor parallelism, and sequences whose length changes. Every run is checked against one
process.

CPU (gloo), one section per launch:
    torchrun --standalone --nproc-per-node 2 scripts/12_combinations.py --section compile --check
    torchrun --standalone --nproc-per-node 2 scripts/12_combinations.py --section recompute --check
    torchrun --standalone --nproc-per-node 4 scripts/12_combinations.py --section fsdp --check
    torchrun --standalone --nproc-per-node 4 scripts/12_combinations.py --section tp --check
    torchrun --standalone --nproc-per-node 2 scripts/12_combinations.py --section shapes --check
What a pipeline does when the sequence length changes between steps (fails on purpose):
    torchrun --standalone --nproc-per-node 2 scripts/12_combinations.py --section shapes --lengths 32 16
The compile section with inductor, torch.compile's default backend (minutes of compiling on a CPU):
    torchrun --standalone --nproc-per-node 2 scripts/12_combinations.py --section compile --backend inductor --steps 5 --donated-buffers-probe --check
The extra time of recomputation at a size where computing dominates (chapter 12's record,
data/recorded/recompute_cost.json):
    torchrun --standalone --nproc-per-node 2 scripts/12_combinations.py --section recompute --policies none full selective ZBVZeroBubble:none ZBVZeroBubble:full --dim 512 --heads 8 --kv-heads 4 --ffn 1408 --seq-len 256 --steps 5 --check
GPUs (NCCL), larger sizes:
    torchrun --standalone --nproc-per-node 4 scripts/12_combinations.py --section tp --device cuda --dim 1024 --heads 16 --kv-heads 4 --ffn 2816 --seq-len 512 --batch-size 32

Sections:
- compile: each stage's blocks wrapped (``torch.compile(block)``, torchtitan's way before
  torchtitan#2688) or each stage whole, under every schedule (``--stage`` picks the schedules for
  whole stages); the schedules that split the backward refuse these wrappers. ``block.compile()``
  (in place, torchtitan's way today) passes that check and fails at the first step on donated
  buffers; mode in-place runs it with donated buffers and inductor's caches off (with the caches
  on, ``--keep-compile-caches``, the gradients come out wrong). ``--check`` also fails if a
  compiled run's graphs never ran.
- recompute: activation checkpointing per block, full or selective (torchtitan's policy), a
  policy per stage; each block's kept bytes, and each stage's kept bytes across the step (their
  high-water mark), against the planner's memory model; the extra backward time per block over
  the same schedule without checkpointing (``recompute_costs``).
- fsdp: FSDP2 inside each stage over a ("pp", "dp") mesh, resharding after forward on and off,
  under a one-stage-per-rank schedule and under torch's runtime with its unshard lookahead.
- tp: tensor parallelism inside each stage over a ("pp", "tp") mesh with ``parallelize_module``;
  where the all-reduces sit in each forward and backward.
- shapes: batches of the book's training text whose length changes: padding to one length,
  to a few bucket lengths, packing documents with a document mask, a new schedule per length.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import os
import platform
import shlex
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed import pipelining
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, parallelize_module
from torch.utils._python_dispatch import TorchDispatchMode
from tqdm import tqdm

from ppbook import cli, data, fsdp_probe, kernels, measure, precision, recompute, timeline, torch_orders, training, workload
from ppbook.planner import simulate
from ppbook.packing import document_mask  # (B, T) document ids -> (B, 1, T, T), chapter 15
from ppbook.dist import gather_to_rank0, pick_device, schedule_backend_problem
from ppbook.models import LlamaConfig, RMSNorm, build_model
from ppbook.planner import memory as planner_memory
from ppbook.planner import search as planner_search
from ppbook.planner.shapes import ModelShape
from ppbook.planner.traffic import fsdp_gathers
from ppbook.stages import TORCH_SCHEDULES, schedule_problem, stage_indices, stage_module

SCHEDULES = list(TORCH_SCHEDULES)  # GPipe, 1F1B, Interleaved1F1B, LoopedBFS, InterleavedZeroBubble, ...
SECTIONS = ("compile", "recompute", "fsdp", "tp", "shapes")
COMPILE_MODES = ("eager", "blocks", "stage", "in-place")
SPLIT = ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")  # split the backward into I and W


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    cli.add_common_args(p, microbatches=4, batch_size=8, seq_len=32, layers=4, dim=64)
    cli.add_timing_args(p, steps=2)
    p.set_defaults(vocab=512)  # the book's training text and tokenizer (chapter 6)
    p.add_argument("--stages-per-rank", type=int, default=2, help="v, for the looped schedules")
    p.add_argument("--kv-heads", type=int, default=2, help="key/value heads (grouped-query attention)")
    p.add_argument("--ffn", type=int, default=176, help="SwiGLU width")
    p.add_argument("--section", choices=SECTIONS, required=True)
    p.add_argument("--schedules", nargs="+", choices=SCHEDULES, default=None,
                   help="schedules to run (compile: all seven; fsdp: 1F1B Interleaved1F1B; others: 1F1B)")
    # compile
    p.add_argument("--backend", default="aot_eager",
                   help="torch.compile backend: aot_eager (AOTAutograd's graphs run by eager kernels: seconds "
                        "on a CPU) or inductor (the default of torch.compile: generated kernels, minutes on a CPU)")
    p.add_argument("--compile-modes", nargs="+", choices=COMPILE_MODES, default=list(COMPILE_MODES),
                   help="eager; blocks: torch.compile(block) for each block (torchtitan before #2688); stage: "
                        "torch.compile the stage; in-place: block.compile() (torchtitan today) with donated "
                        "buffers and inductor's caches off (what a split schedule needs)")
    p.add_argument("--in-place", nargs="+", choices=SCHEDULES, default=None,
                   help="the schedules that compile mode in-place runs (default: those of --schedules that split "
                        "the backward)")
    p.add_argument("--stage", nargs="+", choices=SCHEDULES, default=None,
                   help="the schedules that compile mode stage runs (default: every one of --schedules)")
    p.add_argument("--donated-buffers-probe", action="store_true",
                   help="first, on each rank alone, step ZBVZeroBubble with blocks compiled in place and donated "
                        "buffers on, and record the error")
    p.add_argument("--keep-compile-caches", action="store_true",
                   help="in-place: leave inductor's caches on (a backward cached with donated buffers is reused: "
                        "wrong gradients under the split schedules, chapter 12)")
    # recompute
    p.add_argument("--policies", nargs="+", default=["none", "full", "selective", "full,none"],
                   help="activation checkpointing per run: one mode for every stage, or one per stage "
                        "separated by commas (none, full, selective); SCHEDULE:modes for that schedule only")
    p.add_argument("--kernels", choices=["book", "fused"], default="book",
                   help="the book's Llama block, or the same block with fused kernels (ppbook.kernels)")
    # fsdp, tp
    p.add_argument("--dp", type=int, default=2, help="fsdp: data-parallel size of the (pp, dp) mesh")
    p.add_argument("--tp", type=int, default=2, help="tp: tensor-parallel size of the (pp, tp) mesh")
    # shapes
    p.add_argument("--lengths", nargs="+", type=int, default=None,
                   help="shapes: one schedule stepped with random batches of these lengths, one per step "
                        "(what happens when the length changes)")
    p.add_argument("--shape-batch-sizes", nargs="+", type=int, default=None,
                   help="shapes with --lengths: the batch size of each step (default --batch-size)")
    p.add_argument("--strategies", nargs="+", default=["pad", "bucket", "pack", "recreate"],
                   choices=["pad", "bucket", "pack", "recreate"],
                   help="shapes: how each batch of documents gets a shape the pipeline can take")
    p.add_argument("--buckets", nargs="+", type=int, default=[32, 64, 128],
                   help="shapes: the lengths a batch is padded up to (bucket), the longest for pad and pack")
    p.add_argument("--documents", type=int, default=64, help="shapes: how many documents of the book's text")
    args = p.parse_args(argv)
    if args.schedules is None:
        args.schedules = {"compile": SCHEDULES, "fsdp": ["1F1B", "Interleaved1F1B"]}.get(args.section, ["1F1B"])
    return args


def validate(args: argparse.Namespace, world_size: int) -> None:
    size = {"fsdp": args.dp, "tp": args.tp}.get(args.section, 1)  # the mesh's inner dimension
    if size < 1 or world_size % size:
        flag = "--dp" if args.section == "fsdp" else "--tp"
        raise ValueError(f"{flag} {size} must divide the number of processes ({world_size}); pick one of "
                         f"{[d for d in range(1, world_size + 1) if world_size % d == 0]}")
    pp = world_size // size
    cli.validate_common(args, pp)
    if args.section == "fsdp" and args.batch_size % (args.dp * args.microbatches):
        raise ValueError(f"--batch-size {args.batch_size} must split into --dp {args.dp} replicas of --microbatches "
                         f"{args.microbatches} equal microbatches")
    if args.section == "tp" and (args.heads % args.tp or args.kv_heads % args.tp or args.ffn % args.tp):
        raise ValueError(f"--tp {args.tp} must divide --heads {args.heads}, --kv-heads {args.kv_heads} and --ffn "
                         f"{args.ffn}: each tensor-parallel rank computes whole heads")
    if args.heads % args.kv_heads:
        raise ValueError(f"--heads {args.heads} must be a multiple of --kv-heads {args.kv_heads}")
    device = pick_device(0, args.device)
    for name in args.schedules:
        problem = (schedule_problem(name, pp, args.microbatches, args.stages_per_rank, args.layers)
                   or schedule_backend_problem(name, device, pp))
        if problem:
            raise ValueError(problem)
    for spec in args.policies:
        name, _, modes = spec.rpartition(":")
        if name and name not in SCHEDULES:
            raise ValueError(f"--policies {spec!r}: {name!r} is not a schedule; use one of {', '.join(SCHEDULES)}")
        problem = name and (schedule_problem(name, pp, args.microbatches, args.stages_per_rank, args.layers)
                            or schedule_backend_problem(name, device, pp))
        if problem:
            raise ValueError(problem)
        for mode in modes.split(","):
            if mode not in ("none", "full", "selective"):
                raise ValueError(f"--policies {spec!r}: {mode!r} is not one of none, full, selective")
    if args.section == "recompute" and not recompute_plan(args)[0]:
        raise ValueError(f"selective checkpointing cannot run under {', '.join(args.schedules)} with torch 2.13: the "
                         f"weight-gradient pass runs a second backward through each checkpointed block, and "
                         f"selective checkpointing allows one (chapter 12 shows the error); use full or none there")
    if args.section == "shapes":
        if min(args.buckets) < 1 or args.documents < args.batch_size:
            raise ValueError(f"--buckets must be positive and --documents ({args.documents}) at least --batch-size "
                             f"({args.batch_size})")
        sizes = args.shape_batch_sizes or []
        if args.lengths and (min(args.lengths) < 1 or sizes and len(sizes) != len(args.lengths)
                             or any(b % args.microbatches for b in sizes)):
            raise ValueError(f"--lengths needs positive lengths, and --shape-batch-sizes one batch size per length, "
                             f"each divisible by --microbatches {args.microbatches}")
    if args.section == "compile":
        from torch._dynamo import list_backends

        if args.backend not in list_backends(exclude_tags=()):
            raise ValueError(f"--backend {args.backend!r} is not a torch.compile backend; use aot_eager, inductor "
                             f"or one of {', '.join(list_backends())}")
        for flag, mode, names in (("--stage", "stage", args.stage), ("--in-place", "in-place", args.in_place)):
            if names is None:
                continue
            if mode not in args.compile_modes:
                raise ValueError(f"{flag} picks the schedules of compile mode {mode}, which --compile-modes "
                                 f"{' '.join(args.compile_modes)} does not run; add {mode} to --compile-modes")
            if set(names) - set(args.schedules):
                raise ValueError(f"{flag} {' '.join(names)} names schedules that --schedules "
                                 f"{' '.join(args.schedules)} does not run; pick among those")


# --- one model, one reference ------------------------------------------------------------------

def llama_config(args, max_seq_len: int | None = None) -> LlamaConfig:
    return LlamaConfig(vocab_size=args.vocab, dim=args.dim, n_layers=args.layers, n_heads=args.heads,
                       n_kv_heads=args.kv_heads, ffn_hidden_dim=args.ffn,
                       max_seq_len=max_seq_len or args.seq_len)


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


# === compile ====================================================================================

# [start-compile]
def compiled(mode: str, backend: str):
    """How a stage module is compiled: ``blocks`` each block wrapped by
    torch.compile, ``stage`` the stage whole, ``in-place`` each block's own
    ``compile()``, no wrapper module (torchtitan's apply_compile)."""
    def prepare(mod, index):
        if mode == "blocks":
            for name, block in mod.layers.items():
                mod.layers.register_module(name, torch.compile(block, backend=backend))
        elif mode == "stage":
            return torch.compile(mod, backend=backend)  # an OptimizedModule
        elif mode == "in-place":
            for block in mod.layers.values():
                block.compile(backend=backend)
        return mod
    return prepare
# [end-compile]


class GraphCalls:
    """Counts, per kind of action (F, B, I, W), how often compiled graphs run. With ``aot_eager``
    the counting compilers see AOTAutograd's forward and backward graphs (run as they are): a
    compiled block's backward is one graph, and each run computes every gradient it has. With any
    other backend, each graph dynamo compiled is counted as one ``graph`` per call."""

    def __init__(self):
        self.kind, self.calls, self._backends = None, {}, {}

    def backend(self, name: str):
        """One backend object per name for every compilation (dynamo reuses what one backend compiled)."""
        if name not in self._backends:
            self._backends[name] = self._make(name)
        return self._backends[name]

    def _count(self, graph: str) -> None:
        key = f"{graph} in {self.kind}"
        self.calls[key] = self.calls.get(key, 0) + 1

    def _make(self, name: str):
        from torch._dynamo.backends.debugging import aot_eager, boxed_nop
        from torch._dynamo.backends.registry import lookup_backend

        def counting(graph, compile_graph):
            def compiler(gm, example_inputs):
                run = compile_graph(gm, example_inputs)

                def counted(*args):
                    self._count(graph)
                    return run(*args)
                counted._boxed_call = getattr(run, "_boxed_call", False)  # called as the compiled graph is
                return counted
            return compiler

        if name == "aot_eager":
            return functools.partial(aot_eager, fw_compiler=counting("forward", boxed_nop),
                                     bw_compiler=counting("backward", boxed_nop))
        return counting("graph", lookup_backend(name))

    def attach(self, stage) -> None:
        def wrap(method, kind_of):
            def marked(*args, **kwargs):
                self.kind = kind_of(kwargs)
                try:
                    return method(*args, **kwargs)
                finally:
                    self.kind = None
            return marked
        stage.forward_one_chunk = wrap(stage.forward_one_chunk, lambda kw: "F")
        stage.backward_one_chunk = wrap(stage.backward_one_chunk,
                                        lambda kw: "B" if kw.get("full_backward", True) else "I")
        stage.backward_weight_one_chunk = wrap(stage.backward_weight_one_chunk, lambda kw: "W")


# [start-donated]
@contextlib.contextmanager
def donated_buffers_off(on: bool, keep_caches: bool = False):
    """The split schedules run the input-gradient pass with
    retain_graph=True, which a backward compiled with donated
    buffers refuses: compile without them. Inductor's caches
    return a backward compiled earlier with them (wrong weight
    gradients, chapter 12): off too, unless ``keep_caches``."""
    if not on:
        yield
        return
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch._functorch.config.patch(donated_buffer=False))
        if not keep_caches:
            stack.enter_context(torch._functorch.config.patch(enable_autograd_cache=False))
            from torch._inductor import config as inductor_config

            stack.enter_context(inductor_config.patch(fx_graph_cache=False))
        yield
# [end-donated]


graph_calls = GraphCalls()


#: What torch 2.13 raises when a schedule that splits the backward is built with compiled stage
#: modules (``_check_torch_compile_compatibility``); any other error is a failure.
REFUSAL = "schedule is not supported with stage modules that have used torch.compile"


def torch_problem(name: str, mode: str, device: torch.device) -> str | None:
    """Why the installed torch cannot run compile ``mode`` under schedule ``name`` on ``device``, or
    ``None``: before 2.13 the split backward's weight pass fails at a block compiled in place
    ("Attribute '_input_metadata' is invalid for this instance of _C._FunctionBase"), seen on the CPU
    at two processes with torch 2.11 (the first GPU record ran it on an H200 at one process)."""
    from torch.torch_version import TorchVersion

    if mode == "in-place" and name in SPLIT and device.type == "cpu" and TorchVersion(torch.__version__) < (2, 13):
        return f"needs torch >= 2.13 on the CPU, found {torch.__version__}: the weight pass fails at an in-place block"
    return None


def compile_run(name, mode, full, ref, tokens, targets, args, info) -> dict:
    problem = torch_problem(name, mode, info.device)
    if problem:  # the same on every rank: nothing is built
        return {"schedule": name, "mode": mode, "refused": problem}
    backend = args.backend if mode == "eager" else graph_calls.backend(args.backend)  # its graphs' runs counted
    mods, stages, indices, num_stages = build_stages(name, full, args, info.rank, info.world_size, info.device,
                                                     compiled(mode, backend))
    try:
        schedule = make_schedule(name, stages, args.microbatches)
    except RuntimeError as err:  # torch refuses before any compilation or message
        if REFUSAL not in str(err):
            raise
        return {"schedule": name, "mode": mode, "refused": f"{type(err).__name__}: {err}"}
    if mode != "eager" and (mode == "in-place") != compile_run.donation_off:  # graphs compiled with and
        torch._dynamo.reset()  # without donated buffers must not be mixed: the split backward refuses the first
        compile_run.donation_off = mode == "in-place"
    torch._dynamo.utils.counters.clear()
    rec = timeline.Recorder(info.rank)
    for stage in stages:
        rec.attach(stage)
        graph_calls.attach(stage)
    params = [p for mod in mods for p in mod.parameters()]

    def run_step():
        for p in params:
            p.grad = None
        step(schedule, indices, num_stages, tokens, targets)

    with donated_buffers_off(mode == "in-place", args.keep_compile_caches):
        result = timed(run_step, args, info, rec)
        graph_calls.calls.clear()
        run_step()  # one more step, counting the compiled graphs' runs (and checked below)
    calls = gather_to_rank0(graph_calls.calls)
    diff = torch.tensor(grad_diff(mods, ref), dtype=torch.float64, device=info.device)
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    graphs = torch.tensor(float(torch._dynamo.utils.counters["stats"]["unique_graphs"]), device=info.device)
    dist.all_reduce(graphs, op=dist.ReduceOp.MAX)
    if result is None:
        return {}
    counted = {}
    for c in calls:  # every rank's runs of compiled graphs, by kind of action
        for key, n in c.items():
            counted[key] = counted.get(key, 0) + n
    return {"schedule": name, "mode": mode, "refused": None, "max_grad_diff": diff.item(),
            "graphs": int(graphs.item()), "graph_calls": counted,
            "compiled_runs": sum(counted.values()),  # every rank's runs of compiled graphs in the counted step
            "compiled_runs_per_rank": [sum(c.values()) for c in calls],  # every rank holds blocks: each must run some
            "microbatches_x_blocks": args.microbatches * args.layers, **result}


compile_run.donation_off = False


def donated_buffers_error(full, tokens, targets, args, info) -> str | None:
    """What in-place compiled blocks do under ZBVZeroBubble with donated buffers on (torch's
    default): each rank runs both stages of a V alone (a group of one), one step. The error's
    root cause, or ``None`` if the step runs."""
    torch._dynamo.reset()
    compile_run.donation_off = False
    alone = [dist.new_group([r]) for r in range(info.world_size)][info.rank]
    stages = [pipelining.PipelineStage(compiled("in-place", args.backend)(stage_module(copy.deepcopy(full), i, 2), i),
                                       i, 2, info.device, group=alone) for i in (0, 1)]
    schedule = make_schedule("ZBVZeroBubble", stages, args.microbatches)
    try:
        schedule.step(tokens, target=targets, losses=[])
    except RuntimeError as err:
        cause = err
        while cause.__cause__ is not None:
            cause = cause.__cause__
        return f"{type(cause).__name__}: {cause}"
    finally:
        torch._dynamo.reset()
    return None


def compile_section(args, info) -> dict:
    full = full_llama(args, info.device)
    tokens, targets = workload.make_batch(args, 0, info.device)  # (B, T) each; the same batch every step
    ref = reference(full, tokens, targets, args.microbatches)  # eager, one process
    donated = donated_buffers_error(full, tokens, targets, args, info) if args.donated_buffers_probe else None
    runs = []
    only = {"in-place": args.in_place or [n for n in args.schedules if n in SPLIT],  # where the wrappers are refused
            "stage": args.stage or args.schedules}
    plan = [(n, m) for n in args.schedules for m in args.compile_modes if n in only.get(m, [n])]
    for name, mode in tqdm(plan, desc="schedules x compile modes", disable=info.rank != 0):
        runs.append(compile_run(name, mode, full, ref, tokens, targets, args, info))
    return {"backend": args.backend, "donated_buffers_error": donated, "runs": runs}


# === recompute ==================================================================================

def stage_policies(spec: str, num_stages: int) -> list[str]:
    """``"full,none"`` -> a mode per stage (the last one given repeats)."""
    modes = spec.split(",")
    return [modes[min(i, len(modes) - 1)] for i in range(num_stages)]


class FusedRMSNorm(RMSNorm):
    """The final norm with the fused blocks' function (``ppbook.kernels``): keeps its input and rstd."""

    def forward(self, x):
        return kernels.RMSNormFunction.apply(x, self.weight, self.eps)


# [start-recompute]
def recomputed(policies, kernels_name, probe, saved, calls):
    """Each stage's blocks checkpointed as its policy says, what each
    block keeps recorded by ``probe``, what the stage keeps across the
    step by ``saved``, the blocks' forwards (recomputations too)
    counted in ``calls``."""
    def prepare(mod, index):
        if kernels_name == "fused":
            kernels.fuse(mod)
            if mod.norm is not None:  # the last stage's final norm too
                mod.norm.__class__ = FusedRMSNorm
        probe.attach(mod.layers)  # outside the checkpoint: sees what it keeps
        saved.attach(mod, index)
        for name, block in mod.layers.items():
            block.attention.wq.register_forward_hook(
                lambda *_, name=name: calls.update({name: calls.get(name, 0) + 1}))
            recompute.checkpoint_block(block, policies[index], saved)
        return mod
    return prepare
# [end-recompute]


def recompute_run(name, spec, full, ref, tokens, targets, args, info) -> dict:
    pp = info.world_size
    num_stages = pp * len(stage_indices(name, 0, pp, args.stages_per_rank))
    policies = stage_policies(spec, num_stages)
    probe, saved, calls = recompute.BlockBytes(), recompute.SavedBytes(), {}
    mods, stages, indices, num_stages = build_stages(name, full, args, info.rank, pp, info.device,
                                                     recomputed(policies, args.kernels, probe, saved, calls))
    schedule = make_schedule(name, stages, args.microbatches)
    rec = timeline.Recorder(info.rank)
    for stage in stages:
        rec.attach(stage)
    params = [p for mod in mods for p in mod.parameters()]

    def run_step():
        for p in params:
            p.grad = None
        step(schedule, indices, num_stages, tokens, targets)

    result = timed(run_step, args, info, rec)
    probe.reset()
    calls.clear()
    probe.enabled = saved.enabled = True  # one more step, recording what is kept (the profiler costs time)
    saved.reset()
    run_step()
    probe.enabled = saved.enabled = False
    diff = torch.tensor(grad_diff(mods, ref), dtype=torch.float64, device=info.device)
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    per_stage = {}
    for i, mod in zip(indices, mods):
        kept = [b for (block, _), b in probe.bytes.items() if block in mod.layers]
        per_stage[i] = {"mode": policies[i], "blocks": list(mod.layers.keys()), "block_bytes": sorted(set(kept)),
                        "forwards_per_block": max(calls.get(b, 0) for b in mod.layers) / args.microbatches,
                        "saved_peak_bytes": saved.peak.get(i, 0),  # the most this stage kept at once
                        "rank": info.rank, "rank_saved_peak_bytes": saved.peak_total}  # all of this rank's stages
    stages_info = gather_to_rank0(per_stage)
    if result is None:
        return {}
    every = {k: v for d in stages_info for k, v in d.items()}
    dtype_bytes = next(full.parameters()).element_size()
    model = kept_model(name, every, llama_shape(args), args.batch_size // args.microbatches * args.seq_len,
                       dtype_bytes, args.kernels, pp, args.microbatches, len(indices))
    return {"schedule": name, "policies": policies, "max_grad_diff": diff.item(),
            "stages": {str(k): v for k, v in every.items()}, **model, **result}


def llama_shape(args) -> ModelShape:
    """The script's model as the planner describes it."""
    return ModelShape("script", vocab=args.vocab, hidden=args.dim, layers=args.layers, heads=args.heads,
                      kv_heads=args.kv_heads, ffn=args.ffn)


def kept_model(name, stages: dict, shape, tokens: int, dtype_bytes: int, kernels_name: str, pp: int, m: int,
               v: int) -> dict:
    """What the book's memory model says each stage and each rank keeps at most, for the stages'
    policies (``stages``: index -> {"mode", "blocks"}). Per microbatch a stage keeps
    ``planner.memory.stage_activation_bytes``, plus the generator state of each checkpointed block
    (``recompute.RNG_STATE_BYTES``). ``stage_model_bytes``: that, times the most microbatches the
    stage holds at once (the schedule's order, ``ppbook.planner.simulate``). ``rank_model_bytes``: the
    planner's count for a rank at its peak, which for the schedules that split the backward adds
    what each block keeps after its microbatch's weight pass until the step ends
    (``planner.memory.block_residual_values``, counted per stage by the planner's search)."""
    num_stages = len(stages)

    def per_mb(i):
        st = stages[i]
        layers = [int(b) for b in st["blocks"]]
        rng = recompute.RNG_STATE_BYTES * len(layers) if st["mode"] != "none" else 0
        return planner_memory.stage_activation_bytes(shape, layers, tokens, i == 0, i == num_stages - 1, dtype_bytes,
                                                     kernels_name, st["mode"]) + rng

    held = simulate.peak_in_flight(torch_orders.torch_order(name, pp, m, v))
    residual = planner_memory.values_bytes(planner_memory.block_residual_values(shape), tokens, dtype_bytes)
    ranks = planner_search.rank_saved_bytes(name, pp, m, v, {i: per_mb(i) for i in stages},
                                            {i: residual * len(stages[i]["blocks"]) for i in stages})
    return {"stage_model_bytes": {str(i): held[i] * per_mb(i) for i in sorted(stages)}, "rank_model_bytes": ranks}


def recompute_plan(args) -> tuple[list, list]:
    """(schedule, policies) pairs to run, and those skipped: selective checkpointing fails under the
    schedules that split the backward (torch 2.13; chapter 12 shows the error). A policy written
    ``SCHEDULE:modes`` runs under that schedule only, the others under every ``--schedules``."""
    pairs = [tuple(spec.split(":")) if ":" in spec else (n, spec)
             for spec in args.policies for n in ([None] if ":" in spec else args.schedules)]
    skipped = [(n, spec) for n, spec in pairs if n in SPLIT and "selective" in spec]
    return [x for x in pairs if x not in skipped], skipped


def recompute_costs(runs: list[dict]) -> list[dict]:
    """The extra time of recomputation, isolated: for each checkpointed stage of each run, its
    backward per block (B, or I + W) minus the same stage's under the same schedule without
    checkpointing (a run of ``none`` everywhere in the same launch), next to that run's forward
    per block. Full checkpointing should cost about one forward per block; what the stage runs
    besides its blocks (the embedding, the head) is in both."""
    base = {r["schedule"]: r for r in runs if r and set(r["policies"]) == {"none"}}
    out = []
    for r in runs:
        none = base.get(r.get("schedule"))
        if none is None or r is none:
            continue
        for s, st in sorted(r["stages"].items()):
            if st["mode"] == "none":
                continue
            n = len(st["blocks"])
            backward = [sum(run["stage_costs"].get(f"{s}{kind}", 0.0) for kind in "BIW") for run in (r, none)]
            out.append({"schedule": r["schedule"], "policies": r["policies"], "stage": int(s), "mode": st["mode"],
                        "blocks": n, "forward_per_block": none["stage_costs"][f"{s}F"] / n,
                        "extra_backward_per_block": (backward[0] - backward[1]) / n,
                        "forwards_per_block": st["forwards_per_block"]})
    return out


def recompute_section(args, info) -> dict:
    full = full_llama(args, info.device)
    tokens, targets = workload.make_batch(args, 0, info.device)  # (B, T) each
    ref = reference(full, tokens, targets, args.microbatches)
    plan, skipped = recompute_plan(args)
    if skipped and info.rank == 0:
        print("skipped (selective checkpointing fails under a split backward in torch 2.13): "
              + ", ".join(f"{n} {spec}" for n, spec in skipped))
    runs = [recompute_run(n, spec, full, ref, tokens, targets, args, info)
            for n, spec in tqdm(plan, desc="schedules x policies", disable=info.rank != 0)]
    return {"kernels": args.kernels, "microbatch_tokens": args.batch_size // args.microbatches * args.seq_len,
            "heads": args.heads, "kv_heads": args.kv_heads, "ffn": args.ffn, "vocab": args.vocab,
            "rng_state_bytes": recompute.RNG_STATE_BYTES, "runs": runs, "recompute_costs": recompute_costs(runs),
            "skipped": [{"schedule": n, "policies": spec} for n, spec in skipped]}


# === fsdp =======================================================================================

# [start-fsdp]
def sharded(dp_mesh, reshard_after_forward: bool):
    """FSDP2 over the stage's replicas, as torchtitan wraps a model:
    each block a group (freed after its forward or kept gathered until
    the step's end), then the stage, whose group holds the rest."""
    def prepare(mod, index):
        for block in mod.layers.values():
            fully_shard(block, mesh=dp_mesh,
                        reshard_after_forward=reshard_after_forward)
        fully_shard(mod, mesh=dp_mesh)
        return mod
    return prepare
# [end-fsdp]


def predicted(name, mods, indices, pp_rank, pp, m, reshard) -> dict:
    """This rank's all-gathers per step and the bytes they gather, as the planner predicts them
    (its FSDP count, torch's unshard window included), and the count without the window
    (``planner.traffic.fsdp_gathers`` per group, from the stage's action kinds)."""
    groups = []  # per stage, as the planner takes them: (index, bytes in blocks, bytes in the root group, blocks)
    for i, mod in zip(indices, mods):
        blocks = sum(p.numel() * p.element_size() for p in mod.layers.parameters())
        groups.append((i, blocks, sum(p.numel() * p.element_size() for p in mod.parameters()) - blocks, len(mod.layers)))
    v = len(indices)
    nbytes = planner_search._fsdp_gathered_per_step(name, pp, m, v, pp_rank, reshard, tuple(groups))
    # the same count with every group weighing one: how many all-gathers
    count = planner_search._fsdp_gathered_per_step(name, pp, m, v, pp_rank, reshard,
                                                   tuple((i, n, 1 if root else 0, n) for i, _, root, n in groups))
    order = [(a.stage, a.kind) for a in torch_orders.torch_order(name, pp, m, v)[pp_rank]]
    no_window = sum(n * fsdp_gathers([k for s, k in order if s == i], reshard) + (1 if root else 0)
                    for i, _, root, n in groups)
    return {"planner_gathers": round(count), "planner_gathered_bytes": nbytes, "no_window_gathers": no_window}


def fsdp_run(name, reshard, full, ref, tokens, targets, mesh, args, info) -> dict:
    pp, pp_rank, dp_rank = mesh["pp"].size(), mesh.get_local_rank("pp"), mesh.get_local_rank("dp")
    mods, stages, indices, num_stages = build_stages(name, full, args, pp_rank, pp, info.device,
                                                     sharded(mesh["dp"], reshard), group=mesh.get_group("pp"))
    schedule = make_schedule(name, stages, args.microbatches)
    rec = timeline.Recorder(info.rank)
    for stage in stages:
        rec.attach(stage)
    mine = tokens.chunk(args.dp)[dp_rank], targets.chunk(args.dp)[dp_rank]  # (B/dp, T) each

    def run_step():
        for mod in mods:
            mod.zero_grad(set_to_none=True)
        step(schedule, indices, num_stages, *mine)

    result = timed(run_step, args, info, rec)
    with fsdp_probe.probe() as stats:  # one more step, counting all-gathers and gathered bytes
        run_step()
    diff = torch.tensor(grad_diff(mods, ref), dtype=torch.float64, device=info.device)  # gathers every gradient whole
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    block = next(iter(mods[0].layers.values()))
    row = {"rank": info.rank, "pp_rank": pp_rank, "dp_rank": dp_rank, "stages": indices, **stats.to_json(),
           **predicted(name, mods, indices, pp_rank, pp, args.microbatches, reshard),
           "stage_param_bytes": sum(p.numel() * p.element_size() for mod in mods for p in mod.parameters()),
           "block_param_bytes": sum(p.numel() * p.element_size() for p in block.parameters())}  # numel: whole
    rows = gather_to_rank0(row)
    if result is None:
        return {}
    return {"schedule": name, "reshard_after_forward": reshard, "max_grad_diff": diff.item(), "ranks": rows,
            **result}


def fsdp_section(args, info) -> dict:
    pp = info.world_size // args.dp
    # pp outermost (torchtitan's order): a stage's replicas are neighbouring ranks
    mesh = init_device_mesh(info.device.type, (pp, args.dp), mesh_dim_names=("pp", "dp"))
    full = full_llama(args, info.device)
    tokens, targets = workload.make_batch(args, 0, info.device)  # (B, T): the combined batch
    ref = reference(full, tokens, targets, args.dp * args.microbatches)  # one process, every microbatch
    plan = [(n, r) for n in args.schedules for r in (True, False)]
    runs = [fsdp_run(n, r, full, ref, tokens, targets, mesh, args, info)
            for n, r in tqdm(plan, desc="schedules x resharding", disable=info.rank != 0)]
    return {"dp": args.dp, "pp": pp, "runs": runs}


# === tp =========================================================================================

# [start-tp]
def tensor_parallel(tp_mesh, prepared: bool):
    """Each block's projections split over the tensor-parallel ranks:
    q, k, v, gate and up by output columns (whole heads per rank), the
    attention output and down projections by input rows, whose partial
    sums are all-reduced. ``prepared``: attention and the MLP turn their
    input into one replicated DTensor first (torchtitan's plan), so
    the backward all-reduces its gradient once, not once per layer."""
    def prepare(mod, index):
        for block in mod.layers.values():
            columns = ["attention.wq", "attention.wk", "attention.wv",
                       "feed_forward.w1", "feed_forward.w3"]
            plan = {name: ColwiseParallel() for name in columns}
            plan.update({"attention.wo": RowwiseParallel(),
                         "feed_forward.w2": RowwiseParallel()})
            if prepared:  # attention takes (x, cos, sin, mask), the MLP (x,)
                for part, n in (("attention", 4), ("feed_forward", 1)):
                    layouts = (Replicate(), *[None] * (n - 1))
                    plan[part] = PrepareModuleInput(
                        input_layouts=layouts, desired_input_layouts=layouts,
                        use_local_output=False)
            parallelize_module(block, tp_mesh, plan)
            block.attention.n_heads //= tp_mesh.size()  # this rank's heads
            block.attention.n_kv_heads //= tp_mesh.size()
        return mod
    return prepare
# [end-tp]


class CollectiveClock(TorchDispatchMode):
    """Records when each functional collective (what DTensor runs) is issued, forward and backward."""

    def __init__(self, rank: int):
        super().__init__()
        self.rank, self.events = rank, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        start = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        name = str(func)
        if name.startswith("_c10d_functional.") and "wrap_tensor" not in name:
            self.events.append({"rank": self.rank, "op": name.split(".")[1], "start": start,
                                "end": time.perf_counter(),
                                "bytes": args[0].numel() * args[0].element_size() if name.endswith("all_reduce.default")
                                else 0})
        return out


def tp_run(prepared, full, ref, tokens, targets, mesh, args, info) -> dict:
    name = args.schedules[0]
    pp, pp_rank = mesh["pp"].size(), mesh.get_local_rank("pp")
    mods, stages, indices, num_stages = build_stages(name, full, args, pp_rank, pp, info.device,
                                                     tensor_parallel(mesh["tp"], prepared), group=mesh.get_group("pp"))
    schedule = make_schedule(name, stages, args.microbatches)
    rec = timeline.Recorder(info.rank)
    for stage in stages:
        rec.attach(stage)

    def run_step():
        for mod in mods:
            mod.zero_grad(set_to_none=True)
        step(schedule, indices, num_stages, tokens, targets)

    result = timed(run_step, args, info, rec)
    clock = CollectiveClock(info.rank)
    dist.barrier()
    rec.start_step()
    with clock:  # one more step, recording the collectives next to the actions
        run_step()
    diff = torch.tensor(grad_diff(mods, ref), dtype=torch.float64, device=info.device)
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    rows = gather_to_rank0({"actions": timeline.to_json(rec.events), "collectives": clock.events,
                            "blocks": sum(len(mod.layers) for mod in mods)})
    if result is None:
        return {}
    t0 = min(e["start"] for r in rows for e in r["actions"])
    for r in rows:
        for e in r["actions"] + r["collectives"]:
            e["start"], e["end"] = e["start"] - t0, e["end"] - t0
    return {"schedule": name, "prepared": prepared, "max_grad_diff": diff.item(),
            "probed": rows, **result}


def tp_section(args, info) -> dict:
    pp = info.world_size // args.tp
    # tp innermost: a stage's tensor-parallel ranks are neighbours (one node), the pipeline crosses
    mesh = init_device_mesh(info.device.type, (pp, args.tp), mesh_dim_names=("pp", "tp"))
    full = full_llama(args, info.device)
    tokens, targets = workload.make_batch(args, 0, info.device)  # (B, T): every tp rank the same
    ref = reference(full, tokens, targets, args.microbatches)
    runs = [tp_run(prepared, full, ref, tokens, targets, mesh, args, info)
            for prepared in tqdm((False, True), desc="tp plans", disable=info.rank != 0)]
    return {"tp": args.tp, "pp": pp, "microbatch_size": args.batch_size // args.microbatches,
            "runs": runs}


# === shapes =====================================================================================

def last_stage_values(values: list):
    """This rank's per-step values on the rank that holds the last stage (``None`` elsewhere), on rank 0."""
    rows = gather_to_rank0(values)
    return None if rows is None else next(r for r in rows if r and r[0] is not None)


def naive_lengths(args, info) -> dict:
    """One schedule, stepped with batches whose shape changes: what PipelineStage does then."""
    full = full_llama(args, info.device, max(args.lengths))
    mods, stages, indices, num_stages = build_stages("1F1B", full, args, info.rank, info.world_size, info.device)
    schedule = make_schedule("1F1B", stages, args.microbatches)
    sizes = args.shape_batch_sizes or [args.batch_size] * len(args.lengths)
    steps, losses = [], []
    for i, (length, size) in enumerate(zip(args.lengths, sizes)):
        shape = argparse.Namespace(**{**vars(args), "seq_len": length, "batch_size": size})
        tokens, targets = workload.make_batch(shape, i, info.device)  # (size, length) each
        for mod in mods:
            mod.zero_grad(set_to_none=True)
        mb_losses = step(schedule, indices, num_stages, tokens, targets)
        losses.append(workload.mean_loss(mb_losses) if mb_losses else None)
        ref = reference(full, tokens, targets, args.microbatches)
        diff = torch.tensor(grad_diff(mods, ref), dtype=torch.float64, device=info.device)
        dist.all_reduce(diff, op=dist.ReduceOp.MAX)
        with torch.no_grad():
            ref_loss = torch.stack([workload.loss_fn(ref(t), y) for t, y in zip(
                tokens.tensor_split(args.microbatches), targets.tensor_split(args.microbatches))]).mean().item()
        steps.append({"length": length, "batch_size": size, "reference_loss": ref_loss, "max_grad_diff": diff.item()})
    losses = last_stage_values(losses)
    if losses is None:
        return {}
    for row, loss in zip(steps, losses):
        row["loss"] = loss
    return {"steps": steps, "max_grad_diff": max(r["max_grad_diff"] for r in steps),
            "max_loss_diff": max(abs(r["loss"] - r["reference_loss"]) for r in steps)}


class Documents(torch.nn.Module):
    """A stage (or the whole model) that takes ``doc_ids`` by keyword, as every stage gets it from
    ``step`` (chapter 6), and attends within each document only."""

    def __init__(self, mod):
        super().__init__()
        self.mod = mod

    def forward(self, h, doc_ids=None):
        m = self.mod
        h = m.tok_embeddings(h) if m.tok_embeddings is not None else h  # (b, T) ids -> (b, T, C)
        mask = document_mask(doc_ids) if doc_ids is not None else None  # (b, 1, T, T)
        cos, sin = m.rope_cos[:h.shape[1]], m.rope_sin[:h.shape[1]]
        for layer in m.layers.values():
            h = layer(h, cos, sin, mask)
        return m.output(m.norm(h)) if m.output is not None else h  # logits (b, T, V) on the last stage


# [start-shapes]
def shaped_batches(strategy, rows, lengths, batch_size, buckets):
    """The documents (rows of ids, real lengths) as batches of a shape
    the pipeline can take: ``pad`` to the longest bucket, ``bucket``
    to the next bucket length, ``recreate`` to the batch's own longest
    document, ``pack`` documents back to back into rows of the longest
    bucket, each position tagged with its document (for the mask)."""
    if strategy == "pack":
        tokens, targets, doc_ids = pack(rows, lengths, max(buckets))  # (N, T) each
        for i in range(0, len(tokens) - batch_size + 1, batch_size):
            mine = slice(i, i + batch_size)
            yield tokens[mine], targets[mine], {"doc_ids": doc_ids[mine]}
        return
    for i in batch_starts(len(rows), batch_size):
        r, n = rows[i:i + batch_size], lengths[i:i + batch_size]
        longest = int(n.max()) - 1  # a row of n ids gives n - 1 predictions
        T = max(buckets)  # pad
        if strategy == "bucket":
            T = min(b for b in buckets if b >= longest)
        elif strategy == "recreate":
            T = longest
        # (B, T) each, the padding's targets ignored
        yield *data.inputs_and_targets(r[:, :T + 1], n), {}
# [end-shapes]


def batch_starts(n: int, batch_size: int) -> list[int]:
    """Where each batch of length-sorted rows starts, in a seeded order: similar lengths share a
    batch (little padding), and the length changes from step to step."""
    starts = torch.arange(0, n - batch_size + 1, batch_size)
    return starts[torch.randperm(len(starts), generator=torch.Generator().manual_seed(1))].tolist()


def pack(rows, lengths, T: int):
    """Documents back to back into rows of T positions, a document never cut: tokens, targets and
    each position's document index, (N, T) each; the rest of a row is padding (targets ignored,
    document -1)."""
    out, row = ([], [], []), ([], [], [])

    def close():
        pad = T - len(row[0])
        for got, have, fill in zip(out, row, (0, data.IGNORE_INDEX, -1)):
            got.append(have + [fill] * pad)

    for ids, n in zip(rows.tolist(), lengths.tolist()):
        if len(row[0]) + n - 1 > T:
            close()
            row = ([], [], [])
        doc = len(set(row[2]))
        row[0].extend(ids[:n - 1])
        row[1].extend(ids[1:n])
        row[2].extend([doc] * (n - 1))
    if row[0]:
        close()
    return tuple(torch.tensor(x, device=rows.device) for x in out)  # where the rows were: a GPU's


def documents(args, device):
    """``--documents`` rows of the book's training text (chapter 6's corpus and tokenizer), at most
    the longest bucket long, drawn in a seeded order and sorted by length; and their real lengths."""
    rows, lengths = data.load_local(max(args.buckets), args.vocab).train
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(args.seed))[:args.documents]
    order = order[torch.argsort(lengths[order], stable=True)]  # grouped by length, as trainers batch them
    return rows[order].to(device), lengths[order].to(device)


def strategy_run(strategy, full, rows, lengths, args, info) -> dict:
    """Every batch of the documents through one stage module per rank; PipelineStage objects (and
    their receive buffers) per shape as the strategy needs them, each step checked against one
    process on the same batch."""
    wrap = Documents if strategy == "pack" else (lambda mod: mod)
    mods = [stage_module(copy.deepcopy(full), info.rank, info.world_size)]
    made = {}  # shape -> schedule

    def schedule_for(T):
        if T not in made:
            if strategy == "recreate":
                made.clear()  # a new stage and schedule whenever the length changes
            stage = pipelining.PipelineStage(wrap(mods[0]), info.rank, info.world_size, info.device)
            made[T] = make_schedule("1F1B", [stage], args.microbatches, loss_fn=training.microbatch_mean_loss)
        return made[T]

    steps, built = [], 0
    for tokens, targets, extra in shaped_batches(strategy, rows, lengths, args.batch_size, args.buckets):
        T = tokens.shape[1]
        mods[0].zero_grad(set_to_none=True)
        dist.barrier()
        t0 = time.perf_counter()
        new = T not in made
        built += new
        losses = step(schedule_for(T), [info.rank], info.world_size, tokens, targets, **extra)
        seconds = time.perf_counter() - t0
        ref = reference(wrap(full), tokens, targets, args.microbatches, training.microbatch_mean_loss, **extra)
        diff = grad_diff(mods, ref.mod if strategy == "pack" else ref)
        steps.append([seconds, diff, T, int((targets != data.IGNORE_INDEX).sum()), targets.numel(), new])
    agg = torch.tensor([[s_[0], s_[1]] for s_ in steps], dtype=torch.float64, device=info.device)  # NCCL: a GPU tensor
    dist.all_reduce(agg, op=dist.ReduceOp.MAX)  # the slowest rank's step, the worst difference
    built_here = torch.tensor([s_[5] for s_ in steps], device=info.device)  # the steps that built a stage and schedule
    return {"strategy": strategy, "steps": len(steps), "schedules_built": built,
            "lengths": sorted({s_[2] for s_ in steps}), "seconds": agg[:, 0].sum().item(),
            "building_step_seconds": agg[built_here, 0].mean().item(),
            "other_step_seconds": agg[~built_here, 0].mean().item() if (~built_here).any() else None,
            "max_grad_diff": agg[:, 1].max().item(),
            "real_tokens": sum(s_[3] for s_ in steps), "positions": sum(s_[4] for s_ in steps)}


def shapes_section(args, info) -> dict:
    if args.lengths:
        return {"naive": naive_lengths(args, info)}
    full = full_llama(args, info.device, max(args.buckets))
    rows, lengths = documents(args, info.device)
    runs = [strategy_run(st, full, rows, lengths, args, info)
            for st in tqdm(args.strategies, desc="strategies", disable=info.rank != 0)]
    return {"documents": args.documents, "buckets": args.buckets, "runs": runs}


# === main ======# === main =======================================================================================

def body(args: argparse.Namespace, info) -> int:
    if info.device.type == "cpu":
        torch.set_num_threads(1)  # the same kernels, hence the same bits, on every rank and launcher
    t0 = time.perf_counter()
    sections = {"compile": compile_section, "recompute": recompute_section, "fsdp": fsdp_section, "tp": tp_section, "shapes": shapes_section}
    result = sections[args.section](args, info)
    if info.rank != 0:
        return 0
    result["meta"] = {"command": "torchrun --standalone --nproc-per-node "
                      f"{info.world_size} scripts/12_combinations.py " + " ".join(a for a in (argv_of(args)) if a),
                      "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "python": platform.python_version(),
                      "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, {platform.system()}",
                      "backend": f"{info.backend} ({info.device.type})",
                      "load_average": [round(x, 2) for x in os.getloadavg()]}  # of the machine, at the end
    result.update(section=args.section, world_size=info.world_size, microbatches=args.microbatches,
                  batch_size=args.batch_size, seq_len=args.seq_len, layers=args.layers, dim=args.dim,
                  seconds=time.perf_counter() - t0, torch_version=torch.__version__)
    ok = report(args, result)
    result["match"] = ok
    cli.write_json(args.json, result)
    return 1 if (args.check and not ok) else 0


def argv_of(args) -> list[str]:
    """The command line this run was given, without --json (for the record's meta)."""
    argv = list(getattr(args, "argv", sys.argv[1:]))
    if "--json" in argv:
        i = argv.index("--json")
        del argv[i:i + 2]
    return [shlex.quote(a) for a in argv]


def report(args, result) -> bool:
    """Human lines on rank 0; whether every run that ran equals the one-process reference."""
    ok = True
    if args.section == "compile":
        tol = precision.tolerance(args.dtype)  # LoopedBFS adds its microbatches' gradients in another order
        ran_compiled = 0
        for r in result["runs"]:
            if r["refused"]:
                print(f"{r['schedule']:>21} {r['mode']:<8} refused: {r['refused'][:90]}")
                continue
            # a compiled mode must have run compiled graphs (not fallen back to eager), eager none
            per_rank = r.get("compiled_runs_per_rank", [r["compiled_runs"]])
            compiled_ok = min(per_rank) > 0 if r["mode"] != "eager" else max(per_rank) == 0
            ran_compiled += r["mode"] != "eager" and compiled_ok
            good = r["max_grad_diff"] <= tol and compiled_ok
            ok &= good
            print(f"{r['schedule']:>21} {r['mode']:<8} step {1e3 * r['step_seconds']:7.1f} ms  graphs {r['graphs']}  "
                  f"compiled runs {r['compiled_runs']}  max |grad diff| {r['max_grad_diff']:.1e} "
                  f"{'MATCH' if good else 'MISMATCH' if compiled_ok else 'NOT COMPILED'}")
        if set(args.compile_modes) != {"eager"} and not ran_compiled:
            print("no schedule ran compiled: every compiled mode was refused or fell back to eager")
            ok = False
    if args.section == "recompute":
        for r in result["runs"]:
            good = r["max_grad_diff"] <= precision.tolerance(args.dtype)
            ok &= good
            kept = "  ".join(f"{s}:{v['mode']} {v['block_bytes']} x{v['forwards_per_block']:.2f}"
                             for s, v in sorted(r["stages"].items()))
            print(f"{r['schedule']:>14} {','.join(r['policies']):<24} step {1e3 * r['step_seconds']:6.1f} ms  "
                  f"{kept}  {'MATCH' if good else 'MISMATCH'}")
    if args.section == "fsdp":
        for r in result["runs"]:
            good = r["max_grad_diff"] <= precision.tolerance(args.dtype)
            ok &= good
            gathers = " ".join(f"{x['all_gathers']}/{x['planner_gathers']}/{x['no_window_gathers']}" for x in r["ranks"])
            print(f"{r['schedule']:>16} reshard_after_forward={r['reshard_after_forward']!s:<5} step "
                  f"{1e3 * r['step_seconds']:6.1f} ms  all-gathers per rank (measured/planner/without the window) "
                  f"{gathers}  "
                  f"max |grad diff| {r['max_grad_diff']:.1e} {'MATCH' if good else 'MISMATCH'}")
    if args.section == "tp":
        for r in result["runs"]:
            good = r["max_grad_diff"] <= precision.tolerance(args.dtype)
            ok &= good
            row0 = r["probed"][0]
            n = sum(1 for c in row0["collectives"] if c["op"] == "all_reduce")
            print(f"{'prepared' if r['prepared'] else 'per layer':>10} step {1e3 * r['step_seconds']:6.1f} ms  "
                  f"rank 0: {n} all-reduces for {row0['blocks']} blocks x {args.microbatches} microbatches  "
                  f"max |grad diff| {r['max_grad_diff']:.1e} {'MATCH' if good else 'MISMATCH'}")
    if args.section == "shapes" and "naive" in result:
        for r in result["naive"]["steps"]:
            print(f"length {r['length']:4d} batch {r['batch_size']:3d}: loss {r['loss']:.6f}, one process "
                  f"{r['reference_loss']:.6f}, max |grad diff| {r['max_grad_diff']:.1e}")
        ok &= result["naive"]["max_grad_diff"] <= precision.tolerance(args.dtype)
    if args.section == "shapes" and "runs" in result:
        for r in result["runs"]:
            good = r["max_grad_diff"] <= precision.tolerance(args.dtype)
            ok &= good
            print(f"{r['strategy']:>9}: {r['steps']} steps at lengths {r['lengths']}, {r['schedules_built']} schedules "
                  f"built, {r['real_tokens'] / r['seconds']:8.0f} tokens/s, "
                  f"{100 * (1 - r['real_tokens'] / r['positions']):4.1f}% padding  {'MATCH' if good else 'MISMATCH'}")
    print("MATCH: every run equals the one-process run" if ok else "MISMATCH in at least one run")
    return ok


def main(argv=None) -> int:
    return cli.run("12_combinations.py", parse_args(argv), validate, body)


if __name__ == "__main__":
    sys.exit(main())
