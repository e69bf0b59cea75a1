"""tools/gpu_check.py (``make gpu-check``) on a CPU: the commands it builds validate at any GPU
count, the whole record rehearsed with toy shapes (measurements, parallel launches, at most 8 files,
their schema), a failing script makes it exit non-zero, a budget spent is recorded, no GPU is one
line."""

from __future__ import annotations

import json

import pytest
import torch

from ppbook import cli
from ppbook import launch
from ppbook.diagrams import microbatch_cost
from test_devices import ROOT, fake_gpus

GPU_CHECK = ROOT / "tools" / "gpu_check.py"


@pytest.fixture
def gpu_check():
    return launch.load_script(GPU_CHECK)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_every_command_validates_at_n_gpus(n, gpu_check, monkeypatch):
    fake_gpus(monkeypatch, n, n)
    monkeypatch.setenv("WORLD_SIZE", str(n))
    commands = gpu_check.script_commands(n, "cuda")
    companions = {p.name for p in (ROOT / "scripts").glob("*.py")}
    assert {c["script"] for c in commands} == companions  # every companion script, the whole record
    assert [c["name"] for c in commands] == list(gpu_check.LAUNCHES)
    for cmd in commands:
        if cmd.get("skip"):
            continue
        assert cmd["args"][-2:] == ["--device", "cuda"]
        assert cmd["nproc"] == (1 if cmd["name"] in gpu_check.ONE_PROCESS else n)
        monkeypatch.setenv("WORLD_SIZE", str(cmd["nproc"]))
        mod = launch.load_script(cmd["script"])
        args = mod.parse_args(cmd["args"])
        try:
            getattr(mod, "validate", cli.validate_common)(args, cmd["nproc"])
        except ValueError as err:
            pytest.fail(f"{cmd['script']} {' '.join(cmd['args'])} at {n} GPUs: {err}")


def test_mfu_formula_and_peaks(gpu_check):
    mod = launch.load_script("06_train.py")
    args = mod.parse_args(gpu_check.BENCH_1B)
    cfg = mod.llama_config(args)
    f = gpu_check.flops_per_token(args)
    assert f > 6 * 0.5e9  # a 1B-class model: over half a billion parameters outside the embedding
    assert f == 6 * (gpu_check.llama_parameters(cfg) - cfg.vocab_size * cfg.dim) + 12 * 16 * 2048 * 2048
    assert gpu_check.peak_flops("NVIDIA H100 80GB HBM3") == 989.4e12
    assert gpu_check.peak_flops("NVIDIA H100 PCIe") == 756e12
    assert gpu_check.peak_flops("a CPU") is None


