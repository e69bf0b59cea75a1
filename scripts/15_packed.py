"""Packed rows (several documents per row) trained through a pipeline, equal to one process: the
document ids travel with the microbatches and every stage builds its own mask, positions and
cu_seqlens from them; the loss is normalised by the step's tokens.

CPU, two processes (1F1B, Interleaved1F1B and ZBVZeroBubble in turn, each with every variant):
    torchrun --standalone --nproc-per-node 2 scripts/15_packed.py --check
CPU, four processes:
    torchrun --standalone --nproc-per-node 4 scripts/15_packed.py --check
Only 1F1B, only the block-diagonal SDPA mask:
    torchrun --standalone --nproc-per-node 2 scripts/15_packed.py --schedules 1F1B --variants sdpa
GPUs, one per process (NCCL; FlexAttention unfused, as without torch.compile):
    torchrun --standalone --nproc-per-node 2 scripts/15_packed.py --check --device cuda

Variants: ``sdpa`` (a boolean mask from the ids), ``varlen`` (cu_seqlens derived in the stage),
``varlen-presplit`` (cu_seqlens computed per microbatch before the step and handed over
pre-split), ``varlen-whole-batch`` (the mistake that torchtitan PR 3773 fixed: the whole batch's
cu_seqlens given to step, which cuts them into pieces like any tensor), ``mean-per-microbatch`` (SDPA with a mean loss per
microbatch and ``scale_grads``: not the step's token mean), and ``flex-eval`` (FlexAttention with a
``BlockMask`` built per microbatch in the stage, forward only: FlexAttention has no backward on
the CPU). At two processes the launch also exchanges shapes the way Megatron-LM's
``variable_seq_lengths`` does, in a fixed order of operations and in a paired one.
"""

from __future__ import annotations

import argparse
import copy
import inspect
import sys
import time
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed import pipelining

from ppbook import cli, packing
from ppbook import dist as ppdist
from ppbook.models import LlamaConfig, apply_rope, build_model
from ppbook.planner.schedules import SPLIT_BACKWARD
from ppbook.stages import schedule_problem, stage_indices, stage_module
from ppbook.training import TokenMeanLoss, microbatch_mean_loss

SCHEDULES = ("1F1B", "Interleaved1F1B", "ZBVZeroBubble")
VARIANTS = ("sdpa", "varlen", "varlen-presplit", "varlen-whole-batch", "mean-per-microbatch", "blockmask-kwarg",
            "flex-eval")
BUCKETS = (16, 32, 64, 128, 256)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--schedules", nargs="+", choices=SCHEDULES, default=list(SCHEDULES))
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--rows", type=int, default=8, help="packed rows per step (divisible by --microbatches)")
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lengths", type=int, nargs="*", default=[16, 32, 24, 16, 32, 24],
                   help="row lengths of successive steps, for the changing-length comparison (none: skip it)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--check", action="store_true", help="fail unless every right variant equals one process")
    p.add_argument("--json", default=None, help="write machine-readable results to this path (rank 0)")
    p.add_argument("--timeout", type=float, default=120.0)
    return p.parse_args(argv)


def validate(args: argparse.Namespace, world_size: int) -> None:
    if args.microbatches < 1:
        raise ValueError(f"--microbatches must be at least 1, got {args.microbatches}")
    if args.rows < 1 or args.rows % args.microbatches:
        raise ValueError(f"--rows {args.rows} must be a positive multiple of --microbatches {args.microbatches}: "
                         f"the schedule cuts the rows into equal microbatches; try --rows {2 * args.microbatches}")
    if args.seq_len < 8 or args.seq_len > 256:
        raise ValueError(f"--seq-len must be between 8 and 256, got {args.seq_len}")
    if args.dim % 4 or args.dim < 8:
        raise ValueError(f"--dim must be a multiple of 4 heads and at least 8, got {args.dim}")
    for name in args.schedules:
        problem = (schedule_problem(name, world_size, args.microbatches, 2, args.layers)
                   or ppdist.schedule_backend_problem(name, ppdist.pick_device(0, args.device), world_size))
        if problem:
            raise ValueError(problem)
    if any(not 8 <= n <= args.seq_len for n in args.lengths):
        raise ValueError(f"every --lengths value must be between 8 and --seq-len {args.seq_len} (the model's "
                         f"longest row), got {args.lengths}; raise --seq-len or shorten --lengths")
    ppdist.pick_device(0, args.device)


