"""The book's two models, written so that a pipeline stage is the same module with parts removed.

Introduced in chapter 0 ("Why models outgrow one device") and used by every chapter after it.

Both models follow the layout of the PyTorch pipelining tutorial and of torchtitan:

    tok_embeddings -> layers["0"], layers["1"], ... -> norm -> output

with the layers in an ``nn.ModuleDict`` (so deleting layer "3" keeps the name "layers.4" of the
next one, and a stage's checkpoint keys line up with the full model's). ``forward`` skips any
part that has been set to ``None``: the first stage keeps the embedding, the last keeps the
norm and the output head, the stages in between keep only their layers.

* :class:`GPT` is the tutorial's GPT-style decoder (learned positions, LayerNorm, GELU MLP).
* :class:`Llama` is a Llama-style decoder (RMSNorm, rotary embeddings, grouped-query
  attention, SwiGLU), the model of the training-loop chapter.

Neither has dropout, so a pipelined run and a one-process run compute the same numbers.
Weights come from :func:`init_weights`, which seeds every parameter from the model seed and the
parameter's *name*: a stage built alone, or on the meta device and materialised later, gets
exactly the weights that the full model built from the same seed has.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 256
    dim: int = 64
    n_layers: int = 4
    n_heads: int = 4
    max_seq_len: int = 128
    mlp_ratio: int = 4


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int = 256
    dim: int = 64
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2  # grouped-query attention: n_heads // n_kv_heads queries share a K/V head
    ffn_hidden_dim: int = 176  # SwiGLU width; Llama uses about 8/3 * dim, rounded up
    max_seq_len: int = 128
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5


def _check_heads(dim: int, n_heads: int, n_kv_heads: int) -> None:
    if dim % n_heads:
        raise ValueError(f"dim={dim} must be divisible by n_heads={n_heads}; pick dim as a multiple of n_heads")
    if n_heads % n_kv_heads:
        raise ValueError(
            f"n_heads={n_heads} must be divisible by n_kv_heads={n_kv_heads} for grouped-query attention"
        )


# ---------------------------------------------------------------------------------------------
# GPT-style model (the PyTorch pipelining tutorial's Transformer, causal and without dropout)
# ---------------------------------------------------------------------------------------------
class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, n_heads: int):
        super().__init__()
        _check_heads(dim, n_heads, n_heads)
        self.n_heads = n_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=-1)  # each (B, T, C)
        q, k, v = (t.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2) for t in (q, k, v))  # (B, H, T, hd)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, hd)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))  # (B, T, C)


class GPTBlock(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.dim)
        self.attn = CausalSelfAttention(cfg.dim, cfg.n_heads)
        self.ln_2 = nn.LayerNorm(cfg.dim)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.dim, cfg.mlp_ratio * cfg.dim), nn.GELU(), nn.Linear(cfg.mlp_ratio * cfg.dim, cfg.dim)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPTEmbedding(nn.Module):
    """Token plus learned position embedding: the first stage's input is token ids (B, T)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.pos = nn.Embedding(cfg.max_seq_len, cfg.dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        T = tokens.shape[1]
        if T > self.pos.num_embeddings:
            raise ValueError(f"sequence length {T} exceeds max_seq_len={self.pos.num_embeddings}")
        positions = torch.arange(T, device=tokens.device)
        return self.tok(tokens) + self.pos(positions)  # (B, T, C)


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings: nn.Module | None = GPTEmbedding(cfg)
        self.layers = nn.ModuleDict(
            {str(i): GPTBlock(cfg) for i in range(cfg.n_layers)}
        )
        self.norm: nn.Module | None = nn.LayerNorm(cfg.dim)
        self.output: nn.Module | None = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        # (B, T) ids -> (B, T, C)
        h = self.tok_embeddings(h) if self.tok_embeddings is not None else h
        for layer in self.layers.values():
            h = layer(h)  # (B, T, C)
        h = self.norm(h) if self.norm is not None else h
        # (B, T, vocab) on the last stage
        return self.output(h) if self.output is not None else h


