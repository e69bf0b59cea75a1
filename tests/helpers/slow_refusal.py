"""Every rank refuses its input, and rank 0 takes DELAY_S longer to say so than the others.

tests/test_cli.py launches it under torchrun: the refusal must still reach the terminal as one
line with a non-zero exit (if the other ranks exited at once, torchrun would stop rank 0 before
its line was out). It imports no torch: ``ppbook.cli`` does not, until a process group is needed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from ppbook import cli

DELAY_S = 2.0  # twenty times torchrun's monitor interval (0.1 s): it sees the early exits first
MESSAGE = "--batch-size 6 must split into --dp 4 replicas"


def validate(args: argparse.Namespace, world_size: int) -> None:
    if int(os.environ.get("RANK", "0")) == 0:
        time.sleep(DELAY_S)  # a slow rank 0: a loaded machine, a slow shared filesystem
    raise ValueError(MESSAGE)


def main() -> int:
    return cli.run("slow_refusal.py", argparse.Namespace(), validate, body=lambda args, info: 0)


if __name__ == "__main__":
    sys.exit(main())
