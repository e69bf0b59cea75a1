import pytest
import torch

from ppbook.models import GPT, GPTConfig, Llama, LlamaConfig, build_model, count_parameters, init_weights
from ppbook.stages import stage_module

CONFIGS = [GPTConfig(n_layers=3, max_seq_len=16), LlamaConfig(n_layers=3, max_seq_len=16)]


@pytest.mark.parametrize("cfg", CONFIGS, ids=["gpt", "llama"])
def test_forward_shape_and_determinism(cfg):
    tokens = torch.randint(0, cfg.vocab_size, (2, 16))
    a, b = build_model(cfg, seed=3), build_model(cfg, seed=3)
    assert a(tokens).shape == (2, 16, cfg.vocab_size)
    torch.testing.assert_close(a(tokens), b(tokens), rtol=0, atol=0)
    c = build_model(cfg, seed=4)
    assert not torch.equal(a(tokens), c(tokens))


@pytest.mark.parametrize("cfg", CONFIGS, ids=["gpt", "llama"])
def test_causal(cfg):
    """Changing a later token must not change earlier outputs."""
    model = build_model(cfg, seed=0, dtype=torch.float64)
    x = torch.randint(0, cfg.vocab_size, (1, 16))
    y = x.clone()
    y[0, 10] = (y[0, 10] + 1) % cfg.vocab_size
    torch.testing.assert_close(model(x)[:, :10], model(y)[:, :10])
    assert not torch.allclose(model(x)[:, 10], model(y)[:, 10])


@pytest.mark.parametrize("cfg", CONFIGS, ids=["gpt", "llama"])
def test_no_dropout_train_equals_eval(cfg):
    model = build_model(cfg, seed=0)
    x = torch.randint(0, cfg.vocab_size, (2, 8))
    torch.testing.assert_close(model.train()(x), model.eval()(x), rtol=0, atol=0)


@pytest.mark.parametrize("cfg", CONFIGS, ids=["gpt", "llama"])
def test_stages_compose_to_full_model(cfg):
    """Running the stages one after another is the full model, bit for bit."""
    full = build_model(cfg, seed=1)
    x = torch.randint(0, cfg.vocab_size, (2, 16))
    h = x
    for i in range(3):
        h = stage_module(build_model(cfg, seed=1), i, 3)(h)
    torch.testing.assert_close(h, full(x), rtol=0, atol=0)


@pytest.mark.parametrize("cls,cfg", [(GPT, CONFIGS[0]), (Llama, CONFIGS[1])], ids=["gpt", "llama"])
def test_meta_device_stage_gets_the_full_models_weights(cls, cfg):
    """A stage materialised from the meta device and initialised alone equals the full model's part."""
    full = dict(build_model(cfg, seed=7).named_parameters())
    with torch.device("meta"):
        stage = stage_module(cls(cfg), 1, 3)
    stage.to_empty(device="cpu")
    init_weights(stage, seed=7)
    for name, p in stage.named_parameters():
        torch.testing.assert_close(p, full[name], rtol=0, atol=0)


def test_llama_gqa_and_errors():
    with pytest.raises(ValueError, match="n_kv_heads"):
        Llama(LlamaConfig(n_heads=4, n_kv_heads=3))
    with pytest.raises(ValueError, match="divisible by n_heads"):
        GPT(GPTConfig(dim=10, n_heads=4))
    model = build_model(LlamaConfig(max_seq_len=8))
    with pytest.raises(ValueError, match="max_seq_len"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_rope_buffers_not_in_state_dict():
    model = build_model(LlamaConfig())
    assert not any("rope" in k for k in model.state_dict())
    assert count_parameters(model) == sum(v.numel() for v in model.state_dict().values())