# [start-attention]
def heads(attn, x, cos, sin):
    """q, k, v (b, H, T, hd) of a Llama attention module, rotated."""
    b, T, _ = x.shape
    q = attn.wq(x).view(b, T, attn.n_heads, attn.head_dim).transpose(1, 2)
    k = attn.wk(x).view(b, T, attn.n_kv_heads, attn.head_dim).transpose(1, 2)
    v = attn.wv(x).view(b, T, attn.n_kv_heads, attn.head_dim).transpose(1, 2)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    g = attn.n_heads // attn.n_kv_heads
    return q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)


def sdpa_kernel(doc_ids, cu, block_mask):
    mask = packing.document_mask(doc_ids)           # (b, 1, T, T)
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def flex_kernel(doc_ids, cu, block_mask):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    b, T = doc_ids.shape                            # this microbatch's rows
    block_mask = create_block_mask(packing.document_mask_mod(doc_ids), b, None, T, T,
                                   device=doc_ids.device)
    return lambda q, k, v: flex_attention(q, k, v, block_mask=block_mask)


def varlen_kernel(doc_ids, cu, block_mask):
    if cu is None:                                  # derived here, per microbatch
        cu = packing.cu_seqlens(doc_ids)            # (segments + 1,)
    elif cu.dim() == 2:
        cu = cu[0]                                  # handed over: (1, K) -> (K,)

    def attend(q, k, v):                            # (b, H, T, hd) -> (b*T, H, hd)
        b, H, T, hd = q.shape
        flat = [t.transpose(1, 2).reshape(b * T, H, hd) for t in (q, k, v)]
        out = packing.varlen_attention(*flat, cu)
        return out.view(b, T, H, hd).transpose(1, 2)
    return attend


def given_block_mask_kernel(doc_ids, cu, block_mask):
    """A BlockMask given to step by keyword, split by the schedule: its
    mask_mod, made dense for SDPA (FlexAttention has no CPU backward)."""
    from torch.nn.attention.flex_attention import create_mask

    b, T = doc_ids.shape
    mask = create_mask(block_mask.mask_mod, b, None, T, T, device=doc_ids.device)
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
# [end-attention]


KERNELS = {"sdpa": sdpa_kernel, "flex": flex_kernel, "varlen": varlen_kernel,
           "blockmask": given_block_mask_kernel}


# [start-stage]
class PackedStage(nn.Module):
    """A stage of the Llama model over packed rows. ``doc_ids`` (b, T)
    reaches every stage as a keyword argument, cut into microbatches by
    the schedule; each stage builds from it its mask (or BlockMask, or
    cu_seqlens) and the positions, which restart at every document."""

    def __init__(self, stage_mod: nn.Module, kernel: str = "sdpa"):
        super().__init__()
        self.mod, self.kernel = stage_mod, KERNELS[kernel]

    def forward(self, h, doc_ids, cu=None, block_mask=None):
        m = self.mod
        if m.tok_embeddings is not None:
            h = m.tok_embeddings(h)                 # (b, T) ids -> (b, T, C)
        pos = packing.position_ids(doc_ids)         # (b, T)
        cos, sin = m.rope_cos[pos][:, None], m.rope_sin[pos][:, None]
        attend = self.kernel(doc_ids, cu, block_mask)  # once per microbatch
        for layer in m.layers.values():
            q, k, v = heads(layer.attention, layer.attention_norm(h), cos, sin)
            y = attend(q, k, v).transpose(1, 2).flatten(2)  # (b, T, C)
            h = h + layer.attention.wo(y)
            h = h + layer.feed_forward(layer.ffn_norm(h))
        if m.output is not None:
            return m.output(m.norm(h))              # (b, T, vocab)
        return h                                    # (b, T, C)
