"""Run a companion script under torchrun from a notebook cell or a test, and read its JSON.

Introduced in chapter 1 ("Your first pipeline"); every chapter that launches a script uses it.

Why not ``!torchrun ...`` in a cell: IPython ignores the exit status, so a script that crashes
(or a ``torchrun`` missing from PATH) leaves the build green. :func:`torchrun` runs
``python -m torch.distributed.run`` with the current interpreter, bounds it with a timeout
(killing every rank on expiry, so a hang cannot stall the build), raises
:class:`LaunchError` with the output's tail when the exit status is not zero, and returns the
JSON the script wrote to ``--json``.

The book's build and the tests start a launch server first, build plumbing beside this package
that imports torch once, and plug it in here (:func:`use_forker`); then :func:`torchrun` and
:func:`python` fork the ranks from it instead of starting torchrun: the same script, argv and
environment, without importing torch again in every process. This module knows only the
interface (:data:`Forker`), never the server: a notebook run by a reader has none plugged in and
starts torchrun itself, as does ``PPBOOK_LAUNCHER=torchrun``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

LAUNCHER_ENV = "PPBOOK_LAUNCHER"  # "torchrun": never fork, even where a launch server is plugged in


class LaunchError(RuntimeError):
    """A launched script failed, timed out, or wrote no JSON."""


class ForkTimeout(Exception):
    """A forked launch ran past its timeout; the forker has killed every rank. ``output``: what
    they wrote until then."""

    def __init__(self, output: str):
        super().__init__("timed out")
        self.output = output


#: A forked launcher: ``forker(script, args, nproc, cwd, env, timeout)`` runs ``script`` with ``args``
#: on ``nproc`` ranks (``None``: one plain process) forked from a process that has imported torch
#: already, in folder ``cwd`` with environment ``env``, and returns ``(exit status, output)``; or
#: ``None`` when it cannot run this launch (then torchrun starts it). Past ``timeout`` seconds it
#: kills the ranks and raises :class:`ForkTimeout`. A forker that answers from an identical launch
#: it ran before returns ``(exit status, output, seconds that launch took)``.
Forker = Callable[[Path, list, "int | None", Path, dict, float], "tuple[int, str] | tuple[int, str, float] | None"]

_forker: Forker | None = None  # plugged in by the build's and the tests' launch server, never by a chapter


def use_forker(forker: Forker | None) -> None:
    """Plug in the launcher that forks ranks (``None`` unplugs it). The build's and the tests'
    launch server calls this in the processes it serves (the build, its page kernels, the test
    session); nothing in this package does."""
    global _forker
    _forker = forker


def forker() -> Forker | None:
    """The forked launcher plugged in, if any."""
    return _forker


@dataclass
class RunResult:
    command: list[str]
    returncode: int
    output: str  # stdout and stderr, interleaved as the script wrote them
    seconds: float
    data: dict | None = field(default=None)
    forked: bool = False  # the ranks were forked from a launch server (see use_forker), not started by torchrun
    json_path: str | None = None  # the ``--json`` path the launcher added of its own (no reader types it)
    env: dict | None = None  # the variables set for this launch only (``env=`` of torchrun/python)
    root: str | None = None  # the repository root the command ran in

    @property
    def shell_command(self) -> str:
        """The command as a reader would type it (with ``torchrun`` for the launcher module)."""
        cmd = list(self.command)
        if cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]:
            cmd = ["torchrun"] + cmd[3:]
        elif cmd[:1] == [sys.executable]:
            cmd = ["python"] + cmd[1:]
        return shlex.join(cmd)

    @property
    def reader_command(self) -> str:
        """The command a reader types at the repository root, as chapters print it: ``shell_command``
        without the launcher's own ``--json`` path, the launch's variables in front
        (``PPBOOK_NCCL_RULES=1 torchrun ...``) and paths inside the repository relative to it, so
        that no page shows a path of the machine that built it, e.g.
        ``torchrun --standalone --nproc-per-node 2 scripts/03_gpipe.py --microbatches 4``. Any other
        path stays as it is: a page writes its files under the repository (``_build/ch7/p2``),
        never in the temporary folder, whose paths differ on every machine."""
        words = shlex.split(self.shell_command)
        if self.json_path is not None and words[-2:] == ["--json", self.json_path]:
            words = words[:-2]
        words = [_reader_path(w, self.root) for w in words]
        prefix = [f"{k}={v}" for k, v in (self.env or {}).items()]
        return shlex.join([*prefix, *words])


def _reader_path(word: str, root: str | None) -> str:
    """``word`` as a reader would type it: relative to ``root`` inside it, as it is elsewhere."""
    if root is not None and word.startswith("/") and Path(word).is_relative_to(root):
        return str(Path(word).relative_to(root)) or "."
    return word


def repo_root(start: Path | None = None) -> Path:
    """The folder holding ``_toc.yml``: found upwards from ``start`` (default: the working directory)."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "_toc.yml").is_file() and (folder / "scripts").is_dir():
            return folder
    fallback = Path(__file__).resolve().parents[2]  # src/ppbook/launch.py -> repository root
    if (fallback / "scripts").is_dir():
        return fallback
    raise LaunchError(f"cannot find the book's repository root (a folder with _toc.yml) above {here}")


