"""Chapter 6: the training script against one process, its data, clipping and loss scaling."""

import math

import pytest
import torch

from conftest import assert_one_line_error
from ppbook import data, launch, training


# --- pure: data and schedule ------------------------------------------------------------------
def test_corpus_is_shipped_and_small():
    assert data.CORPUS.is_file() and data.CORPUS.stat().st_size < 2_000_000
    assert "A Public Domain Text, Copyright Expired" in data.CORPUS.read_text()[:2000]
    docs = data.split_documents(data.read_text(data.CORPUS))
    assert len(docs) > 900 and docs[1].startswith("ABASEMENT, n.")


def test_tokenizer_is_trained_once_and_cached(tmp_path):
    text = data.read_text(data.CORPUS)[:60_000]
    path = data.cached_tokenizer(text, 300, tmp_path)
    stamp = path.stat().st_mtime_ns
    assert data.cached_tokenizer(text, 300, tmp_path) == path and path.stat().st_mtime_ns == stamp
    tok = data.load_tokenizer(path, 300)
    assert data.special_ids(tok) == (0, 1)  # <pad>, <eos>
    assert tok.decode(tok.encode("ABSURDITY, n.  A statement").ids) == "ABSURDITY, n.  A statement"
    with pytest.raises(ValueError, match="has 300 tokens but the model's --vocab is 512; pass --vocab 300"):
        data.load_tokenizer(path, 512)


def test_rows_are_right_padded_and_padding_is_ignored(tmp_path):
    tok = data.load_tokenizer(data.cached_tokenizer(data.read_text(data.CORPUS)[:60_000], 300, tmp_path), 300)
    long_doc = data.split_documents(data.read_text(data.CORPUS))[0]  # the preface: many rows
    rows, lengths = data.encode_rows(tok, ["ABATIS, n.  Rubbish in front of a fort.", long_doc], seq_len=16)
    tokens, targets = data.inputs_and_targets(rows, lengths)
    assert tokens.shape == targets.shape == (len(rows), 16)
    for row, n, tgt in zip(rows, lengths, targets):
        assert (row[n:] == 0).all()  # <pad> after the real tokens
        assert (tgt != data.IGNORE_INDEX).sum() == n - 1  # every real next token is scored, no padding is
        assert torch.equal(tgt[:n - 1], row[1:n])
    # a document longer than a row continues in the next row with no prediction lost
    long_rows, long_lengths = data.encode_rows(tok, [long_doc], seq_len=16)
    assert len(long_rows) > 3 and (long_lengths[:-1] == 17).all()
    assert all(x[-1] == y[0] for x, y in zip(long_rows, long_rows[1:]))


def test_batches_are_deterministic_and_resume_from_their_state():
    rows, lengths = torch.arange(40 * 5).view(40, 5), torch.full((40,), 5)
    a = data.Batches(rows, lengths, batch_size=8, seed=3)
    first = [a.next()[0] for _ in range(7)]  # crosses an epoch boundary after 5 batches
    b = data.Batches(rows, lengths, batch_size=8, seed=3)
    assert all(torch.equal(x, b.next()[0]) for x in first)
    c = data.Batches(rows, lengths, batch_size=8, seed=3)
    [c.next() for _ in range(3)]
    d = data.Batches(rows, lengths, batch_size=8, seed=3)
    d.load_state_dict(c.state_dict())
    assert torch.equal(c.next()[0], d.next()[0]) and torch.equal(d.next()[0], first[4])
    assert not torch.equal(first[5], first[0])  # the second epoch is shuffled differently


def test_warmup_then_cosine():
    lr = [training.warmup_cosine(s, warmup=10, total=110, min_ratio=0.1) for s in range(111)]
    assert lr[0] == pytest.approx(0.1) and lr[9] == pytest.approx(1.0) and lr[10] == pytest.approx(1.0)
    assert all(x >= y for x, y in zip(lr[10:], lr[11:]))  # decays monotonically
    assert lr[60] == pytest.approx(0.55) and lr[110] == pytest.approx(0.1)


def test_global_clipping_in_one_process_is_clip_grad_norm():
    torch.manual_seed(0)
    a, b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
    for m in (a, b):
        m(torch.randn(4, 8)).pow(2).sum().backward()
    b.load_state_dict(a.state_dict())
    for p, q in zip(a.parameters(), b.parameters()):
        q.grad = p.grad.clone()
    norm, _ = training.clip_grad_norm_global(list(a.parameters()), 0.1)
    ref = torch.nn.utils.clip_grad_norm_(b.parameters(), 0.1)
    assert norm == ref.item() and norm > 0.1
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p.grad, q.grad)


# --- torchrun: the script against one process --------------------------------------------------
def assert_bitwise_like_one_process(d):
    assert d["match"], d["diffs"]
    assert d["diffs"] == {"loss": 0.0, "grad_norm": 0.0, "eval": 0.0, "weight": 0.0}
    assert [r["loss"] for r in d["train"]] == d["reference"]["loss"]


