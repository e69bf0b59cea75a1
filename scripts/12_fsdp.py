"""Chapter 12: FSDP2 inside each stage of a pipeline, each run checked against one process.

FSDP2 over a ("pp", "dp") mesh, each block a group and then the stage, resharding after forward on
and off, under a one-stage-per-rank schedule and under torch's runtime with its unshard lookahead;
each rank's all-gathers and gathered bytes measured (``ppbook.fsdp_probe``) beside the planner's
count.

CPU (gloo), 2 stages by 2 replicas:
    torchrun --standalone --nproc-per-node 4 scripts/12_fsdp.py --check
    torchrun --standalone --nproc-per-node 4 scripts/12_fsdp.py --stages-per-rank 4 --layers 8 --check
GPUs (NCCL):
    torchrun --standalone --nproc-per-node 4 scripts/12_fsdp.py --device cuda --check
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from tqdm import tqdm

from ppbook import cli, fsdp_probe, precision, timeline, torch_orders, workload
from ppbook.combined import (begin, build_stages, finish, full_llama, grad_diff, make_schedule, parser, reference,
                             stepper, timed)
from ppbook.combined import validate as validate_common
from ppbook.dist import gather_to_rank0
from ppbook.planner import search as planner_search
from ppbook.planner.traffic import fsdp_gathers


def parse_args(argv=None):
    p = parser(__doc__, ["1F1B", "Interleaved1F1B"])
    p.add_argument("--dp", type=int, default=2, help="data-parallel size of the (pp, dp) mesh")
    return p.parse_args(argv)


def validate(args, world_size: int) -> None:
    if args.dp < 1 or world_size % args.dp:
        raise ValueError(f"--dp {args.dp} must divide the number of processes ({world_size}); pick one of "
                         f"{[d for d in range(1, world_size + 1) if world_size % d == 0]}")
    validate_common(args, world_size // args.dp)
    if args.batch_size % (args.dp * args.microbatches):
        raise ValueError(f"--batch-size {args.batch_size} must split into --dp {args.dp} replicas of --microbatches "
                         f"{args.microbatches} equal microbatches")


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
    run_step = stepper(schedule, mods, indices, num_stages, *mine)

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



def body(args, info) -> int:
    t0 = begin(info)
    pp = info.world_size // args.dp
    # pp outermost (torchtitan's order): a stage's replicas are neighbouring ranks
    mesh = init_device_mesh(info.device.type, (pp, args.dp), mesh_dim_names=("pp", "dp"))
    full = full_llama(args, info.device)
    tokens, targets = workload.make_batch(args, 0, info.device)  # (B, T): the combined batch
    ref = reference(full, tokens, targets, args.dp * args.microbatches)  # one process, every microbatch
    plan = [(n, r) for n in args.schedules for r in (True, False)]
    runs = [fsdp_run(n, r, full, ref, tokens, targets, mesh, args, info)
            for n, r in tqdm(plan, desc="schedules x resharding", disable=info.rank != 0)]
    if info.rank != 0:
        return 0
    return finish("12_fsdp.py", args, info, {"dp": args.dp, "pp": pp, "runs": runs}, t0, report(args, runs))


def report(args, runs) -> bool:
    """Human lines on rank 0; whether every run equals the one-process reference."""
    ok = True
    for r in runs:
        good = r["max_grad_diff"] <= precision.tolerance(args.dtype)
        ok &= good
        gathers = " ".join(f"{x['all_gathers']}/{x['planner_gathers']}/{x['no_window_gathers']}" for x in r["ranks"])
        print(f"{r['schedule']:>16} reshard_after_forward={r['reshard_after_forward']!s:<5} step "
              f"{1e3 * r['step_seconds']:6.1f} ms  all-gathers per rank (measured/planner/without the window) "
              f"{gathers}  max |grad diff| {r['max_grad_diff']:.1e} {'MATCH' if good else 'MISMATCH'}")
    return ok


def main(argv=None) -> int:
    return cli.run("12_fsdp.py", parse_args(argv), validate, body)


if __name__ == "__main__":
    sys.exit(main())