# [end-stage]


def eval_fails(name: str, p: int) -> bool:
    """torch 2.13's ``eval`` fails where two adjacent stages share a rank (the V's tip; every
    multi-stage schedule in one process): it hands the previous stage a gradient it has not
    computed ("can't steal_bwd_input if this stage doesn't have backward")."""
    return any(i + 1 in stage_indices(name, r, p) for r in range(p) for i in stage_indices(name, r, p))


def torch_problem(name: str, variant: str) -> str | None:
    """Why the installed torch cannot run ``variant`` under schedule ``name``, or ``None``: before
    2.13 the split backward asks every stage input for ``requires_grad``, a BlockMask given to
    ``step`` by keyword included ("'BlockMask' object has no attribute 'requires_grad'")."""
    from torch.torch_version import TorchVersion

    if variant == "blockmask-kwarg" and name in SPLIT_BACKWARD and TorchVersion(torch.__version__) < (2, 13):
        return (f"{name} {variant}: skipped, its split backward asks a BlockMask for requires_grad under torch "
                f"{torch.__version__}; torch >= 2.13 runs it")
    return None


def kernel_of(variant: str) -> str:
    return {"flex-eval": "flex", "blockmask-kwarg": "blockmask"}.get(variant, variant.split("-")[0]
                                                                     if variant.startswith("varlen") else "sdpa")


# [start-presplit]
def presplit_step(schedule, arg_mbs, kwarg_mbs, target_mbs, losses):
    """One step with microbatches split by the caller. torch's main branch
    (after 2.13, PR 188500) takes them as step(arg_mbs=, kwarg_mbs=,
    target_mbs=); on 2.13 the same effect comes from joining each input's
    pieces along dim 0, which the default chunk spec cuts back apart."""
    if "arg_mbs" in inspect.signature(schedule.step).parameters:
        return schedule.step(arg_mbs=arg_mbs, kwarg_mbs=kwarg_mbs,
                             target_mbs=target_mbs, losses=losses)
    args = [torch.cat(parts) for parts in zip(*arg_mbs)] if arg_mbs else []
    kwargs = {k: torch.cat([kw[k] for kw in kwarg_mbs]) for k in kwarg_mbs[0]}
    extra = {"target": torch.cat(target_mbs), "losses": losses} if target_mbs else {}
    return schedule.step(*args, **kwargs, **extra)
# [end-presplit]


def cu_for(variant: str, doc_ids: torch.Tensor, m: int) -> torch.Tensor | None:
    """What the step is given as ``cu``: microbatches' own stacked (m, K), the whole batch's (K,) that
    the schedule then cuts like any tensor, or None (derived in the stage)."""
    if variant == "varlen-presplit":
        # [start-cu]
        per_mb = [packing.cu_seqlens(d) for d in doc_ids.tensor_split(m)]
        return packing.stack_cu_seqlens(per_mb)     # (m, K): row i is microbatch i's
        # [end-cu]
    if variant == "varlen-whole-batch":             # torchtitan 3773: the schedule
        return packing.cu_seqlens(doc_ids)          # cuts these offsets into m pieces
    return None


def reference(full, variant, tokens, targets, doc_ids, m) -> tuple[dict, float]:
    """One process, microbatch after microbatch, the right kernel, the step's token mean."""
    model = PackedStage(copy.deepcopy(full), "sdpa" if variant == "blockmask-kwarg" else kernel_of(variant))
    loss_fn = TokenMeanLoss()
    loss_fn.set_batch(targets)
    total = 0.0
    grad = variant != "flex-eval"
    for tok, tgt, doc in zip(tokens.tensor_split(m), targets.tensor_split(m), doc_ids.tensor_split(m)):
        with torch.set_grad_enabled(grad):
            loss = loss_fn(model(tok, doc), tgt)
        if grad:
            loss.backward()
        total += loss.item()
    return {n: p.grad for n, p in model.mod.named_parameters()}, total


