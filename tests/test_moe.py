"""Chapter 13: the mixture-of-experts model, expert parallelism, the balancing loss through a
pipeline, DualPipeV's overlapped pairs and the simulator taught them.

The chapter itself launches expert parallelism at 2 processes and PP x EP (1F1B and DualPipeV,
with and without the overlap, and the two balancing-loss pitfalls) at 4, and checks them against
one process. These tests cover the pure functions and launch, in float64 against one process
(gradients, weights, losses and the tokens dropped): PP x EP at 4 processes (1F1B, DualPipeV,
DualPipeV with the overlap), the overlap without any all-to-all (PP = 2, EP = 1) and with the
whole V on one rank (PP = 1, EP = 2), expert parallelism over 4 ranks, and --check at m = 3, 5
and 6 on 2 and 3 ranks (three (p, m) pairs per layout)."""

from __future__ import annotations

import dataclasses
import re
import warnings

import pytest
import torch
import torch.nn.functional as F

from ppbook import launch, moe, overlap, stages, timeline, torch_orders
from ppbook.planner import simulate
from ppbook.planner.schedules import Action

warnings.filterwarnings("ignore", message=".*torch.compile.*")
CFG = moe.MoEConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=16, n_experts=4, top_k=2,
                    expert_hidden_dim=16, capacity_factor=1.0)


def batch(n=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, CFG.vocab_size, (n, CFG.max_seq_len), generator=g)


# --- the model ---------------------------------------------------------------------------------
def test_capacity():
    assert moe.capacity(32, 2, 4, 1.0) == 16 and moe.capacity(32, 2, 4, 1.25) == 20
    assert moe.capacity(32, 2, 4, 0.0) == 32 and moe.capacity(32, 2, 4, 10.0) == 32  # at most T
    assert moe.capacity(3, 1, 64, 0.5) == 1  # at least one slot


def test_routing_fills_slots_in_choice_order_and_never_beyond_capacity():
    logits = torch.randn(3, 16, 4, generator=torch.Generator().manual_seed(1))
    r = moe.route(logits, top_k=2, cap=5)
    assert torch.allclose(r.gate.view(3, 2, 16).sum(1), torch.ones(3, 16))  # each token's gates sum to 1
    chosen = r.expert.view(3, 2, 16)
    assert (chosen[:, 0] != chosen[:, 1]).all()  # two different experts per token
    for b in range(3):
        for e in range(4):
            slots = r.slot[b][r.expert[b] == e]
            assert slots.tolist() == list(range(len(slots)))  # queue places, in choice-major order
            assert r.kept[b][r.expert[b] == e].sum() == min(5, len(slots))


def test_balancing_loss_is_one_for_a_uniform_router_and_e_when_all_on_one():
    uniform = moe.Routing(expert=torch.tensor([[0, 1, 2, 3]]), slot=torch.zeros(1, 4, dtype=torch.long),
                          gate=torch.ones(1, 4), kept=torch.ones(1, 4, dtype=torch.bool),
                          probs=torch.full((1, 4, 4), 0.25))
    assert moe.balancing_loss(uniform, 4).item() == pytest.approx(1.0)
    one = dataclasses.replace(uniform, expert=torch.zeros(1, 4, dtype=torch.long),
                              probs=F.one_hot(torch.zeros(1, 4, dtype=torch.long), 4).float())
    assert moe.balancing_loss(one, 4).item() == pytest.approx(4.0)


def test_per_sequence_capacity_and_loss_do_not_depend_on_how_the_batch_is_cut():
    """What makes microbatches and expert-parallel shards compute what one process computes."""
    model, tokens = moe.build_moe_model(CFG, seed=0), batch()
    whole = model(tokens)
    counts, aux = moe.counts(model), moe.aux_loss(model).item()
    moe.reset_counts(model)
    parts = [model(t) for t in tokens.tensor_split(4)]
    assert torch.equal(torch.cat(parts), whole)
    assert moe.counts(model) == counts
    assert sum(layer.aux_sum for layer in moe.moe_layers(model).values()) / 4 == pytest.approx(aux)
    assert any(sum(c["routed"]) > sum(c["kept"]) for c in counts.values())  # capacity 1.0 drops some


