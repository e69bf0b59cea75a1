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


def pick_device(local_rank: int, device: str = "auto") -> torch.device:
    """``auto``: this process's GPU when there is one, else the CPU. ``cpu`` forces the CPU."""
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"--device must be auto, cpu or cuda, got {device!r}")
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but torch.cuda.is_available() is False; use --device cpu")
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def restarted_store(rank: int, world_size: int, timeout_s: float):
    """After torchrun restarted the group (``--max-restarts``), its store, or ``None`` on a first start.

    torchrun 2.13 keeps one store for all attempts, so a restarted gloo group can read the
    addresses the killed group published there and fail with "Gloo connectFullMesh failed ...
    Connection refused". A prefix per attempt gives each attempt keys of its own (chapter 7).
    """
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if attempt == 0:
        return None
    store, _, _ = next(dist.rendezvous("env://", rank, world_size, timeout=timedelta(seconds=timeout_s)))
    return dist.PrefixStore(f"/ppbook/attempt_{attempt}", store)


def setup(device: str = "auto", timeout_s: float = 120.0) -> DistInfo:
    """Join (or create) the default process group and return who we are.

    ``timeout_s`` bounds every collective and point-to-point wait, so a rank whose peer died
    raises instead of hanging forever.
    """
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
