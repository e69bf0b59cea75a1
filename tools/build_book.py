"""Build the book: execute its pages two at a time, then render them with Jupyter Book.

myst-nb executes a page when Sphinx reads it, one page after another, and a page leaves part of
two cores idle (they were 70% busy on average through a serial build). This runs the pages'
notebooks ``--jobs`` at a time and stores each executed notebook in the execution cache just as
myst-nb does (the same notebook read from the same MyST file, the same working folder, timeout
and error policy, all from ``_config.yml``), so ``jupyter-book build`` then finds every page in
the cache and only renders. A page that fails stops the build with its traceback.

myst-nb writes ``_build/jupyter_execute/<page>.ipynb`` without outputs when it takes a page from the
cache (it saves the notebook it read, not the one it merged), and the download copies and Colab
notebooks (``tools/make_notebooks.py``) are made from those files; so after rendering, this writes
them again from the cache, with their outputs.

Pages that measure wall-clock time for their figures (``ppbook: {execute_alone: true}`` in their
front matter) run while no other page does, so that their numbers are not another page's noise.

    python tools/build_book.py                      # what `make book` runs (from an empty cache)
    python tools/build_book.py --path-output DIR    # into DIR/_build, as the tests build
    python tools/build_book.py --jobs 1             # one page at a time
    python tools/build_book.py --keep-cache         # execute only pages whose code changed (`make book-cached`)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_notebooks import notebook_pages  # noqa: E402
from machine_paths import hide_in_notebook  # noqa: E402


def read_page(page: Path):
    """The notebook myst-nb reads from ``page`` (its code cells and kernelspec are the cache key)."""
    from myst_nb.core.read import read_myst_markdown_notebook

    return read_myst_markdown_notebook(page.read_text("utf8"), add_source_map=True, path=str(page))


def executes_alone(notebook) -> bool:
    return bool(notebook.metadata.get("ppbook", {}).get("execute_alone", False))


#: The page's kernel plugs the launch server in (``ppbook_tools.zygote.load_ipython_extension``) before
#: its first cell, so that its launches fork from the server when one runs; ``ppbook`` never imports it.
KERNEL_ARGS = ["--IPKernelApp.extensions=ppbook_tools.zygote"]


def kernel_manager():
    """nbclient's kernel manager, starting ``ppbook_tools.kernel`` where the kernel spec says
    ``-m ipykernel_launcher``: the page's kernel forks from the launch server, torch imported, when
    one runs, and is ``ipykernel_launcher`` itself otherwise."""
    from jupyter_client.manager import AsyncKernelManager

    class ForkedKernelManager(AsyncKernelManager):
        def format_kernel_cmd(self, extra_arguments=None):
            cmd = super().format_kernel_cmd(extra_arguments)
            return [*cmd[:1], *(["-m", "ppbook_tools.kernel"] if cmd[1:3] == ["-m", "ipykernel_launcher"]
                                else cmd[1:3]), *cmd[3:]]

    return ForkedKernelManager


def execute(page: Path, timeout: int, allow_errors: bool):
    """Run ``page``'s notebook in its own folder (a worker process): (notebook, seconds, error text)."""
    from jupyter_cache.executors.utils import single_nb_execution

    notebook = read_page(page)
    result = single_nb_execution(notebook, cwd=str(page.parent), allow_errors=allow_errors, timeout=timeout,
                                 meta_override=True, extra_arguments=KERNEL_ARGS,
                                 kernel_manager_class=kernel_manager())
    hide_in_notebook(notebook)  # no page shows the build machine's paths (tracebacks, warnings)
    return notebook, result.time, (result.exc_string if result.err is not None else None)


def may_start(page: Path, running: set[Path], alone: set[Path], jobs: int) -> bool:
    """Whether ``page`` may start while ``running`` run: a free worker, no page running alone, and
    for a page that runs alone, nothing running at all."""
    return len(running) < jobs and not running & alone and not (page in alone and running)


def order(pages: list[Path]) -> list[Path]:
    """The pages that run alone first (nothing else is running yet), then the others in toc order."""
    alone = [p for p in pages if executes_alone(read_page(p))]
    return alone + [p for p in pages if p not in alone]


def cached(cache, page: Path) -> bool:
    """Whether the cache holds ``page`` executed with its current code cells."""
    try:
        cache.match_cache_notebook(read_page(page))
    except KeyError:
        return False
    return True


def write_executed(root: Path, build: Path) -> None:
    """Write every page's executed notebook, outputs included, where myst-nb writes it."""
    import nbformat
    from jupyter_cache import get_cache

    cache = get_cache(str(build / ".jupyter_cache"))
    for page in notebook_pages(root):
        _, notebook = cache.merge_match_into_notebook(read_page(page))
        out = build / "jupyter_execute" / page.relative_to(root).with_suffix(".ipynb")
        out.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(notebook, out)


def execute_pages(root: Path, cache_dir: Path, jobs: int) -> int:
    """Execute every notebook page of ``root``'s book into the jupyter-cache at ``cache_dir``."""
    execute_cfg = yaml.safe_load((root / "_config.yml").read_text()).get("execute", {})
    if execute_cfg.get("execute_notebooks", "auto") in ("off", False):
        return 0
    if execute_cfg.get("run_in_temp", False):
        raise SystemExit("build_book.py: error: execute.run_in_temp is set in _config.yml; "
                         "this tool runs pages in their own folder, as the book's pages expect")
    timeout, allow_errors = int(execute_cfg.get("timeout", 30)), bool(execute_cfg.get("allow_errors", False))
    cache_dir.mkdir(parents=True, exist_ok=True)
    with servers(cache_dir.parent):
        return _execute_pages(root, cache_dir, jobs, timeout, allow_errors)


