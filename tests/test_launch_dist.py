import os
import textwrap

import pytest
import torch.distributed as dist

from ppbook import dist as ppdist
from ppbook import launch


def write(tmp_path, body: str):
    path = tmp_path / "probe.py"
    path.write_text(textwrap.dedent(body))
    return path


def test_json_result_and_shell_command(tmp_path):
    script = write(tmp_path, """
        import json, sys
        path = sys.argv[sys.argv.index("--json") + 1]
        json.dump({"args": sys.argv[1:-2]}, open(path, "w"))
        print("hello")
    """)
    r = launch.python(script, ["--x", 1], timeout=30)
    assert r.data == {"args": ["--x", "1"]}
    assert r.returncode == 0 and "hello" in r.output
    assert r.shell_command.startswith("python ")


def test_failure_raises_with_output(tmp_path):
    script = write(tmp_path, "import sys; print('boom on stdout'); sys.exit(3)")
    with pytest.raises(launch.LaunchError, match="exit status 3") as err:
        launch.python(script, timeout=30)
    assert "boom on stdout" in str(err.value)
    r = launch.python(script, timeout=30, check=False)
    assert r.returncode == 3 and r.data is None


def test_missing_json_is_an_error(tmp_path):
    script = write(tmp_path, "print('forgot to write json')")
    with pytest.raises(launch.LaunchError, match="wrote no JSON"):
        launch.python(script, timeout=30)


@pytest.mark.torchrun
def test_timeout_kills_every_rank(tmp_path):
    """A hanging torchrun job (all ranks asleep) is killed at the timeout, never waited on."""
    script = write(tmp_path, "import time; time.sleep(600)")
    with pytest.raises(launch.LaunchError, match="timed out"):
        launch.torchrun(script, nproc=2, timeout=8, json_result=False)


def test_missing_script_and_bad_nproc():
    with pytest.raises(launch.LaunchError, match="no such script"):
        launch.python("does_not_exist.py")
    with pytest.raises(ValueError, match="nproc"):
        launch.torchrun("01_first_pipeline.py", nproc=0)


def test_repo_root_found_from_book_folder():
    root = launch.repo_root()
    assert launch.repo_root(root / "book") == root
    assert (root / "_toc.yml").is_file()


def test_one_process_fallback(monkeypatch):
    for var in ppdist.TORCHRUN_VARS:
        monkeypatch.delenv(var, raising=False)
    assert not ppdist.launched_by_torchrun()
    info = ppdist.setup("cpu")
    try:
        assert (info.rank, info.world_size, info.backend) == (0, 1, "gloo")
        assert info.is_first and info.is_last
        assert dist.get_world_size() == 1
        assert ppdist.gather_to_rank0({"a": 1}) == [{"a": 1}]
    finally:
        ppdist.teardown()
    assert not dist.is_initialized()


def test_device_choice():
    assert ppdist.pick_device(0, "cpu").type == "cpu"
    with pytest.raises(ValueError, match="--device"):
        ppdist.pick_device(0, "tpu")
    import torch
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="use --device cpu"):
            ppdist.pick_device(0, "cuda")


# ------------------------------------------------------------------ the launch server (ppbook_tools.zygote)

ENV_PROBE = """
    import json, os, sys
    import torch, torch.distributed as dist
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME",
             "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "TORCHELASTIC_RESTART_COUNT",
             "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE", "OMP_NUM_THREADS",
             "TORCHINDUCTOR_CACHE_DIR", "PYTHONUNBUFFERED", "TQDM_DISABLE")
    dist.init_process_group("gloo")
    mine = {"env": {n: os.environ.get(n) for n in names}, "threads": torch.get_num_threads(),
            "argv": sys.argv[:-2], "cwd": os.getcwd(), "path0": sys.path[0], "name": __name__,
            "sum": float(torch.ones(3).sum() * (dist.get_rank() + 1))}
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    if dist.get_rank() == 0:
        json.dump(everyone, open(sys.argv[sys.argv.index("--json") + 1], "w"))
    dist.destroy_process_group()
"""


@pytest.fixture
def server():
    from ppbook_tools import zygote

    if not os.environ.get(zygote.ENV):
        pytest.skip("no launch server in this session (PPBOOK_LAUNCHER=torchrun)")
    return zygote


