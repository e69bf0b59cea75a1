"""Chapter 9: PP x DP on 4 processes, two torchrun nodes on loopback, and Ray Train, each
against one process on the combined batch, and torchrun against Ray bit for bit."""

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, assert_one_error_line, assert_one_line_error

from ppbook import launch, nodes


def assert_matches_one_process(data: dict):
    assert data["match"] and data["replicas_equal"], data
    torch.testing.assert_close(data["losses"], data["reference_losses"], rtol=0, atol=data["tolerance"])
    assert all(r["max_weight_diff"] <= data["tolerance"] for r in data["ranks"])


@pytest.fixture(scope="module")
def pp_dp_torchrun() -> dict:
    return launch.torchrun("09_scaling_out.py", ["--dp", "2", "--check"], nproc=4, timeout=300).data


@pytest.mark.torchrun
def test_pp2_dp2_on_four_processes_matches_one_process(pp_dp_torchrun):
    data = pp_dp_torchrun
    assert (data["dp"], data["pp"], data["world_size"]) == (2, 2, 4)
    assert sorted((r["dp_rank"], r["pp_rank"]) for r in data["ranks"]) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # the mesh is (dp, pp): rank = dp_rank * pp + pp_rank, so a pipeline's stages are neighbours
    assert all(r["rank"] == r["dp_rank"] * 2 + r["pp_rank"] for r in data["ranks"])
    assert_matches_one_process(data)


@pytest.mark.torchrun
@pytest.mark.parametrize("dp", [1, 4])
def test_pure_pipeline_and_pure_data_parallel_are_the_corners(dp):
    data = launch.torchrun("09_scaling_out.py", ["--dp", str(dp), "--check", "--batch-size", "16"],
                           nproc=4, timeout=300).data
    assert (data["dp"], data["pp"]) == (dp, 4 // dp)
    assert_matches_one_process(data)


@pytest.mark.torchrun
def test_ddp_per_stage_works_with_one_microbatch():
    """Chapter 9 runs --replicate ddp with two microbatches and finds DDP's internal assert (the
    reason for FSDP; if a torch release fixes it, the chapter fails). With one microbatch per step
    the same DDP path works, as the chapter says."""
    one = launch.torchrun("09_scaling_out.py", ["--dp", "2", "--replicate", "ddp", "--microbatches", "1", "--check"],
                          nproc=2, timeout=300).data
    assert_matches_one_process(one)


@pytest.mark.torchrun
def test_bad_input_one_line_nonzero_exit_end_to_end():
    """The one launch of a companion script that shows a refusal end to end: two ranks, each
    refusing the same bad flag before any process group, give one error line and a non-zero exit
    (every other script's refusals are checked in-process: conftest.refusal; the same under real
    torchrun with a slow rank 0, and that ranks other than 0 stay silent: tests/test_cli.py)."""
    r = launch.torchrun("09_scaling_out.py", ["--dp", "2", "--batch-size", "6"], nproc=2, timeout=120, check=False,
                        json_result=False)
    assert_one_error_line(r, "09_scaling_out.py", "must split into --dp 2 replicas")


def test_dp_must_divide_the_processes():
    assert_one_line_error("09_scaling_out.py", ["--dp", "3"], "--dp 3 must divide the number of processes (4)", nproc=4)


@pytest.mark.parametrize("args,message", [
    (["--ray-workers", "4", "--dp", "3"], "--dp 3 must divide the number of processes (4)"),
    (["--ray-workers", "-1"], "--ray-workers must be 0"),
])
def test_ray_launcher_bad_input_one_line_exit_2(args, message, capsys):
    """With --ray-workers the script is its own launcher: main() validates (Ray's workers are the
    processes) and refuses in one line, exit status 2, before Ray starts."""
    script = launch.load_script("09_scaling_out.py")
    assert script.main(args) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("09_scaling_out.py: error:")]
    assert len(errors) == 1 and message in errors[0], errors