def script_path(name: str | Path) -> Path:
    """``scripts/<name>`` of the book, or ``name`` itself when it is an absolute path."""
    path = Path(name) if Path(name).is_absolute() else repo_root() / "scripts" / name
    if not path.is_file():
        raise LaunchError(f"no such script: {path}")
    return path


def kill_tree(pid: int) -> None:
    """SIGKILL a process and all its descendants.

    Killing torchrun's process group is not enough: torchrun starts each rank in a session of
    its own (and so does a forked launch), so the ranks would outlive it and keep our output
    pipe open.
    """
    import psutil

    try:
        parent = psutil.Process(pid)
        family = parent.children(recursive=True) + [parent]  # collect before killing: orphans get re-parented
    except psutil.NoSuchProcess:
        return
    for p in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(family, timeout=10)


def child_env(extra: dict | None = None) -> dict:
    """The environment of a launched script: unbuffered output, no progress bars; ``extra`` on top
    (e.g. ``{"PPBOOK_NCCL_RULES": "0"}``: gloo as it is, whatever the caller's default)."""
    env = dict(os.environ)
    env.update({k: str(v) for k, v in (extra or {}).items()})
    env.setdefault("PYTHONUNBUFFERED", "1")
    # The ranks' own progress bars are for people at a terminal, not for captured output.
    env.setdefault("TQDM_DISABLE", "1")
    # Nothing launched from a page or a test downloads: Hugging Face's libraries read local files only.
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


