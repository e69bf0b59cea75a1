"""The planner for the runs people train now (issue 52): experts laid out as Megatron-Core folds
them (expert parallelism beyond the data-parallel size), FP8 and its recipes, optimizers other than
Adam, and one-line warnings for layers the planner cannot time."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from ppbook import plan
from ppbook.planner import costs, hardware, memory, published, search, shapes, traffic

H100, A100, B200 = hardware.GPUS["h100-sxm"], hardware.GPUS["a100-80gb"], hardware.GPUS["b200"]
NV, IB = hardware.LINKS["nvlink-h100"], hardware.LINKS["ib-ndr400"]


def request(model: str, gpus: int, batch: int, seq: int = 4096, **kw) -> search.Request:
    return search.Request(shapes.PRESETS[model], kw.pop("gpu", H100), gpus, 8, batch, seq, NV, IB, **kw)


def run(args, capsys):
    try:
        status = plan.main(args)
    except SystemExit as e:  # argparse's refusals
        status = e.code
    captured = capsys.readouterr()
    return status, captured.out + captured.err


# --- experts as frameworks lay them out -------------------------------------------------------------------------------

def test_experts_fold_over_tensor_parallelism_so_ep_may_exceed_dp():
    """Megatron-Core's MoE parallel folding: ep x etp divides tp x cp x dp, not ep dp. The old search
    took ep among the divisors of dp alone."""
    req = request("mixtral-8x7b", 16, 64)
    pairs = search.expert_layouts(req, 4, 1, 2)  # tp 4, dp 2: 8 GPUs a pipeline stage
    assert (8, 1) in pairs and (4, 1) in pairs and (2, 4) in pairs and (1, 4) in pairs
    assert all(8 % (ep * etp) == 0 and req.model.experts % ep == 0 for ep, etp in pairs)
    assert (8, 4) not in pairs  # 32 GPUs do not fold over 8
    assert search.expert_layouts(request("llama3-8b", 16, 64), 4, 1, 2) == [(1, 1)]
    folded = [c for c in search.candidates(req) if c.ep > c.dp]
    assert folded and all(c.ep * c.etp <= c.tp * c.cp * c.dp for c in folded)


def test_the_search_proposes_expert_parallel_layouts_beyond_dp_where_they_fit():
    req = request("mixtral-8x7b", 16, 64, shardings=("none", "zero1"))
    ranked, _ = search.plan(req, slack=0.3)
    beyond = [o for o in ranked if o.layout.ep > o.layout.dp]
    assert beyond and all(o.peak_bytes <= req.usable_bytes for o in beyond)
    # the experts' state is sharded over the GPUs that hold the same experts: tp x cp x dp / (etp x ep)
    c = beyond[0].layout
    assert search.edp_size(c) * c.ep * c.etp == c.tp * c.cp * c.dp


def test_a_published_layout_with_ep_beyond_dp_is_explained_not_refused(capsys):
    """Megatron-Core's Qwen3-235B runs on 256 H100s with EP 32 over TP 2 x DP 16 (the MoE model zoo):
    the planner predicts it, and times it near the published step (the old planner refused the
    layout: ep 32 does not divide dp 16)."""
    data = published.load()
    row = next(r for r in data["moe_runs"] if r["id"] == "qwen3-235b-256-h100-ep32")
    assert row["layout"]["ep"] > row["layout"]["dp"]
    pred = published.published_prediction(row, data)
    assert pred.layout.ep == 32 and pred.layout.dp == 16 and pred.why_not is None
    assert pred.tokens_per_s_per_gpu / published.published_tokens_per_s(row) == pytest.approx(1, abs=0.25)
    status, out = run(["--model", "qwen3-235b-a22b", "--gpus", "256", "--global-batch", "2048", "--seq-len", "4096",
                       "--stage-io", "freed", "--schedules", "Interleaved1F1B", "--pp", "8", "--tp", "2",
                       "--top", "1", "--layout", "tp=2 pp=8 dp=16 ep=32 schedule=Interleaved1F1B v=4 sharding=zero1 "
                       "recompute=selective"], capsys)
    assert status == 0 and "layout tp=2 Interleaved1F1B p=8 v=4 dp=16 ep=32 zero1" in out, out
    assert "error" not in out


@pytest.mark.parametrize("layout,message", [
    ("pp=1 dp=16 ep=32", "ep 32 x etp 1 = 32 must divide tp 1 x cp 1 x dp 16"),
    ("pp=1 dp=16 ep=3", "ep 3 must divide the model's 128 experts"),
    ("tp=2 pp=1 dp=8 ep=1 etp=16", "etp 16 must divide the experts' width 768 and fit in a node of 8"),
])
def test_an_expert_layout_that_does_not_fold_is_one_line(layout, message, capsys):
    status, out = run(["--model", "qwen3-30b-a3b", "--gpus", "16", "--global-batch", "64", "--seq-len", "4096",
                       "--layout", layout], capsys)
    errors = [x for x in out.splitlines() if x.strip()]
    assert status == 2 and len(errors) == 1 and message in errors[0], out


def test_megatrons_guideline_ep8_tp1_beats_ep4_tp2_for_mixtral():
    """Megatron-LM's MoE README (megatron/core/transformer/moe/README.md @ d98e8a64, 'Guideline 4: Prefer
    EP over TP for Expert Layers'): 'For Mixtral 8x7B, EP8xTP1 outperforms EP4xTP2.' On one node of
    H100s, the planner's order is the same, with the experts split over TP (etp 2) or not."""
    req = request("mixtral-8x7b", 8, 64)
    L = search.Layout
    ep8 = search.predict(L(1, 1, 8, search.NO_PIPELINE, 1, 1, 8, "zero1", "full", "even", 8, 1, 1), req, False)
    for etp in (1, 2):
        ep4 = search.predict(L(2, 1, 4, search.NO_PIPELINE, 1, 1, 16, "zero1", "full", "even", 4, 1, etp), req, False)
        assert ep8.step_s < ep4.step_s, etp


