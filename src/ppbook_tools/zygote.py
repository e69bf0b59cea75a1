"""Start a script's ranks by forking a process that has imported torch already: the book's build
and the tests launch scripts this way, readers' notebooks and shells use torchrun itself.

Plumbing, not in any chapter, and :mod:`ppbook.launch` does not import it: :func:`start` plugs the
server into ``launch`` (:func:`ppbook.launch.use_forker`) in the process that starts it, and
:func:`load_ipython_extension` in each page's kernel (``tools/build_book.py`` starts them with
``--IPKernelApp.extensions=ppbook_tools.zygote``); their launches then fork from the server whose
socket ``PPBOOK_ZYGOTE`` names.

Why: a two-rank ``torchrun`` launch on a laptop CPU spends about 12 CPU-seconds before the
script's first line runs. torchrun and each rank import torch (about 2.5 s each), and the ranks
then import ``torch.distributed.pipelining`` (another 2 s, since it pulls in dynamo and export).
The build and the tests launch scripts about a hundred times, so that is 20 CPU-minutes of
imports. The server pays it once: it imports torch, then forks a *handler* for each launch,
which forks the ranks.

The handler does the job of torchrun's agent for ``--standalone --nproc-per-node N``:
- it sets each rank's environment as torchrun does (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
  ``MASTER_ADDR``/``MASTER_PORT``, ``TORCHELASTIC_*``; ``OMP_NUM_THREADS=1`` when N > 1 and it is
  unset);
- it hosts the job's TCPStore, as the agent does (``TORCHELASTIC_USE_AGENT_STORE=True``);
- it runs the script as ``__main__`` with the launch's argv, working folder and environment;
- when a rank fails it lets the others report their own errors for a moment (``NOTICE``), then
  stops them (SIGTERM, then SIGKILL) and reports exit status 1.

The script cannot tell the difference. torchrun's own messages (its OMP warning, its failure
summary) are not printed, and anything torchrun-specific (``torchrun_args``, several nodes)
still runs torchrun. So does a launch whose environment differs from the server's in a variable
that torch or Python read when they start (:data:`MUST_MATCH`). ``PPBOOK_LAUNCHER=torchrun``
turns forking off everywhere; ``tests/test_launch_dist.py`` checks that both ways give the same
bits.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib
import importlib.util
import json
import os
import resource
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from ppbook import launch
from ppbook.launch import LAUNCHER_ENV as FORCE_TORCHRUN  # "torchrun": never fork
from ppbook.launch import ForkTimeout as Timeout
from ppbook.launch import kill_tree

ENV = "PPBOOK_ZYGOTE"  # the server's socket path, for every process that may launch
# A folder: the book's build records there what its pages' launches answered (tools/build_book.py),
# and a page that makes a launch another page made already gets that answer (:func:`_memoised`).
MEMO_ENV = "PPBOOK_LAUNCH_MEMO"
ANSWERED = "answered.txt"  # in that folder: a line per launch answered so, its script and arguments
KERNEL_ENV = "PPBOOK_KERNEL_SERVER"  # the socket of the server of the pages' kernels (ppbook_tools.kernel)
# Imported once by the server: everything a companion script imports that takes long.
PRELOAD = ("numpy", "torch", "torch.distributed.pipelining", "torch.distributed.checkpoint",
           "torch.distributed.fsdp", "torch.distributed.tensor", "torch.nn.parallel", "tqdm", "tqdm.auto",
           # chapters 4 and 7's Hugging Face runs: 1-2.5 s per rank to import, paid here once
           "transformers", "transformers.models.llama.modeling_llama", "safetensors.torch")
# What most pages' kernels import (the server of kernels): torch, and what a kernel and a figure take.
# ipykernel sets MPLBACKEND to its inline backend when the kernel's environment has none; matplotlib
# reads it when it loads, so that server sets it first (:func:`serve`), and a forked kernel draws
# inline as a fresh one does.
KERNEL_PRELOAD = ("numpy", "torch", "torch.distributed.pipelining", "tqdm", "tqdm.auto", "ipykernel.kernelapp",
                  "matplotlib.pyplot")
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"
# Variables read when Python, torch, OpenMP or tqdm start up: a launch whose value differs from
# the server's would behave differently in a forked rank, so it runs torchrun instead.
# OMP_NUM_THREADS is the exception: a rank applies its own with torch.set_num_threads.
MUST_MATCH = ("PYTHON", "TORCH", "PYTORCH", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS", "NUMPY",
              "CUDA", "NCCL", "GLOO", "TQDM_", "LD_", "MALLOC", "TMPDIR", "HF_", "TRANSFORMERS_")
# The server of kernels does not import transformers (KERNEL_PRELOAD): a kernel's HF_ variables are
# read when its page imports it, after the fork. Matplotlib's are read when it loads, in the server,
# where MPLBACKEND is what ipykernel sets when the kernel's environment has none.
KERNEL_MUST_MATCH = tuple(p for p in MUST_MATCH if p not in ("HF_", "TRANSFORMERS_")) + ("MPL",)
# When a rank fails, torchrun notices at its next look (every 0.1 s) and only then stops the
# others. A peer whose connection the failed rank closed fails at once and says so ("Connection
# closed by peer", which chapter A3 teaches readers to look past); stopped the instant the first
# rank exited, a peer under load lost that line. So the others get NOTICE seconds to exit by
# themselves, then SIGTERM, then after GRACE more seconds SIGKILL.
NOTICE = 3.0
GRACE = 10.0
_MAX_MESSAGE = 1 << 20


# ----------------------------------------------------------------------------- the client side

def plug_in() -> None:
    """Make this process's launches (:mod:`ppbook.launch`) fork from the server ``PPBOOK_ZYGOTE``
    names, when one is named and answers (:func:`run`)."""
    launch.use_forker(run)


def load_ipython_extension(ipython) -> None:
    """A page's kernel started by the build (``--IPKernelApp.extensions=ppbook_tools.zygote``)
    plugs the server in before the page's first cell."""
    plug_in()


