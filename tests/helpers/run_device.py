"""A second device on a CPU: which tensors the book made on the run's device, and which it left on
the host, checked wherever they meet.

On a GPU run a tensor made without ``device=`` (``torch.arange(n)``, ``torch.tensor(x)``) lies on
the CPU, and fails the moment it meets a CUDA tensor ("Expected all tensors to be on the same
device") or reaches NCCL ("No backend type associated with device type cpu"). On a CPU run both
lie on the CPU and nothing fails, so the first GPU record found two such lines (issue 47). This
module makes the difference visible on the CPU:

- the run's device becomes ``torch.device("cpu", 0)`` (``ppbook.dist.pick_device`` is patched), a
  device torch computes on like the CPU but that prints differently;
- a ``TorchFunctionMode`` marks as *host* every tensor made without a device (a factory called
  without ``device=``, ``.cpu()``, ``torch.from_numpy``, an explicit ``"cpu"``) and every tensor
  computed from host tensors alone; a tensor moved with ``.to(device)`` or made with ``device=``
  the run's device, or computed from one, is on the run's device. A host tensor reports
  ``t.device == cpu``, a run tensor ``cpu:0``;
- an operation that mixes a host tensor of one or more dimensions with a tensor on the run's
  device raises :class:`DeviceMismatch`, as CUDA would (a host 0-dim tensor is a scalar CUDA
  accepts, and a CUDA tensor may be indexed with host indices, as on a GPU);
- the collectives and point-to-point operations are held to ``ppbook.nccl_rules``'s check that a
  tensor lies on the rank's device, with the run's device as the rank's.

An explicit ``"cpu"`` is the host wherever it is written: torch's own code picks the CPU for itself
only where the backend is gloo (its object collectives, which pick the run's device here, as NCCL's
pick the GPU). Parameters keep the mark of the tensor they wrap until their module is moved.
``scripts/01_minimal.py`` picks its device without ``ppbook`` (``torch.device("cpu")``), so its run
cannot be told from the host here.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

ROOT = Path(__file__).resolve().parents[2]
BOOK_CODE = (str(ROOT / "scripts") + "/", str(ROOT / "src" / "ppbook") + "/")
RUN = torch.device("cpu", 0)
HOST = torch.device("cpu")


class DeviceMismatch(RuntimeError):
    """A host tensor met a tensor on the run's device: on a GPU, a CPU tensor met a CUDA one."""


FACTORIES = {getattr(torch, n) for n in (
    "tensor", "arange", "zeros", "ones", "full", "empty", "rand", "randn", "randint", "randperm", "linspace",
    "logspace", "eye", "empty_strided", "tril_indices", "triu_indices", "from_numpy", "frombuffer",
    "scalar_tensor", "as_tensor", "asarray", "range", "normal", "bartlett_window", "hann_window")
    if hasattr(torch, n)}
INDEXING = {torch.Tensor.__getitem__, torch.Tensor.__setitem__}
COMMUNICATION = ("torch.distributed.distributed_c10d", "ppbook.nccl_rules")  # modules of collectives
# cross-device by design: a copy, a move, storage swapped in; a deep copy (its memo holds other tensors)
CROSS = {torch.Tensor.copy_, torch.Tensor.to, torch.Tensor.set_, torch.Tensor.cpu, torch.Tensor.cuda,
         torch._has_compatible_shallow_copy_type, torch.Tensor.is_set_to, torch.Tensor.is_same_size,
         torch.Tensor.__deepcopy__}


def _where() -> str:
    """file:line of the innermost frame of the book's code (or of anything outside torch)."""
    frame, fallback = sys._getframe(2), None
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(BOOK_CODE):
            return f"{Path(name).relative_to(ROOT)}:{frame.f_lineno}"
        if fallback is None and "/torch/" not in name and name != __file__:
            fallback = f"{name}:{frame.f_lineno}"
        frame = frame.f_back
    return fallback or "?"


