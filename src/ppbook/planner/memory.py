"""Memory per GPU, in bytes: training state by sharding mode, activations by kernel and
recomputation, logits, and the buffers FSDP gathers.

Introduced in chapter 0 ("Why models outgrow one device") for the training state and in
"Choosing a pipeline" for the rest. Everything is a count of values times their bytes; nothing
here measures. ``tests/test_planner_memory.py`` ties the activation counts to what torch saves
(``saved_tensors_hooks`` and the profiler's allocations, on the CPU) for the blocks the book can
build, and the state to the book's own models built in torch.

**The training state.** Mixed-precision training with Adam keeps, per parameter, the bf16
weights the passes use, the gradients (accumulated and reduced in float32 by Megatron-LM and
torchtitan, in bf16 by some others) and the optimizer's float32 master weights and two moments
(Rajbhandari et al. 2020, "ZeRO"). With ``d`` data-parallel ranks:

=========  ============================================================================
mode       what each GPU holds of its share of the model (``Ψ`` parameters)
=========  ============================================================================
none       all of it (DDP): weights, gradients, master and moments
zero1      weights and gradients whole, master and moments ``/ d`` (Megatron-LM's
           distributed optimizer, DeepSpeed ZeRO-1)
zero2      weights whole, gradients, master and moments ``/ d``
fsdp       a float32 shard of the weights (the master), of the gradients and of the moments
           (``/ d``), plus the bf16 weights of the blocks gathered at the moment and their
           unsharded gradients (FSDP2, ZeRO-3)
=========  ============================================================================

How much FSDP holds gathered depends on where it runs. Without a pipeline, FSDP2's defaults free
a block after its forward and after its backward: a block or two are gathered at any time, and
the root group (embedding, norm, head), which does not reshard after forward, stays gathered.
Inside a ``PipelineStage``, resharding after backward and the gradient reduction are switched off
until the step's end (``perform_reduce_grad``), so by the last backward the whole stage is
gathered, with its unsharded gradients accumulated in the reduction's dtype (chapter 9 measures
this).

**Activations.** Per token of a microbatch and per layer, counted tensor by tensor (``h`` the
hidden size, ``h_kv`` the key/value width, ``f`` the MLP width):

- ``book``: the book's own ``LlamaBlock``, unfused: ``11 h + 4 f`` values, two norm statistics
  and attention's log-sum-exp (:func:`layer_activation_bytes`);
- ``fused``: fused norms (input and statistics), attention that reads grouped keys and values
  without copying them, and a fused SwiGLU that recomputes its activation: ``6 h + 2 h_kv + 3 f``
  (a GELU MLP: ``2 f``), what Megatron-LM and torchtitan's kernels save;
- ``unfused``: the same, but attention materialises its scores, as before FlashAttention
  (Megatron-LM 2021, BLOOM, MT-NLG): the softmax's output, the dropout's mask and output, ``5 a s``
  bytes per token, and the two hidden dropouts' masks (Korthikanti et al. 2022, section 4.1);
- ``selective`` recomputation: torch's selective checkpointing with a policy that saves the
  outputs of the matrix products and of attention and recomputes the rest (norms, activation
  functions, elementwise products): the block's input and those outputs;
- ``full`` recomputation: the block's input only; its backward rebuilds one block at a time.

With tensor parallelism and sequence parallelism (Korthikanti et al. 2022, as Megatron-LM and
torchtitan run it today) every saved activation is divided by ``tp``; without sequence
parallelism (before 2022) the norms' inputs, the inputs of attention and of the MLP and the
dropout masks are held whole on every tensor-parallel rank (:func:`replicated_values`).

**A training step's peak, against the allocator** (chapter 11; issue 48). :func:`training_peak`
walks one stage's step action by action as the book's ``scripts/06_train.py`` runs it and counts
every tensor alive at each backward and at the optimizer step: it predicts the first GPU record's
four peaks of ``torch.cuda.max_memory_allocated`` within 1% and ``06_train.py``'s peak on the CPU to
the byte (``tests/test_memory_peak.py``). How the passes get bf16 weights is an input
(:data:`WEIGHT_CASTS`): that record trained float32 weights under autocast, whose activations are
:func:`autocast_layer_values`. The planner counts the same parts for the arrangement it assumes,
bf16 compute copies beside float32 masters (its default recipe ``bf16``, the ``book`` or fused
counts at 2 bytes, float32 log-probabilities), as torchtitan runs it: a fused AdamW (no
temporaries, :func:`optimizer_step_bytes`), the schedule's outputs not kept
(``return_outputs=False``), and gradients counted at every peak (a conservative bound: before a
step's first backward none exists). cuBLAS's workspaces and the allocator's rounding and
fragmentation are in its ``headroom``.

**FP8 and other optimizers** (issue 52): an FP8 recipe (:data:`PRECISIONS`) adds the FP8 copies of
the linear layers' weights and keeps their inputs in FP8 for the backward
(:func:`fp8_saved_values`), with delayed scaling's history of maxima; an optimizer other than Adam
keeps its own state (:data:`OPTIMIZER_STATE`, :func:`recipe_for`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace

from ppbook.planner import shapes
from ppbook.planner.shapes import ModelShape, embedding_parameters, head_parameters, layer_parameters

GB = 1e9  # vendors quote device memory in decimal gigabytes ("80 GB")
SHARDING = ("none", "zero1", "zero2", "fsdp")
RECOMPUTE = ("none", "selective", "full")
KERNELS = ("fused", "unfused", "book")
# How bf16 training gets bf16 weights for its passes (see :func:`weight_copy_bytes`): float32 weights under one
# autocast region per step (the book's scripts until issue 48, the first GPU record), the matrix products'
# weights as bf16 compute copies kept beside their float32 masters under that region (precision.MasterWeights,
# the book's scripts since), an autocast region per microbatch, or every weight a bf16 compute copy made once
# per step beside float32 masters (the planner's default recipe).
WEIGHT_CASTS = ("autocast", "master", "per-microbatch", "per-step")


@dataclass(frozen=True)
class Recipe:
    """Bytes per parameter (weights as the passes use them, float32 master copy, gradients, Adam's
    two moments) and per activation value."""
    name: str
    weight_bytes: int
    master_bytes: int
    grad_bytes: int
    moment_bytes: int
    activation_bytes: int

    @property
    def optimizer_bytes(self) -> int:
        return self.master_bytes + self.moment_bytes


RECIPES: dict[str, Recipe] = {
    # bf16 weights and activations, float32 gradients (Megatron-LM's --accumulate-allreduce-grads-in-fp32,
    # torchtitan's float32 reduction), float32 master and moments: 2 + 4 + 12 = 18 bytes per parameter
    "bf16": Recipe("bf16", 2, 4, 4, 8, 2),
    # bf16 gradients as in ZeRO's accounting (Rajbhandari et al. 2020): 2 + 2 + 12 = 16
    "bf16-grads": Recipe("bf16-grads", 2, 4, 2, 8, 2),
    # everything in float32: 4 + 4 + 8 = 16
    "fp32": Recipe("fp32", 4, 0, 4, 8, 4),
}


@dataclass(frozen=True)
class State:
    """Bytes of one GPU's training state, by kind."""
    parameters: float
    gradients: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.parameters + self.gradients + self.optimizer