def test_the_all_to_all_costs_by_where_its_ranks_sit():
    """Within a node the all-to-all runs over NVLink; its group is ep GPUs at a stride of etp, so a
    group that outgrows the node sends the other nodes' share over the network. DeepEP sends a
    token once to each other node that holds any of its experts."""
    req = request("deepseek-v3", 256, 512)
    nbytes = traffic.expert_dispatch_bytes(1, 4096, 7168, 8, 2)
    inside = search.alltoall_seconds(req, nbytes, 8, 1)
    assert inside == pytest.approx(req.intra.alltoall(nbytes, 8))
    assert search.alltoall_seconds(req, nbytes, 4, 2) == pytest.approx(req.intra.alltoall(nbytes, 4))  # 8 GPUs
    across = search.alltoall_seconds(req, nbytes, 64, 1)
    assert across > 5 * inside
    # 256 experts over 8 nodes, 8 a token: a node holds none of a token's experts with probability C(224, 8)/C(256, 8)
    miss = 1.0
    for i in range(8):
        miss *= (224 - i) / (256 - i)
    assert search.remote_nodes(256, 8, 8) == pytest.approx(7 * (1 - miss))
    deepep = search.deepep_seconds(replace(req, dispatcher="deepep"), nbytes, 64, 1)
    assert deepep < across and search.deepep_seconds(req, nbytes, 8, 1) == inside
    moe = search.moe_layer_seconds(replace(req, dispatcher="deepep"), 1, 1, 1, 64, 1)
    assert moe["dispatch"] == pytest.approx(2 * deepep)


def test_imbalance_and_capacity_set_the_busiest_ranks_load():
    req = request("mixtral-8x7b", 16, 64)
    base = search.moe_layer_seconds(req, 1, 1, 1, 8, 1)
    skew = search.moe_layer_seconds(replace(req, moe_imbalance=1.5), 1, 1, 1, 8, 1)
    capped = search.moe_layer_seconds(replace(req, moe_imbalance=1.5, capacity_factor=1.25), 1, 1, 1, 8, 1)
    assert search.expert_load(replace(req, moe_imbalance=1.5, capacity_factor=1.25)) == 1.25
    assert base["dispatch"] < capped["dispatch"] < skew["dispatch"]
    assert base["compute_F"] < capped["compute_F"] < skew["compute_F"]
    # the busiest GPU keeps its experts' activations at its load
    L = search.Layout(1, 1, 16, search.NO_PIPELINE, 1, 1, 4, "zero1", "none", "even", 8)
    a, b = search.rank_memory(L, req)[0], search.rank_memory(L, replace(req, moe_imbalance=1.5))[0]
    assert b.activations > a.activations and b.parameters == a.parameters


