"""Mixed precision for the companion scripts: ``--dtype bfloat16`` computes under autocast while
the parameters, their gradients and the optimizer state stay float32 (the "master weights").

Introduced in chapter 6 ("A real training loop"). A stage's forward runs inside ``schedule.step``,
so the autocast region wraps the whole step: the matrix products run in bfloat16, while
autocast keeps reductions such as the loss's softmax in float32. The residual stream of the
book's models stays float32 (a float32 input plus a bfloat16 branch is float32), so the
activations passed between stages are float32 as well.

Under autocast alone, each float32 weight of a matrix product is cast to bfloat16 once per step
(autocast caches the copy), but its gradient is cast back to float32 once per *microbatch*: the
cached copy's ``ToCopyBackward0`` runs in every microbatch's backward, a separate cast kernel and
a float32 accumulation per weight each time. :class:`MasterWeights` arranges what mixed-precision
training usually does: the module computes with bfloat16 copies of those weights, the optimizer
steps float32 masters, each weight is cast once per step (master to copy, after the optimizer
step) and so is its gradient (the first microbatch's gradient becomes the master's; the later
ones are added into it by one kernel each, no cast operation, no autograd node). The arithmetic
is the same as autocast's to the last bit: the same bfloat16 roundings of the weights, the same
float32 sums of the same bfloat16 gradients (introduced for chapter 11's benchmark; chapter 6's
``06_train.py`` trains with it).

float16 is not offered: it needs a gradient scaler whose "skip this step" decision all stages
must share (an all-reduce of every stage's inf/NaN flag), which the scripts do not implement.
"""

from __future__ import annotations

import collections
import contextlib

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

AUTOCAST = {"bfloat16": torch.bfloat16}
PARAM_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.float32}

# The largest absolute difference a script's --check accepts between its pipeline and its
# one-process reference, on losses, gradients and updated weights (all of order one here).
# - Where the pipeline and the reference do the same operations on the same shapes in the same
#   order (the references sum the microbatches' gradients, then divide by m, as torch's
#   schedules do), they agree to the bit on a CPU, and the tests hold chapters 1, 3 and 14 and
#   appendix A to 0. The tolerance is for what is not the same arithmetic: a layout that sums in
#   another order than one process (data, expert and tensor parallelism reduce over ranks), and
#   a GPU library that picks another kernel for a microbatch than for the whole batch.
# - float32: 1e-5 is about 80 units in the last place of a value of order one (2^-23 = 1.2e-7):
#   a sum of n terms taken in another order differs by at most (n - 1) units of its terms'
#   magnitude (Higham, Accuracy and Stability of Numerical Algorithms, section 4.2), with n the
#   few ranks or microbatches reduced over, amplified by a few optimizer steps. A reference that
#   rounds differently at every microbatch (scale-then-sum under AdamW, chapter 1's exercise)
#   can exceed it, which is why the references do the schedules' arithmetic.
# - float64: the same 80 units of 2^-52 would be 2e-14; 1e-10 is looser on purpose. A float64
#   run is how the book shows that a float32 difference is rounding (it falls by about the ratio
#   of the two precisions, 2^29), while a mistake (a gradient counted twice, a stage a step
#   behind) leaves differences of the order of the update itself, 1e-4 and more, in either.
# - bfloat16 (autocast, float32 master weights): the matrix products round to 2^-8 = 0.4%; a
#   few of those units on the loss, gradient norms and weights: 2e-2.
TOLERANCES = {"float32": 1e-5, "float64": 1e-10, "bfloat16": 2e-2}


def dtype_choices(mixed: bool) -> list[str]:
    """The values of ``--dtype``: float32 and float64, and bfloat16 where the script supports mixed precision."""
    return sorted(PARAM_DTYPES) if mixed else sorted(k for k in PARAM_DTYPES if k not in AUTOCAST)


def param_dtype(name: str) -> torch.dtype:
    """The dtype of the parameters, gradients and optimizer state: float32 under mixed precision."""
    return PARAM_DTYPES[name]


def autocast(device: torch.device, name: str, cache: bool = True):
    """The region in which forward passes compute in ``name`` (no-op for float32/float64).

    Autocast caches the bfloat16 copy of each weight until the outermost region exits, so a region
    must not span an optimizer step: enter it once per step, or pass ``cache=False`` for a region
    around several steps (``workload.adamw_reference_losses``), else later steps compute with the
    weights of the first."""
    if name not in AUTOCAST:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=AUTOCAST[name], cache_enabled=cache)


