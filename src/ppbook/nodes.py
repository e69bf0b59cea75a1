"""Launch a script as several torchrun "nodes" on this machine, as a cluster would on several.

Introduced in chapter 9 ("Scaling out"). Each node is one ``torchrun --nnodes N --node-rank i``
process; they find each other through a c10d rendezvous on ``127.0.0.1`` and a free port, which
is exactly what separate machines do through the first node's address. All nodes run under one
timeout: when it expires every node and every rank is killed, so a node that never joins cannot
hang a cell or a test.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ppbook.launch import LaunchError, RunResult, child_env, kill_tree, repo_root, script_path


def mesh_layout(dp: int, pp: int, procs_per_node: int, pp_outermost: bool = False) -> list[dict]:
    """Where each rank of a (dp, pp) mesh runs when ranks fill nodes in order (torchrun, Slurm, Ray).

    By default (the mesh ``("dp", "pp")`` that chapter 9's script builds) rank ``r`` is mesh row
    ``r // pp`` (its data-parallel replica) and column ``r % pp`` (its stage): a pipeline is ``pp``
    consecutive ranks, so when ``procs_per_node`` is a multiple of ``pp`` each pipeline stays on
    one node and the data-parallel groups cross nodes. With ``pp_outermost`` (the mesh
    ``("pp", "dp")`` of Megatron-LM and torchtitan) rank ``r`` is stage ``r // dp`` and replica
    ``r % dp``: each stage's data-parallel group is ``dp`` consecutive ranks, and the pipeline
    boundaries cross nodes. Rank ``r`` sits on node ``r // procs_per_node`` as local rank (GPU)
    ``r % procs_per_node``.
    """
    if dp < 1 or pp < 1 or procs_per_node < 1:
        raise ValueError(f"dp, pp and procs_per_node must be at least 1, got {dp}, {pp}, {procs_per_node}")
    return [{"rank": r, "node": r // procs_per_node, "local_rank": r % procs_per_node,
             "dp_rank": r % dp if pp_outermost else r // pp, "pp_rank": r // dp if pp_outermost else r % pp}
            for r in range(dp * pp)]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def node_command(script: str, args, nnodes: int, node_rank: int, nproc_per_node: int, endpoint: str,
                 rdzv_id: str) -> list[str]:
    """One node's command line: torchrun with a c10d rendezvous at ``endpoint`` (host:port)."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--node-rank", str(node_rank),
            "--nproc-per-node", str(nproc_per_node), "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
            "--rdzv-id", rdzv_id, script, *map(str, args)]


def torchrun_nodes(script: str, args: list[str] | tuple = (), nnodes: int = 2, nproc_per_node: int = 2,
                   timeout: float = 300.0, check: bool = True, json_result: bool = True) -> RunResult:
    """Run ``scripts/<script>`` as ``nnodes`` torchrun nodes on loopback; like :func:`ppbook.launch.torchrun`.

    Returns one :class:`~ppbook.launch.RunResult`: ``command`` is node 0's, ``output`` every
    node's output under a ``--- node i ---`` header, ``returncode`` the first non-zero one.
    """
    if nnodes < 1 or nproc_per_node < 1:
        raise ValueError(f"nnodes and nproc_per_node must be at least 1, got {nnodes} and {nproc_per_node}")
    root = repo_root()
    path = script_path(script)
    shown = str(path.relative_to(root) if path.is_relative_to(root) else path)
    endpoint = f"127.0.0.1:{free_port()}"
    with tempfile.TemporaryDirectory(prefix="ppbook-nodes-") as tmp:
        out = Path(tmp) / "result.json"
        extra = ["--json", str(out)] if json_result else []
        # one job's id, the same on every node (the fresh port keeps two launches apart), as a reader types it
        commands = [node_command(shown, [*args, *extra], nnodes, i, nproc_per_node, endpoint, "ppbook")
                    for i in range(nnodes)]
        logs = [open(Path(tmp) / f"node{i}.log", "w+") for i in range(nnodes)]  # files: no pipe can fill up
        t0 = time.perf_counter()
        procs = [subprocess.Popen(c, cwd=root, env=child_env(), stdout=log, stderr=subprocess.STDOUT, text=True,
                                  start_new_session=True) for c, log in zip(commands, logs)]
        try:
            for p in procs:
                p.wait(timeout=max(1.0, timeout - (time.perf_counter() - t0)))
        except subprocess.TimeoutExpired:
            for p in procs:
                kill_tree(p.pid)
        seconds = time.perf_counter() - t0
        output = ""
        for i, log in enumerate(logs):
            log.seek(0)
            output += f"--- node {i} ---\n{log.read()}"
            log.close()
        codes = [p.poll() for p in procs]
        if any(c is None or c < 0 for c in codes) and seconds >= timeout - 1:
            raise LaunchError(f"timed out after {timeout:.0f} s (every node killed)\n--- last output ---\n{output[-4000:]}")
        code = next((c for c in codes if c), 0)
        result = RunResult(commands[0], code, output, seconds, json_path=str(out) if json_result else None,
                           root=str(root))
        if check and code != 0:
            raise LaunchError(f"exit status {code}: {result.shell_command}\n--- last output ---\n{output[-4000:]}")
        if json_result and code == 0:
            if not out.is_file():
                raise LaunchError(f"the nodes exited 0 but wrote no JSON to {out}")
            result.data = json.loads(out.read_text())
        return result
