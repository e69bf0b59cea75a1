"""Every companion script's ``--check`` at m = 3, 5 and 6 on 2 and 3 ranks.

The one-process references do the schedule's arithmetic: each microbatch's loss backpropagated as
it is, the gradients summed in microbatch order, then divided by m (``workload.reference_backward``,
torch's ``PipelineStage.scale_grads``). So a correct pipeline passes at every legal m, not only
at powers of two where dividing each loss by m first happens to give the same bits (chapter 1
shows that difference at m = 6). Small shapes and few steps: what is checked is the arithmetic,
not the learning. 02_naive.py runs the whole batch at once (m = 1 is its only legal value).

Each script runs at three (p, m) pairs, not the six of the product: the bug class is the arithmetic
at m, which does not depend on p, and each pair is a case of its own. (3, 3): m = p, the fewest a
1F1B pipeline takes (no steady state); (2, 5): an odd m that divides into neither p, on 2 ranks,
where DualPipeV runs at an odd m; (3, 6): m = 2p, where every schedule of 05_schedules.py runs on
3 ranks (DualPipeV's 2p stages included). So each m runs once and each p runs (3 and 6 on 3 ranks,
5 on 2). 05_schedules.py adds (2, 6) for the two interleaved schedules only: they refuse m = 5 on
2 ranks, and would otherwise run on 2 ranks only at the chapter's power of two. 03_gpipe.py sweeps
every m in one launch, so it keeps the whole product (one launch per p). 04_splitting.py checks
both split methods (manual, tracer) at every pair, and each model on both p: GPT at (3, 3) and
(2, 5), Llama at (2, 5) and (3, 6) (the tracer's export is most of its cost; the model does not
change the arithmetic at m).
"""

from __future__ import annotations

import pytest

from ppbook import launch, stages

MS = (3, 5, 6)
PAIRS = ((3, 3), (2, 5), (3, 6))  # (p, m): each m once, each p at least once (see above)
BATCH = 30  # divisible by 3, 5 and 6
SMALL = ["--batch-size", str(BATCH), "--seq-len", "16", "--dim", "32", "--layers", "3"]


def legal_schedules(p: int, m: int) -> list[str]:
    """The schedules of torch 2.13 that accept m microbatches on p ranks (two stages per rank for
    the looped ones, three layers per stage at most)."""
    return [s for s in stages.TORCH_SCHEDULES if stages.schedule_problem(s, p, m, 2, 6) is None]


def schedule_launches() -> list[tuple[int, int, list[str]]]:
    """(p, m, schedules) of 05_schedules.py: every legal schedule at each pair, and at (2, 6) those
    that no pair runs on 2 ranks."""
    runs = [(p, m, legal_schedules(p, m)) for p, m in PAIRS]
    on_two = {s for p, _, names in runs if p == 2 for s in names}
    return [*runs, (2, 6, [s for s in legal_schedules(2, 6) if s not in on_two])]


SPLIT_MODELS = {(3, 3): ["gpt"], (2, 5): ["gpt", "llama"], (3, 6): ["llama"]}  # 04_splitting.py's, per pair


def launches(script: str) -> list[tuple[int, tuple[int, ...], list[str]]]:
    """(p, the m's, argument list) of each launch that covers ``script`` at m = 3, 5, 6 on 2 and 3 ranks."""
    if script == "03_gpipe.py":  # one launch sweeps every m
        return [(p, MS, ["--check", *SMALL, "--steps", "1", "--warmup", "0", "--microbatches", *map(str, MS)])
                for p in (2, 3)]
    if script == "05_schedules.py":
        return [(p, (m,), ["--check", *SMALL[:-2], "--layers", "6", "--steps", "1", "--microbatches", str(m),
                           "--schedules", *names]) for p, m, names in schedule_launches()]
    if script == "a1_migrate.py":
        return [(p, (m,), ["--check", "--batch-size", str(BATCH), "--layers", "3", "--steps", "2", "--chunks", str(m)])
                for p, m in PAIRS]
    if script == "04_splitting.py":
        return [(p, (m,), ["--check", *SMALL, "--experiments", "check", "--models", *SPLIT_MODELS[p, m],
                           "--microbatches", str(m)]) for p, m in PAIRS]
    extra = {
        "01_first_pipeline.py": ["--steps", "2"],
        "06_train.py": ["--steps", "2", "--eval-every", "0", "--eval-batches", "1"],
        "07_checkpointing.py": ["--steps", "2"],
        "08_beyond_chain.py": ["--steps", "2"],
        "09_scaling_out.py": ["--dp", "1", "--steps", "2"],
    }[script]
    shape = SMALL if script != "06_train.py" else ["--batch-size", str(BATCH)]
    return [(p, (m,), ["--check", *shape, *extra, "--microbatches", str(m)]) for p, m in PAIRS]


SCRIPTS = ["01_first_pipeline.py", "03_gpipe.py", "04_splitting.py", "05_schedules.py", "06_train.py",
           "07_checkpointing.py", "08_beyond_chain.py", "09_scaling_out.py", "a1_migrate.py"]


CASES = [pytest.param(script, p, args, id=f"{script}-p{p}-m{','.join(map(str, ms))}")
         for script in SCRIPTS for p, ms, args in launches(script)]


@pytest.mark.torchrun
@pytest.mark.parametrize("script,p,args", CASES)
def test_check_passes_at_every_legal_microbatch_count(script, p, args):
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


def test_the_launches_cover_each_m_and_p_for_every_script():
    """The pairs run every m of MS and both p, for each script; every torch schedule runs on 2 and on
    3 ranks at an m that is not a power of two; each split method and model of 04_splitting.py on
    both p."""
    assert {m for _, m in PAIRS} == set(MS) and {p for p, _ in PAIRS} == {2, 3}
    for script in SCRIPTS:
        runs = [(p, m) for p, ms, _ in launches(script) for m in ms]
        assert {m for _, m in runs} == set(MS) and {p for p, _ in runs} == {2, 3}, script
    for p in (2, 3):
        ran = {s for q, _, names in schedule_launches() if q == p for s in names}
        assert ran == set(stages.TORCH_SCHEDULES), (p, ran)
    for p in (2, 3):
        assert {model for (q, _), models in SPLIT_MODELS.items() if q == p for model in models} == {"gpt", "llama"}
    assert set(SPLIT_MODELS) == set(PAIRS)


def test_legal_schedules_cover_each_m():
    """The sweep above runs something at every m: GPipe and 1F1B always accept m >= p."""
    for p in (2, 3):
        for m in MS:
            assert {"GPipe", "1F1B"} <= set(legal_schedules(p, m))
