"""Pipeline x data parallelism (PP x DP): a 2-D DeviceMesh of (dp, pp), every pipeline stage
replicated over its data-parallel group with FSDP2's ``fully_shard``, trained for a few AdamW
steps and checked against one process on the combined batch. The same training function runs
under torchrun (one node or several) and under Ray Train's TorchTrainer.

CPU, 4 processes = 2 replicas x 2 stages (gloo):
    torchrun --standalone --nproc-per-node 4 scripts/09_scaling_out.py --dp 2 --check
Two "nodes" on this machine (run each line in its own terminal; c10d rendezvous on loopback):
    torchrun --nnodes 2 --nproc-per-node 2 --node-rank 0 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29577 --rdzv-id pp-dp scripts/09_scaling_out.py --dp 2 --check
    torchrun --nnodes 2 --nproc-per-node 2 --node-rank 1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29577 --rdzv-id pp-dp scripts/09_scaling_out.py --dp 2 --check
Ray Train, 4 CPU workers (gloo), the same function and numbers:
    python scripts/09_scaling_out.py --ray-workers 4 --dp 2 --check
Ray Train on a cluster of GPU nodes (scripts/09_ray_cluster.yaml), 2 replicas x 4 stages:
    python scripts/09_scaling_out.py --ray-address auto --device cuda --ray-workers 8 --dp 2
GPUs (NCCL), two nodes of 8 GPUs, PP 4 x DP 4 with the pipeline across the nodes and each stage's FSDP
group within one (Slurm: sbatch scripts/09_slurm.sbatch), on each node:
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint $HEAD:29500 --rdzv-id $JOB scripts/09_scaling_out.py --dp 4 --mesh pp,dp --device cuda
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
import types

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from ppbook import dist as ppdist
from ppbook import cli, driver, workload
from ppbook import fsdp_probe, precision
from ppbook.stages import stage_module

WRAPS = ("blocks", "blocks-keep", "stage")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    cli.add_common_args(p, microbatches=2, microbatches_help="microbatches per replica's pipeline",
                       batch_size=16, mixed_precision=True)
    p.add_argument("--dp", type=int, default=2, help="data-parallel replicas; pipeline stages = world size / dp")
    p.add_argument("--mesh", choices=["dp,pp", "pp,dp"], default="dp,pp",
                   help="the mesh's dimensions, outermost first: dp,pp puts a pipeline's stages on neighbouring "
                        "ranks (fine on one node); pp,dp puts a stage's replicas there, so FSDP stays within a node "
                        "and the pipeline crosses nodes (Megatron-LM's and torchtitan's order; chapter 9)")
    p.add_argument("--steps", type=int, default=3, help="optimizer steps (AdamW)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--replicate", choices=["fsdp", "ddp"], default="fsdp",
                   help="how a stage is replicated over --dp; ddp shows torch 2.13's failure (chapter 9)")
    p.add_argument("--fsdp-wrap", choices=WRAPS, default="blocks",
                   help="blocks: fully_shard each block, then the stage; blocks-keep: the same without resharding "
                        "after forward; stage: one fully_shard around the whole stage")
    p.add_argument("--probe-wraps", nargs="+", choices=WRAPS, default=[],
                   help="after training, one step per wrapping on fresh stages: all-gathers and unsharded bytes")
    p.add_argument("--ray-workers", type=int, default=0,
                   help="run under Ray Train's TorchTrainer with this many workers instead of torchrun")
    p.add_argument("--ray-address", default=None,
                   help="an existing Ray cluster ('auto' on its nodes); default: start one on this machine")
    return p.parse_args(argv)


def validate(args: argparse.Namespace, world_size: int) -> None:
    """One line per bad combination, before any process group (or Ray) exists."""
    if args.ray_workers < 0:
        raise ValueError(f"--ray-workers must be 0 (torchrun) or more, got {args.ray_workers}")
    if args.dp < 1 or world_size % args.dp:
        raise ValueError(f"--dp {args.dp} must divide the number of processes ({world_size}); "
                         f"pick --dp from {[d for d in range(1, world_size + 1) if world_size % d == 0]}")
    cli.validate_common(args, world_size // args.dp)
    if args.batch_size % (args.dp * args.microbatches):
        raise ValueError(f"--batch-size {args.batch_size} must split into --dp {args.dp} replicas of "
                         f"--microbatches {args.microbatches} equal microbatches; try --batch-size "
                         f"{-(-args.batch_size // (args.dp * args.microbatches)) * args.dp * args.microbatches}")


def full_weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter, whole: a sharded (DTensor) one is gathered over its group (collective)."""
    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().cpu()
            for n, p in module.named_parameters()}


