"""Benchmark: chapter 12's compile script, eager against compiled step time per schedule.

    make bench-compile      # or: .venv/bin/python tools/bench_compile.py --backend inductor --steps 5

Launches scripts/12_compile.py once on two processes (m = 4, two stages per
rank for the looped schedules): every schedule eager, compiled per block (torchtitan's way), per
stage, and, for the three schedules that refuse both wrappers, compiled in place with donated
buffers off; first, the error of an in-place ZBVZeroBubble step with donated buffers on
(--donated-buffers-probe). The launch runs with --check: every run is compared with one process.
With inductor (torch.compile's default backend: minutes of compiling on a CPU) the launch gets a
fresh, empty TORCHINDUCTOR_CACHE_DIR, so that no kernel or graph compiled earlier is reused.

Writes the script's JSON to _build/bench/compile_<backend>.json and prints, per schedule, the
median step (ms) of each mode and its ratio to the eager step. A timing is never asserted: these
are one machine's numbers for people. data/recorded/compile_inductor.json, which chapter 12 shows,
was written by the same launch (its command is in its meta); this JSON has the same form.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from ppbook import launch

MODES = ("eager", "blocks", "stage", "in-place")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", default="inductor", help="torch.compile backend (inductor, aot_eager, ...)")
    p.add_argument("--steps", type=int, default=5, help="measured steps per schedule and mode (after one warm-up)")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--timeout", type=float, default=1800, help="seconds the launch may take (inductor compiles)")
    p.add_argument("--out", default=None, help="default: _build/bench/compile_<backend>.json")
    args = p.parse_args(argv)
    out = Path(args.out or f"_build/bench/compile_{args.backend}.json")
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache  # the launched ranks inherit it: nothing cached
        run = launch.torchrun("12_compile.py", ["--backend", args.backend, "--steps", str(args.steps),
                                                "--microbatches", str(args.microbatches), "--donated-buffers-probe",
                                                "--check"], nproc=args.nproc, timeout=args.timeout)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(run.data, indent=1))
    by = {}
    for r in run.data["runs"]:
        by.setdefault(r["schedule"], {})[r["mode"]] = r
    print(f"{args.backend}, {args.nproc} processes, m = {args.microbatches}, median of {args.steps} steps "
          f"(ms; in brackets: compiled / eager)")
    print(f"{'schedule':>22}" + "".join(f"{m:>18}" for m in MODES))
    for name, modes in by.items():
        eager = modes["eager"]["step_seconds"]
        cells = []
        for mode in MODES:
            r = modes.get(mode)
            if r is None:
                cells.append("")
            elif r["refused"]:
                cells.append("refused")
            elif mode == "eager":
                cells.append(f"{1e3 * eager:.1f}")
            else:
                cells.append(f"{1e3 * r['step_seconds']:.1f} ({r['step_seconds'] / eager:.2f})")
        print(f"{name:>22}" + "".join(f"{c:>18}" for c in cells))
    print(f"every run equals one process: {run.data['match']}; raw results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
