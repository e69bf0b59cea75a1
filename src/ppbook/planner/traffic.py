"""Bytes that cross the network per training step, for each kind of parallelism.

Introduced in chapter 9 ("Scaling out"); the planner of "Choosing a pipeline" uses it. Pure
functions of sizes, so that a layout's traffic can be compared before anything runs:

* a pipeline boundary carries one activation of ``b x s x h`` values per microbatch forward and
  a gradient of the same size backward (Narayanan et al. 2021, section 3.2);
* a ring all-reduce sends ``2 (n - 1) / n`` times the tensor's bytes per rank, an all-gather or a
  reduce-scatter ``(n - 1) / n`` times (the full tensor's bytes);
* data parallelism moves what its sharding mode needs (:func:`data_parallel_bytes`): an
  all-reduce of the gradients when it replicates (DDP), a reduce-scatter of the gradients plus an
  all-gather of the updated weights under ZeRO-1 and ZeRO-2, and under FSDP (ZeRO-3) one
  all-gather of a block's weights each time it is used after being freed (:func:`fsdp_gathers`
  counts them from the schedule's order) plus the reduce-scatter;
* tensor parallelism (with sequence parallelism) all-gathers and reduce-scatters a block's
  activation twice in its forward and twice in its backward (Korthikanti et al. 2022).
"""

from __future__ import annotations


def boundary_bytes(microbatch_size: int, seq_len: int, hidden: int, dtype_bytes: int) -> int:
    """Bytes of one activation (or its gradient) crossing one stage boundary for one microbatch."""
    return microbatch_size * seq_len * hidden * dtype_bytes


def pipeline_bytes_per_step(n_microbatches: int, microbatch_size: int, seq_len: int, hidden: int,
                            dtype_bytes: int) -> int:
    """Bytes one stage boundary carries per step: every microbatch's activation and its gradient."""
    return 2 * n_microbatches * boundary_bytes(microbatch_size, seq_len, hidden, dtype_bytes)


def allreduce_bytes_per_rank(nbytes: float, n: int) -> float:
    """Bytes each of ``n`` ranks sends in a ring all-reduce of ``nbytes`` (0 when n = 1)."""
    return 2 * (n - 1) / n * nbytes


def alltoall_bytes_per_rank(nbytes: float, n: int) -> float:
    """Bytes each of ``n`` ranks sends to the others in an all-to-all of its ``nbytes``, spread
    evenly: all but its own share (0 when n = 1)."""
    return (n - 1) / n * nbytes


def expert_dispatch_bytes(microbatch_size: int, seq_len: int, hidden: int, top_k: int, dtype_bytes: int,
                          tp: int = 1) -> float:
    """Bytes one rank dispatches to the experts in one MoE layer, one microbatch: each of its
    tokens, copied to its ``top_k`` experts (with sequence parallelism a tensor-parallel rank
    dispatches its ``1/tp`` of the tokens). The combine sends as many back; the backward, both
    again: four all-to-alls per MoE layer and microbatch."""
    return microbatch_size * seq_len * top_k * hidden * dtype_bytes / tp


def gather_bytes_per_rank(nbytes: float, n: int) -> float:
    """Bytes each of ``n`` ranks sends in a ring all-gather or reduce-scatter of a tensor of
    ``nbytes`` in all (0 when n = 1)."""
    return (n - 1) / n * nbytes


def fsdp_gathers(kinds: list[str], reshard_after_forward: bool) -> int:
    """How many times a block's weights are all-gathered in one step under FSDP2 inside a
    ``PipelineStage``, given the kinds (``F``, ``B``, ``I``, ``W``) of the stage's actions in order.

    A block is gathered when it is used while freed. After a forward it is freed again if
    ``reshard_after_forward``; after a backward it is not freed (the stage switches resharding
    after backward off until the step's end, ``perform_reduce_grad``); the next forward frees it if
    ``reshard_after_forward``, else it stays gathered to the step's end. So
    GPipe's order costs ``m + 1`` gathers with resharding and 1 without; 1F1B's frees and
    re-gathers around each forward that follows a backward. Chapter 9 measures these counts.
    """
    gathered, gathers = False, 0
    for kind in kinds:
        if not gathered:
            gathers += 1
            gathered = True
        if kind == "F" and reshard_after_forward:
            gathered = False
    return gathers


def fsdp_bytes_per_rank(param_bytes: float, grad_bytes: float, n: int, gathers: int = 2) -> float:
    """Bytes each of ``n`` ranks sends per step under FSDP: ``gathers`` all-gathers of the weights
    (``param_bytes`` unsharded, in the compute dtype) and one reduce-scatter of the gradients
    (``grad_bytes``: in float32 when the reduction runs in float32, as torchtitan's does). Without
    a pipeline, FSDP's default (reshard after forward) gathers twice per microbatch: for the
    forward and for the backward; inside ``PipelineStage``, :func:`fsdp_gathers` says how often."""
    return gather_bytes_per_rank(gathers * param_bytes + grad_bytes, n)


def data_parallel_bytes(mode: str, param_bytes: float, grad_bytes: float, n: int, reduces: int = 1,
                        gathers: int = 1) -> float:
    """Bytes each of ``n`` data-parallel ranks sends per step for its share of the model under
    sharding ``mode``:

    - ``"none"`` (DDP): one all-reduce of the gradients (``grad_bytes``);
    - ``"zero1"``: a reduce-scatter of the gradients and an all-gather of the updated weights
      (``param_bytes``), the volume of one all-reduce (Megatron-LM's distributed optimizer);
    - ``"zero2"``: the same, with one reduce-scatter per microbatch (``reduces``) when the gradients
      are to stay sharded across microbatches;
    - ``"fsdp"``: ``gathers`` all-gathers of the weights and one reduce-scatter of the gradients
      per step (``reduces`` when it syncs every microbatch).
    """
    if mode == "none":
        return allreduce_bytes_per_rank(grad_bytes, n)
    if mode in ("zero1", "zero2"):
        return gather_bytes_per_rank(reduces * grad_bytes + param_bytes, n)
    if mode == "fsdp":
        return gather_bytes_per_rank(reduces * grad_bytes + gathers * param_bytes, n)
    raise ValueError(f"unknown sharding mode {mode!r}; use none, zero1, zero2 or fsdp")


def tensor_parallel_bytes(microbatch_size: int, seq_len: int, hidden: int, dtype_bytes: int, tp: int) -> float:
    """Bytes each of ``tp`` ranks sends for one block and one microbatch, forward and backward:
    with sequence parallelism, two all-gathers and two reduce-scatters of the ``b x s x h``
    activation each way (the volume of two all-reduces each way, Korthikanti et al. 2022)."""
    return 4 * allreduce_bytes_per_rank(boundary_bytes(microbatch_size, seq_len, hidden, dtype_bytes), tp)
