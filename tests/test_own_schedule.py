"""Chapter 14: hand-written 1F1B and interleaved 1F1B, ZB-H2 and V-Half on torch's runtime.

The pure tests check the order generators (every action once, the right placement, no deadlock,
torch's runtime accepts them, the papers' properties) and the checks of ``custom_schedules``;
the torchrun tests run all eight schedules at p = 2 (with a ninth order from a --csv file) and
p = 4 against one process, bitwise in float32, and check that each rank ran the order the
simulator is given, and every legal schedule's --check at m = 3, 5 and 6 on 2 and 3 ranks (three
(p, m) pairs). The chapter launches p = 2, the four split-backward schedules at p = 4 with small
shapes, and the two failures; these launches do not repeat them.
"""

from __future__ import annotations

import re

import pytest

from ppbook import custom_schedules, launch, timeline, torch_orders
from ppbook.planner import schedules as planner_schedules
from ppbook.planner import simulate
from ppbook.planner.schedules import Action
from ppbook.stages import schedule_problem

GENERATORS = custom_schedules.GENERATORS
SHAPES = [(p, m) for p in (2, 3, 4, 5) for m in sorted({1, 2, p, 2 * p - 1, 2 * p, 3 * p + 1})]


def placement(name: str, p: int) -> dict[int, list[int]]:
    return {r: [r] for r in range(p)} if name == "ZB-H2" else {r: [r, 2 * p - 1 - r] for r in range(p)}


# --- the generators -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(GENERATORS))
@pytest.mark.parametrize("p,m", SHAPES)
def test_every_pass_once_on_its_rank_and_no_deadlock(name, p, m):
    order = GENERATORS[name](p, m)
    assert {r: sorted({a.stage for a in acts}) for r, acts in order.items()} == placement(name, p)
    acts = [a for acts in order.values() for a in acts]
    stages = 2 * p if name == "V-Half" else p
    assert sorted(acts, key=str) == sorted((Action(s, k, i) for s in range(stages) for k in "FIW"
                                            for i in range(m)), key=str)
    assert custom_schedules.order_problem(order, p, m) is None
    simulate.simulate(order, {"F": 1.0, "I": 1.3, "W": 0.4})  # any costs: no deadlock


@pytest.mark.parametrize("name", list(GENERATORS))
@pytest.mark.parametrize("p,m", [(2, 4), (2, 8), (4, 8), (4, 16)])
def test_torchs_runtime_accepts_them(name, p, m):
    order = GENERATORS[name](p, m)
    lowered = custom_schedules.runtime_lowering(order, m)
    compute = {r: [a for a in acts if re.fullmatch(r"\d+[FIW]\d+", a)] for r, acts in lowered.items()}
    assert compute == {r: list(map(str, acts)) for r, acts in order.items()}  # in our order
    # one send (and one receive) per hand-off between ranks
    assert sum("SEND" in a for acts in lowered.values() for a in acts) == simulate.messages(order)
    assert sum("RECV" in a for acts in lowered.values() for a in acts) == simulate.messages(order)


@pytest.mark.parametrize("p", [2, 3, 4, 6])
def test_zb_h2_is_a_parallelogram_with_2p_minus_1_in_flight(p):
    """Qi et al. 2023, section 2.2: 2(p - r) - 1 warm-up forwards on rank r, up to 2p - 1
    microbatches in flight, and at F = I = W no gap inside any rank's work."""
    m = 3 * p
    order = custom_schedules.zb_h2_order(p, m)
    for r, acts in order.items():
        first_i = next(k for k, a in enumerate(acts) if a.kind == "I")
        assert first_i == 2 * (p - r) - 1 and all(a.kind == "F" for a in acts[:first_i])
    assert max(simulate.peak_in_flight(order, by="rank").values()) == 2 * p - 1
    events = simulate.simulate(order, {"F": 1, "I": 1, "W": 1})
    for r in order:
        mine = [e for e in events if e.rank == r]
        assert max(e.end for e in mine) - min(e.start for e in mine) == 3 * m  # no gap
        assert min(e.start for e in mine) == r  # the parallelogram's slanted edge
    zb_h1 = timeline.span(simulate.simulate(torch_orders.zb_h1_order(p, m), {"F": 1, "I": 1.5, "W": 0.5}))[1]
    assert timeline.span(simulate.simulate(order, {"F": 1, "I": 1.5, "W": 0.5}))[1] < zb_h1


