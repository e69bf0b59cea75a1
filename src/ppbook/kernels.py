"""The book's Llama block with fused kernels: what it saves for its backward is what the planner's
``fused`` accounting counts.

Introduced in chapter 12 ("Compile and activation checkpointing in a pipeline"), which measures it
beside the book's own block; ``tests/test_planner_memory.py`` checks both against
:func:`ppbook.planner.memory.layer_activation_values`.

The book's :class:`~ppbook.models.LlamaBlock` is written for reading, one operator at a time,
and autograd keeps what each operator's backward needs: the RMSNorm's intermediate products,
the rotary embedding's halves, keys and values repeated to every query head, SwiGLU's SiLU.
Training code runs fused kernels instead (Megatron-LM's and torchtitan's, FlashAttention), and
each keeps only its inputs and a few statistics. :class:`FusedLlamaBlock` is the same block,
with the same parameters, whose forward uses three small autograd functions and attention that
reads grouped keys and values directly (``enable_gqa=True``):

- :class:`RMSNormFunction` keeps its input and one float32 statistic per token (``rstd``);
- :class:`RopeFunction` keeps nothing of its input (its backward rotates the gradient back), and
  rotates in the ``(B, T, H, hd)`` layout, so attention's output comes out in the layout the
  output projection reads without a copy;
- :class:`SwiGLUFunction` keeps the gate and up projections' outputs, and recomputes SiLU.

They compute the same function as the book's block (to float rounding); they are plain PyTorch,
not faster kernels: what they change is what autograd keeps.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ppbook.models import LlamaBlock


class RMSNormFunction(torch.autograd.Function):
    """y = x * rstd * w with rstd = 1 / sqrt(mean(x^2) + eps); keeps x and rstd (in float32, or
    float64 for a float64 x)."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        wide = x.to(torch.promote_types(x.dtype, torch.float32))  # bfloat16 -> float32
        rstd = torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)  # (..., 1), float32 at least
        ctx.save_for_backward(x, weight, rstd)
        return (x * rstd).to(x.dtype) * weight

    @staticmethod
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        xhat = (x * rstd).to(x.dtype)
        grad_w = (grad * xhat).sum(dim=tuple(range(grad.dim() - 1)))
        g = grad * weight
        grad_x = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
        return grad_x.to(x.dtype), grad_w, None


class RopeFunction(torch.autograd.Function):
    """Rotary embedding of x (..., T, H, hd) by cos and sin (T, 1, hd/2); keeps only cos and sin."""

    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        g1, g2 = grad[..., 0::2], grad[..., 1::2]
        return torch.stack((g1 * cos + g2 * sin, g2 * cos - g1 * sin), dim=-1).flatten(-2), None, None


class SwiGLUFunction(torch.autograd.Function):
    """silu(gate) * up; keeps gate and up, recomputes the SiLU in backward."""

    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, grad):
        gate, up = ctx.saved_tensors
        sig = torch.sigmoid(gate)
        return grad * up * sig * (1 + gate * (1 - sig)), grad * gate * sig


class FusedLlamaBlock(LlamaBlock):
    """:class:`~ppbook.models.LlamaBlock` with the same parameters and names, computing the same
    function, with fused norms, rotary embedding and SwiGLU, and grouped-query attention without
    repeated keys and values."""

    def forward(self, x, cos, sin, mask=None):
        a, f = self.attention, self.feed_forward
        B, T, _ = x.shape
        c, s = cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype)  # (T, 1, hd/2)
        h = RMSNormFunction.apply(x, self.attention_norm.weight, self.attention_norm.eps)
        # rotate in (B, T, H, hd), then view as (B, H, T, hd): attention's output keeps that layout
        q = RopeFunction.apply(a.wq(h).view(B, T, a.n_heads, a.head_dim), c, s).transpose(1, 2)
        k = RopeFunction.apply(a.wk(h).view(B, T, a.n_kv_heads, a.head_dim), c, s).transpose(1, 2)
        v = a.wv(h).view(B, T, a.n_kv_heads, a.head_dim).transpose(1, 2)  # (B, Hkv, T, hd)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                           enable_gqa=True)  # (B, H, T, hd), stored as (B, T, H, hd)
        x = x + a.wo(y.transpose(1, 2).reshape(B, T, -1))  # a view: no copy
        h = RMSNormFunction.apply(x, self.ffn_norm.weight, self.ffn_norm.eps)
        return x + f.w2(SwiGLUFunction.apply(f.w1(h), f.w3(h)))


def fuse(model: torch.nn.Module) -> torch.nn.Module:
    """Turn every ``LlamaBlock`` of ``model`` into a :class:`FusedLlamaBlock`, in place (same
    parameters, same names)."""
    for block in model.modules():
        if type(block) is LlamaBlock:
            block.__class__ = FusedLlamaBlock
    return model