def _descriptor(func, name: str, op: str) -> bool:
    return getattr(func, "__name__", "") == op and getattr(getattr(func, "__self__", None), "__name__", "") == name


class RunDevice(TorchFunctionMode):
    """The mode; use :func:`run_device_checked` rather than this class alone."""

    def __init__(self):
        super().__init__()
        self.host = WeakIdKeyDictionary()
        self.mismatches = 0

    # --- marks -----------------------------------------------------------------------------------
    def is_host(self, t) -> bool:
        return isinstance(t, torch.Tensor) and t in self.host

    def mark(self, out, host: bool):
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                if host:
                    self.host[t] = True
                else:
                    self.host.pop(t, None)
        return out

    @staticmethod
    def device_is_host(device) -> bool:
        """An explicit ``device=``: the host for a plain ``cpu``, the run's device for ``cpu:0``."""
        if device is None:
            return True
        d = torch.device(device)
        return d.type == "cpu" and d.index is None

    # --- the check -------------------------------------------------------------------------------
    def check(self, func, tensors, indices=()) -> None:
        tensors = [t for t in tensors if isinstance(t, torch.Tensor) and t.device.type == "cpu"]
        run = [t for t in tensors if not self.is_host(t)]
        host = [t for t in tensors if self.is_host(t) and t.dim() > 0]
        if func in INDEXING and run and run[0] is tensors[0]:  # a run tensor indexed by host indices: fine
            host = [t for t in host if not any(t is i for i in indices)]
        if run and host:
            self.mismatches += 1
            name = getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
            raise DeviceMismatch(
                f"{_where()}: {name} got a tensor of shape {tuple(host[0].shape)} made without the run's device "
                f"(on a GPU: on the CPU) beside one of shape {tuple(run[0].shape)} on the run's device; "
                f"on a GPU this fails with 'Expected all tensors to be on the same device': make it with "
                f"device=..., or move it with .to(device)")

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _descriptor(func, "device", "__get__"):
            t = args[0]
            real = func(*args, **kwargs)
            return real if real.type != "cpu" else (HOST if self.is_host(t) else RUN)
        if _descriptor(func, "data", "__get__"):
            return self.mark(func(*args, **kwargs), self.is_host(args[0]))
        if _descriptor(func, "data", "__set__"):
            out = func(*args, **kwargs)
            self.mark(args[0], self.is_host(args[1]))
            return out
        if getattr(func, "__name__", "") in ("__get__", "__set__", "__delete__"):
            return func(*args, **kwargs)
        if func in FACTORIES or "device" in kwargs:
            out = func(*args, **kwargs)
            if "device" in kwargs and kwargs["device"] is not None:
                return self.mark(out, self.device_is_host(kwargs["device"]))
            if func in (torch.as_tensor, torch.asarray) and isinstance(args[0], torch.Tensor):
                return self.mark(out, self.is_host(args[0]))
            return self.mark(out, True)
        if func in (torch.Tensor.to, torch.Tensor.cpu, torch.Tensor.cuda):
            return self.move(func, args, kwargs)
        if getattr(func, "__module__", "").startswith(COMMUNICATION):  # a collective, a send or a receive
            host = [t for t in tree_flatten((args, kwargs))[0] if self.is_host(t)]
            if host:
                self.mismatches += 1
                raise DeviceMismatch(
                    f"{_where()}: {func.__name__} got a tensor of shape {tuple(host[0].shape)} made without the run's "
                    f"device; on a GPU, NCCL refuses it ('No backend type associated with device type cpu'): make it "
                    f"with device=..., or move it with .to(device)")
            return func(*args, **kwargs)
        flat = tree_flatten((args, kwargs))[0]
        indices = tree_flatten(args[1])[0] if func in INDEXING and len(args) > 1 else ()
        if func in CROSS:  # the result, where not in place, lies where its source does
            out = func(*args, **kwargs)
            return out if out is args[0] else self.mark(out, self.is_host(args[0]))
        self.check(func, flat, indices)
        out = func(*args, **kwargs)
        tensors = [t for t in flat if isinstance(t, torch.Tensor)]
        if not tensors or any(out is t for t in tensors):  # in place: the mark stays
            return out
        return self.mark(out, all(self.is_host(t) for t in tensors))

    def opaque(self, fn):
        """``fn`` checked at its boundary, run with the mode paused: FlexAttention compiles itself with
        TorchDynamo, which cannot trace through this mode."""
        from torch.overrides import _pop_mode_temporarily

        def checked(*args, **kwargs):
            flat = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            self.check(fn, flat)
            with _pop_mode_temporarily():
                out = fn(*args, **kwargs)
            return self.mark(out, bool(flat) and all(self.is_host(t) for t in flat))
        return checked

    def move(self, func, args, kwargs):
        """``.to(...)``, ``.cpu()``, ``.cuda()``: where the result lies. On the CPU a move to the CPU
        returns the tensor itself; a view stands in for the moved copy, so the mark of the original
        stays what it was (a Parameter moved by its module is marked through ``.data``'s setter)."""
        t = args[0]
        out = func(*args, **kwargs)
        if func is torch.Tensor.cpu:
            host = True
        elif func is torch.Tensor.cuda:
            host = False
        else:
            device, other = kwargs.get("device"), kwargs.get("other")
            for a in args[1:]:
                if isinstance(a, (str, torch.device)):
                    device = a
                elif isinstance(a, torch.Tensor):
                    other = a
            if other is not None:
                host = self.is_host(other)
            elif device is not None:
                host = self.device_is_host(device)
            else:  # a dtype only
                host = self.is_host(t)
        if out is t and host != self.is_host(t):
            out = t.view_as(t)
        return self.mark(out, host)