@pytest.mark.parametrize("p", [2, 3, 4, 5, 6, 8])
def test_v_half_holds_about_half_of_1f1b(p):
    """Qi et al. 2024: V-Half's peak per rank is p + 2 chunks for even p, p + 1 for odd (half a
    stage each), against ZB-V's and 1F1B's 2p; it idles less than 1F1B and more than ZB-V."""
    m = 4 * p
    order = custom_schedules.v_half_order(p, m)
    peak = max(simulate.peak_in_flight(order, by="rank").values())
    assert peak == p + (2 if p % 2 == 0 else 1)
    assert max(simulate.peak_in_flight(planner_schedules.order("ZBVZeroBubble", p, m), by="rank").values()) == 2 * p
    chunk = {"F": 0.5, "I": 0.5, "W": 0.5}
    step = timeline.span(simulate.simulate(order, chunk))[1]
    assert timeline.span(simulate.simulate(planner_schedules.order("ZBVZeroBubble", p, m), chunk))[1] <= step
    assert step < timeline.span(simulate.simulate(planner_schedules.order("1F1B", p, m), {"F": 1, "B": 2}))[1]


def test_csv_round_trip_and_torchs_reader():
    from torch.distributed.pipelining.schedules import _Action

    order = custom_schedules.v_half_order(3, 7)
    text = custom_schedules.to_csv(order)
    assert custom_schedules.from_csv(text) == order
    cells = [c for line in text.splitlines() for c in line.split(",")]
    assert [str(_Action.from_str(c)) for c in cells] == cells


# --- the checks ------------------------------------------------------------------------------------
def one_f_one_b(p, m):
    return planner_schedules.order("1F1B", p, m)


@pytest.mark.parametrize("edit,message", [
    (lambda o: {0: o[0]}, "there are 2 ranks"),
    (lambda o: {0: o[0] + [Action(1, "F", 9)], 1: o[1]}, "stage 1 is on rank 0 and on rank 1"),
    (lambda o: {0: o[0][:1] + o[0], 1: o[1]}, "rank 0 runs 0F0 twice"),
    (lambda o: {0: [Action(0, "F", 4) if a == Action(0, "F", 3) else a for a in o[0]], 1: o[1]},
     "the microbatches are 0 to 3"),
    (lambda o: {0: o[0][:-1], 1: o[1]}, "stage 0 does not run microbatch 3"),
    (lambda o: {0: [Action(0, "B", 0)] + [a for a in o[0] if a != Action(0, "B", 0)], 1: o[1]},
     "before 0F0"),
    (lambda o: {0: [Action(0, "F", 0), Action(0, "B", 0)] + [a for a in o[0] if a.microbatch], 1: o[1]},
     None),  # a bubble, not a mistake
])
def test_order_problem(edit, message):
    problem = custom_schedules.order_problem(edit(one_f_one_b(2, 4)), 2, 4)
    assert (problem is None) if message is None else (message in problem), problem


def test_order_problem_finds_a_deadlock_torch_refuses_too():
    def rank(r, warmup, m=4):
        acts = [Action(r, "F", i) for i in range(warmup)]
        for i in range(m - warmup):
            acts += [Action(r, "B", i), Action(r, "F", warmup + i)]
        return acts + [Action(r, "B", i) for i in range(m - warmup, m)]

    swapped = {0: rank(0, 1), 1: rank(1, 2)}  # 1F1B with the ranks' warm-ups swapped
    assert "deadlocks" in custom_schedules.order_problem(swapped, 2, 4)
    with pytest.raises(AssertionError, match="can't schedule sends/recvs"):
        custom_schedules.runtime_lowering(swapped, 4)