def state_bytes(params: float, recipe: Recipe, mode: str, d: int, gathered: float = 0.0,
                unsharded_grads: float = 0.0) -> State:
    """The training state of ``params`` parameters on one GPU under sharding ``mode`` over ``d``
    data-parallel ranks. For ``fsdp``, ``gathered`` parameters are held unsharded in the weights'
    dtype and ``unsharded_grads`` parameters' gradients unsharded in the gradients' dtype
    (:func:`fsdp_gathered`)."""
    if mode not in SHARDING:
        raise ValueError(f"unknown sharding {mode!r}; use one of {', '.join(SHARDING)}")
    r = recipe
    if mode == "none" or d == 1 and mode != "fsdp":
        return State(params * r.weight_bytes, params * r.grad_bytes, params * r.optimizer_bytes)
    if mode == "zero1":
        return State(params * r.weight_bytes, params * r.grad_bytes, params * r.optimizer_bytes / d)
    if mode == "zero2":
        return State(params * r.weight_bytes, params * r.grad_bytes / d, params * r.optimizer_bytes / d)
    shard = max(r.master_bytes, r.weight_bytes)  # FSDP's shard is the float32 master itself
    return State(params * shard / d + gathered * r.weight_bytes,
                 params * r.grad_bytes / d + unsharded_grads * r.grad_bytes,
                 params * r.moment_bytes / d)


def fsdp_gathered(block_params: float, root_params: float, blocks: int, pipelined: bool,
                  reshard_after_forward: bool = True, prefetch: int = 1) -> tuple[float, float]:
    """(parameters gathered, parameters with unsharded gradients) at one GPU's peak under FSDP2,
    wrapped as torchtitan wraps a model (each block a group, the root the rest).

    Inside a ``PipelineStage`` (``pipelined``) the whole share ends up gathered, with its
    gradients accumulated unsharded. Without a pipeline, with resharding after forward, the root
    stays gathered through the step and ``1 + prefetch`` blocks are gathered at once, one of
    them with its gradients not yet reduced; without resharding, every block stays gathered from
    its forward to its backward."""
    total = blocks * block_params + root_params
    if pipelined or not reshard_after_forward:
        return total, total if pipelined else block_params + root_params
    return root_params + min(blocks, 1 + prefetch) * block_params, block_params + root_params


FSDP_RESHARD = ("default", "always", "never")


def reshards_after_forward(policy: str, pipelined: bool) -> bool:
    """Whether FSDP2 frees a block's gathered weights after its forward, under torchtitan's
    ``fsdp_reshard_after_forward`` policy: ``always``, ``never``, or ``default`` (yes without a
    pipeline, no inside one, where it would gather every block again for every microbatch)."""
    if policy not in FSDP_RESHARD:
        raise ValueError(f"unknown FSDP reshard policy {policy!r}; use one of {', '.join(FSDP_RESHARD)}")
    return {"always": True, "never": False}.get(policy, not pipelined)


# --- a pipeline stage's inputs and outputs -------------------------------------------------------------------

STAGE_IO = ("torch", "freed")


def stage_buffer_bytes(boundary: float, m: int, first: bool, last: bool, stage_io: str = "torch") -> float:
    """Bytes of the receive buffers one pipeline stage keeps: torch's ``PipelineStage`` allocates,
    at its first step, a buffer for every microbatch's input (every stage but the first) and for
    every microbatch's output gradient (every stage but the last), ``boundary`` bytes each, and
    keeps them from step to step (``_prepare_forward_infra`` and ``_prepare_backward_infra`` in
    torch 2.13's ``stage.py``; ``tests/test_planner_memory.py`` counts them on torch's own stage).
    Runtimes that allocate on receipt and free once used (``stage_io="freed"``: Megatron-LM,
    DeepSpeed, Llama 3's) keep none."""
    if stage_io not in STAGE_IO:
        raise ValueError(f"unknown stage_io {stage_io!r}; use one of {', '.join(STAGE_IO)}")
    if stage_io == "freed":
        return 0.0
    return m * boundary * ((0 if first else 1) + (0 if last else 1))


def held_io_bytes(boundary: float, first: bool, last: bool, stage_io: str = "torch") -> float:
    """Bytes one microbatch holds on a stage between its forward and its backward beyond what
    autograd saves (:func:`stage_activation_bytes`): under torch's ``PipelineStage``, the stage's
    output, which the schedule keeps until the backward (``fwd_cache``; the last stage's output is
    the logits, counted apart), less, on every stage but the first, the first block's saved
    input, which is the receive buffer itself (counted once, with the buffers)."""
    if stage_io == "freed":
        return 0.0
    return (0.0 if last else boundary) - (0.0 if first else boundary)


# --- activations ---------------------------------------------------------------------------------------

