"""Shared fixtures. Markers: ``torchrun`` launches processes, ``book`` builds the whole book."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the repository's tools (build_book, make_pdf, make_notebooks, ...) import as modules in every
# test file: pytest imports this file first
sys.path.insert(0, str(ROOT / "tools"))

import make_pdf  # noqa: E402

# One OpenMP thread per process unless the caller sets it: the suite runs the book's pages, its own
# process and the ranks it launches on a few cores at once, and OpenMP's threads spin while they
# wait for one another, so with a thread per core in every process a small operation waits for a
# thread that is not running (an in-process device check took 38 s beside the book build, 1 s with
# one thread). Set before torch loads, so the book build and every launch inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _worker(config) -> bool:
    """Whether this is a worker of ``pytest -n N`` (pytest-xdist; ``make test`` runs three)."""
    return hasattr(config, "workerinput")


def _controller(config) -> bool:
    """Whether this process hands the tests to ``pytest -n N``'s workers and runs none itself."""
    return not _worker(config) and bool(getattr(config.option, "numprocesses", None))


@pytest.hookimpl(trylast=True)  # after pytest's own (the controller's servers log in its temporary folders)
def pytest_configure(config):
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))  # in case a plugin loaded torch first
    config.addinivalue_line("markers", "torchrun: launches processes (a script under torchrun, or alone); "
                                       "make test-fast leaves these out")
    config.addinivalue_line("markers", "book: builds the whole book or drives a browser")
    if _controller(config):
        start_servers(config)  # before the workers start: they inherit the servers' sockets
        os.environ[SHARED_ENV] = str(config._tmp_path_factory.mktemp("shared"))


#: The whole book from an empty cache: about 11 minutes on an idle 2-core machine, and longer while
#: the other tests share the cores with it. The build is one subprocess with its own timeout.
BOOK_BUILD_TIMEOUT_S = 3000
PDF_TIMEOUT_S = 600


#: Under ``pytest -n N``, the niceness of a worker once it runs a test that does not read the book:
#: the book build is the session's longest task, and the tests beside it take what it leaves.
WORKER_NICE = 10


def pytest_runtest_setup(item):
    """A worker of ``pytest -n N`` yields the CPU to the book build (which its worker started at
    the default priority, in a session of its own) from its first test that does not read the
    book; its launches, forked by the launch server, run at its priority too, in sessions of their
    own as nice (ppbook_tools.zygote.group_nice). The workers' own session is left as it is: it is
    the terminal's, and a session is never made less nice again."""
    if _worker(item.config) and not _uses_book(item) and os.nice(0) < WORKER_NICE:
        os.nice(WORKER_NICE - os.nice(0))


@pytest.fixture(scope="session", autouse=True)
def nccl_rules_by_default():
    """Every launch of the tests runs under NCCL's rules on gloo (PPBOOK_NCCL_RULES=1,
    ppbook.nccl_rules) unless the variable is set already: a script that races or hangs only on
    NCCL fails its --check here. Set when the first test starts; the book build does not get it
    (:data:`BUILD_ENV`): the pages show gloo as it is, and appendix A3 runs the mode itself."""
    os.environ.setdefault("PPBOOK_NCCL_RULES", "1")
    yield


#: The environment the session started with, which the book build gets whenever it starts (under
#: ``pytest -n N``, in the middle of a worker's first test): not the NCCL rules set above, not the
#: name of the test that happened to start it.
BUILD_ENV = dict(os.environ)


def missing_tool(name: str, hint: str = "run tools/ensure_chromium.sh") -> None:
    """A browser or PDF tool is not installed: a failure in CI, where `make test` installs it
    (tools/ensure_chromium.sh), and a skip elsewhere."""
    if os.environ.get("CI"):
        pytest.fail(f"{name} is missing in CI: `make test` should have installed it (tools/ensure_chromium.sh)")
    pytest.skip(f"no {name} here; {hint}")


def _uses_book(item) -> bool:
    return "built_book" in getattr(item, "fixturenames", ())


@pytest.hookimpl(trylast=True)  # after -m / -k have deselected: these are the tests that will run
def pytest_collection_modifyitems(config, items):
    """In one process: the tests that use the built book run last, so the build (started in the
    background when collection ends) overlaps every other test instead of stalling the session;
    the first of them waits for what is left of the build, so each gets room for the whole build.
    Under ``pytest -n N`` they go first (:func:`order_for_workers`)."""
    book = [item for item in items if _uses_book(item)]
    if _worker(config):
        order_for_workers(items)
    else:
        items[:] = [item for item in items if not _uses_book(item)] + book
    for item in book:
        item.add_marker(pytest.mark.timeout(BOOK_BUILD_TIMEOUT_S + 600))


