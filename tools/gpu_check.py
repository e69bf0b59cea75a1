"""GPU check: every companion script with ``--check`` on the GPUs present, and a one-GPU throughput
benchmark of scripts/06_train.py in bfloat16 at a 1B-class Llama shape.

    make gpu-check                        # or: .venv/bin/python tools/gpu_check.py
    python tools/gpu_check.py --device cpu --tiny --scripts 01_first_pipeline.py   # the harness on a CPU

Each script runs under torchrun with one process per GPU (one process when there is one GPU),
sized so that it validates at that many stages. The benchmark trains 06_train.py on one GPU
(one stage: the pipeline machinery, its microbatches and its schedule) and, in the same run, a
plain training loop of the same model, batch and precision with no pipeline; it reports
tokens/s, step time (median over the measured steps) and MFU, the model FLOPs per second over
the GPU's dense bfloat16 peak from its datasheet. Model FLOPs per token are 6 N + 12 L T d
(N parameters outside the embedding table, L layers, T tokens per sequence, d the width; the
PaLM paper's count, Chowdhery et al. 2022, appendix B).

One JSON per run lands in ``data/gpu/`` (``--out``): the machine, GPU, torch, CUDA and NCCL
versions, every command and its result. It prints a table and exits non-zero when any script
or the benchmark fails. Without a GPU, ``--device cuda`` (the default) says so in one line and
exits 1. Timing figures are for people, not pass/fail: the targets (30% MFU, 0.9x the plain
loop) are printed beside them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import re
import statistics
import sys
import time
from pathlib import Path

import torch

from ppbook import data as ppdata
from ppbook import dist as ppdist
from ppbook import launch, precision
from ppbook.memory import llama_parameters
from ppbook.models import build_model
from ppbook.training import TokenMeanLoss

SCRIPTS = ("01_minimal.py", "01_first_pipeline.py", "02_naive.py", "03_gpipe.py", "04_splitting.py", "05_schedules.py",
           "06_loss_and_masks.py", "06_train.py", "07_checkpointing.py", "08_beyond_chain.py",
           "09_scaling_out.py", "a1_migrate.py", "a3_troubleshooting.py")
# dense bfloat16 peak FLOP/s from NVIDIA's datasheets, matched on the device name (first match wins)
PEAK_BF16 = (("H100 PCIe", 756e12), ("H100", 989.4e12), ("H200", 989.4e12), ("A100", 312e12))
TARGET_MFU, TARGET_RATIO = 0.30, 0.9
BENCH_1B = ["--layers", "16", "--dim", "2048", "--heads", "16", "--kv-heads", "8", "--vocab", "8192",
            "--seq-len", "2048", "--batch-size", "8", "--microbatches", "8"]  # one sequence per microbatch
BENCH_TINY = ["--layers", "2", "--dim", "64", "--heads", "4", "--kv-heads", "2", "--vocab", "512",
              "--seq-len", "64", "--batch-size", "4", "--microbatches", "4"]


def script_commands(n: int, device: str, scripts=SCRIPTS) -> list[dict]:
    """The ``--check`` launch of every script at ``n`` processes, sized to validate at ``n`` stages."""
    layers = str(max(4, n))
    m5 = 8 if n <= 2 else 4 * n  # 05: DualPipeV needs m >= 2n, the looped schedules m % n == 0
    sized = {
        "01_minimal.py": ["--layers", layers],  # no --check: it trains, and its tests compare it with one process
        "01_first_pipeline.py": ["--check", "--layers", layers],
        "02_naive.py": ["--check", "--layers", layers],
        "03_gpipe.py": ["--check", "--layers", layers],
        "04_splitting.py": ["--check", "--layers", layers],
        "05_schedules.py": ["--check", "--layers", str(max(8, 2 * n)), "--microbatches", str(m5),
                            "--batch-size", str(4 * m5)],
        "06_loss_and_masks.py": ["--layers", str(max(2, n))],
        "06_train.py": ["--check", "--steps", "5", "--layers", layers],
        "07_checkpointing.py": ["--check", "--steps", "4", "--layers", layers],
        "08_beyond_chain.py": ["--check", "--layers", layers],
        "09_scaling_out.py": ["--check", "--dp", "2" if n % 2 == 0 else "1", "--layers", layers],
        "a1_migrate.py": ["--check", "--layers", str(max(2, n))],
        "a3_troubleshooting.py": ["--mistake", "none"],  # its mistakes are staged on exactly 2 processes
    }
    out = []
    for script in scripts:
        if script == "a3_troubleshooting.py" and n != 2:
            out.append({"name": script, "script": script, "nproc": n, "args": [], "skip": "staged on exactly 2 processes"})
            continue
        out.append({"name": script, "script": script, "nproc": n, "args": [*sized[script], "--device", device]})
    return out


def run_script(cmd: dict, timeout: float) -> dict:
    """Launch one command; its result as a JSON-ready dict (status passed, failed or skipped)."""
    if cmd.get("skip"):
        return {**cmd, "status": "skipped", "command": None}
    try:
        r = launch.torchrun(cmd["script"], cmd["args"], nproc=cmd["nproc"], timeout=timeout, check=False)
    except launch.LaunchError as err:  # a timeout, or exit 0 without JSON
        return {**cmd, "status": "failed", "command": None, "error": str(err)[-2000:]}
    passed = r.returncode == 0 and (r.data or {}).get("match", True) is not False
    return {**cmd, "status": "passed" if passed else "failed", "command": r.shell_command,
            "returncode": r.returncode, "seconds": r.seconds, "output_tail": None if passed else r.output[-3000:]}


def flops_per_token(args) -> float:
    """6 N + 12 L T d: N the parameters outside the embedding table (PaLM, appendix B)."""
    mod = launch.load_script("06_train.py")
    cfg = mod.llama_config(args)
    n = llama_parameters(cfg) - cfg.vocab_size * cfg.dim
    return 6 * n + 12 * cfg.n_layers * cfg.max_seq_len * cfg.dim


def peak_flops(device_name: str) -> float | None:
    for key, peak in PEAK_BF16:
        if key in device_name:
            return peak
    return None


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plain_loop(argv: list[str], device: torch.device, warmup: int, steps: int) -> list[float]:
    """Seconds per step of a plain training loop: 06_train's model, data, loss, AdamW, clipping
    and precision, one forward and backward over the whole batch, no pipeline."""
    mod = launch.load_script("06_train.py")
    args = mod.parse_args(argv)
    mod.validate(args, 1)  # loads the shipped data
    model = build_model(mod.llama_config(args), seed=args.seed, dtype=precision.param_dtype(args.dtype)).to(device)
    optimizer, scheduler = mod.optimizer_and_scheduler(list(model.parameters()), args)
    batches, loss_fn, seconds = ppdata.Batches(*args.dataset_.train, args.batch_size, args.seed), TokenMeanLoss(), []
    for _ in range(warmup + steps):
        sync(device)
        t0 = time.perf_counter()
        tokens, targets = ppdist.on_device(device, *batches.next())  # (B, T) each
        loss_fn.set_batch(targets)
        optimizer.zero_grad(set_to_none=True)
        with precision.autocast(device, args.dtype):
            loss = loss_fn(model(tokens), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip or float("inf"))
        optimizer.step()
        scheduler.step()
        sync(device)
        seconds.append(time.perf_counter() - t0)
    del model, optimizer
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return seconds[warmup:]


def benchmark(device: str, tiny: bool, steps: int, warmup: int, timeout: float) -> dict:
    """06_train.py in bfloat16 on one device, and the plain loop of the same model, batch and precision."""
    argv = [*(BENCH_TINY if tiny else BENCH_1B), "--dtype", "bfloat16", "--device", device]
    pipe_argv = [*argv, "--steps", str(warmup + steps), "--eval-every", "0", "--eval-batches", "1",
                 "--warmup-steps", "1"]
    mod = launch.load_script("06_train.py")
    args = mod.parse_args(argv)
    tokens = args.batch_size * args.seq_len
    out = {"name": "benchmark 06_train.py bf16", "args": pipe_argv, "tokens_per_step": tokens,
           "flops_per_token": flops_per_token(args), "status": "failed"}
    try:
        r = launch.torchrun("06_train.py", pipe_argv, nproc=1, timeout=timeout, check=False)
        out.update(command=r.shell_command, returncode=r.returncode)
        if r.returncode != 0:
            out["output_tail"] = r.output[-3000:]
            return out
        pipe = [rec["seconds"] for rec in r.data["train"]][warmup:]
        plain = plain_loop(argv, ppdist.pick_device(0, device), warmup, steps)
    except (launch.LaunchError, RuntimeError, ValueError) as err:  # e.g. out of memory
        out["error"] = f"{type(err).__name__}: {err}"[-2000:]
        return out
    dev = ppdist.pick_device(0, device)
    peak = peak_flops(torch.cuda.get_device_name(dev)) if dev.type == "cuda" else None
    for name, seconds in (("pipeline", pipe), ("plain", plain)):
        step = statistics.median(seconds)
        out[name] = {"step_seconds": seconds, "median_step_seconds": step, "tokens_per_second": tokens / step,
                     "mfu": tokens / step * out["flops_per_token"] / peak if peak else None}
    out.update(status="passed", peak_flops=peak,
               ratio_to_plain=out["pipeline"]["tokens_per_second"] / out["plain"]["tokens_per_second"])
    return out


def machine(dev: torch.device) -> dict:
    info = {"platform": platform.platform(), "machine": platform.machine(), "python": platform.python_version(),
            "torch": torch.__version__, "cuda": torch.version.cuda, "device": dev.type,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        info.update(gpu=props.name, gpu_count=torch.cuda.device_count(), gpu_memory_bytes=props.total_memory,
                    nccl=".".join(map(str, torch.cuda.nccl.version())))
    return info


def print_table(runs: list[dict], bench: dict | None) -> None:
    print(f"{'script':<24} {'procs':>5} {'status':>8} {'seconds':>8}")
    for r in runs:
        secs = f"{r['seconds']:.1f}" if r.get("seconds") is not None else ""
        print(f"{r['name']:<24} {r['nproc']:>5} {r['status']:>8} {secs:>8}  {r.get('skip', '')}")
    if bench is None:
        return
    if bench["status"] != "passed":
        print(f"benchmark: FAILED ({bench.get('error') or 'exit ' + str(bench.get('returncode'))})")
        return
    for name in ("pipeline", "plain"):
        b = bench[name]
        mfu = f"{100 * b['mfu']:.1f}%" if b["mfu"] is not None else "n/a (peak unknown)"
        print(f"benchmark {name:<9} {b['tokens_per_second']:>12,.0f} tokens/s  step {1e3 * b['median_step_seconds']:8.1f} ms  "
              f"MFU {mfu}")
    print(f"pipeline / plain loop: {bench['ratio_to_plain']:.2f}x (target {TARGET_RATIO}x); MFU target "
          f"{100 * TARGET_MFU:.0f}% on one GPU")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--nproc", type=int, default=None, help="processes per script (default: one per GPU; 1 on CPU)")
    p.add_argument("--tiny", action="store_true", help="toy benchmark shape (to test the harness on a CPU)")
    p.add_argument("--scripts", nargs="+", choices=SCRIPTS, default=list(SCRIPTS))
    p.add_argument("--no-bench", action="store_true", help="skip the throughput benchmark")
    p.add_argument("--bench-steps", type=int, default=10, help="measured steps of each benchmark loop")
    p.add_argument("--bench-warmup", type=int, default=3, help="unmeasured steps first")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per launch")
    p.add_argument("--out", default="data/gpu", help="folder of the run's JSON")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check.py: error: no GPU here (torch.cuda.is_available() is False); run it on a machine with "
              "NVIDIA GPUs, or test the harness with --device cpu --tiny", file=sys.stderr)
        return 1
    try:
        Path(args.out).mkdir(parents=True, exist_ok=True)
    except OSError as err:
        print(f"gpu_check.py: error: --out {args.out}: cannot create the folder ({err.strerror}); pick another",
              file=sys.stderr)
        return 2
    n = args.nproc or (torch.cuda.device_count() if args.device == "cuda" else 1)
    dev = ppdist.pick_device(0, args.device)
    runs = []
    for cmd in script_commands(n, args.device, args.scripts):
        runs.append(run_script(cmd, args.timeout))
        print(f"{cmd['name']}: {runs[-1]['status']}", flush=True)
    bench = None if args.no_bench else benchmark(args.device, args.tiny, args.bench_steps, args.bench_warmup,
                                                 args.timeout)
    info = machine(dev)
    passed = all(r["status"] != "failed" for r in runs) and (bench is None or bench["status"] == "passed")
    record = {"meta": {**info, "command": "python tools/gpu_check.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                       "nproc": n, "tiny": args.tiny},
              "passed": passed, "runs": runs, "benchmark": bench}
    slug = re.sub(r"[^A-Za-z0-9]+", "-", info.get("gpu", "cpu")).strip("-").lower()
    path = Path(args.out) / f"gpu-check_{slug}_{info['date'][:19].replace(':', '')}.json"
    path.write_text(json.dumps(record, indent=1))
    print_table(runs, bench)
    print(f"{'PASSED' if passed else 'FAILED'}; results in {path}")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
