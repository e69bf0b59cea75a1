"""How much memory training the book's models takes, and how many devices that state alone needs.

Introduced in chapter 0 ("Why models outgrow one device"); "Choosing a pipeline" and the
schedules chapter use the rest; chapter 11 ("On real GPUs") sets :func:`predict_peak`, the peak of a
whole training step, beside what the allocator measured.

Mixed-precision training with Adam keeps, per parameter (Rajbhandari et al., ZeRO, 2020):
2 bytes of bf16/fp16 weights, 2 bytes of gradients, and 12 bytes of fp32 optimizer state
(a master copy of the weight plus Adam's two moments): 16 bytes in all. Plain fp32 training
also comes to 16 bytes (4 + 4 + 8). Activations come on top and grow with batch and sequence.

The formulas live in the torch-free planner (:mod:`ppbook.planner.memory`, bytes from a model's
shape), which the planner's command line, its page on the site and these chapters all use; this
module takes the book's own :class:`~ppbook.models.LlamaConfig` and adds what needs torch: exact
parameter counts of models built on the meta device, which the tests compare with the planner's,
and the predicted peak of a companion script's training step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ppbook.models import LlamaConfig
from ppbook.planner import memory as pm
from ppbook.planner import shapes

GB = pm.GB  # vendors quote device memory in decimal gigabytes ("80 GB")

# Published architectures (from the models' config.json files), at full size: the planner's
# presets as the book's LlamaConfig, to build them (on the meta device) and count.
_NAMES = {"Llama-2-7B": "llama2-7b", "Llama-3.1-8B": "llama3-8b", "Llama-2-13B": "llama2-13b",
          "Llama-3.1-70B": "llama3-70b", "Llama-3.1-405B": "llama3-405b"}


def llama_config(shape: shapes.ModelShape) -> LlamaConfig:
    return LlamaConfig(vocab_size=shape.vocab, dim=shape.hidden, n_layers=shape.layers, n_heads=shape.heads,
                       n_kv_heads=shape.kv_heads, ffn_hidden_dim=shape.ffn)


def shape_of(cfg: LlamaConfig, name: str = "book Llama") -> shapes.ModelShape:
    """The planner's description of the book's Llama at ``cfg`` (SwiGLU, RMSNorm, untied)."""
    return shapes.ModelShape(name, cfg.vocab_size, cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads,
                             cfg.ffn_hidden_dim)


LLAMA_SIZES: dict[str, LlamaConfig] = {name: llama_config(shapes.PRESETS[key]) for name, key in _NAMES.items()}

# Memory of one device, in GB, as sold.
DEVICES: dict[str, float] = {"A100 40GB": 40, "A100/H100 80GB": 80, "H200 141GB": 141}


@dataclass(frozen=True)
class TrainingMemory:
    params: int
    weights: float  # bytes
    gradients: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer


def training_memory(params: int, weight_bytes: int = 2, grad_bytes: int = 2, optimizer_bytes: int = 12) -> TrainingMemory:
    """Bytes of weights, gradients and optimizer state (defaults: bf16 mixed precision with AdamW)."""
    if params < 0:
        raise ValueError(f"params must be non-negative, got {params}")
    return TrainingMemory(params, params * weight_bytes, params * grad_bytes, params * optimizer_bytes)


def devices_needed(total_bytes: float, device_gb: float) -> int:
    """The fewest devices whose memory adds up to ``total_bytes`` (a lower bound: no activations)."""
    if device_gb <= 0:
        raise ValueError(f"device_gb must be positive, got {device_gb}")
    return max(1, math.ceil(total_bytes / (device_gb * GB)))


def llama_parameters(cfg: LlamaConfig) -> int:
    """Exact parameter count of the book's Llama model at ``cfg``, built on the meta device (no memory)."""
    import torch

    from ppbook.models import Llama, count_parameters

    with torch.device("meta"):
        return count_parameters(Llama(cfg))


# ---------------------------------------------------------------------------------------------
# Memory in bytes, per pipeline stage (introduced in "Choosing a pipeline")
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Precision:
    """Bytes per parameter of weights, gradients and optimizer state, and per activation value."""
    name: str
    weight_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    activation_bytes: int


# ZeRO's accounting (the planner's recipes "bf16-grads" and "fp32"): bf16 with fp32 master
# weights and AdamW moments, 2 + 2 + (4 + 4 + 4); fp32 with AdamW, 4 + 4 + 8.
PRECISIONS: dict[str, Precision] = {
    name: Precision(name, r.weight_bytes, r.grad_bytes, r.optimizer_bytes, r.activation_bytes)
    for name, r in (("fp32", pm.RECIPES["fp32"]), ("bf16", pm.RECIPES["bf16-grads"]))}
_RECIPE = {"fp32": "fp32", "bf16": "bf16-grads"}


def layer_parameters(cfg: LlamaConfig) -> int:
    """Parameters of one :class:`~ppbook.models.LlamaBlock`: two RMSNorm scales, the four attention
    projections (K and V at ``n_kv_heads`` heads) and SwiGLU's three matrices."""
    return shapes.layer_parameters(shape_of(cfg))