def test_the_block_is_the_book_llama_block_with_experts():
    from ppbook.models import LlamaBlock, SwiGLU

    model = moe.build_moe_model(CFG, seed=0)
    block = model.layers["0"]
    assert isinstance(block, LlamaBlock) and type(block).forward is LlamaBlock.forward
    assert all(isinstance(e, SwiGLU) for e in block.feed_forward.experts.values())
    again = moe.build_moe_model(CFG, seed=0)  # weights keyed by name: the same on every rank
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))


def test_attached_balancing_loss_gives_the_summed_losss_gradients():
    tokens, targets = batch(4, 1), batch(4, 2)
    summed, attached = moe.build_moe_model(CFG, seed=0), moe.build_moe_model(CFG, seed=0)
    out = summed(tokens)
    (F.cross_entropy(out.flatten(0, 1), targets.flatten()) + CFG.aux_loss_coef * moe.aux_loss(summed)).backward()
    moe.set_aux_weight(attached, CFG.aux_loss_coef)
    F.cross_entropy(attached(tokens).flatten(0, 1), targets.flatten()).backward()
    for (name, a), b in zip(summed.named_parameters(), attached.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=1e-9, msg=name)


def test_keep_experts_keeps_names_and_refuses_an_uneven_split():
    model = moe.build_moe_model(CFG, seed=0)
    moe.keep_experts(model, moe.ExpertParallel(rank=1, size=2))
    assert sorted(model.layers["0"].feed_forward.experts) == ["2", "3"]
    assert model.layers["0"].feed_forward.ep.rank == 1
    with pytest.raises(ValueError, match="cannot be split evenly over 3"):
        moe.keep_experts(moe.build_moe_model(CFG, seed=0), moe.ExpertParallel(rank=0, size=3))


def test_all_to_all_bytes_is_the_buffer_the_layer_sends():
    sent = []
    layer = moe.build_moe_model(dataclasses.replace(CFG, capacity_factor=1.25), seed=0).layers["0"].feed_forward
    layer.run_experts = lambda slots: sent.append(slots.numel() * slots.element_size()) or slots
    layer(torch.randn(3, CFG.max_seq_len, CFG.dim))
    assert sent == [moe.all_to_all_bytes(3 * CFG.max_seq_len, CFG.dim, 2, 1.25, 4, CFG.max_seq_len)]


# --- the simulator taught pairs ----------------------------------------------------------------
def test_pair_order_flattened_is_torch_order():
    for p, m in ((1, 4), (2, 4), (2, 8), (4, 8)):
        paired = overlap.pair_order("DualPipeV", p, m)
        assert overlap.flatten(paired) == torch_orders.torch_order("DualPipeV", p, m)
        assert overlap.pairs(paired) > 0
    assert overlap.pairs(overlap.pair_order("1F1B", 2, 4)) == 0


def test_pair_cost():
    assert overlap.pair_cost((1, 2), (3, 4), overlap=False) == 10
    assert overlap.pair_cost((1, 0.5), (1, 0.5), overlap=True) == 2  # the comm hides: computations add
    assert overlap.pair_cost((1, 3), (1, 1), overlap=True) == 4  # the forward's own chain sets the pace


def test_without_pairs_it_is_the_books_simulator():
    order = torch_orders.torch_order("1F1B", 3, 6)
    costs = {"F": 1.0, "B": 2.0}
    ours = overlap.simulate_pairs({r: [(a,) for a in acts] for r, acts in order.items()},
                                  lambda a: costs[a.kind], latency=lambda s, r: 0.25)
    assert ours == simulate.simulate(order, costs, latency=0.25)


