"""Process-group set-up and tear-down, the same on a laptop CPU and on a GPU cluster.

Introduced in chapter 1 ("Your first pipeline"); every companion script uses it.

Under torchrun (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` set) :func:`setup`
joins the job's process group: gloo on CPU, the device's default backend (NCCL on NVIDIA GPUs)
otherwise. Run as a plain ``python script.py``, it makes a one-process group instead, so the
same pipeline code runs unchanged with a single stage.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    @property
    def is_last(self) -> bool:
        return self.rank == self.world_size - 1


def launched_by_torchrun(environ: dict | None = None) -> bool:
    environ = os.environ if environ is None else environ
    return all(v in environ for v in TORCHRUN_VARS)


def local_world_size(environ: dict | None = None) -> int:
    """How many processes torchrun starts on this node (``LOCAL_WORLD_SIZE``; 1 without torchrun)."""
    environ = os.environ if environ is None else environ
    return int(environ.get("LOCAL_WORLD_SIZE", "1"))


def pick_device(local_rank: int, device: str = "auto") -> torch.device:
    """``auto``: this process's GPU when every process on the node has one, else the CPU.
    ``cpu`` forces the CPU; ``cuda`` refuses, in one line, a node with fewer GPUs than processes
    (two processes on one GPU fail in NCCL, "Duplicate GPU detected", and gloo cannot send CUDA
    tensors). Called before any process group exists."""
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"--device must be auto, cpu or cuda, got {device!r}")
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but torch.cuda.is_available() is False; use --device cpu")
    gpus, procs = torch.cuda.device_count(), local_world_size()
    if procs > gpus:
        if device == "auto":  # e.g. the CPU commands on a laptop with one GPU
            return torch.device("cpu")
        raise ValueError(f"--device cuda: found {gpus} GPU(s) on this node for {procs} processes (one GPU each); "
                         f"run torchrun --nproc-per-node {gpus} (more stages: more nodes), or --device cpu")
    return torch.device("cuda", local_rank % gpus)


def on_device(device: torch.device | str, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``tensors`` on ``device``, contiguous: what a stage or a schedule may be handed.

    A stage's inputs must live on the stage's device (held-out tokens left on the CPU fail on a
    GPU: "Expected all tensors to be on the same device"), and torch 2.11 checks their strides
    against the stage's expectation, so a slice such as ``rows[:, :-1]`` fails there with
    "PipeliningShapeError: ... stride mismatch". Introduced in chapter 6.
    """
    return tuple(t.to(device).contiguous() for t in tensors)


V_SCHEDULES = ("ZBVZeroBubble", "DualPipeV")  # a rank holds two adjacent stages (the V's tip)


def schedule_backend_problem(name: str, device: torch.device, world_size: int | None = None) -> str | None:
    """Why schedule ``name`` cannot run on ``device``'s backend with the installed torch, or ``None``.

    Under torch < 2.13 on gloo a rank that holds two adjacent stages sends to itself in
    ``_initialize_stages``, which gloo refuses ("Pair is not connected"): the V's tip, at any number
    of processes, and every stage of a looped schedule at one process (``world_size`` 1; without
    ``world_size`` only the V-shaped schedules are judged). NCCL and torch 2.13 are fine.
    """
    from torch.torch_version import TorchVersion

    from ppbook.planner.schedules import placement, stage_to_rank

    if device.type != "cpu" or TorchVersion(torch.__version__) >= (2, 13):
        return None
    if name in V_SCHEDULES:
        return (f"{name} on gloo (CPU) needs torch >= 2.13, found {torch.__version__}; upgrade torch, run on GPUs "
                f"(--device cuda), or pick another schedule")
    if world_size is not None and placement(name) != "single":
        ranks = stage_to_rank(name, world_size)
        if any(ranks[s] == ranks[s + 1] for s in range(len(ranks) - 1)):
            return (f"{name} at {world_size} process(es) on gloo (CPU) needs torch >= 2.13, found {torch.__version__} "
                    f"(a rank holding two adjacent stages sends to itself); upgrade torch, run on GPUs (--device "
                    f"cuda), start more processes, or pick Schedule1F1B")
    return None


def restarted_store(rank: int, world_size: int, timeout_s: float):
    """After torchrun restarted the group (``--max-restarts``),
    its store, or ``None`` on a first start.

    torchrun 2.13 keeps one store for all attempts, so a restarted gloo
    group can read the addresses the killed group published there and fail
    with "Gloo connectFullMesh failed ... Connection refused". A prefix
    per attempt gives each attempt keys of its own (chapter 7).
    """
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if attempt == 0:
        return None
    store, _, _ = next(
        dist.rendezvous(
            "env://", rank, world_size, timeout=timedelta(seconds=timeout_s)
        )
    )
    return dist.PrefixStore(f"/ppbook/attempt_{attempt}", store)


def setup(device: str = "auto", timeout_s: float = 120.0) -> DistInfo:
    """Join (or create) the default process group and return who we are.

    ``timeout_s`` bounds every collective and point-to-point wait, so a rank whose peer died
    raises instead of hanging forever.
    """
    from ppbook import nccl_rules

    nccl_rules.install_if_asked()  # PPBOOK_NCCL_RULES=1: gloo held to NCCL's rules (appendix A3)
    if launched_by_torchrun():
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ["LOCAL_RANK"])
        store = restarted_store(rank, world_size, timeout_s)
    else:  # plain `python script.py`: a one-process group backed by an in-memory store
        rank, world_size, local_rank = 0, 1, 0
        store = dist.HashStore()
    dev = pick_device(local_rank, device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    backend = dist.get_default_backend_for_device(dev)
    if not dist.is_initialized():
        kwargs = dict(backend=backend, timeout=timedelta(seconds=timeout_s))
        if store is not None:
            kwargs.update(store=store, rank=rank, world_size=world_size)
        if dev.type == "cuda":
            kwargs["device_id"] = dev
        dist.init_process_group(**kwargs)
    return DistInfo(rank, world_size, local_rank, dev, backend)


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def gather_to_rank0(obj):
    """Every rank's ``obj`` as a list on rank 0 (``None`` on the others)."""
    out = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out
