"""Chapter 12: a pipeline whose batches change length, each step checked against one process.

Batches of the book's training text whose length changes: padding to one length, to a few bucket
lengths, packing documents with a document mask, a new schedule per length. With ``--lengths``,
one schedule stepped with random batches of those lengths instead: what ``PipelineStage`` does
when the shape changes (fails on purpose).

CPU (gloo):
    torchrun --standalone --nproc-per-node 2 scripts/12_shapes.py --check
What a pipeline does when the sequence length changes between steps (fails on purpose):
    torchrun --standalone --nproc-per-node 2 scripts/12_shapes.py --lengths 32 16
GPUs (NCCL):
    torchrun --standalone --nproc-per-node 2 scripts/12_shapes.py --device cuda --check
"""

from __future__ import annotations

import argparse
import copy
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed import pipelining
from tqdm import tqdm

from ppbook import cli, data, precision, training, workload
from ppbook.combined import (begin, build_stages, finish, full_llama, grad_diff, make_schedule, parser, reference,
                             step)
from ppbook.combined import validate as validate_common
from ppbook.dist import gather_to_rank0
from ppbook.packing import document_mask  # (B, T) document ids -> (B, 1, T, T), chapter 15
from ppbook.stages import stage_module


def parse_args(argv=None):
    p = parser(__doc__, None)
    p.add_argument("--lengths", nargs="+", type=int, default=None,
                   help="one 1F1B schedule stepped with random batches of these lengths, one per step (what "
                        "happens when the length changes)")
    p.add_argument("--shape-batch-sizes", nargs="+", type=int, default=None,
                   help="with --lengths: the batch size of each step (default --batch-size)")
    p.add_argument("--strategies", nargs="+", default=["pad", "bucket", "pack", "recreate"],
                   choices=["pad", "bucket", "pack", "recreate"],
                   help="how each batch of documents gets a shape the pipeline can take")
    p.add_argument("--buckets", nargs="+", type=int, default=[32, 64, 128],
                   help="the lengths a batch is padded up to (bucket), the longest for pad and pack")
    p.add_argument("--documents", type=int, default=64, help="how many documents of the book's text")
    return p.parse_args(argv)


def validate(args, world_size: int) -> None:
    validate_common(args, world_size, ["1F1B"])  # every strategy builds its own 1F1B schedules
    if min(args.buckets) < 1 or args.documents < args.batch_size:
        raise ValueError(f"--buckets must be positive and --documents ({args.documents}) at least --batch-size "
                         f"({args.batch_size})")
    sizes = args.shape_batch_sizes or []
    if args.lengths and (min(args.lengths) < 1 or sizes and len(sizes) != len(args.lengths)
                         or any(b % args.microbatches for b in sizes)):
        raise ValueError(f"--lengths needs positive lengths, and --shape-batch-sizes one batch size per length, "
                         f"each divisible by --microbatches {args.microbatches}")


def last_stage_values(values: list):
    """This rank's per-step values on the rank that holds the last stage (``None`` elsewhere), on rank 0."""
    rows = gather_to_rank0(values)
    return None if rows is None else next(r for r in rows if r and r[0] is not None)


def naive_lengths(args, info) -> dict:
    """One schedule, stepped with batches whose shape changes: what PipelineStage does then."""
    full = full_llama(args, info.device, max(args.lengths))
    mods, stages, indices, num_stages = build_stages("1F1B", full, args, info.rank, info.world_size, info.device)
    schedule = make_schedule("1F1B", stages, args.microbatches)
    sizes = args.shape_batch_sizes or [args.batch_size] * len(args.lengths)
    steps, losses = [], []
    for i, (length, size) in enumerate(zip(args.lengths, sizes)):
        shape = argparse.Namespace(**{**vars(args), "seq_len": length, "batch_size": size})
        tokens, targets = workload.make_batch(shape, i, info.device)  # (size, length) each
        for mod in mods:
            mod.zero_grad(set_to_none=True)
        mb_losses = step(schedule, indices, num_stages, tokens, targets)
        losses.append(workload.mean_loss(mb_losses) if mb_losses else None)
        ref = reference(full, tokens, targets, args.microbatches)
        diff = torch.tensor(grad_diff(mods, ref), dtype=torch.float64, device=info.device)
        dist.all_reduce(diff, op=dist.ReduceOp.MAX)
        with torch.no_grad():
            ref_loss = torch.stack([workload.loss_fn(ref(t), y) for t, y in zip(
                tokens.tensor_split(args.microbatches), targets.tensor_split(args.microbatches))]).mean().item()
        steps.append({"length": length, "batch_size": size, "reference_loss": ref_loss, "max_grad_diff": diff.item()})
    losses = last_stage_values(losses)
    if losses is None:
        return {}
    for row, loss in zip(steps, losses):
        row["loss"] = loss
    return {"steps": steps, "max_grad_diff": max(r["max_grad_diff"] for r in steps),
            "max_loss_diff": max(abs(r["loss"] - r["reference_loss"]) for r in steps)}


