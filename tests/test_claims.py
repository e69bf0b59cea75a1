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