@pytest.mark.torchrun
def test_forked_ranks_see_what_torchrun_gives_them(tmp_path, server, monkeypatch):
    """The same probe under torchrun and forked from the server: every rank's environment,
    thread count, argv, folder and ``__name__`` agree, and the ranks talk through the store."""
    script = write(tmp_path, ENV_PROBE)
    forked = launch.torchrun(script, ["--x", "1"], nproc=2, timeout=60)
    monkeypatch.setenv(server.FORCE_TORCHRUN, "torchrun")
    started = launch.torchrun(script, ["--x", "1"], nproc=2, timeout=120)
    assert forked.forked and not started.forked
    assert forked.shell_command == started.shell_command.replace(started.command[-1], forked.command[-1])
    assert forked.data == started.data
    assert [r["env"]["RANK"] for r in forked.data] == ["0", "1"]
    assert forked.data[0]["threads"] == 1 and forked.data[0]["name"] == "__main__"


@pytest.mark.torchrun
@pytest.mark.parametrize("omp", [None, "1", "2"])
def test_a_forked_plain_process_takes_the_threads_a_fresh_one_would(tmp_path, server, monkeypatch, omp):
    """OpenMP read the server's OMP_NUM_THREADS when it loaded torch; a forked plain process
    still gets the launch's own (or one thread per CPU when it has none)."""
    script = write(tmp_path, """
        import json, os, sys, torch
        json.dump({"threads": torch.get_num_threads(), "omp": os.environ.get("OMP_NUM_THREADS")},
                  open(sys.argv[sys.argv.index("--json") + 1], "w"))
    """)
    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    forked = launch.python(script, timeout=60)
    monkeypatch.setenv(server.FORCE_TORCHRUN, "torchrun")
    fresh = launch.python(script, timeout=60)
    assert forked.forked and not fresh.forked
    assert forked.data == fresh.data and fresh.data["omp"] == omp


@pytest.mark.torchrun
def test_forked_pipeline_has_the_bits_of_torchrun(server, monkeypatch):
    forked = launch.torchrun("01_first_pipeline.py", nproc=2, timeout=60)
    monkeypatch.setenv(server.FORCE_TORCHRUN, "torchrun")
    started = launch.torchrun("01_first_pipeline.py", nproc=2, timeout=120)
    assert forked.forked and not started.forked
    same = ("pipeline_losses", "reference_losses", "layers_per_stage", "match")
    assert {k: forked.data[k] for k in same} == {k: started.data[k] for k in same}
    for mine, theirs in zip(forked.data["stages"], started.data["stages"], strict=True):  # all but the time
        assert {**mine, "seconds": None} == {**theirs, "seconds": None}


@pytest.mark.torchrun
def test_a_failing_rank_stops_the_others_with_exit_status_1(tmp_path, server):
    """As torchrun: one rank raises, the other (asleep) is stopped, the launch exits 1, and the
    traceback carries init_process_group's ``[rank1]:`` prefix."""
    script = write(tmp_path, """
        import time, torch.distributed as dist
        dist.init_process_group("gloo")
        if dist.get_rank() == 1:
            raise ValueError("rank 1 made a mistake")
        time.sleep(600)
    """)
    r = launch.torchrun(script, nproc=2, timeout=120, check=False, json_result=False)
    assert r.forked and r.returncode == 1
    assert "[rank1]: ValueError: rank 1 made a mistake" in r.output


@pytest.mark.torchrun
def test_a_peer_of_a_failed_rank_has_time_to_say_why_it_failed(tmp_path, server):
    """The others are not stopped the instant one rank exits: a peer whose receive ended with the
    failed rank's connection reports it, as under torchrun (chapter A3 shows both messages).
    Stopped at once, the peer below lost its line every time; the server waits NOTICE seconds."""
    script = write(tmp_path, """
        import sys, time, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        if dist.get_rank() == 1:
            raise ValueError("rank 1 made a mistake")
        try:
            dist.recv(torch.zeros(1), src=1)
        except RuntimeError:
            time.sleep(0.2)  # a peer that takes a moment to report, as a long traceback does
            print("rank 0: lost my peer", flush=True)
            sys.exit(1)
    """)
    r = launch.torchrun(script, nproc=2, timeout=120, check=False, json_result=False)
    assert r.forked and r.returncode == 1
    assert "[rank1]: ValueError: rank 1 made a mistake" in r.output and "rank 0: lost my peer" in r.output, r.output


