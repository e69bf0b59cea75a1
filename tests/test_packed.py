"""Chapter 15: packed rows through a pipeline.

Pure tests of ``ppbook.packing`` (ids -> mask, positions, cu_seqlens per microbatch, the varlen
reference against SDPA, the loss weights) and of the script's one-process reference (the whole
batch's token mean, which the launches trust); one 2-process and one 4-process launch of
``scripts/15_packed.py`` that train packed rows under 1F1B, Interleaved1F1B and ZBVZeroBubble and
compare each with one process. The chapter runs its own 2-process launch and the in-process
errors; these launches do not repeat them.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_one_line_error
from ppbook import launch, packing
from ppbook.data import IGNORE_INDEX

DOCS = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2], [0, 0, 0, 0, 0, 1, 1, 1]])


# --- pure ---------------------------------------------------------------------------------------
def test_pack_stream_scores_only_next_tokens_of_the_same_document():
    tokens, targets, doc_ids = packing.pack_stream([5, 7, 4, 20], rows=3, seq_len=8, vocab=50, seed=1)
    assert tokens.shape == targets.shape == doc_ids.shape == (3, 8)
    assert doc_ids[0].tolist() == [0, 0, 0, 0, 0, 1, 1, 1]  # 5 tokens of doc 0, then doc 1
    assert doc_ids[1].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]  # doc 1 continues as segment 0, doc 2 starts
    flat_t, flat_y = tokens.flatten(), targets.flatten()
    ignored = (targets == IGNORE_INDEX).flatten().nonzero().flatten().tolist()
    assert ignored == [4, 11, 15]  # the last token of documents 0, 1 and 2 predicts nothing
    keep = (flat_y != IGNORE_INDEX)[:-1]  # a scored target is the next token of the stream
    assert torch.equal(flat_y[:-1][keep], flat_t[1:][keep])
    # a stream shorter than the rows: the tail is padding, scored nowhere
    _, short_targets, short_ids = packing.pack_stream([5, 4], rows=2, seq_len=8, vocab=50)
    assert (short_targets[1, 1:] == IGNORE_INDEX).all() and short_ids[1].tolist() == [0, 1, 1, 1, 1, 1, 1, 1]


def test_document_mask_is_causal_and_block_diagonal():
    mask = packing.document_mask(DOCS)  # (2, 1, 8, 8)
    assert mask.shape == (2, 1, 8, 8)
    assert mask[0, 0, 4].tolist() == [False, False, False, True, True, False, False, False]
    assert mask[1, 0, 4].tolist() == [True] * 5 + [False] * 3
    assert not mask.triu(1).any()


def test_mask_mod_is_the_same_mask():
    from torch.nn.attention.flex_attention import create_mask

    dense = create_mask(packing.document_mask_mod(DOCS), 2, None, 8, 8, device="cpu")
    assert torch.equal(dense, packing.document_mask(DOCS))


def test_positions_restart_at_every_document():
    assert packing.position_ids(DOCS).tolist() == [[0, 1, 2, 0, 1, 0, 1, 2], [0, 1, 2, 3, 4, 0, 1, 2]]


def test_cu_seqlens_per_microbatch_and_whole_batch():
    assert packing.cu_seqlens(DOCS).tolist() == [0, 3, 5, 8, 13, 16]
    assert packing.cu_seqlens(DOCS).dtype == torch.int32
    per_mb = [packing.cu_seqlens(d) for d in DOCS.tensor_split(2)]
    assert [c.tolist() for c in per_mb] == [[0, 3, 5, 8], [0, 5, 8]]
    stacked = packing.stack_cu_seqlens(per_mb)
    assert stacked.tolist() == [[0, 3, 5, 8], [0, 5, 8, 8]]  # the repeat is an empty segment
    assert [c[0].tolist() for c in stacked.tensor_split(2)] == [[0, 3, 5, 8], [0, 5, 8, 8]]


def test_varlen_reference_equals_the_masked_sdpa_and_whole_batch_offsets_do_not():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 8, 4, generator=g, dtype=torch.float64) for _ in range(3))  # (B, H, T, hd)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=packing.document_mask(DOCS))

    def varlen(rows, cu):  # (b, H, T, hd) -> tokens (b*T, H, hd) and back
        flat = [t[rows].transpose(1, 2).reshape(-1, 2, 4) for t in (q, k, v)]
        return packing.varlen_attention(*flat, cu).view(-1, 8, 2, 4).transpose(1, 2)

    assert torch.allclose(varlen(slice(None), packing.cu_seqlens(DOCS)), want, atol=1e-12)
    for i in (0, 1):  # microbatch of one row, its own offsets
        assert torch.allclose(varlen(slice(i, i + 1), packing.cu_seqlens(DOCS[i:i + 1])), want[i:i + 1], atol=1e-12)
    wrong = varlen(slice(1, 2), packing.cu_seqlens(DOCS))  # row 1 with the whole batch's offsets
    assert (wrong - want[1:2]).abs().max() > 0.1  # row 0's documents cut row 1


def test_tokens_and_weights_per_microbatch():
    targets = torch.tensor([[1, 2, IGNORE_INDEX, 3], [IGNORE_INDEX] * 3 + [4]])
    assert packing.tokens_per_microbatch(targets, 2) == [3, 1]
    per_mb, token_mean = packing.microbatch_weights([3, 1])
    assert per_mb == [1 / 6, 1 / 2] and token_mean == [1 / 4, 1 / 4]


def test_the_one_process_reference_is_the_whole_batch_token_mean():
    """The launches compare the pipeline with ``reference`` (microbatch after microbatch, so that sums
    match to the bit). That reference must itself be the whole batch's token mean, with the mask and
    with cu_seqlens derived per microbatch: a pipeline and a reference that both normalised per
    microbatch, or both used wrong offsets, would agree with each other and pass the launches."""
    import copy

    from ppbook.models import LlamaConfig, build_model

    script = launch.load_script("15_packed.py")
    args = script.parse_args(["--rows", "4", "--seq-len", "16", "--layers", "2"])
    tokens, targets, doc_ids = script.make_batch(args)  # (4, 16) each
    m = args.microbatches
    assert len(set(packing.tokens_per_microbatch(targets, m))) > 1  # else a mean per microbatch is right too
    full = build_model(LlamaConfig(vocab_size=args.vocab, dim=args.dim, n_layers=2, n_heads=4, n_kv_heads=2,
                                   ffn_hidden_dim=2 * args.dim, max_seq_len=args.seq_len), seed=0, dtype=torch.float64)
    whole = script.PackedStage(copy.deepcopy(full))  # every row at once, one mean over every scored token
    loss = F.cross_entropy(whole(tokens, doc_ids).flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)
    loss.backward()
    want = {n: p.grad for n, p in whole.mod.named_parameters()}
    for kernel in ("sdpa", "varlen"):
        grads, total = script.reference(full, kernel, tokens, targets, doc_ids, m)
        assert total == pytest.approx(loss.item(), rel=1e-12), kernel
        for n, g in grads.items():
            torch.testing.assert_close(g, want[n], rtol=1e-9, atol=1e-12, msg=f"{kernel}: {n}")
    with torch.no_grad():  # the mistake the launch shows: the mean of the microbatches' means
        per_mb = sum(F.cross_entropy(whole(t, d).flatten(0, 1), y.flatten(), ignore_index=IGNORE_INDEX)
                     for t, y, d in zip(tokens.tensor_split(m), targets.tensor_split(m), doc_ids.tensor_split(m))) / m
    assert abs(per_mb.item() - loss.item()) > 1e-4


def test_strategies_for_changing_lengths():
    script = launch.load_script("15_packed.py")
    lengths = [16, 32, 24]
    assert [script.shape_for("recreate", n, lengths) for n in lengths] == [16, 32, 24]
    assert [script.shape_for("bucket", n, lengths) for n in lengths] == [16, 32, 32]
    assert [script.shape_for("max", n, lengths) for n in lengths] == [32, 32, 32]


def test_eval_is_skipped_only_where_adjacent_stages_share_a_rank():
    script = launch.load_script("15_packed.py")
    assert script.eval_fails("ZBVZeroBubble", 2) and script.eval_fails("ZBVZeroBubble", 4)
    assert script.eval_fails("Interleaved1F1B", 1)  # one process holds stages 0 and 1
    assert not script.eval_fails("Interleaved1F1B", 2) and not script.eval_fails("1F1B", 4)


@pytest.mark.parametrize("args,message", [
    (["--rows", "6"], "--rows 6 must be a positive multiple of --microbatches 4"),
    (["--microbatches", "2", "--rows", "4", "--schedules", "1F1B"], "Schedule1F1B needs at least as many"),
    (["--layers", "2"], "raise --layers to 4 or more"),
    (["--lengths", "16", "48"], "every --lengths value must be between 8 and --seq-len 32"),
])
def test_bad_input_is_one_line(args, message):
    assert_one_line_error("15_packed.py", args, message, nproc=2 if "--microbatches" not in args else 4)


# --- torchrun: packed training against one process -----------------------------------------------
def check_runs(data, schedules, variants):
    runs = {(r["schedule"], r["variant"]): r for r in data["runs"]}
    assert data["match"]
    for name in schedules:
        for variant in variants:
            r = runs[(name, variant)]
            if variant in ("varlen-whole-batch", "mean-per-microbatch"):  # the two mistakes
                assert r["max_grad_diff"] > 1e-4 and r["loss"] != r["reference_loss"], (name, variant)
            else:  # the same microbatches summed in the same order: bitwise
                assert r["max_grad_diff"] == 0.0 and r["loss"] == r["reference_loss"], (name, variant)
    counts = data["tokens_per_microbatch"]
    assert len(set(counts)) > 1 and sum(counts) == data["targets_counted"]


# Two stages, every schedule and variant (flex included), and the shapes exchanged in a fixed order and
# paired: chapter 15 launches exactly that (``15_packed.py --check`` on 2 processes) and asserts it
# (claims bitwise_runs, flex_forward, whole_diff, mean_diff, crossed); a test launch of the same was a
# subset of it, so the suite runs it once, in the build.


@pytest.mark.torchrun
def test_packed_four_stages():
    variants = ["sdpa", "varlen-presplit", "mean-per-microbatch"]
    # three lengths, not the default six: a shorter, a longer and one in between still change the
    # shape under every strategy (recreate: each; bucket: the last rounds up; max: none)
    r = launch.torchrun("15_packed.py", ["--check", "--variants", *variants, "--lengths", "16", "32", "24"],
                        nproc=4, timeout=400)
    assert r.data["world_size"] == 4 and r.data["shapes"] is None
    check_runs(r.data, ["1F1B", "Interleaved1F1B", "ZBVZeroBubble"], variants)