def test_the_experts_products_are_timed_at_the_rows_each_expert_gets():
    """A GPU's experts do the same FLOPs whatever the layout (etp x its own copies at 1/etp of the
    width); fewer rows per expert reach less of the GPU (DeepGEMM's grouped GEMMs)."""
    shape = shapes.PRESETS["qwen3-235b-a22b"]
    assert costs.expert_rows_factor(4096) == costs.expert_rows_factor(65536) == 1
    assert costs.expert_rows_factor(256) == costs.expert_rows_factor(16) < costs.expert_rows_factor(512) < \
        costs.expert_rows_factor(1024) < 1
    few, many = costs.expert_costs(shape, H100, 16384, 512, 1), costs.expert_costs(shape, H100, 16384, 4096, 1)
    assert few.F > many.F and few.W > many.W
    req = request("qwen3-235b-a22b", 256, 2048)
    flops = {}
    for ep, etp in ((8, 1), (32, 1), (4, 2)):
        own = 4096 / 2
        copies = own * 8 * etp
        flops[ep, etp] = 2.0 * copies * shapes.mlp_parameters(shape, shape.expert_ffn) / etp
    assert len(set(flops.values())) == 1
    assert search.moe_layer_seconds(req, 2, 1, 1, 8, 1)["compute_F"] > search.moe_layer_seconds(req, 2, 1, 1, 32, 1)["compute_F"]


# --- FP8 --------------------------------------------------------------------------------------------------------------

def test_fp8_speedups_are_transformer_engines_measured_ones():
    f, i, w = costs.fp8_speedup("fp8-current", "h100-sxm")
    assert (f, i, w) == pytest.approx((10.653 / 6.503, 10.813 / 6.795, 10.548 / 6.987))
    assert costs.fp8_speedup("fp8-delayed", "h200")[0] > f > costs.fp8_speedup("fp8-blockwise", "h800")[0] > 1
    assert costs.fp8_speedup("mxfp8", "b200") == pytest.approx((4.196 / 2.847, 4.290 / 3.045, 4.272 / 3.092))
    assert costs.fp8_speedup("mxfp8", "h100-sxm") is None and costs.fp8_speedup("fp8-current", "a100-80gb") is None
    assert costs.fp8_family("h100-96gb-500w") == "hopper"  # a published run's H100


def test_fp8_runs_the_blocks_products_faster_and_keeps_the_head_and_attention_in_bf16():
    shape = shapes.PRESETS["llama3-70b"]
    bf16 = costs.layer_costs_at(shape, H100, 1, 8192, "bf16")
    fp8 = costs.layer_costs_at(shape, H100, 1, 8192, "fp8-current")
    assert bf16 == costs.layer_costs(shape, H100, 1, 8192)  # bf16 is the layer's own cost
    s = costs.fp8_speedup("fp8-current", "h100-sxm")
    flops = costs.layer_flops(shape, 8192, 8192)
    products = 2.0 * 8192 * (shapes.attention_parameters(shape) + shapes.mlp_parameters(shape, shape.ffn))
    for k, sk in zip("FIW", s):
        share = products / flops[k]
        assert getattr(fp8, k) == pytest.approx(getattr(bf16, k) * (1 - share + share / sk))
    assert fp8.W == pytest.approx(bf16.W / s[2])  # the weight pass is products alone
    req = request("llama3-70b", 64, 256, 8192)
    L = search.Layout(4, 8, 2, "Interleaved1F1B", 5, 1, 128, "zero1", "none")
    a, b = search._stage_costs(L, req)[0], search._stage_costs(L, replace(req, precision="fp8-current"))[0]
    last = L.num_stages - 1
    head = costs.head_costs(req.model, H100, 1, 8192)
    assert b[(last, "F")] - b[(last - 1, "F")] == pytest.approx(head.F / 4)  # the head stays bf16
    assert a[(last, "F")] - a[(last - 1, "F")] == pytest.approx(head.F / 4)
    assert b[(0, "F")] < a[(0, "F")]
    pa, pb = search.predict(L, req, False), search.predict(L, replace(req, precision="fp8-current"), False)
    assert pb.step_s < pa.step_s