def _differs(env: dict, server_env: dict, must_match: tuple[str, ...] = MUST_MATCH) -> list[str]:
    """The variables of ``must_match`` whose values differ between ``env`` and the server's."""
    keys = {k for k in (*env, *server_env) if k.startswith(must_match) and k != "OMP_NUM_THREADS"}
    return sorted(k for k in keys if env.get(k) != server_env.get(k))


def _connect(variable: str = ENV) -> socket.socket | None:
    """A connection to the running server that ``variable`` names, or ``None`` when there is none
    or forking is off."""
    path = os.environ.get(variable)
    if not path or os.environ.get(FORCE_TORCHRUN) == "torchrun" or not hasattr(socket, "send_fds"):
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return None
    return sock


def run(script: Path, args: list[str], nproc: int | None, cwd: Path, env: dict,
        timeout: float) -> tuple[int, str] | tuple[int, str, float] | None:
    """Run ``script`` with ``args`` on ``nproc`` forked ranks (``None``: one plain process, as
    ``python script``), and return ``(exit status, output)``; ``None`` when it must run the usual
    way instead (no server, or an environment the server cannot give the ranks).
    Raises :class:`Timeout` after ``timeout`` seconds, with every rank killed. In the book's build
    (``PPBOOK_LAUNCH_MEMO``) a launch another page made already returns that launch's
    ``(exit status, output, seconds)`` (:func:`_memoised`)."""
    request = {"script": str(script), "args": [str(a) for a in args], "nproc": nproc, "cwd": str(cwd), "env": env}
    if os.environ.get(MEMO_ENV):
        return _memoised(Path(os.environ[MEMO_ENV]), request, timeout)
    return _run(request, timeout)