def test_no_gpu_is_one_line(gpu_check, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main([]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "no GPU here" in lines[0]


REHEARSAL = ["01_first_pipeline.py", "02_naive.py"]  # two quick launches, at once: the parallel path


@pytest.mark.torchrun
def test_cpu_rehearsal_of_the_whole_record(gpu_check, tmp_path):
    """``--device cpu --tiny``: every measurement (bench, mem, costs, profile) in its own process,
    then two of the launches at once; at most 8 files, each of the schema chapter 11 reads."""
    code = gpu_check.main(["--device", "cpu", "--tiny", "--scripts", *REHEARSAL, "--streams", "2", "--profile",
                           "always", "--bench-steps", "1", "--bench-warmup", "1", "--out", str(tmp_path),
                           "--budget", "3000", "--timeout", "600"])
    files = sorted(p.name for p in tmp_path.iterdir())
    assert code == 0 and len(files) <= 8 and set(files) == set(gpu_check.FILES), files
    read = {f: json.loads((tmp_path / f).read_text()) for f in files if f.endswith(".json")}
    record, check = read["record.json"], read["check.json"]
    assert record["passed"] and record["meta"]["torch"] == torch.__version__ and record["meta"]["device"] == "cpu"
    assert [(s["tag"], s["status"]) for s in record["steps"]] == [
        ("bench", "passed"), ("mem", "passed"), ("costs", "passed"), ("profile", "passed")]
    assert record["summary"] == {name: "passed" for name in REHEARSAL}
    runs = {r["name"]: r for r in check["runs"]}
    assert check["passed"] and set(runs) == set(REHEARSAL)
    for name in REHEARSAL:
        assert runs[name]["command"].startswith(f"torchrun --standalone --nproc-per-node 1 scripts/{name}")
    first, second = sorted(runs.values(), key=lambda r: r["started_s"])
    assert second["started_s"] < first["ended_s"]  # two streams: the second began before the first ended

    bench = read["bench.json"]
    assert bench["status"] == "passed" and set(bench["loops"]) == {"pipeline", "accumulate", "whole"}
    assert "bfloat16" in bench["args"] and bench["targets"] == {"ratio_to_accumulate": 0.9, "mfu": 0.3}
    for loop in bench["loops"].values():
        assert len(loop["step_seconds"]) == 2 and len(loop["losses"]) == 2 and loop["tokens_per_second"] > 0
        assert loop["mfu"] is None and loop["peak_allocated"] is None  # a CPU: no peak, no invented figure
    # the same data, model, arithmetic and microbatches: the accumulation loop repeats the pipeline's losses
    assert bench["loops"]["accumulate"]["losses"] == bench["loops"]["pipeline"]["losses"]
    assert bench["ratio_to_accumulate"] > 0 and bench["ratio_to_whole"] > 0 and isinstance(bench["missed"], list)

    mem = read["mem.json"]
    assert [r["tag"] for r in mem["rows"]] == [t for t, _ in gpu_check.gpu_measure.MEM_TINY]
    for row in mem["rows"]:
        assert row["predicted"]["total"] > 0 and "error" not in row
        assert row["predicted"]["total"] == pytest.approx(sum(row["predicted"]["parts"].values()))
    gpipe, one_f_one_b = (r["predicted"]["in_flight"] for r in mem["rows"])
    assert (gpipe, one_f_one_b) == (4, 1)  # GPipe holds its m = 4 microbatches, 1F1B one at one stage
    costs = read["costs.json"]
    assert {r["part"] for r in costs["rows"]} == {"block", "head+loss"}
    assert all(r["F_ms"] > 0 and r["B_ms"] > 0 for r in costs["rows"])
    profile = (tmp_path / "profile.txt").read_text()
    assert "=== pipeline" in profile and "=== accumulate" in profile
    log = (tmp_path / "run.log").read_text()
    assert "start bench" in log and "2 launches, 2 at once" in log
    # chapter 11's readers take the new layout as they take the H200 record's
    record = launch.load_script(ROOT / "tools" / "gpu_record.py").load(tmp_path)
    assert [r["status"] for r in record["launches"]] == ["passed", "passed"]
    assert set(record["bench"]["loops"]) == {"pipeline", "accumulate", "whole"} and len(record["mem"]) == 2
    fit = microbatch_cost.fit(str(tmp_path))
    assert fit["whole"] > 0 and fit["host"] > 0 and set(fit["pipeline"]) == {4}


def test_a_spent_budget_is_recorded_not_hidden(gpu_check, tmp_path):
    """A run cut short by --budget says what did not run, in valid files, and does not pass."""
    assert gpu_check.main(["--device", "cpu", "--no-bench", "--scripts", *REHEARSAL, "--budget", "1",
                           "--out", str(tmp_path)]) == 1
    record = json.loads((tmp_path / "record.json").read_text())
    check = json.loads((tmp_path / "check.json").read_text())
    assert record["passed"] is False and [r["status"] for r in check["runs"]] == ["not run", "not run"]
    assert all("out of time" in r["error"] for r in check["runs"])


@pytest.mark.torchrun
def test_a_failing_script_fails_the_run(gpu_check, tmp_path, monkeypatch):
    bad = {"name": "01_first_pipeline.py", "script": "01_first_pipeline.py", "nproc": 1,
           "args": ["--batch-size", "10", "--microbatches", "4", "--device", "cpu"]}
    monkeypatch.setattr(gpu_check, "script_commands", lambda n, device, scripts: [bad])
    assert gpu_check.main(["--device", "cpu", "--no-bench", "--out", str(tmp_path)]) == 1
    record = json.loads((tmp_path / "check.json").read_text())
    run = record["runs"][0]
    assert not record["passed"] and run["status"] == "failed" and run["returncode"] != 0
    assert "not divisible by --microbatches 4" in run["output_tail"]


def test_bad_flag_values_are_one_line(gpu_check, tmp_path, capsys):
    assert gpu_check.main(["--device", "cpu", "--budget", "0", "--out", str(tmp_path)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--budget must be at least 1" in lines[0]


def test_benchmark_shapes_validate_with_the_shipped_data(gpu_check):
    mod = launch.load_script("06_train.py")
    measure = gpu_check.gpu_measure
    args = mod.parse_args([*gpu_check.BENCH_1B, *measure.BENCH_TRAIN, "--dtype", "bfloat16"])
    mod.validate(args, 1)  # enough training and held-out rows of 2048 tokens for a batch of 8
    assert args.batch_size * args.seq_len == 8 * 2048 and args.lr == 3e-4
    for tag, shape in measure.MEM_CONFIGS:  # the four configurations of the H200 record's mem.json
        argv = [*shape, *measure.BENCH_TRAIN, "--dtype", "bfloat16"]
        mod.validate(mod.parse_args(argv), 1)
        prediction = measure.predicted_peak(mod.parse_args(argv))
        assert prediction["total"] == pytest.approx(sum(prediction["parts"].values()))
