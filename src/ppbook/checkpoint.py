"""Distributed checkpoints of a pipeline: save, resume, reshard, export, and refuse what is broken.

Introduced in chapter 7 ("Checkpointing, resharding and surviving a crash"); any training
script adopts it in a few lines::

    from ppbook import checkpoint as ckpt
    path = ckpt.find_resume(save_dir, "latest")          # None: start fresh
    train = ckpt.load(path, stage_mod, optimizer, scheduler) if path else {"step": 0, "data_position": 0}
    ...
    ckpt.save(save_dir, step, stage_mod, optimizer, scheduler, {"data_position": pos}, keep=3)

No process holds the whole model, so every rank saves its own stage with
``torch.distributed.checkpoint`` (DCP), in parallel, under the parameters' full names
(``layers.5.attn.qkv.weight``); that naming is what lets a checkpoint written by p stages load
into any other number of stages, or into the plain model in one process.

What this module adds to DCP:

* the optimizer state in the *flattened* form (``StateDictOptions(flatten_optimizer_state_dict=True)``):
  in the default nested form the optimizer's ``param_groups`` are one list that DCP keeps from one
  rank only, so the other stages lose lr, betas and weight decay and resuming fails with
  ``KeyError: 'betas'`` (chapter 7 shows it);
* a train-state record with what a resume needs that is in neither the model nor the optimizer:
  the step, the LR scheduler, the data position and every rank's RNG states;
* atomic commits: everything is written to ``.tmp-step-NNNNNN``, every file's size and SHA-256 go
  into ``manifest.json``, and only then is the folder renamed to ``step-NNNNNN``. A save killed
  half-way leaves a ``.tmp-`` folder that :func:`find_resume` reports and skips; a committed
  checkpoint whose files do not match its manifest is refused in one line;
* one writing job per folder (:func:`lock_writer`): when torchrun itself is SIGKILLed its workers live
  on and keep committing checkpoints; a job restarted on the same folder is refused in one line
  while they live, and free to go as soon as they are dead;
* keeping the newest ``keep`` checkpoints, exporting one to a single ``torch.save`` file that the
  plain model loads with ``strict=True``, and reading which rank wrote which tensor.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import re
import shutil
import tempfile
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

#: The options every save and load here uses. The default (nested) optimizer state is the pitfall.
FLAT = StateDictOptions(flatten_optimizer_state_dict=True)
NESTED = StateDictOptions()

MANIFEST = "manifest.json"
TRAIN_STATE = "train_state.pt"
_STEP_DIR = re.compile(r"^step-(\d+)$")
_TMP_DIR = re.compile(r"^\.tmp-step-(\d+)$")


class CheckpointError(ValueError):
    """A checkpoint that is missing, partial or corrupted; the message is one line that says what to do."""


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step-{step:06d}"


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank() -> int:
    return dist.get_rank() if _distributed() else 0


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _describe(folder: Path, names) -> dict:
    return {n: {"bytes": (folder / n).stat().st_size, "sha256": _sha256(folder / n)} for n in names}


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- RNG states ------------------------------------------------------------------------------
def rng_state() -> dict:
    """This process's random-number generators (torch CPU, every CUDA device, Python's ``random``)."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# --- save ------------------------------------------------------------------------------------