def _mlp_values(shape: ModelShape, width: int, kernels: str) -> int:
    if shapes.gated(shape):
        return 4 * width if kernels == "book" else 3 * width
    return 2 * width


@functools.lru_cache(maxsize=256)
def attention_widths(shape: ModelShape) -> tuple[int, int, int, int]:
    """(query, key, value, output) widths per token: grouped-query attention's keys and values at
    ``kv_heads`` heads, multi-head latent attention's decompressed heads."""
    if shape.mla:
        qk = shape.heads * (shape.qk_nope_dim + shape.qk_rope_dim)
        return qk, qk, shape.heads * shape.v_head_dim, shape.heads * shape.v_head_dim
    return shape.heads * shape.hd, shape.kv_heads * shape.hd, shape.kv_heads * shape.hd, shape.heads * shape.hd


@functools.lru_cache(maxsize=1024)
def kernels_problem(shape: ModelShape, kernels: str) -> str | None:
    """Why the activation accounting ``kernels`` cannot count ``shape``'s blocks; ``None`` if it can."""
    if kernels not in KERNELS:
        return f"unknown kernels {kernels!r}; use one of {', '.join(KERNELS)}"
    if kernels == "book" and (shape.mlp != "swiglu" or shape.norm != "rms" or shape.mla):
        return (f"{shape.name}: kernels 'book' counts the book's own Llama block, tensor by tensor, and this model's "
                "blocks are not Llama-style; use kernels 'fused' or 'unfused'")
    return None


def layer_activation_values(shape: ModelShape, kernels: str = "fused", recompute: str = "none",
                            moe_layer: bool = False, seq_len: int = 0,
                            weight_casts: str = "per-step") -> tuple[float, float]:
    """(values in the activation dtype, values in float32) one layer saves per token for its
    backward. See the module docstring for what each accounting counts.

    ``selective`` is the policy of torchtitan's per-op selective checkpointing: inside each
    block, keep the outputs of attention and of every other matrix product (the first, third,
    ...: for a Llama block the query, value, gate and down projections) and recompute the rest.

    ``weight_casts`` other than ``per-step`` (float32 weights under autocast, the book's
    ``LlamaBlock`` only): :func:`autocast_layer_values`.
    """
    if kernels not in KERNELS or recompute not in RECOMPUTE:
        raise ValueError(f"kernels must be one of {KERNELS} and recompute one of {RECOMPUTE}")
    if weight_casts != "per-step":
        return autocast_layer_values(shape, kernels, recompute, weight_casts)
    h = shape.hidden
    q, k, v, out = attention_widths(shape)
    width = shape.expert_ffn if moe_layer else shape.ffn
    routed = (shape.top_k + shape.shared_experts) if moe_layer else 1  # MLPs a token goes through
    router = shape.experts if moe_layer else 0
    # tokens copied to their experts, and each expert's output, which the gate's gradient needs (the
    # combine weights each output by its gate: d gate = d out . expert out): k x h each
    dispatched = 2 * shape.top_k * h if moe_layer else 0
    lse = shape.heads  # attention's log-sum-exp, float32, per head
    if recompute == "full":
        return h, 0.0
    if recompute == "selective":
        if shapes.gated(shape):  # products: q k v o | gate up down -> keep q, v, gate, down
            return h + q + v + out + routed * width + h + router + dispatched, lse
        return h + q + k + v + out + routed * width + router + dispatched, lse  # qkv o | fc1 fc2 -> keep qkv, fc1
    stats = 2 if shape.norm == "rms" else 4  # rstd per norm (and the mean, for a layer norm)
    mlp = routed * _mlp_values(shape, width, kernels) + router + dispatched
    if kernels == "book":
        # the book's LlamaBlock, tensor by tensor (its keys and values repeated to every head)
        problem = kernels_problem(shape, kernels)
        if problem:
            raise ValueError(problem)
        return 11 * h + mlp + 2, lse
    # block input, first norm's output, q, k, v, attention output, second norm's input and output
    fused = 4 * h + q + k + v + out + mlp
    if kernels == "unfused":  # scores, dropout mask (1 byte) and output per head; two hidden dropout masks
        return fused + 2.5 * shape.heads * seq_len + h, stats
    return fused, stats + lse


def replicated_values(shape: ModelShape, kernels: str = "fused", recompute: str = "none") -> float:
    """Values per token of one layer's saved activations that tensor parallelism without sequence
    parallelism does not divide: each norm's input, the input of attention and of the MLP (the
    norms' outputs), and under ``unfused`` the two hidden dropouts' masks (Korthikanti et al. 2022:
    ``10 s b h`` bytes of ``34 s b h``); with full recomputation, the block's input."""
    if recompute == "full":
        return shape.hidden
    if recompute == "selective":
        return 2 * shape.hidden  # the block's input and the down projection's output
    return 4 * shape.hidden + (shape.hidden if kernels == "unfused" else 0)


def values_bytes(values: tuple[float, float], tokens: int, dtype_bytes: int) -> float:
    """Bytes of ``(values in the activation dtype, values in float32)`` per token for ``tokens``
    tokens; the float32 ones (statistics, log-sum-exp) are kept in the activations' dtype when it
    is wider (float64 in the book's exact tests)."""
    low, fp32 = values
    return tokens * (low * dtype_bytes + fp32 * max(4, dtype_bytes))


def layer_activation_bytes(shape: ModelShape, tokens: int, dtype_bytes: int = 2, kernels: str = "fused",
                           recompute: str = "none", moe_layer: bool = False, seq_len: int = 0,
                           weight_casts: str = "per-step") -> float:
    """Bytes one layer saves for ``tokens`` tokens (microbatch size x sequence length; the
    sequence length matters only where attention keeps its scores)."""
    return values_bytes(layer_activation_values(shape, kernels, recompute, moe_layer, seq_len, weight_casts), tokens,
                        dtype_bytes)


