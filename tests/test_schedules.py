"""Chapter 5: the seven schedules -- their orders, closed forms, memory, and the companion script."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn as nn

from ppbook import activations, bubble, launch, stages, timeline, torch_orders
from ppbook.planner import schedules, simulate

warnings.filterwarnings("ignore", message=".*torch.compile.*")
NAMES = list(stages.TORCH_SCHEDULES)


bubble_per_rank = bubble.idle_per_rank  # the chapters' own: step less the busiest rank's compute


def test_idle_per_rank_is_the_step_less_the_busiest_ranks_compute():
    """GPipe at p = 2, m = 1, F = 1, B = 2: the step is 6, each rank computes 3, so each idles 3."""
    assert bubble.idle_per_rank(schedules.gpipe_order(2, 1), {"F": 1.0, "B": 2.0}) == 3.0


# --- orders -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("p,m", [(2, 4), (2, 8), (4, 8)])
def test_every_order_runs_each_pass_once_on_the_right_rank(name, p, m):
    order = torch_orders.torch_order(name, p, m)
    v = stages.stages_per_rank(name)
    for rank, acts in order.items():
        assert {a.stage for a in acts} == set(stages.stage_indices(name, rank, p)), (name, rank)
    acts = [a for acts in order.values() for a in acts]
    assert len(acts) == len(set(acts))
    for stage in range(p * v):
        for mb in range(m):
            kinds = sorted(a.kind for a in acts if (a.stage, a.microbatch) == (stage, mb))
            assert kinds in (["B", "F"], ["F", "I", "W"]), (name, stage, mb, kinds)
    simulate.simulate(order, {"F": 1, "B": 2, "I": 1, "W": 1})  # no deadlock


def test_torchs_description_of_1f1b_is_wrong_and_torch_order_corrects_it():
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    theirs = [str(a) for a in get_schedule_ops("1F1B", 2, 4)[1] if a is not None]
    assert theirs[0] == "1F1" and "1F4" in theirs  # skips microbatch 0, invents microbatch 4
    ours = [str(a) for a in torch_orders.torch_order("1F1B", 2, 4)[1]]
    assert ours == ["1F0", "1B0", "1F1", "1B1", "1F2", "1B2", "1F3", "1B3"]
    # wrong for the last rank only (p - 1 - rank == 0), not for every rank but the first (item 4 of #13)
    for p, m in ((2, 4), (3, 5), (4, 8)):
        described = get_schedule_ops("1F1B", p, m)
        wrong = [r for r, acts in torch_orders.torch_order("1F1B", p, m).items()
                 if [str(a) for a in described[r] if a is not None and "REDUCE" not in str(a)] != list(map(str, acts))]
        assert wrong == [p - 1], (p, m, wrong)


def test_schedule_ops_are_those_of_torchs_visualizer():
    """torch_orders.schedule_ops builds torch's orders with a cheaper mock stage than torch's
    get_schedule_ops; every schedule, a few shapes, the same actions or the same refusal."""
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    def actions(build):
        try:
            return [[str(a) for a in rank] for rank in build()]
        except ValueError as e:
            return str(e)

    for name in NAMES:
        for p in (2, 3):
            for v in ((2, 3) if stages.placement(name) == "loop" else (2,)):
                k = stages.stages_per_rank(name, v)
                for m in (p - 1, p, 2 * p, 2 * p + 1):
                    assert actions(lambda: torch_orders.schedule_ops(name, p, m, k)) == \
                        actions(lambda: get_schedule_ops(name, p, m, num_stages_per_rank=k)), (name, p, m, v)


def test_schedule_problem_agrees_with_torch():
    """The up-front validation refuses exactly what torch refuses, for every schedule."""
    for name in NAMES:
        for p in (1, 2, 3, 4):
            for v in ((2, 3) if stages.placement(name) == "loop" else (2,)):
                for m in range(1, 17):
                    try:
                        torch_orders.torch_order(name, p, m, v)
                        torch_ok = True
                    except ValueError:
                        torch_ok = False
                    problem = stages.schedule_problem(name, p, m, v)
                    assert torch_ok == (problem is None), (name, p, v, m, problem)
                    assert problem is None or "\n" not in problem


def test_schedule_problem_messages_say_how_to_fix():
    assert "use 4 or more" in stages.schedule_problem("DualPipeV", 2, 3)
    assert "try 4 or 6" in stages.schedule_problem("Interleaved1F1B", 2, 5)
    assert "raise --layers to 8" in stages.schedule_problem("LoopedBFS", 4, 8, 2, layers=6)
    assert "at least 2 stages per rank" in stages.schedule_problem("LoopedBFS", 2, 8, 1)


# --- closed forms ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["Interleaved1F1B", "LoopedBFS"])
@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.parametrize("v", [2, 3])
@pytest.mark.parametrize("rounds", [1, 2, 4])
def test_interleaved_overhead_is_p_minus_1_over_v_m(name, p, v, rounds):
    """Narayanan et al. 2021: a model chunk of 1/v of a stage; overhead (p-1)/(v m), m a multiple of p."""
    m = rounds * p
    f, b = 1.0, 2.0  # one rank's forward and backward of a microbatch, split over its v chunks
    events = simulate.simulate(torch_orders.torch_order(name, p, m, v), {"F": f / v, "B": b / v})
    step = timeline.span(events)[1]
    assert math.isclose(step / (m * (f + b)) - 1, bubble.interleaved_overhead(p, m, v))


COSTS_W_AT_MOST_F = [(1.0, 1.0, 1.0), (1.0, 1.5, 0.5), (1.0, 1.0, 0.6), (1.2, 1.0, 0.8), (2.0, 1.0, 0.5)]


@pytest.mark.parametrize("p", [2, 3, 4, 6])
@pytest.mark.parametrize("m_per_p", [1, 2, 4])
@pytest.mark.parametrize("f,i,w", COSTS_W_AT_MOST_F)
def test_zb_h1_bubble(p, m_per_p, f, i, w):
    """Qi et al. 2023, ZB-H1: (p-1)(T_F + T_B - T_W), T_B the input-gradient pass only, T_W <= T_F.
    Torch's ScheduleInterleavedZeroBubble with one stage per rank, and with v chunks per rank."""
    m = m_per_p * p
    costs = {"F": f, "I": i, "W": w}
    assert math.isclose(bubble_per_rank(torch_orders.zb_h1_order(p, m), costs), bubble.zb_h1_bubble(p, f, i, w))
    assert bubble.zb_h1_bubble(p, f, i, w) < bubble.one_f_one_b_bubble(p, f, i + w)
    chunks = torch_orders.torch_order("InterleavedZeroBubble", p, m)
    assert math.isclose(bubble_per_rank(chunks, costs), bubble.zb_h1_bubble(p, f, i, w))


