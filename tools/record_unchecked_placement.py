"""Record what torch does with a wrong V placement when nothing checks it (troubleshooting appendix).

``scripts/a3_troubleshooting.py --mistake wrong-v-placement`` stops at the book's placement
check, the same way on every run. Without the check (``--no-placement-check``) the ranks exchange
the wrong messages, and what follows depends on timing: one rank reads a garbage object size and
fails to allocate it at once, or both ranks wait until the process-group timeout. A build cannot
show that reliably, so this records a few runs under real torchrun, once, into
``data/recorded/wrong_v_placement.json``, which the appendix shows as a record. Half the runs are made while two busy processes load the cores
(``tools/load_cores.py``), as on a shared CI machine:

    python tools/record_unchecked_placement.py --runs 6
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from ppbook import errors, launch  # noqa: E402

ARGS = ["--mistake", "wrong-v-placement", "--no-placement-check", "--timeout", "20"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--out", type=Path, default=ROOT / "data" / "recorded" / "wrong_v_placement.json")
    args = p.parse_args(argv)
    import torch

    import subprocess

    runs = []
    load = None
    for i in range(args.runs):
        loaded = i >= args.runs // 2
        if loaded and load is None:
            load = subprocess.Popen([sys.executable, str(ROOT / "tools" / "load_cores.py"), "--seconds", "600"])
        t0 = time.perf_counter()
        r = launch.torchrun("a3_troubleshooting.py", ARGS, nproc=2, timeout=120, check=False,
                            json_result=False, fork=False)
        cause = errors.root_cause(r.output)
        runs.append({"loaded": loaded, "returncode": r.returncode, "seconds": round(time.perf_counter() - t0, 2),
                     "rank_errors": {str(k): [t, errors.without_source_path(m)]
                                     for k, (t, m) in errors.rank_errors(r.output).items()},
                     "root_cause": list(cause) if cause else None})
        print(f"run {i}{' (loaded)' if loaded else ''}: exit {r.returncode} after {runs[-1]['seconds']} s: {cause}", flush=True)
    if load is not None:
        load.terminate()
        load.wait()
    meta = {"command": "torchrun --standalone --nproc-per-node 2 scripts/a3_troubleshooting.py " + " ".join(ARGS),
            "recorded_by": "python tools/record_unchecked_placement.py --runs %d" % args.runs,
            "date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "python": platform.python_version(), "machine": f"{platform.machine()}, {_cores()} CPU cores, Linux",
            "backend": "gloo (CPU)",
            "loaded": "runs with loaded=true: two busy processes beside them (tools/load_cores.py)"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "runs": runs}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0))


if __name__ == "__main__":
    sys.exit(main())