# ---------------------------------------------------------------------------------------------
# Llama-style model
# ---------------------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(head_dim: int, max_seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of rotary position embeddings, each (max_seq_len, head_dim // 2)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), inv_freq)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[..., 2i], x[..., 2i+1]) of x (B, H, T, hd) by position-dependent angles."""
    x1, x2 = x[..., 0::2], x[..., 1::2]  # (B, H, T, hd/2) each
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)  # (T, hd/2), broadcast over B and H
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        _check_heads(cfg.dim, cfg.n_heads, cfg.n_kv_heads)
        self.n_heads, self.n_kv_heads = cfg.n_heads, cfg.n_kv_heads
        self.head_dim = cfg.dim // cfg.n_heads
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * self.head_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """``mask`` (B, 1, T, T), True where a query may attend (chapter 6: packed documents);
        ``None`` is plain causal attention."""
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, hd)
        k = self.wk(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, hd)
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, hd)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        groups = self.n_heads // self.n_kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)  # (B, H, T, hd)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)  # (B, H, T, hd)
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))  # (B, T, C)


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)  # gate
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)  # up
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class LlamaBlock(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = LlamaAttention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = SwiGLU(cfg.dim, cfg.ffn_hidden_dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin, mask)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings: nn.Module | None = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleDict({str(i): LlamaBlock(cfg) for i in range(cfg.n_layers)})
        self.norm: nn.Module | None = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output: nn.Module | None = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        # Every stage needs the rotary tables, so they are buffers of the model itself; not
        # persistent, because they are a function of the config and do not belong in checkpoints.
        cos, sin = rope_tables(cfg.dim // cfg.n_heads, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(h) if self.tok_embeddings is not None else h  # (B, T) ids -> (B, T, C)
        T = h.shape[1]
        if T > self.cfg.max_seq_len:
            raise ValueError(f"sequence length {T} exceeds max_seq_len={self.cfg.max_seq_len}")
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]  # (T, hd/2)
        for layer in self.layers.values():
            h = layer(h, cos, sin)  # (B, T, C)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h  # (B, T, vocab) on the last stage


# ---------------------------------------------------------------------------------------------
# Deterministic initialisation, keyed by parameter name
# ---------------------------------------------------------------------------------------------
def _param_seed(seed: int, name: str) -> int:
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63)


@torch.no_grad()
def init_weights(model: nn.Module, seed: int, std: float = 0.02) -> nn.Module:
    """Initialise every parameter from ``(seed, parameter name)`` alone.

    The usual ``torch.manual_seed(seed); Model()`` ties a parameter's values to the order in
    which *all* parameters were created, so a stage that creates only its own layers gets
    different numbers. Keying on the name removes that dependence: the full model, any stage
    cut from it, and a stage materialised from the meta device all agree.
    """
    # The full model's depth, from its config: a stage has fewer layers but must scale the same way.
    n_layers = model.cfg.n_layers
    for name, param in model.named_parameters():
        gen = torch.Generator().manual_seed(_param_seed(seed, name))
        leaf = name.rsplit(".", 1)[-1]
        if param.ndim == 1:  # norm scales start at one, biases at zero
            values = torch.ones(param.shape) if leaf == "weight" else torch.zeros(param.shape)
        else:
            # GPT-2's scaled init for projections that write into the residual stream
            scale = 1 / math.sqrt(2 * n_layers) if name.endswith(("proj.weight", "wo.weight", "w2.weight", "mlp.2.weight")) else 1.0
            values = torch.randn(param.shape, generator=gen) * (std * scale)
        param.copy_(values.to(param.dtype))
    return model


def build_model(cfg: GPTConfig | LlamaConfig, seed: int = 0, dtype: torch.dtype = torch.float32) -> nn.Module:
    """The full model, deterministic from ``seed``, on the CPU."""
    model = GPT(cfg) if isinstance(cfg, GPTConfig) else Llama(cfg)
    return init_weights(model, seed).to(dtype)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