def test_runtime_accepts_a_repeated_backward_that_the_book_refuses():
    order = custom_schedules.v_half_order(2, 8)
    order[0].insert(order[0].index(Action(0, "I", 1)), Action(0, "I", 1))
    custom_schedules.runtime_lowering(order, 8)  # torch counts distinct microbatches: no error
    assert "runs 0I1 twice" in custom_schedules.order_problem(order, 2, 8)


@pytest.mark.parametrize("p", [2, 3, 4, 5])
def test_hand_written_plans_need_no_message_tags(p):
    """The receiver of every pair of ranks expects the messages in the order they are sent (NCCL
    has no tags): true of 1F1B and of interleaved 1F1B, not of V-Half."""
    for v in (2, 3):
        for m in (p, 2 * p, 3 * p):
            if schedule_problem("Interleaved1F1B", p, m, v) is None:
                assert custom_schedules.mismatched_messages(planner_schedules.order("Interleaved1F1B", p, m, v)) == []
    assert custom_schedules.mismatched_messages(one_f_one_b(p, 2 * p)) == []
    assert custom_schedules.mismatched_messages(custom_schedules.v_half_order(4, 8))
    backwards_swapped = one_f_one_b(2, 4)  # the last rank sends gradients 1, 0; rank 0 uses 0, 1
    i, j = backwards_swapped[1].index(Action(1, "B", 0)), backwards_swapped[1].index(Action(1, "B", 1))
    backwards_swapped[1][i], backwards_swapped[1][j] = backwards_swapped[1][j], backwards_swapped[1][i]
    assert custom_schedules.mismatched_messages(backwards_swapped) == [(1, 0)]


def _batches_as_records(batches_of):
    """``batches_of[r]``: rank r's batches in order, each a list of ("send" | "recv", peer): the
    records ``nccl_rules.order_problem`` reads, messages numbered per (sender, receiver)."""
    records, count = {}, {}
    for r, batches in batches_of.items():
        records[r] = []
        for b, batch in enumerate(batches):
            events = []
            for kind, peer in batch:
                pair = (r, peer) if kind == "send" else (peer, r)
                count[kind, pair] = count.get((kind, pair), 0) + 1
                events.append(["p2p", "0", *pair, count[kind, pair]])
            records[r].append({"what": f"batch #{b + 1} {batch}", "events": events})
    return records


def _hand_batches(script, plans, num_stages, lockstep=True):
    """The batches ``hand_step`` posts with these plans: on one clock (lockstep), or, before its
    fix (regression), phase by phase, each send with the receive that follows it on its rank."""
    p = len(plans)
    out = lambda kind, s: (s + 1) % p if kind == "F" and s < num_stages - 1 else (  # noqa: E731
        (s - 1) % p if kind == "B" and s > 0 else None)
    if lockstep:
        ticks = script.lockstep(plans, num_stages)
        batches = {r: [] for r in range(p)}
        for t in range(len(ticks[0])):
            for r in range(p):
                batch = []
                act = ticks[r][t]
                if act is not None:
                    s, _ = plans[r][1 if act[0] == "F" else 2][act[1]]
                    if out(act[0], s) is not None:
                        batch.append(("send", out(act[0], s)))
                for q in range(p):
                    a = ticks[q][t]
                    if q != r and a is not None:
                        s, _ = plans[q][1 if a[0] == "F" else 2][a[1]]
                        if out(a[0], s) == r:
                            batch.append(("recv", q))
                if batch:
                    batches[r].append(batch)
        return batches
    batches = {}
    for r, (warmup, fwd, bwd) in enumerate(plans):
        recv_in = lambda k: [("recv", (fwd[k][0] - 1) % p)] if k < len(fwd) and fwd[k][0] > 0 else []  # noqa: E731
        recv_g = lambda k: [("recv", (bwd[k][0] + 1) % p)] if bwd[k][0] < num_stages - 1 else []  # noqa: E731
        send = lambda kind, sk: [("send", out(kind, sk[0]))] if out(kind, sk[0]) is not None else []  # noqa: E731
        seq = [recv_in(0)]
        seq += [send("F", fwd[k]) + recv_in(k + 1) for k in range(warmup)]
        for k in range(len(fwd) - warmup):
            seq += [send("F", fwd[warmup + k]) + recv_g(k), send("B", bwd[k]) + recv_in(warmup + k + 1)]
        for k in range(len(fwd) - warmup, len(bwd)):
            seq += [recv_g(k), send("B", bwd[k])]
        batches[r] = [b for b in seq if b]
    return batches


