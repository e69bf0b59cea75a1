"""How much memory training a model takes, and how many devices that state alone needs.

Introduced in chapter 0 ("Why models outgrow one device").

Mixed-precision training with Adam keeps, per parameter (Rajbhandari et al., ZeRO, 2020):
2 bytes of bf16/fp16 weights, 2 bytes of gradients, and 12 bytes of fp32 optimizer state
(a master copy of the weight plus Adam's two moments): 16 bytes in all. Plain fp32 training
also comes to 16 bytes (4 + 4 + 8). Activations come on top and grow with batch and sequence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ppbook.models import Llama, LlamaConfig, count_parameters

GB = 1e9  # vendors quote device memory in decimal gigabytes ("80 GB")

# Published architectures (from the models' config.json files), at full size.
LLAMA_SIZES: dict[str, LlamaConfig] = {
    "Llama-2-7B": LlamaConfig(vocab_size=32000, dim=4096, n_layers=32, n_heads=32, n_kv_heads=32, ffn_hidden_dim=11008),
    "Llama-3.1-8B": LlamaConfig(vocab_size=128256, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_hidden_dim=14336),
    "Llama-2-13B": LlamaConfig(vocab_size=32000, dim=5120, n_layers=40, n_heads=40, n_kv_heads=40, ffn_hidden_dim=13824),
    "Llama-3.1-70B": LlamaConfig(vocab_size=128256, dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_hidden_dim=28672),
    "Llama-3.1-405B": LlamaConfig(vocab_size=128256, dim=16384, n_layers=126, n_heads=128, n_kv_heads=8, ffn_hidden_dim=53248),
}

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


# fp32 with AdamW: weights, gradients, two moments (4 + 4 + 8). bf16 with fp32 master weights and
# AdamW moments (ZeRO's "mixed precision" accounting, Rajbhandari et al. 2020): 2 + 2 + (4 + 4 + 4).
PRECISIONS: dict[str, Precision] = {
    "fp32": Precision("fp32", 4, 4, 8, 4),
    "bf16": Precision("bf16", 2, 2, 12, 2),
}


def layer_parameters(cfg: LlamaConfig) -> int:
    """Parameters of one :class:`~ppbook.models.LlamaBlock`: two RMSNorm scales, the four attention
    projections (K and V at ``n_kv_heads`` heads) and SwiGLU's three matrices."""
    head_dim = cfg.dim // cfg.n_heads
    attention = 2 * cfg.dim * cfg.dim + 2 * cfg.dim * cfg.n_kv_heads * head_dim
    return 2 * cfg.dim + attention + 3 * cfg.dim * cfg.ffn_hidden_dim


def stage_parameters(cfg: LlamaConfig, layers: int, first: bool, last: bool) -> int:
    """Parameters of a stage with ``layers`` blocks; the first stage also holds the embedding
    (vocab x dim), the last the final norm and the output head (vocab x dim, untied)."""
    embedding = cfg.vocab_size * cfg.dim if first else 0
    head = cfg.dim + cfg.vocab_size * cfg.dim if last else 0
    return layers * layer_parameters(cfg) + embedding + head


