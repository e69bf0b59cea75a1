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
