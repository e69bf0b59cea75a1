"""Chapter 7: distributed checkpoints. The module in one process (fast), then the script under
torchrun: bitwise resume, resharding 2 -> 4, 3, 1, export, crash recovery, and refusals."""

from __future__ import annotations

import hashlib
import shutil

import pytest
import torch

from ppbook import checkpoint as ckpt
from ppbook import workload
from conftest import argparse_refusal, assert_one_error_line, assert_one_line_error
from ppbook import launch
from ppbook.models import GPTConfig, build_model

SCRIPT = "07_checkpointing.py"
STEPS = ["--steps", "6"]


# --- the module in one process, no process group ------------------------------------------------
def tiny(seed=0):
    model = build_model(GPTConfig(vocab_size=32, dim=16, n_layers=2, n_heads=2, max_seq_len=8), seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, opt


def train_one_step(model, opt):
    tokens = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(1))
    opt.zero_grad()
    workload.loss_fn(model(tokens), tokens).backward()
    opt.step()


def test_save_load_round_trip_keep_and_train_state(tmp_path):
    model, opt = tiny()
    for step in (1, 2, 3):
        train_one_step(model, opt)
        ckpt.save(tmp_path, step, model, opt, extra={"data_position": 10 * step}, keep=2)
    assert [p.name for p in ckpt.committed(tmp_path)] == ["step-000002", "step-000003"]
    fresh, fresh_opt = tiny(seed=1)
    train = ckpt.load(ckpt.find_resume(tmp_path, "latest"), fresh, fresh_opt)
    assert (train["step"], train["data_position"], train["world_size"]) == (3, 30, 1)
    assert ckpt.digest(fresh, fresh_opt) == ckpt.digest(model, opt)


def test_rng_states_are_restored(tmp_path):
    model, opt = tiny()
    torch.manual_seed(123)
    ckpt.save(tmp_path, 1, model, opt)
    expected = torch.rand(3)
    torch.manual_seed(999)
    ckpt.load(tmp_path / "step-000001", model, opt)
    assert torch.equal(torch.rand(3), expected)


def test_partial_save_is_reported_and_skipped(tmp_path):
    model, opt = tiny()
    ckpt.save(tmp_path, 2, model, opt)
    shutil.copytree(tmp_path / "step-000002", tmp_path / ".tmp-step-000004")  # looks complete, never committed
    lines = []
    assert ckpt.find_resume(tmp_path, "latest", report=lines.append) == tmp_path / "step-000002"
    assert len(lines) == 1 and "partial" in lines[0] and ".tmp-step-000004" in lines[0]
    with pytest.raises(ckpt.CheckpointError, match="is partial"):
        ckpt.find_resume(tmp_path, str(tmp_path / ".tmp-step-000004"))


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "manifest"])
def test_corrupted_checkpoint_is_refused_in_one_line(tmp_path, damage):
    model, opt = tiny()
    path = ckpt.save(tmp_path, 1, model, opt)
    shard = path / "__0_0.distcp"
    if damage == "flip":
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    elif damage == "truncate":
        shard.write_bytes(shard.read_bytes()[:100])
    elif damage == "delete":
        shard.unlink()
    else:
        (path / ckpt.MANIFEST).unlink()
    with pytest.raises(ckpt.CheckpointError) as err:
        ckpt.find_resume(tmp_path, "latest")
    message = str(err.value)
    assert "\n" not in message and str(path) in message
    assert ("incomplete" if damage == "manifest" else "corrupted") in message
    with pytest.raises(ckpt.CheckpointError):
        ckpt.load(path, *tiny())  # never silently loaded


def test_no_checkpoint_yet_means_fresh_start(tmp_path):
    assert ckpt.find_resume(tmp_path / "none", "latest") is None
    assert ckpt.find_resume(tmp_path, None) is None
    with pytest.raises(ckpt.CheckpointError, match="not a folder"):
        ckpt.find_resume(tmp_path, str(tmp_path / "step-000009"))


