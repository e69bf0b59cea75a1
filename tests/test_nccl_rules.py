"""PPBOOK_NCCL_RULES=1 (ppbook.nccl_rules): gloo held to NCCL's rules, on the CPU.

The pure part (the checks across ranks) runs in this process; the rest launches tiny programs
that import nothing from the book, under the launch server (the rules installed by the forked
rank) and under torchrun itself (installed by the sitecustomize the launcher puts on PYTHONPATH).
Issue 49's holes each have a launch here that passed under the mode before it was fixed: blocking
sends that wait for each other (chapter 14's --mistake unpaired), FSDP2's and DTensor's
collectives (unseen before), a message whose two sides disagree on its size, an asynchronous
all-reduce read before wait(), a send buffer changed before wait(), a first batch on a group that
not every rank of the group takes part in. The regressions of the defects the mode was first built
for are in test_own_schedule.py (the batch's one work), test_moe.py (the overlap's two threads)
and here (a blocking send returns before its peer receives); test_own_schedule.py also holds
chapter 14's batches to order_problem(p2p=True).
"""

from __future__ import annotations

import json
import re
import textwrap

import pytest

from ppbook import launch, nccl_rules

# What the mode lets through, NCCL's way: one work per batch, poison until wait(), a blocking send
# that returns before its peer receives, an asynchronous all-reduce read after wait(); a
# non-contiguous tensor refused. It imports only torch (like scripts/01_minimal.py).
RULES = textwrap.dedent('''
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
    if r == 0:  # a receive read before wait(): poison
        box = torch.zeros(3)
        work = dist.irecv(box, 1)
        before = box.clone()
        work.wait()
        assert before.isnan().all() and box.tolist() == [1.0] * 3, (before, box)
    else:
        dist.send(torch.ones(3), 0)
    # a blocking send returns before its peer receives: rank 1 receives only once rank 0's send has returned
    if r == 0:
        dist.send(torch.ones(2), 1)
        store.set("sent", "1")
    else:
        store.wait(["sent"])
        dist.recv(torch.zeros(2), 0)
    t = torch.full((2,), float(r + 1))
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    assert t.tolist() == [3.0, 3.0], t
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

# Issue 49's holes found where the call or its wait() happens, in one launch of two ranks: each
# prints what the mode did, and the run itself is correct on NCCL.
AT_THE_CALL = textwrap.dedent('''
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    r, peer = dist.get_rank(), 1 - dist.get_rank()
    t = torch.full((4,), float(r + 1))
    work = dist.all_reduce(t, async_op=True)
    early = t.clone()  # read before wait()
    work.wait()
    print(f"rank {r}: all_reduce read before wait: {'poison' if early.isnan().all() else early.tolist()}")
    x, got = torch.full((3,), float(r)), torch.zeros(3)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, peer), dist.P2POp(dist.irecv, got, peer)])
    if r == 0:
        x.add_(1)  # the mistake: a send buffer changed before wait()
    try:
        [w.wait() for w in works]
        print(f"rank {r}: send buffer changed: passed")
    except RuntimeError as err:
        print(f"rank {r}: send buffer changed: refused: {err}")
    if r == 0:
        box = torch.zeros(2)
        work = dist.irecv(box, 1)
        box.fill_(7.0)  # the mistake: a receive's tensor written before wait()
        try:
            work.wait()
            print(f"rank {r}: receive written: passed")
        except RuntimeError as err:
            print(f"rank {r}: receive written: refused: {err}")
    else:
        dist.send(torch.ones(2), 0)
    dist.destroy_process_group()
