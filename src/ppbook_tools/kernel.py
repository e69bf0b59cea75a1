"""A page's Jupyter kernel forked from a server that has imported torch and matplotlib already.

    python -m ppbook_tools.kernel -f CONNECTION_FILE [ipykernel's arguments]

What ``python -m ipykernel_launcher`` does, in a process forked from the server of kernels
(:func:`ppbook_tools.zygote.start` with ``kernels=True``) that ``PPBOOK_KERNEL_SERVER`` names: a
fresh kernel spends about 7 CPU-seconds importing torch, ``torch.distributed.pipelining``,
ipykernel and matplotlib, on every one of the book's pages. Without a server, or where the server
refuses the environment, this process becomes ``ipykernel_launcher`` itself (``exec``). The
kernel's exit status is this process's; its output comes out here when it ends; a SIGINT (Jupyter's
interrupt) reaches it; when this process is killed (as Jupyter stops a kernel that does not shut
down), the server kills the kernel with it.

``tools/build_book.py`` starts this in place of ``ipykernel_launcher`` for every page it runs (and
``tools/run_page.py`` through it). Plumbing: no page or reader sees a difference.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

LAUNCHER = "ipykernel_launcher"
#: a kernel runs as long as its page; the page's own timeout (``_config.yml``) stops it before this
LIFETIME_S = 24 * 3600.0


def main(argv: list[str]) -> int:
    from ppbook_tools import zygote

    forked = list(argv)
    if os.environ.get("JPY_PARENT_PID"):
        # ipykernel reads its parent from the environment when it is imported, which the server did
        # before any kernel had one: say it, so that the kernel runs as a fresh one would (no banner
        # on its output; it exits when its parent does)
        forked.append(f"--IPKernelApp.parent_handle={os.environ['JPY_PARENT_PID']}")
    result = zygote.run_module(LAUNCHER, forked, Path.cwd(), dict(os.environ), LIFETIME_S, zygote.KERNEL_ENV)
    if result is None:  # no server here, or one that would give the kernel another environment
        os.execv(sys.executable, [sys.executable, "-m", LAUNCHER, *argv])
    code, output = result
    sys.stdout.write(output)
    sys.stdout.flush()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
