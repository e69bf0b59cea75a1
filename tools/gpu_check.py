"""GPU check: the whole GPU record in one command, measurements then every script's --check.

The measurements run alone on the GPU, then every companion script with ``--check``, into one
folder of at most 8 files, each written as it is made.

    make gpu-check                        # or: python tools/gpu_check.py [--out FOLDER]
    python tools/gpu_check.py --device cpu --tiny --scripts 01_first_pipeline.py   # rehearse on a CPU

Phase 1, alone on the GPU, one process per measurement (``tools/gpu_measure.py``): the bf16
benchmark of scripts/06_train.py at one stage beside a plain loop over the same microbatches and
one over the whole batch (tokens/s, MFU, losses, peaks); the allocator's peak bytes at four
configurations beside the book's accounting; the per-action costs of Llama-3 blocks; and, when
the pipeline misses a target (0.9x the same-microbatch loop, 30% MFU), a ``torch.profiler`` table.
Phase 2, correctness: every companion script's ``--check`` under torchrun (chapters 1-9 and the
appendices at one process per GPU, sized to validate at that many stages; chapters 12-15 at one
process, as the first record ran them), several launches at once on the machine's cores.

The folder (``--out``, default ``data/gpu/<gpu>-<date>``) holds ``record.json`` (the machine, the
versions, every step with its exit status and the tail of its output, the summary), ``check.json``
(every script's command and result), ``bench.json``, ``mem.json``, ``costs.json``, ``profile.txt``
(only when a target is missed) and ``run.log``: 7 files at most, under the 8 that a lent machine
returns. ``--budget`` bounds the whole run: what would start with too little time left is recorded
as not run. It prints a table and exits non-zero when a script or a measurement fails; timing
figures are for people, never pass/fail. Without a GPU, ``--device cuda`` (the default) says so in
one line and exits 1.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_measure, beside this file

import gpu_measure  # noqa: E402
import script_matrix  # noqa: E402
from gpu_measure import (BENCH_1B, BENCH_TINY, PEAK_BF16, TARGET_MFU, TARGET_RATIO, flops_per_token,  # noqa: E402,F401
                         llama_parameters, peak_flops)

from ppbook import launch  # noqa: E402

SCRIPTS = ("01_minimal.py", "01_first_pipeline.py", "02_naive.py", "03_gpipe.py", "04_splitting.py", "05_schedules.py",
           "06_loss_and_masks.py", "06_train.py", "07_checkpointing.py", "08_beyond_chain.py",
           "09_scaling_out.py", "a1_migrate.py", "a3_troubleshooting.py")
# Chapters 12-15 at one process, as the H200 record ran them (its run_gpu.py's EXTRA, with chapter
# 12's FSDP2 and tensor-parallel scripts since): a name per launch, the script, its arguments
# before --device; the launches are script_matrix's, which the torch-version tables run at two
# processes.
ONE_PROCESS = {c["name"]: (c["script"], c["args"][:c["args"].index("--device")])
               for c in script_matrix.extra_commands(1, "cuda")}
LAUNCHES = (*SCRIPTS, *ONE_PROCESS)
# Seconds each took on the H200 record: the longest start first, so that the streams end together.
EXPECTED_S = {"12_compile.py": 100, "06_train.py": 16, "05_schedules.py": 23, "15_packed.py": 22,
              "12_recompute.py": 22, "04_splitting.py": 22, "03_gpipe.py": 20}
# The measurements: name, gpu_measure.py's verb and file, the seconds each may take on a GPU.
MEASUREMENTS = (("bench", "bench.json", 150), ("mem", "mem.json", 120), ("costs", "costs.json", 120))
PROFILE = ("profile", "profile.txt", 120)
BUDGET_S = 420  # the whole run on one H100 or H200: about 7 minutes
PHASE2_S = 150  # phase 1 leaves this much of the budget to phase 2 (its longest launch took 100 s on the H200)
FILES = ("record.json", "run.log", "check.json", *(f for _, f, _ in MEASUREMENTS), PROFILE[1])
assert len(FILES) <= 8  # what a lent GPU machine returns


def script_commands(n: int, device: str, scripts=LAUNCHES) -> list[dict]:
    """The ``--check`` launch of each of ``scripts`` (names of :data:`LAUNCHES`): chapters 1-9 and
    the appendices at ``n`` processes, sized to validate at ``n`` stages; chapters 12-15 at one."""
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
    for name in scripts:
        if name in ONE_PROCESS:
            script, args = ONE_PROCESS[name]
            out.append({"name": name, "script": script, "nproc": 1, "args": [*args, "--device", device]})
        elif name == "a3_troubleshooting.py" and n != 2:
            out.append({"name": name, "script": name, "nproc": n, "args": [], "skip": "staged on exactly 2 processes"})
        else:
            out.append({"name": name, "script": name, "nproc": n, "args": [*sized[name], "--device", device]})
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


def machine(device: str) -> dict:
    info = {"platform": platform.platform(), "machine": platform.machine(), "python": platform.python_version(),
            "torch": torch.__version__, "cuda": torch.version.cuda, "device": device, "cpus": os.cpu_count(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_count=torch.cuda.device_count(), gpu_memory_bytes=props.total_memory,
                    nccl=".".join(map(str, torch.cuda.nccl.version())))
    try:
        info["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                        cwd=launch.repo_root(), timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        info["commit"] = None  # a copy of the tree without its .git
    return info


class Session:
    """The run's folder: the log line by line, record.json and check.json rewritten after each result."""

    def __init__(self, out: Path, budget: float, meta: dict):
        self.out, self.budget, self.t0 = out, budget, time.monotonic()
        self.lock = threading.Lock()
        self.log = open(out / "run.log", "a", buffering=1)
        self.record = {"meta": meta, "files": list(FILES), "steps": [], "passed": None}
        self.check = {"meta": meta, "passed": None, "runs": []}
        self.save()

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.t0)

    def say(self, msg: str) -> None:
        line = f"[{time.monotonic() - self.t0:6.1f}s] {msg}"
        with self.lock:
            print(line, flush=True)
            self.log.write(line + "\n")

    def save(self) -> None:
        with self.lock:
            for name, data in (("record.json", self.record), ("check.json", self.check)):
                gpu_measure.write(self.out / name, data)

    def measure(self, what: str, file: str, seconds: float, device: str, tiny: bool, extra=(), reserve=0.0) -> dict:
        """One measurement in a process of its own, bounded by ``seconds`` and by the budget less
        ``reserve`` (what phase 2 needs). A fresh ``python`` on a GPU machine; forked from the
        launch server where one runs (the tests' rehearsal), as every launch is."""
        args = [what, str(self.out / file), "--device", device, *(["--tiny"] if tiny else []), *extra]
        step = {"tag": what, "command": " ".join(["python", "tools/gpu_measure.py", what, file, *args[2:]])}
        timeout = min(seconds, self.left() - reserve - 5)
        if timeout < 10:
            step.update(rc=None, status="not run: out of time")
            self.say(f"skip {what}: {self.left():.0f} s left")
        else:
            self.say(f"start {what} (timeout {timeout:.0f} s)")
            t = time.monotonic()
            try:
                r = launch.python(str(Path(__file__).with_name("gpu_measure.py")), args, timeout=timeout,
                                  check=False, json_result=False)
                rc, text = r.returncode, r.output
            except launch.LaunchError as err:  # past its timeout, every process killed
                rc, text = "timeout", str(err)
            step.update(rc=rc, seconds=time.monotonic() - t, status="passed" if rc == 0 else "failed",
                        tail=text[-3000:])
            self.say(f"end {what}: rc={rc} in {step['seconds']:.1f} s\n"
                     + "\n".join("    " + line for line in text.strip().splitlines()[-12:]))
        with self.lock:
            self.record["steps"].append(step)
        self.save()
        return step

    def add_run(self, result: dict) -> None:
        with self.lock:
            self.check["runs"].append(result)
        self.save()
        self.say(f"{result['name']}: {result['status']}")