def run(name, variant, full, tokens, targets, doc_ids, info, args) -> tuple[dict, float]:
    """One step of schedule ``name`` with ``variant``: this rank's gradients and the step's loss."""
    p, m = info.world_size, args.microbatches
    indices = stage_indices(name, info.rank, p)
    n_stages = p * len(indices)
    mods = [PackedStage(stage_module(copy.deepcopy(full), i, n_stages), kernel_of(variant)) for i in indices]
    stages = [pipelining.PipelineStage(mod, i, n_stages, info.device) for mod, i in zip(mods, indices)]
    if variant == "mean-per-microbatch":
        loss_fn, scale = microbatch_mean_loss, True
    else:
        loss_fn, scale = TokenMeanLoss(), False
        loss_fn.set_batch(targets)                  # every microbatch divides by the step's tokens
    cls = getattr(pipelining, f"Schedule{name}")
    single = issubclass(cls, pipelining.schedules.PipelineScheduleSingle)
    schedule = cls(stages[0] if single else stages, n_microbatches=m, loss_fn=loss_fn, scale_grads=scale)
    first, last = 0 in indices, n_stages - 1 in indices
    losses = []
    cu = cu_for(variant, doc_ids, m)
    kwargs = {"doc_ids": doc_ids, **({"cu": cu} if cu is not None else {})}
    if variant == "blockmask-kwarg":                # one BlockMask for the whole batch
        from torch.nn.attention.flex_attention import create_block_mask

        B, T = doc_ids.shape
        kwargs["block_mask"] = create_block_mask(packing.document_mask_mod(doc_ids), B, None, T, T,
                                                 device=info.device)
    if variant == "varlen-presplit":
        kwarg_mbs = [dict(zip(kwargs, parts)) for parts in zip(*(t.tensor_split(m) for t in kwargs.values()))]
        presplit_step(schedule, [(t,) for t in tokens.tensor_split(m)] if first else None, kwarg_mbs,
                      list(targets.tensor_split(m)) if last else None, losses)
    else:
        step = schedule.eval if variant == "flex-eval" else schedule.step
        with torch.set_grad_enabled(variant != "flex-eval"):  # no FlexAttention backward on CPU
            step(*((tokens,) if first else ()), **kwargs,
                 **({"target": targets, "losses": losses} if last else {}))
    grads = {n: q.grad for mod in mods for n, q in mod.mod.named_parameters()}
    loss = torch.tensor([sum(x.item() for x in losses) if last else 0.0], dtype=torch.float64, device=info.device)
    if variant == "mean-per-microbatch":
        loss /= m
    dist.all_reduce(loss)                           # only the last stage's rank adds a value
    return grads, loss.item()


