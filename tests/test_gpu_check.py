"""tools/gpu_check.py (``make gpu-check``) on a CPU: the commands it builds validate at any GPU
count, a toy run writes its JSON, a failing script makes it exit non-zero, no GPU is one line."""

from __future__ import annotations

import json

import pytest
import torch

from ppbook import cli
from ppbook import launch
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
    assert {c["script"] for c in commands} == set(gpu_check.SCRIPTS)
    for cmd in commands:
        if cmd.get("skip"):
            continue
        assert cmd["args"][-2:] == ["--device", "cuda"] and cmd["nproc"] == n
        mod = launch.load_script(cmd["script"])
        args = mod.parse_args(cmd["args"])
        try:
            getattr(mod, "validate", cli.validate_common)(args, n)
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


@pytest.mark.torchrun
def test_tiny_run_on_cpu_writes_one_json(gpu_check, tmp_path):
    code = gpu_check.main(["--device", "cpu", "--tiny", "--scripts", "01_first_pipeline.py", "--out", str(tmp_path),
                           "--bench-steps", "2", "--bench-warmup", "1", "--timeout", "300"])
    files = list(tmp_path.glob("gpu-check_*.json"))
    assert code == 0 and len(files) == 1
    record = json.loads(files[0].read_text())
    assert record["passed"] and record["meta"]["torch"] == torch.__version__ and record["meta"]["device"] == "cpu"
    assert [r["status"] for r in record["runs"]] == ["passed"]
    assert record["runs"][0]["command"].startswith("torchrun --standalone --nproc-per-node 1 scripts/01_first_pipeline.py")
    bench = record["benchmark"]
    assert bench["status"] == "passed" and "--dtype bfloat16" in bench["command"]
    for name in ("pipeline", "plain"):
        assert len(bench[name]["step_seconds"]) == 2 and bench[name]["tokens_per_second"] > 0
        assert bench[name]["mfu"] is None  # no peak for a CPU: no invented figure


@pytest.mark.torchrun
def test_a_failing_script_fails_the_run(gpu_check, tmp_path, monkeypatch):
    bad = {"name": "01_first_pipeline.py", "script": "01_first_pipeline.py", "nproc": 1,
           "args": ["--batch-size", "10", "--microbatches", "4", "--device", "cpu"]}
    monkeypatch.setattr(gpu_check, "script_commands", lambda n, device, scripts: [bad])
    assert gpu_check.main(["--device", "cpu", "--no-bench", "--out", str(tmp_path)]) == 1
    record = json.loads(next(tmp_path.glob("gpu-check_*.json")).read_text())
    run = record["runs"][0]
    assert not record["passed"] and run["status"] == "failed" and run["returncode"] != 0
    assert "not divisible by --microbatches 4" in run["output_tail"]


def test_benchmark_shape_validates_with_the_shipped_data(gpu_check):
    mod = launch.load_script("06_train.py")
    args = mod.parse_args([*gpu_check.BENCH_1B, "--dtype", "bfloat16", "--eval-batches", "1"])
    mod.validate(args, 1)  # enough training and held-out rows of 2048 tokens for a batch of 8
    assert args.batch_size * args.seq_len == 8 * 2048
