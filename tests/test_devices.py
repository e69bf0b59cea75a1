"""What the first run on a GPU machine broke (issue 14), checked on a CPU.

- Every tensor a script hands to a stage or a schedule lies on the stage's device and is
  contiguous: the preparation functions run with ``torch.device("meta")`` as the target, and
  one-process runs of every script assert on what the schedules receive.
- ``--device cuda`` on a node with fewer GPUs than processes is one line, before any process group.
- ZBVZeroBubble and DualPipeV on gloo under torch < 2.13 are refused in one line, and so is a looped
  schedule at one process; every script's gate asks about the device the run uses (issue 47).
- Every script's one-process run, with the run's device told apart from the host
  (``helpers/run_device.py``): no tensor made without the run's device meets one on it, or reaches a
  collective; the one-process references run on the run's device (issue 47: the first GPU record).
- Every GPU command printed in a docstring, the README or a chapter passes its script's
  validation with the shipped data (the GPU count faked to the processes it asks for).
"""

from __future__ import annotations

import argparse
import ast
import re
import shlex
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.pipelining import schedules

from ppbook import data as ppdata
from ppbook import dist as ppdist
from ppbook import cli, workload
from ppbook.launch import load_script

ROOT = Path(__file__).resolve().parents[1]
META = torch.device("meta")


def assert_ready(tensors, device) -> None:
    for t in tensors:
        assert t.device.type == torch.device(device).type, f"a {tuple(t.shape)} tensor on {t.device}, not {device}"
        assert t.is_contiguous(), f"a {tuple(t.shape)} tensor with strides {t.stride()} is not contiguous"


# --- the preparation functions, aimed at a device that is not the CPU -----------------------------
def test_on_device_moves_and_makes_contiguous():
    rows = torch.arange(12).view(3, 4)
    assert not rows[:, :-1].is_contiguous()  # the slice torch 2.11 refused
    assert_ready(ppdist.on_device(META, rows[:, :-1], rows[:, 1:]), META)


def test_data_slices_are_contiguous():
    rows, lengths = torch.arange(30).view(3, 10), torch.tensor([10, 7, 4])
    assert_ready(ppdata.inputs_and_targets(rows, lengths), "cpu")
    args = argparse.Namespace(seed=0, vocab=50, batch_size=4, seq_len=8)
    assert_ready(workload.make_batch(args, 0, META), META)
    assert_ready(workload.make_batch(args, 0), "cpu")


def test_06_train_held_out_batches_on_the_stage_device():
    """The crash of issue 14 (1): evaluation handed CPU tokens to a GPU schedule."""
    mod = load_script("06_train.py")
    args = mod.parse_args(["--eval-batches", "2"])
    mod.validate(args, 1)
    batches = mod.held_out_batches(args.dataset_, args, META)
    assert len(batches) == 2
    for batch in batches:
        assert_ready(batch, META)


def test_a1_batches_on_the_stage_device():
    mod = load_script("a1_migrate.py")
    assert_ready(mod.make_batch(mod.parse_args([]), 0, META), META)


def test_13_moe_reference_makes_its_batches_on_the_models_device(monkeypatch):
    """The one-process reference of scripts/13_moe.py once made its batches on the CPU, so the
    docstring's GPU command would have failed at its first forward: the reference asks for them
    on the device its model lies on."""
    mod = load_script("13_moe.py")
    args = mod.parse_args(["--layers", "2", "--dim", "32"])
    full = mod.moe.build_moe_model(mod.moe_config(args), seed=args.seed).to(META)
    asked = []

    class Asked(Exception):
        pass

    def spy(a, step, device="cpu"):
        asked.append(torch.device(device))
        raise Asked

    monkeypatch.setattr(mod, "make_batch", spy)
    with pytest.raises(Asked):
        mod.reference(full, args, 1)
    assert asked == [META]