def worst_difference(grads: dict, ref: dict, device) -> float:
    """Largest |pipeline - one process| over this rank's gradients, then over every rank."""
    mine = max(((g - ref[n]).abs().max().item() if g is not None else float("inf") for n, g in grads.items()),
               default=0.0)
    t = torch.tensor([mine], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


# [start-shapes]
def exchange_shapes(info, act_shape, grad_shape, paired: bool) -> dict:
    """Megatron-LM's variable_seq_lengths: before the tensors, each rank
    sends the shape of its activation to the next rank and of its input
    gradient to the previous one, and receives both. At p = 2 both
    neighbours are the same rank, and point-to-point messages between two
    ranks pair in the order they are posted (NCCL has no tags)."""
    r, p = info.rank, info.world_size
    nxt, prv = (r + 1) % p, (r - 1) % p
    send_act = torch.tensor(act_shape, device=info.device)
    send_grad = torch.tensor(grad_shape, device=info.device)
    got_act = torch.zeros_like(send_act)
    got_grad = torch.zeros_like(send_grad)
    op = dist.P2POp
    if paired:  # every rank: sends to next first, receives from prev first
        ops = [op(dist.isend, send_act, nxt), op(dist.isend, send_grad, prv),
               op(dist.irecv, got_act, prv), op(dist.irecv, got_grad, nxt)]
    else:       # _communicate_shapes's fixed order: prev's pair, next's
        ops = [op(dist.isend, send_grad, prv), op(dist.irecv, got_act, prv),
               op(dist.isend, send_act, nxt), op(dist.irecv, got_grad, nxt)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()  # NCCL returns one work for all: wait on every one
    return {"activation": got_act.tolist(), "gradient": got_grad.tolist()}
# [end-shapes]


def shape_demo(info) -> dict:
    """At p = 2: each rank's activation is (T, b, C) = (24, 2, 32) and its gradient (32, 2, 32)."""
    act, grad = [24, 2, 32], [32, 2, 32]
    return {"sent": {"activation": act, "gradient": grad},
            "fixed order": exchange_shapes(info, act, grad, paired=False),
            "paired": exchange_shapes(info, act, grad, paired=True)}


# [start-lengths]
def shape_for(strategy: str, length: int, lengths: list[int]) -> int:
    """The row length a step of documents up to ``length`` runs at."""
    if strategy == "recreate":  # its own length: a new stage at each change
        return length
    if strategy == "bucket":    # the next bucket up: one stage per bucket
        return next(b for b in BUCKETS if b >= length)
    return max(lengths)         # "pack to the maximum": one shape, ever
# [end-lengths]


def lengths_demo(full, args, info) -> list[dict]:
    """Steps whose rows have the lengths of ``--lengths``, under 1F1B and SDPA, three ways."""
    out = []
    mod = PackedStage(stage_module(copy.deepcopy(full), info.rank, info.world_size))
    for strategy in ("recreate", "bucket", "max"):
        schedules, built, seconds, positions, real, worst = {}, 0, [], 0, 0, 0.0
        previous = None
        for k, length in enumerate(args.lengths):
            T = shape_for(strategy, length, args.lengths)
            if T not in schedules or (strategy == "recreate" and T != previous):
                t0 = time.perf_counter()
                stage = pipelining.PipelineStage(mod, info.rank, info.world_size, info.device)
                schedules[T] = (pipelining.Schedule1F1B(stage, n_microbatches=args.microbatches,
                                                        loss_fn=TokenMeanLoss(), scale_grads=False), t0)
                built += 1
            schedule, t0 = schedules[T]
            schedules[T] = (schedule, None)
            previous = T
            docs = step_documents(args, k, length)
            tokens, targets, doc_ids = ppdist.on_device(
                info.device, *packing.pack_stream(docs, args.rows, T, args.vocab, seed=k))
            schedule._loss_fn.set_batch(targets)
            mod.zero_grad(set_to_none=True)
            t0 = t0 if t0 is not None else time.perf_counter()
            last = {"target": targets, "losses": []} if info.is_last else {}
            schedule.step(*((tokens,) if info.is_first else ()), doc_ids=doc_ids, **last)
            seconds.append(time.perf_counter() - t0)
            ref, _ = reference(full, "sdpa", tokens, targets, doc_ids, args.microbatches)
            grads = {n: q.grad for n, q in mod.mod.named_parameters()}
            worst = max(worst, worst_difference(grads, ref, info.device))
            positions += tokens.numel()
            real += int((targets != -100).sum())
        out.append({"strategy": strategy, "schedules_built": built, "step_seconds": seconds,
                    "positions": positions, "scored": real, "max_grad_diff": worst})
    return out


def step_documents(args, k: int, length: int) -> list[int]:
    """Documents for step ``k``: enough to fill ``--rows`` rows of ``length`` tokens."""
    g = torch.Generator().manual_seed(1000 + k)
    docs = []
    while sum(docs) < args.rows * length:
        docs.append(int(torch.randint(3, length + 1, (1,), generator=g)))
    return docs


def make_batch(args) -> tuple[torch.Tensor, ...]:
    """Packed rows of documents of 3 to seq_len + 8 tokens (deterministic from --seed), about 85%
    of the rows' positions: the last rows end in padding, as a loader's last pack does."""
    g = torch.Generator().manual_seed(args.seed)
    lengths = []
    while sum(lengths) < 0.85 * args.rows * args.seq_len:
        lengths.append(int(torch.randint(3, args.seq_len + 8, (1,), generator=g)))
    return packing.pack_stream(lengths, args.rows, args.seq_len, args.vocab, seed=args.seed)


def body(args: argparse.Namespace, info) -> int:
    warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")  # eager on CPU
    cfg = LlamaConfig(vocab_size=args.vocab, dim=args.dim, n_layers=args.layers, n_heads=4, n_kv_heads=2,
                      ffn_hidden_dim=2 * args.dim, max_seq_len=args.seq_len)
    full = build_model(cfg, seed=args.seed, dtype=torch.float64).to(info.device)
    tokens, targets, doc_ids = ppdist.on_device(info.device, *make_batch(args))  # (B, T) each
    m = args.microbatches
    refs = {}
    runs, skipped = [], [p for v in args.variants for n in args.schedules if (p := torch_problem(n, v))]
    for variant in args.variants:
        key = {"flex-eval": "loss only", "blockmask-kwarg": "sdpa"}.get(variant, kernel_of(variant))
        if key not in refs:
            refs[key] = reference(full, variant, tokens, targets, doc_ids, m)
        ref_grads, ref_loss = refs[key]
        for name in args.schedules:
            if (variant == "flex-eval" and eval_fails(name, info.world_size)) or torch_problem(name, variant):
                continue
            t0 = time.perf_counter()
            grads, loss = run(name, variant, full, tokens, targets, doc_ids, info, args)
            diff = None if variant == "flex-eval" else worst_difference(grads, ref_grads, info.device)
            runs.append({"schedule": name, "variant": variant, "loss": loss, "reference_loss": ref_loss,
                         "max_grad_diff": diff, "seconds": time.perf_counter() - t0})
    shapes = shape_demo(info) if info.world_size == 2 else None
    lengths = lengths_demo(full, args, info) if args.lengths else []
    right = [r for r in runs if r["variant"] not in ("varlen-whole-batch", "mean-per-microbatch")]
    match = all((r["max_grad_diff"] is None or r["max_grad_diff"] < 1e-12)  # None: forward only
                and abs(r["loss"] - r["reference_loss"]) < 1e-12 for r in right) \
        and all(r["max_grad_diff"] < 1e-12 for r in lengths)
    if info.rank == 0:
        print(f"{len(doc_ids)} packed rows of {args.seq_len}, {m} microbatches scoring "
              f"{packing.tokens_per_microbatch(targets, m)} tokens, p = {info.world_size}, torch {torch.__version__}")
        for r in runs:
            diff = "forward only" if r["variant"] == "flex-eval" else \
                f"largest gradient difference {r['max_grad_diff']:.1e}"
            print(f"  {r['schedule']:>15} {r['variant']:<20} loss {r['loss']:.6f} (one process "
                  f"{r['reference_loss']:.6f}), {diff}")
        for line in skipped:
            print(f"  {line}")
        if shapes:
            print(f"  shapes sent {shapes['sent']}; received in the fixed order {shapes['fixed order']}, "
                  f"paired {shapes['paired']}")
        for r in lengths:
            print(f"  lengths {args.lengths} by {r['strategy']:<8}: {r['schedules_built']} schedule(s) built, "
                  f"{100 * (1 - r['scored'] / r['positions']):.0f}% of positions score nothing, steps "
                  + " ".join(f"{1e3 * t:.0f}" for t in r["step_seconds"]) + " ms")
        cli.write_json(args.json, {
            "world_size": info.world_size, "microbatches": m, "torch": torch.__version__,
            "tokens_per_microbatch": packing.tokens_per_microbatch(targets, m),
            "doc_ids": doc_ids.tolist(), "targets_counted": (targets != -100).sum().item(),
            "runs": runs, "skipped": skipped, "shapes": shapes, "lengths": lengths, "match": match})
    if args.check and not match:
        raise SystemExit(f"rank {info.rank}: a right variant differs from one process")
    return 0


def main(argv=None) -> int:
    return cli.run("15_packed.py", parse_args(argv), validate, body)


if __name__ == "__main__":
    sys.exit(main())
