"""Two things a pipelined training loop must get right, measured across real stages: how
``scale_grads`` scales the gradients (with padding and with outer accumulation), and an
attention mask that every stage needs, given to every stage by keyword or handed on as a tuple.

CPU, two stages (gloo):
    torchrun --standalone --nproc-per-node 2 scripts/06_loss_and_masks.py
CPU, four stages:
    torchrun --standalone --nproc-per-node 4 scripts/06_loss_and_masks.py --layers 4

The mask part packs two documents into each row (what pretraining pipelines do to avoid
padding) and trains one step four ways: in one process with a document mask (the reference);
through the pipeline with the document ids given to ``step`` by keyword on every rank (torch
cuts a keyword argument into microbatches on every rank and passes each to that rank's stage);
with the ids handed on by every stage (a tuple: for what a stage computes and the next needs);
and with the ids given to the first stage only, as a single-input stage would.
"""

from __future__ import annotations

import argparse
import copy
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

from ppbook import dist as ppdist
from ppbook import cli
from ppbook.packing import document_mask  # (B, T) document ids -> (B, 1, T, T), chapter 15
from ppbook.data import inputs_and_targets
from ppbook.driver import schedule_step
from ppbook.models import LlamaConfig, build_model
from ppbook.stages import stage_module
from ppbook.training import TokenMeanLoss, microbatch_mean_loss
from ppbook.workload import scale_grads


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--json", default=None, help="write machine-readable results to this path (rank 0)")
    p.add_argument("--timeout", type=float, default=120.0)
    return p.parse_args(argv)


def validate(args: argparse.Namespace, world_size: int) -> None:
    if args.microbatches < 1 or args.seq_len < 4:
        raise ValueError(f"--microbatches must be at least 1 and --seq-len at least 4, got {args.microbatches} "
                         f"and {args.seq_len}")
    if args.layers < world_size:
        raise ValueError(f"{world_size} processes need at least {world_size} layers, got --layers {args.layers}")
    ppdist.pick_device(0, args.device)  # --device cuda with too few GPUs: one line, before any process group


def gradient_scaling_cases(info, m: int = 4, seq_len: int = 16, seed: int = 0) -> dict[str, float]:
    """Run a tiny Llama through ``ScheduleGPipe`` (one stage per rank of the current process
    group) with each loss/``scale_grads`` combination, and return for each case the largest
    gradient difference, relative to the largest gradient, from the one-process gradient of
    what the case should compute. float64, so ``0`` means equal and ``>1e-3`` means wrong.

    ``a`` and ``b`` are two batches of ``2m`` rows; in ``a``, every other microbatch is mostly
    padding. The target is always the mean over every counted token of the batches used.
    """
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
        d = torch.tensor(max(((got[n] - want[n]).abs().max() / scale).item() for n in got), dtype=torch.float64,
                         device=info.device)  # a collective's tensor lies on the run's device (NCCL: the GPU)
        if dist.is_initialized():
            dist.all_reduce(d, op=dist.ReduceOp.MAX)  # the worst stage
        return d.item()

    token_mean = TokenMeanLoss()
    cases = {}
    # [start-cases]
    # 1. mean loss per microbatch, scale_grads=True, no padding: the batch mean, right
    cases["mean loss, scale_grads, no padding"] = diff(
        pipeline([a_full], microbatch_mean_loss, True), reference([a_full])
    )
    # 2. the same with padding: each microbatch
    # weighs the same, whatever its number of tokens
    cases["mean loss, scale_grads, padding"] = diff(
        pipeline([a], microbatch_mean_loss, True), reference([a])
    )
    # 3. the fix: sum over tokens / tokens in the whole batch, scale_grads=False
    token_mean.set_batch(a[1])
    cases["token-mean loss, no scaling, padding"] = diff(
        pipeline([a], token_mean, False), reference([a])
    )
    # 4. two steps accumulated: scale_grads divides what the first step left by m again
    cases["mean loss, scale_grads, 2 accumulated steps"] = diff(
        pipeline([a_full, b], microbatch_mean_loss, True), reference([a_full, b]))
    # ... which is exactly the gradient of mean(a)
    # / m + mean(b), not of (mean(a) + mean(b)) / 2
    cases["mean loss, scale_grads, 2 accumulated steps, vs mean(a)/m + mean(b)"] = diff(
        pipeline([a_full, b], microbatch_mean_loss, True),
        reference([a_full, b], weights=[1 / m, 1.0]),
    )
    # 5. the fix: the denominator counts the tokens
    # of every accumulated batch, scale_grads=False
    token_mean.set_batch(a[1], b[1])
    cases["token-mean loss, no scaling, 2 accumulated steps"] = diff(
        pipeline([a, b], token_mean, False), reference([a, b])
    )
    # [end-cases]
    return cases


# [start-packed]
class PackedStage(nn.Module):
    """A stage of the Llama model whose input and output are
    (activations, doc_ids): the mask each stage needs travels with
    the activations. The last stage returns the logits only."""

    def __init__(self, stage_mod: nn.Module, pass_mask: bool = True):
        super().__init__()
        self.mod, self.pass_mask = stage_mod, pass_mask

    def forward(self, h: torch.Tensor, doc_ids: torch.Tensor | None = None):
        m = self.mod
        # (b, T) ids -> (b, T, C)
        h = m.tok_embeddings(h) if m.tok_embeddings is not None else h
        # (b, 1, T, T); None: causal only
        mask = document_mask(doc_ids) if doc_ids is not None else None
        cos, sin = m.rope_cos[:h.shape[1]], m.rope_sin[:h.shape[1]]
        for layer in m.layers.values():
            h = layer(h, cos, sin, mask)
        if m.output is not None:
            return m.output(m.norm(h))                 # (b, T, vocab) on the last stage
        # comm: both tensors, or the activations only
        return (h, doc_ids) if self.pass_mask else h
