"""Chapter 8: skip connections across stages (tuples of tensors) and tied embeddings, against one process."""

import copy

import pytest
import torch

from conftest import assert_one_line_error
from ppbook import launch
from ppbook.models import GPTConfig
from ppbook.skip import build_skip_model, sync_tied_grads, tied_group_ranks, tied_parameter
from ppbook.stages import stage_module


CFG = GPTConfig(vocab_size=64, dim=32, n_layers=4, n_heads=4, max_seq_len=16)


# --- without processes --------------------------------------------------------------------
@pytest.mark.parametrize("num_stages", [2, 3, 4])
def test_stages_chained_by_tuples_equal_the_full_model(num_stages):
    full = build_skip_model(CFG, seed=1, dtype=torch.float64)
    tokens = torch.randint(0, CFG.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    x = tokens
    for s in range(num_stages):
        stage = stage_module(copy.deepcopy(full), s, num_stages)
        x = stage(*x) if isinstance(x, tuple) else stage(x)
        if s < num_stages - 1:  # the stage hands on two tensors: the stream and the skip
            assert isinstance(x, tuple) and len(x) == 2 and x[0].shape == x[1].shape == (2, 16, CFG.dim)
    torch.testing.assert_close(x, full(tokens), rtol=0, atol=0)


def test_skip_changes_the_output():
    """The skip is really used: without it (skip = 0 on the last stage) the logits differ."""
    full = build_skip_model(CFG, seed=1, dtype=torch.float64)
    tokens = torch.zeros(1, 8, dtype=torch.long)
    first, last = (stage_module(copy.deepcopy(full), s, 2) for s in (0, 1))
    h, skip = first(tokens)
    assert not torch.allclose(last(h, skip), last(h, torch.zeros_like(skip)))


def test_tied_model_shares_one_parameter_and_stages_hold_equal_copies():
    full = build_skip_model(CFG, seed=3, tie_embeddings=True)
    assert full.output.weight is full.tok_embeddings.tok.weight
    assert "output.weight" not in dict(full.named_parameters())  # listed once, as the embedding
    first, middle, last = (stage_module(copy.deepcopy(full), s, 3) for s in range(3))
    assert tied_parameter(middle) is None
    assert torch.equal(tied_parameter(first), tied_parameter(last))
    assert tied_parameter(first) is first.tok_embeddings.tok.weight and tied_parameter(last) is last.output.weight
    assert tied_parameter(build_skip_model(CFG)) is None  # untied model: nothing to synchronise


def test_tied_group_ranks_and_sync_without_group_is_a_no_op():
    assert tied_group_ranks(1) == [0] and tied_group_ranks(2) == [0, 1] and tied_group_ranks(4) == [0, 3]
    stage = stage_module(build_skip_model(CFG, tie_embeddings=True), 0, 2)
    stage.tok_embeddings.tok.weight.grad = torch.ones_like(stage.tok_embeddings.tok.weight)
    sync_tied_grads(stage, None)  # a rank outside the tied group
    assert torch.equal(stage.tok_embeddings.tok.weight.grad, torch.ones_like(stage.tok_embeddings.tok.weight))


# --- under torchrun -------------------------------------------------------------------------
@pytest.mark.torchrun
@pytest.mark.parametrize("nproc", [2])  # 4 processes: chapter 8 runs the same launch and checks it
def test_skip_and_tied_pipelines_match_one_process(nproc):
    data = launch.torchrun("08_beyond_chain.py", ["--check", "--dtype", "float64"], nproc=nproc, timeout=300).data
    runs = {r["variant"]: r for r in data["runs"]}
    assert data["as_expected"] and data["world_size"] == nproc
    skip = runs["skip"]  # same microbatches, same order: bitwise
    assert skip["match"] and skip["pipeline_losses"] == skip["reference_losses"]
    assert all(s["max_weight_diff"] == 0.0 and s["max_grad_diff"] == 0.0 for s in skip["stages"])
    tied = runs["tied"]  # the tied gradient is summed in another order than autograd's: close, not bitwise
    assert tied["match"] and tied["tied_copy_diff"] == 0.0
    torch.testing.assert_close(tied["pipeline_losses"], tied["reference_losses"], rtol=0, atol=1e-10)
    assert max(s["max_weight_diff"] for s in tied["stages"]) <= 1e-10
    nosync = runs["tied-nosync"]  # without the sum the two copies drift apart
    assert not nosync["match"] and nosync["tied_copy_diff"] > 1e-4


@pytest.mark.torchrun
def test_one_process_without_torchrun():
    data = launch.python("08_beyond_chain.py", ["--check"], timeout=180).data
    assert data["world_size"] == 1 and data["as_expected"]
    assert all(r["match"] and r["pipeline_losses"] == r["reference_losses"] for r in data["runs"])


# --stage-output dict refused with torch's message: chapter 8 launches and checks it


def test_bad_input_one_line_nonzero_exit():
    assert_one_line_error("08_beyond_chain.py", ["--layers", "1"], "need at least 2 layers")
