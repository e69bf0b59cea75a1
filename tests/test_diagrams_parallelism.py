"""The introduction's picture of DP, TP and PP shows what its layouts say (ppbook.diagrams.parallelism)."""

import matplotlib

matplotlib.use("agg")  # a test draws without a display

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from ppbook.diagrams import parallelism  # noqa: E402
from ppbook.stages import assign_layers  # noqa: E402


@pytest.mark.parametrize("n_layers,n_devices", [(8, 4), (10, 4), (5, 2)])
def test_layouts_divide_the_model_as_each_kind_does(n_layers, n_devices):
    data, tensor, pipe = parallelism.layouts(n_layers, n_devices)
    every = tuple(range(n_layers))
    assert [d.layers for d in data.devices] == [every] * n_devices
    assert [(d.layers, d.slice_index, d.slices) for d in tensor.devices] == [(every, i, n_devices)
                                                                             for i in range(n_devices)]
    assert [list(d.layers) for d in pipe.devices] == assign_layers(n_layers, n_devices)
    # a pipeline's stages hold every layer exactly once
    assert sorted(layer for d in pipe.devices for layer in d.layers) == list(every)


def texts(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


def test_each_box_holds_the_layers_its_layout_gives_it():
    fig = parallelism.draw(n_layers=10, n_devices=4)
    try:
        axes = fig.axes
        assert [ax.get_title() for ax in axes] == [parallelism.TITLES[k] for k in parallelism.KINDS]
        for ax, lay in zip(axes, parallelism.layouts(10, 4)):
            boxes = {p.get_gid(): p for p in ax.patches if p.get_gid() and p.get_gid().count("/") == 1}
            bars = [p for p in ax.patches if p.get_gid() and p.get_gid().count("/") == 2]
            assert len(boxes) == 4
            for dev in lay.devices:
                box = boxes[f"{lay.kind}/device{dev.index}"]
                mine = [p for p in bars if p.get_gid().startswith(f"{lay.kind}/device{dev.index}/")]
                assert sorted(int(p.get_gid().rsplit("layer", 1)[1]) for p in mine) == list(dev.layers)
                for bar in mine:  # drawn inside the device's box
                    assert box.get_x() <= bar.get_x() and bar.get_x() + bar.get_width() <= box.get_x() + box.get_width()
                    assert box.get_y() <= bar.get_y() and bar.get_y() + bar.get_height() <= box.get_y() + box.get_height()
                    if dev.slices > 1:  # a slice is a 1/n of the layer's width
                        assert bar.get_width() == pytest.approx((parallelism.BOX_W - 0.2) / dev.slices)
                assert dev.holds in texts(ax) and f"GPU {dev.index}" in texts(ax)
            assert lay.crossing in texts(ax) and lay.data in texts(ax)
        pipe_text = texts(axes[2])
        assert [t for t in pipe_text if t.startswith("layer")] == ["layers 0-2", "layers 3-5", "layers 6-7", "layers 8-9"]
        assert "1/4 of\nevery layer" in texts(axes[1])
    finally:
        plt.close(fig)


def test_bad_layouts_get_one_clear_error():
    with pytest.raises(ValueError, match="needs at least 4 layers"):
        parallelism.layout("pipeline", 3, 4)
    with pytest.raises(ValueError, match="not one of data, tensor, pipeline"):
        parallelism.layout("expert", 8, 4)
