"""The planner: its search (ppbook.planner.search), links, costs and shapes, and its command line
(``python -m ppbook.plan``): pure tests, consistency of the answers, and one line per bad request."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace

import pytest

from conftest import ROOT
from helpers.hf_configs import HF_CONFIGS
from ppbook import plan
from ppbook.planner import costs, hardware, memory, schedules, search, shapes, traffic

H100, NV, IB = hardware.GPUS["h100-sxm"], hardware.LINKS["nvlink-h100"], hardware.LINKS["ib-ndr400"]


def request(model="llama3-8b", gpus=8, batch=128, seq=8192, **kw) -> search.Request:
    return search.Request(shapes.PRESETS[model], kw.pop("gpu", H100), gpus, 8, batch, seq, NV, IB, **kw)


CASES = {"8b": request(), "70b": request("llama3-70b", 64, 1024)}


# --- links and layout ---------------------------------------------------------------------------------------

def test_fit_link_recovers_latency_and_bandwidth():
    link = hardware.Link("x", 2e-5, 3e9)
    sizes = [1e3, 1e5, 1e6, 4e6]
    fitted = hardware.fit_link(sizes, [link.time(s) for s in sizes])
    assert fitted.latency == pytest.approx(2e-5) and fitted.bandwidth == pytest.approx(3e9)
    with pytest.raises(ValueError, match="two or more different"):
        hardware.fit_link([1e3], [1.0])


def test_ring_collectives_and_layout():
    assert NV.allreduce(1e9, 1) == 0 and NV.gather(1e9, 1) == 0
    assert NV.allreduce(1e9, 8) == pytest.approx(14 * NV.latency + 2 * 7 / 8 * 1e9 / NV.bandwidth)
    assert NV.gather(1e9, 8) == pytest.approx(7 * NV.latency + 7 / 8 * 1e9 / NV.bandwidth)
    # tp innermost, dp next, pp outermost: with dp x tp = 8 every pipeline rank has a node of its own
    assert [search.node_of(r, 8, 1, 8) for r in range(4)] == [0, 1, 2, 3]
    assert [search.node_of(r, 2, 1, 8) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_fsdp_gathers_follow_the_wrapping_and_the_order():
    """GPipe: m forwards each gather (resharded after each), then one gather for the backwards that
    keep it; without resharding one gather per step (chapter 9 measures both). 1F1B re-gathers after
    each forward that follows a backward."""
    m = 4
    gpipe = [a.kind for a in schedules.gpipe_order(2, m)[0]]
    assert traffic.fsdp_gathers(gpipe, reshard_after_forward=True) == m + 1
    assert traffic.fsdp_gathers(gpipe, reshard_after_forward=False) == 1
    ofob = [a.kind for a in schedules.one_f_one_b_order(2, m)[0]]  # F F B F B F B B
    assert traffic.fsdp_gathers(ofob, reshard_after_forward=True) == 2 + 1 + 2
    assert traffic.data_parallel_bytes("none", 1.0, 2.0, 4) == pytest.approx(traffic.allreduce_bytes_per_rank(2.0, 4))
    assert traffic.data_parallel_bytes("zero1", 1.0, 2.0, 4) == pytest.approx(0.75 * 3.0)
    assert traffic.data_parallel_bytes("fsdp", 1.0, 2.0, 4, gathers=3) == pytest.approx(0.75 * 5.0)


# --- costs ----------------------------------------------------------------------------------------------------

def test_the_efficiency_constants_are_the_fit_of_the_measurements():
    fitted = costs.calibrate()
    assert set(fitted) == set(costs.EFFICIENCY)
    for k, line in fitted.items():
        kept = costs.EFFICIENCY[k]
        assert kept[:3] == pytest.approx(line[:3], abs=1e-3), k
        assert kept[3:] == line[3:], k  # F0 on its grid, the tokens measured


def test_estimated_passes_stay_within_10_percent_of_every_measured_one():
    """Every F, I and W of every row of both GPUs' files (the H100's and the H200's), estimated from
    FLOPs at the fitted efficiencies, within 10% of what was measured."""
    rows = costs.measured_rows()
    assert {r["gpu"] for r in rows} == {"h100-sxm", "h200"} and len(rows) == 18 + 32
    for r in rows:
        shape, gpu = shapes.PRESETS[r["model"]], hardware.GPUS[r["gpu"]]
        fn = costs.layer_costs if r["part"] == "block" else costs.head_costs
        est = fn(shape, gpu, r["microbatch"], r["seq_len"], measured_ok=False)
        for kind, key in (("F", "F_ms"), ("I", "I_ms"), ("W", "W_ms_est")):
            assert getattr(est, kind) * 1e3 == pytest.approx(r[key], rel=0.10), (r["gpu"], r["model"], r["part"],
                                                                                   r["seq_len"], r["microbatch"], kind)
    # where a measurement matches, on the GPU it was measured on, it is used as it is
    hit = costs.layer_costs(shapes.PRESETS["llama3-8b"], H100, 1, 8192)
    assert hit.measured and not costs.layer_costs(shapes.PRESETS["llama3-8b"], H100, 1, 2048).measured
    h200 = costs.layer_costs(shapes.PRESETS["llama3-8b"], hardware.GPUS["h200"], 4, 2048)
    assert h200.measured and h200.F == pytest.approx(costs.measured_rows("h200")[2]["F_ms"] / 1e3)
    assert not costs.layer_costs(shapes.PRESETS["llama3-8b"], hardware.GPUS["h800"], 1, 8192).measured


def test_small_microbatches_reach_less_of_the_peak():
    """The H200 measured an 8B block's forward at 444 TFLOP/s on one sequence of 2048 tokens and
    about 570 on four: the fit gives the smallest microbatch the lowest efficiency, so the same
    tokens in more, smaller microbatches take longer, and the gap closes as microbatches grow."""
    shape, gpu = shapes.PRESETS["llama3-8b"], hardware.GPUS["h200"]
    one = costs.pass_efficiencies(shape, 1, 2048)["F"] * gpu.bf16_tflops
    four = costs.pass_efficiencies(shape, 4, 2048)["F"] * gpu.bf16_tflops
    assert one == pytest.approx(444, rel=0.05) and four == pytest.approx(570, rel=0.05)
    per_token = [costs.layer_costs(shape, gpu, b, 2048, measured_ok=False).F / b for b in (1, 2, 4, 8)]
    assert per_token == sorted(per_token, reverse=True)
    assert per_token[0] / per_token[1] > 1.1 > per_token[2] / per_token[3]
    # the weight pass's products have the model's width whatever the tokens: it barely moves
    w = [costs.pass_efficiencies(shape, b, 2048)["W"] for b in (1, 4)]
    assert w[0] == pytest.approx(w[1], rel=0.05)


def test_grouped_query_attention_counts_its_products_at_the_query_heads_width():
    """A hand count for one Llama 3 405B layer (128 query heads of 128, 8 key/value heads, SwiGLU
    53248) on one sequence of 8192 tokens: the scores Q K^T and the product with V each take
    2 x 128 x 128 FLOPs per query and key, half the keys under a causal mask; the key and value
    projections are at the 8 heads' width 1024. Counting the product with V at the key/value
    width (the old count) left the attention 47% low."""
    shape = shapes.PRESETS["llama3-405b"]
    s, h, hd = 8192, 16384, 128
    scores = values = 2 * s * (s / 2) * 128 * hd
    wq = wo = h * 128 * hd
    wk = wv = h * 8 * hd
    mlp = 3 * h * 53248
    f = costs.layer_flops(shape, s, s)
    assert f["F"] == pytest.approx(2 * s * (wq + wk + wv + wo + mlp) + scores + values, rel=1e-12)
    assert f["W"] == pytest.approx(2 * s * (wq + wk + wv + wo + mlp), rel=1e-12)
    assert f["I"] - f["W"] == pytest.approx(costs.ATTENTION_BACKWARD * (scores + values), rel=1e-12)
    old = s * s * (128 * hd + 8 * hd)  # the product with V at the key/value heads' width
    assert 1 - old / (scores + values) == pytest.approx(0.47, abs=0.005)


def test_context_parallelism_moves_keys_and_values_again_in_the_backward():
    """A hand count for Llama 3 70B (8 key/value heads of 128) at tp 4, cp 2 in one node, one sequence
    of 8192 tokens in bf16: the whole sequence's K and V are 8192 x 2 x 1024 / 4 values on a GPU,
    and a ring all-gather among 2 sends half of them over NVLink (across nodes, over the network).
    The forward gathers once; the backward gathers K and V again and reduce-scatters dK and dV
    (two transfers; the old model charged one), and full recomputation's rerun forward gathers
    once more."""
    req = search.Request(shapes.PRESETS["llama3-70b"], H100, 16, 8, 16, 8192, NV, IB, cps=(1, 2))
    nbytes = 8192 * 2 * 8 * 128 / 4 * 2
    one = NV.latency + nbytes / 2 / NV.bandwidth
    f, b = search.context_parallel_seconds(req, 1, 4, 2, "none")
    assert (f, b) == pytest.approx((one, 2 * one), rel=1e-12)
    assert search.context_parallel_seconds(req, 1, 4, 2, "full") == pytest.approx((one, 3 * one), rel=1e-12)
    across = IB.latency + nbytes / 2 / 2 / IB.bandwidth  # tp 8 x cp 2 spans two nodes; a GPU holds half the heads
    assert search.context_parallel_seconds(req, 1, 8, 2, "selective") == pytest.approx((across, 2 * across), rel=1e-12)
    assert search.context_parallel_seconds(req, 1, 4, 1, "none") == (0.0, 0.0)


def test_multi_head_latent_attention_is_gathered_at_its_decompressed_width():
    """DeepSeek-V3 (128 heads; qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128, a latent of
    512): context parallelism gathers the keys and values attention uses, decompressed, 128 x (128 + 64)
    values of K and 128 x 128 of V per token, not the 512 + 64 of the compressed latent."""
    shape = shapes.PRESETS["deepseek-v3"]
    assert (shape.heads, shape.qk_nope_dim, shape.qk_rope_dim, shape.v_head_dim, shape.kv_lora_rank) == (128, 128, 64, 128, 512)
    req = search.Request(shape, H100, 16, 8, 16, 4096, NV, IB, cps=(1, 2))
    nbytes = 4096 * (128 * (128 + 64) + 128 * 128) * 2  # tp 1, bf16
    one = NV.latency + nbytes / 2 / NV.bandwidth
    assert search.context_parallel_seconds(req, 1, 1, 2, "none") == pytest.approx((one, 2 * one), rel=1e-12)
    # and its attention FLOPs: scores at 128 x 192 per query head, the product with V at 128 x 128
    f = costs.layer_flops(shape, 4096, 4096, True)
    assert f["F"] - f["W"] == pytest.approx(4096 * 4096 * (128 * 192 + 128 * 128), rel=1e-12)


def test_the_h200_preset_is_the_recorded_device():
    """The H200's memory is the bytes torch reported on the book's H200 (data/gpu/h200-2026-11-28),
    its dense bf16 peak the H100 SXM's, its bandwidth the datasheet's."""
    g = hardware.GPUS["h200"]
    bench = json.loads((ROOT / "data" / "gpu" / "h200-2026-11-28" / "bench.json").read_text())
    assert hardware.MEMORY["h200"][0] == bench["meta"]["gpu_memory_bytes"] == 150_109_880_320
    assert g.bf16_tflops == hardware.GPUS["h100-sxm"].bf16_tflops == bench["benchmark"]["peak_flops"] / 1e12 == 989.4
    assert g.hbm_tb_s == 4.8 and "datasheet" in g.source


# --- the search -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("schedule,v", [("1F1B", 1), ("Interleaved1F1B", 2), ("ZBVZeroBubble", 2), ("GPipe", 1),
                                        ("DualPipeV", 2), ("InterleavedZeroBubble", 2)])
@pytest.mark.parametrize("balance", ["even", "ends"])
def test_extrapolating_from_2p_and_3p_agrees_with_simulating_m(schedule, v, balance, monkeypatch):
    """Large steps are not simulated in full: time and memory are extended from 2p and 3p
    microbatches, time at least at the busiest rank's pace. Within 1.5% of the full simulation at
    m = 16p, where unequal stages (balance=ends) leave the line through 2p and 3p alone 5% short."""
    req = request(gpus=8, batch=128, seq=4096, gpu=replace(H100, memory_gb=1000))
    layout = search.Layout(1, 8, 1, schedule, v, 1, 128, "none", "full", balance)
    monkeypatch.setattr(search, "SIMULATED_ACTIONS", 0)
    assert search._simulated_ms(layout) == [16, 24]
    search._rank_activations.cache_clear()
    fast = search.predict(layout, req)
    monkeypatch.setattr(search, "SIMULATED_ACTIONS", 10**9)
    search._rank_activations.cache_clear()
    exact = search.predict(layout, req)
    search._rank_activations.cache_clear()
    assert fast.step_s == pytest.approx(exact.step_s, rel=0.015)
    assert fast.peak_bytes == pytest.approx(exact.peak_bytes, rel=0.02)
    assert exact.pipeline_s == pytest.approx(max(e.end for e in search.timeline(layout, req)), rel=1e-12)


def test_stage_costs_add_the_head_tensor_parallel_collectives_and_recomputation():
    req = CASES["8b"]
    shape = req.model
    layer, head = costs.layer_costs(shape, H100, 1, 8192), costs.head_costs(shape, H100, 1, 8192)
    layout = search.Layout(1, 4, 2, "1F1B", 1, 1, 16, "none", "none")
    c, _ = search._stage_costs(layout, req, search.layers_of(layout, req))
    assert c[(0, "F")] == pytest.approx(8 * layer.F) and c[(3, "F")] == pytest.approx(8 * layer.F + head.F)
    full, _ = search._stage_costs(replace(layout, recompute="full"), req, search.layers_of(layout, req))
    assert full[(0, "I")] == pytest.approx(8 * (layer.I + layer.F))
    sel, _ = search._stage_costs(replace(layout, recompute="selective"), req, search.layers_of(layout, req))
    assert c[(0, "I")] < sel[(0, "I")] < full[(0, "I")]
    # selective redoes the share of a forward chapter 12 compares with its recorded cost
    assert sel[(0, "I")] - c[(0, "I")] == pytest.approx(8 * layer.F * search.selective_share(shape, False))
    tp, _ = search._stage_costs(replace(layout, tp=2), req, search.layers_of(layout, req))
    assert tp[(0, "F")] > 8 * layer.F / 2  # half the compute plus the collectives


def test_torchs_split_backward_refuses_selective_and_recomputes_once_per_parameter_group():
    """Chapter 12 measured torch 2.13 under the I/W split: selective checkpointing fails, and full
    checkpointing recomputes a block once in I and once per parameter group in W, on every stage
    but the first (whose whole backward runs in W). Runtimes that are not torch's (stage_io
    freed) do neither."""
    req = CASES["8b"]
    layer = costs.layer_costs(req.model, H100, 1, 8192)
    groups = shapes.block_weight_groups(req.model)
    zbv = search.Layout(1, 2, 4, "ZBVZeroBubble", 2, 1, 32, "zero1", "full")
    none, _ = search._stage_costs(replace(zbv, recompute="none"), req)
    full, _ = search._stage_costs(zbv, req)
    per_stage = 8  # 32 layers on 4 stages
    assert full[(0, "W")] == pytest.approx(none[(0, "W")])
    for s in (1, 2, 3):
        assert full[(s, "I")] - none[(s, "I")] == pytest.approx(per_stage * layer.F)
        assert full[(s, "W")] - none[(s, "W")] == pytest.approx(per_stage * groups * layer.F)
    ofob, _ = search._stage_costs(search.Layout(1, 4, 2, "1F1B", 1, 1, 16, "zero1", "full"), req)
    assert ofob[(1, "W")] == pytest.approx(none[(1, "W")])  # no split, one recomputation
    freed = replace(req, stage_io="freed")
    assert search._stage_costs(zbv, freed)[0][(1, "W")] == pytest.approx(none[(1, "W")])
    for name, v in (("ZBVZeroBubble", 2), ("DualPipeV", 2), ("InterleavedZeroBubble", 2)):
        layout = search.Layout(1, 2, 4, name, v, 1, 32, "zero1", "selective")
        assert "selective checkpointing cannot run" in search.constraint_problem(layout, req), name
        assert search.constraint_problem(layout, freed) is None, name
    assert search.constraint_problem(search.Layout(1, 2, 4, "Interleaved1F1B", 2, 1, 32, "zero1", "selective"), req) is None
    ranked, dropped = search.plan(replace(req, schedules=("ZBVZeroBubble",)), keep_all=True)
    assert all(o.layout.recompute != "selective" for o in ranked if o.layout.p > 1)
    assert any("selective checkpointing cannot run" in (o.why_not or "") for o in dropped)


def test_no_layout_below_its_lower_bound():
    req = CASES["8b"]
    for layout in [search.Layout(1, 2, 4, "1F1B", 1, 1, 32, "zero1", "full"),
                   search.Layout(1, 2, 4, "DualPipeV", 2, 2, 16, "fsdp", "full")]:
        assert search.predict(layout, req, check_memory=False).pipeline_s >= search.lower_bound(layout, req) * (1 - 1e-9)


def test_lightened_ends_give_the_first_and_last_stage_fewer_layers():
    assert [len(s) for s in search.stage_layers(126, 16, 1, 1)] == [7] + [8] * 14 + [7]
    assert sum(search.stage_layers(126, 16, 1, 1), []) == list(range(126))
    assert search.stage_layers(4, 4, 2, 2) == [[0], [1], [2], [3]]  # every stage keeps a layer
    assert search.end_weights(request("llama3-405b")) == (1, 1)  # Llama 3's own choice


def test_data_parallel_traffic_is_hidden_where_the_frameworks_hide_it():
    """``_dp_exposed``, mode by mode, against the ring formulas: the gradients' reduction hides
    behind the last backward (DDP, ZeRO) or behind the step's computation (FSDP alone), and shows
    where it outlasts it; ZeRO's all-gather hides behind the first forward; FSDP inside a pipeline
    reduce-scatters after the last backward, so that part always shows. A group larger than a node
    crosses the network."""
    req, params = CASES["8b"], 1e9
    r = memory.RECIPES[req.recipe]
    grads, weights = params * r.grad_bytes, params * r.weight_bytes

    def exposed(sharding, p=1, dp=8, m=4, busy=0.0, last_backward=0.0, first_forward=0.0, gathers=1.0, rq=req):
        layout = search.Layout(1, p, dp, "1F1B" if p > 1 else search.NO_PIPELINE, 1, 1, m, sharding, "none")
        return search._dp_exposed(layout, rq, params, busy, last_backward, first_forward, gathers=gathers)

    reduce = NV.allreduce(grads, 8)
    assert exposed("none", last_backward=10.0) == (reduce, 0.0)                       # fully hidden
    assert exposed("none", last_backward=reduce / 4) == pytest.approx((reduce, 0.75 * reduce))  # partly
    rs, ag = NV.gather(grads, 8), NV.gather(weights, 8)
    assert exposed("zero1", last_backward=rs / 2, first_forward=10.0) == pytest.approx((rs + ag, rs / 2))
    assert exposed("zero1", last_backward=10.0, first_forward=ag / 2) == pytest.approx((rs + ag, ag / 2))
    # FSDP alone: gathered for each microbatch's forward and again for its backward (resharded after
    # forward), reduced each microbatch; hidden behind the whole step's computation
    alone = 4 * (2 * ag + rs)
    assert exposed("fsdp", busy=10.0) == pytest.approx((alone, 0.0))
    assert exposed("fsdp", busy=alone / 2) == pytest.approx((alone, alone / 2))
    # inside PipelineStage: the all-gathers hide, the reduce-scatter after the last backward does not
    assert exposed("fsdp", p=2, dp=4, busy=10.0, gathers=3.0) == pytest.approx(
        (3 * NV.gather(weights, 4) + NV.gather(grads, 4), NV.gather(grads, 4)))
    assert exposed("fsdp", p=2, dp=4, busy=0.0, gathers=3.0)[1] == pytest.approx(
        3 * NV.gather(weights, 4) + NV.gather(grads, 4))
    wide = request(gpus=32, batch=128)  # 16 replicas x 1 = 16 GPUs: two nodes, over InfiniBand
    assert exposed("none", p=2, dp=16, rq=wide) == (IB.allreduce(grads, 16), IB.allreduce(grads, 16))
    assert exposed("none", dp=1) == (0.0, 0.0)


def test_sharding_modes_hold_what_they_shard():
    r = memory.RECIPES["bf16"]
    none = memory.state_bytes(1.0, r, "none", 8)
    zero1, zero2 = memory.state_bytes(1.0, r, "zero1", 8), memory.state_bytes(1.0, r, "zero2", 8)
    assert none.total == 18 and zero1.total == pytest.approx(2 + 4 + 12 / 8) and zero2.total == pytest.approx(2 + 16 / 8)
    shards = memory.state_bytes(1.0, r, "fsdp", 8)
    assert shards.total == pytest.approx(16 / 8)  # between steps: the float32 shards only
    gathered, unsharded = memory.fsdp_gathered(1.0, 0.5, 4, pipelined=True)
    assert (gathered, unsharded) == (4.5, 4.5)  # inside PipelineStage: everything, by the last backward
    gathered, unsharded = memory.fsdp_gathered(1.0, 0.5, 4, pipelined=False)
    assert (gathered, unsharded) == (2.5, 1.5)  # FSDP alone: the root and two blocks, one block's gradients


@pytest.mark.parametrize("case", sorted(CASES))
def test_worked_cases_answers_are_consistent(case):
    req = CASES[case]
    ranked, dropped = search.plan(req)
    assert ranked, "the planner found nothing for a worked case"
    for o in ranked:
        c = o.layout
        assert c.tp * c.p * c.dp == req.gpus and c.dp * c.b * c.m == req.global_batch
        assert o.peak_bytes <= req.usable_bytes and o.why_not is None
        if c.schedule != search.NO_PIPELINE:
            assert schedules.schedule_problem(c.schedule, c.p, c.m, c.v, req.model.layers) is None
        assert o.step_s >= o.pipeline_s > 0 and 0 <= o.bubble < 1 and 0 < o.mfu < 1
    assert [o.step_s for o in ranked] == sorted(o.step_s for o in ranked)
    assert all(o.why_not for o in dropped)
    assert ranked[0].layout.label() in plan.why_winner(ranked)


# --- shapes -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(shapes.PRESETS))
def test_every_preset_has_its_published_parameter_count(name):
    shape = shapes.PRESETS[name]
    assert shapes.total_parameters(shape) == pytest.approx(shape.published_params, rel=0.01), name
    assert shape.source


def test_active_parameters_of_mixtures_of_experts():
    assert shapes.active_parameters(shapes.PRESETS["mixtral-8x7b"]) == pytest.approx(12.9e9, rel=0.01)  # "13B active"
    assert shapes.active_parameters(shapes.PRESETS["deepseek-v3"]) == pytest.approx(37e9, rel=0.02)     # "37B active"


@pytest.mark.parametrize("name", sorted(HF_CONFIGS))
def test_a_hugging_face_config_gives_the_presets_count(name, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(HF_CONFIGS[name]))
    shape = shapes.load(str(path))
    assert shapes.total_parameters(shape) == shapes.total_parameters(shapes.PRESETS[name]), name


def test_the_shipped_config_json_is_its_preset():
    """data/configs/qwen2.5-7b.json, every key of the real file: read as the preset's shape."""
    shape = shapes.load(str(ROOT / "data" / "configs" / "qwen2.5-7b.json"))
    assert shapes.total_parameters(shape) == shapes.total_parameters(shapes.PRESETS["qwen2.5-7b"])
    preset = shapes.PRESETS["qwen2.5-7b"]
    assert replace(shape, name=preset.name, published_params=preset.published_params, source=preset.source) == preset


