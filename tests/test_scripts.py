"""Every companion script under torchrun at 2 and 4 processes, checked against one process."""

import pytest

from conftest import argparse_refusal, assert_one_line_error
from ppbook import launch


def assert_matches_one_process(data: dict):
    assert data["match"], data
    assert data["pipeline_losses"] == data["reference_losses"]
    for stage in data["stages"]:
        assert stage["max_grad_diff"] == 0.0, stage  # same microbatches, same order: bitwise equal
        assert stage["max_weight_diff"] == 0.0, stage


@pytest.mark.torchrun
@pytest.mark.parametrize("nproc", [2, 4])
@pytest.mark.parametrize("dtype", ["float64"])  # float32 at 2 and 4: chapter 1 runs and checks it
def test_first_pipeline_matches_one_process(nproc, dtype):
    r = launch.torchrun("01_first_pipeline.py", ["--check", "--dtype", dtype], nproc=nproc, timeout=180)
    assert r.data["world_size"] == nproc
    assert sum(r.data["layers_per_stage"], []) == list(range(4))
    assert_matches_one_process(r.data)


@pytest.mark.torchrun
def test_first_pipeline_uneven_stages_and_more_microbatches():
    r = launch.torchrun("01_first_pipeline.py", ["--check", "--layers", "5", "--microbatches", "8",
                                                 "--batch-size", "16", "--steps", "2"], nproc=2, timeout=180)
    assert r.data["layers_per_stage"] == [[0, 1, 2], [3, 4]]
    assert_matches_one_process(r.data)


# One plain process (a one-stage pipeline, bitwise equal to its reference), and the loss falling
# over three steps: chapter 1 runs and checks both.


@pytest.mark.parametrize("args,message", [
    (["--batch-size", "10", "--microbatches", "4"], "not divisible by --microbatches 4"),
    (["--layers", "1"], "need at least 2 layers"),
    (["--microbatches", "0"], "--microbatches must be at least 1"),
    (["--dim", "30", "--heads", "4"], "--dim 30 must be divisible by --heads 4"),
    (["--json", "/no/such/folder/out.json"], "its folder does not exist"),
    (["--steps", "0"], "--steps must be at least 1"),
] + ([(["--device", "cuda"], "use --device cpu")] if not __import__("torch").cuda.is_available() else []))
def test_first_pipeline_bad_input_one_line_nonzero_exit(args, message):
    assert_one_line_error("01_first_pipeline.py", args, message)


def test_first_pipeline_argparse_rejects_unknown_dtype(capsys):
    assert "invalid choice" in argparse_refusal("01_first_pipeline.py", ["--dtype", "float16"], capsys)


# --- chapter 2: naive model parallelism ------------------------------------------------------
# 02_naive.py at 2 and 4 processes (gradients, the naive order, no overlap): chapter 2 runs and checks it


def test_naive_refuses_microbatches():
    assert_one_line_error("02_naive.py", ["--microbatches", "4"], "--microbatches must be 1")


# --- chapter 3: GPipe from scratch and with ScheduleGPipe --------------------------------------
@pytest.mark.torchrun
@pytest.mark.parametrize("nproc", [4])  # 2 processes, m = 1, 2, 4, 8: chapter 3 runs and checks it
def test_gpipe_scratch_and_torch_match_one_process_and_run_gpipe_order(nproc):
    from ppbook import timeline
    from ppbook.planner import schedules

    ms = [1, 4]
    r = launch.torchrun("03_gpipe.py", ["--check", "--steps", "1", "--warmup", "0", "--batch-size", "8",
                                        "--seq-len", "32", "--dim", "64", "--layers", "4",
                                        "--microbatches", *map(str, ms)], nproc=nproc, timeout=240)
    assert len(r.data["runs"]) == 2 * len(ms)
    for run in r.data["runs"]:
        assert run["match"], run["impl"]
        assert all(s["max_grad_diff"] == 0.0 for s in run["stages"]), run["impl"]
        events = timeline.from_json(run["events"])
        expected = schedules.gpipe_order(nproc, run["microbatches"])
        for rank in range(nproc):
            mine = sorted((e for e in events if e.rank == rank), key=lambda e: e.start)
            assert [str(schedules.Action(e.stage, e.kind, e.microbatch)) for e in mine] == \
                [str(a) for a in expected[rank]], (run["impl"], rank)


def test_gpipe_measures_every_configuration_in_rounds():
    """Issue 50: the naive step (m = 1) and every pipelined one are measured in the same rounds, one
    step of each per round, so that chapter 3's speed-ups compare steps that saw the same moments
    of a shared host (before, each m ran all its steps before the next m started)."""
    rounds = launch.load_script("03_gpipe.py").rounds
    configs = [(1, "scratch"), (1, "torch"), (8, "scratch"), (8, "torch")]
    order = rounds(configs, warmup=1, steps=2)
    assert order == [(c, True) for c in configs] + [(c, False) for c in configs] * 2
    assert rounds(configs, warmup=0, steps=0) == []


def test_gpipe_bad_microbatch_list_is_one_line():
    assert_one_line_error("03_gpipe.py", ["--microbatches", "1", "3"], "--batch-size 32 is not divisible by --microbatches 3")


# --- the recorder with every schedule class ---------------------------------------------------
@pytest.mark.torchrun
def test_recorder_times_every_action_of_every_schedule_class(tmp_path):
    """All seven schedules of torch.distributed.pipelining, each stage placed as the schedule
    needs, with the recorder attached to their stages (torch itself not patched): every
    forward and every backward (full, or input- plus weight-gradient) of every microbatch on
    every stage is recorded, gradients equal one process, and Schedule1F1B runs exactly the
    simulator's 1F1B order on every rank."""
    from ppbook import timeline
    from ppbook.planner import schedules
    from conftest import ROOT

    m = 4
    r = launch.torchrun(ROOT / "tests" / "helpers" / "record_all_schedules.py", ["--microbatches", m],
                        nproc=2, timeout=240)
    assert len(r.data) == 7
    for name, run in r.data.items():
        assert run["max_grad_diff"] < 1e-12, name
        events = timeline.from_json(run["events"])
        for stage in range(run["num_stages"]):
            for mb in range(m):
                kinds = sorted(e.kind for e in events if (e.stage, e.microbatch) == (stage, mb))
                assert kinds in (["B", "F"], ["F", "I", "W"]), (name, stage, mb, kinds)
    for name, order in (("ScheduleGPipe", schedules.gpipe_order(2, m)), ("Schedule1F1B", schedules.one_f_one_b_order(2, m))):
        events = timeline.from_json(r.data[name]["events"])
        for rank in range(2):
            mine = sorted((e for e in events if e.rank == rank), key=lambda e: e.start)
            assert [e.label for e in mine] == [str(a) for a in order[rank]], (name, rank)