def memo_key(request: dict) -> tuple[str, list[str], str | None] | None:
    """``(key, its arguments but the launcher's --json, that --json path)`` of a launch that the build may answer from an identical
    one: the same script (its bytes), arguments (but the launcher's own ``--json`` path), ranks,
    folder and environment (but Jupyter's per-kernel ``JPY_`` variables). ``None`` for a launch that
    names a file or folder in its arguments: what it reads or writes there may have changed since."""
    args, json_path = list(request["args"]), None
    if args[-2:-1] == ["--json"]:
        args, json_path = args[:-2], args[-1]
    if any(os.sep in a for a in args):
        return None
    env = sorted((k, v) for k, v in request["env"].items() if not k.startswith("JPY_"))
    digest = hashlib.sha256((Path(request["cwd"]) / request["script"]).read_bytes())
    digest.update(json.dumps([request["script"], args, json_path is None, request["nproc"], request["cwd"], env]).encode())
    return digest.hexdigest(), args, json_path


def _memoised(folder: Path, request: dict, timeout: float) -> tuple[int, str] | tuple[int, str, float] | None:
    """The book's build runs a launch once: chapter 3 and the schedules' deeper page both measure
    ``03_gpipe.py --check --microbatches 1 2 4 8``, and the second page shows the first's run, its
    JSON, output and seconds. Only launches that exited 0 are kept; a page that makes an identical
    launch while another runs it waits for its answer (a lock per launch)."""
    key = memo_key(request)
    if key is None:
        return _run(request, timeout)
    digest, args, json_path = key
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{digest}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when this launch ends, or its process dies
        record = folder / f"{digest}.json"
        if record.is_file():
            kept = json.loads(record.read_text())
            if json_path is not None and kept["json"] is not None:
                Path(json_path).write_text(kept["json"])
            with open(folder / ANSWERED, "a") as log:  # the build says which (tools/build_book.py)
                log.write(" ".join([Path(request["script"]).name, *args]) + "\n")
            return kept["returncode"], kept["output"], kept["seconds"]
        t0 = time.perf_counter()
        answer = _run(request, timeout)
        seconds = time.perf_counter() - t0
        if answer is not None and answer[0] == 0:
            written = Path(json_path) if json_path is not None else None
            kept = {"returncode": 0, "output": answer[1], "seconds": seconds,
                    "json": written.read_text() if written is not None and written.is_file() else None}
            record.with_suffix(".tmp").write_text(json.dumps(kept))
            record.with_suffix(".tmp").replace(record)
        return answer if answer is None else (*answer, seconds)  # the seconds an identical launch will show


def run_module(module: str, args: list[str], cwd: Path, env: dict, timeout: float,
               variable: str = ENV) -> tuple[int, str] | None:
    """Run ``python -m module args`` forked from the server ``variable`` names, as :func:`run` runs a
    script (a page's kernel: :mod:`ppbook_tools.kernel`). A SIGINT to this process while it runs
    reaches the module's process (Jupyter interrupts a kernel so)."""
    return _run({"module": module, "script": module, "args": [str(a) for a in args], "nproc": None,
                 "cwd": str(cwd), "env": env}, timeout, variable, forward_interrupts=True)


def _run(request: dict, timeout: float, variable: str = ENV,
         forward_interrupts: bool = False) -> tuple[int, str] | None:
    sock = _connect(variable)
    if sock is None:
        return None
    read_end, write_end = os.pipe()
    deadline = time.monotonic() + timeout
    interrupt = signal.getsignal(signal.SIGINT)
    try:
        request = {**request, "nice": os.nice(0)}  # the launch runs at its caller's priority
        socket.send_fds(sock, [json.dumps(request).encode()], [write_end])
        os.close(write_end)
        write_end = None
        reply = _receive(sock, deadline)
        if not reply or "refused" in reply:  # the environment differs, or the server is gone or stuck
            return None
        handler = reply["pid"]
        if forward_interrupts:  # the handler passes it on to its process
            signal.signal(signal.SIGINT, lambda signum, frame: os.kill(handler, signal.SIGINT))
        chunks = []
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([read_end], [], [], left)[0]:
                kill_tree(handler)
                raise Timeout(b"".join(chunks).decode(errors="replace"))
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        output = b"".join(chunks).decode(errors="replace")
        status = _receive(sock, deadline)
        if status is None:
            kill_tree(handler)
            raise Timeout(output)
        if not status:  # the handler was killed before it could say how the ranks ended
            return 1, output + "\nppbook_tools.zygote: the launch's handler died before its ranks' exit status came back\n"
        return status["returncode"], output
    finally:
        if forward_interrupts:
            signal.signal(signal.SIGINT, interrupt)
        os.close(read_end)
        if write_end is not None:
            os.close(write_end)
        sock.close()


