"""Load every CPU core with a busy process for a bounded time, to run the tests under load.

The suite must pass on a machine that other jobs keep busy (issue 16: "passes under load").
This starts one busy-looping process per core (or ``--procs N``), each ending by itself after
``--seconds`` (so a forgotten load cannot outlive its purpose), and with a command after ``--``
runs that command under the load, then stops the load and exits with the command's status:

    python tools/load_cores.py --seconds 1800 -- make test      # the suite with both cores busy
    python tools/load_cores.py --seconds 60                     # just load the cores for a minute
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time


def busy(seconds: float) -> None:
    end = time.monotonic() + seconds
    x = 0
    while time.monotonic() < end:  # pure Python arithmetic: one core at 100%, no memory
        x = (x * 1103515245 + 12345) % 2147483648


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--procs", type=int, default=os.cpu_count() or 1, help="busy processes (default: one per core)")
    p.add_argument("--seconds", type=float, default=600.0, help="each busy process stops by itself after this long")
    p.add_argument("command", nargs=argparse.REMAINDER, help="after --: a command to run under the load")
    args = p.parse_args(argv)
    if args.procs < 1 or args.seconds <= 0:
        p.error(f"--procs must be at least 1 and --seconds positive, got {args.procs} and {args.seconds}")
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    children = []
    for _ in range(args.procs):
        pid = os.fork()
        if pid == 0:  # the busy child: loop, then leave without running the parent's clean-up
            try:
                busy(args.seconds)
            finally:
                os._exit(0)
        children.append(pid)
    print(f"load: {args.procs} busy processes ({', '.join(map(str, children))}) for at most {args.seconds:.0f} s",
          flush=True)
    status = 0
    # stopped with SIGTERM (Popen.terminate, as the recording tools do): stop the load too, not
    # only this process, or the busy children would run on for --seconds
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        if args.command:
            status = subprocess.call(args.command)
        else:
            for pid in children:
                os.waitpid(pid, 0)
    except KeyboardInterrupt:
        status = 130
    finally:
        for pid in children:  # stop the load as soon as the command is done
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
    print("load: stopped", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
