"""precision.MasterWeights: bfloat16 compute copies and float32 masters, so that each weight and each
weight's gradient is cast once per step, not once per microbatch (issue 48), with the arithmetic
of plain autocast kept to the last bit."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ppbook import launch, precision
from ppbook.models import LlamaConfig, build_model


def test_06_train_casts_each_weight_and_its_gradient_once_per_step(monkeypatch):
    """One step of 06_train.py in bfloat16 at m = 4: one cast of each Linear weight (master to
    compute copy) and one of its gradient (to float32), whatever m. Under autocast alone it was one
    cast of the weight and m of its gradient (the cached copy's ToCopyBackward0 in every
    microbatch's backward): 5 per weight at m = 4. Counted as the difference between a 2-step and a
    1-step run, which share everything else (data, model build, the final evaluation)."""
    monkeypatch.setenv("TQDM_DISABLE", "1")
    mod = launch.load_script("06_train.py")
    argv = ["--layers", "2", "--batch-size", "8", "--microbatches", "4", "--seq-len", "32", "--dtype", "bfloat16",
            "--eval-every", "0", "--eval-batches", "1", "--warmup-steps", "1"]
    model = build_model(mod.llama_config(mod.parse_args(argv)), seed=0)
    linear = [m.weight for m in model.modules() if isinstance(m, nn.Linear)]
    counts = {}
    for steps in (1, 2):
        with precision.CastCounter({tuple(w.shape) for w in linear}) as mode:
            assert mod.main([*argv, "--steps", str(steps)]) == 0
        counts[steps] = mode.counts
    per_step = {k: counts[2][k] - counts[1][k] for k in ("bfloat16", "float32")}
    assert per_step == {"bfloat16": len(linear), "float32": len(linear)}, per_step


def tiny_llama():
    cfg = LlamaConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden_dim=48, max_seq_len=16)
    return build_model(cfg, seed=0)


def train_steps(model, params, master, steps=3, m=4):
    """AdamW steps with m microbatches under bfloat16 autocast; the losses."""
    opt = torch.optim.AdamW(params, lr=1e-2)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        tokens = torch.randint(0, 64, (8, 16), generator=g)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        with precision.autocast(torch.device("cpu"), "bfloat16"):
            for mb in tokens.chunk(m):
                loss = nn.functional.cross_entropy(model(mb[:, :-1]).flatten(0, 1), mb[:, 1:].flatten()) / m
                loss.backward()
                total += loss.item()
        if master is not None:
            master.gradients_to_masters()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if master is not None:
            master.masters_to_compute()
        losses.append(total)
    return losses


def test_master_weights_train_like_autocast_to_the_last_bit():
    plain = tiny_llama()
    plain_losses = train_steps(plain, list(plain.parameters()), None)
    model = tiny_llama()
    master = precision.MasterWeights(model, "bfloat16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16, torch.float32}
    assert all(p.dtype == torch.float32 for p in master.parameters())
    losses = train_steps(model, master.parameters(), master)
    assert losses == plain_losses
    ref = dict(plain.named_parameters())
    for name, p in master.named_parameters():
        assert torch.equal(p, ref[name]), name
    for m in model.modules():  # the compute copies hold the masters' values, rounded once
        if isinstance(m, nn.Linear):
            assert torch.equal(m.weight, ref[next(n for n, q in model.named_parameters() if q is m.weight)]
                               .to(torch.bfloat16))


@pytest.mark.parametrize("name", ["float32", "float64"])
def test_full_precision_is_untouched(name):
    model = tiny_llama()
    before = list(model.parameters())
    master = precision.MasterWeights(model, name)
    assert master.parameters() == before and list(model.parameters()) == before
    master.gradients_to_masters()
    master.masters_to_compute()


def test_tied_weights_stay_float32_and_direct_gradients_are_folded():
    emb, head = nn.Embedding(10, 4), nn.Linear(4, 10, bias=False)
    head.weight = emb.weight  # tied: the embedding reads it too, autocast would not cast it there
    other = nn.Linear(4, 4)
    model = nn.ModuleDict({"emb": emb, "head": head, "other": other})
    master = precision.MasterWeights(model, "bfloat16")
    assert head.weight is emb.weight and emb.weight.dtype == torch.float32
    assert other.weight.dtype == other.bias.dtype == torch.bfloat16
    # a backward that assigns .grad itself (no accumulation hook): folded by gradients_to_masters
    other.weight.grad = torch.ones(4, 4, dtype=torch.bfloat16)
    master.gradients_to_masters()
    masters = dict(master.named_parameters())
    assert other.weight.grad is None and masters["other.weight"].grad.dtype == torch.float32
    assert torch.equal(masters["other.weight"].grad, torch.ones(4, 4))