def test_deepseek_table_uses_the_full_backward():
    """DeepSeek-V3's table writes B for the full backward (I + W): its ZB1P row is ZB-H1."""
    for p in (2, 4, 8):
        for f, i, w in COSTS_W_AT_MOST_F:
            table = bubble.dualpipe_table(2 * p, f, i + w, w)
            assert math.isclose(table["ZB1P"]["bubble"], bubble.zb_h1_bubble(2 * p, f, i, w))
            assert math.isclose(table["1F1B"]["bubble"], bubble.one_f_one_b_bubble(2 * p, f, i + w))


@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.parametrize("f,i,w", COSTS_W_AT_MOST_F)
def test_dualpipev_bubble_is_within_the_dualpipe_table(p, f, i, w):
    """DualPipeV on p ranks is DualPipe on 2p ranks cut in half; its table bubble,
    (PP/2 - 1)(F&B + B - 3W) with F&B = F + B (no overlap on a CPU), bounds the simulated one:
    torch runs an overlapped pair as two actions, and the forward need not wait for the backward's input."""
    costs = {"F": f, "I": i, "W": w, "B": i + w}
    sim = bubble_per_rank(torch_orders.torch_order("DualPipeV", p, 4 * p), costs)
    table = bubble.dualpipe_table(2 * p, f, i + w, w)["DualPipe"]["bubble"]
    assert sim <= table + 1e-9
    assert sim >= bubble.zb_h1_bubble(p, f, i, w) - 1e-9


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("p", [2, 4])
def test_no_order_beats_the_last_ranks_wait_for_its_first_input(name, p):
    """In a step all ranks start together, the last rank idles (p-1) T_F before its first input
    arrives: why ZB-H2's (p-1)(T_F + T_B - 2 T_W) needs the paper's unsynchronised optimizer step."""
    f, i, w = 1.0, 1.0, 1.0
    v = stages.stages_per_rank(name)
    idle = bubble_per_rank(torch_orders.torch_order(name, p, 4 * p), {"F": f / v, "I": i / v, "W": w / v, "B": (i + w) / v})
    assert idle >= (p - 1) * f / v - 1e-9
    assert bubble.zb_h2_bubble(p, f, i, w) < (p - 1) * f / v