def stage_state(cfg: LlamaConfig, layers: int, first: bool, last: bool, precision: str = "bf16",
                shards: int = 1) -> TrainingMemory:
    """Weights, gradients and optimizer state of one stage, in bytes. ``shards`` > 1 divides all
    three over a ZeRO-3 / FSDP group of that size (what each GPU keeps between collectives)."""
    pr = PRECISIONS[precision]
    n = stage_parameters(cfg, layers, first, last)
    tm = training_memory(n, pr.weight_bytes, pr.grad_bytes, pr.optimizer_bytes)
    return TrainingMemory(n, tm.weights / shards, tm.gradients / shards, tm.optimizer / shards)


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
    views of the model's buffers, the same memory for every microbatch.
    """
    n = microbatch_size * seq_len
    values = 11 * n * cfg.dim + 4 * n * cfg.ffn_hidden_dim + 2 * n
    return values * dtype_bytes + microbatch_size * cfg.n_heads * seq_len * max(4, dtype_bytes)


def stage_activation_bytes(cfg: LlamaConfig, microbatch_size: int, seq_len: int, layers: int, first: bool,
                           last: bool, dtype_bytes: int = 2, recompute: bool = False) -> int:
    """Bytes one stage saves for one microbatch between its forward and its backward: its blocks
    (see :func:`block_activation_bytes`), on the first stage the token ids the embedding keeps
    (int64), on the last the final RMSNorm (its input, x * rsqrt, its output, rsqrt).

    With ``recompute`` (activation checkpointing of whole blocks) each block keeps only its input;
    the backward recomputes one block at a time, see :func:`recompute_transient_bytes`. Logits and
    the loss are not here: :func:`logits_bytes`.
    """
    n = microbatch_size * seq_len
    per_block = n * cfg.dim * dtype_bytes if recompute else block_activation_bytes(cfg, microbatch_size, seq_len, dtype_bytes)
    ids = n * 8 if first else 0
    norm = (3 * n * cfg.dim + n) * dtype_bytes if last else 0
    return layers * per_block + ids + norm


def recompute_transient_bytes(cfg: LlamaConfig, microbatch_size: int, seq_len: int, dtype_bytes: int = 2) -> int:
    """Extra bytes at the peak of a backward with whole-block recomputation: one block's saved
    activations, rebuilt by its second forward and freed by its backward."""
    return block_activation_bytes(cfg, microbatch_size, seq_len, dtype_bytes) - microbatch_size * seq_len * cfg.dim * dtype_bytes


def logits_bytes(cfg: LlamaConfig, microbatch_size: int, seq_len: int, dtype_bytes: int = 2,
                 loss_dtype_bytes: int | None = None) -> int:
    """The last stage's output buffers per microbatch held until its backward: the logits
    (b x s x vocab, kept by the schedule as the stage's output) and the log-probabilities that
    cross-entropy saves (at ``loss_dtype_bytes``: the logits' dtype by default, 4 when the loss is
    computed in float32 as large-vocabulary recipes do)."""
    values = microbatch_size * seq_len * cfg.vocab_size
    return values * (dtype_bytes + (dtype_bytes if loss_dtype_bytes is None else loss_dtype_bytes))


def peak_microbatches(schedule: str, p: int, m: int, v: int = 2) -> dict[int, int]:
    """Per stage, the most microbatches whose activations it holds at once under torch's
    ``Schedule<schedule>`` (from :func:`ppbook.simulate.torch_order`; a microbatch counts from its
    forward until the full backward, or the weight-gradient pass, that frees it)."""
    from ppbook import simulate

    return simulate.peak_in_flight(simulate.torch_order(schedule, p, m, v))


@dataclass(frozen=True)
class StageMemory:
    stage: int
    layers: int
    state: TrainingMemory     # weights, gradients, optimizer state (bytes)
    activations: float        # saved activations at the peak (bytes)
    logits: float             # last stage only: logits and log-probabilities held (bytes)

    @property
    def total(self) -> float:
        return self.state.total + self.activations + self.logits


def stage_memory(cfg: LlamaConfig, num_stages: int, peak: dict[int, int], microbatch_size: int, seq_len: int,
                 precision: str = "bf16", recompute: bool = False, shards: int = 1,
                 loss_dtype_bytes: int | None = 4) -> list[StageMemory]:
    """Memory of every stage at its peak: state, plus ``peak[stage]`` microbatches' activations
    (from :func:`peak_microbatches`), plus, on the last stage, the logits of the microbatches it
    holds (the schedule keeps each microbatch's output until its backward)."""
    from ppbook.stages import assign_layers

    dt = PRECISIONS[precision].activation_bytes
    out = []
    for s, owned in enumerate(assign_layers(cfg.n_layers, num_stages)):
        first, last = s == 0, s == num_stages - 1
        per_mb = stage_activation_bytes(cfg, microbatch_size, seq_len, len(owned), first, last, dt, recompute)
        act = peak[s] * per_mb + (recompute_transient_bytes(cfg, microbatch_size, seq_len, dt) if recompute else 0)
        held_logits = peak[s] * logits_bytes(cfg, microbatch_size, seq_len, dt, loss_dtype_bytes) if last else 0
        out.append(StageMemory(s, len(owned), stage_state(cfg, len(owned), first, last, precision, shards),
                               act, held_logits))
    return out


def block_residual_bytes(cfg: LlamaConfig, microbatch_size: int, seq_len: int, dtype_bytes: int = 2) -> int:
    """Bytes of one block that torch 2.13 keeps after a microbatch's weight-gradient pass ``W``,
    until ``step`` returns, in the schedules that split the backward (I then W): the input
    gradient runs with ``retain_graph=True`` and the weight pass frees only what lies on a
    weight's path, so what only the input gradient needed stays: SDPA's q, k, v, output and
    log-sum-exp, and each RMSNorm's input and rsqrt (6 N h + 2 N values)."""
    n = microbatch_size * seq_len
    return (6 * n * cfg.dim + 2 * n) * dtype_bytes + microbatch_size * cfg.n_heads * seq_len * max(4, dtype_bytes)


def peak_activation_bytes(order, per_microbatch: dict[int, int], residual: dict[int, int] | None = None,
                          by: str = "stage") -> dict[int, int]:
    """Per stage (or rank, ``by="rank"``), the most saved-activation bytes held at once under
    ``order`` (a :func:`ppbook.simulate.torch_order`): a forward adds the stage's
    ``per_microbatch`` bytes, a full backward frees them, a weight pass frees all but
    ``residual[stage]``, which stays until the step ends (see :func:`block_residual_bytes`)."""
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