''')

# Issue 49's holes found at the end, when the ranks compare their records: one mistake per run.
AT_THE_END = textwrap.dedent('''
    import sys

    import torch
    import torch.distributed as dist

    mistake = sys.argv[1]
    dist.init_process_group("gloo")
    r = dist.get_rank()
    if mistake == "size":  # 4 values sent into a receive of 8
        if r == 0:
            dist.send(torch.ones(4), 1)
        else:
            dist.recv(torch.zeros(8), 0)
    elif mistake == "first-batch":  # ranks 0 and 1 begin the world group with a batch, rank 2 with a barrier
        if r < 2:
            x, y = torch.ones(2), torch.zeros(2)
            ops = [dist.P2POp(dist.isend, x, 1 - r), dist.P2POp(dist.irecv, y, 1 - r)]
            [w.wait() for w in dist.batch_isend_irecv(ops)]
        dist.barrier()
    elif mistake in ("fsdp2", "dtensor"):  # another group's collective: before theirs on rank 0, after on 1
        from torch.distributed.device_mesh import init_device_mesh

        mesh, other = init_device_mesh("cpu", (2,)), dist.new_group([0, 1])
        if mistake == "fsdp2":
            from torch.distributed.fsdp import fully_shard

            torch.manual_seed(0)
            model = fully_shard(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)), mesh=mesh)
            run = lambda: model(torch.ones(2, 8)).sum().backward()
        else:
            from torch.distributed.tensor import Shard, distribute_tensor

            w = distribute_tensor(torch.ones(4, 2), mesh, [Shard(0)])
            run = lambda: w.full_tensor()  # an all-gather of the shards
        if r == 0:
            work = dist.all_reduce(torch.ones(1), group=other, async_op=True)
        run()
        if r == 1:
            work = dist.all_reduce(torch.ones(1), group=other, async_op=True)
        work.wait()
    print(f"rank {r}: the run completed")
    dist.destroy_process_group()
''')

# A pipeline whose stages are sharded with FSDP2 (issue 49: chapters 9 and 12): four ranks, two
# stages (pipeline groups {0, 2} and {1, 3}), each stage's blocks under fully_shard over its two
# ranks (data-parallel groups {0, 1} and {2, 3}), 1F1B, two steps. Four, not two: FSDP2 issues no
# collective on a group of one rank.
FSDP_PIPELINE = textwrap.dedent('''
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    dist.init_process_group("gloo")
    r = dist.get_rank()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))
    s = mesh.get_local_rank("pp")
    torch.manual_seed(0)
    full = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(4)])
    stage_mod = full[2 * s:2 * s + 2]
    for block in stage_mod:
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(stage_mod, mesh=mesh["dp"])
    stage = PipelineStage(stage_mod, s, 2, torch.device("cpu"), group=mesh.get_group("pp"))
    schedule = Schedule1F1B(stage, n_microbatches=4, loss_fn=lambda out, y: ((out - y) ** 2).mean())
    x, y = torch.randn(8, 8), torch.randn(8, 8)
    for _ in range(2):
        schedule.step(x) if s == 0 else schedule.step(target=y, losses=[])
    print(f"rank {r}: FSDP pipeline OK")
    dist.destroy_process_group()
