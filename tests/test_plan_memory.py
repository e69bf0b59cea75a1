"""Memory in bytes (ppbook.model_memory, "Choosing a pipeline"): the formulas against what autograd
really saves, on CPU, for real stages of the book's Llama at several shapes and dtypes, against
a measured run of each of the seven schedules at p = 2 and 4, and against the H100 file."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from ppbook import workload
from ppbook import launch, model_memory, torch_orders
from ppbook.models import LlamaConfig, build_model
from ppbook.stages import assign_layers, stage_module

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT / "data" / "gpu" / "h100_llama3_costs.json"


def test_stage_parameters_add_up_to_the_model():
    for name, cfg in model_memory.LLAMA_SIZES.items():
        assert model_memory.stage_parameters(cfg, cfg.n_layers, True, True) == model_memory.llama_parameters(cfg), name
    cfg = model_memory.LLAMA_SIZES["Llama-3.1-70B"]
    per_stage = [model_memory.stage_parameters(cfg, 10, s == 0, s == 7) for s in range(8)]
    assert sum(per_stage) == model_memory.llama_parameters(cfg)


def test_precisions_bytes_per_parameter():
    assert model_memory.stage_state(model_memory.LLAMA_SIZES["Llama-3.1-8B"], 4, False, False, "bf16").total == \
        16 * 4 * model_memory.layer_parameters(model_memory.LLAMA_SIZES["Llama-3.1-8B"])
    fp32 = model_memory.stage_state(LlamaConfig(), 2, True, True, "fp32")
    assert (fp32.weights, fp32.gradients, fp32.optimizer) == (4 * fp32.params, 4 * fp32.params, 8 * fp32.params)
    # sharded as it runs: ZeRO-1 divides the optimizer state, FSDP between steps everything, and
    # inside a pipeline FSDP's peak holds the stage gathered and its gradients unsharded
    cfg, whole = LlamaConfig(), model_memory.stage_state(LlamaConfig(), 2, True, True, "bf16")
    zero1 = model_memory.stage_state(cfg, 2, True, True, "bf16", sharding="zero1", dp=4)
    assert (zero1.weights, zero1.gradients, zero1.optimizer) == (whole.weights, whole.gradients, whole.optimizer / 4)
    # FSDP2 keeps a float32 shard that is the master itself (no bf16 copy beside it): 4 + 2 + 8 per parameter / dp
    between = model_memory.stage_state_between_steps(cfg, 2, True, True, "bf16", dp=4)
    assert between.total == whole.params * (4 + 2 + 8) / 4
    peak = model_memory.stage_state(cfg, 2, True, True, "bf16", sharding="fsdp", dp=4)
    assert peak.total == between.total + whole.weights + whole.gradients


def saved_bytes(module, *inputs) -> int:
    """Bytes of the distinct storages autograd saves in ``module(*inputs)``, parameters and
    buffers (the rotary tables) left out: they are there whatever the microbatch."""
    kept = [*module.parameters(), *module.buffers()] if isinstance(module, torch.nn.Module) else []
    skip = {t.untyped_storage().data_ptr() for t in kept}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(*inputs)
    return sum(seen.values())


SHAPES = [  # (b, s, dim, heads, kv heads, ffn)
    (2, 16, 32, 4, 2, 48), (1, 24, 64, 8, 2, 176), (3, 8, 48, 6, 6, 128), (2, 32, 64, 4, 1, 96)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("b,s,dim,heads,kv,ffn", SHAPES)
def test_stage_activation_bytes_equal_what_autograd_saves(b, s, dim, heads, kv, ffn, dtype):
    cfg = LlamaConfig(vocab_size=96, dim=dim, n_layers=5, n_heads=heads, n_kv_heads=kv, ffn_hidden_dim=ffn,
                      max_seq_len=s)
    full = build_model(cfg, seed=0, dtype=dtype)
    layers = [len(owned) for owned in assign_layers(5, 3)]  # 2, 2, 1
    tokens = torch.randint(0, cfg.vocab_size, (b, s))
    for stage in range(3):
        mod = stage_module(copy.deepcopy(full), stage, 3)
        x = tokens if stage == 0 else torch.randn(b, s, dim, dtype=dtype, requires_grad=True)
        predicted = model_memory.stage_activation_bytes(cfg, b, s, layers[stage], stage == 0, stage == 2, dtype.itemsize)
        assert saved_bytes(mod, x) == predicted, (stage, dtype)


def test_recomputation_keeps_only_each_blocks_input():
    from torch.utils.checkpoint import checkpoint

    cfg = LlamaConfig(dim=32, n_layers=3, n_heads=4, n_kv_heads=2, ffn_hidden_dim=48, max_seq_len=16)
    model = build_model(cfg, seed=0)
    cos, sin = model.rope_cos[:16], model.rope_sin[:16]

    class Checkpointed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = model.layers
            self.register_buffer("cos", cos)  # the rotary tables: the model's buffers, not activations
            self.register_buffer("sin", sin)

        def forward(self, h):
            for layer in self.layers.values():
                h = checkpoint(layer, h, cos, sin, use_reentrant=False)
            return h

    x = torch.randn(2, 16, 32, requires_grad=True)
    assert saved_bytes(Checkpointed(), x) == model_memory.stage_activation_bytes(cfg, 2, 16, 3, False, False, 4, recompute=True)


def test_the_loss_saves_the_log_probabilities():
    cfg = LlamaConfig(vocab_size=200, dim=32, n_heads=4, n_kv_heads=2)
    logits = torch.randn(2, 16, cfg.vocab_size, requires_grad=True)
    targets = torch.randint(0, cfg.vocab_size, (2, 16))
    # held: the logits (the stage's output, kept by the schedule) plus what the loss saves
    # besides the targets (int64 ids, which the data loader holds anyway) and nll_loss's
    # one-element total weight (4 bytes)
    saved = saved_bytes(lambda x: workload.loss_fn(x, targets), logits)
    assert logits.nbytes + saved - targets.nbytes - 4 == model_memory.logits_bytes(cfg, 2, 16, 4)


def test_h100_saved_bytes_agree_with_the_formulas():
    """The GPU file's saved_bytes is what a forward left allocated: saved tensors less the input
    (allocated before) plus the output, i.e. the same count; plus four bf16 copies of the float32
    rotary tables the recording script passed (s x head_dim / 2 each). The caching allocator
    rounds every allocation up to 512 bytes: agreement within 4 KiB of hundreds of MB."""
    rows = json.loads(H100.read_text())["rows"]
    for r in rows:
        b, s = r["microbatch"], r["seq_len"]
        if r["part"] == "block":
            cfg = LlamaConfig(dim=r["dim"], n_heads=r["heads"], n_kv_heads=r["kv_heads"], ffn_hidden_dim=r["ffn"])
            predicted = model_memory.block_activation_bytes(cfg, b, s, 2) + 4 * s * (r["dim"] // r["heads"] // 2) * 2
        else:  # float32 log-probabilities of the cross-entropy (the bf16 logits are freed in the test)
            predicted = b * s * r["vocab"] * 4
        assert abs(r["saved_bytes"] - predicted) <= 4096, r


def test_peak_microbatches_from_torch_orders():
    assert model_memory.peak_microbatches("GPipe", 4, 8) == {s: 8 for s in range(4)}
    assert model_memory.peak_microbatches("1F1B", 4, 8) == {s: 4 - s for s in range(4)}


def test_the_planners_rank_memory_is_the_books_per_stage_arithmetic():
    """The planner's activations on rank 0 of 1F1B (p = 4, m = 8) are its 4 microbatches of the
    book's stage bytes (the planner with the book's own block accounting), each with the stage's
    output that torch's schedule keeps until the backward; its buffers are torch's 8 receive
    buffers of output gradients. A runtime that frees a stage's inputs and outputs holds neither."""
    from dataclasses import replace

    from ppbook.planner import hardware, search

    cfg = model_memory.LLAMA_SIZES["Llama-3.1-8B"]
    req = search.Request(model_memory.shape_of(cfg), hardware.GPUS["h100-sxm"], 4, 8, 8, 4096, hardware.LINKS["nvlink-h100"],
                         hardware.LINKS["ib-ndr400"], kernels="book", recipe="bf16-grads")
    layout = search.Layout(1, 4, 1, "1F1B", 1, 1, 8, "none", "none")
    mem = search.rank_memory(layout, req)
    boundary = 1 * 4096 * cfg.dim * 2  # one microbatch's activation, bf16
    assert mem[0].activations == 4 * (model_memory.stage_activation_bytes(cfg, 1, 4096, 8, True, False, 2) + boundary)
    assert mem[0].buffers == 8 * boundary and mem[1].buffers == 2 * 8 * boundary and mem[-1].buffers == 8 * boundary
    assert mem[0].logits == 0 < mem[-1].logits
    freed = search.rank_memory(layout, replace(req, stage_io="freed"))
    assert freed[0].activations == 4 * model_memory.stage_activation_bytes(cfg, 1, 4096, 8, True, False, 2)
    assert all(r.buffers == 0 for r in freed)
    # a middle stage: its held output and its input (the receive buffer) cancel
    assert freed[1].activations == mem[1].activations
    assert mem[0].parameters + mem[0].gradients + mem[0].optimizer == model_memory.stage_state(cfg, 8, True, False).total
    full = search.rank_memory(search.Layout(1, 4, 1, "1F1B", 1, 1, 8, "none", "full"), req)
    assert full[0].activations < mem[0].activations / 5


