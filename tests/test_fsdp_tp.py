"""Chapter 12, FSDP2 and tensor parallelism inside a pipeline's stages (``scripts/12_fsdp.py``,
``scripts/12_tp.py``). The chapter launches and checks, against one process: FSDP2 on a (pp, dp)
mesh and tensor parallelism on a (pp, tp) mesh (4 processes). These tests launch both again on
their 2 x 2 meshes, small and at m = 3 (the only layouts where they split anything), and cover the
rest: the FSDP unshard window against torch's own lowering, and bad input."""

from __future__ import annotations

import pytest
from conftest import assert_one_line_error

from ppbook import launch, precision, torch_orders
from ppbook.planner.fsdp_window import StageGroups, fsdp_step, with_unshard_window
from ppbook.planner.traffic import fsdp_gathers

FSDP, TP = "12_fsdp.py", "12_tp.py"
SMALL = ["--dim", "32", "--seq-len", "16", "--steps", "1", "--warmup", "0", "--check"]
ODD_M = ["--microbatches", "3", "--batch-size", "12"]  # not a power of two: the references sum, then divide


@pytest.mark.torchrun
def test_fsdp_on_a_2_by_2_mesh_matches_one_process_resharding_or_not():
    d = launch.torchrun(FSDP, ["--schedules", "1F1B", *SMALL, *ODD_M], nproc=4, timeout=120).data
    assert d["match"] and (d["pp"], d["dp"]) == (2, 2)
    by = {r["reshard_after_forward"]: r for r in d["runs"]}
    assert set(by) == {True, False}
    for run in by.values():
        assert run["max_grad_diff"] <= precision.tolerance("float32"), run["max_grad_diff"]
        assert len(run["ranks"]) == 4
        for x in run["ranks"]:  # one stage per rank: the planner's count is exact, and there is no window
            assert x["all_gathers"] == x["planner_gathers"] == x["no_window_gathers"], x
            assert x["all_gather_bytes"] == x["planner_gathered_bytes"], x  # every dimension splits in 2: no padding
            assert x["sent_bytes"] == (x["all_gather_bytes"] + x["reduce_scatter_bytes"]) / 2, x  # a ring of 2
            assert x["reduce_scatter_bytes"] == x["stage_param_bytes"], x  # every gradient once, float32
    on, off = by[True]["ranks"][0], by[False]["ranks"][0]
    assert on["all_gathers"] > off["all_gathers"]  # resharding after forward gathers again for the backward
    assert on["reduce_scatters"] == off["reduce_scatters"] == off["all_gathers"]  # once per group, after the step


@pytest.mark.torchrun
def test_tensor_parallel_on_a_2_by_2_mesh_matches_one_process_with_either_plan():
    d = launch.torchrun(TP, [*SMALL, *ODD_M], nproc=4, timeout=120).data
    assert d["match"] and (d["pp"], d["tp"]) == (2, 2)
    per_block = {False: 2 + 5, True: 2 + 2}  # forward + backward all-reduces per block and microbatch
    assert {r["prepared"] for r in d["runs"]} == set(per_block)
    for run in d["runs"]:
        assert run["max_grad_diff"] <= precision.tolerance("float32"), run["max_grad_diff"]
        for row in run["probed"]:  # every rank of the mesh
            n = sum(1 for c in row["collectives"] if c["op"] == "all_reduce")
            assert n == per_block[run["prepared"]] * row["blocks"] * d["microbatches"], (run["prepared"], n)



# --- pure: FSDP's all-gathers under torch's unshard window ----------------------------------------
@pytest.mark.parametrize("name,p,m,v", [("Interleaved1F1B", 2, 4, 2), ("Interleaved1F1B", 2, 4, 4),
                                        ("Interleaved1F1B", 4, 8, 3), ("LoopedBFS", 2, 4, 4),
                                        ("InterleavedZeroBubble", 2, 4, 4), ("ZBVZeroBubble", 2, 4, 2),
                                        ("DualPipeV", 2, 4, 2)])
def test_the_unshard_window_is_torchs(name, p, m, v):
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops
    from torch.distributed.pipelining.schedules import _add_unshard_reshard

    kinds = {"FORWARD": "F", "FULL_BACKWARD": "B", "BACKWARD_INPUT": "I", "BACKWARD_WEIGHT": "W"}
    for rank, acts in enumerate(get_schedule_ops(name, p, m, num_stages_per_rank=v)):
        compute = [a for a in acts if a is not None and a.computation_type.name in kinds]
        theirs = [(a.stage_index, kinds.get(a.computation_type.name, a.computation_type.name))
                  for a in _add_unshard_reshard(compute)]
        ours = with_unshard_window([(a.stage_index, kinds[a.computation_type.name]) for a in compute])
        assert ours == theirs, (name, rank)


@pytest.mark.parametrize("v", [2, 3])
@pytest.mark.parametrize("reshard", [True, False])
def test_up_to_three_stages_per_rank_the_window_changes_no_count(v, reshard):
    order = torch_orders.torch_order("Interleaved1F1B", 2, 4, v)
    for acts in order.values():
        actions = [(a.stage, a.kind) for a in acts]
        groups = {s: StageGroups((10, 10), root=5 if s == 0 else 0) for s, _ in actions}
        planner = sum(2 * fsdp_gathers([k for s2, k in actions if s2 == s], reshard) + (1 if groups[s].root else 0)
                      for s in groups)
        assert fsdp_step(actions, groups, reshard, window=True).all_gathers == planner
        assert fsdp_step(actions, groups, reshard, window=False).all_gathers == planner


def test_four_stages_per_rank_are_gathered_again():
    actions = [(a.stage, a.kind) for a in torch_orders.torch_order("Interleaved1F1B", 2, 4, 4)[0]]
    groups = {s: StageGroups((10,)) for s, _ in actions}
    windowed = fsdp_step(actions, groups, False, window=True)
    assert windowed.all_gathers > fsdp_step(actions, groups, False, window=False).all_gathers == 4
    assert windowed.gathered_bytes == 10 * windowed.all_gathers


# --- bad input -------------------------------------------------------------------------------------
@pytest.mark.parametrize("script,args,message", [
    (TP, ["--tp", "3"], "--tp 3 must divide the number of processes (4)"),
    (TP, ["--tp", "4", "--kv-heads", "2"], "each tensor-parallel rank computes whole heads"),
    (FSDP, ["--dp", "3"], "--dp 3 must divide the number of processes (4)"),
    (FSDP, ["--batch-size", "4"], "must split into --dp 2 replicas of --microbatches 4"),
])
def test_bad_input_is_one_line(script, args, message):
    assert_one_line_error(script, args, message, nproc=4)
