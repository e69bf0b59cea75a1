"""Chapter 12: tensor parallelism inside each stage of a pipeline, each run checked against one
process.

Tensor parallelism over a ("pp", "tp") mesh with ``parallelize_module``, two plans (each projection
on its own, or attention's and the MLP's input prepared once); where the all-reduces sit in each
forward and backward, recorded beside the pipeline's actions.

CPU (gloo), 2 stages by 2 tensor-parallel ranks:
    torchrun --standalone --nproc-per-node 4 scripts/12_tp.py --check
GPUs (NCCL), larger sizes:
    torchrun --standalone --nproc-per-node 4 scripts/12_tp.py --device cuda --dim 1024 --heads 16 --kv-heads 4 --ffn 2816 --seq-len 512 --batch-size 32
"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, parallelize_module
from torch.utils._python_dispatch import TorchDispatchMode
from tqdm import tqdm

from ppbook import cli, precision, timeline, workload
from ppbook.combined import (begin, build_stages, finish, full_llama, grad_diff, make_schedule, parser, reference,
                             stepper, timed)
from ppbook.combined import validate as validate_common
from ppbook.dist import gather_to_rank0


def parse_args(argv=None):
    p = parser(__doc__, ["1F1B"])
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel size of the (pp, tp) mesh")
    return p.parse_args(argv)


def validate(args, world_size: int) -> None:
    if args.tp < 1 or world_size % args.tp:
        raise ValueError(f"--tp {args.tp} must divide the number of processes ({world_size}); pick one of "
                         f"{[d for d in range(1, world_size + 1) if world_size % d == 0]}")
    validate_common(args, world_size // args.tp)
    if args.heads % args.tp or args.kv_heads % args.tp or args.ffn % args.tp:
        raise ValueError(f"--tp {args.tp} must divide --heads {args.heads}, --kv-heads {args.kv_heads} and --ffn "
                         f"{args.ffn}: each tensor-parallel rank computes whole heads")


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
    run_step = stepper(schedule, mods, indices, num_stages, tokens, targets)

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



def body(args, info) -> int:
    t0 = begin(info)
    pp = info.world_size // args.tp
    # tp innermost: a stage's tensor-parallel ranks are neighbours (one node), the pipeline crosses
    mesh = init_device_mesh(info.device.type, (pp, args.tp), mesh_dim_names=("pp", "tp"))
    full = full_llama(args, info.device)
    tokens, targets = workload.make_batch(args, 0, info.device)  # (B, T): every tp rank the same
    ref = reference(full, tokens, targets, args.microbatches)
    runs = [tp_run(prepared, full, ref, tokens, targets, mesh, args, info)
            for prepared in tqdm((False, True), desc="tp plans", disable=info.rank != 0)]
    if info.rank != 0:
        return 0
    result = {"tp": args.tp, "pp": pp, "microbatch_size": args.batch_size // args.microbatches, "runs": runs}
    return finish("12_tp.py", args, info, result, t0, report(args, runs))


def report(args, runs) -> bool:
    """Human lines on rank 0; whether every run equals the one-process reference."""
    ok = True
    for r in runs:
        good = r["max_grad_diff"] <= precision.tolerance(args.dtype)
        ok &= good
        row0 = r["probed"][0]
        n = sum(1 for c in row0["collectives"] if c["op"] == "all_reduce")
        print(f"{'prepared' if r['prepared'] else 'per layer':>10} step {1e3 * r['step_seconds']:6.1f} ms  "
              f"rank 0: {n} all-reduces for {row0['blocks']} blocks x {args.microbatches} microbatches  "
              f"max |grad diff| {r['max_grad_diff']:.1e} {'MATCH' if good else 'MISMATCH'}")
    return ok


def main(argv=None) -> int:
    return cli.run("12_tp.py", parse_args(argv), validate, body)


if __name__ == "__main__":
    sys.exit(main())