@pytest.mark.torchrun
def test_an_environment_torch_reads_at_import_runs_torchrun(tmp_path, server, monkeypatch):
    """A variable torch reads when it starts cannot reach a forked rank: such a launch runs torchrun."""
    script = write(tmp_path, ENV_PROBE)
    monkeypatch.setenv("TORCH_CPP_LOG_LEVEL", "ERROR")
    r = launch.torchrun(script, nproc=2, timeout=120)
    assert not r.forked and r.data[1]["env"]["RANK"] == "1"
    assert server._differs({"TORCH_CPP_LOG_LEVEL": "ERROR", "OMP_NUM_THREADS": "3"}, {}) == ["TORCH_CPP_LOG_LEVEL"]


PID_PROBE = """
    import json, os, sys
    args = sys.argv[1:]
    print("pid", os.getpid(), flush=True)
    if "--fail" in args:
        sys.exit(3)
    if "--json" in args and os.environ.get("RANK", "0") == "0":
        json.dump({"pid": os.getpid(), "args": args[:-2]}, open(args[args.index("--json") + 1], "w"))
"""


@pytest.mark.torchrun
def test_the_builds_memo_runs_an_identical_launch_once(tmp_path, server, monkeypatch):
    """In the book's build (PPBOOK_LAUNCH_MEMO, tools/build_book.py) a launch identical to one made
    before returns that run, its JSON, output and seconds: the pid shows the script did not run
    again. Other arguments, another process count, a changed script, a launch that names a file
    and one that failed run each time; so does every launch outside a build."""
    script = write(tmp_path, PID_PROBE)
    monkeypatch.setenv(server.MEMO_ENV, str(tmp_path / "memo"))
    first = launch.torchrun(script, ["--n", 1], nproc=2, timeout=120)
    again = launch.torchrun(script, ["--n", 1], nproc=2, timeout=120)
    assert first.forked and again.data == first.data and again.output == first.output
    assert again.seconds == first.seconds
    pid = first.data["pid"]
    assert launch.torchrun(script, ["--n", 2], nproc=2, timeout=120).data["pid"] != pid
    assert launch.python(script, ["--n", 1], timeout=120).data["pid"] != pid
    named = [launch.python(script, ["--file", tmp_path / "x"], timeout=120).data["pid"] for _ in range(2)]
    failed = [launch.python(script, ["--fail"], timeout=120, check=False, json_result=False).output for _ in range(2)]
    assert named[0] != named[1] and failed[0] != failed[1]
    script.write_text(script.read_text() + "\n# changed\n")
    assert launch.torchrun(script, ["--n", 1], nproc=2, timeout=120).data["pid"] != pid
    # the build prints what was answered so (tools/build_book.py)
    assert (tmp_path / "memo" / server.ANSWERED).read_text().splitlines() == ["probe.py --n 1"]
    monkeypatch.delenv(server.MEMO_ENV)
    outside = [launch.python(script, ["--n", 3], timeout=120).data["pid"] for _ in range(2)]
    assert outside[0] != outside[1]


def test_the_server_ends_with_the_process_that_started_it(tmp_path):
    """A server whose starter dies without stopping it exits too (no stray servers after a
    killed test session)."""
    import subprocess
    import sys

    import psutil

    starter = subprocess.run([sys.executable, "-c", "from ppbook import launch; from ppbook_tools import zygote; "
                              "print(zygote.start(launch.child_env(), log=None).pid)"],
                             capture_output=True, text=True, timeout=60, check=True)
    server = psutil.Process(int(starter.stdout))
    try:
        server.wait(timeout=60)
    except psutil.TimeoutExpired:
        server.kill()
        pytest.fail("the launch server outlived the process that started it")


