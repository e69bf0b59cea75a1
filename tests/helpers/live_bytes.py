"""Test helper: the bytes of live tensors on the CPU, tensor by tensor, as the CUDA caching
allocator's ``memory_allocated`` counts them on a GPU (without its rounding).

:class:`LiveBytes` is a ``TorchDispatchMode``: every tensor an operator returns is noted by its
storage (a view adds nothing), with the storage's bytes, and forgotten when the storage is freed.
``peak`` is the most bytes alive at once since :meth:`start` (checked after every allocation, where
a peak can only begin); :meth:`register` adds tensors made before tracking began (the parameters).
Temporaries that live and die inside one operator's kernel are not seen: on a GPU they are the
kernels' workspaces, which differ from the CPU's anyway.
"""

from __future__ import annotations

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LiveBytes(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.tracking = False
        self.live: dict[StorageWeakRef, int] = {}
        self.current = 0
        self.peak = 0
        self.marks: list[tuple[str, int]] = []

    def start(self, *tensors: torch.Tensor) -> None:
        """Begin tracking, with ``tensors`` (made before) counted as alive."""
        self.tracking = True
        self.register(*tensors)

    def register(self, *tensors: torch.Tensor) -> None:
        for t in tensors:
            self._note(t)
        self._update()

    def mark(self, label: str) -> int:
        """The bytes alive now, noted under ``label`` in :attr:`marks`."""
        self._sweep()
        self.marks.append((label, self.current))
        return self.current

    def reset_peak(self) -> None:
        self._sweep()
        self.peak = self.current

    def _note(self, t: torch.Tensor) -> bool:
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            return False
        st = t.untyped_storage()
        ref = StorageWeakRef(st)
        if ref in self.live:
            return False
        self.live[ref] = st.nbytes()
        return True

    def _sweep(self) -> None:
        dead = [r for r in self.live if r.expired()]
        for r in dead:
            del self.live[r]
        self.current = sum(self.live.values())

    def _update(self) -> None:
        self._sweep()
        self.peak = max(self.peak, self.current)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.tracking:
            new = [self._note(t) for t in tree_leaves(out)]
            if any(new):
                self._update()
        return out


def train_06_peaks(argv: list[str]) -> dict[str, list[int]]:
    """Run ``scripts/06_train.py`` in this process on the CPU with :class:`LiveBytes` on, and return
    the peak bytes alive during each step's ``schedule.step`` (``passes``) and between one
    step's passes and the next one's (``between``: clipping and the optimizer step), from the
    first ``schedule.step`` on, with the stage's parameters and buffers and each step's batch counted."""
    from ppbook import driver, launch

    mod = launch.load_script("06_train.py")
    live = LiveBytes()
    real = driver.schedule_step
    peaks: dict[str, list[int]] = {"passes": [], "between": []}

    def tracked(schedule, info, tokens, targets, *args, **kwargs):
        if args or kwargs.get("forward_only"):
            return real(schedule, info, tokens, targets, *args, **kwargs)
        if not live.tracking:
            live.start(*schedule._stage.submod.parameters(), *schedule._stage.submod.buffers())
        else:
            peaks["between"].append(live.peak)
        live.register(tokens, targets)
        live.reset_peak()
        out = real(schedule, info, tokens, targets, *args, **kwargs)
        peaks["passes"].append(live.peak)
        live.reset_peak()
        return out

    driver.schedule_step = tracked
    try:
        with live:
            rc = mod.main([*argv, "--device", "cpu", "--dtype", "bfloat16", "--eval-every", "0"])
    finally:
        driver.schedule_step = real
    assert rc == 0
    return peaks
