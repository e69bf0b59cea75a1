"""The GPU records under data/gpu/ as chapter 11 reads them: every failure of the H200 record has its
entry in data/gpu/fixes.json, the record's own lines say what went wrong, and the microbatch-cost
model (ppbook.diagrams.microbatch_cost) holds on the record's numbers."""

from __future__ import annotations

import re

import pytest

from ppbook import launch
from ppbook.diagrams import microbatch_cost
from test_devices import ROOT


@pytest.fixture(scope="module")
def gpu_record():
    return launch.load_script(ROOT / "tools" / "gpu_record.py")


def test_every_failed_launch_of_the_record_has_a_fix_entry(gpu_record):
    fixes = gpu_record.fixes()
    record = gpu_record.load(fixes["record"])
    failed = {r["name"] for r in record["launches"] if r["status"] == "failed"}
    assert failed and failed == set(fixes["failures"])
    for name, entry in fixes["failures"].items():
        assert set(entry) == {"what", "class", "fix", "commit"}, name
        assert entry["class"] in {"device", "torch 2.11", "gate", "tolerance"}, name
        assert entry["commit"] is None or re.fullmatch(r"[0-9a-f]{7,40}", entry["commit"]), name
    assert re.fullmatch(r"[0-9a-f]{7,40}", fixes["book_commit"])


def test_the_records_own_lines_say_what_went_wrong(gpu_record):
    launches = {r["name"]: r for r in gpu_record.load("h200-2026-11-28")["launches"]}
    assert len(launches) == 19 and launches["a3_troubleshooting.py"]["status"] == "skipped"
    expected = {"06_loss_and_masks.py": "No backend type associated with device type cpu",
                "09_scaling_out.py": "max |weight - ref| = 2.37e-05",
                "13_moe.py": "DualPipeV on gloo (CPU) needs torch >= 2.13",
                "12_shapes.py": "found at least two devices, cuda:0 and cpu",
                "15_packed.py": "'BlockMask' object has no attribute 'requires_grad'"}
    for name, text in expected.items():
        assert text in launches[name]["evidence"], name
    assert all(r["evidence"] is None for r in launches.values() if r["status"] != "failed")


@pytest.mark.parametrize("p", [2, 4, 8])
def test_the_step_model_is_shortest_at_w_over_h(p):
    whole, host = 0.24, 0.06
    grid = [1 + k / 100 for k in range(1500)]
    best = min(grid, key=lambda m: microbatch_cost.step_seconds(m, p, whole, host))
    assert best == pytest.approx(whole / host, abs=0.01)


def test_at_one_stage_the_step_is_flat_to_w_over_h_then_rises():
    whole, host = 0.24, 0.06
    assert all(microbatch_cost.step_seconds(m, 1, whole, host) == pytest.approx(whole) for m in (1, 2, 3, 4))
    assert microbatch_cost.step_seconds(8, 1, whole, host) == pytest.approx(8 * host)


def test_the_fit_on_the_h200_record():
    fit = microbatch_cost.fit()
    assert fit["whole"] == pytest.approx(0.2408, abs=1e-4)  # bench.json's whole-batch loop
    assert sorted(fit["pipeline"]) == [2, 8] and fit["m_fitted"] == 8
    assert fit["host"] == pytest.approx((0.51589 + 0.43681) / 2 / 8, rel=1e-3)  # the two m = 8 runs
    # fitted on the whole batch and m = 8, the model predicts the step at m = 2 within 5%
    assert fit["predicted"][2] == pytest.approx(fit["pipeline"][2][0], rel=0.05)


def test_draw_returns_what_it_shows():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2)
    numbers = microbatch_cost.draw(axes, ps=(1, 4))
    assert set(numbers["steps"]) == {1, 4} and numbers["tflops"][(2048, 1)] < numbers["tflops"][(2048, 4)]
    assert len(axes[1].get_lines()) >= 4  # two model lines, their stars, the measured points
    plt.close(fig)