#: Under ``pytest -n N``: the folder (named by this variable) where the workers write which tests
#: read the built book, for the controller's scheduler (:func:`pytest_xdist_make_scheduler`)
SHARED_ENV = "PPBOOK_TEST_SHARED"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's scheduler, handing out work a unit at a time: every test that reads the built
    book is one unit (so one worker builds it), every other test file one unit (its fixtures, such
    as the planner page in a browser, set up once), in the workers' order (:func:`order_for_workers`).
    xdist's own ``--dist loadgroup`` cannot say this under pytest 9 (it renames ``item._nodeid``,
    which pytest 9 no longer reads)."""
    import json

    from xdist.scheduler import LoadScopeScheduling

    class ByFileAndBook(LoadScopeScheduling):
        book: set[str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.book is None:
                self.book = set(json.loads((Path(os.environ[SHARED_ENV]) / "book.json").read_text()))
            return "book" if nodeid in self.book else nodeid.split("::", 1)[0]

    return ByFileAndBook(config, log)


def order_for_workers(items) -> None:
    """Under ``pytest -n N`` (``make test``): the tests that use the built book are one unit of work
    (:func:`pytest_xdist_make_scheduler`), handed out first, so that one worker starts the build
    at once (the first of them starts it) and waits for it while the others run every other test;
    the rest go out a test file at a time (a file's fixtures, such as the planner page in a
    browser, are set up once), the files with the most launches and browser sessions first, so
    that the last to finish are short (the planner's parity tests in chromium, about 85 CPU-s,
    finished the session alone while they counted as a file of quick tests)."""
    book = [item for item in items if _uses_book(item)]
    rest = [item for item in items if not _uses_book(item)]
    weight: dict[str, float] = {}
    for item in rest:
        heavy = item.get_closest_marker("torchrun") or item.get_closest_marker("slow") \
            or "chromium" in getattr(item, "fixturenames", ())
        weight[item.nodeid.split("::")[0]] = weight.get(item.nodeid.split("::")[0], 0.0) + (1.0 if heavy else 0.01)
    rest.sort(key=lambda item: -weight[item.nodeid.split("::")[0]])  # stable: a file's order kept
    items[:] = book + rest


class BookBuild:
    """``make book``'s build (``tools/build_book.py``) into a fresh folder, running in the background."""

    def __init__(self, config, pdf: bool = False):
        self.out = config._tmp_path_factory.mktemp("book")  # pytest's basetemp: the last 3 sessions kept
        self.log = self.out / "build.log"
        # ``make pdf`` of this build, started the moment it ends: in a folder of its own, since its
        # singlehtml build rewrites jupyter_execute/, which other tests read
        self.pdf_out = config._tmp_path_factory.mktemp("pdf") if pdf else None
        self.pdf_proc = None
        self.pdf_decided = threading.Event()  # set once the PDF has started, or will not
        self.lock = threading.Lock()
        self.stopped = False
        cmd = [sys.executable, str(ROOT / "tools" / "build_book.py"), "--path-output", str(self.out)]
        with open(self.log, "w") as log:
            env = {**BUILD_ENV, **{k: v for k, v in os.environ.items() if k.startswith("PPBOOK_")}}
            env.pop("PYTEST_CURRENT_TEST", None)
            if "PPBOOK_NCCL_RULES" in BUILD_ENV:
                env["PPBOOK_NCCL_RULES"] = BUILD_ENV["PPBOOK_NCCL_RULES"]
            else:
                env.pop("PPBOOK_NCCL_RULES", None)
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        self.started = time.monotonic()
        self.deadline = self.started + BOOK_BUILD_TIMEOUT_S
        self.ended = self.waited = None
        threading.Thread(target=self._note_the_end, daemon=True).start()

    def _note_the_end(self) -> None:
        self.proc.wait()
        self.ended = time.monotonic()
        try:
            with self.lock:
                if self.pdf_out is not None and self.proc.returncode == 0 and not self.stopped \
                        and make_pdf.chromium_path() is not None:
                    # the execution cache and Sphinx's pickled environment, as `make pdf` finds them
                    # after `make book`: the singlehtml build then reads no page again, and writes
                    for kept in (".jupyter_cache", ".doctrees"):
                        shutil.copytree(self.out / "_build" / kept, self.pdf_out / "_build" / kept)
                    with open(self.pdf_out / "pdf.log", "w") as log:
                        self.pdf_proc = subprocess.Popen(
                            [sys.executable, str(ROOT / "tools" / "make_pdf.py"), "--path-output", str(self.pdf_out)],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
                    self.pdf_deadline = time.monotonic() + PDF_TIMEOUT_S
        finally:
            self.pdf_decided.set()

    def wait(self) -> Path:
        from ppbook import launch

        t0 = time.monotonic()
        try:
            self.proc.wait(timeout=max(1.0, self.deadline - time.monotonic()))
            if self.waited is None:
                self.waited = time.monotonic() - t0
        except subprocess.TimeoutExpired:
            launch.kill_tree(self.proc.pid)
            pytest.fail(f"the book build took over {BOOK_BUILD_TIMEOUT_S} s (killed); log: {self.log}")
        text = self.log.read_text()
        assert self.proc.returncode == 0, f"book build failed (exit {self.proc.returncode}):\n{text[-6000:]}"
        html = self.out / "_build" / "html"
        assert (html / "index.html").is_file(), text[-3000:]
        return html

    def wait_pdf(self) -> Path:
        """The folder of the PDF made from this build (``make pdf --path-output``)."""
        from ppbook import launch

        self.wait()
        if not self.pdf_decided.wait(timeout=120):  # a copy of a few MB after the build's end
            pytest.fail("the PDF build had not started 120 s after the book build ended (copying its execution cache)")
        if self.pdf_proc is None:
            if make_pdf.chromium_path() is None:
                missing_tool("chromium")
            pytest.fail("the PDF build did not start: the session asked for no PDF when collection ended, "
                        "or copying the execution cache failed (its traceback is above)")
        try:
            self.pdf_proc.wait(timeout=max(1.0, self.pdf_deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            launch.kill_tree(self.pdf_proc.pid)
            pytest.fail(f"the PDF build took over {PDF_TIMEOUT_S} s (killed); log: {self.pdf_out / 'pdf.log'}")
        text = (self.pdf_out / "pdf.log").read_text()
        assert self.pdf_proc.returncode == 0, f"make pdf failed (exit {self.pdf_proc.returncode}):\n{text[-6000:]}"
        return self.pdf_out / "_build" / "pdf"

    def summary(self) -> str:
        waited = f"; the tests that read it waited {self.waited:.0f} s for it" if self.waited is not None else ""
        return (f"book build: {self.ended - self.started:.0f} s from its start (exit {self.proc.returncode})"
                f"{waited}")

    def stop(self) -> None:
        from ppbook import launch

        with self.lock:
            self.stopped = True
        for proc in (self.proc, self.pdf_proc):
            if proc is not None and proc.poll() is None:
                launch.kill_tree(proc.pid)


BOOK_KEY = pytest.StashKey[BookBuild]()
BUILD_LINE_KEY = pytest.StashKey[str]()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist: a worker ended; the one that built the book says how long it took."""
    line = getattr(node, "workeroutput", {}).get("ppbook_book_build")
    if line:
        node.config.stash[BUILD_LINE_KEY] = line


ZYGOTE_KEY = pytest.StashKey[list]()


def pytest_collection_finish(session):
    if _worker(session.config) and os.environ.get(SHARED_ENV):  # for the scheduler (every worker collects the same)
        import json

        book = Path(os.environ[SHARED_ENV]) / "book.json"
        temp = book.with_name(f"book-{os.getpid()}.json")
        temp.write_text(json.dumps([item.nodeid for item in session.items if _uses_book(item)]))
        temp.replace(book)
    if session.config.option.collectonly:
        return
    from ppbook_tools import zygote

    launches = any(_uses_book(item) or item.get_closest_marker("torchrun") for item in session.items)
    if launches and not os.environ.get(zygote.ENV):
        start_servers(session.config)
    elif os.environ.get(zygote.ENV):
        zygote.plug_in()  # a server of the process that started this session (a build's, a test's)
    if any(_uses_book(item) for item in session.items) and not _worker(session.config):
        session.config.stash[BOOK_KEY] = BookBuild(session.config, pdf=_wants_pdf(session))
    # (a worker of pytest -n N starts the build when the first test that reads it runs: the group of
    # those tests is handed out first)


def _wants_pdf(session) -> bool:
    return any("built_pdf" in getattr(item, "fixturenames", ()) for item in session.items)


def start_servers(config) -> None:
    """One launch server for the session, the book build's pages included: the tests' launches fork
    their ranks from it instead of importing torch in three fresh processes each (ppbook_tools.zygote).
    And one server of pages' kernels (ppbook_tools.kernel) for every build the session runs, the
    book's and the one-page books of tests/test_book.py, which would each start their own. Under
    ``pytest -n N`` the process that starts the workers starts both, and every worker uses them."""
    from ppbook import launch
    from ppbook_tools import zygote

    if os.environ.get(zygote.FORCE_TORCHRUN) == "torchrun":
        return
    logs = config._tmp_path_factory.mktemp("zygote")
    config.stash[ZYGOTE_KEY] = [zygote.start(launch.child_env(), log=logs / "zygote.log"),
                                zygote.start(dict(os.environ), log=logs / "kernels.log", kernels=True)]


def pytest_sessionfinish(session):
    build = session.config.stash.get(BOOK_KEY, None)
    if build is not None:
        build.stop()  # a session cut short (-x, Ctrl-C) leaves no build running
        if _worker(session.config) and build.ended is not None:  # for the summary the controller prints
            session.config.workeroutput["ppbook_book_build"] = build.summary()
    for server in session.config.stash.get(ZYGOTE_KEY, []):
        from ppbook_tools import zygote

        zygote.stop(server)


def pytest_terminal_summary(terminalreporter, config):
    """Where the session's time went around the book build, for the CI log."""
    build = config.stash.get(BOOK_KEY, None)
    line = build.summary() if build is not None and build.ended is not None else config.stash.get(BUILD_LINE_KEY, None)
    if line:
        terminalreporter.write_line(line)
    # The machine is CPU-bound through the suite: this, over the cores, is the floor of its wall time.
    import resource

    used = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    terminalreporter.write_line(f"CPU: {sum(u.ru_utime + u.ru_stime for u in used):.0f} s (user + system) in "
                                "pytest and every process it waited for: the book build, the launches, the browser")


@pytest.fixture(scope="session")
def chromium():
    """Headless Chromium (Debian's, driven by playwright with make_pdf's flags), once per
    session: the site's browser tests and the planner page's equality test share it."""
    exe = make_pdf.chromium_path()
    if exe is None:
        missing_tool("chromium", "run tools/ensure_chromium.sh or set PPBOOK_CHROMIUM")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=make_pdf.FLAGS)
        yield browser
        browser.close()


@pytest.fixture(scope="session")
def built_book(request) -> Path:
    """The whole book built once per session from an EMPTY execution cache, under -W -n
    (``build.log`` beside ``_build``).

    jupyter-cache keys on code cells only, so a cache kept from an earlier build would hide a
    change in scripts/ or src/; building into a fresh output folder guarantees a cold cache.
    """
    build = request.config.stash.get(BOOK_KEY, None)
    if build is None:  # a worker of pytest -n N, or a session whose collection did not start it
        if _worker(request.config) and os.environ.get(SHARED_ENV):
            try:  # one build per session: the scheduler hands every test that reads it to one worker
                (Path(os.environ[SHARED_ENV]) / "book-build").open("x").write(request.config.workerinput["workerid"])
            except FileExistsError:
                pytest.fail("another worker builds the book already: the scheduler split the tests that read it "
                            "(tests/conftest.py, pytest_xdist_make_scheduler)")
        build = request.config.stash[BOOK_KEY] = BookBuild(request.config, pdf=_wants_pdf(request.session))
    return build.wait()


@pytest.fixture(scope="session")
def built_pdf(built_book, request) -> Path:
    """``make pdf`` of the session's build (its ``_build/pdf`` folder). It runs in the background
    from the moment the build ends, beside the tests that read the HTML, instead of after them:
    the singlehtml build (from the HTML build's parsed pages) and chromium's printing take about a
    minute of CPU."""
    return request.config.stash[BOOK_KEY].wait_pdf()


def assert_one_error_line(result, script: str, message: str) -> None:
    """Bad input: a non-zero exit and exactly one distinct ``<script>: error:`` line, saying ``message``
    (rank 0 prints it, the others wait for it before they exit: :func:`ppbook.cli.run`)."""
    assert result.returncode != 0
    errors = sorted({line for line in result.output.splitlines() if line.startswith(f"{script}: error:")})
    assert len(errors) == 1 and message in errors[0], result.output


def refusal(script: str, args: list, world_size: int = 2) -> str:
    """The message ``scripts/<script>`` refuses ``args`` with at ``world_size`` processes, found
    in this process: the script's pure ``validate(args, world_size)`` (what it runs on every rank
    before any process group), so a bad flag costs no torchrun launch. Fails if it accepts them.

    That a refusal reaches the terminal as one line and exit status 2 on every rank is the
    launcher's part, tested once end to end under torchrun (``tests/test_scaling_out.py``).
    """
    from ppbook import launch

    module = launch.load_script(script)
    validate = getattr(module, "validate", None) or module.cli.validate_common  # scripts with no checks of their own
    with pytest.raises(ValueError) as err:
        validate(module.parse_args([str(a) for a in args]), world_size)
    return str(err.value)


def assert_one_line_error(script: str, args: list, message: str, nproc: int = 2) -> None:
    """``script`` refuses bad ``args`` at ``nproc`` processes with one line saying ``message``
    (checked in-process: see :func:`refusal`)."""
    text = refusal(script, args, nproc)
    assert message in text and "\n" not in text, text


def argparse_refusal(script: str, args: list, capsys) -> str:
    """What argparse prints when ``scripts/<script>`` is given ``args`` it cannot parse (exit status 2)."""
    from ppbook import launch

    module = launch.load_script(script)
    with pytest.raises(SystemExit) as err:
        module.parse_args([str(a) for a in args])
    assert err.value.code == 2
    return capsys.readouterr().err