def test_hand_step_posts_each_message_in_one_tick_on_both_sides():
    """Regression (issue 39): on NCCL a rank's batches run one after the other on its group's
    communicator, and a large send ends only once its receive runs. hand_step used to post each
    send with the receive that follows it on its own rank; with interleaving, rank 0 then posts
    a send alone that rank 1 receives in a batch whose own send rank 0 receives only later: the
    two wait on each other (order_problem with p2p=True names it). On one clock (lockstep) every
    message is in the same tick's batch on both sides, for every shape tried."""
    from ppbook import nccl_rules

    script = launch.load_script("14_own_schedule.py")
    old = _hand_batches(script, [script.plan_interleaved(r, 2, 4, 2) for r in range(2)], 4, lockstep=False)
    problem = nccl_rules.order_problem(_batches_as_records(old), p2p=True)
    assert problem and "wait on each other" in problem and "large send" in problem, problem
    for p in (2, 3, 4):
        for m in (p, 2 * p):
            shapes = [([script.plan_1f1b(r, p, m) for r in range(p)], p)]
            shapes += [([script.plan_interleaved(r, p, m, v) for r in range(p)], p * v) for v in (2, 3)
                       if schedule_problem("Interleaved1F1B", p, m, v) is None]
            for plans, num_stages in shapes:
                records = _batches_as_records(_hand_batches(script, plans, num_stages))
                assert nccl_rules.order_problem(records, p2p=True) is None, (p, m, num_stages)
                assert len(records[0]) > 0


@pytest.mark.parametrize("p", [2, 3, 4, 8])
def test_scripts_plans_are_torchs_orders(p):
    script = launch.load_script("14_own_schedule.py")

    def executed(plan):
        warmup, forwards, backwards = plan
        acts = [Action(s, "F", i) for s, i in forwards[:warmup]]
        for (s, i), (t, j) in zip(forwards[warmup:], backwards):
            acts += [Action(s, "F", i), Action(t, "B", j)]
        return acts + [Action(s, "B", i) for s, i in backwards[len(forwards) - warmup:]]

    for m in (p, 2 * p, 3 * p):
        for r in range(p):
            assert executed(script.plan_1f1b(r, p, m)) == planner_schedules.order("1F1B", p, m)[r]
            for v in (2, 3):
                if schedule_problem("Interleaved1F1B", p, m, v) is None:
                    assert executed(script.plan_interleaved(r, p, m, v)) == planner_schedules.order("Interleaved1F1B", p, m, v)[r]


# --- the companion script under torchrun -----------------------------------------------------------
SMALL = ["--dim", "32", "--seq-len", "8", "--batch-size", "8", "--heads", "4", "--steps", "1", "--warmup", "0",
         "--check"]  # float32, the chapter's: bitwise equal to one process, as the chapter says