def stage_parameters(cfg: LlamaConfig, layers: int, first: bool, last: bool) -> int:
    """Parameters of a stage with ``layers`` blocks; the first stage also holds the embedding
    (vocab x dim), the last the final norm and the output head (vocab x dim, untied)."""
    return pm.stage_parameters(shape_of(cfg), list(range(layers)), first, last)


def stage_state(cfg: LlamaConfig, layers: int, first: bool, last: bool, precision: str = "bf16",
                sharding: str = "none", dp: int = 1, pipelined: bool = True) -> TrainingMemory:
    """Weights, gradients and optimizer state of one stage on one GPU, in bytes, under
    ``sharding`` over ``dp`` data-parallel ranks as it runs (:func:`ppbook.planner.memory.state_bytes`):
    for ``fsdp`` inside a pipeline (``pipelined``) the peak, with the whole stage gathered and
    its gradients unsharded by the step's last backward; between steps only the shards remain
    (:func:`stage_state_between_steps`)."""
    n = stage_parameters(cfg, layers, first, last)
    gathered = unsharded = 0.0
    if sharding == "fsdp":
        block = layer_parameters(cfg)
        gathered, unsharded = pm.fsdp_gathered(block, n - layers * block, layers, pipelined)
    s = pm.state_bytes(n, pm.RECIPES[_RECIPE[precision]], sharding, dp, gathered, unsharded)
    return TrainingMemory(n, s.parameters, s.gradients, s.optimizer)


def stage_state_between_steps(cfg: LlamaConfig, layers: int, first: bool, last: bool, precision: str = "bf16",
                              dp: int = 1) -> TrainingMemory:
    """Under FSDP, what one GPU keeps between steps: its shard of everything (``/ dp``)."""
    n = stage_parameters(cfg, layers, first, last)
    s = pm.state_bytes(n, pm.RECIPES[_RECIPE[precision]], "fsdp", dp)
    return TrainingMemory(n, s.parameters, s.gradients, s.optimizer)


def block_activation_bytes(cfg: LlamaConfig, microbatch_size: int, seq_len: int, dtype_bytes: int = 2) -> int:
    """Bytes autograd saves in one :class:`~ppbook.models.LlamaBlock`'s forward for one microbatch,
    the block's input included, counted tensor by tensor from what the block as written saves
    (N = b x s tokens, h = dim, f = SwiGLU width, H heads)::

        11 N h   block input, x * rsqrt and the normed x of each RMSNorm (2 x 3), SDPA's q, k, v
                 and output (k and v after repeat_interleave: H heads, not n_kv_heads), the input
                 of wo
        4 N f    SwiGLU: w1's output, silu's output, w3's output, the product (w2's input)
        2 N      the two RMSNorms' rsqrt (N x 1)
        b H s    SDPA's log-sum-exp, in float32 for 16-bit inputs (else the input's dtype)

    SDPA keeps no s x s matrix. The rotary tables are not counted: at the model's dtype they are
    views of the model's buffers, the same memory for every microbatch. (The planner's "book"
    accounting, :func:`ppbook.planner.memory.layer_activation_values`.)
    """
    return int(pm.layer_activation_bytes(shape_of(cfg), microbatch_size * seq_len, dtype_bytes, "book"))


def stage_activation_bytes(cfg: LlamaConfig, microbatch_size: int, seq_len: int, layers: int, first: bool,
                           last: bool, dtype_bytes: int = 2, recompute: bool = False) -> int:
    """Bytes one stage saves for one microbatch between its forward and its backward: its blocks
    (see :func:`block_activation_bytes`), on the first stage the token ids the embedding keeps
    (int64), on the last the final RMSNorm (its input, x * rsqrt, its output, rsqrt).

    With ``recompute`` (activation checkpointing of whole blocks) each block keeps only its input;
    the backward recomputes one block at a time, see :func:`recompute_transient_bytes`. Logits and
    the loss are not here: :func:`logits_bytes`.
    """
    return int(pm.stage_activation_bytes(shape_of(cfg), list(range(layers)), microbatch_size * seq_len, first, last,
                                         dtype_bytes, "book", "full" if recompute else "none"))


def recompute_transient_bytes(cfg: LlamaConfig, microbatch_size: int, seq_len: int, dtype_bytes: int = 2) -> int:
    """Extra bytes at the peak of a backward with whole-block recomputation: one block's saved
    activations, rebuilt by its second forward and freed by its backward."""
    return int(pm.recompute_transient_bytes(shape_of(cfg), microbatch_size * seq_len, dtype_bytes, "book", "full"))


def logits_bytes(cfg: LlamaConfig, microbatch_size: int, seq_len: int, dtype_bytes: int = 2,
                 loss_dtype_bytes: int | None = None) -> int:
    """The last stage's output buffers per microbatch held until its backward: the logits
    (b x s x vocab, kept by the schedule as the stage's output) and the log-probabilities that
    cross-entropy saves (at ``loss_dtype_bytes``: the logits' dtype by default, 4 when the loss is
    computed in float32 as large-vocabulary recipes do)."""
    loss = dtype_bytes if loss_dtype_bytes is None else loss_dtype_bytes
    return int(pm.logits_bytes(shape_of(cfg), microbatch_size * seq_len, dtype_bytes, loss))


