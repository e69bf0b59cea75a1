"""The companion scripts' command line: shared flags, their validation, and the ``run`` wrapper.

Introduced in chapter 1 ("Your first pipeline"); every companion script uses it. Bad input is
refused in one line before any process group exists; machine-readable results go to ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import TYPE_CHECKING, Callable

from ppbook import nccl_rules

if TYPE_CHECKING:
    from ppbook import dist as ppdist

# ppbook.dist and ppbook.precision import torch; they are imported where they are used, so that a
# refusal costs no torch import (tests/helpers/slow_refusal.py launches ranks that only refuse).


def add_common_args(p: argparse.ArgumentParser, microbatches: int | list[int] = 4,
                    microbatches_help: str = "n_microbatches: the batch is cut into this many",
                    batch_size: int = 8, seq_len: int = 32, layers: int = 4, dim: int = 64,
                    mixed_precision: bool = False) -> None:
    """The model, data and run flags every script shares (defaults run in seconds on a CPU).

    ``mixed_precision`` lets ``--dtype`` take ``bfloat16`` (for scripts that wrap their steps in
    :func:`ppbook.precision.autocast`).

    A list default for ``microbatches`` makes ``--microbatches`` take several values (a sweep).
    """
    from ppbook import precision

    nargs = "+" if isinstance(microbatches, list) else None
    p.add_argument("--microbatches", type=int, nargs=nargs, default=microbatches, help=microbatches_help)
    p.add_argument("--batch-size", type=int, default=batch_size, help="global batch size (divisible by --microbatches)")
    p.add_argument("--seq-len", type=int, default=seq_len)
    p.add_argument("--layers", type=int, default=layers, help="transformer layers in the full model")
    p.add_argument("--dim", type=int, default=dim)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=precision.dtype_choices(mixed_precision), default="float32",
                   help="float32/float64: everything in that dtype; bfloat16: float32 weights and optimizer "
                        "state, bfloat16 compute (autocast)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--check", action="store_true", help="fail unless the pipeline matches the one-process run")
    p.add_argument("--json", default=None, help="write machine-readable results to this path (rank 0)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds any rank waits for a peer before failing")


def validate_common(args: argparse.Namespace, num_stages: int, split_over: tuple[str, int] | None = None) -> None:
    """Refuse bad combinations in one line each, before any process group exists. ``split_over``
    (a flag and its value, such as ``("--ep", 2)``): each microbatch is split again that many
    ways, so the batch must divide by both."""
    from ppbook import dist as ppdist

    for name in ("batch_size", "seq_len", "layers", "dim", "heads", "vocab"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.timeout <= 0:
        raise ValueError(f"--timeout must be positive, got {args.timeout}")
    ppdist.pick_device(0, args.device)  # --device cuda without a GPU: one line now, not a traceback later
    for m in args.microbatches if isinstance(args.microbatches, list) else [args.microbatches]:
        if m < 1:
            raise ValueError(f"--microbatches must be at least 1, got {m}")
        flag, ways = split_over or ("", 1)
        q = m * ways
        if args.batch_size % q:
            by = f"--microbatches {m}" + (f" x {flag} {ways} = {q}" if ways > 1 else "")
            raise ValueError(
                f"--batch-size {args.batch_size} is not divisible by {by}: every microbatch must have the same "
                f"size{f' on each of the {ways} {flag} ranks' if ways > 1 else ''}; try --batch-size "
                f"{-(-args.batch_size // q) * q}")
    if args.layers < num_stages:
        raise ValueError(
            f"{num_stages} processes need at least {num_stages} layers (one stage each), got --layers {args.layers}; "
            f"raise --layers or lower --nproc-per-node")
    if args.dim % args.heads:
        raise ValueError(f"--dim {args.dim} must be divisible by --heads {args.heads}")
    if args.json and not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
        raise ValueError(f"--json {args.json}: its folder does not exist; create it or pick another path")
    if getattr(args, "steps", 1) < 1 or getattr(args, "warmup", 0) < 0:
        raise ValueError(f"--steps must be at least 1 and --warmup at least 0, got {args.steps} and "
                         f"{getattr(args, 'warmup', 0)}")


def add_timing_args(p: argparse.ArgumentParser, steps: int = 3) -> None:
    p.add_argument("--steps", type=int, default=steps, help="measured steps per configuration")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured steps first (allocator, caches)")


#: How long a rank other than 0 waits, after refusing its input, for rank 0 to print the same
#: refusal and exit (the launcher then stops the waiting ranks). Rank 0 refuses within a second
#: or two of starting; this bound only matters when it never does (a check that passes on rank 0).
REFUSAL_WAIT_S = 30.0


def _wait_for_rank_0(seconds: float) -> None:
    time.sleep(seconds)


def run(script: str, args: argparse.Namespace, validate: Callable[[argparse.Namespace, int], None],
        body: Callable[[argparse.Namespace, "ppdist.DistInfo"], int], process_group: bool = True) -> int:
    """Validate, set up the process group, run ``body``, tear down; bad input is one line and exit 2.

    Under torchrun every rank validates, and only global rank 0 prints the error line. The other
    ranks do not exit at once: the first rank to exit makes the launcher stop the rest, and a
    rank 1 that exited first could have rank 0 stopped before its line was out (seen on a loaded
    machine). So they wait for rank 0 to print and exit, and are stopped by the launcher then; if
    rank 0 has not done so after :data:`REFUSAL_WAIT_S` (its own check passed), each prints its
    own line and exits 2.

    With ``process_group=False`` a plain ``python script.py`` (no torchrun) runs ``body`` without
    any process group (chapter 7 loads a pipeline's checkpoint that way).
    """
    try:
        validate(args, int(os.environ.get("WORLD_SIZE", "1")))
        nccl_rules.asked()  # a PPBOOK_NCCL_RULES that is neither on nor off is bad input too
    except ValueError as err:
        rank = int(os.environ.get("RANK", "0"))
        if rank == 0:  # every rank fails the same check at once: one prints, so lines cannot interleave
            print(f"{script}: error: {err}", file=sys.stderr, flush=True)
            return 2
        _wait_for_rank_0(REFUSAL_WAIT_S)
        print(f"{script}: error: {err} (rank {rank}: rank 0 did not report it within {REFUSAL_WAIT_S:.0f} s)",
              file=sys.stderr, flush=True)
        return 2
    from ppbook import dist as ppdist

    if not process_group and not ppdist.launched_by_torchrun():
        dev = ppdist.pick_device(0, args.device)
        return body(args, ppdist.DistInfo(0, 1, 0, dev, "none"))
    info = ppdist.setup(args.device, timeout_s=args.timeout)
    status = body(args, info)
    # Not in a ``finally``: a rank whose body raised must print its traceback before its process
    # group goes. Destroying the group first ends the peers' waits ("Connection closed by peer"),
    # a peer exits, and the launcher kills the remaining ranks, the culprit included, before the
    # culprit's own traceback is out (chapter A3 lost its root cause that way). The exit of a
    # raising rank closes its connections after Python has printed the traceback.
    ppdist.teardown()
    return status


def write_json(path: str | None, data: dict) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(data, f, indent=1)
