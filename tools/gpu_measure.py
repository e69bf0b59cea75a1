"""The measurements of ``make gpu-check``: each runs in a process of its own, alone on the GPU, and
writes its file as it goes, so that a run cut short keeps what it measured.

    python tools/gpu_measure.py bench OUT.json [--device cpu --tiny]    pipeline vs two plain loops
    python tools/gpu_measure.py mem OUT.json [--device cpu --tiny]      peak allocator bytes vs ppbook.model_memory
    python tools/gpu_measure.py costs OUT.json [--device cpu --tiny]    F, I, B and saved bytes per block
    python tools/gpu_measure.py profile OUT.txt [--device cpu --tiny]   torch.profiler tables

``bench``: scripts/06_train.py in bfloat16 at one stage (the pipeline machinery, its microbatches
and its schedule) beside two plain loops of the same model, data, loss, AdamW, clipping and
precision (:class:`ppbook.precision.MasterWeights` under autocast): one over the *same*
microbatches by gradient accumulation, which isolates what the pipeline runtime costs, and one
forward and backward over the whole batch, which adds what microbatching costs. Each reports its
median step, tokens/s, MFU (model FLOPs, 6 N + 12 L T d per token with N the parameters outside
the embedding table: PaLM, Chowdhery et al. 2022, appendix B, over the GPU's dense bfloat16 peak
from its datasheet), its losses and its peak allocator bytes.

``mem``: ``torch.cuda.max_memory_allocated`` of 06_train.py at one stage at four configurations
(GPipe and 1F1B at m = 8, GPipe at m = 2, a wide model at sequence 4096: the H200 record's), each
beside :func:`predicted_peak`, the book's accounting (``ppbook.model_memory``).

``costs``: per-action times (F; I the gradient with respect to the input alone; B input and
weights; W = B - I) and the forward's saved bytes of one Llama-3 8B and 70B block and of the head
with its loss, at sequence lengths 2048 to 16384 and 1, 2, 4 sequences per microbatch.

``profile``: ``torch.profiler`` over a few steps of the benchmark's pipeline and of the
same-microbatch loop, one table each, sorted by device time (CPU time on a CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ppbook import data as ppdata
from ppbook import dist as ppdist
from ppbook import launch, model_memory, precision
from ppbook.model_memory import llama_parameters
from ppbook.models import LlamaBlock, LlamaConfig, build_model, rope_tables
from ppbook.training import TokenMeanLoss

# dense bfloat16 peak FLOP/s from NVIDIA's datasheets, matched on the device name (first match wins)
PEAK_BF16 = (("H100 PCIe", 756e12), ("H100", 989.4e12), ("H200", 989.4e12), ("A100", 312e12))
TARGET_MFU, TARGET_RATIO = 0.30, 0.9  # the pipeline at one stage against the same-microbatch loop
TARGET_MEMORY = 0.10  # the accounting's prediction against the allocator's peak, either way
BENCH_1B = ["--layers", "16", "--dim", "2048", "--heads", "16", "--kv-heads", "8", "--vocab", "8192",
            "--seq-len", "2048", "--batch-size", "8", "--microbatches", "8"]  # one sequence per microbatch
BENCH_TINY = ["--layers", "2", "--dim", "64", "--heads", "4", "--kv-heads", "2", "--vocab", "512",
              "--seq-len", "64", "--batch-size", "4", "--microbatches", "4"]
# AdamW's step moves each weight by about the learning rate whatever its gradient: at 3e-3 (the
# script's default, for its 64-wide toy) a 2048-wide model's weights, initialised at std 0.02,
# change by a sixth of their size per step and the H200 record's loss rose (9.4 -> 13.7 in four
# steps). 3e-4 with a short warmup is the usual rate for a 1B Llama.
BENCH_TRAIN = ["--lr", "3e-4", "--warmup-steps", "3", "--eval-every", "0", "--eval-batches", "1"]
WIDE = ["--layers", "4", "--dim", "4096", "--heads", "32", "--kv-heads", "8", "--vocab", "8192", "--seq-len", "4096"]
MEM_CONFIGS = (  # the H200 record's four (its mem.json)
    ("1b-b8-m8-gpipe", [*BENCH_1B, "--schedule", "gpipe"]),
    ("1b-b8-m8-1f1b", [*BENCH_1B, "--schedule", "1f1b"]),
    ("1b-b8-m2-gpipe", [*BENCH_1B[:-2], "--microbatches", "2", "--schedule", "gpipe"]),
    ("wide-4x4096-s4096-b4-m4-gpipe", [*WIDE, "--batch-size", "4", "--microbatches", "4", "--schedule", "gpipe"]),
)
MEM_TINY = (("tiny-b4-m4-gpipe", [*BENCH_TINY, "--schedule", "gpipe"]),
            ("tiny-b4-m4-1f1b", [*BENCH_TINY, "--schedule", "1f1b"]))
SCHEDULE_NAMES = {"gpipe": "GPipe", "1f1b": "1F1B"}  # 06_train.py's --schedule -> the planner's names
COST_SHAPES = {"llama3-8b": (4096, 32, 8, 14336), "llama3-70b": (8192, 64, 8, 28672)}  # dim, heads, kv, ffn
COST_LENGTHS, COST_MICROBATCH, COST_REPS, COST_VOCAB = (2048, 4096, 8192, 16384), (1, 2, 4), 5, 128256


def train_script():
    return launch.load_script("06_train.py")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_flops(device_name: str) -> float | None:
    for key, peak in PEAK_BF16:
        if key in device_name:
            return peak
    return None


def flops_per_token(args) -> float:
    """6 N + 12 L T d: N the parameters outside the embedding table (PaLM, appendix B)."""
    cfg = train_script().llama_config(args)
    n = llama_parameters(cfg) - cfg.vocab_size * cfg.dim
    return 6 * n + 12 * cfg.n_layers * cfg.max_seq_len * cfg.dim


def predicted_peak(args) -> dict:
    """The book's accounting of 06_train.py's peak at one stage (:func:`ppbook.model_memory.predict_peak`:
    float32 masters, AdamW's moments and gradients, the bf16 weight copies, each microbatch in
    flight's activations under autocast, the logits, the loss's float32 terms, cuBLAS's workspaces,
    the allocator's rounding). 06_train trains under autocast with bf16 copies of its Linear
    weights (``precision.MasterWeights``), which the ``master`` arrangement counts: one bf16 copy
    of each weight through the step and the optimizer's, and the activations autocast saves. ``total`` bytes, its
    named ``parts``, the ``moment`` of the step where the peak falls and the microbatches ``in_flight`` then."""
    cfg = train_script().llama_config(args)
    peak = model_memory.predict_peak(cfg, SCHEDULE_NAMES[args.schedule], args.microbatches,
                                     args.batch_size // args.microbatches, args.seq_len, weight_casts="master")
    return {"total": peak.total, "parts": dict(peak.parts), "moment": peak.moment, "in_flight": peak.in_flight}


def meta(device: torch.device, **extra) -> dict:
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": device.type,
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            "date": time.strftime("%Y-%m-%d"), "python": sys.version.split()[0]}
    return {**info, **extra}


def write(path: str | Path, data) -> None:
    """Replace ``path`` whole (write a sibling, then rename): a reader never sees half a file."""
    tmp = Path(f"{path}.part")
    tmp.write_text(data if isinstance(data, str) else json.dumps(data, indent=1))
    os.replace(tmp, path)


class Peak:
    """The allocator's peak over a region, in bytes above what was allocated when it began (None on a CPU)."""

    def __init__(self, device: torch.device):
        self.device, self.bytes, self.reserved = device, None, None

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            self.bytes = torch.cuda.max_memory_allocated(self.device) - self.base
            self.reserved = torch.cuda.max_memory_reserved(self.device)
        return False


def pipeline_run(argv: list[str], device: torch.device) -> dict:
    """06_train.py at one stage, in this process; its per-step seconds, losses and peak bytes."""
    with tempfile.TemporaryDirectory(prefix="ppbook-gpu-") as tmp, Peak(device) as peak:
        path = Path(tmp) / "train.json"
        code = train_script().main([*argv, "--json", str(path)])
        result = json.loads(path.read_text()) if code == 0 and path.is_file() else None
    if result is None:
        raise RuntimeError(f"06_train.py exited {code}")
    return {"step_seconds": [r["seconds"] for r in result["train"]], "losses": [r["loss"] for r in result["train"]],
            "peak_allocated": peak.bytes, "peak_reserved": peak.reserved}


def plain_loop(argv: list[str], device: torch.device, microbatches: int) -> dict:
    """A training loop without a pipeline: 06_train's model, data, loss, AdamW, learning-rate
    schedule, clipping and precision, the batch in ``microbatches`` forward and backward passes
    whose gradients add up (1: the whole batch at once)."""
    mod = train_script()
    args = mod.parse_args(argv)
    mod.validate(args, 1)  # loads the shipped data
    with Peak(device) as peak:
        model = build_model(mod.llama_config(args), seed=args.seed, dtype=precision.param_dtype(args.dtype)).to(device)
        master = precision.MasterWeights(model, args.dtype)
        optimizer, scheduler = mod.optimizer_and_scheduler(master.parameters(), args)
        batches, loss_fn = ppdata.Batches(*args.dataset_.train, args.batch_size, args.seed), TokenMeanLoss()
        seconds, losses = [], []
        for _ in range(args.steps):
            sync(device)
            t0 = time.perf_counter()
            tokens, targets = ppdist.on_device(device, *batches.next())  # (B, T) each
            loss_fn.set_batch(targets)
            optimizer.zero_grad(set_to_none=True)
            total = 0.0
            with precision.autocast(device, args.dtype):
                for mb_tokens, mb_targets in zip(tokens.chunk(microbatches), targets.chunk(microbatches)):
                    loss = loss_fn(model(mb_tokens), mb_targets)
                    loss.backward()
                    total = total + loss.detach()
            master.gradients_to_masters()
            torch.nn.utils.clip_grad_norm_(master.parameters(), args.clip or float("inf"))
            optimizer.step()
            master.masters_to_compute()
            scheduler.step()
            losses.append(float(total))  # synchronises, as the pipeline's loss does
            sync(device)
            seconds.append(time.perf_counter() - t0)
        del model, master, optimizer
    return {"step_seconds": seconds, "losses": losses, "peak_allocated": peak.bytes, "peak_reserved": peak.reserved}


def summarise(loop: dict, warmup: int, tokens: int, flops: float, peak: float | None) -> dict:
    measured = loop["step_seconds"][warmup:]
    step = statistics.median(measured)
    return {**loop, "warmup_steps": warmup, "median_step_seconds": step, "tokens_per_second": tokens / step,
            "mfu": tokens / step * flops / peak if peak else None,
            "loss_fell": loop["losses"][-1] < loop["losses"][0]}


LOOPS = {"pipeline": "06_train.py at one stage (the pipeline runtime, its schedule and microbatches)",
         "accumulate": "plain loop, the same microbatches by gradient accumulation",
         "whole": "plain loop, the whole batch in one forward and backward"}


def bench(out: str, device_name: str, tiny: bool, steps: int, warmup: int) -> int:
    """The three loops, one after another on the same device; ``out`` rewritten after each."""
    device = ppdist.pick_device(0, device_name)
    shape = BENCH_TINY if tiny else BENCH_1B
    argv = [*shape, *BENCH_TRAIN, "--dtype", "bfloat16", "--device", device_name, "--steps", str(warmup + steps)]
    args = train_script().parse_args(argv)
    tokens, flops = args.batch_size * args.seq_len, flops_per_token(args)
    peak = peak_flops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    result = {"meta": meta(device, command="python tools/gpu_measure.py bench"), "args": argv, "loops_described": LOOPS,
              "microbatches": args.microbatches, "tokens_per_step": tokens, "flops_per_token": flops,
              "peak_flops": peak, "targets": {"ratio_to_accumulate": TARGET_RATIO, "mfu": TARGET_MFU},
              "loops": {}, "status": "running"}
    write(out, result)
    runs = {"pipeline": lambda: pipeline_run(argv, device),
            "accumulate": lambda: plain_loop(argv, device, args.microbatches),
            "whole": lambda: plain_loop(argv, device, 1)}
    for name, run in runs.items():
        try:
            result["loops"][name] = summarise(run(), warmup, tokens, flops, peak)
        except (RuntimeError, ValueError) as err:  # out of memory among them
            result["loops"][name] = {"error": f"{type(err).__name__}: {err}"[-2000:]}
        if device.type == "cuda":
            torch.cuda.empty_cache()
        write(out, result)
    loops = result["loops"]
    ok = all("error" not in v for v in loops.values())
    if ok:
        pipe = loops["pipeline"]["median_step_seconds"]
        result["ratio_to_accumulate"] = loops["accumulate"]["median_step_seconds"] / pipe
        result["ratio_to_whole"] = loops["whole"]["median_step_seconds"] / pipe
        mfu = loops["pipeline"]["mfu"]
        result["missed"] = [k for k, v in (("ratio_to_accumulate", result["ratio_to_accumulate"] < TARGET_RATIO),
                                           ("mfu", mfu is not None and mfu < TARGET_MFU)) if v]
    result["status"] = "passed" if ok else "failed"
    write(out, result)
    for name, v in loops.items():
        if "error" in v:
            print(f"{name:<10} FAILED: {v['error'][-300:]}")
        else:
            mfu = f"{100 * v['mfu']:.1f}%" if v["mfu"] is not None else "n/a"
            print(f"{name:<10} {v['tokens_per_second']:>12,.0f} tokens/s  step {1e3 * v['median_step_seconds']:8.1f} ms"
                  f"  MFU {mfu}  loss {v['losses'][0]:.3f} -> {v['losses'][-1]:.3f}")
    if ok:
        print(f"pipeline: {result['ratio_to_accumulate']:.2f}x the same-microbatch loop (target {TARGET_RATIO}x), "
              f"{result['ratio_to_whole']:.2f}x the whole-batch loop")
    return 0 if ok else 1


def mem(out: str, device_name: str, tiny: bool, steps: int | None = None) -> int:
    """06_train.py at each configuration in turn, its peak beside the accounting's prediction (the
    peak comes in the second step, once AdamW's state exists)."""
    device = ppdist.pick_device(0, device_name)
    steps = steps or (2 if tiny else 3)
    mod = train_script()
    result = {"meta": meta(device, command="python tools/gpu_measure.py mem", steps=steps,
                           accounting="tools/gpu_measure.py predicted_peak (ppbook.model_memory)"), "rows": []}
    failed = 0
    for tag, shape in (MEM_TINY if tiny else MEM_CONFIGS):
        argv = [*shape, *BENCH_TRAIN, "--dtype", "bfloat16", "--device", device_name, "--steps", str(steps)]
        row = {"tag": tag, "argv": argv, "predicted": predicted_peak(mod.parse_args(argv))}
        try:
            row.update(pipeline_run(argv, device))
        except (RuntimeError, ValueError) as err:
            row["error"] = f"{type(err).__name__}: {err}"[-2000:]
            failed += 1
        if device.type == "cuda":
            torch.cuda.empty_cache()
        result["rows"].append(row)
        write(out, result)
        shown = f"{row['peak_allocated'] / 1e9:.2f} GB" if row.get("peak_allocated") is not None else "n/a"
        print(f"{tag:<32} peak {shown}  predicted {row['predicted']['total'] / 1e9:.2f} GB"
              + (f"  FAILED {row['error'][-200:]}" if "error" in row else ""))
    return 1 if failed else 0


def time_actions(fwd, x, params, reps: int, device: torch.device) -> dict:
    """F: forward; I: gradient w.r.t. the input alone; B: input and weights; W_est = B - I (ms)."""
    fs, is_, bs, saved = [], [], [], []
    alloc = (lambda: torch.cuda.memory_allocated(device)) if device.type == "cuda" else (lambda: 0)
    for k in range(reps + 1):  # the first is a warm-up
        sync(device)
        m0, t0 = alloc(), time.perf_counter()
        y = fwd(x)
        sync(device)
        t1, m1 = time.perf_counter(), alloc()
        g = torch.ones_like(y) if y.dim() else None
        t2 = time.perf_counter()
        torch.autograd.grad(y, [x], g)
        sync(device)
        t3 = time.perf_counter()
        del y
        y = fwd(x)
        sync(device)
        t4 = time.perf_counter()
        torch.autograd.grad(y, [x, *params], g)
        sync(device)
        t5 = time.perf_counter()
        if k:
            fs.append(t1 - t0), is_.append(t3 - t2), bs.append(t5 - t4), saved.append(m1 - m0)
        del y, g
    f, i, b = (1e3 * statistics.median(v) for v in (fs, is_, bs))
    return {"F_ms": f, "I_ms": i, "B_ms": b, "W_ms_est": b - i, "saved_bytes": statistics.median(saved),
            "F_ms_all": [1e3 * v for v in fs]}


def costs(out: str, device_name: str, tiny: bool) -> int:
    device = ppdist.pick_device(0, device_name)
    shapes, lengths, mbs, reps, vocab = COST_SHAPES, COST_LENGTHS, COST_MICROBATCH, COST_REPS, COST_VOCAB
    if tiny:
        shapes, lengths, mbs, reps, vocab = {"tiny": (64, 4, 2, 128)}, (64,), (1, 2), 1, 512
    result = {"meta": meta(device, dtype="bfloat16", command="python tools/gpu_measure.py costs",
                           timing=f"median of {reps} after 1 warm-up, synchronised wall clock; I = grad w.r.t. the "
                                  "input alone, B = grad w.r.t. input and weights, W_ms_est = B - I; saved_bytes = "
                                  "memory allocated by the forward (saved tensors plus its output)"), "rows": []}

    def add(row):
        result["rows"].append(row)
        write(out, result)
        print(json.dumps({k: v for k, v in row.items() if k != "F_ms_all"}), flush=True)

    for name, (dim, heads, kv, ffn) in shapes.items():
        cfg = LlamaConfig(vocab_size=vocab, dim=dim, n_layers=1, n_heads=heads, n_kv_heads=kv, ffn_hidden_dim=ffn,
                          max_seq_len=max(lengths))
        block = LlamaBlock(cfg).to(device, torch.bfloat16)
        params = list(block.parameters())
        for seq in lengths:
            cos, sin = (t.to(device) for t in rope_tables(dim // heads, seq, cfg.rope_theta))
            for mb in mbs:
                row = {"part": "block", "model": name, "dim": dim, "heads": heads, "kv_heads": kv, "ffn": ffn,
                       "seq_len": seq, "microbatch": mb, "params": sum(p.numel() for p in params),
                       "handoff_bytes": mb * seq * dim * 2}
                try:
                    x = torch.randn(mb, seq, dim, device=device, dtype=torch.bfloat16, requires_grad=True)
                    row.update(time_actions(lambda x: block(x, cos, sin), x, params, reps, device))
                    del x
                except torch.OutOfMemoryError:
                    row["error"] = "OOM"
                    torch.cuda.empty_cache()
                add(row)
        del block
        head = torch.nn.Linear(dim, vocab, bias=False).to(device, torch.bfloat16)
        for seq in lengths:
            x = torch.randn(1, seq, dim, device=device, dtype=torch.bfloat16, requires_grad=True)
            tgt = torch.randint(0, vocab, (1, seq), device=device)
            row = time_actions(lambda x: F.cross_entropy(head(x).float().flatten(0, 1), tgt.flatten()), x,
                               list(head.parameters()), reps, device)
            add({**row, "part": "head+loss", "model": name, "dim": dim, "vocab": vocab, "seq_len": seq,
                 "microbatch": 1, "params": dim * vocab})
            del x
        del head
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return 0


def profile(out: str, device_name: str, tiny: bool, steps: int | None = None) -> int:
    """torch.profiler over ``steps`` steps of the pipeline and of the same-microbatch loop (model
    build and data included: their rows are init kernels and host copies)."""
    from torch.profiler import ProfilerActivity, profile as prof

    device = ppdist.pick_device(0, device_name)
    steps = steps or (2 if tiny else 3)
    argv = [*(BENCH_TINY if tiny else BENCH_1B), *BENCH_TRAIN, "--dtype", "bfloat16", "--device", device_name,
            "--steps", str(steps)]
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sort = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    text = f"torch.profiler, {meta(device)}\nargv={argv}\n"
    runs = (("pipeline", lambda: pipeline_run(argv, device)),
            ("accumulate", lambda: plain_loop(argv, device, train_script().parse_args(argv).microbatches)))
    for name, run in runs:
        with prof(activities=acts) as p:
            run()
        text += f"\n=== {name}: {LOOPS[name]}, by {sort} ===\n"
        text += p.key_averages().table(sort_by=sort, row_limit=40)
        text += f"\n=== {name}, by self CPU time ===\n" + p.key_averages().table(sort_by="self_cpu_time_total",
                                                                                  row_limit=20)
        write(out, text)
    print(f"profile written: {out}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", choices=["bench", "mem", "costs", "profile"])
    p.add_argument("out", help="the file to write (JSON; text for profile)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--tiny", action="store_true", help="toy shapes (to rehearse on a CPU)")
    p.add_argument("--steps", type=int, default=10, help="bench: measured steps of each loop")
    p.add_argument("--warmup", type=int, default=3, help="bench: unmeasured steps first")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_measure.py: error: no GPU here; use --device cpu --tiny to rehearse", file=sys.stderr)
        return 1
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.what == "bench":
        return bench(args.out, args.device, args.tiny, args.steps, args.warmup)
    return {"mem": mem, "costs": costs, "profile": profile}[args.what](args.out, args.device, args.tiny)


if __name__ == "__main__":
    raise SystemExit(main())
