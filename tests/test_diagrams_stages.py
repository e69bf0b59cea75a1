"""ppbook.diagrams.stages: what chapters 1 and 2's conceptual figures show, read back from the drawn
artists, equals the split of the model they are drawn from. Pure: no processes."""

import matplotlib
import pytest
import torch

matplotlib.use("agg")  # tests only: a page keeps the inline backend
import matplotlib.pyplot as plt  # noqa: E402

from ppbook import launch  # noqa: E402
from ppbook.diagrams import stages as diagram  # noqa: E402
from ppbook.models import GPTConfig, build_model  # noqa: E402
from ppbook.stages import stage_module  # noqa: E402


def minimal_split(p: int) -> list[list[str]]:
    """The parts of each stage of scripts/01_minimal.py's model cut into ``p`` stages."""
    mod = launch.load_script("01_minimal.py")
    args = mod.parse_args([])
    parts = []
    for r in range(p):
        torch.manual_seed(args.seed)
        parts.append(diagram.held_parts(mod.cut(mod.Model(args.vocab, args.dim, args.heads, args.layers), r, p)))
    return parts


def gpt_split(p: int, layers: int = 4) -> list[list[str]]:
    return [diagram.held_parts(stage_module(build_model(GPTConfig(n_layers=layers), seed=0), r, p)) for r in range(p)]


def test_held_parts_spells_out_the_layers_and_skips_what_was_removed():
    assert minimal_split(2) == [["embed", "layers.0", "layers.1"], ["layers.2", "layers.3", "norm", "head"]]
    assert gpt_split(4) == [["tok_embeddings", "layers.0"], ["layers.1"], ["layers.2"], ["layers.3", "norm", "output"]]
    assert gpt_split(1) == [["tok_embeddings", "layers.0", "layers.1", "layers.2", "layers.3", "norm", "output"]]
    seq = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ModuleList([torch.nn.ReLU(), torch.nn.ReLU()]))
    assert diagram.held_parts(seq) == ["0", "1.0", "1.1"]


@pytest.mark.parametrize("p,m", [(1, 1), (2, 4), (3, 2), (4, 8)])
def test_pipeline_figure_shows_each_stage_its_arrows_and_numbered_microbatches(p, m):
    parts = gpt_split(p)
    fig = diagram.pipeline_figure(parts, microbatches=m)
    try:
        seen = diagram.shown(fig)
    finally:
        plt.close(fig)
    assert seen["stages"] == parts  # each box's text is its stage's parts, one per line
    assert seen["activation"] == seen["gradient"] == p - 1  # one hand-off each way between neighbours
    assert seen["microbatches"] == list(range(m))
    assert seen["loss"] and seen["busy"] == 0 and seen["actions"] == []


@pytest.mark.parametrize("p", [1, 2, 4])
def test_naive_figure_shows_one_busy_device_per_moment(p):
    parts = gpt_split(p)
    fig = diagram.naive_figure(parts)
    try:
        seen = diagram.shown(fig)
    finally:
        plt.close(fig)
    assert seen["stages"] == parts
    forward = [f"{s}F0" for s in range(p)]
    assert seen["actions"] == forward + [f"{s}B0" for s in reversed(range(p))]
    assert seen["busy"] == 2 * p and seen["idle"] == 2 * p * (p - 1)  # 2p moments, one device busy in each
    assert seen["activation"] == seen["gradient"] == p - 1


def test_naive_moments_come_from_the_simulated_order():
    assert diagram.naive_moments(3) == [(0, "F", "0F0"), (1, "F", "1F0"), (2, "F", "2F0"),
                                        (2, "B", "2B0"), (1, "B", "1B0"), (0, "B", "0B0")]


def test_no_stage_is_refused():
    with pytest.raises(ValueError, match="at least one stage"):
        diagram.pipeline_figure([])
    with pytest.raises(ValueError, match="at least one stage"):
        diagram.naive_figure([])