def _receive(sock: socket.socket, deadline: float) -> dict | None:
    """The next message: ``None`` at the deadline, ``{}`` when the other side has closed."""
    left = deadline - time.monotonic()
    if left <= 0 or not select.select([sock], [], [], left)[0]:
        return None
    data = sock.recv(_MAX_MESSAGE)
    return json.loads(data) if data else {}


# ----------------------------------------------------------------------------- starting a server

def start(env: dict, log: Path | None = None, kernels: bool = False) -> subprocess.Popen:
    """Start a server for processes with environment ``env`` (and their children), and set
    ``PPBOOK_ZYGOTE`` in this process's environment (``kernels``: a server of pages' kernels,
    :data:`KERNEL_PRELOAD`, named by ``PPBOOK_KERNEL_SERVER``). It exits with the process that
    started it. Returns at once: the server imports torch while the caller goes on, and answers
    launches made meanwhile when it is ready."""
    folder = Path(tempfile.mkdtemp(prefix="ppbook-zygote-"))
    path = folder / "socket"
    out = open(log or folder / "log", "ab")
    server = subprocess.Popen([sys.executable, "-u", "-m", "ppbook_tools.zygote", str(path), str(os.getpid()),
                               *(["--kernels"] if kernels else [])],
                              env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                              start_new_session=True)
    out.close()
    deadline = time.monotonic() + 60
    while not path.exists():  # it listens before it imports anything heavy
        if server.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the launch server did not start; see {log or folder / 'log'}")
        time.sleep(0.02)
    if kernels:
        os.environ[KERNEL_ENV] = str(path)
        return server
    os.environ[ENV] = str(path)
    plug_in()
    return server


def stop(server: subprocess.Popen) -> None:
    """Stop a server started by :func:`start`, and every launch it still runs."""
    kill_tree(server.pid)
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.wait(timeout=10)  # reaped: its CPU time counts in this process's children's
    variable = KERNEL_ENV if "--kernels" in server.args else ENV
    path = os.environ.pop(variable, None)
    if path:
        with contextlib.suppress(OSError):
            os.unlink(path)
    if variable == ENV and launch.forker() is run:
        launch.use_forker(None)


# ----------------------------------------------------------------------------- the server side

