"""The planner's activation counts (``ppbook.planner.memory``) against what torch keeps, measured
on the CPU: the book's Llama block with no recomputation (``book``), with full and with selective
activation checkpointing (torchtitan's per-op policy, ``ppbook.recompute``), and the same block
with fused kernels (``fused``, ``ppbook.kernels``).

"Kept" is what a block's forward leaves allocated (``ppbook.recompute.allocated_bytes``, the
profiler's memory events): the tensors autograd saves for the backward, plus the output. The
block's input exists before the forward and is not counted, its output (the next block's input,
of the same size) is: so a block's measurement is what the planner counts per layer, input
included. Each checkpointed region also keeps the CPU generator's state, a constant
(``RNG_STATE_BYTES``) that the planner leaves out: it is the only slack allowed, and it is
derived, not fitted (``preserve_rng_state=False`` removes it, checked below).
"""

from __future__ import annotations

import copy

import pytest
import torch

from ppbook import kernels, recompute
from ppbook.models import LlamaConfig, build_model, rope_tables
from ppbook.planner.memory import layer_activation_bytes, stage_activation_bytes
from ppbook.planner.shapes import ModelShape
from ppbook.stages import keep_parts

B, T = 2, 32
CONFIGS = {
    "book default (GQA 4:2)": LlamaConfig(dim=64, n_heads=4, n_kv_heads=2, ffn_hidden_dim=176, max_seq_len=T),
    "wider, GQA 8:2": LlamaConfig(dim=128, n_heads=8, n_kv_heads=2, ffn_hidden_dim=352, max_seq_len=T),
    "multi-head (no GQA)": LlamaConfig(dim=48, n_heads=3, n_kv_heads=3, ffn_hidden_dim=128, max_seq_len=T),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def shape_of(cfg: LlamaConfig, layers: int = 1) -> ModelShape:
    return ModelShape("book", vocab=cfg.vocab_size, hidden=cfg.dim, layers=layers, heads=cfg.n_heads,
                      kv_heads=cfg.n_kv_heads, ffn=cfg.ffn_hidden_dim)


def block_and_inputs(cfg: LlamaConfig, dtype: torch.dtype, fused: bool = False):
    model = build_model(cfg, seed=0, dtype=dtype)
    block = model.layers["0"]
    if fused:
        kernels.fuse(block)
    cos, sin = rope_tables(cfg.dim // cfg.n_heads, cfg.max_seq_len, cfg.rope_theta)
    x = torch.randn(B, T, cfg.dim, generator=torch.Generator().manual_seed(1)).to(dtype).requires_grad_()
    # the tables in the model's dtype, as a model cast to it holds them (a float32 table would be
    # cast, and the copies kept, in every block: T x head_dim values, not counted by the planner)
    return block, x, cos[:T].to(dtype), sin[:T].to(dtype)


def measured(cfg, dtype, kernel: str, mode: str, **checkpoint_kwargs) -> int:
    block, x, cos, sin = block_and_inputs(cfg, dtype, fused=kernel == "fused")
    recompute.checkpoint_block(block, mode)
    nbytes, out = recompute.allocated_bytes(block, x, cos, sin)
    out.float().sum().backward()  # the recorded graph runs (and frees what it kept)
    return nbytes


def predicted(cfg, dtype, kernel: str, mode: str) -> float:
    size = torch.finfo(dtype).bits // 8
    return layer_activation_bytes(shape_of(cfg), B * T, dtype_bytes=size, kernels=kernel, recompute=mode)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("kernel,mode", [("book", "none"), ("book", "full"), ("book", "selective"),
                                         ("fused", "none"), ("fused", "full"), ("fused", "selective")])
def test_block_saves_what_the_planner_counts(name, dtype, kernel, mode):
    cfg = CONFIGS[name]
    slack = recompute.RNG_STATE_BYTES if mode != "none" else 0
    assert measured(cfg, DTYPES[dtype], kernel, mode) == predicted(cfg, DTYPES[dtype], kernel, mode) + slack


def test_the_checkpoint_slack_is_the_generator_state():
    cfg = CONFIGS["book default (GQA 4:2)"]
    block, x, cos, sin = block_and_inputs(cfg, torch.float32)
    nbytes, _ = recompute.allocated_bytes(
        lambda: torch.utils.checkpoint.checkpoint(block, x, cos, sin, use_reentrant=False, preserve_rng_state=False))
    assert nbytes == predicted(cfg, torch.float32, "book", "full")


def test_a_middle_stage_saves_its_layers():
    """A stage with neither embedding nor head: its blocks, each counted with its input, which is
    the stage's input for the first block and what the stage hands on for the last."""
    cfg = LlamaConfig(dim=64, n_layers=5, n_heads=4, n_kv_heads=2, ffn_hidden_dim=176, max_seq_len=T)
    stage = keep_parts(build_model(cfg, seed=0), layers=[1, 2, 3], embedding=False, head=False)
    h = torch.randn(B, T, cfg.dim).requires_grad_()
    for mode in recompute.MODES:
        mod = copy.deepcopy(stage)
        for block in mod.layers.values():
            recompute.checkpoint_block(block, mode)
        nbytes, out = recompute.allocated_bytes(mod, h)
        slack = 3 * recompute.RNG_STATE_BYTES if mode != "none" else 0
        want = stage_activation_bytes(shape_of(cfg, 5), [1, 2, 3], B * T, first=False, last=False, dtype_bytes=4,
                                      kernels="book", recompute=mode)
        assert nbytes == want + slack, mode
        out.sum().backward()


def test_the_fused_block_computes_the_book_block():
    cfg = CONFIGS["book default (GQA 4:2)"]
    block, x, cos, sin = block_and_inputs(cfg, torch.float64)
    fused = kernels.fuse(copy.deepcopy(block))
    x2 = x.detach().clone().requires_grad_()
    ref, out = block(x, cos, sin), fused(x2, cos, sin)
    torch.testing.assert_close(out, ref)
    ref.square().sum().backward()
    out.square().sum().backward()
    torch.testing.assert_close(x2.grad, x.grad)
    for (name, p), q in zip(block.named_parameters(), fused.parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=name)


def test_selective_checkpointing_computes_the_same_gradients():
    """Recomputation changes what is kept, not the arithmetic: gradients equal to the bit."""
    cfg = CONFIGS["book default (GQA 4:2)"]
    grads = {}
    for mode in recompute.MODES:
        block, x, cos, sin = block_and_inputs(cfg, torch.float32)
        recompute.checkpoint_block(block, mode)
        block(x, cos, sin).square().sum().backward()
        grads[mode] = [x.grad] + [p.grad for p in block.parameters()]
    for mode in ("full", "selective"):
        assert all(torch.equal(a, b) for a, b in zip(grads[mode], grads["none"])), mode


@pytest.mark.parametrize("kernel", ["book", "fused"])
def test_the_weight_pass_differentiates_the_groups_the_planner_counts(kernel):
    """Under the split backward torch's weight pass calls autograd once per parameter group, and
    full checkpointing recomputes the block for each (chapter 12): the planner's count of groups
    is torch's own grouping (``get_param_groups``, as ``stage_backward_input`` calls it) of the
    book's block, unfused and fused, GQA or not."""
    from torch.distributed.pipelining._backward import _get_grad_fn_or_grad_acc, construct_reverse_graph, get_param_groups

    from ppbook.planner.shapes import block_weight_groups

    for cfg in CONFIGS.values():
        block, x, cos, sin = block_and_inputs(cfg, torch.float32, fused=kernel == "fused")
        out = block(x, cos, sin)
        groups = get_param_groups([_get_grad_fn_or_grad_acc(x)],
                                  [_get_grad_fn_or_grad_acc(p) for p in block.parameters()],
                                  construct_reverse_graph([out.grad_fn]))
        assert len(groups) == block_weight_groups(shape_of(cfg)) == 9


def test_an_moe_layer_keeps_each_routed_tokens_copy_and_its_experts_output():
    """Per token and expert it routes to, an MoE layer keeps the dispatched copy of the token (k x h)
    and the expert's output (k x h more), which the gate's gradient needs: the combine weights each
    output by its gate, so d gate = d out . expert out (for DeepSeek-V3, 26% more than a layer was counted to
    keep without them)."""
    from dataclasses import replace

    from ppbook.planner import memory, shapes

    ds = shapes.PRESETS["deepseek-v3"]
    one_more = replace(ds, top_k=ds.top_k + 1)
    for kernels, recompute in (("fused", "none"), ("unfused", "none"), ("fused", "selective")):
        grown = (memory.layer_activation_values(one_more, kernels, recompute, True, 4096)[0]
                 - memory.layer_activation_values(ds, kernels, recompute, True, 4096)[0])
        expert = memory._mlp_values(ds, ds.expert_ffn, kernels) if recompute == "none" else ds.expert_ffn
        assert grown == expert + 2 * ds.hidden, (kernels, recompute)
    low, _ = memory.layer_activation_values(ds, "fused", "none", True, 4096)
    added = ds.top_k * ds.hidden  # the experts' outputs: about a quarter of what the layer was counted to keep
    assert 0.25 < added / (low - added) < 0.27
