"""Pieces of a training loop that a pipeline changes: the loss and how its gradients are scaled,
gradient clipping by the global norm, the learning-rate schedule, and the loop's state.

Introduced in chapter 6 ("A real training loop"); chapter 7 checkpoints :class:`TrainState`.

Why these need care in a pipeline:

* ``ScheduleGPipe``/``Schedule1F1B`` with ``scale_grads=True`` (the default) divide every
  gradient of the stage by ``m`` once the step's backwards are done. With a loss that is the
  mean over each microbatch this gives the mean over the batch, but only if every microbatch
  has as many counted tokens as every other (padding breaks it), and it also divides any
  gradient left over from an earlier ``step`` (outer accumulation breaks it).
  :class:`TokenMeanLoss` with ``scale_grads=False`` is right in both cases.
* ``clip_grad_norm_`` on a stage sees only that stage's parameters. :func:`clip_grad_norm_global`
  reduces the squared norms over the pipeline group first, so every stage scales its gradients
  by the same factor one process would.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ppbook.data import IGNORE_INDEX


# [start-loss]
class TokenMeanLoss:
    """Cross-entropy summed over a microbatch's tokens, divided by the
    number of counted tokens in the *whole* batch (all microbatches, all
    accumulation steps). Use with ``scale_grads=False``: the microbatch
    losses then add up to the batch's token mean, and so do their gradients,
    whatever the padding. Set :attr:`denominator` before each step."""

    def __init__(self):
        self.denominator = 1

    def set_batch(self, *targets: torch.Tensor) -> int:
        """Count the tokens that will be scored in
        this step's batch (or accumulated batches)."""
        self.denominator = max(1, sum(int((t != IGNORE_INDEX).sum()) for t in targets))
        return self.denominator

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        total = F.cross_entropy(
            logits.flatten(0, 1),
            targets.flatten(),
            ignore_index=IGNORE_INDEX,
            reduction="sum",
        )  # logits (b, T, V), targets (b, T)
        return total / self.denominator
# [end-loss]


def microbatch_mean_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The seed's loss: the mean over the *microbatch's* counted tokens (use with scale_grads=True)."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)


# [start-clip]
def clip_grad_norm_global(
    params: list[torch.Tensor], max_norm: float, group=None
) -> tuple[float, float]:
    """Clip this stage's gradients by the norm of *all* stages' gradients, exactly as
    ``torch.nn.utils.clip_grad_norm_`` does for the whole model in one process.

    Every stage gathers every stage's per-tensor norms (stage order is the model's
    parameter order) and reduces them the way ``clip_grad_norm_`` does, so the global
    norm, and the clipped gradients, are the one-process ones to the last bit. Returns
    (global norm, this stage's norm).
    """
    grads = [p.grad for p in params if p.grad is not None]
    device = params[0].device
    mine = (
        torch.stack([torch.linalg.vector_norm(g) for g in grads])
        if grads
        else torch.zeros(0, device=device)
    )
    norms = mine  # (tensors on this stage,)
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        world = dist.get_world_size(group)
        counts = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(world)]
        # comm: how many
        dist.all_gather(counts, torch.tensor([len(mine)], device=device), group=group)
        longest = int(max(c.item() for c in counts))
        padded = torch.zeros(longest, dtype=mine.dtype, device=device)
        padded[:len(mine)] = mine
        gathered = [torch.empty_like(padded) for _ in range(world)]
        # comm: every stage's per-tensor norms
        dist.all_gather(gathered, padded, group=group)
        # (all tensors,) in model order
        norms = torch.cat([g[:int(c.item())] for g, c in zip(gathered, counts)])
    # what clip_grad_norm_ computes from the same norms
    total = torch.linalg.vector_norm(norms)
    if max_norm > 0 and grads:
        # its clipping coefficient, too
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total.item(), torch.linalg.vector_norm(mine).item()
# [end-clip]


def clip_coefficient(norm: float, max_norm: float) -> float:
    """The factor ``clip_grad_norm_`` multiplies gradients by."""
    return min(1.0, max_norm / (norm + 1e-6))


# [start-lr]
def warmup_cosine(step: int, warmup: int, total: int, min_ratio: float = 0.1) -> float:
    """Learning-rate multiplier: linear from 1/warmup to 1 over ``warmup`` steps, then a cosine
    from 1 down to ``min_ratio`` at step ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
# [end-lr]


@dataclass
class TrainState:
    """What the loop needs besides the model, optimizer and LR scheduler to continue where it
    stopped: the next step, the data iterator's position, and the metrics so far. The loop draws
    no random numbers of its own (no dropout; the data order is a function of the seed and the
    epoch), so there is no RNG state to keep yet. A checkpoint (chapter 7) stores this with the
    model's, optimizer's and scheduler's ``state_dict()``."""

    step: int = 0
    data: dict = field(default_factory=dict)  # Batches.state_dict()
    train: list = field(default_factory=list)  # one dict per step
    eval: list = field(default_factory=list)  # one dict per evaluation

    def to_json(self) -> dict:
        return asdict(self)
