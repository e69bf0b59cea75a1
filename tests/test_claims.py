"""The claim helper: a false conclusion raises an error that names it."""

import pytest

from ppbook.claims import ClaimError, check, claim


def test_true_claim_returns_its_value():
    assert claim("fits", 42.0, 42.0 < 80, why="fits in 80 GB") == 42.0


def test_false_claim_names_the_claim_and_the_conclusion():
    with pytest.raises(ClaimError, match=r"claim 'fits' is false: fits in 80 GB"):
        claim("fits", 137.0, 137.0 < 80, why="fits in 80 GB")


def test_check_without_glue():
    check("ok", True)
    with pytest.raises(ClaimError, match="'bad'"):
        check("bad", False)


def test_traffic_formulas():
    from ppbook.planner import traffic

    assert traffic.boundary_bytes(2, 8, 16, 2) == 2 * 8 * 16 * 2
    assert traffic.pipeline_bytes_per_step(4, 2, 8, 16, 2) == 2 * 4 * 512
    assert traffic.allreduce_bytes_per_rank(100.0, 1) == 0
    assert traffic.allreduce_bytes_per_rank(100.0, 4) == 150.0
    assert traffic.fsdp_bytes_per_rank(100.0, 100.0, 2) == 150.0
