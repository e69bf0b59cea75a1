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


def _schedule_on(name: str, rank: int, p: int, held: list[int]):
    """torch's ``Schedule<name>`` built on mock stages that say they are ``held`` on ``rank``
    (the constructor sends nothing; the map it builds is what the check reads)."""
    from unittest import mock

    from torch.distributed.pipelining.schedules import get_schedule_class
    from torch.distributed.pipelining.stage import PipelineStage

    mocks = []
    for s in held:
        stage = mock.NonCallableMagicMock(spec=PipelineStage)
        stage.group_rank, stage.group_size, stage.submod, stage.num_stages = rank, p, None, 2 * p
        stage.stage_index = s
        mocks.append(stage)
    return get_schedule_class(name)(mocks, 2 * p)


@pytest.mark.parametrize("name", ["ZBVZeroBubble", "DualPipeV", "Interleaved1F1B"])
@pytest.mark.parametrize("p", [2, 4])
def test_placement_problem_accepts_torchs_placement_and_names_the_fix(name, p):
    from ppbook.stages import placement_problem, stage_indices

    for rank in range(p):
        assert placement_problem(_schedule_on(name, rank, p, stage_indices(name, rank, p))) is None
    if name == "Interleaved1F1B":  # looped: r, r + p; a V placement is the mistake here
        wrong, rank = [0, 2 * p - 1], 0
    else:  # V-shaped: r, 2p - 1 - r; the looped placement r, r + p is the mistake (troubleshooting appendix)
        wrong, rank = [1, 1 + p], 1
    problem = placement_problem(_schedule_on(name, rank, p, wrong))
    assert problem is not None and "torch does not check this" in problem
    assert f"build stages {stage_indices(name, rank, p)} on rank {rank}" in problem
