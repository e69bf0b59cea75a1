"""Bytes that cross the network per training step, for each kind of parallelism.

Introduced in chapter 9 ("Scaling out"); the planner of "Choosing a pipeline" uses it. Pure
functions of sizes, so that a layout's traffic can be compared before anything runs:

* a pipeline boundary carries one activation of ``b x s x h`` values per microbatch forward and
  a gradient of the same size backward (Narayanan et al. 2021, section 3.2);
* a data-parallel all-reduce (ring) sends ``2 (n - 1) / n`` times the gradient bytes per rank;
* FSDP / ZeRO-3 all-gathers the parameters in the forward and again in the backward, and
  reduce-scatters the gradients: about three times the shard group's parameter bytes, each
  moving ``(n - 1) / n`` of it per rank (Rajbhandari et al. 2020).
"""

from __future__ import annotations


def boundary_bytes(microbatch_size: int, seq_len: int, hidden: int, dtype_bytes: int) -> int:
    """Bytes of one activation (or its gradient) crossing one stage boundary for one microbatch."""
    return microbatch_size * seq_len * hidden * dtype_bytes


def pipeline_bytes_per_step(n_microbatches: int, microbatch_size: int, seq_len: int, hidden: int,
                            dtype_bytes: int) -> int:
    """Bytes one stage boundary carries per step: every microbatch's activation and its gradient."""
    return 2 * n_microbatches * boundary_bytes(microbatch_size, seq_len, hidden, dtype_bytes)


def allreduce_bytes_per_rank(grad_bytes: float, n: int) -> float:
    """Bytes each of ``n`` ranks sends in a ring all-reduce of ``grad_bytes`` (0 when n = 1)."""
    return 2 * (n - 1) / n * grad_bytes


def fsdp_bytes_per_rank(param_bytes: float, grad_bytes: float, n: int) -> float:
    """Bytes each of ``n`` ranks sends per step under FSDP (full sharding, reshard after forward):
    all-gather of the parameters in the forward and in the backward, reduce-scatter of the
    gradients; each collective moves ``(n - 1) / n`` of the full tensor through every rank."""
    return (n - 1) / n * (2 * param_bytes + grad_bytes)