def test_a_pair_is_one_block_whose_outputs_leave_at_its_end():
    order = {0: [(Action(0, "F", 0),), (Action(1, "F", 0),), (Action(0, "F", 1), Action(1, "B", 0)),
                 (Action(1, "F", 1),), (Action(1, "B", 1),), (Action(0, "B", 0),), (Action(0, "B", 1),)]}
    cost = {"F": 1.0, "B": 2.0}
    serial = overlap.simulate_pairs(order, lambda a: cost[a.kind])
    block = overlap.simulate_pairs(order, lambda a: cost[a.kind], pair=lambda f, b: 2.5)
    end = lambda events: timeline.span(events)[1]  # noqa: E731
    assert end(serial) == 1 + 1 + (1 + 2) + 1 + 2 + 2 + 2
    assert end(block) == end(serial) - 0.5
    both = [e for e in block if (e.stage, e.kind, e.microbatch) in ((0, "F", 1), (1, "B", 0))]
    assert {(e.start, e.end) for e in both} == {(2.0, 4.5)}
    with pytest.raises(ValueError, match="deadlocks"):  # 0B0 waits on 1B0, which waits on 0F0
        overlap.simulate_pairs({0: [(Action(0, "B", 0),), (Action(0, "F", 0),)],
                                1: [(Action(1, "F", 0),), (Action(1, "B", 0),)]}, lambda a: 1.0)


@pytest.mark.parametrize("name,p,overlapped", [("1F1B", 2, False), ("DualPipeV", 2, False),
                                               ("DualPipeV", 2, True), ("DualPipeV", 1, True)])
def test_a_replay_of_a_simulated_step_is_that_step(name, p, overlapped):
    """Fed a timeline the simulator made (known costs, no gaps), the replay gives its step time back,
    for one pipeline and for two side by side."""
    order = overlap.pair_order(name, p, 4)
    cost = {"F": 1.0, "B": 2.0, "I": 1.5, "W": 0.5}
    events = overlap.simulate_pairs(order, lambda a: cost[a.kind], latency=lambda s, r: 0.1,
                                    pair=(lambda f, b: 2.25) if overlapped else None)
    two = events + [dataclasses.replace(e, rank=e.rank + p) for e in events]
    for step in (events, two):
        measured, predicted = overlap.predicted_step_time([step], order, overlapped, draws=3)
        assert predicted == pytest.approx(measured)
    replayed = {(e.rank, e.label): (e.start, e.end) for e in overlap.replay(two, order, overlapped)}
    assert replayed == {(e.rank, e.label): pytest.approx((e.start, e.end)) for e in two}


def test_cpu_pair_cost_hides_the_free_share_of_what_a_perfect_overlap_hides():
    f, b = (1.0, 2.0), (3.0, 1.0)  # (compute, all-to-all): 7 one after the other, 4 perfectly overlapped
    assert overlap.cpu_pair_cost(f, b, 0.0) == overlap.pair_cost(f, b, overlap=False) == 7
    assert overlap.cpu_pair_cost(f, b, 1.0) == overlap.pair_cost(f, b, overlap=True) == 4
    assert overlap.cpu_pair_cost(f, b, 0.25) == pytest.approx(7 - 0.25 * 3)
    assert overlap.cpu_pair_cost(f, b, -0.5) == 7 and overlap.cpu_pair_cost(f, b, 2.0) == 4  # a share: clamped


def test_pair_split_reads_only_the_paired_halves_over_all_steps():
    order = {0: [(Action(0, "F", 0),), (Action(0, "F", 1), Action(1, "B", 0))]}
    step = lambda k: ([timeline.Event(0, 0, "F", 0, 0.0, 9.0),  # noqa: E731  (a single: not read)
                       timeline.Event(0, 0, "F", 1, 9.0, 9.0 + 2 * k), timeline.Event(0, 1, "B", 0, 20.0, 24.0)],
                      [{"rank": 0, "kind": "dispatch", "start": 9.0, "end": 9.0 + k}])
    assert overlap.pair_split([step(1), step(3)], order) == {(0, "F"): (2.0, 2.0), (1, "B"): (4.0, 0.0)}