class Documents(torch.nn.Module):
    """A stage (or the whole model) that takes ``doc_ids`` by keyword, as every stage gets it from
    ``step`` (chapter 6), and attends within each document only."""

    def __init__(self, mod):
        super().__init__()
        self.mod = mod

    def forward(self, h, doc_ids=None):
        m = self.mod
        h = m.tok_embeddings(h) if m.tok_embeddings is not None else h  # (b, T) ids -> (b, T, C)
        mask = document_mask(doc_ids) if doc_ids is not None else None  # (b, 1, T, T)
        cos, sin = m.rope_cos[:h.shape[1]], m.rope_sin[:h.shape[1]]
        for layer in m.layers.values():
            h = layer(h, cos, sin, mask)
        return m.output(m.norm(h)) if m.output is not None else h  # logits (b, T, V) on the last stage


# [start-shapes]
def shaped_batches(strategy, rows, lengths, batch_size, buckets):
    """The documents (rows of ids, real lengths) as batches of a shape
    the pipeline can take: ``pad`` to the longest bucket, ``bucket``
    to the next bucket length, ``recreate`` to the batch's own longest
    document, ``pack`` documents back to back into rows of the longest
    bucket, each position tagged with its document (for the mask)."""
    if strategy == "pack":
        tokens, targets, doc_ids = pack(rows, lengths, max(buckets))  # (N, T) each
        for i in range(0, len(tokens) - batch_size + 1, batch_size):
            mine = slice(i, i + batch_size)
            yield tokens[mine], targets[mine], {"doc_ids": doc_ids[mine]}
        return
    for i in batch_starts(len(rows), batch_size):
        r, n = rows[i:i + batch_size], lengths[i:i + batch_size]
        longest = int(n.max()) - 1  # a row of n ids gives n - 1 predictions
        T = max(buckets)  # pad
        if strategy == "bucket":
            T = min(b for b in buckets if b >= longest)
        elif strategy == "recreate":
            T = longest
        # (B, T) each, the padding's targets ignored
        yield *data.inputs_and_targets(r[:, :T + 1], n), {}
# [end-shapes]


def batch_starts(n: int, batch_size: int) -> list[int]:
    """Where each batch of length-sorted rows starts, in a seeded order: similar lengths share a
    batch (little padding), and the length changes from step to step."""
    starts = torch.arange(0, n - batch_size + 1, batch_size)
    return starts[torch.randperm(len(starts), generator=torch.Generator().manual_seed(1))].tolist()


def pack(rows, lengths, T: int):
    """Documents back to back into rows of T positions, a document never cut: tokens, targets and
    each position's document index, (N, T) each; the rest of a row is padding (targets ignored,
    document -1)."""
    out, row = ([], [], []), ([], [], [])

    def close():
        pad = T - len(row[0])
        for got, have, fill in zip(out, row, (0, data.IGNORE_INDEX, -1)):
            got.append(have + [fill] * pad)

    for ids, n in zip(rows.tolist(), lengths.tolist()):
        if len(row[0]) + n - 1 > T:
            close()
            row = ([], [], [])
        doc = len(set(row[2]))
        row[0].extend(ids[:n - 1])
        row[1].extend(ids[1:n])
        row[2].extend([doc] * (n - 1))
    if row[0]:
        close()
    return tuple(torch.tensor(x, device=rows.device) for x in out)  # where the rows were: a GPU's


def documents(args, device):
    """``--documents`` rows of the book's training text (chapter 6's corpus and tokenizer), at most
    the longest bucket long, drawn in a seeded order and sorted by length; and their real lengths."""
    rows, lengths = data.load_local(max(args.buckets), args.vocab).train
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(args.seed))[:args.documents]
    order = order[torch.argsort(lengths[order], stable=True)]  # grouped by length, as trainers batch them
    return rows[order].to(device), lengths[order].to(device)


