"""Chapter 12, sequences whose length changes through a pipeline (``scripts/12_shapes.py``). The
chapter launches and checks, against one process, the four shape strategies and the
shorter-sequence failure (2 processes). These tests launch its --check at m = 3, 5 and 6 on 2 and
3 ranks (three (p, m) pairs) and a longer second step, and cover the rest: packing, batching, the
document mask, compiled blocks under changing lengths, and bad input."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_one_line_error

from ppbook import data, launch

SCRIPT = "12_shapes.py"
SMALL = ["--dim", "32", "--seq-len", "16", "--steps", "1", "--warmup", "0", "--check"]


@pytest.fixture(scope="module")
def script():
    return launch.load_script(SCRIPT)


@pytest.mark.torchrun
def test_a_longer_second_step_aborts_gloo():
    r = launch.torchrun(SCRIPT, ["--lengths", "16", "24"], nproc=2, timeout=120,
                        check=False, json_result=False)
    assert r.returncode != 0
    assert "Received data size doesn't match expected size" in r.output, r.output[-3000:]


@pytest.mark.torchrun
@pytest.mark.parametrize("p,m", [(3, 3), (2, 5), (3, 6)])
def test_check_passes_at_3_5_and_6_microbatches(p, m):
    """Issue 26. Three (p, m) pairs, not the six of the product: the arithmetic at m does not depend
    on p. (3, 3): m = p; (2, 5): an odd m that divides into neither p; (3, 6): m = 2p. Each m once,
    each p at least once."""
    r = launch.torchrun(SCRIPT, ["--documents", "60", "--strategies", "bucket", "pack", "--batch-size", "30",
                                 "--layers", "6", *SMALL, "--microbatches", str(m)], nproc=p, timeout=180, check=False)
    assert r.returncode == 0 and r.data["match"], f"{r.shell_command}\n{r.output[-3000:]}"


# --- pure: packing and batching ------------------------------------------------------------------
def rows_of(lengths: list[int], width: int):
    g = torch.Generator().manual_seed(0)
    rows = torch.randint(1, 50, (len(lengths), width), generator=g)
    for r, n in zip(rows, lengths):
        r[n:] = 0  # padding
    return rows, torch.tensor(lengths)


def test_packing_keeps_every_prediction_and_never_cuts_a_document(script):
    lengths = [5, 9, 3, 17, 2, 8, 12]
    rows, n = rows_of(lengths, 18)
    tokens, targets, docs = script.pack(rows, n, 17)
    assert tokens.shape == targets.shape == docs.shape and tokens.shape[1] == 17
    real = targets != data.IGNORE_INDEX
    assert int(real.sum()) == sum(x - 1 for x in lengths)
    got = [(tuple(tokens[i][docs[i] == d].tolist()), tuple(targets[i][docs[i] == d].tolist()))
           for i in range(len(docs)) for d in sorted(set(docs[i].tolist()) - {-1})]
    want = [(tuple(r[:k - 1].tolist()), tuple(r[1:k].tolist())) for r, k in zip(rows, lengths)]
    assert got == want  # each document whole, in order, with its own targets
    assert bool(((docs == -1) == ~real).all())  # padding is its own document, and never scored


def test_batches_take_the_shapes_each_strategy_promises(script):
    lengths = [3, 5, 9, 14, 17, 20, 30, 33]
    rows, n = rows_of(lengths, 33)
    buckets = [8, 16, 32]
    shapes = {s: [t.shape[1] for t, _, _ in script.shaped_batches(s, rows, n, 2, buckets)]
              for s in ("pad", "bucket", "recreate", "pack")}
    assert set(shapes["pad"]) == {32} and set(shapes["pack"]) == {32}
    assert sorted(shapes["recreate"]) == [4, 13, 19, 32]  # each batch's longest document, minus one
    assert sorted(shapes["bucket"]) == [8, 16, 32, 32]
    for tokens, targets, extra in script.shaped_batches("pack", rows, n, 2, buckets):
        assert extra["doc_ids"].shape == tokens.shape


def test_the_document_mask_is_causal_within_documents(script):
    docs = torch.tensor([[0, 0, 1, 1, -1]])
    mask = script.document_mask(docs)[0, 0]
    assert mask.tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0],
                             [0, 0, 0, 0, 1]]


# --- bad input -------------------------------------------------------------------------------------
@pytest.mark.parametrize("args,message", [
    (["--documents", "4"], "--documents (4) at least --batch-size (8)"),
    (["--lengths", "32", "16", "--shape-batch-sizes", "8"], "--shape-batch-sizes one batch size per length"),
])
def test_bad_input_is_one_line(args, message):
    assert_one_line_error(SCRIPT, args, message, nproc=2)


def test_a_compiled_block_recompiles_for_lengths_as_the_chapter_says():
    """Chapter 12, changing lengths under compile: by default a block compiled in place recompiles
    once, at the second length, with the length dynamic, and that graph serves later lengths;
    with dynamic=False every length recompiles, up to torch's recompile_limit, then runs eager."""
    from torch._dynamo.utils import counters

    from ppbook.models import LlamaConfig, build_model

    cfg = LlamaConfig(vocab_size=32, dim=32, n_layers=1, n_heads=2, n_kv_heads=1, ffn_hidden_dim=32, max_seq_len=64)
    limit, graphs = torch._dynamo.config.recompile_limit, {}
    for dynamic in (None, False):
        torch._dynamo.reset()
        counters.clear()
        model = build_model(cfg, seed=0)
        for block in model.layers.values():
            block.compile(backend="eager", dynamic=dynamic)
        with torch.no_grad():
            for length in range(4, 4 + limit + 3):
                model(torch.randint(0, cfg.vocab_size, (2, length)))
        graphs[dynamic] = counters["stats"]["unique_graphs"]
    torch._dynamo.reset()
    assert graphs == {None: 2, False: limit}