def test_the_planners_llama_counts_are_the_book_models_built_in_torch():
    from ppbook import model_memory as torch_memory

    for name, cfg in torch_memory.LLAMA_SIZES.items():
        if cfg.n_layers > 40:  # the formula per layer is the same; fewer layers build faster on the meta device
            cfg = replace(cfg, n_layers=2)
        assert torch_memory.llama_parameters(cfg) == shapes.total_parameters(torch_memory.shape_of(cfg)), name


# --- expert parallelism --------------------------------------------------------------------------------------

def test_expert_parallelism_divides_the_routed_experts_and_their_state():
    """ep ranks share each MoE layer's routed experts; the rest (attention, router, norms) stays
    whole, and the experts' optimizer state is sharded among the dp / ep replicas holding them."""
    req = request("mixtral-8x7b", 64, 256, 4096)
    shape = req.model
    one, eight = (search.Layout(1, 1, 64, search.NO_PIPELINE, 1, 1, 4, "zero1", "none", "even", ep)
                  for ep in (1, 8))
    routed = sum(shapes.routed_expert_parameters(shape, i) for i in range(shape.layers))
    assert routed == shape.layers * shape.experts * shapes.mlp_parameters(shape, shape.expert_ffn)
    a, b = search.rank_memory(one, req)[0], search.rank_memory(eight, req)[0]
    recipe = memory.RECIPES[req.recipe]
    assert a.parameters - b.parameters == pytest.approx(routed * (1 - 1 / 8) * recipe.weight_bytes)
    assert a.gradients - b.gradients == pytest.approx(routed * (1 - 1 / 8) * recipe.grad_bytes)  # ZeRO-1 keeps them
    # ZeRO-1 shards the experts' optimizer state over the 64 / 8 replicas that hold the same experts:
    # 1/8 of the experts over 8 is what all of them over 64 was
    assert b.optimizer == pytest.approx(a.optimizer)
    dense_model = request("llama3-8b", 64, 256, 4096)
    assert search.expert_parallel_sizes(dense_model, 64) == [1]
    assert search.expert_parallel_sizes(req, 64) == [1, 2, 4, 8]