def strategy_run(strategy, full, rows, lengths, args, info) -> dict:
    """Every batch of the documents through one stage module per rank; PipelineStage objects (and
    their receive buffers) per shape as the strategy needs them, each step checked against one
    process on the same batch."""
    wrap = Documents if strategy == "pack" else (lambda mod: mod)
    mods = [stage_module(copy.deepcopy(full), info.rank, info.world_size)]
    made = {}  # shape -> schedule

    def schedule_for(T):
        if T not in made:
            if strategy == "recreate":
                made.clear()  # a new stage and schedule whenever the length changes
            stage = pipelining.PipelineStage(wrap(mods[0]), info.rank, info.world_size, info.device)
            made[T] = make_schedule("1F1B", [stage], args.microbatches, loss_fn=training.microbatch_mean_loss)
        return made[T]

    steps, built = [], 0
    for tokens, targets, extra in shaped_batches(strategy, rows, lengths, args.batch_size, args.buckets):
        T = tokens.shape[1]
        mods[0].zero_grad(set_to_none=True)
        dist.barrier()
        t0 = time.perf_counter()
        new = T not in made
        built += new
        step(schedule_for(T), [info.rank], info.world_size, tokens, targets, **extra)
        seconds = time.perf_counter() - t0
        ref = reference(wrap(full), tokens, targets, args.microbatches, training.microbatch_mean_loss, **extra)
        diff = grad_diff(mods, ref.mod if strategy == "pack" else ref)
        steps.append([seconds, diff, T, int((targets != data.IGNORE_INDEX).sum()), targets.numel(), new])
    agg = torch.tensor([[s_[0], s_[1]] for s_ in steps], dtype=torch.float64, device=info.device)  # NCCL: a GPU tensor
    dist.all_reduce(agg, op=dist.ReduceOp.MAX)  # the slowest rank's step, the worst difference
    built_here = torch.tensor([s_[5] for s_ in steps], device=info.device)  # the steps that built a stage and schedule
    return {"strategy": strategy, "steps": len(steps), "schedules_built": built,
            "lengths": sorted({s_[2] for s_ in steps}), "seconds": agg[:, 0].sum().item(),
            "building_step_seconds": agg[built_here, 0].mean().item(),
            "other_step_seconds": agg[~built_here, 0].mean().item() if (~built_here).any() else None,
            "max_grad_diff": agg[:, 1].max().item(),
            "real_tokens": sum(s_[3] for s_ in steps), "positions": sum(s_[4] for s_ in steps)}



def body(args, info) -> int:
    t0 = begin(info)
    if args.lengths:
        result = {"naive": naive_lengths(args, info)}
    else:
        full = full_llama(args, info.device, max(args.buckets))
        rows, lengths = documents(args, info.device)
        runs = [strategy_run(st, full, rows, lengths, args, info)
                for st in tqdm(args.strategies, desc="strategies", disable=info.rank != 0)]
        result = {"documents": args.documents, "buckets": args.buckets, "runs": runs}
    if info.rank != 0:
        return 0
    return finish("12_shapes.py", args, info, result, t0, report(args, result))


def report(args, result) -> bool:
    """Human lines on rank 0; whether every step equals the one-process reference."""
    ok = True
    if "naive" in result:
        for r in result["naive"]["steps"]:
            print(f"length {r['length']:4d} batch {r['batch_size']:3d}: loss {r['loss']:.6f}, one process "
                  f"{r['reference_loss']:.6f}, max |grad diff| {r['max_grad_diff']:.1e}")
        ok &= result["naive"]["max_grad_diff"] <= precision.tolerance(args.dtype)
    for r in result.get("runs", []):
        good = r["max_grad_diff"] <= precision.tolerance(args.dtype)
        ok &= good
        print(f"{r['strategy']:>9}: {r['steps']} steps at lengths {r['lengths']}, {r['schedules_built']} schedules "
              f"built, {r['real_tokens'] / r['seconds']:8.0f} tokens/s, "
              f"{100 * (1 - r['real_tokens'] / r['positions']):4.1f}% padding  {'MATCH' if good else 'MISMATCH'}")
    return ok


def main(argv=None) -> int:
    return cli.run("12_shapes.py", parse_args(argv), validate, body)


if __name__ == "__main__":
    sys.exit(main())
