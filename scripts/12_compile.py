"""Chapter 12: torch.compile inside a pipeline, under every schedule, each run checked against one
process.

Each stage's blocks wrapped (``torch.compile(block)``, torchtitan's way before torchtitan#2688), or
each stage whole (``--stage`` picks the schedules for whole stages); the schedules that split the
backward refuse these wrappers. ``block.compile()`` (in place, torchtitan's way today) passes that
check and fails at the first step on donated buffers; mode in-place runs it with donated buffers
and inductor's caches off (with the caches on, ``--keep-compile-caches``, the gradients come out
wrong). ``--check`` also fails if a compiled run's graphs never ran.

CPU (gloo), with aot_eager (AOTAutograd's graphs on eager kernels, seconds):
    torchrun --standalone --nproc-per-node 2 scripts/12_compile.py --check
With inductor, torch.compile's default backend (minutes of compiling on a CPU; chapter 12's record,
data/recorded/compile_inductor.json):
    torchrun --standalone --nproc-per-node 2 scripts/12_compile.py --backend inductor --steps 5 --donated-buffers-probe --check
GPUs (NCCL):
    torchrun --standalone --nproc-per-node 2 scripts/12_compile.py --device cuda --backend inductor --check
"""

from __future__ import annotations

import contextlib
import copy
import functools
import sys

import torch
import torch.distributed as dist
from torch.distributed import pipelining
from tqdm import tqdm

from ppbook import cli, precision, timeline, workload
from ppbook.combined import (SCHEDULES, begin, build_stages, finish, full_llama, grad_diff, make_schedule,
                             parser, reference, stepper, timed)
from ppbook.combined import validate as validate_common
from ppbook.dist import gather_to_rank0
from ppbook.planner.schedules import SPLIT_BACKWARD as SPLIT  # split the backward into I and W
from ppbook.stages import stage_module

COMPILE_MODES = ("eager", "blocks", "stage", "in-place")


def parse_args(argv=None):
    p = parser(__doc__, SCHEDULES)
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
    return p.parse_args(argv)


def validate(args, world_size: int) -> None:
    validate_common(args, world_size)
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
    run_step = stepper(schedule, mods, indices, num_stages, tokens, targets)

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


def body(args, info) -> int:
    t0 = begin(info)
    full = full_llama(args, info.device)
    tokens, targets = workload.make_batch(args, 0, info.device)  # (B, T) each; the same batch every step
    ref = reference(full, tokens, targets, args.microbatches)  # eager, one process
    donated = donated_buffers_error(full, tokens, targets, args, info) if args.donated_buffers_probe else None
    only = {"in-place": args.in_place or [n for n in args.schedules if n in SPLIT],  # where the wrappers are refused
            "stage": args.stage or args.schedules}
    plan = [(n, m) for n in args.schedules for m in args.compile_modes if n in only.get(m, [n])]
    runs = [compile_run(name, mode, full, ref, tokens, targets, args, info)
            for name, mode in tqdm(plan, desc="schedules x compile modes", disable=info.rank != 0)]
    if info.rank != 0:
        return 0
    result = {"backend": args.backend, "donated_buffers_error": donated, "runs": runs}
    return finish("12_compile.py", args, info, result, t0, report(args, runs))


def report(args, runs) -> bool:
    """Human lines on rank 0; whether every run that ran equals the one-process reference and ran
    its compiled graphs (a compiled mode must not fall back to eager, eager runs none)."""
    tol = precision.tolerance(args.dtype)  # LoopedBFS adds its microbatches' gradients in another order
    ok, ran_compiled = True, 0
    for r in runs:
        if r["refused"]:
            print(f"{r['schedule']:>21} {r['mode']:<8} refused: {r['refused'][:90]}")
            continue
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
    return ok


def main(argv=None) -> int:
    return cli.run("12_compile.py", parse_args(argv), validate, body)


if __name__ == "__main__":
    sys.exit(main())