def save(
    root: str | Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler=None,
    extra: dict | None = None,
    keep: int = 2,
    options: StateDictOptions = FLAT,
    before_commit: Callable[[Path], None] | None = None,
) -> Path:
    """Save this rank's stage and optimizer, and the train state, as checkpoint
    ``step``; every rank calls it.

    Each rank writes its own tensors in parallel (DCP) into
    ``root/.tmp-step-NNNNNN``, hashes the files it wrote, and rank 0 writes
    the train state and the manifest and commits the folder by renaming it to
    ``root/step-NNNNNN``; then only the newest ``keep`` checkpoints are kept.
    ``before_commit(tmp)`` runs on every rank after its shard is written (for
    fault injection). Works in one process without a process group too.
    """
    root, rank = Path(root), _rank()
    tmp, final = root / f".tmp-step-{step:06d}", step_dir(root, step)
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        # left by an earlier attempt that was killed while saving this step
        if tmp.exists():
            shutil.rmtree(tmp)
    if _distributed():
        dist.barrier()  # nobody writes into the folder while rank 0 clears it
    model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
    # every rank writes __<rank>_*.distcp
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=tmp)
    mine = {
        "files": _describe(tmp, sorted(f.name for f in tmp.glob(f"__{rank}_*.distcp"))),
        "rng": rng_state(),
    }
    if before_commit is not None:
        before_commit(tmp)
    everyone = [None] * dist.get_world_size() if _distributed() else [mine]
    if _distributed():
        # each rank hashed its own files: in parallel, like the writes
        dist.all_gather_object(everyone, mine)
    if rank == 0:
        train = {
            "step": step,
            "world_size": len(everyone),
            "rng": [e["rng"] for e in everyone],
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            **(extra or {}),
        }
        torch.save(train, tmp / TRAIN_STATE)
        files = {n: d for e in everyone for n, d in e["files"].items()}
        files.update(_describe(tmp, [".metadata", TRAIN_STATE]))
        manifest = tmp / MANIFEST
        manifest.write_text(
            json.dumps(
                {"step": step, "world_size": len(everyone), "files": files}, indent=1
            )
        )
        # on disk before the rename makes the checkpoint visible
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        if final.exists():
            # the same step saved again (a rerun): the new one replaces it
            shutil.rmtree(final)
        os.replace(tmp, final)  # the commit: atomic on a POSIX file system
        _fsync_dir(root)
        for old in committed(root)[:-keep] if keep > 0 else []:
            shutil.rmtree(old)
    if _distributed():
        dist.barrier()  # nobody goes on (or reports "saved") before the commit
    return final