def test_the_all_to_all_costs_time_on_moe_layers_unless_a_registered_overlap_hides_it():
    req = request("mixtral-8x7b", 64, 256, 4096)
    base = dict(tp=1, p=4, dp=16, v=2, b=1, m=16, sharding="zero1", recompute="none")
    costs = {}
    for schedule, ep in (("ZBVZeroBubble", 1), ("ZBVZeroBubble", 8), ("DualPipeV", 8), ("DualPipeV", 1)):
        layout = search.Layout(base["tp"], base["p"], base["dp"], schedule, base["v"], base["b"], base["m"],
                               base["sharding"], base["recompute"], "even", ep)
        costs[schedule, ep] = search._stage_costs(layout, req)[0]
    nbytes = traffic.expert_dispatch_bytes(1, 4096, req.model.hidden, req.model.top_k, 2)
    a2a = 2 * search.alltoall_seconds(req, nbytes, 8, 1)
    assert a2a == pytest.approx(2 * (7 * NV.latency + nbytes * 7 / 8 / NV.bandwidth))  # within a node
    layers_per_stage = req.model.layers // 8
    moe = {ep: search.moe_layer_seconds(req, 1, 1, 1, ep, 1) for ep in (1, 8)}
    assert moe[1]["dispatch"] == 0 and moe[8]["dispatch"] == pytest.approx(a2a) and moe[8]["tp"] == 0
    # a stage's forward is its MoE layers' computation and their all-to-alls; expert parallelism changes the
    # computation too (each expert gets the tokens of 8 GPUs: costs.expert_costs), the weight pass only that
    assert costs["ZBVZeroBubble", 8][(1, "F")] == pytest.approx(layers_per_stage * (moe[8]["compute_F"] + a2a))
    assert costs["ZBVZeroBubble", 1][(1, "F")] == pytest.approx(layers_per_stage * moe[1]["compute_F"])
    assert costs["ZBVZeroBubble", 8][(1, "W")] == pytest.approx(layers_per_stage * moe[8]["compute_W"])  # no traffic
    assert costs["DualPipeV", 1] == costs["ZBVZeroBubble", 1]
    # torch runs an OVERLAP_F_B action's halves one after the other unless the trainer registers a
    # function for it (schedules.py's _PipelineScheduleRuntime; torchtitan 0.3.0 registers none)
    assert costs["DualPipeV", 8] == costs["ZBVZeroBubble", 8]
    overlapped = search._stage_costs(search.Layout(base["tp"], base["p"], base["dp"], "DualPipeV", base["v"], base["b"],
                                                   base["m"], base["sharding"], base["recompute"], "even", 8),
                                     replace(req, overlap_f_b=True))[0]
    # an action alone pays its all-to-alls in full; the pair hides them (test_dualpipev_pairs_...)
    assert overlapped[(1, "F")] == costs["ZBVZeroBubble", 8][(1, "F")]
    assert overlapped[(1, "F_a2a")] == overlapped[(1, "B_a2a")] == pytest.approx(layers_per_stage * a2a)
    # across nodes, the share for other nodes crosses the network
    assert search.alltoall_seconds(req, nbytes, 16, 1) > search.alltoall_seconds(req, nbytes, 8, 1)