# --- one-process runs: what the schedules receive (used below) ---------------------------------------
@pytest.fixture
def schedule_spy(monkeypatch):
    """Wrap every schedule's step and eval: each tensor handed to them must be on a stage's device and
    contiguous. Returns the list of (schedule class, tensor count) seen."""
    seen = []

    def devices_of(schedule):
        stages = getattr(schedule, "_stages", None) or [schedule._stage]
        return {torch.device(s.device) for s in stages}

    def wrap(method):
        def spy(self, *args, target=None, losses=None, **kwargs):
            tensors = [a for a in (*args, target, *kwargs.values()) if isinstance(a, torch.Tensor)]
            for t in tensors:  # under helpers.run_device a tensor made without the run's device is on "cpu"
                assert t.device in devices_of(self), f"{type(self).__name__} got a tensor on {t.device}"
                assert t.is_contiguous(), f"{type(self).__name__} got a non-contiguous {tuple(t.shape)} tensor"
            seen.append((type(self).__name__, len(tensors)))
            return method(self, *args, target=target, losses=losses, **kwargs)
        return spy

    for cls in (schedules.PipelineScheduleSingle, schedules.PipelineScheduleMulti):
        for name in ("step", "eval"):
            if name in vars(cls):
                monkeypatch.setattr(cls, name, wrap(vars(cls)[name]))
    monkeypatch.setenv("TQDM_DISABLE", "1")
    return seen


# --- the run's device told apart from the host: tensors made without it --------------------------------
def test_the_check_finds_a_tensor_made_without_the_runs_device(monkeypatch):
    """The two lines of the first GPU record, in miniature: a position index made with a bare
    ``torch.arange`` beside the rows on the run's device (data.py), and a bare ``torch.tensor`` handed
    to a collective (06_loss_and_masks.py). What the test below would find in the book."""
    from helpers.run_device import RUN, DeviceMismatch, run_device_checked

    from ppbook.nccl_rules import RuleError

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    with run_device_checked(monkeypatch):
        rows = torch.arange(12).view(2, 6).to(RUN)
        assert rows.device == RUN and torch.arange(3).device == torch.device("cpu")
        with pytest.raises(DeviceMismatch, match=r"test_devices.py:\d+: .*made without the run's device"):
            torch.arange(6)[None, :] >= rows  # noqa: B015
        assert (torch.arange(6, device=rows.device)[None, :] >= rows).device == RUN
        assert rows[torch.tensor([1, 0])].device == RUN  # a run tensor indexed by host indices: fine on a GPU too
        assert (rows + torch.tensor(1)).device == RUN  # a host 0-dim tensor is a scalar to CUDA
        info = ppdist.setup("cpu")
        try:
            assert info.device == RUN
            with pytest.raises((DeviceMismatch, RuleError), match="cpu"):
                dist.all_reduce(torch.tensor(1.0))
            dist.all_reduce(torch.tensor(1.0, device=info.device))
            assert ppdist.gather_to_rank0({"a": 1}) == [{"a": 1}]  # gloo's object collectives: the run's device
        finally:
            ppdist.teardown()


