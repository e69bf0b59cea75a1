"""The planner against the record (``ppbook.planner.published``, ``data/published/runs.json``).

Chapter 10 reads every row in its build; these tests check the data and the comparisons that do
not need the book: every row is sourced and asks a question the planner can pose, the memory
model meets torchtitan's published peaks where the recipe is the one it counts, and the rows that
compare schedules at one layout come out in the measured order.
"""

from __future__ import annotations

import pytest

from ppbook.planner import memory, published, search, shapes

DATA = published.load()


@pytest.fixture(scope="module")
def rows() -> dict[str, published.Comparison]:
    return {row["id"]: published.compare(row, DATA) for row in DATA["runs"]}


def test_every_row_is_sourced_and_its_framework_known():
    for row in DATA["runs"] + DATA["moe_runs"] + DATA["fp8_runs"]:
        assert row["source"] and row["quote"] and row["cite"], row["id"]
        fw = DATA["frameworks"][row["framework"]]
        assert fw["stage_io"] in memory.STAGE_IO and fw.get("fsdp_reshard", "default") in memory.FSDP_RESHARD
        assert row["layout"]["sharding"] in fw["shardings"], row["id"]
        assert (row["layout"]["schedule"] or search.NO_PIPELINE) in (search.NO_PIPELINE, *fw["schedules"]), row["id"]
        assert row["model"] in shapes.PRESETS, row["id"]
        if "alternative_of" in row:
            assert row["alternative_of"] in {r["id"] for r in DATA["runs"]}


def test_each_published_layout_is_posed_as_published(rows):
    for rid, c in rows.items():
        lay, got = c.row["layout"], c.published.layout
        assert (got.tp, got.p, got.dp) == (lay["tp"], lay["pp"], lay["dp"]), rid
        assert got.schedule == (lay["schedule"] or search.NO_PIPELINE) and got.sharding == lay["sharding"], rid
        assert got.v == lay.get("v", got.v), rid
        assert got.b == c.row["constraints"].get("microbatch", got.b), rid
        assert c.row["global_batch"] == got.dp * got.b * got.m, rid


def test_bf16_peaks_within_the_tolerance_and_reached_in_the_loss_backward(rows):
    """torchtitan's bf16 runs (its 8B FSDP tables): within 15%, and only with the loss's backward
    counted (two vocabulary-wide float32 buffers at once): without it, more than 15% low."""
    bf16 = [c for c in rows.values() if c.memory_error is not None and c.row["throughput"].get("comparable", True)]
    assert len(bf16) >= 2
    for c in bf16:
        assert abs(c.memory_error) <= published.MEMORY, c.row["id"]
        loss = memory.loss_backward_bytes(shapes.PRESETS[c.row["model"]], c.published.layout.b * c.row["seq_len"])
        without = (c.published.peak_bytes - loss / c.published.layout.tp) / published.GiB / c.row["peak_memory"]["value"]
        assert without - 1 < -published.MEMORY, c.row["id"]


def test_float8_runs_are_compared_for_memory_not_time(rows):
    float8 = [c for c in rows.values() if not c.row["throughput"].get("comparable", True)]
    assert len(float8) == 3
    for c in float8:
        assert not c.throughput_comparable and "Float8" in c.incomparable_because
        assert c.memory_error is not None and c.memory_error < 0  # the planner counts no Float8, compile or async TP


def test_a_table_of_schedules_comes_out_in_the_measured_order(rows):
    """torchtitan's 405B at one layout: interleaved ran faster and peaked lower than 1F1B; so does
    the prediction. The 1F1B row is the alternative, not a choice."""
    il, ofob = rows["torchtitan-405b-512-interleaved"], rows["torchtitan-405b-512-1f1b"]
    assert not ofob.is_choice and il.is_choice
    assert il.row["throughput"]["value"] > ofob.row["throughput"]["value"]
    assert il.published.step_s < ofob.published.step_s
    assert il.published.peak_bytes < ofob.published.peak_bytes
    assert il.row["peak_memory"]["value"] < ofob.row["peak_memory"]["value"]


def test_framework_runtimes_decide_the_stage_buffers(rows):
    """Megatron-LM's and DeepSpeed's pipelines free a stage's inputs and outputs; torchtitan's
    (torch's PipelineStage) keeps a buffer per microbatch."""
    assert all(r.buffers == 0 for r in rows["megatron-2021-530b"].published.memory)
    assert all(r.buffers > 0 for r in rows["torchtitan-405b-512-1f1b"].published.memory)


def test_runs_on_gpus_without_a_published_peak_are_timed_and_read(rows):
    """torchtitan's 500 W H100s have no published peak; their bf16 runs are timed all the same
    (at the SXM's peak that stands in) and read as misses or not by the tolerance, while the
    Float8 runs are not timed at all."""
    capped = [c for c in rows.values() if "preset" not in c.row["gpu"] and c.row["throughput"].get("comparable", True)]
    assert len(capped) == 4 and all(c.throughput_comparable and c.throughput_reading == "over" for c in capped)
    for c in rows.values():
        if c.throughput_comparable:
            error = c.throughput_error
            assert c.throughput_reading == ("within" if abs(error) <= published.THROUGHPUT else
                                            "over" if error > 0 else "under"), c.row["id"]
        else:
            assert c.throughput_reading == "not timed"
        assert (c.memory_reading is None) == (c.row["peak_memory"] is None), c.row["id"]


def test_how_much_each_row_leaves_to_choose(rows):
    """torchtitan's table of schedules fixes tp, pp and dp: its rows leave one size and only the
    schedules and stage counts torch accepts; every other row leaves many sizes."""
    for rid, c in rows.items():
        req = published.request(c.row, DATA)
        valid = [x for x in search.candidates(req) if search.constraint_problem(x, req) is None]
        assert c.weighed == len(valid) and c.sizes_weighed == len({(x.tp, x.p, x.dp) for x in valid}), rid
        assert c.published.layout in valid, rid
        assert (c.sizes_weighed == 1) == rid.startswith("torchtitan-405b-512"), rid
