"""PPBOOK_NCCL_RULES=1 (ppbook.nccl_rules): gloo held to NCCL's rules, on the CPU.

The pure part (the order check across ranks) runs in this process; the rest launches one tiny
program that imports nothing from the book, under the launch server (the rules installed by the
forked rank) and under torchrun itself (installed by the sitecustomize the launcher puts on
PYTHONPATH), and one whose two ranks issue collectives on two groups in opposite orders. The
regressions of the three defects the mode was built for are in test_own_schedule.py (the batch's
one work), test_moe.py (the overlap's two threads) and here (a blocking send that returns at once);
test_own_schedule.py also holds chapter 14's batches to order_problem(p2p=True), which the mode
does not run (torch's schedules mix batches with lone sends that NCCL puts on other communicators).
"""

from __future__ import annotations

import re
import textwrap

import pytest

from ppbook import launch, nccl_rules

# Every check of one launch: one work per batch, poison until wait(), a blocking send that returns
# before its peer receives, contiguity; it imports only torch (like scripts/01_minimal.py).
RULES = textwrap.dedent('''
    import os, sys
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    r, store = dist.get_rank(), dist.distributed_c10d._get_default_store()
    peer = 1 - r
    x = torch.full((4,), float(r))
    got = torch.zeros(4)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, peer), dist.P2POp(dist.irecv, got, peer)])
    assert len(works) == 1, works  # NCCL's one work for the batch
    works[0].wait()
    assert got.tolist() == [float(peer)] * 4, got
    box = torch.zeros(3)
    work = dist.irecv(box, peer)
    before = box.clone()  # read before wait(): poison
    dist.barrier()
    dist.send(torch.ones(3), peer)
    work.wait()
    assert before.isnan().all() and box.tolist() == [1.0] * 3, (before, box)
    # a blocking send returns before its peer receives: rank 1 receives only once rank 0's send has returned
    if r == 0:
        dist.send(torch.ones(2), 1)
        store.set("sent", "1")
    else:
        store.wait(["sent"])
        dist.recv(torch.zeros(2), 0)
    try:
        dist.all_reduce(torch.zeros(3, 2).t())
        raise SystemExit("a non-contiguous tensor was accepted")
    except RuntimeError as err:
        assert "non-contiguous" in str(err), err
    print(f"rank {r}: RULES OK")
    dist.destroy_process_group()
''')

# Two groups over the same two ranks, one asynchronous collective on each, in opposite orders on
# the two ranks: gloo runs them (a thread and connections per group), NCCL may wait forever.
OPPOSITE = textwrap.dedent('''
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    groups = [dist.new_group([0, 1]) for _ in range(2)]
    works = [dist.all_reduce(torch.ones(2), group=g, async_op=True)
             for g in (groups if dist.get_rank() == 0 else groups[::-1])]
    for work in works:
        work.wait()
    dist.destroy_process_group()
''')


def test_opposite_orders_of_collectives_on_two_groups_are_named():
    x = {"what": "all_reduce on group 1 [0, 1] #1", "events": [["coll", "1", 1]]}
    y = {"what": "all_reduce on group 2 [0, 1] #1", "events": [["coll", "2", 1]]}
    line = nccl_rules.order_problem({0: [x, y], 1: [y, x]})
    assert line.startswith("ranks 0, 1 issued operations in orders that wait on each other") and "\n" not in line
    assert "rank 0 issued all_reduce on group 1 [0, 1] #1 before all_reduce on group 2 [0, 1] #1" in line
    assert "rank 1 issued all_reduce on group 2 [0, 1] #1 before all_reduce on group 1 [0, 1] #1" in line
    assert nccl_rules.order_problem({0: [x, y], 1: [x, y]}) is None
    send = {"what": "send to rank 1 #1", "events": [["p2p", "0", 0, 1, 1]]}  # point-to-point: not compared
    assert nccl_rules.order_problem({0: [send, x], 1: [x, send]}) is None



