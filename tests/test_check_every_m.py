"""Every companion script's ``--check`` at m = 3, 5 and 6 on 2 and 3 ranks.

The one-process references do the schedule's arithmetic: each microbatch's loss backpropagated as
it is, the gradients summed in microbatch order, then divided by m (``workload.reference_backward``,
torch's ``PipelineStage.scale_grads``). So a correct pipeline passes at every legal m, not only
at powers of two where dividing each loss by m first happens to give the same bits (chapter 1
shows that difference at m = 6). Small shapes and few steps: what is checked is the arithmetic,
not the learning. 02_naive.py runs the whole batch at once (m = 1 is its only legal value).
"""

from __future__ import annotations

import pytest

from ppbook import launch, stages

MS = (3, 5, 6)
BATCH = 30  # divisible by 3, 5 and 6
SMALL = ["--batch-size", str(BATCH), "--seq-len", "16", "--dim", "32", "--layers", "3"]


def legal_schedules(p: int, m: int) -> list[str]:
    """The schedules of torch 2.13 that accept m microbatches on p ranks (two stages per rank for
    the looped ones, three layers per stage at most)."""
    return [s for s in stages.TORCH_SCHEDULES if stages.schedule_problem(s, p, m, 2, 6) is None]


def launches(script: str, p: int) -> list[list[str]]:
    """The argument lists that cover m = 3, 5, 6 for ``script`` at ``p`` ranks."""
    if script == "03_gpipe.py":  # one launch sweeps every m
        return [["--check", *SMALL, "--steps", "1", "--warmup", "0", "--microbatches", *map(str, MS)]]
    if script == "05_schedules.py":
        return [["--check", *SMALL[:-2], "--layers", "6", "--steps", "1", "--microbatches", str(m),
                 "--schedules", *legal_schedules(p, m)] for m in MS]
    if script == "a1_migrate.py":
        return [["--check", "--batch-size", str(BATCH), "--layers", "3", "--steps", "2", "--chunks", str(m)] for m in MS]
    extra = {
        "01_first_pipeline.py": ["--steps", "2"],
        "04_splitting.py": ["--experiments", "check"],
        "06_train.py": ["--steps", "2", "--eval-every", "0", "--eval-batches", "1"],
        "07_checkpointing.py": ["--steps", "2"],
        "08_beyond_chain.py": ["--steps", "2"],
        "09_scaling_out.py": ["--dp", "1", "--steps", "2"],
    }[script]
    shape = SMALL if script != "06_train.py" else ["--batch-size", str(BATCH)]
    return [["--check", *shape, *extra, "--microbatches", str(m)] for m in MS]


SCRIPTS = ["01_first_pipeline.py", "03_gpipe.py", "04_splitting.py", "05_schedules.py", "06_train.py",
           "07_checkpointing.py", "08_beyond_chain.py", "09_scaling_out.py", "a1_migrate.py"]


@pytest.mark.torchrun
@pytest.mark.parametrize("p", [2, 3])
@pytest.mark.parametrize("script", SCRIPTS)
def test_check_passes_at_every_legal_microbatch_count(script, p):
    for args in launches(script, p):
        r = launch.torchrun(script, args, nproc=p, timeout=300, check=False)
        assert r.returncode == 0, f"{r.shell_command}\n{r.output[-3000:]}"
        data = r.data
        assert data.get("match", data.get("as_expected")), r.output[-3000:]
        if script in ("01_first_pipeline.py", "a1_migrate.py"):
            # the same microbatches summed in the same order, then / m: bit for bit at any m
            assert data["pipeline_losses"] == data["reference_losses"], r.output[-2000:]
            assert all(s["max_grad_diff"] == 0 and s["max_weight_diff"] == 0 for s in data["stages"]
                       if "max_grad_diff" in s), r.output[-2000:]
        if script == "03_gpipe.py":
            assert {run["microbatches"] for run in data["runs"]} == set(MS)
            assert all(s["max_grad_diff"] == 0 for run in data["runs"] for s in run["stages"])


def test_legal_schedules_cover_each_m():
    """The sweep above runs something at every m: GPipe and 1F1B always accept m >= p."""
    for p in (2, 3):
        for m in MS:
            assert {"GPipe", "1F1B"} <= set(legal_schedules(p, m))