def test_a_dualpipev_pair_hides_each_halfs_all_to_all_under_the_other_halfs_computation():
    """DeepSeek-V3's DualPipe pair, by hand: the forward computes 3 s beside the backward's 2 s of
    all-to-alls, then the backward computes 5 s beside the forward's 4 s: 3 + 5, not 3 + 4 + 5 + 2."""
    from ppbook.planner.simulate import pair_slots

    assert pair_slots((3.0, 4.0), (5.0, 2.0)) == (3.0, 5.0)
    # an all-to-all longer than the other half's computation shows by what it outlasts it
    assert pair_slots((1.0, 4.0), (5.0, 2.0)) == (2.0, 5.0)  # the backward's 2 s outlast the forward's 1 s
    assert pair_slots((3.0, 7.0), (5.0, 2.0)) == (3.0, 7.0)  # the forward's 7 s outlast the backward's 5 s
    assert sum(pair_slots((1.0, 4.0), (5.0, 2.0))) >= 1.0 + 5.0  # never below the two computations


def _dualpipev_costs(overlap_f_b: bool, m: int = 16):
    req = replace(request("mixtral-8x7b", 64, 256, 4096), overlap_f_b=overlap_f_b)
    layout = search.Layout(1, 4, 16, "DualPipeV", 2, 1, m, "zero1", "none", "even", 8)
    costs = search._stage_costs(layout, req)[0]
    c = search._compiled("DualPipeV", 4, m, 2)
    return req, layout, costs, c, search._action_costs("DualPipeV", 4, m, 2, c, costs)


