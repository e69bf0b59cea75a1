"""Measure how many microbatches' activations each pipeline stage holds, and when.

Introduced in chapter 5 ("The schedules"): the schedules differ less in speed than in memory.

Autograd keeps, for every microbatch a stage has run forward and not yet run backward, the
tensors its backward will need (the *saved tensors*). :class:`ActivationProbe` wraps a stage's
``forward_one_chunk`` in :func:`torch.autograd.graph.saved_tensors_hooks`: each saved tensor is
handed to autograd inside a small holder object, and a :func:`weakref.finalize` on the holder
fires when autograd lets go of it -- after the backward (or, for zero-bubble schedules, the
weight-gradient pass) that needs it. So the probe sees both when bytes are saved and when they
are released, per (stage, microbatch), without touching torch. Parameters, which autograd also
saves (a linear layer saves its weight), are not counted: they are there whatever the schedule.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class MemoryEvent:
    rank: int
    stage: int
    microbatch: int
    time: float  # perf_counter seconds (shifted like timeline events after gather)
    delta: int   # bytes saved (+) or released (-)


class _Held:
    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor


class ActivationProbe:
    """Counts the bytes autograd saves for each (stage, microbatch) on this rank, over time.

    Counting costs a little Python per saved tensor, so it is off until ``enabled`` is set: a
    script can time its steps with the probe attached and count on a step of its own.
    """

    def __init__(self, rank: int, enabled: bool = False):
        self.rank = rank
        self.enabled = enabled
        self.events: list[MemoryEvent] = []
        self._refs: dict[tuple[int, int, int], int] = {}  # (stage, microbatch, storage) -> live holders

    def start_step(self) -> None:
        self.events = []

    def attach(self, stage) -> None:
        """Count what ``stage`` (a ``PipelineStage``) saves in every forward a schedule runs."""
        params = {p.untyped_storage().data_ptr() for p in stage.submod.parameters()}
        forward = stage.forward_one_chunk

        def probed(chunk_id, *args, **kwargs):
            if not self.enabled:
                return forward(chunk_id, *args, **kwargs)
            pack = self._packer(stage.stage_index, chunk_id, params)
            with torch.autograd.graph.saved_tensors_hooks(pack, _unpack):
                return forward(chunk_id, *args, **kwargs)

        stage.forward_one_chunk = probed

    def _packer(self, stage: int, mb: int, params: set[int]):
        def pack(t: torch.Tensor):
            storage = t.untyped_storage()
            if storage.data_ptr() in params:
                return t
            key = (stage, mb, storage.data_ptr())
            # a storage saved twice (views, reused inputs) counts once
            if self._refs.get(key, 0) == 0:
                self.events.append(
                    MemoryEvent(
                        self.rank, stage, mb, time.perf_counter(), storage.nbytes()
                    )
                )
            self._refs[key] = self._refs.get(key, 0) + 1
            held = _Held(t)
            weakref.finalize(held, self._release, key, storage.nbytes())
            return held
        return pack

    def _release(self, key: tuple[int, int, int], nbytes: int) -> None:
        self._refs[key] -= 1
        if self._refs[key] == 0:
            del self._refs[key]
            self.events.append(MemoryEvent(self.rank, key[0], key[1], time.perf_counter(), -nbytes))


def _unpack(held):
    return held.tensor if isinstance(held, _Held) else held


def to_json(events: list[MemoryEvent]) -> list[dict]:
    return [asdict(e) for e in events]


def from_json(rows: list[dict]) -> list[MemoryEvent]:
    return [MemoryEvent(**row) for row in rows]


def held_over_time(events: list[MemoryEvent], stage: int, fraction: float = 0.0) -> tuple[list[float], list[int], list[int]]:
    """For one stage: times, bytes held and microbatches held after each event.

    A microbatch counts as held while it holds more than ``fraction`` of the most bytes it ever
    held (0: any saved bytes at all; 0.5: most of its activations)."""
    mine = sorted((e for e in events if e.stage == stage), key=lambda e: e.time)
    most: dict[int, int] = {}
    running: dict[int, int] = {}
    for e in mine:
        running[e.microbatch] = running.get(e.microbatch, 0) + e.delta
        most[e.microbatch] = max(most.get(e.microbatch, 0), running[e.microbatch])
    times, held_bytes, held_mbs = [], [], []
    per_mb: dict[int, int] = {}
    total = 0
    for e in mine:
        per_mb[e.microbatch] = per_mb.get(e.microbatch, 0) + e.delta
        total += e.delta
        times.append(e.time)
        held_bytes.append(total)
        held_mbs.append(sum(1 for mb, b in per_mb.items() if b > fraction * most[mb]))
    return times, held_bytes, held_mbs


def peak_in_flight(events: list[MemoryEvent], fraction: float = 0.0) -> dict[int, int]:
    """Per stage, the most microbatches it held at once (see :func:`held_over_time`)."""
    return {s: max(held_over_time(events, s, fraction)[2], default=0) for s in sorted({e.stage for e in events})}


def residual_bytes(events: list[MemoryEvent]) -> dict[tuple[int, int], int]:
    """Bytes each (stage, microbatch) still held at the last event: saved, never released."""
    net: dict[tuple[int, int], int] = {}
    for e in events:
        net[(e.stage, e.microbatch)] = net.get((e.stage, e.microbatch), 0) + e.delta
    return {k: v for k, v in sorted(net.items()) if v}


def remainder_shares(events: list[MemoryEvent]) -> list[float]:
    """For each (stage, microbatch) that still held bytes at the last event: what it kept over the
    most it held at once. Torch's split backward (zero-bubble schedules) keeps such a remainder
    until ``step`` returns; chapter 5 measures its share."""
    net: dict[tuple[int, int], int] = {}
    most: dict[tuple[int, int], int] = {}
    for e in sorted(events, key=lambda e: e.time):
        key = (e.stage, e.microbatch)
        net[key] = net.get(key, 0) + e.delta
        most[key] = max(most.get(key, 0), net[key])
    return [net[k] / most[k] for k in net if net[k] > 0]


def peak_bytes(events: list[MemoryEvent], by: str = "stage") -> dict[int, int]:
    """Per stage (or per rank, ``by="rank"``), the most saved-activation bytes held at once."""
    out = {}
    for key in sorted({getattr(e, by) for e in events}):
        total, peak = 0, 0
        for e in sorted((e for e in events if getattr(e, by) == key), key=lambda e: e.time):
            total += e.delta
            peak = max(peak, total)
        out[key] = peak
    return out


def held_bytes_by_rank(events: list[MemoryEvent]) -> dict[int, tuple[list[float], list[int]]]:
    """Per rank (all its stages together): times and saved-activation bytes held after each event."""
    out = {}
    for rank in sorted({e.rank for e in events}):
        mine = sorted((e for e in events if e.rank == rank), key=lambda e: e.time)
        total, held = 0, []
        for e in mine:
            total += e.delta
            held.append(total)
        out[rank] = ([e.time for e in mine], held)
    return out
