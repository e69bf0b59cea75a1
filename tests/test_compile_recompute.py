"""Chapter 12, compile and activation checkpointing in a pipeline (``scripts/12_compile.py``,
``scripts/12_recompute.py``). The chapter launches and checks, against one process: the compile
sweep per block, per stage and in place, and the checkpointing policies with the book's kernels
(2 processes). These tests launch both scripts' --check at m = 3, 5 and 6 (checkpointing, at one p
each) and once per p (compile: blocks wrapped and compiled in place under every schedule once,
over the two p) on 2 and 3 ranks, the fused kernels under checkpointing, and cover the rest: the
compile check, what a stage keeps and what recomputing costs, and bad input."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_one_line_error, refusal

from ppbook import launch, precision
from ppbook.planner.memory import layer_activation_bytes
from ppbook.planner.schedules import SPLIT_BACKWARD as SPLIT
from ppbook.planner.shapes import ModelShape
from ppbook.stages import TORCH_SCHEDULES, schedule_problem

COMPILE, RECOMPUTE = "12_compile.py", "12_recompute.py"
SMALL = ["--dim", "32", "--seq-len", "16", "--steps", "1", "--warmup", "0", "--check"]


@pytest.fixture(scope="module")
def compile_script():
    return launch.load_script(COMPILE)


@pytest.fixture(scope="module")
def recompute_script():
    return launch.load_script(RECOMPUTE)


def checked(script: str, args: list[str], p: int) -> dict:
    r = launch.torchrun(script, args, nproc=p, timeout=180, check=False)
    assert r.returncode == 0 and r.data["match"], f"{r.shell_command}\n{r.output[-3000:]}"
    return r.data


# --- launched: what the chapter does not run ------------------------------------------------------
@pytest.mark.torchrun
def test_fused_kernels_keep_what_the_planner_counts_in_every_stage():
    d = launch.torchrun(RECOMPUTE, ["--kernels", "fused", "--policies", "none", "selective",
                                 "--steps", "1", "--warmup", "0", "--check"], nproc=2, timeout=300).data
    shape = ModelShape("script", vocab=d["vocab"], hidden=d["dim"], layers=d["layers"], heads=d["heads"],
                       kv_heads=d["kv_heads"], ffn=d["ffn"])
    for run in d["runs"]:
        for st in run["stages"].values():
            slack = d["rng_state_bytes"] if st["mode"] != "none" else 0
            want = layer_activation_bytes(shape, d["microbatch_tokens"], 4, "fused", st["mode"]) + slack
            assert st["block_bytes"] == [want], (run["policies"], st)
        for s, st in run["stages"].items():  # what each stage kept at most across the step, measured
            assert st["saved_peak_bytes"] == run["stage_model_bytes"][s], (run["policies"], s, st)
    assert d["match"]



# --- launched: --check at m = 3, 5 and 6 on 2 and 3 ranks (issue 26) ------------------------------
# Checkpointing at three (p, m) pairs, not the six of the product: what is checked is the arithmetic
# at m (and what a stage keeps, which the model gives at any m), not p. (3, 3): m = p; (2, 5): an odd
# m that divides into neither p; (3, 6): m = 2p. Each m once, each p at least once; every schedule at
# every m is also checked eager by 05_schedules.py (tests/test_check_every_m.py).
RECOMPUTE_M = {2: (5,), 3: (3, 6)}
EVERY_M = ["--batch-size", "30", "--layers", "6", *SMALL]  # 30: divisible by 3, 5 and 6
# The compile sweep once per p, at an m where (nearly) every schedule is legal: what compiling
# changes does not depend on m (each block is compiled once and its graph runs once per microbatch,
# asserted below at two m's), and each schedule's arithmetic at every m is checked eager by
# 05_schedules.py (tests/test_check_every_m.py).
COMPILE_M = {2: 6, 3: 5}


def legal(schedules, p: int, m: int) -> list[str]:
    """Those of ``schedules`` that torch 2.13 runs with m microbatches on p ranks (v = 2)."""
    return [s for s in schedules if schedule_problem(s, p, m, 2, 6) is None]


def compile_plan(p: int) -> set[tuple[str, str]]:
    """The (schedule, mode) pairs the sweep runs on p ranks: each compiled mode under every schedule
    once, split over the two p (compiling is most of this test's time, and a mode compiles each
    block's one graph the same way whatever p is). On 2 ranks, every schedule's blocks wrapped (the
    split schedules refuse them), and DualPipeV in place (legal at m = 6 only on 2 ranks); on 3
    ranks, in place under every legal schedule: the way that runs under all of them. Whole stages
    (under 1F1B: runs; under DualPipeV: refused with torch's message) are chapter 12's own launch at
    2 processes, checked there against one process, with their compiled graphs run."""
    names = legal(TORCH_SCHEDULES, p, COMPILE_M[p])
    if p == 3:
        return {(s, "in-place") for s in names}
    return {(s, "blocks") for s in names} | {("DualPipeV", "in-place")}


def compile_sweep(p: int) -> list[str]:
    """The arguments of 12_compile.py that run :func:`compile_plan`."""
    names = legal(TORCH_SCHEDULES, p, COMPILE_M[p])
    if p == 3:
        return ["--compile-modes", "in-place", "--in-place", *names, "--schedules", *names]
    return ["--compile-modes", "blocks", "in-place", "--in-place", "DualPipeV", "--schedules", *names]


def test_the_compile_sweeps_run_each_mode_under_every_schedule():
    """Together, the two sweeps run blocks wrapped and blocks compiled in place under every schedule
    of torch 2.13 (whole stages: the chapter's launch), the wrappers' refusals included."""
    plan = compile_plan(2) | compile_plan(3)
    for mode in ("blocks", "in-place"):
        assert {s for s, m in plan if m == mode} == set(TORCH_SCHEDULES), mode


def check_compiled(d: dict, p: int) -> None:
    """The compile sweep's runs: the wrappers refused with torch's message exactly where the
    backward splits, everything else compiled (its graphs ran) and equal to one process."""
    m, tol = d["microbatches"], precision.tolerance("float32")
    assert {(r["schedule"], r["mode"]) for r in d["runs"]} == compile_plan(p)
    for r in d["runs"]:
        where = (r["schedule"], r["mode"])
        if r["schedule"] in SPLIT and r["mode"] != "in-place":
            assert f"The Schedule{r['schedule']} schedule is not supported with stage modules that have used " \
                   "torch.compile" in r["refused"], where
            continue
        assert r["refused"] is None and r["max_grad_diff"] <= tol and r["compiled_runs"] > 0, (where, r)
        blocks = r["microbatches_x_blocks"] // m  # compiled modules: one per block
        assert r["graph_calls"]["forward in F"] == m * blocks, (where, r["graph_calls"])  # once per microbatch


@pytest.mark.torchrun
@pytest.mark.parametrize("p", [2, 3])
def test_check_passes_at_3_5_and_6_microbatches(p):
    for m in RECOMPUTE_M[p]:  # checkpointing per stage: every 1F1B stage keeps what the model says
        d = checked(RECOMPUTE, ["--policies", "none", "full,selective", *EVERY_M, "--microbatches", str(m)], p)
        for run in d["runs"]:
            assert {s: st["saved_peak_bytes"] for s, st in run["stages"].items()} == run["stage_model_bytes"], run
    check_compiled(checked(COMPILE, [*compile_sweep(p), *EVERY_M, "--microbatches", str(COMPILE_M[p])], p), p)


def test_the_compile_check_fails_when_nothing_ran_compiled(compile_script, capsys):
    args = compile_script.parse_args(["--compile-modes", "blocks", "in-place"])
    run = {"schedule": "1F1B", "mode": "blocks", "refused": None, "step_seconds": 0.1, "graphs": 1,
           "compiled_runs": 8, "max_grad_diff": 0.0}
    refused = {"schedule": "DualPipeV", "mode": "blocks", "refused": "RuntimeError: ..."}
    assert compile_script.report(args, [run, refused])
    assert not compile_script.report(args, [{**run, "compiled_runs": 0}, refused])  # fell back to eager
    assert compile_script.report(args, [{**run, "compiled_runs_per_rank": [4, 4]}, refused])
    assert not compile_script.report(args, [{**run, "compiled_runs_per_rank": [8, 0]}, refused])  # one rank eager
    assert not compile_script.report(args, [refused])  # every compiled mode refused
    eager = compile_script.parse_args(["--compile-modes", "eager"])
    assert compile_script.report(eager, [{**run, "mode": "eager", "compiled_runs": 0}])
    assert not compile_script.report(eager, [{**run, "mode": "eager"}])  # eager ran compiled graphs
    assert "NOT COMPILED" in capsys.readouterr().out



# --- in-process: what a stage keeps, and what recomputing costs ----------------------------------
@pytest.mark.parametrize("mode", ["none", "full", "selective"])
def test_saved_bytes_follow_each_microbatch_from_its_forward_to_its_backward(mode):
    from ppbook import recompute
    from ppbook.models import LlamaConfig, build_model
    from ppbook.planner.memory import stage_activation_bytes
    from ppbook.stages import stage_module

    cfg = LlamaConfig(vocab_size=128, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden_dim=64, max_seq_len=16)
    mod = stage_module(build_model(cfg, seed=0), 0, 1)  # the whole model as one stage: first and last
    saved = recompute.SavedBytes()
    saved.attach(mod, 0)
    for block in mod.layers.values():
        recompute.checkpoint_block(block, mode, saved)
    shape = ModelShape("t", vocab=128, hidden=32, layers=2, heads=4, kv_heads=2, ffn=64)
    per_mb = stage_activation_bytes(shape, [0, 1], 2 * 16, True, True, 4, "book", mode) + \
        (2 * recompute.RNG_STATE_BYTES if mode != "none" else 0)
    tokens = torch.randint(0, 128, (4, 16), generator=torch.Generator().manual_seed(0))  # two microbatches
    saved.enabled = True
    losses = [mod(t).float().square().mean() for t in tokens.tensor_split(2)]  # views of one storage
    saved.enabled = False
    assert saved.live == {0: 2 * per_mb} and saved.peak_total == 2 * per_mb
    losses.pop(0).backward()
    assert saved.total == per_mb  # the first microbatch's, dropped after its backward
    losses.pop().backward()
    assert saved.total == 0 and saved.peak == {0: 2 * per_mb}
    saved.reset()
    assert saved.peak_total == 0


def test_the_selective_policy_answers_a_recomputation_as_it_answered_the_forward():
    """torch before 2.13 asks the policy again while recomputing, and hands each kept operator the
    outputs the forward kept, in order: an answer that differs hands a matrix product another's
    output (issue 47: the recompute section failed on torch 2.11 with "shape '[2, 32, 32]' is invalid
    for input of size 11264"). Every recomputation, a zero-bubble schedule's second included, gets
    the forward's answers."""
    from types import SimpleNamespace

    from torch.utils.checkpoint import CheckpointPolicy

    from ppbook import recompute

    mm, add = torch.ops.aten.mm.default, torch.ops.aten.add.Tensor
    ops = [mm, mm, mm, add, mm, add, mm, mm, mm, add]  # the book's block: seven matrix products
    policy = recompute.selective_policy()

    def answers(recomputing: bool) -> list:
        return [policy(SimpleNamespace(is_recompute=recomputing), op) for op in ops]

    forward = answers(False)
    assert answers(True) == forward and answers(True) == forward
    kept = [a == CheckpointPolicy.MUST_SAVE for a, op in zip(forward, ops) if op == mm]
    assert kept == [True, False, True, False, True, False, True]  # the 1st, 3rd, 5th, ...


def test_saved_bytes_count_a_storage_once_however_many_views_of_it_are_saved():
    from ppbook import recompute

    saved = recompute.SavedBytes()
    x = torch.zeros(4, 8)  # 128 bytes
    views = [x, x[:2], x[1:3], x.t(), x[3:]]  # all within x's storage, overlapping
    packed = [saved._pack(0, v) for v in views]
    assert saved.total == 128
    del packed[0], packed[2]  # x and x.t() dropped: rows 0-2 and row 3 remain, overlapping
    assert saved.total == 128
    del packed[0]  # x[:2] dropped: rows 1-2 and 3 remain
    assert saved.total == 96
    packed.clear()
    assert saved.total == 0 and saved.peak_total == 128


def test_recompute_costs_subtract_the_same_schedule_without_checkpointing(recompute_script):
    def run(name, policies, f, b, forwards=1.0):
        return {"schedule": name, "policies": policies, "stage_costs": {"0F": f, "0B": b, "1F": f, "1I": b / 2, "1W": b / 2},
                "stages": {str(s): {"mode": m, "blocks": ["0", "1"], "forwards_per_block": forwards}
                           for s, m in enumerate(policies)}}
    runs = [run("ZBVZeroBubble", ["full", "selective", "none"], 1.0, 5.0, 2.0),
            run("ZBVZeroBubble", ["none", "none", "none"], 1.0, 2.0),
            run("GPipe", ["full", "full"], 1.0, 5.0, 2.0)]  # no run without checkpointing: nothing to subtract
    common = {"schedule": "ZBVZeroBubble", "policies": ["full", "selective", "none"], "blocks": 2,
              "forward_per_block": 0.5, "extra_backward_per_block": 1.5, "forwards_per_block": 2.0}
    assert recompute_script.recompute_costs(runs) == [{**common, "stage": 0, "mode": "full"},  # B
                                            {**common, "stage": 1, "mode": "selective"}]  # I + W


# --- bad input -------------------------------------------------------------------------------------
@pytest.mark.parametrize("script,args,message", [
    (RECOMPUTE, ["--schedules", "ZBVZeroBubble", "--policies", "selective"],
     "selective checkpointing cannot run under ZBVZeroBubble"),
    (RECOMPUTE, ["--policies", "full,most"], "'most' is not one of none, full, selective"),
    (COMPILE, ["--schedules", "1F1B", "--microbatches", "1", "--batch-size", "4"],
     "needs at least as many microbatches as stages (2)"),
])
def test_bad_input_is_one_line(script, args, message):
    assert_one_line_error(script, args, message, nproc=2)


@pytest.mark.parametrize("args, message", [
    (["--compile-modes", "eager", "blocks", "--stage", "1F1B"], "--stage picks the schedules of compile mode stage"),
    (["--schedules", "1F1B", "--stage", "GPipe"], "names schedules that --schedules"),
    (["--schedules", "1F1B", "--in-place", "DualPipeV"], "names schedules that --schedules"),
])
def test_compile_flags_that_would_be_ignored_are_refused(args, message):
    assert message in refusal(COMPILE, args)
