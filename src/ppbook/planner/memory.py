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
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ppbook.planner import shapes
from ppbook.planner.shapes import ModelShape, embedding_parameters, head_parameters, layer_parameters

GB = 1e9  # vendors quote device memory in decimal gigabytes ("80 GB")
SHARDING = ("none", "zero1", "zero2", "fsdp")
RECOMPUTE = ("none", "selective", "full")
KERNELS = ("fused", "unfused", "book")


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
                            moe_layer: bool = False, seq_len: int = 0) -> tuple[float, float]:
    """(values in the activation dtype, values in float32) one layer saves per token for its
    backward. See the module docstring for what each accounting counts.

    ``selective`` is the policy of torchtitan's per-op selective checkpointing: inside each
    block, keep the outputs of attention and of every other matrix product (the first, third,
    ...: for a Llama block the query, value, gate and down projections) and recompute the rest.
    """
    if kernels not in KERNELS or recompute not in RECOMPUTE:
        raise ValueError(f"kernels must be one of {KERNELS} and recompute one of {RECOMPUTE}")
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
                           recompute: str = "none", moe_layer: bool = False, seq_len: int = 0) -> float:
    """Bytes one layer saves for ``tokens`` tokens (microbatch size x sequence length; the
    sequence length matters only where attention keeps its scores)."""
    return values_bytes(layer_activation_values(shape, kernels, recompute, moe_layer, seq_len), tokens, dtype_bytes)


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
                           seq_len: int = 0) -> float:
    """Bytes one stage saves for one microbatch between its forward and its backward: its
    ``layers`` (indices into the model, so MoE and dense layers count as they are), on the first
    stage the token ids the embedding keeps (int64), on the last the final norm (outside every
    block, so kept whatever the recomputation: the book's unfused norm keeps its input, ``x * rsqrt``,
    its output and ``rsqrt``; a fused one its input and ``rsqrt``, and the output head keeps the
    norm's output, its own input). Logits are not here: :func:`logits_bytes`."""
    moe = sum(1 for i in layers if shape.moe and i >= shape.dense_layers)
    total = (len(layers) - moe) * layer_activation_bytes(shape, tokens, dtype_bytes, kernels, recompute, False, seq_len)
    if moe:
        total += moe * layer_activation_bytes(shape, tokens, dtype_bytes, kernels, recompute, True, seq_len)
    if first:
        total += tokens * 8
    if last:
        norm = (3 * shape.hidden + 1, 0) if kernels == "book" else (2 * shape.hidden, 1 if shape.norm == "rms" else 2)
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