# --- against a measured run of all seven schedules -------------------------------------------------
SPLIT_BACKWARD = ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")


def check_schedules(data: dict) -> None:
    """Every stage's measured peak of saved bytes equals the prediction from torch's order.

    Two things the probe counts that are not per-microbatch memory are added to the prediction:
    the rotary tables (model buffers, saved by reference, counted once per microbatch) and the
    token ids (each microbatch is a view of the whole batch, so the probe counts the batch's
    storage). On the last stage of the split-backward schedules torch keeps more after the weight
    pass than :func:`model_memory.block_residual_bytes` says; there the prediction with a residual of the
    whole microbatch (W frees nothing) is an upper bound, checked as such."""
    cfg = LlamaConfig(**data["config"])
    b, s, p, m = data["microbatch_size"], data["seq_len"], data["world_size"], data["microbatches"]
    rope = 2 * cfg.max_seq_len * (cfg.dim // cfg.n_heads // 2) * 4
    for name, run in data["runs"].items():
        n = run["num_stages"]
        layers = cfg.n_layers // n
        check_stage_io(run["stage_io"], n, m, boundary=b * s * cfg.dim * 4, logits=b * s * cfg.vocab_size * 4)
        per_mb = {st: model_memory.stage_activation_bytes(cfg, b, s, layers, st == 0, st == n - 1, 4) + rope
                  + (m * b * s * 8 - b * s * 8 if st == 0 else 0) for st in range(n)}
        assert {int(k): v for k, v in run["bytes_per_microbatch"].items()} == per_mb, name
        residual = {st: 0 if st == 0 else layers * model_memory.block_residual_bytes(cfg, b, s, 4) + rope for st in range(n)}
        order = torch_orders.torch_order(name, p, m, 2)
        predicted = model_memory.peak_activation_bytes(order, per_mb, residual)
        measured = {int(k): v for k, v in run["peak_bytes"].items()}
        for st in range(n):
            if name in SPLIT_BACKWARD and st == n - 1:
                bound = model_memory.peak_activation_bytes(order, per_mb, per_mb)[st]
                assert predicted[st] <= measured[st] <= bound, (name, st)
            else:
                assert measured[st] == predicted[st], (name, st)


def check_stage_io(stage_io: dict, n: int, m: int, boundary: int, logits: int) -> None:
    """What torch's ``PipelineStage`` keeps beyond autograd's saved tensors is what the planner
    counts: receive buffers for every microbatch (inputs on every stage but the first, output
    gradients on every stage but the last), one output per microbatch held until its backward
    (the logits on the last stage), and no separate copy of a received input: the saved input is
    the receive buffer."""
    from ppbook.planner import memory as pm

    assert sorted(map(int, stage_io)) == list(range(n))
    for key, io in stage_io.items():
        st = int(key)
        first, last = st == 0, st == n - 1
        assert io["buffer_bytes"] == pm.stage_buffer_bytes(boundary, m, first, last), (st, io)
        assert io["output_bytes"] == (logits if last else boundary), (st, io)
        assert io["inputs_are_buffers"], st
        # what the planner adds to a microbatch's saved activations for it
        assert pm.held_io_bytes(boundary, first, last) == (0 if last else io["output_bytes"]) - (0 if first else boundary)


@pytest.mark.torchrun
@pytest.mark.parametrize("nproc,extra", [(2, ["--microbatch-size", "1", "--seq-len", "24"]), (4, [])])
def test_all_seven_schedules_peak_bytes_as_predicted(nproc, extra):
    r = launch.torchrun(ROOT / "tests" / "helpers" / "record_llama_memory.py", ["--microbatches", "8", *extra],
                        nproc=nproc, timeout=400)
    check_schedules(r.data)
