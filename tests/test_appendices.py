"""Appendices: the migration example against one process, and every troubleshooting mistake
failing with torch's exact message (each launch under a timeout: a hang is a failure)."""

import pytest

from conftest import assert_one_line_error, refusal
from ppbook import errors, launch


# The appendix launches every other mistake and checks each the same way (book/a3_troubleshooting.md,
# executed by the book build): indivisible, wrong-v-placement, shape-mismatch, target-positional,
# no-target, hang with its flight records, and target-not-last completing.
@pytest.mark.torchrun
def test_troubleshooting_too_few_microbatches_fails_with_torchs_message():
    """The appendix shows this one in-process (the schedule's constructor); here under torchrun."""
    r = launch.torchrun("a3_troubleshooting.py", ["--mistake", "too-few-microbatches"], nproc=2, timeout=300,
                        check=False, json_result=False)
    assert r.returncode != 0, r.output
    assert errors.surfaced(r.output, "ValueError",
                           "Number of microbatches (1) must be greater than or equal to the number of stages (2).",
                           rank=0), r.output


@pytest.mark.torchrun
def test_troubleshooting_correct_setup_completes():
    r = launch.torchrun("a3_troubleshooting.py", ["--mistake", "none"], nproc=2, timeout=300)
    assert r.data == {"mistake": "none", "completed": True}


def test_troubleshooting_refuses_other_world_sizes_in_one_line():
    assert refusal("a3_troubleshooting.py", ["--mistake", "none"], world_size=1) == \
        "every mistake is staged on exactly 2 processes, got 1; use --nproc-per-node 2"


def test_rank_errors_and_root_cause_skip_consequences():
    output = ("[rank0]: RuntimeError: [/x/pair.cc:553] Connection closed by peer [127.0.0.1]:1. GLHF\n"
              "[rank1]: Traceback (most recent call last):\n"
              "[rank1]: torch.distributed.pipelining._utils.PipeliningMetadataError: Stage 1: no target\n")
    assert errors.rank_errors(output) == {
        0: ("RuntimeError", "[/x/pair.cc:553] Connection closed by peer [127.0.0.1]:1. GLHF"),
        1: ("PipeliningMetadataError", "Stage 1: no target")}
    assert errors.root_cause(output) == (1, "PipeliningMetadataError", "Stage 1: no target")
    assert errors.surfaced(output, "PipeliningMetadataError", "no target", rank=1)
    assert errors.surfaced(output, "PipeliningMetadataError", "no target")  # any rank
    assert not errors.surfaced(output, "PipeliningMetadataError", "no target", rank=0)
    assert not errors.surfaced(output, "ValueError", "no target")
    assert not errors.surfaced(output + "[rank2]: RuntimeError: something else\n", "PipeliningMetadataError", "no target")
    assert errors.without_source_path("[/x/pair.cc:553] Connection closed") == "Connection closed"
    assert errors.root_cause("no error here") is None


# --- appendix A: the migration example ---------------------------------------------------------
def assert_equivalent(data: dict):
    """The migrated pipeline computes what the one-process model computes, to the last bit."""
    assert data["match"], data
    assert data["pipeline_losses"] == data["reference_losses"]
    assert data["max_output_diff"] == 0.0
    for stage in data["stages"]:
        assert stage["max_grad_diff"] == 0.0 and stage["max_weight_diff"] == 0.0, stage


# the blog's Pipe(model, chunks=4, balance=[1, 1], devices=[0, 1]), migrated, with and without
# recomputation: the appendix runs both and checks them bit for bit (book/a1_migrating_from_pipe.md)


@pytest.mark.torchrun
def test_migration_uneven_balance_on_three_processes():
    r = launch.torchrun("a1_migrate.py", ["--layers", "5", "--balance", "2", "1", "2", "--chunks", "8",
                                          "--check", "--dtype", "float64"], nproc=3, timeout=300)
    assert r.data["layers_per_stage"] == [[0, 1], [2], [3, 4]]
    assert_equivalent(r.data)


@pytest.mark.torchrun
def test_migration_one_process_without_torchrun():
    r = launch.python("a1_migrate.py", ["--balance", "2", "--check"], timeout=120)
    assert r.data["world_size"] == 1
    assert_equivalent(r.data)


def test_migration_balance_maps_to_stage_layers():
    a1 = launch.load_script("a1_migrate.py")
    assert a1.layers_of_stages([1, 1], 2, 2) == [[0], [1]]
    assert a1.layers_of_stages([3, 1, 2], 6, 3) == [[0, 1, 2], [3], [4, 5]]
    assert a1.layers_of_stages(None, 5, 2) == [[0, 1, 2], [3, 4]]  # no balance: ppbook.stages.assign_layers


@pytest.mark.parametrize("args,nproc,message", [
    (["--balance", "1", "1", "1"], 2, "--balance has 3 entries but there are 2 processes"),
    (["--balance", "1", "2"], 2, "must give every one of the 2 layers to a stage"),
    (["--chunks", "3"], 2, "--batch-size 16 is not divisible by --chunks 3"),
    (["--checkpoint", "except_last"], 2, "--checkpoint except_last has no equivalent today"),
])
def test_migration_bad_old_arguments_get_one_line(args, nproc, message):
    assert_one_line_error("a1_migrate.py", args, message, nproc=nproc)


