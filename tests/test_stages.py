import pytest
import torch

from ppbook.models import GPTConfig, build_model
from ppbook.stages import assign_layers, stage_module


@pytest.mark.parametrize("n_layers", range(1, 25))
@pytest.mark.parametrize("p", range(1, 9))
def test_assign_layers_covers_every_layer_once_and_evenly(n_layers, p):
    if n_layers < p:
        with pytest.raises(ValueError, match="at least one layer"):
            assign_layers(n_layers, p)
        return
    parts = assign_layers(n_layers, p)
    assert len(parts) == p
    assert sum(parts, []) == list(range(n_layers))  # contiguous, in order, none dropped
    sizes = [len(x) for x in parts]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the extra layers go to the earlier stages


def test_uneven_example():
    assert assign_layers(12, 5) == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9], [10, 11]]


def test_bad_stage_counts():
    with pytest.raises(ValueError, match="num_stages must be at least 1"):
        assign_layers(4, 0)
    with pytest.raises(ValueError, match="stage_index"):
        stage_module(build_model(GPTConfig()), 4, 4)


@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_stages_partition_the_parameters(p):
    cfg = GPTConfig(n_layers=4)
    full = dict(build_model(cfg).named_parameters())
    seen = []
    for i in range(p):
        stage = stage_module(build_model(cfg), i, p)
        for name, t in stage.named_parameters():
            assert torch.equal(t, full[name])
            seen.append(name)
        assert (stage.tok_embeddings is not None) == (i == 0)
        assert (stage.output is not None) == (i == p - 1)
    assert sorted(seen) == sorted(full)