def test_busy_share_is_processor_time_over_the_cores_time():
    records = [{"cpu_seconds": [0.5, 0.5], "seconds": 1.0, "cores": 2}, {"cpu_seconds": [1.0, 0.5], "seconds": 1.0, "cores": 2}]
    assert overlap.busy_share(records) == pytest.approx((0.5 + 0.75) / 2)


def test_idle_share_is_what_nobody_used_and_falls_back_to_what_the_job_left():
    """The CPU model's free share: the machine's idle share where the records carry it; without
    it (no /proc/stat), one minus the job's own busy share."""
    records = [{"cpu_seconds": [0.5, 0.5], "seconds": 1.0, "cores": 2, "idle_share": 0.1},
               {"cpu_seconds": [1.0, 0.5], "seconds": 1.0, "cores": 2, "idle_share": 0.3}]
    assert overlap.idle_share(records) == pytest.approx(0.2)  # not 1 - busy (0.375): others used the rest
    records[1]["idle_share"] = None
    assert overlap.idle_share(records) == pytest.approx(1 - overlap.busy_share(records))


def test_cpu_ticks_count_idle_ticks_of_this_process_cores():
    script = launch.load_script("13_moe.py")
    before = script.cpu_ticks()
    if before is None:
        pytest.skip("no /proc/stat on this system: the records fall back to the job's busy share")
    sum(i * i for i in range(200_000))  # some work between the readings
    after = script.cpu_ticks()
    assert 0 <= after[0] - before[0] <= after[1] - before[1] and after[1] >= before[1]


def test_a_predicted_pair_replaces_the_measured_block():
    """Fed an overlapped step the simulator made with pairs of 2.25, the prediction with that pair
    cost gives the step back, and a longer pair gives a longer step."""
    order = overlap.pair_order("DualPipeV", 2, 4)
    cost = {"F": 1.0, "B": 2.0, "I": 1.5, "W": 0.5}
    events = overlap.simulate_pairs(order, lambda a: cost[a.kind], latency=lambda s, r: 0.1, pair=lambda f, b: 2.25)
    measured, same = overlap.predicted_step_time([events], order, True, draws=2, pair=lambda f, b: 2.25)
    assert same == pytest.approx(measured)
    _, longer = overlap.predicted_step_time([events], order, True, draws=2, pair=lambda f, b: 3.0)
    assert longer > measured + 0.5
    replayed = overlap.replay(events, order, True, pair=lambda f, b: 3.0)
    assert timeline.span(replayed)[1] == pytest.approx(longer)


def test_split_costs_and_pair_stats_read_the_all_to_alls_of_each_half():
    f, b = timeline.Event(0, 0, "F", 1, 0.0, 4.0), timeline.Event(0, 1, "B", 0, 0.0, 6.0)
    comm = [{"rank": 0, "kind": "dispatch", "start": 1.0, "end": 2.0},
            {"rank": 0, "kind": "dispatch-grad", "start": 1.5, "end": 4.5},
            {"rank": 1, "kind": "dispatch", "start": 1.0, "end": 2.0}]  # another rank's
    assert overlap.split_costs([f, b], comm) == {(0, "F"): (3.0, 1.0), (1, "B"): (3.0, 3.0)}
    stats = overlap.pair_stats([([f, b], comm)], {0: [(Action(0, "F", 1), Action(1, "B", 0))]})
    assert stats == {"block": 6.0, "compute": 3.0, "all_to_all": 2.0, "per_call": 3.0, "pairs": 1}


# --- the companion script under torchrun -------------------------------------------------------
SMALL = ["--dim", "32", "--expert-dim", "16", "--seq-len", "8", "--heads", "4", "--steps", "1", "--warmup", "0",
         "--dtype", "float64", "--check"]


def check_matches(data, runs):
    assert data["ok"] and [r["run"] for r in data["runs"]] == runs
    for r in data["runs"]:
        assert r["match"] and max(r["max_diff"][k] for k in ("router", "other", "weight")) < 1e-12, r["run"]
        assert abs(r["ce"] - data["reference"]["ce"]) < 1e-12, r["run"]
        assert r["same_drops"] and r["counts"] == data["reference"]["counts"], r["run"]  # the same tokens dropped