def test_fp8_memory_each_recipe_keeps():
    """FP8 copies of the linear layers' weights (row- and column-wise), their inputs kept in FP8 for
    the backward, delayed scaling's history of maxima; masters, gradients and moments as in bf16."""
    req = request("llama3-8b", 8, 64, 4096)
    L = search.Layout(1, 1, 8, search.NO_PIPELINE, 1, 1, 8, "zero1", "none")
    base = search.rank_memory(L, req)[0]
    linear = sum(shapes.linear_parameters(req.model, i) for i in range(req.model.layers))
    tokens = 4096
    for name in ("fp8-current", "fp8-delayed", "fp8-blockwise"):
        r = search.rank_memory(L, replace(req, precision=name))[0]
        p = memory.PRECISIONS[name]
        amax = 3 * 7 * req.model.layers * p.amax_history * 4  # 7 linear layers a Llama block, 3 tensors each
        assert r.parameters - base.parameters == pytest.approx(linear * p.weight_copy_bytes + amax)
        assert (r.gradients, r.optimizer) == (base.gradients, base.optimizer)
        saved = req.model.layers * tokens * memory.fp8_saved_values(req.model) * (2 - p.saved_input_bytes)
        assert base.activations - r.activations == pytest.approx(saved)
    # full recomputation keeps the block's bf16 input alone (the layer it rebuilds keeps FP8 inputs again)
    kept = [search._tables(r, 1, "even", 1, "full", 1).per_mb for r in (req, replace(req, precision="fp8-current"))]
    assert kept[0] == kept[1]
    transient = [search._transient(r, 1, "full", 1) for r in (req, replace(req, precision="fp8-current"))]
    assert transient[1] < transient[0]


@pytest.mark.parametrize("args,message", [
    (["--precision", "fp8", "--fp8-recipe", "mxfp8"], "--fp8-recipe mxfp8 does not run on Hopper"),
    (["--precision", "fp8", "--gpu", "a100-80gb"], "no FP8 GEMM measurement on the a100-80gb"),
    (["--precision", "fp8", "--recipe", "fp32"], "use --recipe bf16 or bf16-grads"),
    (["--optimizer", "lion"], "invalid choice: 'lion'"),
    (["--moe-imbalance", "0.5"], "--moe-imbalance"),
    (["--fp8-recipe", "delayed"], "add --precision fp8"),
])
def test_precision_and_optimizer_refusals_are_one_line(args, message, capsys):
    status, out = run(["--model", "llama3-8b", "--gpus", "8", "--global-batch", "64", "--seq-len", "4096"] + args, capsys)
    errors = [x for x in out.splitlines() if x.strip()]
    assert status == 2 and len(errors) == 1 and message in errors[0], out


def test_precision_fp8_from_the_command_line_says_what_stays_bf16(capsys):
    base = ["--model", "llama3-8b", "--gpus", "8", "--global-batch", "64", "--seq-len", "4096", "--top", "1"]
    status, out = run(base + ["--precision", "fp8", "--fp8-recipe", "blockwise"], capsys)
    assert status == 0, out
    line = next(x for x in out.splitlines() if x.startswith("precision fp8-blockwise"))
    assert "the output head and loss" in line and "attention's score and value products" in line
    assert "all communication" in line and "FP8 copies of the weights" in line
    status, plain = run(base, capsys)
    assert status == 0 and "precision fp8" not in plain


# --- what is not modelled, said ---------------------------------------------------------------------------------------

def test_an_optimizer_other_than_adam_gets_its_state_bytes_and_a_line(capsys):
    req = request("llama3-8b", 8, 64)
    L = search.Layout(1, 1, 8, search.NO_PIPELINE, 1, 1, 8, "none", "full")
    adam = search.rank_memory(L, req)[0]
    params = shapes.total_parameters(req.model) + req.model.vocab * req.model.hidden * req.model.tied
    for name, moments in (("muon", 4), ("sgd", 4), ("adafactor", 0), ("adamw-bf16", 4)):
        other = search.rank_memory(L, replace(req, optimizer=name))[0]
        assert adam.optimizer - other.optimizer == pytest.approx(params * (8 - moments)), name
        assert (other.parameters, other.gradients) == (adam.parameters, adam.gradients)
    status, out = run(["--model", "llama3-8b", "--gpus", "8", "--global-batch", "64", "--seq-len", "4096", "--top", "1",
                       "--optimizer", "muon"], capsys)
    lines = [x for x in out.splitlines() if x.startswith("optimizer muon")]
    assert status == 0 and len(lines) == 1 and "one float32 momentum buffer" in lines[0]


