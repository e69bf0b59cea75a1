"""The toy workload of the companion scripts, and the one-process run every pipeline is checked against.

Introduced in chapter 1 ("Your first pipeline"): a small GPT built from ``--seed`` identically on
every rank, random token batches that are the same on every rank, the loss, the one-process
reference, and the comparison of a stage's gradients and weights with it.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

from ppbook import precision
from ppbook.models import GPTConfig, build_model

def gpt_config(args: argparse.Namespace) -> GPTConfig:
    return GPTConfig(vocab_size=args.vocab, dim=args.dim, n_layers=args.layers, n_heads=args.heads,
                     max_seq_len=args.seq_len)


def full_model(args: argparse.Namespace, device: torch.device) -> nn.Module:
    """The whole model, identical on every rank: built from ``--seed``."""
    return build_model(gpt_config(args), seed=args.seed, dtype=precision.param_dtype(args.dtype)).to(device)


def make_batch(args: argparse.Namespace, step: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids and next-token targets, the same on every rank for a given step."""
    g = torch.Generator().manual_seed(args.seed * 10_000 + step)
    seq = torch.randint(0, args.vocab, (args.batch_size, args.seq_len + 1), generator=g)
    # contiguous: torch 2.11 checks a stage input's strides, and a slice of seq has the strides of seq
    return seq[:, :-1].contiguous().to(device), seq[:, 1:].contiguous().to(device)  # tokens (B, T), targets (B, T)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())  # mean over the microbatch's B*T tokens


def mean_loss(mb_losses: list[torch.Tensor]) -> float:
    # equal-sized microbatches: the mean of their mean losses is the full batch's mean loss
    return torch.stack([loss.detach() for loss in mb_losses]).mean().item()


def reference_backward(
    model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor, m: int
) -> float:
    """The one-process run every pipeline is compared with: the
    same m microbatches, in the same order, each microbatch's
    loss backpropagated as it is, the gradients summed, then
    divided by m: the schedule's own arithmetic
    (PipelineStage.scale_grads), so float results agree to the
    last bit at any m. Returns the batch's mean loss."""
    mb_losses = []
    pairs = zip(tokens.tensor_split(m), targets.tensor_split(m))
    for mb_tokens, mb_targets in pairs:
        loss = loss_fn(model(mb_tokens), mb_targets)
        loss.backward()  # sums into .grad, as the stages' backward does
        mb_losses.append(loss)
    scale_grads(model, m)
    return mean_loss(mb_losses)


def scale_grads(model: nn.Module, m: int) -> None:
    """Divide every gradient by ``m`` once, after all microbatches: what ``PipelineStage.scale_grads``
    does at the end of a step. Scaling each loss by 1/m before its backward instead gives the same
    bits only when m is a power of two (chapter 1)."""
    for p in model.parameters():
        if p.grad is not None:
            p.grad.div_(m)


def adamw_reference_losses(model: nn.Module, args: argparse.Namespace, device: torch.device | str) -> list[float]:
    """The one-process training run: same model, same microbatches, ``args.steps`` AdamW steps at
    ``args.lr``; returns each step's mean loss."""
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    losses = []
    for step in range(args.steps):
        tokens, targets = make_batch(args, step, device)
        opt.zero_grad()
        losses.append(reference_backward(model, tokens, targets, args.microbatches))
        opt.step()
    return losses


def compare(stage_mod: nn.Module, reference: nn.Module) -> dict:
    """Largest difference between this stage's gradients and weights and the same-named reference ones."""
    # remove_duplicate=False: a weight shared by two modules (tied embeddings) is listed under both
    # names, so a stage that holds it as "output.weight" finds it in the full model too
    ref = dict(reference.named_parameters(remove_duplicate=False))
    names = [n for n, _ in stage_mod.named_parameters()]
    params = list(stage_mod.parameters())
    return {
        "params": names,
        "max_grad_diff": max((p.grad - ref[n].grad).abs().max().item() for n, p in zip(names, params)),
        "max_weight_diff": max((p.detach() - ref[n].detach()).abs().max().item() for n, p in zip(names, params)),
    }


