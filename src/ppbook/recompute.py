"""Activation checkpointing of a stage's blocks, and the bytes a forward leaves allocated.

Introduced in chapter 12 ("Compile and activation checkpointing in a pipeline");
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
* :class:`SavedBytes` follows what each stage's forwards saved for their backward, live, across a
  whole step (until autograd drops it), and records its high-water mark per stage and for all of
  a rank's stages together: the pipeline's activation memory, measured.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import weakref
from dataclasses import dataclass, field

import torch
from torch.utils._pytree import tree_leaves
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
    "op" selective checkpointing), recompute everything else. torch
    before 2.13 asks it again while recomputing (it pops what was kept
    in the order kept), so it gives the recomputation the same answers."""
    matmuls = {False: 0, True: 0}  # seen in the forward, in recomputations

    def policy(ctx, func, *args, **kwargs):
        if func != _aten.mm.default:
            save = func in SAVE_OPS
        else:
            matmuls[ctx.is_recompute] += 1
            k = matmuls[ctx.is_recompute]  # this one's place in its pass;
            if ctx.is_recompute:  # a zero-bubble schedule recomputes twice
                k = (k - 1) % matmuls[False] + 1
            save = k % 2 == 1
        if save:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy
# [end-policy]


def _selective_contexts():
    return create_selective_checkpoint_contexts(selective_policy())


# [start-checkpoint]
def checkpoint_block(block: torch.nn.Module, mode: str,
                     saved: SavedBytes | None = None) -> torch.nn.Module:
    """Recompute ``block`` in its backward: ``full`` keeps only its
    input, ``selective`` what :func:`selective_policy` keeps; ``none``
    leaves it alone. In place; parameter names do not change. With
    ``saved``, what each region keeps outside autograd is reported to it."""
    if mode not in MODES:
        raise ValueError(f"checkpointing mode {mode!r}: use one of {MODES}")
    if mode == "none":
        return block
    # the class's forward and a weak reference: no reference cycle through the block
    forward, owner = type(block).forward, weakref.ref(block)
    contexts = _selective_contexts if mode == "selective" else None
    if saved is not None:
        contexts = functools.partial(saved.region_contexts, contexts)
    extra = {"context_fn": contexts} if contexts else {}

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


class _Packed:
    """What autograd keeps for one saved tensor while :class:`SavedBytes` follows it: its lifetime
    is the saved tensor's."""
    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor


class _Delegate:
    """A context manager that runs another's ``__enter__``/``__exit__`` (or none), and can be
    referred to weakly: a checkpointed region's recomputation context lives as long as torch keeps
    the region."""

    def __init__(self, inner=None):
        self.inner = inner if inner is not None else contextlib.nullcontext()

    def __enter__(self):
        return self.inner.__enter__()

    def __exit__(self, *exc):
        return self.inner.__exit__(*exc)