def streams_run(session: Session, commands: list[dict], streams: int, timeout: float) -> None:
    """Run ``commands`` on ``streams`` threads, the longest expected first; each result saved as it comes."""
    todo: queue.Queue = queue.Queue()
    for cmd in sorted(commands, key=lambda c: -EXPECTED_S.get(c["name"], 20)):
        todo.put(cmd)

    def worker():
        while True:
            try:
                cmd = todo.get_nowait()
            except queue.Empty:
                return
            limit = min(timeout, session.left() - 5)
            started = time.monotonic() - session.t0
            if cmd.get("skip") or limit >= 10:
                result = run_script(cmd, limit)
            else:
                result = {**cmd, "status": "not run", "command": None, "error": "out of time (--budget)"}
            session.add_run({**result, "started_s": started, "ended_s": time.monotonic() - session.t0})

    threads = [threading.Thread(target=worker) for _ in range(max(1, streams))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def print_summary(session: Session) -> None:
    runs = sorted(session.check["runs"], key=lambda r: LAUNCHES.index(r["name"]) if r["name"] in LAUNCHES else 99)
    print(f"{'launch':<30} {'procs':>5} {'status':>8} {'seconds':>8}")
    for r in runs:
        secs = f"{r['seconds']:.1f}" if r.get("seconds") is not None else ""
        print(f"{r['name']:<30} {r['nproc']:>5} {r['status']:>8} {secs:>8}  {r.get('skip', '')}")
    for step in session.record["steps"]:
        print(f"measurement {step['tag']:<10} {step['status']}")
    bench_file = session.out / "bench.json"
    if bench_file.is_file():
        b = json.loads(bench_file.read_text())
        for name, loop in b.get("loops", {}).items():
            if "error" in loop:
                print(f"benchmark {name:<10} FAILED")
                continue
            mfu = f"{100 * loop['mfu']:.1f}%" if loop["mfu"] is not None else "n/a (peak unknown)"
            print(f"benchmark {name:<10} {loop['tokens_per_second']:>12,.0f} tokens/s  "
                  f"step {1e3 * loop['median_step_seconds']:8.1f} ms  MFU {mfu}")
        if "ratio_to_accumulate" in b:
            print(f"pipeline / same-microbatch loop: {b['ratio_to_accumulate']:.2f}x (target {TARGET_RATIO}x); "
                  f"/ whole-batch loop: {b['ratio_to_whole']:.2f}x; MFU target {100 * TARGET_MFU:.0f}%")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--nproc", type=int, default=None, help="processes per script (default: one per GPU; 1 on CPU)")
    p.add_argument("--tiny", action="store_true", help="toy measurement shapes (to rehearse on a CPU)")
    p.add_argument("--scripts", nargs="+", choices=LAUNCHES, default=list(LAUNCHES), metavar="LAUNCH",
                   help=f"the launches of phase 2 (default: all): {', '.join(LAUNCHES)}")
    p.add_argument("--no-bench", action="store_true", help="skip phase 1 (the measurements)")
    p.add_argument("--profile", choices=["auto", "always", "never"], default="auto",
                   help="a torch.profiler table: when a target is missed (auto), always, or never")
    p.add_argument("--bench-steps", type=int, default=10, help="measured steps of each benchmark loop")
    p.add_argument("--bench-warmup", type=int, default=3, help="unmeasured steps first")
    p.add_argument("--streams", type=int, default=None,
                   help="launches at once in phase 2 (default: half the CPU cores, at most 6)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per launch")
    p.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for the whole run")
    p.add_argument("--out", default=None, help="the run's folder (default: data/gpu/<gpu>-<date>)")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check.py: error: no GPU here (torch.cuda.is_available() is False); run it on a machine with "
              "NVIDIA GPUs, or rehearse it with --device cpu --tiny", file=sys.stderr)
        return 1
    for name in ("bench_steps", "bench_warmup", "timeout", "budget", "streams"):
        value, least = getattr(args, name), 0 if name == "bench_warmup" else 1
        if value is not None and value < least:
            print(f"gpu_check.py: error: --{name.replace('_', '-')} must be at least {least}, got {value}",
                  file=sys.stderr)
            return 2
    meta = machine(args.device)
    slug = re.sub(r"[^A-Za-z0-9]+", "-", meta.get("gpu", "cpu")).strip("-").lower()
    out = Path(args.out or launch.repo_root() / "data" / "gpu" / f"{slug}-{meta['date'][:10]}")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        print(f"gpu_check.py: error: --out {out}: cannot create the folder ({err.strerror}); pick another",
              file=sys.stderr)
        return 2
    n = args.nproc or (torch.cuda.device_count() if args.device == "cuda" else 1)
    meta.update(command="python tools/gpu_check.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                nproc=n, tiny=args.tiny, budget_s=args.budget)
    session = Session(out, args.budget, meta)
    if not args.no_bench:  # phase 1: alone on the GPU
        reserve = PHASE2_S if args.device == "cuda" else 0.0
        for what, file, seconds in (*MEASUREMENTS, PROFILE):
            if what == "profile":
                missed = json.loads((out / "bench.json").read_text()).get("missed") if (
                    out / "bench.json").is_file() else None
                if not (args.profile == "always" or (args.profile == "auto" and missed)):
                    continue
            extra = ["--steps", str(args.bench_steps), "--warmup", str(args.bench_warmup)] if what == "bench" else []
            # the seconds are a GPU's; a CPU rehearsal takes what --timeout gives a launch
            session.measure(what, file, seconds if args.device == "cuda" else args.timeout, args.device, args.tiny,
                            extra, reserve)
    streams = args.streams or max(1, min(6, (os.cpu_count() or 1) // 2))
    session.say(f"phase 2: {len(args.scripts)} launches, {streams} at once")
    streams_run(session, script_commands(n, args.device, args.scripts), streams, args.timeout)
    runs_ok = all(r["status"] in ("passed", "skipped") for r in session.check["runs"])
    steps_ok = all(s["status"] == "passed" for s in session.record["steps"] if s["tag"] != "profile")
    session.check["passed"] = runs_ok
    session.record.update(passed=runs_ok and steps_ok, seconds=time.monotonic() - session.t0,
                          summary={r["name"]: r["status"] for r in session.check["runs"]})
    session.save()
    print_summary(session)
    session.say(f"{'PASSED' if session.record['passed'] else 'FAILED'}; results in {out}")
    session.log.close()
    return 0 if session.record["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