def peak_microbatches(schedule: str, p: int, m: int, v: int = 2) -> dict[int, int]:
    """Per stage, the most microbatches whose activations it holds at once under torch's
    ``Schedule<schedule>`` (a microbatch counts from its forward until the full backward, or the
    weight-gradient pass, that frees it)."""
    from ppbook.planner import schedules
    from ppbook.planner.simulate import peak_in_flight

    return peak_in_flight(schedules.order(schedule, p, m, v))


def block_residual_bytes(cfg: LlamaConfig, microbatch_size: int, seq_len: int, dtype_bytes: int = 2) -> int:
    """Bytes of one block that torch 2.13 keeps after a microbatch's weight-gradient pass until
    ``step`` returns, in the schedules that split the backward
    (:func:`ppbook.planner.memory.block_residual_values`)."""
    return int(pm.values_bytes(pm.block_residual_values(shape_of(cfg)), microbatch_size * seq_len, dtype_bytes))


def peak_activation_bytes(order, per_microbatch: dict[int, int], residual: dict[int, int] | None = None,
                          by: str = "stage") -> dict[int, int]:
    """Per stage (or rank, ``by="rank"``), the most saved-activation bytes held at once under
    ``order``: a forward adds the stage's ``per_microbatch`` bytes, a full backward frees them, a
    weight pass frees all but ``residual[stage]``, which stays until the step ends (see
    :func:`block_residual_bytes`)."""
    residual = residual or {}
    held: dict[int, int] = {}
    peak: dict[int, int] = {}
    for rank, acts in order.items():
        for a in acts:
            key = a.stage if by == "stage" else rank
            full = per_microbatch[a.stage]
            delta = {"F": full, "B": -full, "W": residual.get(a.stage, 0) - full}.get(a.kind, 0)
            held[key] = held.get(key, 0) + delta
            peak[key] = max(peak.get(key, 0), held[key])
    return dict(sorted(peak.items()))


# ---------------------------------------------------------------------------------------------
# The peak of a training step, against the allocator (chapter 11, "On real GPUs")
# ---------------------------------------------------------------------------------------------
WEIGHT_CASTS = pm.WEIGHT_CASTS


def predict_peak(cfg: LlamaConfig, schedule: str, m: int, microbatch_size: int, seq_len: int,
                 weight_casts: str = "per-step", device: str = "cuda", optimizer: str | None = None) -> pm.Peak:
    """The peak ``torch.cuda.max_memory_allocated`` of ``scripts/06_train.py`` training the book's
    Llama at ``cfg`` at one stage (``schedule`` ``GPipe`` or ``1F1B``; ``none``: a plain loop over the
    ``m`` microbatches), with ``m`` microbatches of ``microbatch_size`` sequences of ``seq_len``
    tokens, in bf16 with float32 masters and AdamW, from its second step on.

    ``weight_casts`` says how the passes get bf16 weights (:data:`WEIGHT_CASTS`,
    :func:`ppbook.planner.memory.weight_copy_bytes`): ``autocast``, float32 weights under one
    autocast region per step, is how the first GPU record's runs trained (H200, 2026-11-28,
    ``data/gpu/h200-2026-11-28/mem.json``); ``master``, the matrix products' weights as bf16
    compute copies beside float32 masters under that region (:class:`ppbook.precision.MasterWeights`),
    is how ``06_train.py`` trains since; ``per-step``, bf16 compute copies made once per step,
    is what the planner's default recipe counts. ``device="cpu"`` counts what the CPU allocates (no
    allocator rounding, no cuBLAS workspace, AdamW a tensor at a time), which the tests measure.

    Returns a :class:`~ppbook.planner.memory.Peak`: ``total`` bytes, ``parts`` (name to bytes,
    adding up to the total) and the ``moment`` of the step where the peak falls. The walk and every
    part are :func:`ppbook.planner.memory.training_peak`'s."""
    return pm.training_peak(shape_of(cfg), schedule, m, microbatch_size, seq_len, weight_casts, device, optimizer)


def predict_train_peak(argv: list[str], weight_casts: str = "master", device: str = "cuda") -> pm.Peak:
    """:func:`predict_peak` for ``scripts/06_train.py`` run at one stage with the command-line
    arguments ``argv`` (its model, batch, microbatches and schedule, read by the script's own
    ``parse_args`` and ``llama_config``), as the GPU record's ``mem.json`` lists its runs. The
    default ``weight_casts`` is how the script trains now; the first GPU record's runs (before
    :class:`ppbook.precision.MasterWeights`) are ``autocast``."""
    from ppbook import launch

    script = launch.load_script("06_train.py")
    args = script.parse_args(argv)
    schedule = {"gpipe": "GPipe", "1f1b": "1F1B"}.get(args.schedule, args.schedule)
    return predict_peak(script.llama_config(args), schedule, args.microbatches, args.batch_size // args.microbatches,
                        args.seq_len, weight_casts, device)