@pytest.mark.torchrun
@pytest.mark.parametrize("nproc,schedule,eval_impl", [(2, "gpipe", "schedule")])
def test_train_matches_one_process_with_global_norm_clipping(nproc, schedule, eval_impl):
    """Same seed, same batches in the same order: losses, global gradient norms, evaluations and
    final weights equal the one-process run's, bit for bit, with clipping active.
    (3 stages, 1F1B, --eval-impl stages: chapter 6 runs and checks it.)"""
    r = launch.torchrun("06_train.py", ["--check", "--steps", "6", "--eval-every", "3", "--eval-batches", "2",
                                        "--warmup-steps", "2", "--clip", "0.5", "--schedule", schedule,
                                        "--eval-impl", eval_impl], nproc=nproc, timeout=300)
    d = r.data
    assert d["world_size"] == nproc and sum(d["layers_per_stage"], []) == list(range(4))
    assert_bitwise_like_one_process(d)
    norms = [s["grad_norm"] for s in d["train"]]
    assert norms == d["reference"]["grad_norm"]  # global norm == clip_grad_norm_'s return value
    assert sum(n > 0.5 for n in norms) >= 2, norms  # clipping was active
    for i, norm in enumerate(norms):  # the global norm is the root of the stages' squared norms
        assert math.sqrt(sum(s["stage_norms"][i] ** 2 for s in d["stages"])) == pytest.approx(norm, rel=1e-6)
        assert all(s["stage_norms"][i] < norm for s in d["stages"])  # no stage sees the whole norm


@pytest.mark.torchrun
def test_train_with_a_hugging_face_tokenizer_file(tmp_path):
    """--tokenizer-file takes any tokenizer.json; the cached one gives the default run's losses."""
    default = launch.python("06_train.py", ["--steps", "3", "--eval-every", "0", "--eval-batches", "1"], timeout=180)
    path = default.data["data"]["tokenizer"]
    again = launch.python("06_train.py", ["--steps", "3", "--eval-every", "0", "--eval-batches", "1",
                                          "--tokenizer-file", path], timeout=180)
    assert again.data["data"]["tokenizer"] == path
    assert [s["loss"] for s in again.data["train"]] == [s["loss"] for s in default.data["train"]]


@pytest.mark.torchrun
@pytest.mark.parametrize("nproc", [2, 3])
def test_gradient_scaling_and_tuple_masks_across_stages(nproc):
    r = launch.torchrun("06_loss_and_masks.py", ["--layers", "3"], nproc=nproc, timeout=300)
    c = r.data["scaling"]
    assert c["mean loss, scale_grads, no padding"] < 1e-12  # right without padding
    assert c["mean loss, scale_grads, padding"] > 1e-2  # microbatches weighed equally, tokens not
    assert c["token-mean loss, no scaling, padding"] < 1e-12
    assert c["mean loss, scale_grads, 2 accumulated steps"] > 1e-2  # the first step divided by m twice
    assert c["mean loss, scale_grads, 2 accumulated steps, vs mean(a)/m + mean(b)"] < 1e-12
    assert c["token-mean loss, no scaling, 2 accumulated steps"] < 1e-12
    masks = r.data["masks"]
    for way in ("kwarg on every rank", "tuple"):
        assert masks[way]["max_grad_diff"] == 0.0 and masks[way]["loss"] == masks["reference_loss"], way
    assert masks["first stage only"]["max_grad_diff"] > 1e-4  # later stages attend across documents
    assert masks["first stage only"]["loss"] != masks["reference_loss"]


@pytest.fixture(scope="module")
def small_tokenizer(tmp_path_factory):
    path = data.cached_tokenizer(data.read_text(data.CORPUS), 300, tmp_path_factory.mktemp("tok"))
    return str(path)


@pytest.mark.parametrize("args,message", [
    (["--data", "/no/such/corpus.txt"], "data file /no/such/corpus.txt does not exist"),
    (["--tokenizer-file", "TOKENIZER"], "has 300 tokens but the model's --vocab is 512; pass --vocab 300"),
    (["--tokenizer-file", "/no/such/tokenizer.json"], "tokenizer file /no/such/tokenizer.json does not exist"),
    (["--tokenizer-file", "CORRUPT"], "is not a Hugging Face tokenizer.json"),
    (["--batch-size", "10", "--microbatches", "4"], "--batch-size 10 is not divisible by --microbatches 4"),
    (["--schedule", "1f1b", "--microbatches", "1", "--batch-size", "4"], "1F1B needs at least as many microbatches"),
    (["--vocab", "100"], "needs --vocab of at least 258"),
    (["--kv-heads", "3"], "--heads 4 must be divisible by --kv-heads 3"),
])
def test_train_bad_input_is_one_line_and_nonzero_exit(args, message, small_tokenizer, tmp_path):
    corrupt = tmp_path / "tokenizer.json"
    corrupt.write_text('{"version": "1.0", "model": {"type": "BPE", "vocab": ')  # cut off mid-file
    args = [{"TOKENIZER": small_tokenizer, "CORRUPT": str(corrupt)}.get(a, a) for a in args]
    assert_one_line_error("06_train.py", args, message)