def recompute_transient_bytes(shape: ModelShape, tokens: int, dtype_bytes: int = 2, kernels: str = "fused",
                              recompute: str = "full", seq_len: int = 0) -> float:
    """Extra bytes at the peak of a backward with recomputation: one layer's activations rebuilt
    by its second forward (minus what the layer kept), freed by its backward."""
    if recompute == "none":
        return 0.0
    moe = shape.moe and shape.dense_layers < shape.layers
    return layer_activation_bytes(shape, tokens, dtype_bytes, kernels, "none", moe, seq_len) - \
        layer_activation_bytes(shape, tokens, dtype_bytes, kernels, recompute, moe, seq_len)


def logits_bytes(shape: ModelShape, tokens: int, dtype_bytes: int = 2, loss_dtype_bytes: int = 4) -> float:
    """The last stage's output per microbatch, held until its backward: the logits
    (tokens x vocabulary, kept by the schedule as the stage's output) and the log-probabilities
    that cross-entropy saves (float32, as large-vocabulary recipes compute the loss)."""
    return tokens * shape.vocab * (dtype_bytes + loss_dtype_bytes)


def loss_backward_bytes(shape: ModelShape, tokens: int, loss_dtype_bytes: int = 4) -> float:
    """The extra bytes while one microbatch's loss runs backward: the gradient of the
    log-probabilities and the gradient of the logits, both float32 and vocabulary-wide, exist
    at once (torchtitan's 8B runs peak here: tests/test_planner_published.py)."""
    return 2 * tokens * shape.vocab * loss_dtype_bytes


def stage_activation_bytes(shape: ModelShape, layers: list[int], tokens: int, first: bool, last: bool,
                           dtype_bytes: int = 2, kernels: str = "fused", recompute: str = "none",
                           seq_len: int = 0, weight_casts: str = "per-step") -> float:
    """Bytes one stage saves for one microbatch between its forward and its backward: its
    ``layers`` (indices into the model, so MoE and dense layers count as they are), on the first
    stage the token ids the embedding keeps (int64), on the last the final norm (outside every
    block, so kept whatever the recomputation: the book's unfused norm keeps its input, ``x * rsqrt``,
    its output and ``rsqrt``; a fused one its input and ``rsqrt``, and the output head keeps the
    norm's output, its own input). Logits are not here: :func:`logits_bytes`. Under autocast
    (``weight_casts``, :func:`autocast_layer_values`) the final norm keeps its float32 input,
    ``x * rsqrt`` and ``rsqrt``, and the head its own bf16 copy of the norm's output."""
    moe = sum(1 for i in layers if shape.moe and i >= shape.dense_layers)
    total = (len(layers) - moe) * layer_activation_bytes(shape, tokens, dtype_bytes, kernels, recompute, False, seq_len,
                                                         weight_casts)
    if moe:
        total += moe * layer_activation_bytes(shape, tokens, dtype_bytes, kernels, recompute, True, seq_len)
    if first:
        total += tokens * 8
    if last:
        if weight_casts != "per-step":
            norm = (shape.hidden, 2 * shape.hidden + 1)
        elif kernels == "book":
            norm = (3 * shape.hidden + 1, 0)
        else:
            norm = (2 * shape.hidden, 1 if shape.norm == "rms" else 2)
        total += values_bytes(norm, tokens, dtype_bytes)
    return total


def block_residual_values(shape: ModelShape) -> tuple[float, float]:
    """(values, float32 values) per token of one book block that torch 2.13 keeps after a
    microbatch's weight-gradient pass ``W``, until ``step`` returns, in the schedules that split
    the backward (I then W): the input gradient runs with ``retain_graph=True`` and the weight
    pass frees only what lies on a weight's path, so what only the input gradient needed stays:
    attention's q, k, v and output, each norm's input and ``rsqrt`` (``6 h + 2``), and attention's
    log-sum-exp."""
    return 6 * shape.hidden + 2, shape.heads


# --- parameters of a stage ---------------------------------------------------------------------------

def stage_parameters(shape: ModelShape, layers: list[int], first: bool, last: bool) -> int:
    """Parameters of a stage holding ``layers``; the first also holds the embedding, the last the
    final norm and the output head (a separate copy of a tied embedding: a pipeline keeps one on
    each end)."""
    moe = sum(1 for i in layers if shape.moe and i >= shape.dense_layers)
    blocks = (len(layers) - moe) * layer_parameters(shape, 0) + (moe * layer_parameters(shape, shape.layers - 1) if moe else 0)
    return blocks + (embedding_parameters(shape) if first else 0) + (head_parameters(shape) if last else 0)


def training_state_bytes(params: float, recipe: str = "bf16-grads") -> float:
    """Bytes of weights, gradients and optimizer state of ``params`` parameters, unsharded
    (chapter 0's count: 16 bytes per parameter in ZeRO's accounting)."""
    r = RECIPES[recipe]
    return params * (r.weight_bytes + r.grad_bytes + r.optimizer_bytes)


# --- the book's own training step, moment by moment (issue 48: the first GPU record) ---------------------

MiB = 2 ** 20
# torch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp): every block a multiple of 512 bytes; a
# request of 10 MiB or more gets a segment of its own rounded up to 2 MiB, and a block whose remainder is 1 MiB or
# less is not split: ``memory_allocated`` counts the whole block.
ALLOC_MIN_BLOCK, ALLOC_SMALL, ALLOC_MIN_LARGE, ALLOC_ROUND_LARGE = 512, MiB, 10 * MiB, 2 * MiB
# cuBLAS's workspace on Hopper (torch's CUDABlas default ``:4096:8``), allocated through the caching allocator, one
# per thread that runs matrix products: the forward's and autograd's device thread. The first GPU record's runs
# leave exactly these two allocated when everything else is freed (``pipeline_allocated_after``).
CUBLAS_WORKSPACE_BYTES, CUBLAS_WORKSPACES = 32 * MiB, 2
# cuDNN's attention (torch's choice for bf16 on an H200) saves, beside q, k, v, its output and the log-sum-exp,
# two int64 scalars of its random-number state: 512 bytes each once allocated (data/gpu costs.json: every block
# row is the count plus 1024 bytes). The CPU's flash attention saves none.
ATTENTION_RNG_TENSORS = {"cuda": 2, "cpu": 0}
DEVICES = ("cuda", "cpu")
OPTIMIZERS = ("foreach", "for-loop", "fused")


