import pytest

from ppbook import memory
from ppbook.report import human_bytes, markdown_table


def test_sixteen_bytes_per_parameter():
    state = memory.training_memory(1_000)
    assert (state.weights, state.gradients, state.optimizer, state.total) == (2_000, 2_000, 12_000, 16_000)
    fp32 = memory.training_memory(1_000, weight_bytes=4, grad_bytes=4, optimizer_bytes=8)
    assert fp32.total == state.total


def test_devices_needed_rounds_up():
    assert memory.devices_needed(80e9, 80) == 1
    assert memory.devices_needed(80e9 + 1, 80) == 2
    assert memory.devices_needed(0, 80) == 1
    with pytest.raises(ValueError):
        memory.devices_needed(1, 0)


@pytest.mark.parametrize("name,published", [
    # Parameter counts published with the models (safetensors metadata of the releases).
    ("Llama-2-7B", 6_738_415_616),
    ("Llama-3.1-8B", 8_030_261_248),
    ("Llama-3.1-70B", 70_553_706_496),
])
def test_llama_sizes_match_the_published_counts(name, published):
    assert memory.llama_parameters(memory.LLAMA_SIZES[name]) == published


def test_markdown_table_and_bytes():
    table = markdown_table(["a", "b"], [[1, 2], [3, 4]])
    assert table.splitlines() == ["| a | b |", "|:--|--:|", "| 1 | 2 |", "| 3 | 4 |"]
    with pytest.raises(ValueError):
        markdown_table(["a"], [[1, 2]])
    assert human_bytes(1.13e12) == "1.13 TB"
    assert human_bytes(80e9) == "80 GB"
    assert human_bytes(12) == "12 B"