# --- one writer per folder ------------------------------------------------------------------
def lock_writer(root: str | Path):
    """Lock folder ``root`` for the job that will save into it; rank 0 calls it (the rank that
    commits), before any process group exists, and keeps the returned file open for as long as
    the job saves (it is closed when the process ends).

    torchrun starts each rank in a session of its own, so when torchrun itself is SIGKILLed its
    ranks live on and keep committing checkpoints; a job restarted on the same folder would commit
    between theirs. The lock is an exclusive ``fcntl.flock`` on ``root/.writer.lock``: the kernel
    drops it when the process ends, however it dies, so a dead run never holds the folder, and a
    live one refuses the next job in one line that names its process. (A child forked without
    exec inherits the lock with the file; on a shared file system flock needs a server that
    supports it, as NFSv4 and Lustre do.) Raises :class:`CheckpointError`.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    path = root / ".writer.lock"
    f = open(path, "a+")  # not truncated before the lock is ours: it names the holder
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise CheckpointError(f"checkpoint folder {root} is being written by a live job ({holder} holds {path.name}); "
                              f"stop that job first, or save into another folder") from None
    f.truncate(0)
    f.write(f"process {os.getpid()}")
    f.flush()
    return f


# --- find and verify -------------------------------------------------------------------------
def committed(root: str | Path) -> list[Path]:
    """The committed checkpoints under ``root``, oldest first (not verified)."""
    root = Path(root)
    found = [(int(m.group(1)), d) for d in root.iterdir() if d.is_dir() and (m := _STEP_DIR.match(d.name))] \
        if root.is_dir() else []
    return [d for _, d in sorted(found)]


def partial(root: str | Path) -> list[Path]:
    """Folders of saves that never committed (killed while saving)."""
    root = Path(root)
    return sorted(d for d in root.iterdir() if _TMP_DIR.match(d.name)) if root.is_dir() else []


def verify(path: str | Path) -> dict:
    """The manifest of checkpoint ``path`` after checking every file's size and SHA-256 against it.

    Raises :class:`CheckpointError` with one line when anything is missing or differs.
    """
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"no checkpoint at {path}: not a folder; pass a step-NNNNNN folder of --save-dir")
    if _TMP_DIR.match(path.name):
        raise CheckpointError(f"checkpoint {path} is partial: its save was interrupted before the commit; "
                              f"resume from a committed step-NNNNNN folder instead")
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} is incomplete: it has no {MANIFEST} (not written by ppbook.checkpoint, "
                              f"or its save never finished); resume from another one") from None
    except json.JSONDecodeError as err:
        raise CheckpointError(f"checkpoint {path} is corrupted: {MANIFEST} is not valid JSON ({err}); "
                              f"delete the folder and resume from an older one") from None
    for name, want in manifest["files"].items():
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"checkpoint {path} is corrupted: {name} is missing; "
                                  f"delete the folder and resume from an older one")
        size = f.stat().st_size
        what = f"has {size} bytes, its manifest says {want['bytes']}" if size != want["bytes"] else \
            "has another SHA-256 than its manifest records" if _sha256(f) != want["sha256"] else None
        if what:
            raise CheckpointError(f"checkpoint {path} is corrupted: {name} {what}; "
                                  f"delete the folder and resume from an older one")
    return manifest


def find_resume(root: str | Path | None, which: str | None, report: Callable[[str], None] = print) -> Path | None:
    """The checkpoint to resume from, verified, or ``None`` to start fresh.

    ``which`` is ``None`` (no resume), ``"latest"`` (the newest committed checkpoint under
    ``root``; none yet means a fresh start, as on a job's first launch) or a folder. Partial saves
    are reported in one line each and skipped; a corrupted checkpoint is refused
    (:class:`CheckpointError`), never silently replaced by an older one.
    """
    if which is None:
        return None
    if which != "latest":
        path = Path(which)
        verify(path)
        return path
    if root is None:
        raise CheckpointError("--resume without a folder needs --save-dir (where to look for the newest checkpoint)")
    for tmp in partial(root):
        report(f"skipping partial checkpoint {tmp}: its save was interrupted before the commit")
    found = committed(root)
    if not found:
        return None
    verify(found[-1])
    return found[-1]


# --- load ------------------------------------------------------------------------------------
def load(
    path: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler=None,
    options: StateDictOptions = FLAT,
    restore_rng: bool = True,
) -> dict:
    """Load checkpoint ``path`` into this rank's stage,
    optimizer and scheduler; return the train state.

    The stage asks for exactly the tensors it owns, by name, so the
    checkpoint may come from any number of stages (resharding) and this may
    be one process without a process group. RNG states are restored per
    rank when the number of ranks is unchanged, otherwise rank 0's are.
    """
    path = Path(path)
    verify(path)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
    state = {"model": model_sd, "optim": optim_sd}
    # reads only this stage's tensors, from whichever files hold them
    dcp.load(state, checkpoint_id=path)
    set_state_dict(
        model,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optim"],
        options=options,
    )
    train = torch.load(path / TRAIN_STATE, weights_only=True)
    if scheduler is not None and train["scheduler"] is not None:
        scheduler.load_state_dict(train["scheduler"])
    world = dist.get_world_size() if _distributed() else 1
    if restore_rng:
        set_rng_state(train["rng"][_rank() if world == train["world_size"] else 0])
    return train


# --- export and inspect ----------------------------------------------------------------------
def export(path: str | Path, out_file: str | Path) -> Path:
    """Write the model of checkpoint ``path`` as one ``torch.save`` file of the full model's
    state dict (no optimizer), for inference: ``model.load_state_dict(torch.load(f, weights_only=True), strict=True)``.

    Uses ``dcp_to_torch_save``, in one process, reading every rank's files.
    """
    verify(path)
    with tempfile.TemporaryDirectory(prefix="ppbook-export-") as tmp:
        everything = Path(tmp) / "all.pt"
        dcp_to_torch_save(path, everything)
        model_sd = torch.load(everything, weights_only=True)["model"]
    torch.save(model_sd, out_file)
    return Path(out_file)


def writers(path: str | Path) -> dict[str, int]:
    """Which rank wrote each tensor of checkpoint ``path``: ``{"model.layers.0.ln_1.weight": 0, ...}``,
    read from DCP's metadata (a rank's files are named ``__<rank>_<n>.distcp``)."""
    meta = FileSystemReader(str(path)).read_metadata()
    return {index.fqn: int(info.relative_path.split("_")[2]) for index, info in meta.storage_data.items()}


def digest(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, str]:
    """A SHA-256 of every tensor and value of this rank's flattened model and optimizer state,
    keyed by full name: two runs agree on a key exactly when they agree to the last bit."""
    model_sd, optim_sd = get_state_dict(model, optimizer, options=FLAT)
    out = {}
    for prefix, sd in (("model.", model_sd), ("optim.", optim_sd)):
        for k, v in sd.items():
            data = v.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if torch.is_tensor(v) \
                else repr(v).encode()
            out[prefix + k] = hashlib.sha256(data).hexdigest()
    return out