def test_reader_command_drops_the_launchers_json_and_machine_paths(tmp_path):
    """Pure: what a chapter prints is what a reader types at the repository root."""
    import sys
    import tempfile

    root = "/home/someone/book"
    mine = f"{tempfile.gettempdir()}/ppbook-k2j3x9_q/result.json"
    r = launch.RunResult([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "scripts/03_gpipe.py", "--microbatches", "4", "--dump-dir", f"{root}/_build/a3/flight",
                          "--config", f"{root}/data/x.json", "--json", mine],
                         0, "", 0.0, json_path=mine, env={"PPBOOK_NCCL_RULES": "1"}, root=root)
    assert r.reader_command == ("PPBOOK_NCCL_RULES=1 torchrun --standalone --nproc-per-node 2 scripts/03_gpipe.py "
                                "--microbatches 4 --dump-dir _build/a3/flight --config data/x.json")
    # a --json the reader asked for stays; so does every path outside the repository, one under the
    # temporary folder included, random characters and all (the build's check then reports it)
    made = f"{tempfile.gettempdir()}/flight-ab12cd34"
    own = launch.RunResult([sys.executable, "scripts/x.py", "--json", "/data/out.json", "--dump-dir", made],
                           0, "", 0.0, root=root)
    assert own.reader_command == f"python scripts/x.py --json /data/out.json --dump-dir {made}"


def test_reader_command_of_a_real_launch(tmp_path):
    script = write(tmp_path, """
        import json, sys
        json.dump({}, open(sys.argv[sys.argv.index("--json") + 1], "w"))
    """)
    r = launch.python(script, ["--x", 1], timeout=30, env={"PPBOOK_DEMO": "2"})
    assert "--json" in r.shell_command and "--json" not in r.reader_command
    assert r.reader_command.startswith("PPBOOK_DEMO=2 python ") and r.reader_command.endswith(" --x 1")


@pytest.mark.torchrun
def test_a_launch_whose_caller_is_killed_leaves_no_process_behind(tmp_path, server):
    """The process that asked for a launch dies (a page's kernel killed by Jupyter, a test killed by
    its timeout): the server sees its connection close and kills the launch's processes."""
    import signal
    import subprocess
    import sys
    import time

    script = write(tmp_path, """
        import os, pathlib, sys, time
        pathlib.Path(sys.argv[1]).write_text(str(os.getpid()))
        time.sleep(600)
    """)
    pid_file = tmp_path / "pid"
    caller = subprocess.Popen([sys.executable, "-c",
                               "import sys; from pathlib import Path; from ppbook import launch; from ppbook_tools import zygote; "
                               "r = zygote.run(Path(sys.argv[1]), [sys.argv[2]], None, Path.cwd(), launch.child_env(), 600); "
                               "sys.exit('the server did not take the launch' if r is None else 0)",
                               str(script), str(pid_file)])
    try:
        deadline = time.monotonic() + 60
        while not pid_file.is_file() or not pid_file.read_text():
            assert caller.poll() is None and time.monotonic() < deadline, "the launch did not start"
            time.sleep(0.05)
        pid = int(pid_file.read_text())
        caller.send_signal(signal.SIGKILL)
        caller.wait(timeout=30)
        deadline = time.monotonic() + 30
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(f"/proc/{pid}"), "the launch outlived the process that asked for it"
    finally:
        if caller.poll() is None:
            caller.kill()


@pytest.mark.torchrun
def test_a_forked_launch_runs_at_its_callers_priority(tmp_path, server):
    """A process started by its caller would inherit its niceness; a forked one gets it from the
    server's handler (make test's workers run nicer than the book build they leave the CPU to)."""
    import json
    import subprocess
    import sys

    script = write(tmp_path, """
        import json, os, sys
        json.dump(os.nice(0), open(sys.argv[1], "w"))
    """)
    out = tmp_path / "nice.json"
    code = ("import os, sys; from pathlib import Path; from ppbook import launch; from ppbook_tools import zygote; "
            "os.nice(max(0, 7 - os.nice(0))); "
            "r = zygote.run(Path(sys.argv[1]), [sys.argv[2]], None, Path.cwd(), launch.child_env(), 60); "
            "sys.exit('the server did not take the launch' if r is None else r[0])")
    subprocess.run([sys.executable, "-c", code, str(script), str(out)], check=True, timeout=120)
    assert json.loads(out.read_text()) == max(7, os.nice(0))


# ------------------------------------------------------------------ pages' kernels forked from a server

KERNEL_PROBE = """
import json, os, sys
first = {"torch_loaded": "torch" in sys.modules}
import matplotlib, matplotlib.pyplot as plt, torch
print(json.dumps({**first, "cwd": os.getcwd(), "path0": sys.path[0], "name": __name__, "argv0": sys.argv[0],
                  "backend": matplotlib.get_backend(), "mpl": os.environ.get("MPLBACKEND"),
                  "threads": torch.get_num_threads(), "omp": os.environ.get("OMP_NUM_THREADS"),
                  "parent_is_set": bool(get_ipython().kernel.parent.parent_handle),
                  "extensions": list(get_ipython().kernel.parent.extensions)}))
"""


