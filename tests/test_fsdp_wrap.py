"""Chapter 9's FSDP wrapping under a pipeline (issue 13, item 3): per-block groups, what
resharding does across microbatches, measured by ppbook.fsdp_probe."""

import pytest

from ppbook import launch

pytestmark = pytest.mark.torchrun


def test_per_block_fsdp_matches_one_process_and_reshards_per_microbatch():
    r = launch.torchrun("09_scaling_out.py", ["--dp", "2", "--check", "--steps", "2", "--probe-wraps", "stage",
                                              "blocks", "blocks-keep"], nproc=4, timeout=400)
    d = r.data
    assert d["match"] and d["replicas_equal"], d
    m, blocks_per_stage = d["microbatches"], 2  # 4 layers over 2 stages
    for row in d["fsdp_probe"]:
        # gathers per steady step: the stage's own group once, each block per forward (unless kept) and
        # once more for its backward (reshard_after_forward) or not at all (kept)
        expected = {"stage": 1, "blocks-keep": 1 + blocks_per_stage, "blocks": 1 + blocks_per_stage * (m + 1)}
        assert row["all_gathers"] == expected[row["wrap"]], row
        # PipelineStage keeps gathered what a backward gathered until the step's end: the peak is the stage
        assert row["peak_unsharded_bytes"] == row["stage_param_bytes"], row
        if row["wrap"] == "blocks":
            assert row["forward_peak_unsharded_bytes"] < row["stage_param_bytes"], row
        else:
            assert row["forward_peak_unsharded_bytes"] == row["stage_param_bytes"], row