''')


def ruled(tmp_path, source: str, args=(), nproc: int = 2, record=None):
    """Launch ``source`` under the rules; its result and the mode's lines."""
    path = tmp_path / "program.py"
    path.write_text(source)
    env = {"PPBOOK_NCCL_RULES": "1", **({nccl_rules.RECORD_ENV: str(record)} if record else {})}
    r = launch.torchrun(str(path), list(args), nproc=nproc, timeout=120, json_result=False, check=False, env=env)
    return r, re.findall(r"ppbook\.nccl_rules: .*", r.output)


# --- the pure checks --------------------------------------------------------------------------------
def op(what, kind, group="0", events=(), msgs=(), pair=None):
    o = {"what": what, "kind": kind, "group": group, "events": [list(e) for e in events],
         "msgs": [list(m) for m in msgs]}
    return {**o, "pair": pair} if pair else o


def lone(what, role, src, dst, k, numel=4, dtype="float32"):
    return op(what, "lone", events=[("p2p", "0", src, dst, k)], msgs=[(role, src, dst, k, k, numel, dtype)],
              pair=sorted((src, dst)))


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
    # the mode's own model: the same, with the collectives' queue (and their waits)
    ops = {g: op(f"all_reduce on group {g} [0, 1] #1", "coll", g, [("coll", g, 1)]) for g in "12"}
    records = {0: {"ops": [ops["1"], ops["2"]], "waits": [[0, 2], [1, 2]]},
               1: {"ops": [ops["2"], ops["1"]], "waits": [[0, 2], [1, 2]]}}
    line = nccl_rules.deadlock_problem(records)
    assert "rank 0 issued all_reduce on group 1 [0, 1] #1 before all_reduce on group 2 [0, 1] #1" in line, line
    records[1]["ops"] = [ops["1"], ops["2"]]
    assert nccl_rules.deadlock_problem(records) is None


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
    assert nccl_rules.order_problem(apart) is None  # collectives only
    together = {r: [batch(1, (0, 1), (1, 0))] for r in (0, 1)}
    assert nccl_rules.order_problem(together, p2p=True) is None


def test_three_ranks_in_a_ring_of_groups():
    a, b, c = ({"what": f"all_reduce on group {g}", "events": [["coll", g, 1]]} for g in "abc")
    assert "ranks 0, 1, 2" in nccl_rules.order_problem({0: [a, c], 1: [b, a], 2: [c, b]})
    assert nccl_rules.order_problem({0: [a, c], 1: [a, b], 2: [c, b]}) is None


def test_sends_that_wait_for_each_other_in_both_layouts():
    """Two ranks that each send, then receive, with messages of their own (chapter 14's unpaired
    1F1B in two operations): on NCCL each send waits for a receive queued behind the peer's own
    send, with a communicator per pair as with one per group. A receive first on one side does
    not wait."""
    def ops(first, second):
        return {"ops": [first, second], "waits": [[0, 1], [1, 2]]}

    records = {0: ops(lone("send to rank 1 #1", "send", 0, 1, 1), lone("recv from rank 1 #1", "recv", 1, 0, 1)),
               1: ops(lone("send to rank 0 #1", "send", 1, 0, 1), lone("recv from rank 0 #1", "recv", 0, 1, 1))}
    line = nccl_rules.deadlock_problem(records)
    assert line.startswith("ranks 0, 1 issued operations in orders that wait on each other on NCCL"), line
    assert "rank 0 issued send to rank 1 #1 before recv from rank 1 #1" in line, line
    assert "device_id" not in line  # both layouts
    records[1]["ops"].reverse()  # rank 1 receives first
    assert nccl_rules.deadlock_problem(records) is None


def test_a_receive_before_a_collective_waits_only_on_one_communicator():
    """Rank 0 posts a receive from rank 1 (alone), then joins a barrier; rank 1 joins the barrier,
    then sends. With one communicator per group (device_id) the receive holds the group's queue
    and rank 0's part of the barrier never starts; with a communicator per pair it does."""
    records = {0: {"ops": [lone("irecv from rank 1 #1", "recv", 1, 0, 1),
                           op("barrier on group 0 [0, 1] #1", "coll", events=[("coll", "0", 1)])],
                   "waits": [[1, 2], [0, 2]]},
               1: {"ops": [op("barrier on group 0 [0, 1] #1", "coll", events=[("coll", "0", 1)]),
                           lone("send to rank 0 #1", "send", 1, 0, 1)],
                   "waits": [[0, 1], [1, 2]]}}
    line = nccl_rules.deadlock_problem(records)
    assert line and "with device_id in init_process_group" in line, line
    assert "rank 0 issued irecv from rank 1 #1 before barrier on group 0 [0, 1] #1" in line, line


def test_messages_are_compared_between_their_two_sides():
    send, recv = lone("send to rank 1 #1", "send", 0, 1, 1, numel=4), lone("recv from rank 0 #1", "recv", 0, 1, 1, 8)
    line = nccl_rules.message_problem({0: {"ops": [send]}, 1: {"ops": [recv]}})
    assert line == ("rank 0's send to rank 1 #1 sends 4 float32 values and rank 1's recv from rank 0 #1 receives 8 "
                    "float32 values: NCCL needs the same count and dtype on both sides (gloo passes it, the rest of "
                    "the receive holding what it held before); receive into a tensor of the sent tensor's size and "
                    "dtype")
    half = lone("recv from rank 0 #1", "recv", 0, 1, 1, numel=4, dtype="float16")
    assert "4 float16 values" in nccl_rules.message_problem({0: {"ops": [send]}, 1: {"ops": [half]}})
    assert "has no matching receive on rank 1" in nccl_rules.message_problem({0: {"ops": [send]}, 1: {"ops": []}})
    batched = op("batch_isend_irecv with rank 0 #1", "batch", events=[("p2p", "0", 0, 1, 1)],
                 msgs=[("recv", 0, 1, 1, 1, 4, "float32")])
    line = nccl_rules.message_problem({0: {"ops": [send]}, 1: {"ops": [batched]}})
    assert "rank 0's send to rank 1 #1 is a message of its own and rank 1's batch_isend_irecv" in line, line
    assert nccl_rules.message_problem({0: {"ops": [send]}, 1: {"ops": [lone("r", "recv", 0, 1, 1)]}}) is None


def test_the_first_batch_on_a_group_needs_every_rank():
    first = {"kind": "batch", "what": "batch_isend_irecv with rank 1 #1", "ranks": [0, 1, 2], "bound": False}
    coll = {"kind": "coll", "what": "barrier on group 0 [0, 1, 2] #1", "ranks": [0, 1, 2], "bound": False}
    records = {0: {"firsts": {"0": first}}, 1: {"firsts": {"0": first}}, 2: {"firsts": {"0": coll}}}
    line = nccl_rules.first_batch_problem(records)
    assert line.startswith("on group 0 [0, 1, 2], rank 0's first operation is batch_isend_irecv with rank 1 #1 and "
                           "rank 2's is barrier on group 0 [0, 1, 2] #1"), line
    del records[2]["firsts"]["0"]
    assert "rank 2's never comes" in nccl_rules.first_batch_problem(records)
    records[2]["firsts"]["0"] = first
    assert nccl_rules.first_batch_problem(records) is None
    bound = {r: {"firsts": {"0": {**coll, "kind": "batch", "bound": True} if r < 2 else coll}} for r in range(3)}
    assert nccl_rules.first_batch_problem(bound) is None  # device_id: the communicator exists from the start


def test_the_mode_is_one_variable_and_the_launcher_puts_its_hook_first():
    assert nccl_rules.asked({"PPBOOK_NCCL_RULES": "1"}) and not nccl_rules.asked({"PPBOOK_NCCL_RULES": "0"})
    with pytest.raises(ValueError, match="PPBOOK_NCCL_RULES='maybe' is neither on nor off"):
        nccl_rules.asked({"PPBOOK_NCCL_RULES": "maybe"})
    env = launch.started_env({"PPBOOK_NCCL_RULES": "1", "PYTHONPATH": "/x"})
    assert env["PYTHONPATH"].split(":") == [nccl_rules.site_folder(), "/x"]
    assert launch.started_env({"PYTHONPATH": "/x"})["PYTHONPATH"] == "/x"


# --- launches -----------------------------------------------------------------------------------------
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
    r, lines = ruled(tmp_path, OPPOSITE)
    assert r.returncode != 0 and len(lines) == 1, r.output
    assert "rank 0 issued all_reduce on group 1 [0, 1] #1 before all_reduce on group 2 [0, 1] #1" in lines[0]


@pytest.mark.torchrun
def test_blocking_sends_that_wait_for_each_other_fail_every_run():
    """Issue 49 (1): the mode turned a blocking send into one that returns, and the unpaired 1F1B
    of chapter 14 (each rank sends before it receives) passed, where gloo itself times out and
    NCCL waits forever once a message is larger than its buffers. Now the send still returns, as
    NCCL's does, and the ranks' records show the sends waiting on each other: one line, well
    before the 30 s timeout the step would take to fail on gloo."""
    r = launch.torchrun("14_own_schedule.py", ["--mistake", "unpaired", "--timeout", "30"], nproc=2, timeout=180,
                        check=False, json_result=False, env={"PPBOOK_NCCL_RULES": "1"})
    lines = re.findall(r"ppbook\.nccl_rules: .*", r.output)
    assert r.returncode != 0 and len(lines) == 1 and "Timed out" not in r.output, r.output
    assert re.search(r"ranks 0, 1 issued operations in orders that wait on each other on NCCL .*: rank \d issued "
                     r"send to rank \d #\d+ before recv from rank \d #\d+", lines[0]), lines[0]


@pytest.mark.torchrun
def test_mistakes_found_at_the_call_or_its_wait(tmp_path):
    """Issue 49 (3): an asynchronous all-reduce read before wait() returned the unreduced values;
    a send buffer changed before wait() and a receive's tensor written before wait() passed."""
    r, lines = ruled(tmp_path, AT_THE_CALL)
    assert r.returncode == 0 and not lines, r.output
    for rank in (0, 1):
        assert f"rank {rank}: all_reduce read before wait: poison" in r.output, r.output
    assert re.search(r"rank 0: send buffer changed: refused: batch_isend_irecv with rank 1 #1: a tensor it sends "
                     r"changed before its work was waited on", r.output), r.output
    assert "rank 1: send buffer changed: passed" in r.output, r.output
    assert re.search(r"rank 0: receive written: refused: irecv from rank 1 #1: a tensor it writes was written to "
                     r"before its work was waited on", r.output), r.output


@pytest.mark.torchrun
@pytest.mark.parametrize("mistake, nproc, expected", [
    ("size", 2, "rank 0's send to rank 1 #1 sends 4 float32 values and rank 1's recv from rank 0 #1 receives 8 "
                "float32 values: NCCL needs the same count and dtype on both sides"),
    ("first-batch", 3, "on group 0 [0, 1, 2], rank 0's first operation is batch_isend_irecv with rank 1 #1 and "
                       "rank 2's is barrier on group 0 [0, 1, 2] #1"),
    ("fsdp2", 2, "rank 0 issued all_reduce on group 1 [0, 1] #1 before all_gather_single on group 0 [0, 1] #1"),
    ("dtensor", 2, "rank 0 issued all_reduce on group 1 [0, 1] #1 before _c10d_functional.all_gather_into_tensor "
                   "on group 0 [0, 1] #1"),
])
def test_mistakes_found_when_the_ranks_compare_their_records(tmp_path, mistake, nproc, expected):
    """Issue 49 (2, 3): each of these completed under the mode: a message of 4 values received
    into 8 (the tail uninitialised), a first batch on a group that rank 2 does not take part in,
    and collectives in opposite orders on two groups when one of the two is FSDP2's or DTensor's,
    which the mode did not see."""
    r, lines = ruled(tmp_path, AT_THE_END, [mistake], nproc=nproc)
    assert r.returncode != 0 and len(lines) == 1 and expected in lines[0], r.output
    assert "rank 0: the run completed" in r.output  # found at the end, not where gloo failed


@pytest.mark.torchrun
def test_a_pipeline_with_fsdp2_holds_to_nccl_order(tmp_path):
    """Issue 49 (2): FSDP2's collectives are recorded next to the pipeline's batches, in the order
    each rank issued them, and the four ranks' records hold to what NCCL needs (the run passes the
    mode, and the records pass its checks here again; with rank 0's first gather and first
    reduce-scatter swapped, as a rank that issues FSDP2's collectives in another order would, they
    do not)."""
    r, lines = ruled(tmp_path, FSDP_PIPELINE, nproc=4, record=tmp_path)
    assert r.returncode == 0 and not lines and r.output.count("FSDP pipeline OK") == 4, r.output
    records = {rank: json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(4)}
    for rec in records.values():
        kinds = [o["what"].split(" ")[0] for o in rec["ops"]]
        assert {"all_gather_single", "reduce_scatter_single", "batch_isend_irecv"} <= set(kinds), kinds
        sends = [i for i, o in enumerate(rec["ops"]) if o["kind"] == "batch" and o["msgs"][0][0] == "send"]
        assert kinds.index("all_gather_single") < sends[0], kinds  # a stage's blocks gathered before it sends
    assert nccl_rules.nccl_problem(records) is None
    ops, waits = records[0]["ops"], records[0]["waits"]
    a = next(i for i, o in enumerate(ops) if o["what"].startswith("all_gather_single"))
    b = next(i for i, o in enumerate(ops) if o["what"].startswith("reduce_scatter_single"))
    ops[a], ops[b] = ops[b], ops[a]
    records[0]["waits"] = [[{a: b, b: a}.get(j, j), pos] for j, pos in waits]
    line = nccl_rules.deadlock_problem(records)
    assert line and re.search(r"rank 0 issued reduce_scatter_single on group \d+ \[0, 1\] #1 before", line), line