@pytest.fixture(scope="module")
def kernel_server(tmp_path_factory):
    from ppbook_tools import zygote

    if os.environ.get(zygote.FORCE_TORCHRUN) == "torchrun":
        pytest.skip("forking is off in this session (PPBOOK_LAUNCHER=torchrun)")
    if os.environ.get(zygote.KERNEL_ENV):  # the session's (tests/conftest.py)
        yield zygote
        return
    server = zygote.start(dict(os.environ), log=tmp_path_factory.mktemp("kernels") / "kernels.log", kernels=True)
    yield zygote
    zygote.stop(server)


def run_probe(folder):
    import json

    from build_book import execute

    page = folder / "probe.md"
    page.write_text("---\nkernelspec:\n  name: python3\n  display_name: Python 3\njupytext:\n  text_representation:\n"
                    "    format_name: myst\n---\n\n```{code-cell} ipython3\n" + KERNEL_PROBE + "```\n\n"
                    "```{code-cell} ipython3\nplt.plot([0, 1, 0]); plt.show()\n```\n")
    notebook, _, error = execute(page, timeout=120, allow_errors=False)
    assert error is None, error
    first, figure = notebook.cells[0].outputs, notebook.cells[1].outputs
    probe = json.loads("".join(o.get("text", "") for o in first if o.output_type == "stream"))
    return probe, [o for o in figure if "image/png" in o.get("data", {})]


@pytest.mark.torchrun
def test_a_forked_kernel_runs_a_page_as_a_fresh_kernel_does(tmp_path, kernel_server, monkeypatch):
    """A page run by the build's executor in a kernel forked from the server of kernels (torch
    loaded before its first line) and in a fresh ``ipykernel_launcher``: the same folder, path,
    argv, inline figures, threads, parent and extensions."""
    # a variable the server of kernels does not read (it does not import transformers), set other
    # than in the server (tests/test_hf.py sets it in its worker): the kernel still forks
    monkeypatch.setenv("HF_HUB_OFFLINE", "0" if os.environ.get("HF_HUB_OFFLINE") == "1" else "1")
    forked, forked_figures = run_probe(tmp_path)
    monkeypatch.delenv(kernel_server.KERNEL_ENV)
    fresh, fresh_figures = run_probe(tmp_path)
    assert forked.pop("torch_loaded") and not fresh.pop("torch_loaded")
    assert forked == fresh
    assert fresh["backend"].endswith("backend_inline") and fresh["cwd"] == str(tmp_path)
    assert len(forked_figures) == len(fresh_figures) == 1


@pytest.mark.torchrun
def test_an_interrupt_reaches_a_forked_kernel(tmp_path, kernel_server):
    """Jupyter interrupts a kernel (a cell past its timeout, the stop button) with SIGINT to the
    process it started: the launcher passes it on, and the cell ends in KeyboardInterrupt."""
    import asyncio

    from build_book import kernel_manager

    async def interrupted() -> str:
        km = kernel_manager()(kernel_name="python3")
        await km.start_kernel(cwd=str(tmp_path))
        kc = km.client()
        kc.start_channels()
        try:
            await kc.wait_for_ready(timeout=120)
            sent = kc.execute("import sys; print('torch' in sys.modules, flush=True); import time; time.sleep(120)")
            while True:  # the cell has started when its output arrives
                msg = await kc.get_iopub_msg(timeout=60)
                if msg["msg_type"] == "stream":
                    assert msg["content"]["text"].strip() == "True"  # forked: torch loaded already
                    break
            await km.interrupt_kernel()
            while True:  # the cell's reply: wait_for_ready's kernel_info replies may come first on a busy machine
                reply = await kc.get_shell_msg(timeout=60)
                if reply["parent_header"].get("msg_id") == sent:
                    return reply["content"].get("ename", reply["content"]["status"])
        finally:
            kc.stop_channels()
            await km.shutdown_kernel(now=True)

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:  # a loop of its own: the session may run one in this thread
        assert pool.submit(asyncio.run, interrupted()).result() == "KeyboardInterrupt"
