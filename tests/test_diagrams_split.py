"""Chapter 4's picture of a cut model (ppbook.diagrams.split): each stage's boxes are the units its
parameters belong to, in the model's order, and every name reads on its box."""

import matplotlib

matplotlib.use("agg")  # a test draws without a display

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402

from ppbook.diagrams import split  # noqa: E402
from ppbook.models import Llama, LlamaConfig  # noqa: E402
from ppbook.stages import assign_layers, stage_module  # noqa: E402


def test_units_are_read_from_parameter_names_in_the_model_order():
    assert split.unit_of("layers.3.attention.wq.weight") == "layers.3"
    assert split.unit_of("tok_embeddings.weight") == "tok_embeddings"
    cfg, p = LlamaConfig(n_layers=5), 3
    with torch.device("meta"):  # shapes only: no memory, no initialisation to wait for
        order = split.units(Llama(cfg))
        cut = [split.units(stage_module(Llama(cfg), s, p), order) for s in range(p)]
        small = Llama(LlamaConfig(n_layers=2))
    assert order[0] == "tok_embeddings" and order[-1] == "output"
    assert sum(cut, []) == order  # every unit once, in order
    assert [[u for u in st if u.startswith("layers.")] for st in cut] == \
        [[f"layers.{i}" for i in ls] for ls in assign_layers(cfg.n_layers, p)]
    with pytest.raises(ValueError, match="not in the model's order"):
        split.units(small, ["output"])


def luminance(colour) -> float:
    r, g, b = to_rgb(colour)
    return 0.299 * r + 0.587 * g + 0.114 * b


def test_every_unit_is_a_box_named_in_a_colour_that_reads_on_it():
    rows = {"a": [["tok_embeddings", "layers.0"], ["layers.1", "norm", "output"]],
            "b": [["tok_embeddings"], ["layers.0", "layers.1"], ["norm", "output"]]}
    fig, ax = plt.subplots(figsize=(8, 2.2))
    try:
        split.draw(rows, ax=ax)
        names = [t for t in ax.texts if t.get_text() in {"embedding", "layer 0", "layer 1", "norm", "output"}]
        assert len(names) == len(ax.patches) == sum(len(st) for stages in rows.values() for st in stages)
        for text, box in zip(names, ax.patches):  # a unit's name and its box are drawn together
            assert abs(luminance(text.get_color()) - luminance(box.get_facecolor())) > 0.35, text.get_text()
        stages = [t.get_text() for t in ax.texts if t.get_text().startswith("stage")]
        assert stages == ["stage 0", "stage 1", "stage 0", "stage 1", "stage 2"]
        words = [t.get_text() for t in ax.texts]
        assert words.count("activations") == words.count("gradients") == 1 + 2  # one pair per hand-off
    finally:
        plt.close(fig)
