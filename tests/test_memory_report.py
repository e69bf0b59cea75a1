import pytest

from ppbook import model_memory
from ppbook.report import human_bytes, markdown_table


def test_sixteen_bytes_per_parameter():
    state = model_memory.training_memory(1_000)
    assert (state.weights, state.gradients, state.optimizer, state.total) == (2_000, 2_000, 12_000, 16_000)
    fp32 = model_memory.training_memory(1_000, weight_bytes=4, grad_bytes=4, optimizer_bytes=8)
    assert fp32.total == state.total


def test_devices_needed_rounds_up():
    assert model_memory.devices_needed(80e9, 80) == 1
    assert model_memory.devices_needed(80e9 + 1, 80) == 2
    assert model_memory.devices_needed(0, 80) == 1
    with pytest.raises(ValueError):
        model_memory.devices_needed(1, 0)


@pytest.mark.parametrize("name,published", [
    # Parameter counts published with the models (safetensors metadata of the releases).
    ("Llama-2-7B", 6_738_415_616),
    ("Llama-3.1-8B", 8_030_261_248),
    ("Llama-3.1-70B", 70_553_706_496),
])
def test_llama_sizes_match_the_published_counts(name, published):
    assert model_memory.llama_parameters(model_memory.LLAMA_SIZES[name]) == published


def test_markdown_table_and_bytes():
    table = markdown_table(["a", "b"], [[1, 2], [3, 4]])
    assert table.splitlines() == ["| a | b |", "|:--|--:|", "| 1 | 2 |", "| 3 | 4 |"]
    with pytest.raises(ValueError):
        markdown_table(["a"], [[1, 2]])
    assert human_bytes(1.13e12) == "1.13 TB"
    assert human_bytes(80e9) == "80 GB"
    assert human_bytes(12) == "12 B"


def test_bounds_round_away_from_what_they_bound():
    """A printed "at most" must not fall below the maximum, nor "at least" rise above the minimum,
    float noise included (0.3 * 10 is 3.0000000000000004)."""
    from ppbook.report import round_down, round_up, round_up_sig

    assert (round_up(1.494), round_down(1.494), round_up(0.3), round_down(0.7)) == (1.5, 1.4, 0.3, 0.7)
    assert round_up(12.31) == 12.4 and round_down(14.99, 0) == 14.0 and round_down(-0.25) == -0.3
    assert (round_up_sig(1.23e-5), round_up_sig(3e-5), round_up_sig(123.4), round_up_sig(0.0)) == (1.3e-5, 3e-5, 130.0, 0.0)
    for x in (0.123456, 7.0, 9.99, 1e-7, 2.5e-3):
        assert round_up_sig(x) >= x and round_up(x, 3) >= x and round_down(x, 3) <= x