def _exit_with_parent(parent: int) -> None:
    """Ask Linux to SIGTERM this process when the thread that started it ends."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it ended before we asked
        sys.exit(0)


def serve(path: str, parent: int, kernels: bool = False) -> None:
    _exit_with_parent(parent)
    preload = KERNEL_PRELOAD if kernels else PRELOAD
    if kernels:
        os.environ.setdefault("MPLBACKEND", INLINE_BACKEND)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path + ".tmp")
    listener.listen(128)
    os.rename(path + ".tmp", path)  # connect() now queues until accept() below
    t0 = time.perf_counter()
    server_env = dict(os.environ)
    for name in preload:
        importlib.import_module(name)
    # What the imports set themselves (TORCHINDUCTOR_CACHE_DIR): a launch may differ in these, since
    # a rank that imports the same modules sets them again as it would under torchrun.
    own = sorted(k for k in os.environ if k not in server_env)
    print(f"zygote {os.getpid()}: imported {', '.join(preload)} in {time.perf_counter() - t0:.1f} s", flush=True)
    # Each handler is reaped as it ends (not left to the kernel with SIG_IGN, which drops its CPU
    # time): what the ranks used then adds up into this server's, and into the suite's or the
    # build's when they reap it, so `time make test` counts every launch.
    signal.signal(signal.SIGCHLD, _reap)
    while True:
        conn, _ = listener.accept()
        if os.fork() == 0:
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            try:
                _handle(conn, server_env, own, KERNEL_MUST_MATCH if kernels else MUST_MATCH)
            finally:
                os._exit(0)
        conn.close()


def _reap(signum=None, frame=None) -> None:
    """Wait for every handler that has ended (SIGCHLD's handler in the server)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _handle(conn: socket.socket, server_env: dict, own: list[str], must_match: tuple[str, ...] = MUST_MATCH) -> None:
    data, fds, _, _ = socket.recv_fds(conn, _MAX_MESSAGE, 1)
    if not data or not fds:
        return
    output = fds[0]
    request = json.loads(data)
    env = request["env"]
    seen = {"MPLBACKEND": INLINE_BACKEND, **env} if must_match is KERNEL_MUST_MATCH else env
    differ = [k for k in _differs(seen, server_env, must_match) if k not in own]
    if differ:
        conn.send(json.dumps({"refused": differ}).encode())
        print(f"handler {os.getpid()}: {Path(request['script']).name}: runs torchrun, since these differ: "
              f"{', '.join(differ)}", flush=True)
        return
    conn.send(json.dumps({"pid": os.getpid()}).encode())
    if request.get("nice", 0) > os.nice(0):  # as a process the caller started would (never less nice: not allowed)
        os.nice(request["nice"] - os.nice(0))
    t0 = time.perf_counter()
    nproc = request["nproc"]
    request["run_id"] = uuid.uuid4().hex  # one for the job, as torchrun's
    ranks = {}  # pid -> (rank, the write end of the pipe that gives it the store's port)
    for rank in range(nproc or 1):
        port_read, port_write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(port_write)
            _rank(request, rank, output, port_read)  # never returns
        os.close(port_read)
        ranks[pid] = (rank, port_write)
    os.close(output)
    store = None
    if nproc is not None:  # host the job's store, as torchrun's agent does
        from torch.distributed import TCPStore

        store = TCPStore("localhost", 0, world_size=None, is_master=True, wait_for_workers=False)
    for _, port_write in ranks.values():
        os.write(port_write, f"{store.port if store else 0}\n".encode())
        os.close(port_write)
    # an interrupt (SIGINT) of the launch goes to its processes, as a terminal's Ctrl-C reaches them
    signal.signal(signal.SIGINT, lambda signum, frame: _signal(set(ranks), signal.SIGINT))
    returncode = _wait(set(ranks), plain=nproc is None, caller=conn)
    conn.send(json.dumps({"returncode": returncode}).encode())
    # the CPU of the launch (its processes and this handler) and, in the tests, the test that asked:
    # the log then says where a session's CPU went, launch by launch
    cpu = sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
              for f in ("ru_utime", "ru_stime"))
    test = request["env"].get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]
    print(f"handler {os.getpid()}: {Path(request['script']).name} {' '.join(request['args'][:6])}"
          f"{' ...' if len(request['args']) > 6 else ''} on {nproc or 'python'}: exit {returncode} "
          f"in {time.perf_counter() - t0:.1f} s, {cpu:.1f} CPU-s{f' ({test})' if test else ''}", flush=True)


def _wait(pids: set[int], plain: bool, caller: socket.socket | None = None) -> int:
    """Wait for every rank; after the first failure stop the rest, as torchrun does. The exit
    status: torchrun's (1 if any rank failed), or a plain process's own (``-N`` for signal N).
    When the ``caller``'s end of the connection closes (the process that asked for the launch was
    killed), the ranks are killed too: nothing outlives the launch that started it."""
    failed_at, first, stopping = None, 0, False
    while pids:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            if caller is not None and _hung_up(caller):
                _signal(pids, signal.SIGKILL)
                caller = None
            waited = time.monotonic() - failed_at if failed_at is not None else 0.0
            if waited > NOTICE and not stopping:
                _signal(pids, signal.SIGTERM)
                stopping = True
            elif waited > NOTICE + GRACE:
                _signal(pids, signal.SIGKILL)
            time.sleep(0.02)
            continue
        pids.discard(pid)
        code = os.waitstatus_to_exitcode(status)
        if code != 0 and failed_at is None:
            failed_at, first = time.monotonic(), code
    return first if plain else int(failed_at is not None)


