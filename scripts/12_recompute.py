"""Chapter 12: activation checkpointing in a pipeline, a policy per stage, each run checked against
one process.

Activation checkpointing per block, full or selective (torchtitan's policy), a policy per stage;
each block's kept bytes, and each stage's kept bytes across the step (their high-water mark),
against the planner's memory model; the extra backward time per block over the same schedule
without checkpointing (``recompute_costs``).

CPU (gloo):
    torchrun --standalone --nproc-per-node 2 scripts/12_recompute.py --check
The extra time of recomputation at a size where computing dominates (chapter 12's record,
data/recorded/recompute_cost.json):
    torchrun --standalone --nproc-per-node 2 scripts/12_recompute.py --policies none full selective ZBVZeroBubble:none ZBVZeroBubble:full --dim 512 --heads 8 --kv-heads 4 --ffn 1408 --seq-len 256 --steps 5 --check
GPUs (NCCL):
    torchrun --standalone --nproc-per-node 2 scripts/12_recompute.py --device cuda --check
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from tqdm import tqdm

from ppbook import cli, kernels, precision, recompute, timeline, torch_orders, workload
from ppbook.combined import (SCHEDULES, begin, build_stages, finish, full_llama, grad_diff, llama_shape,
                             make_schedule, parser, reference, stepper, timed)
from ppbook.combined import validate as validate_common
from ppbook.dist import gather_to_rank0
from ppbook.models import RMSNorm
from ppbook.planner import memory as planner_memory
from ppbook.planner import search as planner_search
from ppbook.planner import simulate
from ppbook.planner.schedules import SPLIT_BACKWARD as SPLIT  # split the backward into I and W
from ppbook.stages import stage_indices


def parse_args(argv=None):
    p = parser(__doc__, ["1F1B"])
    p.add_argument("--policies", nargs="+", default=["none", "full", "selective", "full,none"],
                   help="activation checkpointing per run: one mode for every stage, or one per stage "
                        "separated by commas (none, full, selective); SCHEDULE:modes for that schedule only")
    p.add_argument("--kernels", choices=["book", "fused"], default="book",
                   help="the book's Llama block, or the same block with fused kernels (ppbook.kernels)")
    return p.parse_args(argv)


def validate(args, world_size: int) -> None:
    validate_common(args, world_size)
    for spec in args.policies:
        name, _, modes = spec.rpartition(":")
        if name and name not in SCHEDULES:
            raise ValueError(f"--policies {spec!r}: {name!r} is not a schedule; use one of {', '.join(SCHEDULES)}")
        if name:
            validate_common(args, world_size, [name])
        for mode in modes.split(","):
            if mode not in ("none", "full", "selective"):
                raise ValueError(f"--policies {spec!r}: {mode!r} is not one of none, full, selective")
    if not recompute_plan(args)[0]:
        raise ValueError(f"selective checkpointing cannot run under {', '.join(args.schedules)} with torch 2.13: the "
                         f"weight-gradient pass runs a second backward through each checkpointed block, and "
                         f"selective checkpointing allows one (chapter 12 shows the error); use full or none there")


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
    run_step = stepper(schedule, mods, indices, num_stages, tokens, targets)

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


def body(args, info) -> int:
    t0 = begin(info)
    full = full_llama(args, info.device)
    tokens, targets = workload.make_batch(args, 0, info.device)  # (B, T) each
    ref = reference(full, tokens, targets, args.microbatches)
    plan, skipped = recompute_plan(args)
    if skipped and info.rank == 0:
        print("skipped (selective checkpointing fails under a split backward in torch 2.13): "
              + ", ".join(f"{n} {spec}" for n, spec in skipped))
    runs = [recompute_run(n, spec, full, ref, tokens, targets, args, info)
            for n, spec in tqdm(plan, desc="schedules x policies", disable=info.rank != 0)]
    if info.rank != 0:
        return 0
    result = {"kernels": args.kernels, "microbatch_tokens": args.batch_size // args.microbatches * args.seq_len,
              "rng_state_bytes": recompute.RNG_STATE_BYTES, "runs": runs, "recompute_costs": recompute_costs(runs),
              "skipped": [{"schedule": n, "policies": spec} for n, spec in skipped]}
    return finish("12_recompute.py", args, info, result, t0, report(args, runs))


def report(args, runs) -> bool:
    """Human lines on rank 0; whether every run equals the one-process reference."""
    ok = True
    for r in runs:
        good = r["max_grad_diff"] <= precision.tolerance(args.dtype)
        ok &= good
        kept = "  ".join(f"{s}:{v['mode']} {v['block_bytes']} x{v['forwards_per_block']:.2f}"
                         for s, v in sorted(r["stages"].items()))
        print(f"{r['schedule']:>14} {','.join(r['policies']):<24} step {1e3 * r['step_seconds']:6.1f} ms  "
              f"{kept}  {'MATCH' if good else 'MISMATCH'}")
    return ok


def main(argv=None) -> int:
    return cli.run("12_recompute.py", parse_args(argv), validate, body)


if __name__ == "__main__":
    sys.exit(main())