def test_dualpipev_pairs_hide_their_all_to_alls_and_unpaired_actions_pay_them():
    """With --overlap-f-b, an action DualPipeV runs alone (a warm-up forward, a cool-down
    backward) costs its computation plus its all-to-alls, as without the overlap; a pair costs
    pair_slots of its halves; and the search's lower bound stays below the simulated step."""
    from ppbook.planner.simulate import pair_slots

    req, layout, costs, c, cost = _dualpipev_costs(True)
    plain = _dualpipev_costs(False)[4]
    paired = schedules.overlapped_forwards("DualPipeV", 4, 16)
    in_pair = paired | {c.actions[i + 1] for i, a in enumerate(c.actions) if a in paired}
    alone = [i for i, a in enumerate(c.actions) if a not in in_pair]
    assert alone and all(cost[i] == plain[i] == costs[(c.actions[i].stage, c.actions[i].kind)] for i in alone)
    for i, a in enumerate(c.actions):
        if a in paired:
            f, b = a, c.actions[i + 1]
            af, ab = costs[(f.stage, "F_a2a")], costs[(b.stage, "B_a2a")]
            assert af > 0 and ab > 0
            assert (cost[i], cost[i + 1]) == pair_slots((costs[(f.stage, "F")] - af, af), (costs[(b.stage, "B")] - ab, ab))
            assert cost[i] + cost[i + 1] < plain[i] + plain[i + 1]
    pred = search.predict(layout, req, check_memory=False)
    assert search.lower_bound(layout, req) <= pred.pipeline_s
    assert pred.step_s < search.predict(layout, replace(req, overlap_f_b=False), check_memory=False).step_s


def test_the_share_of_actions_dualpipev_runs_unpaired_is_torchs():
    """The pairs the planner knows are the OVERLAP_F_B actions torch's ScheduleDualPipeV emits, and
    at p = 8, m = 16 (the fewest microbatches it takes) most actions run alone: the warm-up and
    cool-down outweigh a short steady state; the share falls as m grows."""
    from ppbook import overlap

    def unpaired(p, m):
        n = sum(len(acts) for acts in schedules.order("DualPipeV", p, m).values())
        return 1 - 2 * len(schedules.overlapped_forwards("DualPipeV", p, m)) / n

    torch_order = overlap.pair_order("DualPipeV", 8, 16)
    assert schedules.overlapped_forwards("DualPipeV", 8, 16) == {
        item[0] for items in torch_order.values() for item in items if len(item) == 2}
    assert unpaired(8, 16) > 0.5 > unpaired(8, 64)
    assert schedules.overlapped_forwards("ZBVZeroBubble", 8, 16) == frozenset()


def test_the_planner_asks_for_expert_parallelism_where_it_pays():
    """Mixtral 8x7B on 64 GPUs: the published AMD recipe in Megatron-LM's examples (tp 1, no
    pipeline, ep 8, distributed optimizer, microbatches of 2) is among the planner's layouts within 5%."""
    from ppbook.planner import published

    row = next(r for r in published.load()["moe_runs"] if r["id"] == "mixtral-8x7b-64-mi300x")
    c = published.compare(row)
    assert c.agrees, c


# --- the command line ---------------------------------------------------------------------------------------------

GOOD = ["--model", "llama3-8b", "--gpus", "8", "--global-batch", "128", "--seq-len", "8192"]


def in_process(args: list[str], capsys) -> tuple[int, str]:
    try:
        status = plan.main(args)
    except SystemExit as e:
        status = e.code
    out = capsys.readouterr()
    return status, out.out + out.err


def with_change(change: list) -> list[str]:
    """``GOOD`` with each flag of ``change`` set to the value after it (``None``: the flag removed)."""
    args = list(GOOD)
    for i in range(0, len(change), 2):
        if change[i + 1] is None:
            del args[args.index(change[i]):args.index(change[i]) + 2]
        elif change[i] in args:
            args[args.index(change[i]) + 1] = change[i + 1]
        else:
            args += change[i:i + 2]
    return args


@pytest.mark.parametrize("change,message", [
    (["--model", "gpt5"], "is neither a preset"),
    (["--model", "/no/such/config.json"], "no such file"),
    (["--gpus", "0"], "--gpus must be at least 1"),
    (["--gpus", "12"], "not a whole number of nodes"),
    (["--gpu-memory", "nan"], "--gpu-memory must be a finite number"),
    (["--gpu-tflops", "inf"], "--gpu-tflops must be a finite number"),
    (["--gpu-memory", "-1"], "--gpu-memory must be more than 0"),
    (["--global-batch", "3", "--gpus", "512"], "not a multiple of any data-parallel size"),
    (["--seq-len", "0"], "--seq-len must be at least 1"),
    (["--headroom", "1.5"], "--headroom is the fraction"),
    (["--tp", "3"], "no --tp of [3] divides"),
    (["--schedules", "Zero"], "unknown 'Zero'"),
    (["--gpu", "tpu-v5"], "is not a preset"),
    (["--intra", "carrier-pigeon"], "unknown link"),
    (["--model", "custom", "--hidden", "64"], "--model custom needs"),
    (["--layout", "tp=3"], "must divide the 8 GPUs"),
    (["--layout", "pp"], "is not key=value"),
    (["--json", "/no/such/folder/x.json"], "its folder does not exist"),
    (["--model", "opt-175b", "--kernels", "book", "--gpus", "64"], "kernels 'book' counts the book's own Llama block"),
    (["--ep", "2"], "has no experts"),
    (["--model", "mixtral-8x7b", "--ep", "3"], "none of [3] divides the 8 experts"),
    (["--layout", "ep=2"], "ep 2 must divide dp"),
    (["--pp", "7"], "no pipeline size of [7] divides"),
    (["--pp", "0"], "--pp must be at least 1"),
    # argparse's own refusals, in one line with the fix instead of the usage
    (["--gpus", "abc"], "--gpus takes a whole number"),
    (["--global-batch", "1.5"], "--global-batch takes a whole number"),
    (["--gpus", None], "required: --gpus; add --gpus N"),
    (["--recipe", "fp4"], "invalid choice: 'fp4'"),
    (["--frobnicate", "3"], "unrecognized arguments: --frobnicate 3; remove it"),
])
def test_bad_requests_get_one_line_and_a_nonzero_exit(change, message, capsys):
    """In this process (``plan.main``); ``test_cli_runs_as_a_reader_runs_it`` runs the module."""
    status, out = in_process(with_change(change), capsys)
    errors = [line for line in out.splitlines() if line.strip()]
    assert status == 2 and len(errors) == 1 and message in errors[0], out


@pytest.mark.parametrize("layout,message", [
    ("pp=4 schedule=1F1B b=64", "got m=1; use m=4 or more (m = global batch / (dp x b))"),
    ("pp=2 b=3", "does not split into dp 4 x b 3"),
    ("pp=2 schedule=Interleaved1F1B v=1", "got v=1; use v=2 or more"),
])
def test_a_layout_that_cannot_run_is_reported_with_the_rest_of_the_answer(layout, message, capsys):
    """A well-formed --layout the batch cannot split (or its schedule refuses) costs one line in
    this command's words, after the ranked answer, and exit status 2."""
    status, out = in_process(with_change(["--layout", layout]), capsys)
    errors = [line for line in out.splitlines() if "error:" in line]
    assert status == 2 and len(errors) == 1 and message in errors[0], out
    assert "is predicted fastest" in out and "--microbatches" not in out and "--stages-per-rank" not in out


def test_a_custom_gpu_says_which_links_it_assumes(capsys):
    status, out = in_process(with_change(["--gpu", "custom", "--gpu-memory", "80", "--gpu-tflops", "900",
                                          "--gpu-bandwidth", "3"]), capsys)
    assert status == 0 and "--gpu custom: assuming nvlink-h100 within a node" in out
    assert "assuming ib-ndr400 between nodes" in out
    status, out = in_process(with_change(["--gpu", "custom", "--gpu-memory", "80", "--gpu-tflops", "900",
                                          "--gpu-bandwidth", "3", "--intra", "nvlink-a100", "--inter", "ib-hdr200"]),
                             capsys)
    assert status == 0 and "assuming" not in out


def test_expert_parallelism_from_the_command_line(capsys):
    args = ["--model", "mixtral-8x7b", "--gpus", "16", "--global-batch", "64", "--seq-len", "4096", "--ep", "8",
            "--export", "megatron", "--layout", "pp=2 dp=8 ep=8 schedule=DualPipeV sharding=zero1"]
    status, out = in_process(args, capsys)
    assert status == 0 and "--expert-model-parallel-size 8" in out, out
    assert "layout tp=1 DualPipeV p=2 v=2 dp=8 ep=8 zero1" in out
    status, out = in_process(args[:-4] + ["--export", "torchtitan"], capsys)
    assert "--parallelism.expert_parallel_degree 8" in out and " ep " in next(
        x for x in out.splitlines() if " sharding " in x), out


