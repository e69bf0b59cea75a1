"""The planner (ppbook.plan) and the link model (ppbook.network): pure tests, the CLI's refusals,
and the two worked cases of "Choosing a pipeline" checked for consistency."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ppbook import memory, network, plan, simulate, stages

CASES = {
    "8b": plan.Request("llama3-8b", gpus=8, gpus_per_node=8, gpu_memory_gb=80, global_batch=128, seq_len=8192),
    "70b": plan.Request("llama3-70b", gpus=64, gpus_per_node=8, gpu_memory_gb=80, global_batch=1024, seq_len=8192),
}


def test_fit_link_recovers_latency_and_bandwidth():
    link = network.Link("x", 2e-5, 3e9)
    sizes = [1e3, 1e5, 1e6, 4e6]
    fitted = network.fit_link(sizes, [link.time(s) for s in sizes])
    assert fitted.latency == pytest.approx(2e-5) and fitted.bandwidth == pytest.approx(3e9)
    with pytest.raises(ValueError, match="two or more different"):
        network.fit_link([1e3], [1.0])


def test_ring_allreduce_and_layout():
    link = network.LINKS["nvlink-h100"]
    assert link.allreduce(1e9, 1) == 0
    assert link.allreduce(1e9, 8) == pytest.approx(14 * link.latency + 2 * 7 / 8 * 1e9 / link.bandwidth)
    # tp innermost, dp next, pp outermost: with dp x tp = 8 every pipeline rank has a node of its own
    assert [network.node_of(r, 8, 1, 8) for r in range(4)] == [0, 1, 2, 3]
    assert [network.node_of(r, 2, 1, 8) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]


@pytest.mark.parametrize("p", [2, 4, 8])
def test_every_schedule_fills_the_pipeline_before_rank_0_runs_a_backward(p):
    """The planner's memory floor: rank 0 holds at least min(m, p) stage-microbatches."""
    for name, placement in ((n, stages.placement(n)) for n in stages.TORCH_SCHEDULES):
        for m in (p, 2 * p, 3 * p):
            for v in ((2, 3) if placement == "loop" else (2,)):
                if stages.schedule_problem(name, p, m, v) is None:
                    order = plan._order_cached(name, p, m, v)
                    assert simulate.peak_in_flight(order, by="rank")[0] >= min(m, p), (name, p, m, v)


@pytest.mark.parametrize("schedule,v", [("1F1B", 1), ("Interleaved1F1B", 2), ("ZBVZeroBubble", 2), ("GPipe", 1)])
def test_extrapolating_from_2p_and_3p_agrees_with_simulating_m(schedule, v, monkeypatch):
    req = plan.Request("llama3-8b", gpus=4, gpus_per_node=8, gpu_memory_gb=1000, global_batch=32, seq_len=4096)
    c = plan.Candidate(schedule, p=4, dp=1, v=v, b=1, m=32, shard=False, recompute=True)
    fast = plan.predict(c, req)
    monkeypatch.setattr(plan, "_simulated_ms", lambda c: [c.m])
    exact = plan.predict(c, req)
    assert fast.step_s == pytest.approx(exact.step_s, rel=0.01)
    assert fast.memory_gb == pytest.approx(exact.memory_gb, rel=0.02)


def test_stage_costs_add_the_head_and_recomputation():
    req = CASES["8b"]
    c = plan.Candidate("1F1B", p=4, dp=2, v=1, b=1, m=16, shard=False, recompute=False)
    block, head = plan.part_costs("llama3-8b", "block", 8192, 1), plan.part_costs("llama3-8b", "head+loss", 8192, 1)
    costs = plan.stage_costs(c, req)
    assert costs[(0, "F")] == pytest.approx(8 * block["F"]) and costs[(3, "F")] == pytest.approx(8 * block["F"] + head["F"])
    rc = plan.stage_costs(plan.Candidate("1F1B", 4, 2, 1, 1, 16, False, True), req)
    assert rc[(0, "B")] == pytest.approx(8 * (block["B"] + block["F"]))


def test_no_candidate_below_its_lower_bound():
    req = CASES["8b"]
    for c in [plan.Candidate("1F1B", 2, 4, 1, 1, 32, True, True), plan.Candidate("DualPipeV", 2, 4, 2, 2, 16, True, True)]:
        assert plan.predict(c, req).pipeline_s >= plan.lower_bound(c, req) * (1 - 1e-9)


@pytest.mark.parametrize("case", sorted(CASES))
def test_worked_cases_answers_are_consistent(case):
    req = CASES[case]
    ranked, dropped = plan.plan(req)
    assert ranked, "the planner found nothing for a worked case"
    usable = req.gpu_memory_gb * (1 - req.headroom)
    for o in ranked:
        c = o.candidate
        assert c.p * c.dp * req.tp == req.gpus and c.dp * c.b * c.m == req.global_batch
        assert o.memory_gb <= usable and o.why_not is None
        if c.schedule != plan.NO_PIPELINE:
            layers = memory.LLAMA_SIZES[plan.MODELS[req.model]].n_layers
            assert stages.schedule_problem(c.schedule, c.p, c.m, c.v, layers) is None
        assert o.step_s >= o.pipeline_s > 0 and 0 <= o.bubble < 1
    assert [o.step_s for o in ranked] == sorted(o.step_s for o in ranked)
    assert all(o.why_not for o in dropped)
    assert ranked[0].candidate.label() in plan.why_winner(ranked)


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "ppbook.plan", *args], capture_output=True, text=True, timeout=300)


GOOD = ["--model", "llama3-8b", "--gpus", "8", "--global-batch", "128", "--seq-len", "8192"]


@pytest.mark.parametrize("change,message", [
    (["--model", "gpt5"], "use one of llama3-8b"),
    (["--gpus", "0"], "--gpus must be at least 1"),
    (["--seq-len", "2048"], "the measured file has 4096, 8192"),
    (["--gpus", "12"], "not a whole number of nodes"),
    (["--tp", "16", "--gpus", "16"], "keep --tp <= --gpus-per-node"),
    (["--gpu-memory", "-1"], "--gpu-memory must be positive"),
    (["--schedules", "Zero"], "unknown schedule 'Zero'"),
    (["--json", "/no/such/folder/x.json"], "its folder does not exist"),
])
def test_bad_requests_get_one_line_and_a_nonzero_exit(change, message, capsys):
    """In this process (``plan.main``, argparse's exit included): ``test_cli_writes_json`` runs
    the module as a reader does, exit status and all."""
    args = list(GOOD)
    for i in range(0, len(change), 2):
        if change[i] in args:
            args[args.index(change[i]) + 1] = change[i + 1]
        else:
            args += change[i:i + 2]
    try:
        status = plan.main(args)
    except SystemExit as e:
        status = e.code
    out = capsys.readouterr()
    errors = [line for line in (out.out + out.err).splitlines() if line.strip()]
    assert status != 0 and len(errors) == 1 and message in errors[0], out.out + out.err


def test_a_request_nothing_fits_exits_nonzero_and_says_why(capsys):
    status = plan.main(["--model", "llama3-70b", "--gpus", "8", "--global-batch", "64", "--seq-len", "8192", "--why"])
    out = capsys.readouterr().out
    assert status == 1 and "nothing fits" in out and "does not fit" in out


def test_cli_writes_json(tmp_path):
    out = tmp_path / "plan.json"
    r = run_cli(*GOOD, "--json", str(out))
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["ranked"][0]["step_s"] <= data["ranked"][-1]["step_s"] and data["winner_reason"] in r.stdout