def tolerance(name: str) -> float:
    """Largest difference accepted between a pipeline and its one-process reference."""
    return TOLERANCES[name]


class MasterWeights:
    """bfloat16 compute copies in ``module``, float32 master weights for the optimizer.

    Under ``--dtype bfloat16`` every parameter of an ``nn.Linear`` (what autocast would cast for
    the matrix product) is replaced in ``module`` by a bfloat16 copy; the float32 original becomes
    its master. Parameters that other modules use too (a head tied to an embedding) and every
    other parameter (embeddings, norms) stay float32 and are their own masters. Give the
    optimizer and the clipping :meth:`parameters`, and per step::

        with autocast(device, name):
            ...forward and backward of every microbatch...   # gradients land on the masters
        master_weights.gradients_to_masters()                 # what a hook did not fold
        clip, optimizer.step()                                # on the float32 masters
        master_weights.masters_to_compute()                   # one cast per weight

    For float32 and float64 it changes nothing: :meth:`parameters` are the module's own.
    """

    def __init__(self, module: nn.Module, name: str):
        self.module = module
        self.compute_dtype = AUTOCAST.get(name)
        self._master: dict[int, torch.Tensor] = {}  # id(compute copy) -> float32 master
        self._pairs: list[tuple[nn.Parameter, torch.Tensor]] = []
        if self.compute_dtype is None:
            return
        linear = [m for m in module.modules() if isinstance(m, nn.Linear)]
        elsewhere = {id(p) for m in module.modules() if not isinstance(m, nn.Linear)
                     for p in m.parameters(recurse=False)}
        copies: dict[int, nn.Parameter] = {}  # id(float32 original) -> its copy (a weight two Linears share)
        for mod in linear:
            for pname, p in list(mod.named_parameters(recurse=False)):
                if id(p) in elsewhere or p.dtype != torch.float32:
                    continue
                if id(p) not in copies:
                    copy = nn.Parameter(p.detach().to(self.compute_dtype), requires_grad=p.requires_grad)
                    copy.register_post_accumulate_grad_hook(self._fold)
                    copies[id(p)] = copy
                    self._master[id(copy)] = p
                    self._pairs.append((copy, p))
                setattr(mod, pname, copies[id(p)])

    def parameters(self) -> list[torch.Tensor]:
        """The float32 masters, in the order of ``module.parameters()``: for the optimizer."""
        return [self._master.get(id(p), p) for p in self.module.parameters()]

    def named_parameters(self) -> list[tuple[str, torch.Tensor]]:
        """``module.named_parameters()`` with each compute copy's master in its place."""
        return [(n, self._master.get(id(p), p)) for n, p in self.module.named_parameters()]

    def _fold(self, copy: torch.Tensor) -> None:
        """Move ``copy``'s gradient onto its master: the first one cast to float32, later ones added
        (one kernel that reads bfloat16 and adds in float32, as autocast's accumulation did)."""
        master, grad = self._master[id(copy)], copy.grad
        copy.grad = None
        if master.grad is None:
            master.grad = grad.to(torch.float32)
        else:
            master.grad.add_(grad)

    def gradients_to_masters(self) -> None:
        """Fold what a backward left on the copies without the accumulation hook (a schedule that
        assigns ``.grad`` itself, e.g. a split weight-gradient pass)."""
        for copy, _ in self._pairs:
            if copy.grad is not None:
                self._fold(copy)

    @torch.no_grad()
    def masters_to_compute(self) -> None:
        """After the optimizer step: each copy takes its master's new value (one cast per weight)."""
        for copy, master in self._pairs:
            copy.copy_(master)


class CastCounter(TorchDispatchMode):
    """Counts the dtype casts (``aten._to_copy``, and ``aten.copy_`` between two dtypes) whose result
    has one of ``shapes``, by the dtype cast to: with the shapes of a model's weights, how often a
    step casts weights or their gradients (chapter 11; the tests hold 06_train.py to it)::

        with CastCounter({tuple(w.shape) for w in weights}) as casts:
            ...one step...
        casts.counts  # Counter({"bfloat16": ..., "float32": ...})
    """

    CASTS = (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default)

    def __init__(self, shapes):
        super().__init__()
        self.shapes, self.counts = {tuple(s) for s in shapes}, collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in self.CASTS and isinstance(out, torch.Tensor) and tuple(out.shape) in self.shapes:
            source = args[1] if func is torch.ops.aten.copy_.default else args[0]
            if source.dtype != out.dtype:
                self.counts[str(out.dtype).removeprefix("torch.")] += 1
        return out