def test_a_hugging_face_config_that_is_not_json_is_one_line(tmp_path, capsys):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    status, out = in_process(with_change(["--model", str(bad)]), capsys)
    assert status == 2 and "not a JSON file" in out and len(out.strip().splitlines()) == 1
    bad.write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    status, out = in_process(with_change(["--model", str(bad)]), capsys)
    assert status == 2 and "no 'num_hidden_layers'" in out and len(out.strip().splitlines()) == 1


@pytest.mark.parametrize("argv", [
    ["--model", "llama3-405b", "--gpus", "8", "--global-batch", "64", "--seq-len", "8192"],
    # every layout dropped on its memory's lower bound, none counted by the search
    ["--model", "llama3-8b", "--gpus", "1", "--global-batch", "1", "--seq-len", "4096", "--gpu", "a100-40gb"],
    ["--model", "llama3-70b", "--gpus", "7", "--global-batch", "1024", "--seq-len", "8192"],
])
def test_a_request_nothing_fits_exits_1_and_shows_the_closest(argv, capsys):
    status, out = in_process([*argv, "--why"], capsys)
    assert status == 1 and "nothing fits" in out and "layouts dropped" in out and "within 5% of the winner" not in out
    assert "the closest layout" in out and "does not fit" in out
    closest = out.split("the closest layout, ", 1)[1]
    assert "needs " in closest and " GB on its fullest GPU" in closest and "total" in closest  # with its breakdown


def test_a_named_layout_is_explained_and_the_winner_exported(capsys):
    status, out = in_process(with_change(["--layout", "tp=8 pp=1 sharding=zero1 recompute=full", "--export",
                                          "megatron"]), capsys)
    assert status == 0 and "layout tp=8 no pipeline dp=1 zero1" in out and "than the winner" in out
    assert "--tensor-model-parallel-size" in out and "--global-batch-size 128" in out
    status, out = in_process(with_change(["--export", "torchtitan"]), capsys)
    assert status == 0 and "-m torchtitan.train --module llama3 --config llama3_8b" in out
    assert "--parallelism.pipeline_parallel_degree" in out