def digest(weights: dict[str, torch.Tensor]) -> str:
    """A fingerprint of every parameter's bits: equal digests mean bitwise-equal weights."""
    h = hashlib.sha256()
    for name, w in sorted(weights.items()):
        h.update(name.encode() + w.contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


# [start-shard]
def shard_stage(stage_mod, dp_mesh, wrap: str = "blocks") -> None:
    """FSDP2 over the replicas of this stage, wrapped as torchtitan wraps a model: each
    block its own group, gathered just before it runs and freed after its forward
    (unless ``blocks-keep``), then the stage, whose group holds the rest (embedding,
    norm, head) and stays gathered through the step."""
    if wrap != "stage":
        for block in stage_mod.layers.values():
            fully_shard(block, mesh=dp_mesh, reshard_after_forward=wrap == "blocks")
    fully_shard(stage_mod, mesh=dp_mesh)
# [end-shard]


# [start-mesh]
def build_replicated_stage(args, info):
    """This rank's pipeline stage, replicated over its data-parallel group."""
    pp = info.world_size // args.dp
    # outermost first: ("dp", "pp") makes a pipeline's stages neighbouring
    # ranks, ("pp", "dp") a stage's replicas (across nodes: pp outermost)
    names = tuple(args.mesh.split(","))
    sizes = {"dp": args.dp, "pp": pp}
    mesh = init_device_mesh(
        info.device.type, tuple(sizes[n] for n in names), mesh_dim_names=names
    )
    # this rank's replica and stage
    dp_rank, pp_rank = mesh.get_local_rank("dp"), mesh.get_local_rank("pp")
    # same seed on every rank
    stage_mod = stage_module(workload.full_model(args, info.device), pp_rank, pp)
    # FSDP2 shards this stage over the replicas holding the
    # same stage (its "dp" group) and reduce-scatters (averages)
    # their gradients after the last microbatch's backward
    wrapped = stage_mod
    if args.dp > 1 and args.replicate == "fsdp":
        # in place: stage_mod's parameters become shards
        shard_stage(stage_mod, mesh["dp"], args.fsdp_wrap)
    elif args.dp > 1:  # what fails in torch 2.13 (chapter 9)
        wrapped = DDP(stage_mod, process_group=mesh.get_group("dp"))
    stage = PipelineStage(
        wrapped,
        stage_index=pp_rank,
        num_stages=pp,
        device=info.device,
        # sends and receives within this rank's pipeline
        group=mesh.get_group("pp"),
    )
    return stage, stage_mod, mesh, dp_rank, pp_rank
# [end-mesh]


# [start-train]
def train(args: argparse.Namespace, info: ppdist.DistInfo) -> dict | None:
    """The training function: the same under torchrun,
    on several nodes and under Ray Train."""
    if info.device.type == "cpu":
        # the same kernels, hence the same bits, whatever the launcher
        torch.set_num_threads(1)
    stage, stage_mod, mesh, dp_rank, pp_rank = build_replicated_stage(args, info)
    schedule = ScheduleGPipe(
        stage, n_microbatches=args.microbatches, loss_fn=workload.loss_fn
    )
    opt = torch.optim.AdamW(stage_mod.parameters(), lr=args.lr)
    where = types.SimpleNamespace(is_first=stage.is_first, is_last=stage.is_last)
    losses, t0 = [], time.perf_counter()
    for step in tqdm(range(args.steps), desc="PP x DP steps", disable=info.rank != 0):
        # combined batch (B, T), every rank
        tokens, targets = workload.make_batch(args, step, info.device)
        # (B/dp, T) each
        mine = tokens.chunk(args.dp)[dp_rank], targets.chunk(args.dp)[dp_rank]
        opt.zero_grad()
        # a no-op unless --dtype bfloat16
        with precision.autocast(info.device, args.dtype):
            # FSDP reduces after the last backward
            mb_losses = driver.schedule_step(schedule, where, *mine)
        opt.step()
        loss = torch.tensor(
            [workload.mean_loss(mb_losses) if mb_losses else 0.0],
            dtype=torch.float64,
            device=info.device,
        )  # NCCL reduces only GPU tensors
        dist.all_reduce(loss)  # comm: the last stages' losses (the others add zero)
        losses.append(loss.item() / args.dp)
    # [end-train]
    seconds = time.perf_counter() - t0
    probes = measure_wraps(args, info, mesh, args.probe_wraps) if args.probe_wraps and args.dp > 1 else None
    result = report(args, info, stage_mod, losses, dp_rank, pp_rank, seconds)
    if result is not None:
        result["fsdp_probe"] = probes
    return result


def measure_wraps(args, info, mesh, wraps) -> list[dict] | None:
    """Two GPipe steps per FSDP wrapping, on fresh copies of this rank's stage, the second under
    :func:`ppbook.fsdp_probe.probe`: every rank's all-gathers and parameter bytes held unsharded."""
    pp = info.world_size // args.dp
    dp_rank, pp_rank = mesh.get_local_rank("dp"), mesh.get_local_rank("pp")
    tokens, targets = workload.make_batch(args, 0, info.device)
    mine = tokens.chunk(args.dp)[dp_rank], targets.chunk(args.dp)[dp_rank]  # (B/dp, T) each
    rows = []
    for wrap in wraps:
        stage_mod = stage_module(workload.full_model(args, info.device), pp_rank, pp)
        full_bytes = sum(p.numel() * p.element_size() for p in stage_mod.parameters())
        shard_stage(stage_mod, mesh["dp"], wrap)
        stage = PipelineStage(stage_mod, stage_index=pp_rank, num_stages=pp, device=info.device,
                              group=mesh.get_group("pp"))
        schedule = ScheduleGPipe(stage, n_microbatches=args.microbatches, loss_fn=workload.loss_fn)
        where = types.SimpleNamespace(is_first=stage.is_first, is_last=stage.is_last)
        driver.schedule_step(schedule, where, *mine)  # the first step also infers shapes (one more gather)
        with fsdp_probe.probe() as stats:         # a steady step
            driver.schedule_step(schedule, where, *mine)
        rows.append({"wrap": wrap, "rank": info.rank, "pp_rank": pp_rank, "stage_param_bytes": full_bytes,
                     **stats.to_json()})
    everyone = ppdist.gather_to_rank0(rows)
    return None if everyone is None else [row for rank_rows in everyone for row in rank_rows]


def report(args, info, stage_mod, losses, dp_rank, pp_rank, seconds) -> dict | None:
    """Compare every rank's trained stage with one process on the combined batch (rank 0 only)."""
    weights = full_weights(stage_mod)
    mine = {"rank": info.rank, "dp_rank": dp_rank, "pp_rank": pp_rank, "node": int(os.environ.get("GROUP_RANK", 0)),
            "host": os.uname().nodename, "digest": digest(weights), "weights": weights}
    everyone = ppdist.gather_to_rank0(mine)
    if info.rank != 0:
        return None
    # The reference: the full model, the combined batch cut into dp x m microbatches, in order, on this
    # rank's device. Its microbatches have the pipeline's shape (B / (dp m) rows), so the same kernels
    # compute the same products: at --dp 1 the sums are the pipeline's, in its order, and agree to the
    # bit on a CPU; at --dp > 1 FSDP averages the replicas' gradients in another order, which the
    # tolerance covers (ppbook.precision). On a GPU the same holds up to kernels that are not
    # deterministic. A reference on another device promises much less: every product comes from other
    # kernels (another blocking of its sums, another attention algorithm), and AdamW divides each
    # gradient by its own running size, so a weight whose gradient is near zero moves by up to the
    # learning rate per step whatever the rounding: the first GPU record (data/gpu/h200-2026-11-28)
    # found 2.4e-5 between an H200's pipeline and a CPU reference after 3 steps at lr 1e-3.
    reference = workload.full_model(args, info.device)
    ref_args = argparse.Namespace(**{**vars(args), "microbatches": args.dp * args.microbatches})
    with precision.autocast(info.device, args.dtype, cache=False):  # around several steps: no cache
        ref_losses = workload.adamw_reference_losses(reference, ref_args, info.device)
    ref = {n: p.detach().cpu() for n, p in reference.named_parameters()}  # beside the gathered weights
    for r in everyone:
        r["max_weight_diff"] = max((w - ref[n]).abs().max().item() for n, w in r.pop("weights").items())
    replicas_equal = all(len({r["digest"] for r in everyone if r["pp_rank"] == s}) == 1
                         for s in {r["pp_rank"] for r in everyone})
    loss_diff = max(abs(a - b) for a, b in zip(losses, ref_losses))
    tol = precision.tolerance(args.dtype)
    ok = replicas_equal and loss_diff <= tol and all(r["max_weight_diff"] <= tol for r in everyone)
    return {"world_size": info.world_size, "dp": args.dp, "pp": info.world_size // args.dp, "mesh": args.mesh,
            "microbatches": args.microbatches, "batch_size": args.batch_size, "dtype": args.dtype,
            "losses": losses, "reference_losses": ref_losses, "max_loss_diff": loss_diff,
            "replicas_equal": replicas_equal, "ranks": everyone, "train_seconds": seconds, "match": ok, "tolerance": tol,
            "launcher": "ray" if args.ray_workers else "torchrun", "torch_version": torch.__version__}


def print_result(result: dict) -> None:
    for r in result["ranks"]:
        print(f"rank {r['rank']} (node {r['node']}): dp {r['dp_rank']}, stage {r['pp_rank']}, "
              f"weights {r['digest']}, max |weight - ref| = {r['max_weight_diff']:.2e}")
    for step, (a, b) in enumerate(zip(result["losses"], result["reference_losses"])):
        print(f"step {step}: PP x DP loss {a:.6f}   one-process loss {b:.6f}")
    print("MATCH: PP x DP reproduces one process on the combined batch" if result["match"] else "MISMATCH")


def body(args: argparse.Namespace, info: ppdist.DistInfo) -> int:
    result = train(args, info)
    if result is None:
        return 0
    print_result(result)
    cli.write_json(args.json, result)
    return 1 if (args.check and not result["match"]) else 0


# [start-ray]
def ray_worker(config: dict) -> None:
    """What each Ray Train worker runs: Ray has already
    joined the process group (gloo or NCCL)."""
    import ray.train
    import ray.train.torch

    args = argparse.Namespace(**config)
    context = ray.train.get_context()
    device = (
        ray.train.torch.get_device() if args.device == "cuda" else torch.device("cpu")
    )
    info = ppdist.DistInfo(
        dist.get_rank(),
        dist.get_world_size(),
        context.get_local_rank(),
        device,
        dist.get_backend(),
    )
    result = train(args, info)  # the same function torchrun runs
    # every worker reports; rank 0 attaches the result
    with tempfile.TemporaryDirectory() as folder:
        if result is not None:
            with open(os.path.join(folder, "result.json"), "w") as f:
                json.dump(result, f)
        checkpoint = (
            ray.train.Checkpoint.from_directory(folder) if result is not None else None
        )
        ray.train.report({"step": args.steps}, checkpoint=checkpoint)


def run_with_ray(args: argparse.Namespace) -> dict:
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    if args.ray_address:  # a cluster of GPU nodes (scripts/09_ray_cluster.yaml)
        ray.init(address=args.ray_address)
    else:
        # this machine: one CPU slot per worker, no dashboard
        # (start-up time on a laptop)
        ray.init(num_cpus=args.ray_workers, include_dashboard=False)
    try:
        with tempfile.TemporaryDirectory(prefix="ppbook-ray-") as storage:
            trainer = TorchTrainer(
                ray_worker,
                train_loop_config=vars(args),
                scaling_config=ScalingConfig(
                    num_workers=args.ray_workers, use_gpu=args.device == "cuda"
                ),
                torch_config=TorchConfig(
                    backend="nccl" if args.device == "cuda" else "gloo",
                    timeout_s=int(args.timeout),
                ),
                run_config=RunConfig(storage_path=storage, name="pp-dp"),
            )
            # rank 0's, copied to storage
            with trainer.fit().checkpoint.as_directory() as folder:
                with open(os.path.join(folder, "result.json")) as f:
                    return json.load(f)
    finally:
        ray.shutdown()
# [end-ray]


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.ray_workers:
        return cli.run("09_scaling_out.py", args, validate, body)
    try:  # on a cluster the driver may sit on a CPU-only head node: the workers have the GPUs
        validate(argparse.Namespace(**{**vars(args), "device": "cpu"}) if args.ray_address else args,
                 args.ray_workers)
    except ValueError as err:
        print(f"09_scaling_out.py: error: {err}", file=sys.stderr)
        return 2
    result = run_with_ray(args)
    print_result(result)
    cli.write_json(args.json, result)
    return 1 if (args.check and not result["match"]) else 0


if __name__ == "__main__":
    sys.exit(main())