class _RegionForward(_Delegate):
    """A checkpointed region's forward context: once the region's forward has run, what the
    region keeps outside autograd is added to ``saved`` for as long as ``keeper`` lives."""

    def __init__(self, saved: SavedBytes, stage, inner, keeper: _Delegate):
        super().__init__(inner)
        self.saved, self.stage, self.keeper = saved, stage, keeper

    def __exit__(self, *exc):
        out = super().__exit__(*exc)
        spans = [(("generator", id(self.keeper)), (0, RNG_STATE_BYTES))]  # the CPU generator's state
        for entries in getattr(self.inner, "storage", {}).values():  # selective: the outputs it keeps
            for entry in (entries.values() if isinstance(entries, dict) else entries):
                for leaf in tree_leaves(entry):
                    t = getattr(leaf, "val", None)
                    if isinstance(t, torch.Tensor) and t.numel():
                        spans.append((t.untyped_storage().data_ptr(), _span(t)))
        for key, span in spans:
            self.saved._add(self.stage, key, span)
            weakref.finalize(self.keeper, self.saved._drop, self.stage, key, span)
        return out


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes of its storage a tensor spans: (first, past the last)."""
    es = t.element_size()
    last = t.storage_offset() + sum((n - 1) * st for n, st in zip(t.shape, t.stride()) if n > 0)
    return t.storage_offset() * es, (last + 1) * es


def _union(spans) -> int:
    """Bytes covered by a set of (start, end) spans of one storage."""
    total, reach = 0, None
    for start, end in sorted(spans):
        if reach is None or start >= reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


class SavedBytes:
    """The bytes each stage's forwards saved for their backward, live across a step, and their
    high-water mark: per stage (``peak``) and for all of this rank's stages at once
    (``peak_total``), while ``enabled``. Introduced in chapter 12.

    :meth:`attach` enters ``saved_tensors_hooks`` around a stage module's forward: every tensor
    autograd saves there is counted from then until autograd drops it (after its microbatch's
    backward; under the split backward some only when the step ends), as the bytes of its storage
    it spans, a storage shared by several saved tensors counted once; parameters and buffers are
    not activations and are left out. Inside a checkpointed region autograd saves nothing; the
    region keeps its inputs (which the hooks see), the CPU generator's state
    (:data:`RNG_STATE_BYTES`, held by the checkpoint in Python) and, with selective
    checkpointing, the outputs its policy keeps (in its cache): :func:`checkpoint_block` given
    this object reports those two, counted as long as torch keeps the region.
    """

    def __init__(self):
        self.enabled = False
        self.live: dict = {}   # stage -> bytes saved now
        self.peak: dict = {}   # stage -> the most bytes saved at once
        self.total = self.peak_total = 0
        self._spans: dict = {}  # (stage, storage) -> {(start, end): how many saved tensors span it}
        self._skip: set = set()  # storages of parameters and buffers
        self._current = None    # the stage whose forward runs

    def reset(self) -> None:
        """Start a new high-water mark from what is saved now."""
        self.peak, self.peak_total = dict(self.live), self.total

    def attach(self, module: torch.nn.Module, stage) -> None:
        self._skip |= {t.untyped_storage().data_ptr() for t in (*module.parameters(), *module.buffers())}
        open_ = []

        def start(mod, args):
            if self.enabled:
                hooks = torch.autograd.graph.saved_tensors_hooks(functools.partial(self._pack, stage), _unpack)
                hooks.__enter__()
                open_.append(hooks)
                self._current = stage

        def stop(mod, args, output):
            if open_:
                open_.pop().__exit__(None, None, None)
                self._current = None

        module.register_forward_pre_hook(start)
        module.register_forward_hook(stop, always_call=True)

    def region_contexts(self, make_inner=None):
        """A ``context_fn`` for :func:`torch.utils.checkpoint.checkpoint`: ``make_inner``'s
        contexts (selective checkpointing's, or none), with what the region keeps reported."""
        fwd, rec = make_inner() if make_inner else (None, None)
        keeper = _Delegate(rec)  # held by the checkpoint's recomputation: as long as the region
        if not self.enabled or self._current is None:
            return _Delegate(fwd), keeper
        return _RegionForward(self, self._current, fwd, keeper), keeper

    def _pack(self, stage, t: torch.Tensor):
        if not t.numel() or t.device.type == "meta":
            return t
        key = t.untyped_storage().data_ptr()
        if key in self._skip:
            return t
        packed, span = _Packed(t), _span(t)
        self._add(stage, key, span)
        weakref.finalize(packed, self._drop, stage, key, span)
        return packed

    def _change(self, stage, key, change) -> None:
        spans = self._spans.setdefault((stage, key), {})
        before = _union(spans)
        change(spans)
        delta = _union(spans) - before
        if not spans:
            del self._spans[stage, key]
        self.live[stage] = self.live.get(stage, 0) + delta
        self.total += delta
        if delta > 0:
            self.peak[stage] = max(self.peak.get(stage, 0), self.live[stage])
            self.peak_total = max(self.peak_total, self.total)

    def _add(self, stage, key, span) -> None:
        self._change(stage, key, lambda spans: spans.__setitem__(span, spans.get(span, 0) + 1))

    def _drop(self, stage, key, span) -> None:
        def remove(spans):
            spans[span] -= 1
            if not spans[span]:
                del spans[span]
        self._change(stage, key, remove)


def _unpack(x):
    return x.tensor if isinstance(x, _Packed) else x