def ran_as_pairs(data, run: str, p: int, m: int, steps: int = 1) -> None:
    """``run`` ran every OVERLAP_F_B pair of DualPipeV's order through the script's function, its
    backward on a second thread, on every rank. (Whether the two halves' times overlap is up to
    the operating system: the chapter measures it on a record, a test does not assert it.)"""
    order = overlap.pair_order("DualPipeV", p, m)
    result = next(r for r in data["runs"] if r["run"] == run)
    expected = {rank: steps * sum(len(item) == 2 for item in order[rank % p]) for rank in range(data["world_size"])}
    assert {int(k): v for k, v in result["pairs_on_two_threads"].items()} == expected and all(expected.values())
    others = [r for r in data["runs"] if r["run"] != run]
    assert all(not any(r["pairs_on_two_threads"].values()) for r in others)  # torch runs those pairs in turn


@pytest.mark.torchrun
def test_overlap_with_the_v_on_one_rank_and_experts_over_two():
    r = launch.torchrun("13_moe.py", ["--pp", "1", "--ep", "2", "--runs", "DualPipeV-overlap", "aux-ignored",
                                      "--microbatches", "4", "--batch-size", "8", *SMALL], nproc=2, timeout=300)
    runs = {x["run"]: x for x in r.data["runs"]}
    assert runs["DualPipeV-overlap"]["match"] and not runs["aux-ignored"]["match"] and r.data["ok"]
    ran_as_pairs(r.data, "DualPipeV-overlap", 1, 4)


@pytest.mark.torchrun
def test_pipelines_times_experts_on_four_processes_equal_one_process():
    """PP = 2 x EP = 2: two pipelines whose stages share their experts; 1F1B, DualPipeV, and
    DualPipeV with the overlap, in float64 against one process (the chapter runs the same in
    float32 with the timings); and the balancing loss's two pitfalls across stages, off by far
    more than rounding."""
    runs = ["1F1B", "DualPipeV", "DualPipeV-overlap", "aux-ignored", "aux-over-m"]
    r = launch.torchrun("13_moe.py", ["--pp", "2", "--ep", "2", "--runs", *runs,
                                      "--microbatches", "4", "--batch-size", "8", *SMALL], nproc=4, timeout=300)
    assert [x["run"] for x in r.data["runs"]] == runs
    pitfalls = r.data["runs"][3:]
    r.data["runs"] = r.data["runs"][:3]
    check_matches(r.data, runs[:3])
    for run in pitfalls:  # the router trains wrongly, with no error
        assert not run["match"] and run["max_diff"]["router"] > 1e-6, run["run"]
    assert r.data["pp"] == 2 and r.data["ep"] == 2
    assert all(len(rec["comm"]) > 0 for run in r.data["runs"] for rec in run["records"])  # experts exchanged tokens
    idle = [rec["idle_share"] for run in r.data["runs"] for rec in run["records"]]
    assert idle and all(v is None or 0 <= v <= 1 for v in idle)  # a share of the cores' time (None: no /proc/stat)
    assert any(sum(c["routed"]) > sum(c["kept"]) for c in r.data["reference"]["counts"].values())  # some dropped
    ran_as_pairs(r.data, "DualPipeV-overlap", 2, 4)