@contextlib.contextmanager
def run_device_checked(monkeypatch):
    """Run the block with the run's device apart from the host (see the module's docstring); yields
    the mode (its ``mismatches`` count). ``--device cpu`` runs pick ``cpu:0``."""
    from ppbook import dist as ppdist
    from ppbook import nccl_rules

    pick = ppdist.pick_device

    def pick_run_device(local_rank, device="auto"):
        d = pick(local_rank, device)
        return RUN if d == HOST else d

    monkeypatch.setattr(ppdist, "pick_device", pick_run_device)
    nccl_rules.install()  # its wrappers see every collective, send and receive: a tensor check each
    # NCCL takes only tensors on the rank's own device. The mode's own check runs where a tensor is
    # handed to each operation: while the mode is on, a tensor reports RUN or HOST; inside its handler
    # (the mode paused: a collective that torch hands to the mode first, checked there), its real device.
    contiguous = nccl_rules._check_tensor

    def on_run_device(t, what):
        contiguous(t, what)
        expected = RUN if torch._C._len_torch_function_stack() else HOST
        if isinstance(t, torch.Tensor) and not nccl_rules._state.suspended and t.device != expected:
            raise nccl_rules.RuleError(f"{what}: a tensor on {t.device}, but this rank's device is {expected}; NCCL "
                                       f"takes only tensors on the rank's own device: move it with .to(device)")

    monkeypatch.setattr(nccl_rules, "_check_tensor", on_run_device)
    mode = RunDevice()
    new = torch.nn.Parameter.__new__

    def parameter(cls, data=None, requires_grad=True):
        p = new(cls, data, requires_grad)
        if data is not None and mode.is_host(data):
            mode.host[p] = True
        return p

    monkeypatch.setattr(torch.nn.Parameter, "__new__", parameter)
    # gloo's object collectives (gather_object, ...) serialise on the CPU, NCCL's on the GPU: the run's device
    from torch.distributed import distributed_c10d as c10d

    monkeypatch.setattr(c10d, "_get_object_coll_device", lambda group=None: str(RUN))
    from torch.nn.attention import flex_attention

    monkeypatch.setattr(flex_attention, "flex_attention", mode.opaque(flex_attention.flex_attention))
    with mode:
        yield mode