def started_env(env: dict) -> dict:
    """``env`` for a process started afresh (torchrun, python): with ``PPBOOK_NCCL_RULES=1``, the
    folder whose ``sitecustomize`` installs NCCL's rules first on ``PYTHONPATH``, so that every
    rank runs under them, a script that imports nothing from the book included
    (:mod:`ppbook.nccl_rules`). A forked rank gets them from the launch server instead."""
    from ppbook import nccl_rules

    if not nccl_rules.asked(env):
        return env
    paths = [nccl_rules.site_folder(), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
    return {**env, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}


def _run(command: list[str], timeout: float, cwd: Path, expect_json: Path | None, check: bool,
         fork: tuple[Path, list[str], int | None] | None = None, extra_env: dict | None = None) -> RunResult:
    """Run ``command``; with ``fork`` (script, args, ranks or ``None`` for a plain process), fork
    the ranks from the launch server instead when one is plugged in (:func:`use_forker`): the
    same script, argv and environment, without paying torch's imports again."""
    env = child_env(extra_env)
    t0 = time.perf_counter()
    forked = None
    if fork is not None and _forker is not None and os.environ.get(LAUNCHER_ENV) != "torchrun":
        try:
            forked = _forker(*fork, cwd, env, timeout)
        except ForkTimeout as e:
            raise LaunchError(_timed_out(command, timeout, e.output)) from None
    took = None
    if forked is not None:
        returncode, output, *took = forked
    else:
        proc = subprocess.Popen(command, cwd=cwd, env=started_env(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            output, _ = proc.communicate(timeout=30)
            raise LaunchError(_timed_out(command, timeout, output)) from None
        returncode = proc.returncode
    seconds = took[0] if took else time.perf_counter() - t0
    result = RunResult(command, returncode, output, seconds, forked=forked is not None)
    if check and returncode != 0:
        raise LaunchError(f"exit status {returncode}: {result.shell_command}\n--- last output ---\n{output[-4000:]}")
    if expect_json is not None and returncode == 0:
        if not expect_json.is_file():
            raise LaunchError(f"the script exited 0 but wrote no JSON to {expect_json}: {result.shell_command}")
        result.data = json.loads(expect_json.read_text())
    return result


def _timed_out(command: list[str], timeout: float, output: str) -> str:
    return (f"timed out after {timeout:.0f} s (all ranks killed): {shlex.join(command)}\n"
            f"--- last output ---\n{output[-4000:]}")


def _launch(prefix: list[str], script: str, args, timeout: float, check: bool, json_result: bool,
            nproc: int | None = None, forkable: bool = False, env: dict | None = None) -> RunResult:
    root = repo_root()
    with tempfile.TemporaryDirectory(prefix="ppbook-") as tmp:
        out = Path(tmp) / "result.json"
        extra = ["--json", str(out)] if json_result else []
        path = script_path(script)
        shown = path.relative_to(root) if path.is_relative_to(root) else path
        args = [*map(str, args), *extra]
        command = [*prefix, str(shown), *args]
        fork = (shown, args, nproc) if forkable else None
        result = _run(command, timeout, root, out if json_result else None, check, fork, env)
        result.json_path, result.env, result.root = (str(out) if json_result else None), env, str(root)
        return result


def torchrun(script: str, args: list[str] | tuple = (), nproc: int = 2, timeout: float = 120.0,
             check: bool = True, json_result: bool = True, torchrun_args: list[str] | tuple = (),
             fork: bool = True, env: dict | None = None) -> RunResult:
    """Launch ``scripts/<script>`` on ``nproc`` local processes with ``torchrun --standalone``.

    With ``json_result`` the script gets ``--json <tmpfile>`` appended and its content is
    returned as ``.data``. With ``check=False`` a failing script returns its result instead of
    raising, for chapters and tests that show an error on purpose. ``torchrun_args`` go to
    torchrun itself, e.g. ``["--max-restarts", "1"]`` (chapter 7). With a launch server running
    (the build, the tests) the ranks are forked from it unless ``fork=False`` or ``torchrun_args``
    are given. ``env``: variables set for this launch only, e.g. ``{"PPBOOK_NCCL_RULES": "1"}`` to
    run it under NCCL's rules (:mod:`ppbook.nccl_rules`).
    """
    if nproc < 1:
        raise ValueError(f"nproc must be at least 1, got {nproc}")
    prefix = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
              *map(str, torchrun_args)]
    return _launch(prefix, script, args, timeout, check, json_result, nproc, forkable=fork and not torchrun_args,
                   env=env)


def python(script: str, args: list[str] | tuple = (), timeout: float = 120.0, check: bool = True,
           json_result: bool = True, env: dict | None = None) -> RunResult:
    """Run ``scripts/<script>`` as one plain process (no torchrun), the same way."""
    return _launch([sys.executable], script, args, timeout, check, json_result, None, forkable=True, env=env)


def load_script(name: str | Path):
    """Import ``scripts/<name>`` as a module, to call its functions in a notebook or a test.

    Introduced in the appendices; a script does no work at import (house style), so this only
    defines its functions.
    """
    import importlib.util

    path = script_path(name)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