def test_cli_runs_as_a_reader_runs_it(tmp_path):
    out = tmp_path / "plan.json"
    r = subprocess.run([sys.executable, "-m", "ppbook.plan", *GOOD, "--json", str(out)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["ranked"][0]["step_s"] <= data["ranked"][-1]["step_s"] and data["winner_reason"] in r.stdout
    assert all(math.isfinite(row["peak_gb"]) for row in data["ranked"])


@pytest.mark.parametrize("p", [2, 4, 8])
def test_every_schedule_fills_the_pipeline_before_rank_0_runs_a_backward(p):
    """The planner's memory floor (search.memory_floor): rank 0 holds at least min(m, p)
    stage-microbatches at its peak, under every schedule, so a layout whose state plus that many
    microbatches does not fit is dropped without building its order."""
    from ppbook.planner.simulate import peak_in_flight

    for name in schedules.TORCH_SCHEDULES:
        for m in (1, p - 1, p, 2 * p, 3 * p):
            for v in ((2, 3) if schedules.placement(name) == "loop" else (2,)):
                if m >= 1 and schedules.schedule_problem(name, p, m, v) is None:
                    held = peak_in_flight(schedules.order(name, p, m, v), by="rank")[0]
                    assert held >= min(m, p), (name, p, m, v)
    req = CASES["70b"]
    for layout in [search.Layout(8, 8, 1, "1F1B", 1, 1, 1024, "none", "none"),
                   search.Layout(8, 2, 4, "ZBVZeroBubble", 2, 1, 256, "fsdp", "full")]:
        assert search.memory_floor(layout, req) <= max(r.total for r in search.rank_memory(layout, req))


# --- FSDP as torch runs it inside a pipeline, and torch's stage buffers ----------------------------------

def test_torchs_unshard_window_frees_stages_beyond_three_and_gathers_them_again():
    """With four stages per rank torch's runtime keeps at most three gathered (ppbook.planner.fsdp_window):
    the planner holds the three largest, gathers more per step than once, and keeps every stage's
    gradients unsharded; with two or three stages per rank nothing changes."""
    req = request("llama3-8b", 16, 64, 4096)
    t = search._tables(req, 2 * 4, "even", 1, "full", 1)
    for v, window in ((2, False), (3, False), (4, True)):
        layout = search.Layout(1, 2, 8, "Interleaved1F1B", v, 1, 8, "fsdp", "full")
        t = search._tables(req, layout.num_stages, "even", 1, "full", 1)
        stages = search._owned(layout, 0)
        shares = sorted((search._fsdp_share(t, s, 1) for s in stages), reverse=True)
        state = search._rank_state(layout, req, stages)[2]
        r = memory.RECIPES[req.recipe]
        gathered = (state.parameters - sum(shares) * r.master_bytes / 8) / r.weight_bytes
        assert gathered == pytest.approx(sum(shares[:3] if window else shares))
        assert state.gradients == pytest.approx(sum(shares) * r.grad_bytes * (1 + 1 / 8))
        factor = search.fsdp_gathers_factor(layout, req, t, 0)
        assert factor > 1 if window else factor == pytest.approx(1.0)


def test_resharding_after_forward_costs_gathers_not_memory_inside_a_pipeline():
    """torchtitan's policy: inside a pipeline blocks stay gathered by default; 'always' gathers again
    after every forward that follows a backward (more traffic), while the stage is still whole by
    its last backward (the same peak). Without a pipeline, 'never' keeps every block gathered from
    its forward to its backward (more memory, one gather fewer per microbatch)."""
    req = request("llama3-8b", 16, 64, 4096)
    piped = search.Layout(1, 2, 8, "1F1B", 1, 1, 8, "fsdp", "full")
    always = replace(req, fsdp_reshard="always")
    assert search.rank_memory(piped, always) == search.rank_memory(piped, req)
    t = search._tables(req, 2, "even", 1, "full", 1)
    assert search.fsdp_gathers_factor(piped, req, t, 0) == 1.0 < search.fsdp_gathers_factor(piped, always, t, 0)
    alone = search.Layout(1, 1, 16, search.NO_PIPELINE, 1, 1, 4, "fsdp", "full")
    never = replace(req, fsdp_reshard="never")
    assert search.rank_memory(alone, never)[0].parameters > search.rank_memory(alone, req)[0].parameters
    slow, fast = search.predict(alone, req, check_memory=False), search.predict(alone, never, check_memory=False)
    assert fast.detail["dp_traffic_s"] < slow.detail["dp_traffic_s"]
    with pytest.raises(ValueError, match="use one of default, always, never"):
        memory.reshards_after_forward("sometimes", True)


def test_only_torchs_stages_keep_receive_buffers():
    req = request("llama3-8b", 16, 64, 4096)
    layout = search.Layout(1, 4, 4, "1F1B", 1, 1, 16, "zero1", "full")
    torch_runtime, freed = search.rank_memory(layout, req), search.rank_memory(layout, replace(req, stage_io="freed"))
    boundary = search.stage_boundary_bytes(req, 1, 1)
    assert [r.buffers for r in torch_runtime] == [16 * boundary, 32 * boundary, 32 * boundary, 16 * boundary]
    assert all(r.buffers == 0 for r in freed)
    assert torch_runtime[0].activations - freed[0].activations == 4 * boundary  # its output, per microbatch held


# --- exports a practitioner pastes -------------------------------------------------------------------------------

# the exports read back by the engines' own config code: tests/test_plan_export.py


def test_a_winner_the_framework_cannot_run_is_named_and_its_best_runnable_layout_exported(capsys):
    status, out = in_process(with_change(["--sharding", "zero1", "--export", "torchtitan"]), capsys)
    assert status == 0 and "the winner cannot be exported: torchtitan has no zero1 sharding" in out, out
    assert "that layout as torchtitan configuration" in out
    with pytest.raises(ValueError, match="megatron runs no GPipe schedule"):
        plan.export(search.Prediction(search.Layout(1, 2, 4, "GPipe", 1, 1, 8, "none", "none")), request(), "megatron")


# --- activations of the accountings that cannot be built on the CPU ----------------------------------------

def test_attention_keeping_its_scores_is_korthikantis_count():
    """Korthikanti et al. 2022 (section 4.1): a GPT layer without recomputation saves
    ``s b h (34 + 5 a s / h)`` bytes in 16-bit, and tensor parallelism without sequence
    parallelism divides all but ``10 s b h`` of it by ``t``. The planner's ``unfused`` accounting
    gives the same, plus the layer norms' float32 statistics, which that count leaves out."""
    gpt = shapes.PRESETS["megatron-145b"]
    h, a, s, b = gpt.hidden, gpt.heads, 2048, 1
    values, fp32 = memory.layer_activation_values(gpt, "unfused", "none", seq_len=s)
    assert values * 2 == pytest.approx(h * (34 + 5 * a * s / h))  # bytes per token
    assert fp32 == 4  # mean and rstd of each of the two layer norms
    req = request("megatron-145b", 64, 64, s, gpu=hardware.GPUS["a100-80gb"], kernels="unfused",
                  sequence_parallel=False)
    for t in (2, 4, 8):
        per_mb = search._tables(req, 80, "even", b, "none", t).per_mb[1]  # a middle stage: one layer
        layer = per_mb - memory.held_io_bytes(search.stage_boundary_bytes(req, b, t), False, False)
        expected = s * b * h * (10 + 24 / t + 5 * a * s / (h * t)) + s * b * 4 * 4 / t
        assert layer == pytest.approx(expected)


def test_a_custom_model_from_the_command_line_is_planned(capsys):
    status, out = in_process(["--model", "custom", "--hidden", "2048", "--layers", "16", "--heads", "16",
                              "--kv-heads", "4", "--ffn", "5632", "--vocab", "32000", "--gpus", "8",
                              "--global-batch", "64", "--seq-len", "2048"], capsys)
    assert status == 0 and "model custom:" in out and "is predicted fastest" in out, out


def test_each_gpu_brings_its_servers_network_and_estimates_say_their_efficiency(capsys):
    """An A100 request without --inter crosses nodes on HDR InfiniBand, as DGX A100s do; a request
    whose times are estimated prints the fractions of the peak it times them at."""
    assert all(g.network in hardware.LINKS and g.nvlink in hardware.LINKS for g in hardware.GPUS.values())
    assert hardware.GPUS["a100-80gb"].network == "ib-hdr200" != hardware.GPUS["h100-sxm"].network
    status, out = in_process(with_change(["--gpu", "a100-80gb", "--gpus", "16", "--top", "1"]), capsys)
    assert status == 0 and "links nvlink-a100 / ib-hdr200" in out, out
    f = costs.pass_efficiencies(shapes.PRESETS["llama3-8b"], 1, 8192)["F"]
    assert f"a layer's F {100 * f:.0f}%" in out and "of 312 TFLOP/s" in out, out
    status, out = in_process(with_change(["--gpu", "a100-80gb", "--gpus", "16", "--inter", "ib-ndr400", "--top", "1"]),
                             capsys)
    assert "links nvlink-a100 / ib-ndr400" in out


def test_a_named_layout_is_compared_with_the_winner_term_by_term():
    """The parts of a step (computation, recomputation, bubble and hand-offs, data-parallel traffic
    not hidden, optimizer) add up to the predicted step, recomputation shows only where a layout
    recomputes, and the explanation names the part where a slower layout loses most."""
    req = CASES["8b"]
    ranked, _ = search.plan(req)
    slow = search.Layout(1, 4, 2, "1F1B", 1, 1, 64, "zero1", "full")
    critical_1 = search.Layout(1, 2, 4, "InterleavedZeroBubble", 2, 1, 32, "none", "full")  # its rank 1 ends last
    for layout in (ranked[0].layout, slow, search.Layout(1, 1, 8, "none", 1, 2, 8, "fsdp", "selective"), critical_1):
        pred = search.predict(layout, req, check_memory=False)
        terms = plan.step_terms(pred, req)
        assert sum(terms.values()) == pytest.approx(pred.step_s, rel=1e-9), layout.label()
        assert (terms["recomputation"] > 0) == (layout.recompute != "none"), layout.label()
        bubble = terms["bubble and hand-offs"]  # a zero-bubble schedule's is small, not nothing
        assert (bubble > 0) if layout.p > 1 else (bubble <= 0.01 * pred.step_s), layout.label()
        assert min(terms.values()) >= 0
    mine, theirs = (plan.step_terms(search.predict(x, req, check_memory=False), req) for x in (slow, ranked[0].layout))
    worst = max(plan.TERMS, key=lambda k: mine[k] - theirs[k])
    text = "\n".join(plan.explain(slow, req, ranked))
    assert f"slower than the winner ({ranked[0].layout.label()}), most of the difference in {worst}" in text, text
    assert "it is the planner's choice" in "\n".join(plan.explain(ranked[0].layout, req, ranked))
    unfit = "\n".join(plan.explain(search.Layout(1, 1, 8, "none", 1, 8, 2, "none", "none"), req, ranked))
    assert "and it does not fit: its fullest GPU holds" in unfit and "GB of activations" in unfit, unfit


def test_the_ranked_table_says_how_the_layers_are_balanced():
    """Two layouts that differ only in their balance print differently."""
    req = request("llama3-70b", 64, 1024)
    even = search.Layout(8, 8, 1, "1F1B", 1, 1, 1024, "none", "full", "even")
    preds = [search.predict(replace(even, balance=b), req, check_memory=False) for b in ("even", "ends")]
    rows = plan.table(preds, 2)
    assert "balance" in rows[0] and rows[1] != rows[2] and " even " in rows[1] and " ends " in rows[2]


def test_requests_and_shapes_hash_once_and_by_value():
    """The search's caches are keyed on the request: its hash is computed once, equal requests
    hash alike, a changed one does not, and a pickled copy (another process salts string hashes
    differently) computes its own."""
    import pickle

    a, b = request(), request()
    assert a is not b and a == b and hash(a) == hash(b) and "_hash" in a.__dict__
    assert hash(replace(a, global_batch=256)) != hash(a)
    for obj in (a, a.model):
        hash(obj)
        copy = pickle.loads(pickle.dumps(obj))
        assert copy == obj and "_hash" not in copy.__dict__ and hash(copy) == hash(obj)


def test_the_header_says_which_ranked_layouts_are_estimated():
    """A time is measured only where the book measured the block and the head at the layout's
    microbatch size: the header says so for the layouts ranked, not for one sequence alone."""
    from types import SimpleNamespace
    req = CASES["70b"]
    said = lambda *est: plan.header(req, [SimpleNamespace(estimated=e) for e in est])[-1]  # noqa: E731
    assert said(False, False).startswith("action times: measured on an H100")
    mixed = said(True, False, False)
    assert "for 1 of the 3 ranked layouts (the winner among them) estimated" in mixed
    assert "(not the winner)" in said(False, True)
    assert said(True, True).startswith("action times: estimated")
    mistral = request("mistral-7b")  # Llama 3 8B's block, another vocabulary: its head was never measured
    assert plan.header(mistral)[-1].startswith("action times: estimated")
    assert plan.header(CASES["8b"])[-1].startswith("action times: measured")


# --- the MLP a config.json describes ------------------------------------------------------------------------

def test_the_mlp_is_read_from_the_activation_and_the_model_type(tmp_path, capsys):
    """Nemotron-4 15B (squared ReLU, two matrices: 15.6B, not the 20.5B of a Llama block), Gemma's
    GeGLU (three), Falcon's keys (num_kv_heads, no intermediate_size); what it cannot tell, refused."""
    nemotron = {"model_type": "nemotron", "hidden_act": "relu2", "hidden_size": 6144, "num_hidden_layers": 32,
                "num_attention_heads": 48, "num_key_value_heads": 8, "intermediate_size": 24576,
                "vocab_size": 256000, "tie_word_embeddings": False}
    shape = shapes.from_hf_config(nemotron)
    assert shape.mlp == "relu2" and not shapes.gated(shape)
    assert shapes.total_parameters(shape) / 1e9 == pytest.approx(15.6, abs=0.05)
    assert shapes.total_parameters(shapes.from_hf_config({**nemotron, "model_type": "llama", "hidden_act": "silu"})) \
        / 1e9 == pytest.approx(20.5, abs=0.05)
    gemma = shapes.from_hf_config({**nemotron, "model_type": "gemma", "hidden_act": "gelu_pytorch_tanh"})
    assert gemma.mlp == "geglu" and shapes.block_weight_groups(gemma) == shapes.block_weight_groups(
        shapes.PRESETS["llama3-8b"])
    falcon = shapes.from_hf_config({"model_type": "falcon", "hidden_size": 8192, "num_hidden_layers": 60,
                                    "num_attention_heads": 128, "num_kv_heads": 8, "vocab_size": 65024})
    assert (falcon.kv_heads, falcon.ffn, falcon.mlp, falcon.tied) == (8, 4 * 8192, "gelu", True)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**nemotron, "model_type": "mine", "hidden_act": "gelu"}))
    status, out = in_process(with_change(["--model", str(path)]), capsys)
    assert status == 2 and "cannot tell a gated MLP" in out and len(out.strip().splitlines()) == 1


