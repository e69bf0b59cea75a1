"""Activation checkpointing of a stage's blocks, and the bytes a forward leaves allocated.

Introduced in chapter 12 ("A pipeline among the tools it is combined with");
``tests/test_planner_memory.py`` ties the planner's activation counts
(:func:`ppbook.planner.memory.layer_activation_values`) to :func:`allocated_bytes`.

* :func:`checkpoint_block` recomputes a block in its backward, fully (only the block's input is
  kept) or selectively: torchtitan's per-op policy keeps the outputs of attention and of every
  other matrix product (the 1st, 3rd, 5th, ...: for the book's Llama block the query, value,
  gate and down projections) and recomputes the rest (:func:`selective_policy`). It wraps the
  block's ``forward`` in :func:`torch.utils.checkpoint.checkpoint` (non-reentrant), so parameter
  names stay those of the full model. torch's composable ``checkpoint(module)`` keeps names too,
  but in torch 2.13 it fails in the weight-gradient pass of the zero-bubble schedules, which
  recompute a region more than once (chapter 12).
* :func:`allocated_bytes` runs a forward under :mod:`torch.profiler` with ``profile_memory`` and
  sums what its operators allocated and did not free (on the CPU, or on a GPU's device memory):
  the activations autograd keeps, inside
  checkpointed regions too (which ``saved_tensors_hooks`` cannot see into), plus the output.
  A checkpointed region also keeps the CPU generator's state (:data:`RNG_STATE_BYTES`) unless
  ``preserve_rng_state=False``.
* :class:`BlockBytes` records, per block and microbatch, what each block's forward left
  allocated, while switched on.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import weakref
from dataclasses import dataclass, field

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

MODES = ("none", "full", "selective")

#: What a checkpointed region keeps besides its inputs: the CPU generator's state, saved so that
#: the recomputation draws the same random numbers (``preserve_rng_state=True``, the default).
RNG_STATE_BYTES = torch.get_rng_state().numel()

_aten = torch.ops.aten
#: The operators whose outputs torchtitan's selective policy keeps (``_op_sac_save_list``), with
#: the CPU's attention kernels added; only every other matrix product is kept (see below).
SAVE_OPS = {
    _aten.mm.default,
    _aten._scaled_dot_product_flash_attention_for_cpu.default,
    _aten._scaled_dot_product_flash_attention.default,
    _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_cudnn_attention.default,
}


# [start-policy]
def selective_policy():
    """A fresh policy for one checkpointed forward: keep attention's
    outputs and the 1st, 3rd, 5th, ... matrix product's (torchtitan's
    "op" selective checkpointing), recompute everything else."""
    matmuls = 0

    def policy(ctx, func, *args, **kwargs):
        nonlocal matmuls
        if func == _aten.mm.default and not ctx.is_recompute:
            matmuls += 1  # counted in the forward only
        every_other = func != _aten.mm.default or matmuls % 2 == 1
        if func in SAVE_OPS and every_other:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy
# [end-policy]


def _selective_contexts():
    return create_selective_checkpoint_contexts(selective_policy())


# [start-checkpoint]
def checkpoint_block(block: torch.nn.Module, mode: str) -> torch.nn.Module:
    """Recompute ``block`` in its backward: ``full`` keeps only its
    input, ``selective`` what :func:`selective_policy` keeps; ``none``
    leaves it alone. In place; parameter names do not change."""
    if mode not in MODES:
        raise ValueError(f"checkpointing mode {mode!r}: use one of {MODES}")
    if mode == "none":
        return block
    # the class's forward and a weak reference: no reference cycle through the block
    forward, owner = type(block).forward, weakref.ref(block)
    extra = {"context_fn": _selective_contexts} if mode == "selective" else {}

    def recomputed(*args, **kwargs):
        return checkpoint(forward, owner(), *args, use_reentrant=False,
                          **extra, **kwargs)

    block.forward = recomputed  # nn.Module.__call__ calls the instance's forward
    return block
# [end-checkpoint]


@contextlib.contextmanager
def _quiet_stderr():
    """The profiler's start and stop each print a line to the process's stderr (file descriptor 2,
    from C++); silence those two moments only."""
    try:
        saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    except OSError:  # no file descriptor 2 to silence
        yield
        return
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


@contextlib.contextmanager
def _profiled(record: list):
    """Append to ``record`` the bytes the code inside allocated and did not free. Python's cyclic
    garbage collector is held off meanwhile: run inside, it would free tensors allocated before
    (a dropped model caught in a reference cycle) and count them as negative bytes."""
    collecting = gc.isenabled()
    gc.disable()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():  # a GPU's allocations are device memory events
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    prof = torch.profiler.profile(activities=activities, profile_memory=True)
    with _quiet_stderr():
        prof.__enter__()
    try:
        yield
    finally:
        with _quiet_stderr():
            prof.__exit__(None, None, None)
        if collecting:
            gc.enable()
        record.append(sum(e.self_cpu_memory_usage + e.self_device_memory_usage for e in prof.events()))


def allocated_bytes(fn, *args, **kwargs):
    """(bytes, output): what ``fn(*args, **kwargs)`` left allocated (CPU and GPU) when it returned:
    for a forward, the tensors kept for its backward plus its output. Tensors that exist before
    the call (the inputs, the parameters) are not counted."""
    record: list[int] = []
    with _profiled(record):
        out = fn(*args, **kwargs)
    return record[0], out


@dataclass
class BlockBytes:
    """Records what each block's forward leaves allocated (see :func:`allocated_bytes`), keyed
    by (block name, the how-manieth forward of that block since :meth:`reset`), while ``enabled``."""
    enabled: bool = False
    bytes: dict = field(default_factory=dict)  # (block name, call index) -> bytes
    _calls: dict = field(default_factory=dict)
    _open: dict = field(default_factory=dict)

    def reset(self) -> None:
        self.bytes.clear()
        self._calls.clear()

    def attach(self, layers: torch.nn.ModuleDict) -> None:
        """Hook every block of a stage's ``layers`` (before any checkpointing is applied or after:
        the hooks surround the whole forward, recomputation included only when it runs a forward)."""
        for name, block in layers.items():
            block.register_forward_pre_hook(functools.partial(self._start, name), prepend=True)
            block.register_forward_hook(functools.partial(self._stop, name), always_call=True)

    def _start(self, name, module, args):
        if not self.enabled or not torch.is_grad_enabled():
            return
        record: list[int] = []
        ctx = _profiled(record)
        ctx.__enter__()
        self._open[name] = (ctx, record)

    def _stop(self, name, module, args, output):
        if name not in self._open:
            return
        ctx, record = self._open.pop(name)
        ctx.__exit__(None, None, None)
        call = self._calls.get(name, 0)
        self._calls[name] = call + 1
        self.bytes[(name, call)] = record[0]