@pytest.mark.torchrun
def test_slurm_batch_script_runs_on_loopback_with_stand_ins(tmp_path, pp_dp_torchrun):
    """scripts/09_slurm.sbatch itself, with an `srun` that starts one task per "node" here and an
    `scontrol` that names 127.0.0.1 as the first node: 2 nodes x 2 CPU processes, --dp 2."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/bash\npids=()\nfor i in $(seq 0 $((SLURM_NNODES - 1))); do\n'
                                  '  SLURM_NODEID=$i "$@" & pids+=($!)\ndone\nstatus=0\n'
                                  'for p in "${pids[@]}"; do wait $p || status=$?; done\nexit $status\n')
    (bin_dir / "scontrol").write_text("#!/bin/bash\necho 127.0.0.1\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    out = tmp_path / "result.json"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.path.dirname(sys.executable)}:{os.environ['PATH']}",
           "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "node[0-1]", "SLURM_JOB_ID": "4242",
           "GPUS_PER_NODE": "2", "DP": "2", "DEVICE": "cpu", "PORT": str(nodes.free_port()), "TQDM_DISABLE": "1"}
    proc = subprocess.Popen(["bash", "scripts/09_slurm.sbatch", "--check", "--json", str(out)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        launch.kill_tree(proc.pid)
        pytest.fail("the Slurm script hung (every process killed)")
    assert proc.returncode == 0, output[-3000:]
    data = json.loads(out.read_text())
    assert sorted(x["node"] for x in data["ranks"]) == [0, 0, 1, 1]
    # the batch script puts pp outermost: a stage's replicas (its FSDP group) share a node, the
    # pipeline crosses the nodes, as nodes.mesh_layout(pp_outermost=True) computes for chapter 9
    assert data["mesh"] == "pp,dp"
    expected = nodes.mesh_layout(dp=2, pp=2, procs_per_node=2, pp_outermost=True)
    assert [(x["node"], x["dp_rank"], x["pp_rank"]) for x in data["ranks"]] == \
        [(x["node"], x["dp_rank"], x["pp_rank"]) for x in expected]
    assert all(len({x["node"] for x in data["ranks"] if x["pp_rank"] == s}) == 1 for s in (0, 1))
    assert_matches_one_process(data)
    # the same weights as the ("dp", "pp") mesh of one torchrun: the order of the mesh moves
    # ranks, not bits
    by_stage = {(x["dp_rank"], x["pp_rank"]): x["digest"] for x in pp_dp_torchrun["ranks"]}
    assert {(x["dp_rank"], x["pp_rank"]): x["digest"] for x in data["ranks"]} == by_stage


def test_mesh_layout_keeps_pipelines_on_a_node_when_the_node_holds_whole_pipelines():
    layout = nodes.mesh_layout(dp=4, pp=2, procs_per_node=4)
    assert [(x["node"], x["local_rank"], x["dp_rank"], x["pp_rank"]) for x in layout[:4]] == \
        [(0, 0, 0, 0), (0, 1, 0, 1), (0, 2, 1, 0), (0, 3, 1, 1)]
    assert {x["node"] for x in layout} == {0, 1}
    one_pipeline = nodes.mesh_layout(dp=1, pp=8, procs_per_node=4)
    assert {x["node"] for x in one_pipeline} == {0, 1}  # 8 stages on 4-GPU nodes: the pipeline crosses
    with pytest.raises(ValueError, match="at least 1"):
        nodes.mesh_layout(0, 2, 4)


def test_mesh_layout_with_pp_outermost_keeps_each_stage_group_on_a_node():
    """Megatron-LM / torchtitan order (item 2 of #13): a stage's replicas share a node, the
    pipeline crosses nodes."""
    layout = nodes.mesh_layout(dp=4, pp=4, procs_per_node=8, pp_outermost=True)
    for stage in range(4):
        assert len({x["node"] for x in layout if x["pp_rank"] == stage}) == 1
    assert len({x["node"] for x in layout if x["dp_rank"] == 0}) == 2
    assert sorted((x["dp_rank"], x["pp_rank"]) for x in layout) == \
        sorted((x["dp_rank"], x["pp_rank"]) for x in nodes.mesh_layout(4, 4, 8))  # same cells, other order