@contextlib.contextmanager
def servers(logs: Path):
    """The pages' launches fork their ranks from one launch server (ppbook_tools.zygote), unless the
    caller runs one already (the tests do) or asks for torchrun itself (PPBOOK_LAUNCHER=torchrun);
    their kernels fork from a server of their own (``ppbook_tools.kernel``), which has the build's
    environment, as a kernel does. Logs ``zygote.log`` and ``kernels.log`` in ``logs``. A launch
    that one page makes after another made it identically is answered with that run
    (``PPBOOK_LAUNCH_MEMO``, :func:`ppbook_tools.zygote.memo_key`): each launch runs once a build."""
    from ppbook import launch
    from ppbook_tools import zygote

    started = []
    if os.environ.get(zygote.FORCE_TORCHRUN) != "torchrun":
        if not os.environ.get(zygote.ENV):
            started.append(zygote.start(launch.child_env(), log=logs / "zygote.log"))
        if not os.environ.get(zygote.KERNEL_ENV):
            started.append(zygote.start(dict(os.environ), log=logs / "kernels.log", kernels=True))
    memo = tempfile.mkdtemp(prefix="ppbook-memo-")
    os.environ[zygote.MEMO_ENV] = memo  # the pages' kernels inherit it
    try:
        yield
    finally:
        os.environ.pop(zygote.MEMO_ENV, None)
        answered = Path(memo) / zygote.ANSWERED
        for line in answered.read_text().splitlines() if answered.is_file() else []:
            print(f"answered from an identical earlier launch: {line}", flush=True)
        shutil.rmtree(memo, ignore_errors=True)
        for server in started:
            zygote.stop(server)


def _execute_pages(root: Path, cache_dir: Path, jobs: int, timeout: int, allow_errors: bool) -> int:
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn
    from tqdm import tqdm

    cache = get_cache(str(cache_dir))
    queue = order([page for page in notebook_pages(root) if not cached(cache, page)])
    alone = {p for p in queue if executes_alone(read_page(p))}
    running, failed = {}, []
    bar = tqdm(total=len(queue), desc="executing pages", unit="page", file=sys.stdout, disable=None)
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        while queue or running:
            while queue and not failed and may_start(queue[0], set(running.values()), alone, jobs):
                page = queue.pop(0)
                running[pool.submit(execute, page, timeout, allow_errors)] = page
            if not running:
                break
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                page = running.pop(future)
                notebook, seconds, error = future.result()
                shown = page.relative_to(root) if page.is_relative_to(root) else page
                bar.update()
                if error is not None:
                    failed.append(page)
                    tqdm.write(f"{shown}: executing the notebook failed\n{error}", file=sys.stderr)
                    continue
                cache.cache_notebook_bundle(CacheBundleIn(notebook, str(page), data={"execution_seconds": seconds}),
                                            check_validity=False, overwrite=True)
                tqdm.write(f"{shown}: Executed notebook in {seconds:.2f} seconds")
    bar.close()
    if failed:
        print(f"build_book.py: error: {len(failed)} page(s) failed to execute: "
              + ", ".join(p.stem for p in failed) + " (tracebacks above)", file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="build_book.py", description=__doc__.split("\n")[0])
    p.add_argument("--root", type=Path, default=ROOT, help="the book's folder (default: this repository)")
    p.add_argument("--path-output", type=Path, default=None,
                   help="build into DIR/_build instead of the book's own _build (jupyter-book's --path-output)")
    p.add_argument("--jobs", type=int, default=2, help="pages executed at once (default: %(default)s)")
    p.add_argument("--keep-cache", action="store_true",
                   help="keep the execution cache and execute only the pages whose code cells changed "
                        "(stale after a change in scripts/ or src/)")
    args = p.parse_args(argv)
    if args.jobs < 1:
        p.error(f"--jobs must be at least 1, got {args.jobs}")
    root = args.root.resolve()
    if not (root / "_toc.yml").is_file():
        p.error(f"--root {args.root} has no _toc.yml: pass the folder of the book (the repository root)")
    build = (args.path_output.resolve() if args.path_output else root) / "_build"
    # from an empty cache unless asked: jupyter-cache keys on code cells only, so a kept cache would
    # keep stale outputs after a change in scripts/ or src/
    for stale in ((), (".jupyter_cache",))[not args.keep_cache] + ("html", "jupyter_execute"):
        shutil.rmtree(build / stale, ignore_errors=True)
    # Each page's kernel and each rank it launches get their share of the cores, no more: OpenMP's
    # threads spin while they wait for one another, so with more threads than cores (two pages at
    # once, each with a thread per core) a small operation waits for a thread that is not running,
    # and pages took several times as long. A reader's own OMP_NUM_THREADS is kept.
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.jobs)))
    t0 = time.perf_counter()
    status = execute_pages(root, build / ".jupyter_cache", args.jobs)
    if status:
        return status
    print(f"executed every page in {time.perf_counter() - t0:.0f} s; rendering", flush=True)
    cmd = [str(Path(sys.executable).with_name("jupyter-book")), "build", str(root), "--all", "-W", "-n",
           "--keep-going"]
    if args.path_output:
        cmd += ["--path-output", str(args.path_output.resolve())]
    status = subprocess.run(cmd, cwd=root, env=os.environ).returncode
    if status == 0:
        write_executed(root, build)
    return status


if __name__ == "__main__":
    sys.exit(main())