# Every script's one-process run, small (a3_troubleshooting.py is staged on exactly two processes;
# 01_minimal.py picks its device without ppbook, so its run cannot be told from the host), under the
# check; compiled paths (12's compile section) are left out: TorchDynamo does not trace under it.
S = ["--layers", "2", "--dim", "16", "--heads", "2", "--vocab", "64", "--seq-len", "8", "--batch-size", "4"]
TRACKED_RUNS = [
    ("01_first_pipeline.py", [*S, "--microbatches", "2", "--steps", "1", "--check"]),
    ("02_naive.py", [*S, "--microbatches", "1", "--steps", "1", "--warmup", "0", "--check"]),
    ("03_gpipe.py", [*S, "--microbatches", "2", "--steps", "1", "--warmup", "0", "--check"]),
    ("04_splitting.py", [*S, "--microbatches", "2", "--check", "--experiments", "check", "balance", "--balance-vocab",
                         "256", "--balance-dim", "16", "--balance-layers", "2", "--steps", "1", "--warmup", "0"]),
    ("05_schedules.py", ["--schedules", "GPipe", "Interleaved1F1B", "DualPipeV", "--layers", "4", "--dim", "16",
                         "--batch-size", "8", "--microbatches", "4", "--steps", "1", "--warmup", "0", "--check"]),
    ("06_loss_and_masks.py", ["--seq-len", "8"]),
    ("06_train.py", ["--steps", "2", "--eval-every", "1", "--eval-batches", "1", "--batch-size", "4", "--seq-len",
                     "16", "--layers", "2", "--dim", "32", "--microbatches", "2", "--check"]),
    ("06_train.py", ["--steps", "1", "--eval-batches", "1", "--batch-size", "4", "--seq-len", "16", "--layers", "2",
                     "--dim", "32", "--microbatches", "2", "--eval-impl", "stages"]),
    ("07_checkpointing.py", [*S, "--microbatches", "2", "--steps", "2", "--check"]),
    ("07_checkpointing.py", [*S, "--microbatches", "2", "--steps", "2", "--save-dir", "{tmp}", "--save-every", "1",
                             "--check"]),
    ("07_checkpointing.py", [*S, "--microbatches", "2", "--steps", "3", "--save-dir", "{tmp}", "--resume", "--check"]),
    ("08_beyond_chain.py", [*S, "--microbatches", "2", "--steps", "1", "--check"]),
    ("09_scaling_out.py", [*S, "--microbatches", "2", "--dp", "1", "--steps", "1", "--check"]),
    ("12_shapes.py", ["--check", "--documents", "16", "--batch-size", "4", "--buckets", "16", "32", "--layers", "2",
                      "--dim", "32"]),
    ("12_recompute.py", ["--check", "--layers", "2", "--dim", "32", "--steps", "1", "--warmup", "0"]),
    ("13_moe.py", ["--pp", "1", "--ep", "1", "--check", "--layers", "2", "--dim", "32", "--steps", "1", "--warmup",
                   "0", "--microbatches", "2", "--batch-size", "4", "--seq-len", "8"]),
    ("14_own_schedule.py", ["--check", "--schedules", "1F1B-hand", "1F1B", "Interleaved1F1B", "ZB-H2", "V-Half",
                            "ZBVZeroBubble", "DualPipeV", "--layers", "4", "--dim", "16", "--steps", "1", "--warmup",
                            "0", "--microbatches", "4", "--batch-size", "4", "--seq-len", "8"]),
    ("15_packed.py", ["--check", "--layers", "2", "--seq-len", "16", "--microbatches", "2", "--lengths"]),
    ("a1_migrate.py", ["--check", "--balance", "2", "--steps", "1", "--checkpoint", "always"]),
    ("06_train.py", ["--steps", "1", "--eval-batches", "1", "--batch-size", "4", "--seq-len", "16", "--layers", "2",
                     "--dim", "32", "--microbatches", "2", "--dtype", "bfloat16", "--check"]),
]


@pytest.mark.parametrize("script,argv", TRACKED_RUNS, ids=[f"{s}:{i}" for i, (s, _) in enumerate(TRACKED_RUNS)])
def test_every_tensor_meets_tensors_on_its_device(script, argv, schedule_spy, monkeypatch, tmp_path_factory):
    """A tensor made without the run's device (on a GPU: on the CPU) never meets one on it, nor reaches
    a collective; the schedules receive contiguous tensors (``schedule_spy``); the one-process
    references run on the run's device (09_scaling_out.py's ran on the CPU beside a GPU pipeline:
    2.4e-5 apart on an H200, issue 47)."""
    from helpers.run_device import RUN, run_device_checked

    from ppbook import workload

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    asked = []
    for name in ("full_model", "adamw_reference_losses"):
        def spy(*a, real=getattr(workload, name), name=name, **k):
            asked.append((name, k.get("device", a[-1])))
            return real(*a, **k)
        monkeypatch.setattr(workload, name, spy)
    mod = load_script(script)
    saves = tmp_path_factory.getbasetemp() / "run_device_checkpoints"  # 07's save, then its resume
    argv = [str(saves) if a == "{tmp}" else a for a in argv]
    with run_device_checked(monkeypatch) as mode:
        try:
            assert mod.main([*argv, "--device", "cpu"]) == 0
        finally:
            ppdist.teardown()
    assert mode.mismatches == 0
    assert all(torch.device(device) == RUN for _, device in asked), asked