# --- one writer per folder -----------------------------------------------------------------------
@pytest.fixture
def live_writer(tmp_path):
    """A live process that holds tmp_path's writer claim, as the ranks of a job whose torchrun was
    SIGKILLed do; yields (folder, process), SIGKILLs it at the end."""
    import subprocess
    import sys

    code = ("import sys, time\nfrom ppbook import checkpoint as c\nlock = c.lock_writer(sys.argv[1])\n"
            "print('held', flush=True)\ntime.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        yield tmp_path, proc
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_a_live_writer_is_refused_in_one_line_and_a_dead_ones_claim_is_taken_over(live_writer):
    folder, holder = live_writer
    with pytest.raises(ckpt.CheckpointError) as err:
        ckpt.lock_writer(folder)
    message = str(err.value)
    assert "\n" not in message and "is being written by a live job" in message
    assert f"process {holder.pid} holds .writer.lock" in message
    holder.kill()  # dies without a word, as a SIGKILLed rank does: the kernel drops its lock
    holder.wait(timeout=30)
    mine = ckpt.lock_writer(folder)
    assert (folder / ".writer.lock").read_text() == f"process {__import__('os').getpid()}"
    mine.close()
    ckpt.lock_writer(folder).close()  # closed (or exited): free again


@pytest.mark.torchrun
def test_a_second_job_on_a_live_writers_folder_is_refused_under_torchrun(live_writer):
    """Every rank ends (rank 0 refuses before any process group, torchrun stops the others): one
    line, a non-zero exit, no hang; the live job's folder is untouched. A restart after the old
    ranks died is test_killed_rank_recovers_under_max_restarts (its restarted rank 0 claims the
    folder that the killed group held)."""
    folder, holder = live_writer
    r = launch.torchrun(SCRIPT, ["--steps", "4", "--save-dir", folder, "--save-every", "2"], nproc=2, timeout=120,
                        check=False, json_result=False)
    assert_one_error_line(r, SCRIPT, f"is being written by a live job (process {holder.pid} holds .writer.lock)")
    assert not ckpt.committed(folder) and not ckpt.partial(folder)


# --- the script under torchrun (each test marked: they launch processes) -----------------------

@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Two stages, six steps without interruption, a checkpoint after steps 3 and 6."""
    d = tmp_path_factory.mktemp("ckpt")
    r = launch.torchrun(SCRIPT, [*STEPS, "--save-dir", d, "--save-every", "3", "--check"], nproc=2, timeout=300)
    assert r.data["match"] is True and r.data["start_step"] == 0
    assert [p.name for p in ckpt.committed(d)] == ["step-000003", "step-000006"]
    return d, r.data


@pytest.mark.torchrun
@pytest.mark.parametrize("nproc", [2, 3])
def test_resume_and_reshard_continue_bitwise(uninterrupted, nproc):
    """Stopped after step 3 at p = 2, resumed at p = 2 and 3 (uneven: [[0, 1], [2], [3]]); at 4 and
    in one process without a process group, chapter 7 runs and checks it."""
    d, ref = uninterrupted
    r = launch.torchrun(SCRIPT, [*STEPS, "--resume", d / "step-000003", "--check"], nproc=nproc, timeout=300)
    assert r.data["start_step"] == 3 and r.data["world_size"] == nproc
    assert r.data["digest"] == ref["digest"]  # every weight, Adam moment, step and lr, to the last bit
    assert r.data["losses"] == {k: v for k, v in ref["losses"].items() if int(k) > 3}
    assert r.data["match"] is True
    if nproc == 2:
        assert r.data["rng_after"] == ref["rng_after"]  # each rank's RNG restored
    if nproc == 3:
        assert r.data["layers_per_stage"] == [[0, 1], [2], [3]]


@pytest.mark.torchrun
def test_export_to_one_file_loads_into_the_plain_model_strictly(uninterrupted, tmp_path):
    d, ref = uninterrupted
    out = ckpt.export(d / "step-000006", tmp_path / "model.pt")
    model = build_model(GPTConfig(vocab_size=256, dim=64, n_layers=4, n_heads=4, max_seq_len=32))
    model.load_state_dict(torch.load(out, weights_only=True), strict=True)
    for name, tensor in model.state_dict().items():
        got = hashlib.sha256(tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
        assert got == ref["digest"]["model." + name], name


@pytest.mark.torchrun
def test_checkpoint_records_which_rank_wrote_which_tensor(uninterrupted):
    d, _ = uninterrupted
    writers = ckpt.writers(d / "step-000003")
    assert writers["model.tok_embeddings.tok.weight"] == 0 and writers["model.layers.1.ln_1.weight"] == 0
    assert writers["model.layers.2.ln_1.weight"] == 1 and writers["model.output.weight"] == 1
    assert writers["optim.state.layers.3.mlp.0.weight.exp_avg"] == 1


# A rank SIGKILLed at the start of a step, under --max-restarts: chapter 7 runs and checks it (the
# fault's line, the checkpoint it resumed from, every value equal to the uninterrupted run).


@pytest.mark.torchrun
def test_kill_during_save_keeps_previous_checkpoint(uninterrupted, tmp_path, monkeypatch):
    _, ref = uninterrupted
    monkeypatch.setenv("PPBOOK_KILL", "1:4:save")  # the environment-variable form of the flags
    r = launch.torchrun(SCRIPT, [*STEPS, "--save-dir", tmp_path, "--save-every", "2", "--resume", "--check"],
                        nproc=2, timeout=300, torchrun_args=["--max-restarts", "1"])
    assert "SIGKILL during the save after step 4" in r.output
    assert "skipping partial checkpoint" in r.output and ".tmp-step-000004" in r.output
    assert r.data["resumed_from"] == str(tmp_path / "step-000002")
    assert r.data["digest"] == ref["digest"] and r.data["match"] is True
    assert not ckpt.partial(tmp_path)  # the retried save replaced the partial folder


@pytest.mark.torchrun
@pytest.mark.parametrize("how", ["path", "latest"])
def test_corrupted_checkpoint_refused_nonzero_exit(uninterrupted, tmp_path, how):
    d, _ = uninterrupted
    shutil.copytree(d, tmp_path / "ckpt")
    shard = tmp_path / "ckpt" / "step-000006" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[1000] ^= 0x01  # one bit
    shard.write_bytes(bytes(data))
    resume = ["--resume", tmp_path / "ckpt" / "step-000006"] if how == "path" else \
        ["--save-dir", tmp_path / "ckpt", "--resume"]
    # refused by validate, before any process group: a ValueError (CheckpointError), printed as one line
    assert_one_line_error(SCRIPT, ["--steps", "8", *resume], "is corrupted: __1_0.distcp has another SHA-256")


@pytest.mark.parametrize("args,message", [
    (["--save-every", "2"], "--save-every needs --save-dir"),
    (["--kill-rank", "5", "--kill-at-step", "2"], "--kill-rank must be in [0, 2)"),
    (["--kill-rank", "1"], "needs both --kill-rank and --kill-at-step"),
    (["--save-dir", "d", "--save-every", "3", "--kill-rank", "1", "--kill-at-step", "2", "--kill-during-save"],
     "--kill-during-save needs a save after step 2"),
])
def test_bad_flags_one_line(args, message, tmp_path):
    args = [str(tmp_path / a) if a == "d" else a for a in args]
    assert_one_line_error(SCRIPT, args, message)


@pytest.mark.torchrun
def test_other_state_dict_options_and_how_they_fail():
    """Re-measured: full_state_dict with flatten fails in set_state_dict; cpu_offload alone is harmless,
    but with full_state_dict the ranks other than 0 get empty state dicts (a stage lost at save)."""
    from conftest import ROOT

    r = launch.torchrun(ROOT / "tests" / "helpers" / "checkpoint_options.py", [], nproc=2, timeout=300)
    assert [rank["failed"] for rank in r.data["flatten"]] == [None, None]
    assert [rank["failed"] for rank in r.data["flatten+cpu_offload"]] == [None, None]
    assert all(rank["failed"].startswith("set_state_dict: KeyError") for rank in r.data["flatten+full_state_dict"])
    offloaded = r.data["flatten+full_state_dict+cpu_offload"]
    assert offloaded[0]["model_entries"] > 0
    assert (offloaded[1]["model_entries"], offloaded[1]["optim_entries"]) == (0, 0)


def test_bad_kill_variable_is_refused(monkeypatch, capsys):
    monkeypatch.setenv("PPBOOK_KILL", "one:5")
    assert "PPBOOK_KILL='one:5': expected RANK:STEP or RANK:STEP:save" in argparse_refusal(SCRIPT, [], capsys)