def test_stages_per_rank_and_data_parallel_sizes_can_be_pinned(tmp_path, capsys):
    """--v pins v beyond --max-v (published interleaved runs use 5, 7, 12), --dp pins dp; a pin
    nothing satisfies is refused in one line."""
    out_json = tmp_path / "plan.json"
    status, out = in_process(["--model", "llama3-70b", "--gpus", "64", "--global-batch", "512", "--seq-len", "8192",
                              "--v", "5", "7", "--dp", "8", "--json", str(out_json)], capsys)
    ranked = json.loads(out_json.read_text())["ranked"]
    assert status == 0 and ranked
    assert all(o["v"] in (5, 7) and o["dp"] == 8 and o["p"] > 1 for o in ranked)
    req = search.with_layout(request("llama3-70b", 64, 512), vs=(12,), pps=(2,))
    assert {c.v for c in search.candidates(req)} == {12}
    status, out = in_process(with_change(["--dp", "3"]), capsys)
    assert status == 2 and "no layout has dp in [3]" in out and len(out.strip().splitlines()) == 1


def test_a_runtime_that_frees_its_stage_io_keeps_no_split_backward_residual():
    """torch's input-gradient pass keeps each microbatch's graph (retain_graph=True) until its
    weight pass: counted under torch's runtime, not under one modelled as freeing its stage I/O."""
    req = request("llama3-8b", 8, 64, 4096)
    layout = search.Layout(1, 4, 2, "ZBVZeroBubble", 2, 1, 32, "zero1", "none")
    torch_acts = [r.activations for r in search.rank_memory(layout, req)]
    freed = replace(req, stage_io="freed")
    t = search._tables(freed, layout.num_stages, layout.balance, layout.b, layout.recompute, layout.tp)
    kept = search.rank_saved_bytes(layout.schedule, layout.p, layout.m, layout.v, t.per_mb, [0.0] * len(t.residual))
    freed_acts = [r.activations for r in search.rank_memory(layout, freed)]
    transient = search._transient(freed, layout.b, layout.recompute, layout.tp)
    assert freed_acts == pytest.approx([k + transient for k in kept])
    assert all(a > f for a, f in zip(torch_acts, freed_acts))


# --- context parallelism -------------------------------------------------------------------------------------

def test_context_parallelism_divides_activations_and_keeps_the_parameters():
    """cp GPUs each hold 1/cp of every sequence: the activations a stage keeps per microbatch and the
    logits divide by cp; the parameters are replicated over cp, and the state sharded over dp x cp."""
    req = search.Request(shapes.PRESETS["llama3-70b"], hardware.GPUS["h100-sxm"], 64, 8, 64, 8192,
                         hardware.LINKS["nvlink-h100"], hardware.LINKS["ib-ndr400"], cps=(1, 2))
    one = search.Layout(8, 4, 2, "1F1B", 1, 1, 32, "zero1", "none")
    two = replace(one, dp=1, cp=2)
    t1 = search._tables(req, one.num_stages, "even", 1, "none", 8, 1)
    t2 = search._tables(req, two.num_stages, "even", 1, "none", 8, 2)
    assert all(math.isclose(a / 2, b) for a, b in zip(t1.per_mb, t2.per_mb)) and t1.params == t2.params
    m1, m2 = search.rank_memory(one, req), search.rank_memory(two, req)
    assert all(math.isclose(a.logits / 2, b.logits) for a, b in zip(m1, m2))
    assert all(math.isclose(a.parameters, b.parameters) and math.isclose(a.optimizer, b.optimizer)
               for a, b in zip(m1, m2))  # zero1 over dp x cp = 2 either way
    # the world is tp x cp x pp x dp, and each layer adds the gathering of keys and values
    assert all(c.tp * c.cp * c.p * c.dp == req.gpus for c in search.candidates(req))
    assert search.context_parallel_seconds(req, 1, 8, 2, "none")[0] > 0 == search.context_parallel_seconds(req, 1, 8, 1, "none")[0]


def test_nvidias_405b_request_is_planned_with_context_parallelism(capsys):
    """Llama 3.1 405B on 512 H100s with a global batch of 252 sequences of 8192 tokens (NVIDIA's recipe
    runs context parallelism 2): no data-parallel size of tp 8 and pp 8 divides the batch, and the
    refusal points to --cp; with --cp 2 the request is planned and every layout prints its cp."""
    base = ["--model", "llama3-405b", "--gpus", "512", "--global-batch", "252", "--seq-len", "8192", "--tp", "8",
            "--pp", "8", "--schedules", "1F1B", "Interleaved1F1B", "--v", "2", "--microbatch-sizes", "1"]
    status, out = in_process(base, capsys)
    assert status == 2 and "--cp 2" in out
    status, out = in_process(base + ["--cp", "2"], capsys)
    assert status == 0 and "tp=8 cp=2" in out, out


def test_a_presets_memory_is_the_bytes_its_device_reports_less_the_headroom():
    """"80 GB" as sold is not what the allocator gets: an H100 80GB reports 79.11 GiB (84.9e9 bytes), and
    the planner's usable memory is exactly those bytes less the 10% headroom. Every preset carries its
    bytes with the source of the figure, and a figure read from no device says it is the datasheet's."""
    assert set(hardware.MEMORY) == set(hardware.GPUS)
    for name, g in hardware.GPUS.items():
        nbytes, source = hardware.MEMORY[name]
        assert abs(g.memory_gb * 1e9 - nbytes) <= 5e6 and source  # to 10 MB, as the page shows it
        assert source.startswith("reported: ") or source.startswith("no reported figure: "), source
    h100 = hardware.MEMORY["h100-sxm"][0]
    assert h100 == pytest.approx(79.11 * 2 ** 30) and 84.9e9 < h100 < 85.0e9  # not 80e9
    assert hardware.MEMORY["a100-40gb"][0] == 42298834944
    req = request()
    assert req.headroom == 0.1
    assert req.usable_bytes == pytest.approx(h100 * 0.9, abs=5e6)  # the preset to 10 MB
    assert request(gpu=hardware.GPUS["a100-80gb"]).usable_bytes == pytest.approx(80 * 2 ** 30 * 0.9, abs=5e6)