# --- the GPU count, faked ----------------------------------------------------------------------------
def fake_gpus(monkeypatch, count: int, local_world_size: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_world_size))


def test_pick_device_counts_gpus(monkeypatch):
    fake_gpus(monkeypatch, 1, 2)
    with pytest.raises(ValueError, match=r"found 1 GPU\(s\) on this node for 2 processes.*--nproc-per-node 1"):
        ppdist.pick_device(1, "cuda")
    assert ppdist.pick_device(1, "auto") == torch.device("cpu")  # the CPU commands still run
    fake_gpus(monkeypatch, 4, 4)
    assert ppdist.pick_device(3, "cuda") == torch.device("cuda", 3)
    assert ppdist.pick_device(3, "auto") == torch.device("cuda", 3)


@pytest.mark.parametrize("script", ["01_first_pipeline.py", "06_loss_and_masks.py", "a3_troubleshooting.py"])
def test_too_few_gpus_is_one_line_before_any_process_group(script, monkeypatch, capsys):
    fake_gpus(monkeypatch, 1, 2)
    monkeypatch.setenv("WORLD_SIZE", "2")
    extra = ["--mistake", "none"] if script.startswith("a3") else []
    monkeypatch.setattr(ppdist, "setup", lambda *a, **k: pytest.fail("a process group was set up"))
    assert load_script(script).main(["--device", "cuda", *extra]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "found 1 GPU(s) on this node for 2 processes" in lines[0], lines
    assert not dist.is_initialized()


# --- torch < 2.13 on gloo: the V-shaped schedules --------------------------------------------------
def test_v_schedules_gated_on_old_torch_gloo(monkeypatch, capsys):
    assert ppdist.schedule_backend_problem("DualPipeV", torch.device("cpu")) is None  # 2.13 here
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu130")
    for name in ppdist.V_SCHEDULES:
        assert "needs torch >= 2.13, found 2.11.0+cu130" in ppdist.schedule_backend_problem(name, torch.device("cpu"))
        assert ppdist.schedule_backend_problem(name, torch.device("cuda", 0)) is None  # NCCL is fine
    assert ppdist.schedule_backend_problem("1F1B", torch.device("cpu")) is None
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert load_script("05_schedules.py").main(["--schedules", "1F1B", "ZBVZeroBubble", "--device", "cpu"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "ZBVZeroBubble on gloo (CPU) needs torch >= 2.13" in lines[0], lines


def test_looped_schedules_at_one_process_gated_on_old_torch_gloo(monkeypatch):
    """torch 2.11 on gloo: every stage of a looped schedule at one process lies on rank 0, which sends
    to itself in _initialize_stages ("Pair is not connected", 15_packed.py at one process)."""
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu130")
    cpu = torch.device("cpu")
    for name in ("Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble"):
        assert "at 1 process(es) on gloo (CPU) needs torch >= 2.13" in ppdist.schedule_backend_problem(name, cpu, 1)
        assert ppdist.schedule_backend_problem(name, cpu, 2) is None  # stage i on rank i % p: no neighbour shares
        assert ppdist.schedule_backend_problem(name, torch.device("cuda", 0), 1) is None
    assert ppdist.schedule_backend_problem("1F1B", cpu, 1) is None


# Each script that validates schedules, with one its gate refuses on gloo under torch 2.11 (a V, or a
# looped schedule at one process): the gate must ask about the device the run uses (issue 47: 13_moe.py
# refused DualPipeV with --device cuda, its gate asking about the CPU whatever the device).
GATED = [("05_schedules.py", ["--schedules", "DualPipeV", "--layers", "8", "--microbatches", "8",
                              "--batch-size", "32"], 2),
         ("12_compile.py", ["--schedules", "ZBVZeroBubble"], 1),
         ("13_moe.py", ["--pp", "1", "--ep", "1", "--runs", "DualPipeV"], 1),
         ("14_own_schedule.py", ["--schedules", "V-Half"], 2),
         ("15_packed.py", ["--schedules", "Interleaved1F1B"], 1)]


@pytest.mark.parametrize("script,argv,world", GATED, ids=[s for s, _, _ in GATED])
def test_schedule_gates_ask_about_the_runs_device(script, argv, world, monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu130")
    fake_gpus(monkeypatch, world, world)
    monkeypatch.setenv("WORLD_SIZE", str(world))
    mod = load_script(script)
    mod.validate(mod.parse_args([*argv, "--device", "cuda"]), world)  # NCCL: no refusal
    with pytest.raises(ValueError, match=r"on gloo \(CPU\) needs torch >= 2.13"):
        mod.validate(mod.parse_args([*argv, "--device", "cpu"]), world)


def test_15_packed_keeps_a_blockmask_from_old_torchs_split_backward(monkeypatch, capsys):
    """torch 2.11's split backward asks every stage input for requires_grad, a BlockMask given by
    keyword included (issue 47: "'BlockMask' object has no attribute 'requires_grad'", ZBVZeroBubble on
    an H200): under torch < 2.13 that pairing is skipped in one printed line, the others run."""
    mod = load_script("15_packed.py")
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu130")
    ran = []
    monkeypatch.setattr(mod, "run", lambda name, variant, *a: ran.append((name, variant)) or ({}, 0.0))
    monkeypatch.setattr(mod, "worst_difference", lambda *a: 0.0)
    args = mod.parse_args(["--schedules", "1F1B", "ZBVZeroBubble", "--variants", "sdpa", "blockmask-kwarg",
                           "--lengths", "--layers", "2"])
    info = ppdist.DistInfo(0, 1, 0, torch.device("cpu"), "gloo")
    assert mod.body(args, info) == 0
    assert ("ZBVZeroBubble", "blockmask-kwarg") not in ran
    assert {("1F1B", "sdpa"), ("ZBVZeroBubble", "sdpa"), ("1F1B", "blockmask-kwarg")} <= set(ran)
    lines = [line for line in capsys.readouterr().out.splitlines() if "skipped" in line]
    assert len(lines) == 1 and "ZBVZeroBubble blockmask-kwarg" in lines[0] and "torch >= 2.13" in lines[0], lines


def test_06_keeps_integer_ids_from_old_torchs_receive_buffers(monkeypatch):
    """torch 2.11 makes every tensor a stage receives require a gradient, and integer document ids
    cannot ("only Tensors of floating point dtype can require gradients": 06_loss_and_masks.py at two
    processes): under torch < 2.13 the ids are not handed on as a tuple, and the run says so."""
    mod = load_script("06_loss_and_masks.py")
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu130")
    monkeypatch.setattr(mod, "MASK_VARIANTS", (("tuple", True, False),))
    args = mod.parse_args(["--seq-len", "8"])
    out = mod.mask_demo(args, ppdist.DistInfo(0, 2, 0, torch.device("cpu"), "gloo"))  # no peer: nothing may run
    assert "torch >= 2.13" in out["skipped"]["tuple"] and "tuple" not in out
    assert mod.torch_problem(True, 1) is None and mod.torch_problem(False, 2) is None


def test_12_compile_keeps_in_place_blocks_from_old_torchs_weight_pass_on_the_cpu(monkeypatch):
    """torch 2.11's weight pass (a split backward's W) fails on gloo at a block compiled in place
    ("'_input_metadata' is invalid", InterleavedZeroBubble at two processes, found by make
    torch-versions TORCH=2.11.0): that run is refused before anything is built, in the report's line."""
    mod = load_script("12_compile.py")
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu130")
    monkeypatch.setattr(mod, "build_stages", lambda *a, **k: pytest.fail("stages were built"))
    info = ppdist.DistInfo(0, 2, 0, torch.device("cpu"), "gloo")
    run = mod.compile_run("InterleavedZeroBubble", "in-place", None, None, None, None, None, info)
    assert "needs torch >= 2.13" in run["refused"]
    assert mod.torch_problem("InterleavedZeroBubble", "in-place", torch.device("cuda", 0)) is None  # ran on an H200
    assert mod.torch_problem("1F1B", "in-place", torch.device("cpu")) is None


# --- every GPU command the book prints ----------------------------------------------------------------
def printed_commands() -> list[tuple[str, str]]:
    """(where, command) of every torchrun/python command printed in a script's docstring, the README
    or a chapter, continuation lines joined."""
    texts = [("README.md", (ROOT / "README.md").read_text())]
    texts += [(f"book/{p.name}", p.read_text()) for p in sorted((ROOT / "book").glob("*.md"))]
    for p in sorted((ROOT / "scripts").glob("*.py")):
        texts.append((f"scripts/{p.name}", ast.get_docstring(ast.parse(p.read_text())) or ""))
    found = []
    for where, text in texts:
        lines = text.replace("\\\n", " ").splitlines()
        for line in lines:
            line = line.strip().lstrip("$ ").strip()
            if re.match(r"^(\w+=\S+\s+)*(torchrun|python3?) .*scripts/\S+\.py", line):
                found.append((where, line))
    return found


def gpu_commands() -> list[tuple[str, str]]:
    return [(w, c) for w, c in printed_commands() if "--device cuda" in c]


def parse_command(command: str) -> tuple[str, list[str], int, int]:
    """(script, its argv, processes per node, world size) of a printed torchrun/python command."""
    words = shlex.split(command, comments=True)
    while "=" in words[0]:
        words = words[1:]  # VAR=value prefixes
    at = next(i for i, w in enumerate(words) if w.endswith(".py"))
    launcher, argv = words[:at], words[at + 1:]
    nproc = nnodes = 1
    for flag, value in zip(launcher, launcher[1:]):
        if flag in ("--nproc-per-node", "--nproc_per_node"):
            nproc = int(value)
        if flag == "--nnodes":
            nnodes = int(value.split(":")[-1])
    if "--ray-workers" in argv:  # Ray Train: the workers are the processes
        nproc = int(argv[argv.index("--ray-workers") + 1])
    return Path(words[at]).name, argv, nproc, nproc * nnodes


def test_the_book_prints_gpu_commands():
    where = {w for w, _ in gpu_commands()}
    assert {"README.md", "scripts/06_train.py", "book/06_training.md"} <= where, where


@pytest.mark.parametrize("where,command", gpu_commands(), ids=[f"{w}:{i}" for i, (w, _) in enumerate(gpu_commands())])
def test_printed_gpu_command_passes_validation(where, command, monkeypatch):
    script, argv, nproc, world = parse_command(command)
    fake_gpus(monkeypatch, nproc, nproc)  # the GPU count aside: as many as the command starts per node
    monkeypatch.setenv("WORLD_SIZE", str(world))
    mod = load_script(script)
    args = mod.parse_args(argv)
    if getattr(args, "ray_address", None):  # the driver validates for its workers (09_scaling_out.main)
        args = argparse.Namespace(**{**vars(args), "device": "cpu"})
    validate = getattr(mod, "validate", cli.validate_common)
    try:
        validate(args, world)
    except ValueError as err:
        pytest.fail(f"{where}: `{command}` is refused: {err}")


def test_a_command_that_cannot_run_is_caught(monkeypatch):
    """The 8-GPU command 06_train's docstring printed before issue 14: too few held-out rows."""
    old = ("torchrun --standalone --nproc-per-node 8 scripts/06_train.py --device cuda --layers 32 --dim 1024 "
           "--heads 16 --kv-heads 4 --vocab 8192 --seq-len 512 --batch-size 256 --microbatches 32 --schedule 1f1b")
    script, argv, nproc, world = parse_command(old)
    fake_gpus(monkeypatch, nproc, nproc)
    mod = load_script(script)
    with pytest.raises(ValueError, match="held-out rows"):
        mod.validate(mod.parse_args(argv), world)
    with pytest.raises(ValueError, match="found 1 GPU"):
        fake_gpus(monkeypatch, 1, nproc)
        mod.validate(mod.parse_args(argv), world)


# --- mixed precision -----------------------------------------------------------------------------------
@pytest.mark.torchrun
def test_06_train_bfloat16_at_two_processes_matches_one_process():
    from ppbook import launch, precision

    r = launch.torchrun("06_train.py", ["--dtype", "bfloat16", "--steps", "2", "--eval-batches", "1", "--check",
                                        "--device", "cpu", "--seq-len", "16", "--layers", "2", "--dim", "32"],
                        nproc=2, timeout=300)
    assert r.data["match"] and r.data["dtype"] == "bfloat16", r.data
    assert r.data["tolerance"] == precision.tolerance("bfloat16")
    assert max(r.data["diffs"].values()) <= r.data["tolerance"]


@pytest.mark.torchrun
@pytest.mark.parametrize("script,nproc,extra", [("01_first_pipeline.py", 2, []), ("08_beyond_chain.py", 2, []),
                                               ("09_scaling_out.py", 4, ["--dp", "2", "--steps", "2"]),
                                               ("05_schedules.py", 2, ["--schedules", "1F1B", "ZBVZeroBubble", "--steps",
                                                                       "1", "--warmup", "0", "--dim", "32", "--seq-len",
                                                                       "16", "--layers", "4", "--microbatches", "4",
                                                                       "--batch-size", "8"]),
                                               ("07_checkpointing.py", 2, ["--steps", "2"]),
                                               ("a1_migrate.py", 2, ["--checkpoint", "always"])])
def test_bfloat16_pipelines_match_one_process(script, nproc, extra):
    from ppbook import launch

    r = launch.torchrun(script, ["--dtype", "bfloat16", "--check", "--device", "cpu", *extra], nproc=nproc, timeout=400)
    assert r.data["dtype"] == "bfloat16" and r.data.get("match", True), r.data


def test_autocast_cache_must_not_span_optimizer_steps():
    """Why the references enter autocast per step or without its cache: a cached bfloat16 copy of a
    weight outlives the optimizer step that changed the weight."""
    from ppbook import precision

    model = torch.nn.Linear(4, 4)
    x = torch.ones(1, 4)
    outs = {}
    for cache in (True, False):
        with torch.no_grad():
            model.weight.fill_(1.0)
        with precision.autocast(torch.device("cpu"), "bfloat16", cache=cache):
            model(x).sum().backward()  # caches the bfloat16 weight when cache=True
            with torch.no_grad():
                model.weight.fill_(2.0)  # "the optimizer step"
            outs[cache] = model(x)
    assert not torch.equal(outs[True], outs[False])
    assert torch.equal(outs[False], torch.full((1, 4), 8.0, dtype=torch.bfloat16) + model.bias.to(torch.bfloat16))


def test_bfloat16_keeps_float32_master_weights():
    from ppbook import precision

    mod = load_script("06_train.py")
    args = mod.parse_args(["--dtype", "bfloat16"])
    assert precision.param_dtype(args.dtype) == torch.float32
    model = torch.nn.Linear(4, 4)
    with precision.autocast(torch.device("cpu"), args.dtype):
        assert model(torch.ones(2, 4)).dtype == torch.bfloat16  # compute in bfloat16
    assert model.weight.dtype == torch.float32
    with pytest.raises(SystemExit):
        mod.parse_args(["--dtype", "float16"])  # not offered: no gradient scaler across stages