def _hung_up(conn: socket.socket) -> bool:
    """Whether the other end of ``conn`` has closed (it sends nothing while it waits)."""
    if not select.select([conn], [], [], 0)[0]:
        return False
    try:
        return not conn.recv(1, socket.MSG_PEEK)
    except OSError:
        return True


def group_nice(nice: int) -> None:
    """Give this process's session the niceness ``nice`` where Linux's autogroup scheduling is on
    (``/proc/sys/kernel/sched_autogroup_enabled``): there the CPU is shared between sessions first,
    whatever each process's own niceness, and a new session starts at 0. Only ever nicer."""
    if nice > 0:
        with contextlib.suppress(OSError):
            Path("/proc/self/autogroup").write_text(str(nice))


def _signal(pids: set[int], sig: int) -> None:
    for p in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, sig)


def _rank(request: dict, rank: int, output: int, port_read: int) -> None:
    """In the forked rank: take the launch's streams, folder, environment and argv, and run the
    script as ``__main__``. Exits the process with the script's exit status."""
    code = 1
    try:
        with os.fdopen(port_read) as f:
            port = f.readline().strip()
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.close(output)
        os.setsid()  # torchrun starts each rank in a session of its own too
        group_nice(request.get("nice", 0))
        os.chdir(request["cwd"])
        env = dict(request["env"])
        nproc = request["nproc"]
        if nproc is not None:
            if nproc > 1:
                env.setdefault("OMP_NUM_THREADS", "1")
            env.update(RANK=str(rank), LOCAL_RANK=str(rank), GROUP_RANK="0", ROLE_RANK=str(rank),
                       ROLE_NAME="default", LOCAL_WORLD_SIZE=str(nproc), WORLD_SIZE=str(nproc),
                       GROUP_WORLD_SIZE="1", ROLE_WORLD_SIZE=str(nproc), MASTER_ADDR="localhost",
                       MASTER_PORT=port, TORCHELASTIC_RESTART_COUNT="0", TORCHELASTIC_MAX_RESTARTS="0",
                       TORCHELASTIC_RUN_ID=request["run_id"], TORCHELASTIC_USE_AGENT_STORE="True")
            env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        os.environ.clear()
        os.environ.update(env)
        from ppbook import nccl_rules

        # NCCL's rules on gloo before the script's first line (ppbook.nccl_rules); not in a kernel
        if nccl_rules.asked() and not request.get("module"):
            nccl_rules.install()
        # OpenMP read the server's OMP_NUM_THREADS when torch loaded: give this rank what a fresh
        # process would take, its own OMP_NUM_THREADS or else one thread per CPU it may run on
        import torch

        torch.set_num_threads(int(env["OMP_NUM_THREADS"]) if env.get("OMP_NUM_THREADS")
                              else len(os.sched_getaffinity(0)))
        import runpy

        if request.get("module"):  # python -m module: a fresh interpreter's sys.path and argv
            sys.path[0] = os.getcwd()
            spec = importlib.util.find_spec(request["module"])
            sys.argv = [spec.origin if spec else request["module"], *request["args"]]
            code = _exit_code(lambda: runpy.run_module(request["module"], run_name="__main__", alter_sys=True))
            return
        script = os.path.abspath(request["script"])
        sys.argv = [request["script"], *request["args"]]
        sys.path[0] = os.path.dirname(script)
        code = _exit_code(lambda: runpy.run_path(script, run_name="__main__"))
    except BaseException:  # in the set-up above: say what went wrong in the launch's output
        with contextlib.suppress(BaseException):
            sys.excepthook(*sys.exc_info())
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _exit_code(main) -> int:
    """Run ``main`` as the interpreter runs a script: the status of ``SystemExit``, 1 with the
    traceback printed for any other exception (through ``sys.excepthook``, which
    ``init_process_group`` replaces to prefix ``[rankN]:``), 0 otherwise; then the atexit hooks."""
    import atexit

    try:
        main()
        code = 0
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    atexit._run_exitfuncs()
    return code


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]), kernels="--kernels" in sys.argv[3:])