# Every --check at m = 3, 5 and 6 (issue 26), on 2 and 3 ranks, in each layout: pipeline only
# (--ep 1) and experts only (--pp 1; 3 ranks need a multiple of 3 experts). A schedule runs where
# it is legal: 1F1B needs m >= p; DualPipeV has 2p stages and needs m >= 2p, so m = 3 is refused on
# a 2-rank pipeline and only m = 6 runs on a 3-rank one (with 6 layers, one per stage).
# Each layout at three (p, m) pairs, not the six of the product: the arithmetic at m does not
# depend on p. (3, 3): m = p; (2, 5): an odd m that divides into neither p, where DualPipeV runs at
# an odd m on a 2-rank pipeline; (3, 6): m = 2p, DualPipeV on a 3-rank pipeline. Each m once per
# layout, each p in both.
EVERY_M = (3, 5, 6)
PAIRS = ((3, 3), (2, 5), (3, 6))  # (p, m)
LAYOUTS = [(2, 2, 1), (2, 1, 2), (3, 3, 1), (3, 1, 3)]  # (processes, pp, ep)
CASES = [(nproc, pp, ep, m) for nproc, pp, ep in LAYOUTS for p, m in PAIRS if p == nproc]


def legal_runs(pp: int, m: int) -> list[str]:
    """The runs of 13_moe.py whose schedule accepts m microbatches on a pp-rank pipeline of 6 layers."""
    return [run for run in ("1F1B", "DualPipeV", "DualPipeV-overlap")
            if stages.schedule_problem(run.removesuffix("-overlap"), pp, m, layers=6) is None]


def test_every_layout_and_m_runs_something():
    assert [legal_runs(2, m) for m in EVERY_M] == [["1F1B"]] + [["1F1B", "DualPipeV", "DualPipeV-overlap"]] * 2
    assert [legal_runs(3, m) for m in EVERY_M] == [["1F1B"], ["1F1B"], ["1F1B", "DualPipeV", "DualPipeV-overlap"]]
    assert all(legal_runs(1, m) == ["1F1B", "DualPipeV", "DualPipeV-overlap"] for m in EVERY_M)
    for pipeline in (True, False):  # each layout family runs every m, on 2 and on 3 ranks
        family = [(nproc, m) for nproc, pp, ep, m in CASES if (ep == 1) == pipeline]
        assert {m for _, m in family} == set(EVERY_M) and {n for n, _ in family} == {2, 3}
    assert {run for _, pp, _, m in CASES for run in legal_runs(pp, m)} == {"1F1B", "DualPipeV", "DualPipeV-overlap"}


@pytest.mark.torchrun
@pytest.mark.parametrize("nproc,pp,ep,m", CASES)
def test_check_passes_at_m_3_5_and_6(nproc, pp, ep, m):
    runs = legal_runs(pp, m)
    args = ["--pp", pp, "--ep", ep, "--experts", 6 if ep == 3 else 4, "--layers", 6, "--runs", *runs,
            "--microbatches", m, "--batch-size", m * ep, *SMALL]
    r = launch.torchrun("13_moe.py", args, nproc=nproc, timeout=300, check=False)
    assert r.returncode == 0, f"{r.shell_command}\n{r.output[-3000:]}"
    check_matches(r.data, runs)
    assert r.data["microbatches"] == m


@pytest.mark.torchrun
def test_overlap_without_all_to_all_and_experts_over_four():
    pp = launch.torchrun("13_moe.py", ["--pp", "2", "--ep", "1", "--runs", "1F1B", "DualPipeV-overlap",
                                       "--microbatches", "4", "--batch-size", "8", *SMALL], nproc=2, timeout=300)
    check_matches(pp.data, ["1F1B", "DualPipeV-overlap"])
    assert all(not rec["comm"] for r in pp.data["runs"] for rec in r["records"])  # nothing to exchange
    ep = launch.torchrun("13_moe.py", ["--pp", "1", "--ep", "4", "--runs", "1F1B", "--microbatches", "2",
                                       "--batch-size", "8", *SMALL], nproc=4, timeout=300)
    check_matches(ep.data, ["1F1B"])
    # ranks x microbatches x layers x (dispatch, combine) x (forward, backward)
    assert len(ep.data["runs"][0]["records"][0]["comm"]) == 4 * 2 * 4 * 2 * 2


