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
    """Cross-entropy summed over a microbatch's tokens, divided by the number of counted tokens
    in the *whole* batch (all microbatches, all accumulation steps). Use with
    ``scale_grads=False``: the microbatch losses then add up to the batch's token mean, and so do
    their gradients, whatever the padding. Set :attr:`denominator` before each step."""

    def __init__(self):
        self.denominator = 1

    def set_batch(self, *targets: torch.Tensor) -> int:
        """Count the tokens that will be scored in this step's batch (or accumulated batches)."""
        self.denominator = max(1, sum(int((t != IGNORE_INDEX).sum()) for t in targets))
        return self.denominator

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        total = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX,
                                reduction="sum")  # logits (b, T, V), targets (b, T)
        return total / self.denominator
# [end-loss]


def microbatch_mean_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The seed's loss: the mean over the *microbatch's* counted tokens (use with scale_grads=True)."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)


# [start-clip]
def clip_grad_norm_global(params: list[torch.Tensor], max_norm: float, group=None) -> tuple[float, float]:
    """Clip this stage's gradients by the norm of *all* stages' gradients, exactly as
    ``torch.nn.utils.clip_grad_norm_`` does for the whole model in one process.

    Every stage gathers every stage's per-tensor norms (stage order is the model's parameter
    order) and reduces them the way ``clip_grad_norm_`` does, so the global norm, and the
    clipped gradients, are the one-process ones to the last bit. Returns (global norm, this
    stage's norm).
    """
    grads = [p.grad for p in params if p.grad is not None]
    device = params[0].device
    mine = torch.stack([torch.linalg.vector_norm(g) for g in grads]) if grads else torch.zeros(0, device=device)
    norms = mine  # (tensors on this stage,)
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        world = dist.get_world_size(group)
        counts = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(world)]
        dist.all_gather(counts, torch.tensor([len(mine)], device=device), group=group)  # comm: how many
        longest = int(max(c.item() for c in counts))
        padded = torch.zeros(longest, dtype=mine.dtype, device=device)
        padded[:len(mine)] = mine
        gathered = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(gathered, padded, group=group)  # comm: every stage's per-tensor norms
        norms = torch.cat([g[:int(c.item())] for g, c in zip(gathered, counts)])  # (all tensors,) in model order
    total = torch.linalg.vector_norm(norms)  # what clip_grad_norm_ computes from the same norms
    if max_norm > 0 and grads:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)  # its clipping coefficient, too
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


# --- what scale_grads does, measured ----------------------------------------------------------------
def gradient_scaling_cases(info, m: int = 4, seq_len: int = 16, seed: int = 0) -> dict[str, float]:
    """Run a tiny Llama through ``ScheduleGPipe`` (one stage per rank of the current process
    group) with each loss/``scale_grads`` combination, and return for each case the largest
    gradient difference, relative to the largest gradient, from the one-process gradient of
    what the case should compute. float64, so ``0`` means equal and ``>1e-3`` means wrong.

    ``a`` and ``b`` are two batches of ``2m`` rows; in ``a``, every other microbatch is mostly
    padding. The target is always the mean over every counted token of the batches used.
    """
    import copy

    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    from ppbook.data import inputs_and_targets
    from ppbook.experiment import schedule_step
    from ppbook.models import LlamaConfig, build_model
    from ppbook.stages import stage_module

    cfg = LlamaConfig(vocab_size=64, dim=32, n_layers=max(2, info.world_size), n_heads=4, n_kv_heads=2,
                      ffn_hidden_dim=64, max_seq_len=seq_len)
    full = build_model(cfg, seed=seed, dtype=torch.float64).to(info.device)
    rows = torch.randint(2, 64, (4 * m, seq_len + 1), generator=torch.Generator().manual_seed(seed))
    lengths = torch.full((4 * m,), seq_len + 1)
    lengths[:2 * m].view(m, 2)[1::2] = 3  # batch a: microbatches 1, 3, ... hold 2 real targets per row
    a = inputs_and_targets(rows[:2 * m], lengths[:2 * m])  # tokens (2m, T), targets (2m, T)
    b = inputs_and_targets(rows[2 * m:], lengths[2 * m:])
    a_full = inputs_and_targets(rows[:2 * m], torch.full((2 * m,), seq_len + 1))

    def reference(batches, weights=None) -> dict[str, torch.Tensor]:
        """One process: gradient of the token mean over ``batches`` (or of sum(w * batch mean))."""
        model = copy.deepcopy(full)
        if weights is None:
            loss_fn = TokenMeanLoss()
            loss_fn.set_batch(*(t for _, t in batches))
            loss = sum(loss_fn(model(x.to(info.device)), y.to(info.device)) for x, y in batches)
        else:
            loss = sum(w * microbatch_mean_loss(model(x.to(info.device)), y.to(info.device))
                       for w, (x, y) in zip(weights, batches))
        loss.backward()
        return {n: p.grad for n, p in model.named_parameters()}

    def pipeline(batches, loss_fn, scale_grads) -> dict[str, torch.Tensor]:
        """``schedule.step`` once per batch, without zero_grad in between (outer accumulation)."""
        stage_mod = stage_module(copy.deepcopy(full), info.rank, info.world_size)
        stage = PipelineStage(stage_mod, stage_index=info.rank, num_stages=info.world_size, device=info.device)
        schedule = ScheduleGPipe(stage, n_microbatches=m, loss_fn=loss_fn, scale_grads=scale_grads)
        for x, y in batches:
            schedule_step(schedule, info, x.to(info.device), y.to(info.device))
        return {n: p.grad for n, p in stage_mod.named_parameters()}

    def diff(got, want) -> float:
        scale = max(want[n].abs().max() for n in got)
        d = torch.tensor(max(((got[n] - want[n]).abs().max() / scale).item() for n in got), dtype=torch.float64)
        if dist.is_initialized():
            dist.all_reduce(d, op=dist.ReduceOp.MAX)  # the worst stage
        return d.item()

    token_mean = TokenMeanLoss()
    cases = {}
    # [start-cases]
    # 1. mean loss per microbatch, scale_grads=True, no padding: the batch mean, right
    cases["mean loss, scale_grads, no padding"] = diff(pipeline([a_full], microbatch_mean_loss, True), reference([a_full]))
    # 2. the same with padding: each microbatch weighs the same, whatever its number of tokens
    cases["mean loss, scale_grads, padding"] = diff(pipeline([a], microbatch_mean_loss, True), reference([a]))
    # 3. the fix: sum over tokens / tokens in the whole batch, scale_grads=False
    token_mean.set_batch(a[1])
    cases["token-mean loss, no scaling, padding"] = diff(pipeline([a], token_mean, False), reference([a]))
    # 4. two steps accumulated: scale_grads divides what the first step left by m again
    cases["mean loss, scale_grads, 2 accumulated steps"] = diff(
        pipeline([a_full, b], microbatch_mean_loss, True), reference([a_full, b]))
    # ... which is exactly the gradient of mean(a) / m + mean(b), not of (mean(a) + mean(b)) / 2
    cases["mean loss, scale_grads, 2 accumulated steps, vs mean(a)/m + mean(b)"] = diff(
        pipeline([a_full, b], microbatch_mean_loss, True), reference([a_full, b], weights=[1 / m, 1.0]))
    # 5. the fix: the denominator counts the tokens of every accumulated batch, scale_grads=False
    token_mean.set_batch(a[1], b[1])
    cases["token-mean loss, no scaling, 2 accumulated steps"] = diff(pipeline([a, b], token_mean, False),
                                                                   reference([a, b]))
    # [end-cases]
    return cases
