"""Models that are not a plain chain of layers: a long skip connection, and tied embeddings.

Introduced in chapter 8 ("Beyond a chain of layers"); chapter 9 trains :class:`SkipGPT` with
pipeline and data parallelism together.

:class:`SkipGPT` is the GPT of :mod:`ppbook.models` with one change: the embedding's output
skips every block and is added back just before the final norm (a long residual, the kind the
old ``torch.distributed.pipeline.sync`` documentation wrote with ``@skippable``, ``stash`` and
``pop``). A pipeline stage therefore receives and returns *two* tensors, ``(h, skip)``, and the
skip tensor rides through every stage in between. With ``tie_embeddings=True`` the output head
and the token embedding share one weight, as in GPT-2: the first stage holds it as
``tok_embeddings.tok.weight`` and the last stage as ``output.weight``.

:func:`tied_group_ranks`, :func:`sync_tied_grads` keep the two copies of a tied weight equal
across stages by summing their gradients, which is what autograd does in one process.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from ppbook.models import GPTBlock, GPTConfig, GPTEmbedding, init_weights


class SkipGPT(nn.Module):
    """GPT with a skip connection from the embedding to the head, optionally with tied embeddings.

    ``forward`` takes token ids on the first stage and the pair ``(h, skip)`` on the others; it
    returns ``(h, skip)`` unless this module holds the output head, which returns the logits.
    """

    def __init__(self, cfg: GPTConfig, tie_embeddings: bool = False):
        super().__init__()
        self.cfg = cfg
        self.tie_embeddings = tie_embeddings
        self.tok_embeddings: nn.Module | None = GPTEmbedding(cfg)
        self.layers = nn.ModuleDict({str(i): GPTBlock(cfg) for i in range(cfg.n_layers)})
        self.norm: nn.Module | None = nn.LayerNorm(cfg.dim)
        self.output: nn.Module | None = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if tie_embeddings:
            self.output.weight = self.tok_embeddings.tok.weight  # one Parameter, two uses

    def forward(self, h: torch.Tensor, skip: torch.Tensor | None = None):
        if self.tok_embeddings is not None:
            h = self.tok_embeddings(h)  # (B, T) ids -> (B, T, C)
            skip = h  # the long skip starts here ...
        for layer in self.layers.values():
            h = layer(h)  # (B, T, C)
        if self.output is None:
            return h, skip  # two tensors to the next stage: (B, T, C), (B, T, C)
        h = self.norm(h + skip)  # ... and ends here, several stages later
        return self.output(h)  # (B, T, vocab)


def build_skip_model(cfg: GPTConfig, seed: int = 0, tie_embeddings: bool = False,
                     dtype: torch.dtype = torch.float32) -> SkipGPT:
    """The full model, deterministic from ``seed`` (weights keyed by parameter name).

    With tied embeddings ``named_parameters`` lists the shared weight once, under
    ``tok_embeddings.tok.weight``, so both uses start from that name's values.
    """
    return init_weights(SkipGPT(cfg, tie_embeddings), seed).to(dtype)


def tied_group_ranks(num_stages: int) -> list[int]:
    """Pipeline ranks that hold a copy of the tied weight: the first and the last stage."""
    return sorted({0, num_stages - 1})


def tied_parameter(stage_mod: SkipGPT) -> nn.Parameter | None:
    """This stage's copy of the tied weight (the embedding on the first stage, the head on the last)."""
    if not stage_mod.tie_embeddings:
        return None
    if stage_mod.tok_embeddings is not None:
        return stage_mod.tok_embeddings.tok.weight
    return stage_mod.output.weight if stage_mod.output is not None else None


def sync_tied_grads(stage_mod: SkipGPT, group: dist.ProcessGroup | None) -> None:
    """Sum the tied weight's gradient over the first
    and last stage, after backward, before the step.

    In one process the shared weight's gradient is the sum of its two uses. Split across
    two stages, each copy sees one use; summing makes both copies' gradients that full
    gradient, so the same optimizer step keeps them equal. ``group`` holds exactly the
    ranks of :func:`tied_group_ranks` (``None`` on ranks outside it, which do nothing).
    With one stage the weight is one Parameter already and there is nothing to do.
    """
    param = tied_parameter(stage_mod)
    if param is None or group is None or dist.get_world_size(group) == 1:
        return
    if param.grad is None:
        param.grad = torch.zeros_like(param)
    # comm: embedding grad + head grad
    dist.all_reduce(param.grad, op=dist.ReduceOp.SUM, group=group)