def test_point_to_point_batches_that_wait_on_each_other_only_with_p2p():
    """order_problem(p2p=True): each rank sends alone, in a batch of its own, then receives the
    peer's message in the next. On NCCL, with large messages, each send waits for a receive its
    peer posts only after its own send: they wait on each other. One batch holding both messages,
    on both sides, does not."""
    def batch(n, *events):
        return {"what": f"batch_isend_irecv #{n}", "events": [["p2p", "0", *ev, 1] for ev in events]}

    apart = {0: [batch(1, (0, 1)), batch(2, (1, 0))], 1: [batch(1, (1, 0)), batch(2, (0, 1))]}
    line = nccl_rules.order_problem(apart, p2p=True)
    assert line and "a large send once its receive runs" in line and "rank 0 issued batch_isend_irecv #1 before" in line
    assert nccl_rules.order_problem(apart) is None  # the mode at run time compares collectives only
    together = {r: [batch(1, (0, 1), (1, 0))] for r in (0, 1)}
    assert nccl_rules.order_problem(together, p2p=True) is None

def test_three_ranks_in_a_ring_of_groups():
    a, b, c = ({"what": f"all_reduce on group {g}", "events": [["coll", g, 1]]} for g in "abc")
    assert "ranks 0, 1, 2" in nccl_rules.order_problem({0: [a, c], 1: [b, a], 2: [c, b]})
    assert nccl_rules.order_problem({0: [a, c], 1: [a, b], 2: [c, b]}) is None


def test_the_mode_is_one_variable_and_the_launcher_puts_its_hook_first():
    assert nccl_rules.asked({"PPBOOK_NCCL_RULES": "1"}) and not nccl_rules.asked({"PPBOOK_NCCL_RULES": "0"})
    with pytest.raises(ValueError, match="PPBOOK_NCCL_RULES='maybe' is neither on nor off"):
        nccl_rules.asked({"PPBOOK_NCCL_RULES": "maybe"})
    env = launch.started_env({"PPBOOK_NCCL_RULES": "1", "PYTHONPATH": "/x"})
    assert env["PYTHONPATH"].split(":") == [nccl_rules.site_folder(), "/x"]
    assert launch.started_env({"PYTHONPATH": "/x"})["PYTHONPATH"] == "/x"


@pytest.mark.torchrun
@pytest.mark.parametrize("fork", [True, False], ids=["forked", "torchrun"])
def test_a_script_that_imports_nothing_from_the_book_runs_under_the_rules(tmp_path, fork):
    path = tmp_path / "rules.py"
    path.write_text(RULES)
    r = launch.torchrun(str(path), nproc=2, timeout=120, json_result=False, fork=fork,
                        env={"PPBOOK_NCCL_RULES": "1"})
    assert r.forked == fork and sorted(re.findall(r"rank \d: RULES OK", r.output)) == ["rank 0: RULES OK",
                                                                                        "rank 1: RULES OK"], r.output


@pytest.mark.torchrun
def test_collectives_in_opposite_orders_pass_on_gloo_and_fail_under_the_rules(tmp_path):
    path = tmp_path / "opposite.py"
    path.write_text(OPPOSITE)
    gloo = launch.torchrun(str(path), nproc=2, timeout=120, json_result=False, env={"PPBOOK_NCCL_RULES": "0"})
    assert gloo.returncode == 0, gloo.output
    ruled = launch.torchrun(str(path), nproc=2, timeout=120, json_result=False, check=False,
                            env={"PPBOOK_NCCL_RULES": "1"})
    lines = re.findall(r"ppbook\.nccl_rules: .*", ruled.output)
    assert ruled.returncode != 0 and len(lines) == 1, ruled.output
    assert "rank 0 issued all_reduce on group 1 [0, 1] #1 before all_reduce on group 2 [0, 1] #1" in lines[0]