@pytest.mark.parametrize("args,message,nproc", [
    (["--ep", "3"], "--ep 3 must divide the 2 processes", 2),
    (["--pp", "2", "--ep", "1"], "--pp 2 x --ep 1 = 2 processes, but 4 were started", 4),
    (["--ep", "2", "--experts", "3"], "--experts 3 cannot be split evenly over --ep 2", 2),
    (["--ep", "2", "--microbatches", "5"], "--batch-size 32 is not divisible by --microbatches 5 x --ep 2 = 10: "
     "every microbatch must have the same size on each of the 2 --ep ranks; try --batch-size 40", 2),
    (["--ep", "1", "--runs", "DualPipeV", "--microbatches", "2", "--batch-size", "8"],
     "ScheduleDualPipeV needs at least as many microbatches as stages (2 x 2 = 4)", 2),
    (["--ep", "2", "--top-k", "5"], "--top-k 5 must be between 1 and --experts 4", 2),
])
def test_bad_flags_one_line(args, message, nproc):
    from conftest import assert_one_line_error

    assert_one_line_error("13_moe.py", args, message, nproc=nproc)


def test_the_suggested_batch_size_is_accepted():
    """A refusal's suggestion must itself run: it once named a multiple of --microbatches alone."""
    from ppbook.launch import load_script

    mod = load_script("13_moe.py")
    bad = mod.parse_args(["--ep", "2", "--microbatches", "5", "--runs", "1F1B"])
    with pytest.raises(ValueError, match="try --batch-size 40") as refused:
        mod.validate(bad, 2)
    suggested = int(str(refused.value).rsplit(" ", 1)[-1])
    mod.validate(mod.parse_args(["--ep", "2", "--microbatches", "5", "--runs", "1F1B", "--batch-size", str(suggested)]), 2)


def test_the_recorded_launches_are_what_assess_reads():
    """Chapter 13 asserts its step-time conclusions on data/recorded/moe_overlap.json.gz: every
    launch there equals one process and carries what overlap.assess reads (a quick pass, few draws;
    the build runs the full one)."""
    import gzip
    import json

    with gzip.open(launch.repo_root() / "data" / "recorded" / "moe_overlap.json.gz", "rt") as f:
        record = json.load(f)
    assert record["meta"]["command"].endswith("scripts/13_moe.py --pp 2 --ep 2 --check --probe-gloo")
    assert any(one["loaded"] for one in record["launches"]) and not all(one["loaded"] for one in record["launches"])
    for one in record["launches"]:
        assert [r["run"] for r in one["data"]["runs"]] == list(overlap.SHOWN) and all(r["match"] for r in one["data"]["runs"])
    a = overlap.assess(record["launches"][0]["data"], draws=2)
    assert set(a["error_pct"]) == set(overlap.SHOWN) and 0 < a["perfect"] < a["nothing_hidden"]


@pytest.mark.torchrun
def test_the_overlap_before_its_fix_is_refused_under_nccl_rules():
    """Issue 39: the overlap's two threads issued their all-to-alls on two groups with nothing
    ordering them; NCCL needs one order on every rank (two peers taking opposite orders wait
    forever). Under PPBOOK_NCCL_RULES=1 the old code is refused on every run, in one line naming the
    two operations; the fixed one (moe.Turns) passes every other overlap test here, under the same
    rules by default."""
    r = launch.torchrun("13_moe.py", ["--pp", "1", "--ep", "2", "--runs", "DualPipeV-overlap", "--microbatches", "4",
                                      "--batch-size", "8", *SMALL, "--overlap-before-fix"],
                        nproc=2, timeout=300, check=False, json_result=False, env={"PPBOOK_NCCL_RULES": "1"})
    lines = re.findall(r"ppbook\.nccl_rules: .*", r.output)  # a progress bar may lead the line
    assert r.returncode != 0 and len(lines) == 1, r.output
    assert re.search(r"rank \d: all_to_all_single on group \d+ \[0, 1\] #\d+ \(thread [\w() -]+\) and "
                     r"all_to_all_single on group \d+ \[0, 1\] #\d+ \(thread [\w() -]+\) were issued from two "
                     r"threads with nothing ordering them", lines[0]), lines[0]

