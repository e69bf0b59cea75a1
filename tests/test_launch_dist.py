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