def check_run(data: dict, p: int, schedules=None, tol: float = 0.0, csv: dict | None = None):
    """Every run of ``schedules`` (default: all eight), and of ``csv`` ({path: order}) if given,
    equals one process within ``tol``, each hand-written one equals torch's bit for bit, and
    each rank ran its schedule's order."""
    m, v, csv = data["microbatches"], data["stages_per_rank"], csv or {}
    schedules = list(schedules or launch.load_script("14_own_schedule.py").SCHEDULES) + list(csv)
    assert data["match"] and [r["schedule"] for r in data["runs"]] == schedules
    assert data["hand_vs_torch"] == {h: 0.0 for h in ("1F1B-hand", "Interleaved1F1B-hand") if h in schedules}
    for run in data["runs"]:
        name = run["schedule"]
        assert run["match"] and run["max_grad_diff"] <= tol and abs(run["loss"] - run["reference_loss"]) <= tol, name
        order = (csv[name] if name in csv else GENERATORS[name](p, m) if name in GENERATORS
                 else planner_schedules.order(name.removesuffix("-hand"), p, m, v))
        events = timeline.from_json(run["events"])
        for rank in range(p):  # each rank ran the order the simulator is given
            ran = [e.label for e in sorted(events, key=lambda e: e.start) if e.rank == rank]
            assert ran == [str(a) for a in order[rank]], (name, rank)
        if run["memory"] is not None:  # run by torch: the probe counts what the order predicts
            peaks = {int(k): n for k, n in run["memory"]["peak_in_flight_most"].items()}
            assert peaks == simulate.peak_in_flight(order), name


@pytest.mark.torchrun
def test_all_eight_and_a_csv_match_one_process_at_2_ranks(tmp_path):
    """The same launch runs a ninth order from a CSV (ZB-H1's, which none of the eight is): the
    path a reader's own order takes (--csv), checked like the others."""
    zb_h1, path = torch_orders.zb_h1_order(2, 4), tmp_path / "zb_h1.csv"
    path.write_text(custom_schedules.to_csv(zb_h1))
    r = launch.torchrun("14_own_schedule.py", ["--layers", "4", "--microbatches", "4", "--csv", path, *SMALL],
                        nproc=2, timeout=300)
    check_run(r.data, 2, csv={str(path): zb_h1})


@pytest.mark.torchrun
def test_all_eight_match_one_process_at_4_ranks():
    r = launch.torchrun("14_own_schedule.py", ["--layers", "8", "--microbatches", "8", *SMALL], nproc=4, timeout=400)
    check_run(r.data, 4)  # bitwise, as at 2 ranks
    by_name = {run["schedule"]: run for run in r.data["runs"]}
    held = {name: {int(k): n for k, n in by_name[name]["memory"]["peak_in_flight_most"].items()}
            for name in ("V-Half", "ZBVZeroBubble")}
    per_rank = {name: max(h[s] + h[7 - s] for s in range(4)) for name, h in held.items()}
    assert per_rank["V-Half"] < per_rank["ZBVZeroBubble"]  # measured: V-Half holds less


PAIRS = ((3, 3), (2, 5), (3, 6))  # (p, m)


def legal_at(p: int, m: int) -> list[str]:
    script = launch.load_script("14_own_schedule.py")
    return [n for n in script.SCHEDULES if schedule_problem(script.PLACED_AS.get(n, n), p, m, 2, 6) is None]


def every_m_launches() -> list[tuple[int, int, list[str]]]:
    """(p, m, schedules): every legal schedule at each pair, and at (2, 6) those that no pair runs on
    2 ranks (the interleaved ones refuse m = 5 there)."""
    runs = [(p, m, legal_at(p, m)) for p, m in PAIRS]
    on_two = {n for p, _, names in runs if p == 2 for n in names}
    return [*runs, (2, 6, [n for n in legal_at(2, 6) if n not in on_two])]


def test_the_launches_run_every_schedule_on_each_p():
    script = launch.load_script("14_own_schedule.py")
    runs = every_m_launches()
    assert {m for _, m, _ in runs} == {3, 5, 6}
    for p in (2, 3):
        assert {n for q, _, names in runs if q == p for n in names} == set(script.SCHEDULES), p


