"""What FSDP2 holds and gathers during a pipeline step: a measurement probe for chapter 9.

Introduced in chapter 9 ("Scaling out"). Under ``fully_shard`` each parameter group (one per
``fully_shard`` call) is all-gathered before use and, depending on ``reshard_after_forward`` and
on what torch's pipelining sets for backward, freed again. :func:`probe` counts the all-gathers
and tracks the bytes of parameters held unsharded, in total and while only forwards have run;
chapter 12 also counts the gradient reductions (one reduce-scatter per group and step under
torch's pipelining, after the last microbatch's backward).

Each collective's bytes are read from the buffers FSDP hands to it: an all-gather's output (the
group's parameters unsharded, padded so that each rank's shard has the same size) and a
reduce-scatter's input (the unsharded gradients, padded the same way), with the size of the group.
In a ring, each of ``n`` ranks sends ``(n - 1) / n`` of that (:attr:`FsdpStats.sent_bytes`).
Plain FSDP only: under HSDP (a 2-D mesh) or ``replicate``, FSDP also all-reduces the reduced
gradients over the replicas, which the probe does not count.

It wraps three methods of FSDP2's private ``FSDPParamGroup`` and the module's all-gather and
reduce-scatter functions for the duration of a ``with`` block (torch 2.13): a measurement, not
something a training script should depend on.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field


@dataclass
class FsdpStats:
    all_gathers: int = 0
    reduce_scatters: int = 0
    peak_unsharded_bytes: int = 0           # the most parameter bytes held unsharded at once
    forward_peak_unsharded_bytes: int = 0   # the same, before the step's first backward
    all_gather_bytes: int = 0               # what the all-gathers gathered, summed (their outputs)
    reduce_scatter_bytes: int = 0           # what the reduce-scatters reduced, summed (their inputs)
    sent_bytes: float = 0.0                 # what this rank sent in both, as rings: (n - 1) / n of each (not HSDP's all-reduce)
    backward_started: bool = False
    _held: dict = field(default_factory=dict)  # group id -> unsharded bytes

    def to_json(self) -> dict:
        return {"all_gathers": self.all_gathers, "reduce_scatters": self.reduce_scatters,
                "all_gather_bytes": self.all_gather_bytes, "reduce_scatter_bytes": self.reduce_scatter_bytes,
                "sent_bytes": self.sent_bytes, "peak_unsharded_bytes": self.peak_unsharded_bytes,
                "forward_peak_unsharded_bytes": self.forward_peak_unsharded_bytes}


def _group_bytes(group) -> int:
    return sum(fp._orig_size.numel() * fp.sharded_param.element_size() for fp in group.fsdp_params)


@contextlib.contextmanager
def probe():
    """``with probe() as stats:`` counts all-gathers and unsharded bytes of every FSDP2 group."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as pg

    stats = FsdpStats()
    cls = pg.FSDPParamGroup
    saved = {"to_unsharded": cls._to_unsharded, "to_sharded": cls._to_sharded, "pre_backward": cls.pre_backward,
             "gather": pg.foreach_all_gather, "reduce": pg.foreach_reduce}

    def record():
        held = sum(stats._held.values())
        stats.peak_unsharded_bytes = max(stats.peak_unsharded_bytes, held)
        if not stats.backward_started:
            stats.forward_peak_unsharded_bytes = max(stats.forward_peak_unsharded_bytes, held)

    def to_unsharded(self):
        saved["to_unsharded"](self)
        stats._held[id(self)] = _group_bytes(self)
        record()

    def to_sharded(self):
        saved["to_sharded"](self)
        stats._held.pop(id(self), None)

    def pre_backward(self, *args, **kwargs):
        stats.backward_started = True
        return saved["pre_backward"](self, *args, **kwargs)

    def collective(nbytes: int, n: int) -> int:
        stats.sent_bytes += (n - 1) / n * nbytes
        return nbytes

    def gather(fsdp_params, group, *args, **kwargs):
        result = saved["gather"](fsdp_params, group, *args, **kwargs)
        stats.all_gathers += 1
        if result is not None:  # an AllGatherResult: its first field is the gathered buffer
            out = result[0]
            stats.all_gather_bytes += collective(out.numel() * out.element_size(), group.size())
        return result

    def reduce(fsdp_params, unsharded_grads, group, *args, **kwargs):
        result = saved["reduce"](fsdp_params, unsharded_grads, group, *args, **kwargs)
        stats.reduce_scatters += 1
        buffer = result[0]  # the reduce-scatter's input: every gradient of the group, padded
        n = group.size() if group is not None else 1  # no group: replicated (HSDP's all-reduce only)
        stats.reduce_scatter_bytes += collective(buffer.numel() * buffer.element_size(), n)
        return result

    cls._to_unsharded, cls._to_sharded, cls.pre_backward, pg.foreach_all_gather, pg.foreach_reduce = \
        to_unsharded, to_sharded, pre_backward, gather, reduce
    try:
        yield stats
    finally:
        cls._to_unsharded, cls._to_sharded, cls.pre_backward = \
            saved["to_unsharded"], saved["to_sharded"], saved["pre_backward"]
        pg.foreach_all_gather, pg.foreach_reduce = saved["gather"], saved["reduce"]