# [end-packed]


# How the document ids reach every stage: (name, the stage hands them on, step gets them by keyword)
MASK_VARIANTS = (("kwarg on every rank", False, True), ("tuple", True, False), ("first stage only", False, False))


def torch_problem(pass_mask: bool, world_size: int) -> str | None:
    """Why the installed torch cannot hand the ids on between stages, or ``None``: before 2.13 every
    tensor a stage receives is made to require a gradient, and integer ids cannot ("only Tensors of
    floating point dtype can require gradients"); 2.13 leaves integer tensors without one."""
    from torch.torch_version import TorchVersion

    if pass_mask and world_size > 1 and TorchVersion(torch.__version__) < (2, 13):
        return (f"the ids handed on as a tuple need torch >= 2.13 (found {torch.__version__}, which makes every "
                f"received tensor require a gradient, integer ids too): skipped")
    return None


def packed_batch(args, vocab: int, batch: int):
    """Rows of two documents each, cut at a random point: tokens, targets, doc_ids, all (B, T)."""
    g = torch.Generator().manual_seed(args.seed + 1)
    seq = torch.randint(0, vocab, (batch, args.seq_len + 1), generator=g)
    cut = torch.randint(args.seq_len // 4, 3 * args.seq_len // 4, (batch, 1), generator=g)
    doc_ids = (torch.arange(args.seq_len)[None, :] >= cut).long()  # 0 then 1
    return seq[:, :-1], seq[:, 1:], doc_ids


def mask_demo(args, info) -> dict:
    cfg = LlamaConfig(vocab_size=128, dim=32, n_layers=args.layers, n_heads=4, n_kv_heads=2, ffn_hidden_dim=96,
                      max_seq_len=args.seq_len)
    full = build_model(cfg, seed=args.seed, dtype=torch.float64).to(info.device)
    batch = 2 * args.microbatches
    tokens, targets, doc_ids = ppdist.on_device(info.device, *packed_batch(args, cfg.vocab_size, batch))
    m = args.microbatches

    # one process, the mask on every layer: the reference
    ref = PackedStage(copy.deepcopy(full))
    ref_losses = []
    for tok, tgt, doc in zip(tokens.chunk(m), targets.chunk(m), doc_ids.chunk(m)):
        ref_losses.append(microbatch_mean_loss(ref(tok, doc), tgt))
        ref_losses[-1].backward()
    scale_grads(ref, m)  # sum, then divide by m, as the schedule does
    ref_grads = dict(ref.mod.named_parameters())
    out = {"reference_loss": torch.stack(ref_losses).mean().item()}

    for name, pass_mask, as_kwarg in MASK_VARIANTS:
        if torch_problem(pass_mask, info.world_size):
            out["skipped"] = {name: torch_problem(pass_mask, info.world_size)}
            continue
        # [start-run-packed]
        mine = stage_module(copy.deepcopy(full), info.rank, info.world_size)
        stage_mod = PackedStage(mine, pass_mask)
        stage = PipelineStage(stage_mod, stage_index=info.rank,
                              num_stages=info.world_size, device=info.device)
        schedule = ScheduleGPipe(stage, n_microbatches=m,
                                 loss_fn=microbatch_mean_loss)
        losses = []
        # a keyword argument of step is cut into microbatches on
        # every rank and given to that rank's stage; a positional
        # one goes to the first stage only
        mask_kw = {"doc_ids": doc_ids} if as_kwarg else {}
        last_kw = {"target": targets, "losses": losses} if info.is_last else {}
        if info.is_first:
            first_args = (tokens,) if as_kwarg else (tokens, doc_ids)
            schedule.step(*first_args, **mask_kw, **last_kw)
        else:
            # receives (h, doc_ids) or h alone
            schedule.step(**mask_kw, **last_kw)
        # [end-run-packed]
        grad_diff = torch.tensor(max((p.grad - ref_grads[n].grad).abs().max().item()
                                     for n, p in stage_mod.mod.named_parameters()), dtype=torch.float64,
                                 device=info.device)
        dist.all_reduce(grad_diff, op=dist.ReduceOp.MAX)
        loss = torch.tensor(torch.stack(losses).mean().item() if info.is_last else 0.0, dtype=torch.float64,
                            device=info.device)
        dist.broadcast(loss, src=info.world_size - 1)
        out[name] = {"loss": loss.item(), "max_grad_diff": grad_diff.item()}
    return out


def body(args: argparse.Namespace, info) -> int:
    scaling = gradient_scaling_cases(info, m=args.microbatches, seed=args.seed)
    masks = mask_demo(args, info)
    if info.rank != 0:
        return 0
    width = max(map(len, scaling))
    print("max |grad - target| / max |target|, float64, over every stage:")
    for case, d in scaling.items():
        print(f"  {case:<{width}}  {d:.1e}")
    print(f"packed rows, one-process loss {masks['reference_loss']:.6f}")
    for name, _, _ in MASK_VARIANTS:
        if name in masks.get("skipped", {}):
            print(f"  mask passed {name:<17} {masks['skipped'][name]}")
        else:
            print(f"  mask passed {name:<17} loss {masks[name]['loss']:.6f}, max |grad diff| "
                  f"{masks[name]['max_grad_diff']:.1e}")
    cli.write_json(args.json, {"world_size": info.world_size, "microbatches": args.microbatches,
                              "scaling": scaling, "masks": masks})
    return 0


def main(argv=None) -> int:
    return cli.run("06_loss_and_masks.py", parse_args(argv), validate, body)


if __name__ == "__main__":
    sys.exit(main())