HYBRIDS = {
    "qwen3-next": ({"model_type": "qwen3_next", "num_hidden_layers": 4,
                    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"]},
                   "3 of 4 layers are linear attention (layer_types)"),
    "minimax": ({"model_type": "minimax", "num_hidden_layers": 4, "attn_type_list": [0, 0, 0, 1]},
                "3 of 4 layers are linear (lightning) attention (attn_type_list 0)"),
    "kimi-linear": ({"model_type": "kimi_linear", "num_hidden_layers": 4,
                     "linear_attn_config": {"kda_layers": [1, 2, 3], "full_attn_layers": [4]}},
                    "3 of 4 layers are linear attention (linear_attn_config)"),
    "nemotron-h": ({"model_type": "nemotron_h", "num_hidden_layers": 6, "hybrid_override_pattern": "M-M*-M"},
                   "3 of 6 layers are Mamba (state-space) layers (hybrid_override_pattern 'M')"),
    "jamba": ({"model_type": "jamba", "num_hidden_layers": 32, "attn_layer_period": 8, "mamba_d_state": 16},
              "28 of 32 layers are Mamba (state-space) layers (attn_layer_period 8)"),
    "falcon-mamba": ({"model_type": "falcon_mamba", "num_hidden_layers": 64, "state_size": 16},
                     "state-space (Mamba) layers (state_size)"),
    "mistral-swa": ({"model_type": "mistral", "num_hidden_layers": 32, "sliding_window": 4096},
                    "sliding-window attention of 4096 tokens (sliding_window)"),
    "gemma3": ({"model_type": "gemma3_text", "num_hidden_layers": 6, "sliding_window": 1024,
                "layer_types": ["sliding_attention"] * 5 + ["full_attention"]},
               "5 of 6 layers are sliding attention (a window of 1024 tokens) (layer_types)"),
}


@pytest.mark.parametrize("name", sorted(HYBRIDS))
def test_layers_the_planner_cannot_time_are_named_in_one_line(name):
    config, expected = HYBRIDS[name]
    lines = shapes.unmodelled_layers(config, seq_len=8192)
    assert len(lines) == 1 and expected in lines[0] and "softmax attention" in lines[0], lines


def test_no_warning_where_every_layer_is_timed():
    assert shapes.unmodelled_layers({"model_type": "llama", "num_hidden_layers": 32}) == []
    # a window at least as long as the sequence attends to all of it; Qwen2's window is switched off
    assert shapes.unmodelled_layers({"model_type": "mistral", "sliding_window": 4096}, seq_len=4096) == []
    assert shapes.unmodelled_layers({"model_type": "qwen2", "sliding_window": 131072, "use_sliding_window": False},
                                    seq_len=200000) == []


def test_a_hybrid_config_is_planned_with_its_warning(tmp_path, capsys):
    config = {"model_type": "qwen3_next", "hidden_size": 2048, "num_hidden_layers": 4, "num_attention_heads": 16,
              "num_key_value_heads": 2, "intermediate_size": 5120, "vocab_size": 151936, "hidden_act": "silu",
              "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"]}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    status, out = run(["--model", str(path), "--gpus", "8", "--global-batch", "64", "--seq-len", "4096", "--top", "1"],
                      capsys)
    lines = [x for x in out.splitlines() if "linear attention (layer_types)" in x]
    assert status == 0 and len(lines) == 1 and lines[0].startswith("config.json: 3 of 4 layers"), out


# --- against the record ------------------------------------------------------------------------------------------------

def test_spearman_of_the_same_order_is_one_and_of_the_reverse_minus_one():
    assert published.spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1)
    assert published.spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1)
    assert published.ranks([5, 1, 5, 2]) == [3.5, 1, 3.5, 2]
    assert published.spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(0.8660254, rel=1e-6)
    with pytest.raises(ValueError):
        published.spearman([1], [1])


def test_the_published_moe_and_fp8_runs_are_read_as_published():
    data = published.load()
    rows = {r["id"]: r for r in data["moe_runs"] + data["fp8_runs"]}
    # throughput from a step time, and from a cost in GPU hours per trillion tokens
    assert published.published_tokens_per_s(rows["qwen3-235b-256-h100-ep32"]) == pytest.approx(2048 * 4096 / 19.7 / 256)
    assert published.published_tokens_per_s(rows["deepseek-v3-2048-h800"]) == pytest.approx(1e12 / (180e3 * 3600))
    for row in rows.values():
        assert row["source"] and row["quote"] and row.get("precision", "bf16") in memory.PRECISIONS, row["id"]
        lay = row["layout"]
        ranks = lay["tp"] * lay.get("cp", 1) * lay["dp"]
        assert ranks * lay["pp"] == row["gpus"], row["id"]  # the layout covers the GPUs
        assert ranks % (lay.get("ep", 1) * lay.get("etp", 1)) == 0, row["id"]  # the experts fold over tp x cp x dp
    sweep = published.sweeps(data)["qwen3-235b-256-h100-modelzoo"]
    assert len(sweep) >= 4 and len({(r["model"], r["gpus"], r["global_batch"]) for r in sweep}) == 1
    assert any("not_cut" in r for r in sweep)  # listed, with why the planner cannot cut it
