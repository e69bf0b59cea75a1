"""Appendices: the migration example against one process, and every troubleshooting mistake
failing with torch's exact message (each launch under a timeout: a hang is a failure)."""

import pytest

from conftest import assert_one_line_error, refusal
from ppbook import errors, launch

pytestmark = pytest.mark.torchrun

# (mistake, extra flags, failing rank, exception type, text of torch 2.13's message)
MISTAKES = [
    ("indivisible", [], 1, "ValueError", "Expected input batch_size (16) to match target batch_size (8)."),
    ("too-few-microbatches", [], 0, "ValueError",
     "Number of microbatches (1) must be greater than or equal to the number of stages (2)."),
    ("wrong-v-placement", [], None, "RuntimeError", "DefaultCPUAllocator: can't allocate memory: you tried to allocate"),
    ("shape-mismatch", [], 1, "RuntimeError",
     "Given normalized_shape=[32], expected input with shape [*, 32], but got input of size[2, 8, 16]"),
    ("target-positional", [], 0, "TypeError", "GPT.forward() takes 2 positional arguments but 3 were given"),
    ("no-target", [], 1, "PipeliningMetadataError", "Stage 1: loss_fn and target required for last stage"),
    # both ranks wait with the same timeout, rank 0 on its sends and the last rank in the barrier:
    # either may time out first, so the root cause is whichever wait ran out (send or recv)
    ("hang", ["--timeout", "5"], None, "RuntimeError", "Timed out waiting 5000ms for "),
]


@pytest.mark.parametrize("mistake,extra,rank,kind,message", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_troubleshooting_mistake_fails_with_torchs_message(mistake, extra, rank, kind, message):
    r = launch.torchrun("a3_troubleshooting.py", ["--mistake", mistake, *extra], nproc=2, timeout=300,
                        check=False, json_result=False)
    assert r.returncode != 0, r.output
    culprit, culprit_kind, culprit_message = errors.root_cause(r.output)
    assert culprit_kind == kind and message in culprit_message, r.output
    if rank is not None:
        assert culprit == rank, r.output
    # every other rank made the same mistake or failed only because it lost its peer
    for other, (_, msg) in errors.rank_errors(r.output).items():
        assert message in msg or any(c in msg for c in errors.CONSEQUENCES), r.output


def test_troubleshooting_hang_leaves_a_flight_record_per_rank(tmp_path):
    import json

    r = launch.torchrun("a3_troubleshooting.py", ["--mistake", "hang", "--timeout", "5", "--dump-dir", tmp_path],
                        nproc=2, timeout=300, check=False, json_result=False)
    records = sorted(line for line in r.output.splitlines() if line.startswith("[flight record]"))
    assert len(records) == 2, r.output
    assert records[0].startswith("[flight record] rank 0, step 1: completed 0F0 0F1 0F2 0F3; then RuntimeError: "), \
        r.output
    assert records[1].startswith("[flight record] rank 1, step 1: completed nothing; then RuntimeError: "), r.output
    # whichever rank's wait ran out first raised the timeout; the other one may only have lost its peer
    assert any("Timed out waiting 5000ms for " in line for line in records), r.output
    dumps = {d["rank"]: d for d in (json.loads(f.read_text()) for f in tmp_path.glob("rank*.json"))}
    assert [(e["kind"], e["microbatch"]) for e in dumps[0]["completed"]] == [("F", i) for i in range(4)]
    assert dumps[1]["completed"] == [] and dumps[1]["step"] == 1


@pytest.mark.parametrize("mistake", ["none", "target-not-last"])
def test_troubleshooting_correct_setups_complete(mistake):
    r = launch.torchrun("a3_troubleshooting.py", ["--mistake", mistake], nproc=2, timeout=300)
    assert r.data == {"mistake": mistake, "completed": True}


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


@pytest.mark.parametrize("checkpoint", ["never", "always"])
def test_migration_after_matches_one_process(checkpoint):
    # the blog's Pipe(model, chunks=4, balance=[1, 1], devices=[0, 1]), migrated
    r = launch.torchrun("a1_migrate.py", ["--chunks", "4", "--balance", "1", "1", "--checkpoint", checkpoint,
                                          "--check"], nproc=2, timeout=300)
    assert r.data["layers_per_stage"] == [[0], [1]] and r.data["chunks"] == 4
    assert_equivalent(r.data)


def test_migration_uneven_balance_on_three_processes():
    r = launch.torchrun("a1_migrate.py", ["--layers", "5", "--balance", "2", "1", "2", "--chunks", "8",
                                          "--check", "--dtype", "float64"], nproc=3, timeout=300)
    assert r.data["layers_per_stage"] == [[0, 1], [2], [3, 4]]
    assert_equivalent(r.data)


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


# --- reader experience: notebooks for Colab and download, never committed under book/ -------------
def test_every_notebook_page_becomes_a_valid_ipynb(tmp_path):
    import importlib.util

    import jupytext
    import nbformat

    from conftest import ROOT

    spec = importlib.util.spec_from_file_location("make_notebooks", ROOT / "tools" / "make_notebooks.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    pages = tool.notebook_pages()
    assert {p.stem for p in pages} >= {"01_first_pipeline", "a1_migrating_from_pipe", "a2_myths", "a3_troubleshooting"}
    written = tool.write_notebooks(tmp_path)
    assert [w.stem for w in written] == [p.stem for p in pages]
    for page, path in zip(pages, written):
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        source = jupytext.read(page)
        assert [c.source for c in nb.cells if c.cell_type == "code"] == \
               [c.source for c in source.cells if c.cell_type == "code"]
        assert nb.metadata["kernelspec"]["name"] == "python3"
    assert not list((ROOT / "book").glob("*.ipynb"))  # generated elsewhere, never beside the sources