# --- activation memory -------------------------------------------------------------------------------
@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (3, 7)])
def test_predicted_in_flight_gpipe_m_and_1f1b_p_minus_r(p, m):
    assert simulate.peak_in_flight(torch_orders.torch_order("GPipe", p, m)) == {r: m for r in range(p)}
    assert simulate.peak_in_flight(torch_orders.torch_order("1F1B", p, m)) == {r: min(m, p - r) for r in range(p)}
    if m % max(1, m // p) == 0:  # ZB-H1 keeps 1F1B's peak, p microbatches (Qi et al. 2023)
        assert max(simulate.peak_in_flight(torch_orders.zb_h1_order(p, m)).values()) == min(m, p)


@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.parametrize("m_per_p", [2, 4])
def test_v_schedules_memory_per_rank_as_their_papers_say(p, m_per_p):
    """In chunks (1/2p of the model): ZB-V holds 1F1B's 2p (p stages of two chunks); DualPipeV
    holds DeepSeek's PP + 1 with PP = 2p."""
    m = m_per_p * p
    def per_rank(name):
        return max(simulate.peak_in_flight(torch_orders.torch_order(name, p, m), by="rank").values())
    assert 2 * per_rank("1F1B") == 2 * p
    assert per_rank("ZBVZeroBubble") == 2 * p
    assert per_rank("DualPipeV") == bubble.dualpipe_table(2 * p, 1, 2, 1)["DualPipe"]["activations"] == 2 * p + 1


class _FakeStage:
    """What the probe touches of a PipelineStage: ``stage_index``, ``submod``, ``forward_one_chunk``."""

    def __init__(self, submod):
        self.stage_index, self.submod = 0, submod

    def forward_one_chunk(self, chunk_id, x):
        return self.submod(x)


def test_probe_counts_saved_activations_until_backward_frees_them():
    torch.manual_seed(0)
    mod = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    stage, probe = _FakeStage(mod), activations.ActivationProbe(rank=0, enabled=True)
    probe.attach(stage)
    x = torch.randn(5, 8, requires_grad=True)
    outs = [stage.forward_one_chunk(i, x * (i + 1)) for i in range(3)]
    assert activations.peak_in_flight(probe.events) == {0: 3}
    held = sum(e.delta for e in probe.events)
    # the first linear saves its input (5x8), tanh its output (5x16), the second linear its input (5x16),
    # and x * (i + 1) is the first linear's input; weights are not counted
    assert held == 3 * 4 * (5 * 8 + 5 * 16), held
    outs[1].sum().backward()
    assert activations.residual_bytes(probe.events) == {(0, 0): held // 3, (0, 2): held // 3}
    for out in (outs[0], outs[2]):
        out.sum().backward()
    assert activations.residual_bytes(probe.events) == {}
    times, held_bytes, held_mbs = activations.held_over_time(probe.events, 0)
    assert max(held_mbs) == 3 and held_bytes[-1] == 0 and times == sorted(times)


def test_remainder_shares_are_what_each_microbatch_kept_over_the_most_it_held():
    """A microbatch that saved 100 bytes, then 50, and released 120 kept 30 of its 150; one that
    released everything is not counted."""
    E = activations.MemoryEvent
    events = [E(0, 1, 0, 0.0, 100), E(0, 1, 0, 1.0, 50), E(0, 1, 1, 1.5, 40), E(0, 1, 0, 2.0, -120),
              E(0, 1, 1, 3.0, -40)]
    assert activations.remainder_shares(events[::-1]) == [30 / 150]  # in time order, whatever the list's


def test_probe_off_counts_nothing():
    stage, probe = _FakeStage(nn.Linear(4, 4)), activations.ActivationProbe(rank=0)
    probe.attach(stage)
    stage.forward_one_chunk(0, torch.randn(2, 4, requires_grad=True)).sum().backward()
    assert probe.events == []


# --- the companion script under torchrun --------------------------------------------------------------
SMALL = ["--dim", "32", "--seq-len", "16", "--batch-size", "16", "--heads", "4", "--steps", "1", "--warmup", "0"]


def check_run(data: dict, p: int):
    m = data["microbatches"]
    assert data["match"] and [r["schedule"] for r in data["runs"]] == NAMES
    for run in data["runs"]:
        name = run["schedule"]
        assert run["match"] and run["max_grad_diff"] < 1e-12 and abs(run["loss"] - run["reference_loss"]) < 1e-12, name
        assert run["max_weight_diff"] < 1e-12 and run["steps_trained"] == len(run["losses"]) == 2, name  # SGD updates
        order = torch_orders.torch_order(name, p, m, data["stages_per_rank"])
        # the order each rank ran, recorded, is the order the simulator was given
        events = timeline.from_json(run["memory"]["events"])
        for rank in range(p):
            ran = [e.label for e in sorted(events, key=lambda e: e.start) if e.rank == rank]
            assert ran == [str(a) for a in order[rank]], (name, rank)
        peaks = {int(k): v for k, v in run["memory"]["peak_in_flight_most"].items()}
        assert peaks == simulate.peak_in_flight(order), name
        any_bytes = {int(k): v for k, v in run["memory"]["peak_in_flight"].items()}
        if name in ("GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS"):
            assert any_bytes == peaks, name  # a full backward frees everything it saved
    by_name = {r["schedule"]: r for r in data["runs"]}
    gpipe = {int(k): v for k, v in by_name["GPipe"]["memory"]["peak_in_flight"].items()}
    one_f = {int(k): v for k, v in by_name["1F1B"]["memory"]["peak_in_flight"].items()}
    assert gpipe == {r: m for r in range(p)}
    assert one_f == {r: p - r for r in range(p)}


@pytest.mark.torchrun
def test_all_seven_schedules_match_one_process_at_2_ranks():
    r = launch.torchrun("05_schedules.py", ["--check", "--dtype", "float64", "--layers", "4",
                                            "--microbatches", "4", *SMALL], nproc=2, timeout=300)
    check_run(r.data, 2)


@pytest.mark.torchrun
def test_all_seven_schedules_match_one_process_at_4_ranks():
    r = launch.torchrun("05_schedules.py", ["--check", "--dtype", "float64", "--layers", "8",
                                            "--microbatches", "8", *SMALL], nproc=4, timeout=400)
    check_run(r.data, 4)


@pytest.mark.parametrize("args,message", [
    (["--schedules", "DualPipeV", "--microbatches", "2", "--batch-size", "8"], "use 4 or more"),
    (["--schedules", "Interleaved1F1B", "--microbatches", "5", "--batch-size", "10"], "try 4 or 6"),
    (["--schedules", "1F1B", "--microbatches", "1"], "Schedule1F1B needs at least as many microbatches"),
    (["--schedules", "LoopedBFS", "--layers", "3"], "raise --layers to 4"),
    (["--schedules", "LoopedBFS", "--stages-per-rank", "1"], "at least 2 stages per rank"),
    (["--microbatches", "8", "--batch-size", "12"], "not divisible by --microbatches 8"),
    (["--lr", "-1"], "--lr must be at least 0"),
])
def test_bad_flags_one_line_nonzero_exit(args, message):
    from conftest import assert_one_line_error

    assert_one_line_error("05_schedules.py", args, message)


def test_unknown_schedule_is_refused_by_argparse(capsys):
    from conftest import argparse_refusal

    assert "invalid choice" in argparse_refusal("05_schedules.py", ["--schedules", "Zero"], capsys)