def allocated_size(nbytes: float, device: str = "cuda") -> float:
    """Bytes the allocator's ``memory_allocated`` counts for a tensor of ``nbytes`` (see
    :data:`ALLOC_MIN_BLOCK`): on a GPU, rounded up to 512 bytes, and a tensor of 10 MiB or more
    given its own segment rounded up to 2 MiB, kept whole when 1 MiB or less is left over (what
    the first step's allocations do; later steps reuse those blocks). On the CPU, ``nbytes``."""
    if device == "cpu" or nbytes <= 0:
        return float(max(nbytes, 0))
    size = -(-nbytes // ALLOC_MIN_BLOCK) * ALLOC_MIN_BLOCK
    if size >= ALLOC_MIN_LARGE:
        segment = -(-size // ALLOC_ROUND_LARGE) * ALLOC_ROUND_LARGE
        if segment - size <= ALLOC_SMALL:
            return float(segment)
    return float(size)


def autocast_layer_values(shape: ModelShape, kernels: str = "book", recompute: str = "none",
                          weight_casts: str = "autocast") -> tuple[float, float]:
    """(bf16 values, float32 values) per token that the book's ``LlamaBlock`` saves when its
    weights are float32 and its passes run under ``torch.autocast`` to bfloat16 (``weight_casts``
    ``autocast`` or ``per-microbatch``; the first GPU record's runs). The residual stream stays
    float32 (a float32 input plus a bf16 branch is float32), and every matrix product casts its
    float32 input to a bf16 copy of its own, which its backward keeps::

        bf16    10 h + 4 f  the bf16 copies of the attention norm's output for wq, wk, wv (3), SDPA's
                            q, k, v (keys and values repeated to every head) and output, wo's input,
                            the copies of the MLP norm's output for w1 and w3 (2); SwiGLU's w1 output,
                            silu's output, w3's output and w2's input
        float32 4 h + 2 + H the block's input and the residual after attention (each norm's input),
                            each norm's x * rsqrt and rsqrt, and SDPA's log-sum-exp per head

    Counted tensor by tensor in :func:`book_block_tensors`; ``tests/test_memory_autocast.py``
    checks both against what autograd saves under the CPU's autocast, whose casting rules for
    these operators are the GPU's (matrix products and attention to bf16, ``pow`` and ``rsqrt``
    of a float32 input stay float32). Whole-block recomputation keeps the float32 input alone."""
    if weight_casts not in WEIGHT_CASTS:
        raise ValueError(f"unknown weight_casts {weight_casts!r}; use one of {', '.join(WEIGHT_CASTS)}")
    if kernels != "book" or recompute not in ("none", "full"):
        raise ValueError(f"float32 weights under autocast are counted for the book's own block (kernels 'book') "
                         f"without recomputation or with 'full', not kernels {kernels!r}, recompute {recompute!r}")
    h, f = shape.hidden, shape.ffn
    if recompute == "full":
        return 0.0, float(h)
    return 10 * h + 4 * f, 4 * h + 2 + shape.heads


def book_block_tensors(shape: ModelShape, microbatch_size: int, seq_len: int, weight_casts: str = "per-step",
                       device: str = "cuda", rope_copies: bool = True) -> list[tuple[str, int]]:
    """(name, bytes) of every tensor one book ``LlamaBlock`` keeps for its backward for one
    microbatch of ``microbatch_size`` sequences of ``seq_len`` tokens: its input included, as in
    :func:`layer_activation_values` (whose ``book`` count, times the tokens, these add up to, plus
    the rotary tables' copies and the attention kernel's random-number state, which do not grow with
    the tokens). ``per-step``: bf16 weights and activations; otherwise float32 weights under
    autocast (:func:`autocast_layer_values`). ``rope_copies``: the rotary tables are float32
    buffers, so each ``apply_rope`` casts ``cos`` and ``sin`` to bf16 and keeps the copies (two
    calls, q and k: four tables of ``seq_len x head_dim / 2``)."""
    n, h, f, heads = microbatch_size * seq_len, shape.hidden, shape.ffn, shape.heads
    qkv = heads * shape.hd
    wide = 2 if weight_casts == "per-step" else 4  # the residual stream's bytes per value
    out = [("block input", n * h * wide)]
    for norm, inputs in (("attention", ("wq", "wk", "wv")), ("MLP", ("w1", "w3"))):
        if norm == "MLP":
            out.append(("residual after attention", n * h * wide))
        out += [(f"{norm} norm x * rsqrt", n * h * wide), (f"{norm} norm rsqrt", n * wide)]
        if weight_casts == "per-step":
            out.append((f"{norm} norm output", n * h * 2))
        else:
            out += [(f"bf16 copy of the {norm} norm output for {w}", n * h * 2) for w in inputs]
        if norm == "attention":
            if rope_copies:
                out += [(f"rotary {t} copy for {x}", seq_len * shape.hd) for x in ("q", "k") for t in ("cos", "sin")]
            out += [(f"attention {x}", n * qkv * 2) for x in ("q", "k", "v", "output")]
            out.append(("attention log-sum-exp (float32)", n * heads * 4))
            out += [(f"attention random-number state {i}", 8) for i in range(ATTENTION_RNG_TENSORS[device])]
            out.append(("wo input", n * qkv * 2))
    out += [(f"SwiGLU {x}", n * f * 2) for x in ("w1 output", "silu output", "w3 output", "w2 input")]
    return out


def final_norm_tensors(shape: ModelShape, tokens: int, weight_casts: str = "per-step") -> list[tuple[str, int]]:
    """(name, bytes) the book's final norm and output head keep per microbatch (the last stage)."""
    h = shape.hidden
    if weight_casts == "per-step":
        return [("final norm input", tokens * h * 2), ("final norm x * rsqrt", tokens * h * 2),
                ("final norm rsqrt", tokens * 2), ("final norm output", tokens * h * 2)]
    return [("final norm input (float32)", tokens * h * 4), ("final norm x * rsqrt (float32)", tokens * h * 4),
            ("final norm rsqrt (float32)", tokens * 4), ("bf16 copy of the final norm output for the head", tokens * h * 2)]


def weight_copy_bytes(cast_params: float, weight_casts: str, in_flight: int = 1) -> float:
    """Bytes of the bf16 copies of float32 weights that one moment of a step holds (Micikevicius
    et al. 2018: float32 masters, half-precision copies for the passes):

    - ``autocast``: one region around the step's passes (``precision.autocast`` around
      ``schedule.step``). torch's autocast caches the bf16 copy of every float32 leaf that
      requires grad (the matrix products' weights, ``cast_params``; the embedding and the norms'
      scales run in float32) from its first use until the outermost region exits, after the
      step's last backward: one copy, shared by every microbatch's saved graph.
    - ``master``: :class:`ppbook.precision.MasterWeights` under that region (the book's scripts
      since issue 48): the matrix products' weights are bf16 compute copies that autocast uses
      as they are, their float32 originals the optimizer's masters, recast once after each
      optimizer step. The passes hold what ``autocast`` holds; the copies live on through the
      optimizer step, where autocast's cache is gone.
    - ``per-microbatch``: a region per microbatch's forward. Each closes with its forward, but
      the copies stay referenced by that microbatch's saved graph until its backward: one copy
      per microbatch in flight.
    - ``per-step``: bf16 compute copies made once per step, float32 masters in the optimizer,
      kept from step to step (``cast_params`` then counts every parameter). The passes then run
      in bf16 throughout: activations are the ``book`` count at 2 bytes (what ``costs.json``
      measured), the gradients accumulate in float32 and the loss keeps float32 log-probabilities,
      as the planner's default recipe counts them."""
    if weight_casts not in WEIGHT_CASTS:
        raise ValueError(f"unknown weight_casts {weight_casts!r}; use one of {', '.join(WEIGHT_CASTS)}")
    return 2.0 * cast_params * (in_flight if weight_casts == "per-microbatch" else 1)


def optimizer_step_bytes(sizes: list[float], implementation: str = "foreach") -> float:
    """Bytes AdamW allocates for the duration of its step beyond its state (Loshchilov and Hutter
    2019), for parameters of ``sizes`` elements (in the optimizer's order): torch's ``foreach``
    implementation (the default on a GPU) computes ``sqrt(v)`` for all of them at once, float32,
    then updates in place; the ``for-loop`` one (the CPU's default) does it a tensor at a time,
    ``sqrt(v)`` and its quotient alive while the previous tensor's quotient is not yet released;
    ``fused`` kernels keep none. Clipping by the global norm adds only a scalar per tensor (the
    norms; the gradients are scaled in place)."""
    if implementation not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer implementation {implementation!r}; use one of {', '.join(OPTIMIZERS)}")
    if implementation == "foreach":
        return 4.0 * sum(sizes)
    if implementation == "for-loop":
        return 4.0 * max((2 * n + (sizes[i - 1] if i else 0) for i, n in enumerate(sizes)), default=0)
    return 0.0


def workspace_bytes(device: str = "cuda") -> float:
    """Bytes the libraries keep allocated through torch's allocator during training: cuBLAS's
    workspaces (:data:`CUBLAS_WORKSPACE_BYTES`, one per thread); none on the CPU."""
    return float(CUBLAS_WORKSPACE_BYTES * CUBLAS_WORKSPACES) if device == "cuda" else 0.0


def book_parameter_tensors(shape: ModelShape) -> list[tuple[str, int, bool]]:
    """(name, elements, cast) of every parameter of the book's Llama (untied), in model order;
    ``cast``: a matrix product's weight, which autocast copies to bf16 (the embedding and the
    norms' scales run in float32)."""
    h, f, q, kv = shape.hidden, shape.ffn, shape.heads * shape.hd, shape.kv_heads * shape.hd
    block = [("attention norm", h, False), ("wq", q * h, True), ("wk", kv * h, True), ("wv", kv * h, True),
             ("wo", h * q, True), ("MLP norm", h, False), ("w1", f * h, True), ("w3", f * h, True), ("w2", h * f, True)]
    return [("embedding", shape.vocab * h, False), *block * shape.layers, ("final norm", h, False),
            ("head", shape.vocab * h, True)]


@dataclass(frozen=True)
class Peak:
    """The most bytes one training step holds at once, by part (the parts add up to ``total``),
    and the moment it happens; ``moments``: every candidate moment's total; ``in_flight``: how
    many microbatches' activations that moment holds."""
    total: float
    parts: dict
    moment: str
    moments: dict = field(default_factory=dict)
    in_flight: int = 0


PEAK_SCHEDULES = ("GPipe", "1F1B", "none")


def training_peak(shape: ModelShape, schedule: str, m: int, microbatch_size: int, seq_len: int,
                  weight_casts: str = "per-step", device: str = "cuda", optimizer: str | None = None,
                  rope_copies: bool = True) -> Peak:
    """The peak of ``memory_allocated`` over a training step of the book's Llama at one stage,
    as ``scripts/06_train.py`` trains it (AdamW, gradients set to None before each step,
    ``torch.distributed.pipelining``'s ``Schedule<schedule>``, or ``none``: a plain loop that runs
    each microbatch's forward and backward in turn), from the second step on (AdamW's moments
    exist), on ``device``.

    The step is walked action by action (:func:`ppbook.planner.schedules.order`); the candidate
    moments are the start of each microbatch's backward, where its loss's backward makes the
    largest transient (:func:`loss_backward_bytes`), and the optimizer's step. At a backward:

    - float32 parameters, AdamW's moments (Rajbhandari et al. 2020's 12 bytes a parameter) and
      the float32 gradients, which exist only once the step's first backward has made them: at
      GPipe's first backward no gradient exists yet;
    - the bf16 weight copies (:func:`weight_copy_bytes`);
    - each microbatch in flight: its blocks (:func:`book_block_tensors`; per token,
      :func:`layer_activation_values`, Korthikanti et al. 2022's tensor-by-tensor count), the final
      norm, and the loss's float32 log-probabilities;
    - the logits: torch's schedules keep every microbatch's output (``output_chunks``) until the
      next step begins, to return them merged; in the plain loop nothing keeps them past the loss
      (cross-entropy keeps its float32 log-probabilities, not its input);
    - the step's batch (token ids and targets, int64), each loss's scalars, cuBLAS's workspaces
      (:func:`workspace_bytes`), and the allocator's rounding of every tensor
      (:func:`allocated_size`).

    At the optimizer step the activations are gone; AdamW's temporaries
    (:func:`optimizer_step_bytes`: ``foreach`` on a GPU, ``for-loop`` on the CPU) come instead.
    What is not counted: kernels' workspaces inside one operator, and backward transients other
    than the loss's (a block's backward frees about what it allocates).
    """
    from ppbook.planner import schedules as sched

    if schedule not in PEAK_SCHEDULES:
        raise ValueError(f"training_peak walks one stage under {', '.join(PEAK_SCHEDULES)}, not {schedule!r}")
    if weight_casts not in WEIGHT_CASTS:
        raise ValueError(f"unknown weight_casts {weight_casts!r}; use one of {', '.join(WEIGHT_CASTS)}")
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; use one of {', '.join(DEVICES)}")
    if min(m, microbatch_size, seq_len) < 1:
        raise ValueError(f"need m, microbatch_size and seq_len >= 1, got {m}, {microbatch_size}, {seq_len}")
    optimizer = optimizer or ("foreach" if device == "cuda" else "for-loop")
    size = functools.partial(allocated_size, device=device)
    n, V = microbatch_size * seq_len, shape.vocab
    params = book_parameter_tensors(shape)
    copied = [e for _, e, cast in params if cast or weight_casts == "per-step"]
    per_mb = [t for _, t in book_block_tensors(shape, microbatch_size, seq_len, weight_casts, device, rope_copies)]
    per_mb = per_mb * shape.layers + [t for _, t in final_norm_tensors(shape, n, weight_casts)]
    # a loss is a float32 scalar: the schedule keeps each microbatch's until the step returns, the loop the previous
    # step's until then (``mb_losses``), and each loss's backward saves one more
    scalar = 4
    fixed = {  # what every moment holds: each part as the bytes of its tensors
        "parameters (float32)": [4 * e for _, e, _ in params],
        "AdamW moments": [4 * e for _, e, _ in params] * 2 + ([4] * len(params) if device == "cpu" else []),
        "rotary tables (float32)": [seq_len * shape.hd // 2 * 4] * 2,
        "batch (token ids, targets)": [8 * m * n] * 2,
        "workspaces": [CUBLAS_WORKSPACE_BYTES] * CUBLAS_WORKSPACES if device == "cuda" else [],
    }

    def moment(label: str, parts_lists: dict, in_flight: int = 0) -> Peak:
        lists = {**fixed, **parts_lists}
        parts = {k: float(sum(v)) for k, v in lists.items()}
        parts["allocator rounding"] = sum(size(t) - t for v in lists.values() for t in v)
        return Peak(sum(parts.values()), parts, label, in_flight=in_flight)

    keep = schedule != "none"
    acts = sched.order("1F1B" if schedule == "none" else schedule, 1, m)[0]
    held: list[int] = []
    forwards = backwards = 0
    best = None
    totals = {}
    for a in acts:
        if a.kind == "F":
            held.append(a.microbatch)
            forwards += 1
            continue
        k = len(held)
        here = moment(f"backward of microbatch {a.microbatch}", {
            "gradients (float32)": [4 * e for _, e, _ in params] if backwards else [],
            "weight copies (bf16)": [2 * e for e in copied] * (k if weight_casts == "per-microbatch" else 1),
            "activations": per_mb * k,
            "log-probabilities (float32)": [4 * V * n] * k,
            "logits (bf16)": [2 * V * n] * (forwards if keep else 0),
            "loss scalars": [scalar] * ((forwards + m if keep else k) + k),
            "loss backward": [4 * V * n] * 2,
        }, in_flight=k)
        totals[here.moment] = here.total
        best = here if best is None or here.total > best.total else best
        held.remove(a.microbatch)
        backwards += 1
    step = moment("optimizer step", {
        "gradients (float32)": [4 * e for _, e, _ in params],
        "weight copies (bf16)": [2 * e for e in copied] if weight_casts in ("per-step", "master") else [],
        "optimizer temporaries": [optimizer_step_bytes([e for _, e, _ in params], optimizer)],
        "logits (bf16)": [2 * V * n] * (m if keep else 0),
        "loss scalars": [scalar] * (m if keep else 0),
    })
    totals[step.moment] = step.total
    return replace(step if step.total > best.total else best, moments=totals)


# --- mixtures of experts as frameworks lay them out, FP8, optimizers other than Adam (issue 52) -------------------

# Optimizer state per parameter beyond the float32 master copy, in bytes, and what it is. Adam's two float32
# moments are the planner's default (Recipe.moment_bytes); the others replace them.
OPTIMIZER_STATE: dict[str, tuple[int, str]] = {
    "adamw": (8, "two float32 moments (Loshchilov and Hutter 2019)"),
    "adamw-bf16": (4, "two bf16 moments (DeepSeek-V3's recipe; Megatron-LM's --use-precision-aware-optimizer "
                      "--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16)"),
    "muon": (4, "one float32 momentum buffer (Jordan et al. 2024); Moonlight keeps AdamW's two for the embedding, "
                "head and norms, counted here at Muon's one, and Muon's Newton-Schulz iterations are not timed"),
    "sgd": (4, "one float32 momentum buffer (SGD with momentum)"),
    "adafactor": (0, "factored second moments, one row and one column per matrix (Shazeer and Stern 2018), and no "
                     "first moment (its default): counted as nothing per parameter"),
}


def recipe_for(name: str, optimizer: str = "adamw") -> Recipe:
    """The memory recipe ``name`` (:data:`RECIPES`) with ``optimizer``'s state (:data:`OPTIMIZER_STATE`)
    in place of Adam's moments; ``adamw`` gives the recipe itself."""
    if optimizer not in OPTIMIZER_STATE:
        raise ValueError(f"unknown optimizer {optimizer!r}; use one of {', '.join(OPTIMIZER_STATE)}")
    base = RECIPES[name]
    if optimizer == "adamw":
        return base
    return replace(base, name=f"{name}+{optimizer}", moment_bytes=OPTIMIZER_STATE[optimizer][0])


@dataclass(frozen=True)
class Precision:
    """How the blocks' matrix products run, and what that keeps in memory (Transformer Engine's
    recipes, as Megatron-LM runs them; ``costs.FP8_GEMM_MS`` holds their measured speed-ups):

    - ``weight_copy_bytes``: per parameter of an FP8 linear layer, the FP8 copies of its weight kept
      between the passes: a row-wise copy for the forward and a column-wise (transposed) one for the
      input gradient, which Hopper's FP8 products need (Transformer Engine caches both), with their
      scales; the bf16 weights and float32 masters stay as in bf16 training;
    - ``saved_input_bytes``: per value of a linear layer's input saved for the weight gradient:
      Transformer Engine saves the quantized input (one byte, and its block's scale) instead of bf16;
    - ``amax_history``: delayed scaling keeps each FP8 tensor's last ``amax_history`` maxima (float32;
      three tensors a linear layer: input, weight, output gradient)."""
    name: str
    fp8: bool
    weight_copy_bytes: float = 0.0
    saved_input_bytes: float = 2.0
    amax_history: int = 0
    about: str = ""


PRECISIONS: dict[str, Precision] = {p.name: p for p in [
    Precision("bf16", False, about="bf16 matrix products"),
    Precision("fp8-delayed", True, 2.0, 1.0, 1024,
              "FP8 per-tensor delayed scaling (Transformer Engine's DelayedScaling, E4M3 forward and E5M2 "
              "gradients, scales from a 1,024-step history of maxima)"),
    Precision("fp8-current", True, 2.0, 1.0, 0,
              "FP8 per-tensor current scaling (Transformer Engine's Float8CurrentScaling, Megatron-LM's "
              "--fp8-recipe tensorwise; torchao's tensorwise)"),
    Precision("fp8-blockwise", True, 2.0 + 2 * 4 / 128 ** 2, 1.0 + 4 / 128, 0,
              "FP8 blockwise scaling as DeepSeek-V3 trained (1 x 128 tiles of activations and gradients, 128 x 128 "
              "blocks of weights, a float32 scale each; Transformer Engine's Float8BlockScaling)"),
    Precision("mxfp8", True, 2 * (1 + 1 / 32), 1 + 1 / 32, 0,
              "MXFP8 (OCP microscaling: 32 values share a one-byte power-of-two scale; Blackwell's tensor cores; "
              "Transformer Engine's MXFP8BlockScaling)"),
]}
# Kept in bf16 whatever the precision (Transformer Engine's and Megatron-LM's FP8 recipes, DeepSeek-V3's): the
# embedding, the output head and its loss, the router, the norms, attention's score and value products (softmax),
# and every communication (pipeline hand-offs, the experts' all-to-all, data-parallel traffic: no FP8 all-gather).
BF16_PARTS = ("the embedding", "the output head and loss", "the router", "the norms",
              "attention's score and value products", "all communication (no FP8 all-gather)")


def precision_of(name: str) -> Precision:
    if name not in PRECISIONS:
        raise ValueError(f"unknown precision {name!r}; use one of {', '.join(PRECISIONS)}")
    return PRECISIONS[name]


def fp8_saved_values(shape: ModelShape, kernels: str = "fused", recompute: str = "none",
                     moe_layer: bool = False, etp: int = 1, load: float = 1.0) -> float:
    """Values per token of one layer's saved activations that are inputs of FP8 linear layers, which
    an FP8 recipe saves in FP8 (:attr:`Precision.saved_input_bytes`) instead of bf16. Without
    recomputation: each norm's output (the input of the query, key and value projections, and of the
    MLP; in an MoE layer only where shared experts take it, the router being bf16), attention's
    output (the output projection's input), the input of the MLP's last matrix, and in an MoE layer
    the tokens dispatched to the experts. Selective recomputation keeps attention's output and the
    dispatched tokens of these; full recomputation only the block's input, in bf16. On the busiest
    GPU of an MoE layer the routed experts' inputs are ``load`` times the mean, and the dispatched
    tokens ``etp`` times more (:func:`expert_activation_extra`)."""
    if recompute == "full":
        return 0.0
    _, _, _, out = attention_widths(shape)
    dispatched = shape.top_k * shape.hidden * etp * load if moe_layer else 0
    if recompute == "selective":
        return out + dispatched
    if not moe_layer:
        return shape.hidden + out + shape.hidden + shape.ffn
    mlp_norm = shape.hidden if shape.shared_experts else 0  # the router's input stays bf16
    matrices_in = (shape.top_k * load + shape.shared_experts) * shape.expert_ffn
    return shape.hidden + out + mlp_norm + matrices_in + dispatched


def expert_activation_extra(shape: ModelShape, kernels: str = "fused", recompute: str = "none", etp: int = 1,
                            load: float = 1.0) -> float:
    """Values per token (of a GPU's own tokens) one MoE layer keeps on the busiest GPU beyond what
    :func:`layer_activation_values` counts, which divides every value by the tensor-parallel size:
    the routed experts' activations are ``load`` times the mean there (the busiest expert-parallel
    rank's tokens over the mean), and the dispatched tokens and expert outputs are gathered over the
    ``etp`` GPUs that split each expert (each holds all of its group's tokens, at ``1/etp`` of each
    expert's width). 0 for a dense layer's count (``etp`` 1, ``load`` 1)."""
    if recompute == "full":
        return 0.0
    dispatched = 2 * shape.top_k * shape.hidden
    width = shape.expert_ffn
    routed = shape.top_k * (width if recompute == "selective" else _mlp_values(shape, width, kernels))
    return routed * (load - 1) + dispatched * (etp * load - 1)
