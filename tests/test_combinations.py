"""Chapter 12: a pipeline combined with torch.compile, activation checkpointing, FSDP2, tensor
parallelism and changing lengths. The chapter launches and checks, against one process: the
compile sweep per block, per stage and in place (2 processes), the checkpointing policies (book
kernels, 2 processes), FSDP2 on a (pp, dp) mesh and tensor parallelism on a (pp, tp) mesh (4
processes), the shape strategies and the shorter-sequence failure (2 processes). These tests launch
FSDP2 and tensor parallelism on their 2 x 2 meshes again, small and at m = 3, the checkpointing and
shape sections' --check at m = 3, 5 and 6 on 2 and 3 ranks, and the compile section once on 2 and
once on 3 ranks; and they cover the rest: the fused kernels under checkpointing in a pipeline, a
longer second step, the pure pieces (packing, batching, the FSDP unshard window against torch's
own lowering, the compile check), and bad input."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_one_line_error, refusal

from ppbook import data, launch, precision, torch_orders
from ppbook.planner.fsdp_window import StageGroups, fsdp_step, with_unshard_window
from ppbook.planner.memory import layer_activation_bytes
from ppbook.planner.shapes import ModelShape
from ppbook.planner.traffic import fsdp_gathers
from ppbook.stages import TORCH_SCHEDULES, schedule_problem

SCRIPT = "12_combinations.py"


@pytest.fixture(scope="module")
def script():
    return launch.load_script(SCRIPT)


# --- launched: what the chapter does not run ------------------------------------------------------
@pytest.mark.torchrun
def test_fused_kernels_keep_what_the_planner_counts_in_every_stage():
    d = launch.torchrun(SCRIPT, ["--section", "recompute", "--kernels", "fused", "--policies", "none", "selective",
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


@pytest.mark.torchrun
def test_a_longer_second_step_aborts_gloo():
    r = launch.torchrun(SCRIPT, ["--section", "shapes", "--lengths", "16", "24"], nproc=2, timeout=120,
                        check=False, json_result=False)
    assert r.returncode != 0
    assert "Received data size doesn't match expected size" in r.output, r.output[-3000:]


SMALL = ["--dim", "32", "--seq-len", "16", "--steps", "1", "--warmup", "0", "--check"]
ODD_M = ["--microbatches", "3", "--batch-size", "12"]  # not a power of two: the references sum, then divide


@pytest.mark.torchrun
def test_fsdp_on_a_2_by_2_mesh_matches_one_process_resharding_or_not():
    d = launch.torchrun(SCRIPT, ["--section", "fsdp", "--schedules", "1F1B", *SMALL, *ODD_M], nproc=4, timeout=120).data
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
    d = launch.torchrun(SCRIPT, ["--section", "tp", *SMALL, *ODD_M], nproc=4, timeout=120).data
    assert d["match"] and (d["pp"], d["tp"]) == (2, 2)
    per_block = {False: 2 + 5, True: 2 + 2}  # forward + backward all-reduces per block and microbatch
    assert {r["prepared"] for r in d["runs"]} == set(per_block)
    for run in d["runs"]:
        assert run["max_grad_diff"] <= precision.tolerance("float32"), run["max_grad_diff"]
        for row in run["probed"]:  # every rank of the mesh
            n = sum(1 for c in row["collectives"] if c["op"] == "all_reduce")
            assert n == per_block[run["prepared"]] * row["blocks"] * d["microbatches"], (run["prepared"], n)


# --- launched: every section's --check at m = 3, 5 and 6 on 2 and 3 ranks (issue 26) --------------
MS = (3, 5, 6)
EVERY_M = ["--batch-size", "30", "--layers", "6", *SMALL]  # 30: divisible by 3, 5 and 6
# The compile section once per p, at an m where (nearly) every schedule is legal: what compiling
# changes does not depend on m (each block is compiled once and its graph runs once per microbatch,
# asserted below at two m's), and each schedule's arithmetic at every m is checked eager by
# 05_schedules.py (tests/test_check_every_m.py).
COMPILE_M = {2: 6, 3: 5}
SPLIT = ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")


def legal(schedules, p: int, m: int) -> list[str]:
    """Those of ``schedules`` that torch 2.13 runs with m microbatches on p ranks (v = 2)."""
    return [s for s in schedules if schedule_problem(s, p, m, 2, 6) is None]


def every_section(p: int, m: int) -> list[list[str]]:
    """One launch per section at p ranks and m microbatches: checkpointing per stage, two shape
    strategies. FSDP and tensor parallelism run at m = 3 on their 2 x 2 meshes above, the only
    layouts where they split anything; the compile section runs once per p (COMPILE_M)."""
    return [["--section", "recompute", "--policies", "none", "full,selective"],
            ["--section", "shapes", "--documents", "60", "--strategies", "bucket", "pack"]]


def compile_sweep(p: int) -> list[str]:
    """Every legal schedule compiled per block, or in place where the split schedules refuse the
    wrapper; on 2 ranks also whole stages, under 1F1B (runs) and DualPipeV (refused) only: a whole
    stage compiles slowly."""
    stage = ["stage", "--stage", "1F1B", "DualPipeV"] if p == 2 else []
    return ["--section", "compile", "--compile-modes", "blocks", "in-place", *stage,
            "--schedules", *legal(TORCH_SCHEDULES, p, COMPILE_M[p])]


def check_compiled(d: dict, p: int) -> None:
    """The compile sweep's runs: the wrappers refused with torch's message exactly where the
    backward splits, everything else compiled (its graphs ran) and equal to one process."""
    m, tol = d["microbatches"], precision.tolerance("float32")
    ran = {(r["schedule"], r["mode"]) for r in d["runs"]}
    assert {s for s, _ in ran} == set(legal(TORCH_SCHEDULES, p, m)), ran
    assert {x for x in ran if x[1] == "stage"} == ({("1F1B", "stage"), ("DualPipeV", "stage")} if p == 2 else set())
    for r in d["runs"]:
        where = (r["schedule"], r["mode"])
        if r["schedule"] in SPLIT and r["mode"] != "in-place":
            assert f"The Schedule{r['schedule']} schedule is not supported with stage modules that have used " \
                   "torch.compile" in r["refused"], where
            continue
        assert r["refused"] is None and r["max_grad_diff"] <= tol and r["compiled_runs"] > 0, (where, r)
        stages = p * (1 if r["schedule"] in ("GPipe", "1F1B") else 2)
        graphs = stages if r["mode"] == "stage" else r["microbatches_x_blocks"] // m  # compiled modules
        assert r["graph_calls"]["forward in F"] == m * graphs, (where, r["graph_calls"])  # once per microbatch


@pytest.mark.torchrun
@pytest.mark.parametrize("p", [2, 3])
def test_check_passes_at_3_5_and_6_microbatches(p):
    def check(args: list[str], m: int) -> dict:
        r = launch.torchrun(SCRIPT, [*args, *EVERY_M, "--microbatches", str(m)], nproc=p, timeout=180, check=False)
        assert r.returncode == 0 and r.data["match"], f"{r.shell_command}\n{r.output[-3000:]}"
        return r.data

    for m in MS:
        for args in every_section(p, m):
            d = check(args, m)
            for run in d.get("kernels") and d["runs"] or []:  # recompute: every 1F1B stage as the model says
                assert {s: st["saved_peak_bytes"] for s, st in run["stages"].items()} == run["stage_model_bytes"], run
    check_compiled(check(compile_sweep(p), COMPILE_M[p]), p)


def test_the_compile_check_fails_when_nothing_ran_compiled(script, capsys):
    args = script.parse_args(["--section", "compile", "--compile-modes", "blocks", "in-place"])
    run = {"schedule": "1F1B", "mode": "blocks", "refused": None, "step_seconds": 0.1, "graphs": 1,
           "compiled_runs": 8, "max_grad_diff": 0.0}
    refused = {"schedule": "DualPipeV", "mode": "blocks", "refused": "RuntimeError: ..."}
    assert script.report(args, {"runs": [run, refused]})
    assert not script.report(args, {"runs": [{**run, "compiled_runs": 0}, refused]})  # fell back to eager
    assert script.report(args, {"runs": [{**run, "compiled_runs_per_rank": [4, 4]}, refused]})
    assert not script.report(args, {"runs": [{**run, "compiled_runs_per_rank": [8, 0]}, refused]})  # one rank eager
    assert not script.report(args, {"runs": [refused]})  # every compiled mode refused
    eager = script.parse_args(["--section", "compile", "--compile-modes", "eager"])
    assert script.report(eager, {"runs": [{**run, "mode": "eager", "compiled_runs": 0}]})
    assert not script.report(eager, {"runs": [{**run, "mode": "eager"}]})  # eager ran compiled graphs
    assert "NOT COMPILED" in capsys.readouterr().out


# --- in-process: what a stage keeps, and what recomputing costs ----------------------------------
@pytest.mark.parametrize("mode", ["none", "full", "selective"])
def test_saved_bytes_follow_each_microbatch_from_its_forward_to_its_backward(mode):
    from ppbook import recompute, workload
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


def test_recompute_costs_subtract_the_same_schedule_without_checkpointing(script):
    def run(name, policies, f, b, forwards=1.0):
        return {"schedule": name, "policies": policies, "stage_costs": {"0F": f, "0B": b, "1F": f, "1I": b / 2, "1W": b / 2},
                "stages": {str(s): {"mode": m, "blocks": ["0", "1"], "forwards_per_block": forwards}
                           for s, m in enumerate(policies)}}
    runs = [run("ZBVZeroBubble", ["full", "selective", "none"], 1.0, 5.0, 2.0),
            run("ZBVZeroBubble", ["none", "none", "none"], 1.0, 2.0),
            run("GPipe", ["full", "full"], 1.0, 5.0, 2.0)]  # no run without checkpointing: nothing to subtract
    common = {"schedule": "ZBVZeroBubble", "policies": ["full", "selective", "none"], "blocks": 2,
              "forward_per_block": 0.5, "extra_backward_per_block": 1.5, "forwards_per_block": 2.0}
    assert script.recompute_costs(runs) == [{**common, "stage": 0, "mode": "full"},  # B
                                            {**common, "stage": 1, "mode": "selective"}]  # I + W


# --- pure: packing and batching ------------------------------------------------------------------
def rows_of(lengths: list[int], width: int):
    g = torch.Generator().manual_seed(0)
    rows = torch.randint(1, 50, (len(lengths), width), generator=g)
    for r, n in zip(rows, lengths):
        r[n:] = 0  # padding
    return rows, torch.tensor(lengths)


def test_packing_keeps_every_prediction_and_never_cuts_a_document(script):
    lengths = [5, 9, 3, 17, 2, 8, 12]
    rows, n = rows_of(lengths, 18)
    tokens, targets, docs = script.pack(rows, n, 17)
    assert tokens.shape == targets.shape == docs.shape and tokens.shape[1] == 17
    real = targets != data.IGNORE_INDEX
    assert int(real.sum()) == sum(x - 1 for x in lengths)
    got = [(tuple(tokens[i][docs[i] == d].tolist()), tuple(targets[i][docs[i] == d].tolist()))
           for i in range(len(docs)) for d in sorted(set(docs[i].tolist()) - {-1})]
    want = [(tuple(r[:k - 1].tolist()), tuple(r[1:k].tolist())) for r, k in zip(rows, lengths)]
    assert got == want  # each document whole, in order, with its own targets
    assert bool(((docs == -1) == ~real).all())  # padding is its own document, and never scored


def test_batches_take_the_shapes_each_strategy_promises(script):
    lengths = [3, 5, 9, 14, 17, 20, 30, 33]
    rows, n = rows_of(lengths, 33)
    buckets = [8, 16, 32]
    shapes = {s: [t.shape[1] for t, _, _ in script.shaped_batches(s, rows, n, 2, buckets)]
              for s in ("pad", "bucket", "recreate", "pack")}
    assert set(shapes["pad"]) == {32} and set(shapes["pack"]) == {32}
    assert sorted(shapes["recreate"]) == [4, 13, 19, 32]  # each batch's longest document, minus one
    assert sorted(shapes["bucket"]) == [8, 16, 32, 32]
    for tokens, targets, extra in script.shaped_batches("pack", rows, n, 2, buckets):
        assert extra["doc_ids"].shape == tokens.shape


def test_the_document_mask_is_causal_within_documents(script):
    docs = torch.tensor([[0, 0, 1, 1, -1]])
    mask = script.document_mask(docs)[0, 0]
    assert mask.tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0],
                             [0, 0, 0, 0, 1]]


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
@pytest.mark.parametrize("args,nproc,message", [
    (["--section", "tp", "--tp", "3"], 4, "--tp 3 must divide the number of processes (4)"),
    (["--section", "tp", "--tp", "4", "--kv-heads", "2"], 4, "each tensor-parallel rank computes whole heads"),
    (["--section", "recompute", "--schedules", "ZBVZeroBubble", "--policies", "selective"], 2,
     "selective checkpointing cannot run under ZBVZeroBubble"),
    (["--section", "recompute", "--policies", "full,most"], 2, "'most' is not one of none, full, selective"),
    (["--section", "compile", "--schedules", "1F1B", "--microbatches", "1", "--batch-size", "4"], 2,
     "needs at least as many microbatches as stages (2)"),
])
def test_bad_input_is_one_line(args, nproc, message):
    assert_one_line_error(SCRIPT, args, message, nproc=nproc)


@pytest.mark.parametrize("args, message", [
    (["--section", "compile", "--compile-modes", "eager", "blocks", "--stage", "1F1B"],
     "--stage picks the schedules of compile mode stage"),
    (["--section", "compile", "--schedules", "1F1B", "--stage", "GPipe"], "names schedules that --schedules"),
    (["--section", "compile", "--schedules", "1F1B", "--in-place", "DualPipeV"], "names schedules that --schedules"),
])
def test_compile_flags_that_would_be_ignored_are_refused(args, message):
    assert message in refusal("12_combinations.py", args)


def test_a_compiled_block_recompiles_for_lengths_as_the_chapter_says():
    """Chapter 12, changing lengths under compile: by default a block compiled in place recompiles
    once, at the second length, with the length dynamic, and that graph serves later lengths;
    with dynamic=False every length recompiles, up to torch's recompile_limit, then runs eager."""
    from torch._dynamo.utils import counters

    from ppbook.models import LlamaConfig, build_model

    cfg = LlamaConfig(vocab_size=32, dim=32, n_layers=1, n_heads=2, n_kv_heads=1, ffn_hidden_dim=32, max_seq_len=64)
    limit, graphs = torch._dynamo.config.recompile_limit, {}
    for dynamic in (None, False):
        torch._dynamo.reset()
        counters.clear()
        model = build_model(cfg, seed=0)
        for block in model.layers.values():
            block.compile(backend="eager", dynamic=dynamic)
        with torch.no_grad():
            for length in range(4, 4 + limit + 3):
                model(torch.randint(0, cfg.vocab_size, (2, length)))
        graphs[dynamic] = counters["stats"]["unique_graphs"]
    torch._dynamo.reset()
    assert graphs == {None: 2, False: limit}