@pytest.mark.torchrun
@pytest.mark.parametrize("p,m,legal", [pytest.param(*x, id=f"p{x[0]}-m{x[1]}") for x in every_m_launches()])
def test_check_passes_at_3_5_and_6_microbatches(p, m, legal):
    """Issue 26: --check holds at every legal m, not only powers of two; in float32 every schedule
    sums the same microbatches in the same order as the one-process run, so to the bit. Three
    (p, m) pairs, not the six of the product: the arithmetic at m does not depend on p. (3, 3):
    m = p; (2, 5): an odd m that divides into neither p, where DualPipeV runs at an odd m; (3, 6):
    m = 2p, every schedule on 3 ranks. (2, 6) adds the two interleaved schedules on 2 ranks, which
    refuse m = 5 there. Each m once, every schedule on 2 ranks and on 3 (checked above)."""
    r = launch.torchrun("14_own_schedule.py", ["--schedules", *legal, "--microbatches", str(m), "--batch-size", "30",
                                               "--layers", "6", "--dim", "32", "--seq-len", "8", "--steps", "1",
                                               "--warmup", "0", "--check"], nproc=p, timeout=120, check=False)
    assert r.returncode == 0, f"{r.shell_command}\n{r.output[-3000:]}"
    check_run(r.data, p, legal)


@pytest.mark.parametrize("args,message", [
    (["--schedules", "1F1B", "--microbatches", "1"], "Schedule1F1B needs at least as many microbatches"),
    (["--schedules", "V-Half", "--layers", "3"], "V-Half on 2 processes has 4 stages"),
    (["--schedules", "Interleaved1F1B-hand", "--microbatches", "5", "--batch-size", "10"], "try 4 or 6"),
    (["--csv", "/nonexistent.csv"], "no such file"),
    (["--mistake", "repeated-backward", "--microbatches", "1"], "needs 2 or more processes and --microbatches 2"),
    (["--microbatches", "8", "--batch-size", "12"], "not divisible by --microbatches 8"),
])
def test_bad_flags_one_line(args, message):
    from conftest import assert_one_line_error

    assert_one_line_error("14_own_schedule.py", args, message)


def test_a_bad_csv_is_refused_before_any_process_group(tmp_path):
    from conftest import assert_one_line_error

    path = tmp_path / "order.csv"
    order = planner_schedules.order("1F1B", 2, 4)
    order[0] = order[0] + [Action(0, "B", 3)]
    path.write_text(custom_schedules.to_csv(order))
    assert_one_line_error("14_own_schedule.py", ["--csv", path, "--microbatches", "4"], "runs 0B3 twice")


@pytest.mark.parametrize("cell", ["12", "F1", "0X1", "0F"])
def test_a_csv_cell_that_is_not_an_action_is_named(cell):
    text = custom_schedules.to_csv(planner_schedules.order("1F1B", 2, 2)).replace("0F0", cell, 1)
    with pytest.raises(ValueError, match=f"cell '{cell}' is not an action"):
        custom_schedules.from_csv(text)


@pytest.mark.torchrun
def test_the_exchange_before_its_fix_reads_receives_before_they_arrive_under_nccl_rules():
    """Issue 39: exchange() waited on the works after the sends' (works[len(sends):]); NCCL returns
    one work for the batch, so it waited on none and read its receive buffers too early. Under
    PPBOOK_NCCL_RULES=1 gloo returns one work too and a receive holds NaN until waited on: the old
    code fails --check on every run (the fixed one passes in every other test here, under the same
    rules by default)."""
    r = launch.torchrun("14_own_schedule.py", ["--schedules", "1F1B-hand", "--microbatches", "4", *SMALL,
                                               "--exchange-before-fix"],
                        nproc=2, timeout=300, check=False, env={"PPBOOK_NCCL_RULES": "1"})
    assert r.returncode != 0 and re.search(r"1F1B-hand .* MISMATCH", r.output), r.output
    assert "MISMATCH in at least one run" in r.output

