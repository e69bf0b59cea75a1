"""ppbook.cli: the run wrapper's one error line, in-process (no torchrun)."""

from __future__ import annotations

import argparse

import pytest

from ppbook import cli


def refuse(args: argparse.Namespace, world_size: int) -> None:
    raise ValueError("--batch-size 6 must split into --microbatches 4")


@pytest.mark.parametrize("rank, prints", [(None, True), ("0", True), ("1", False), ("3", False)])
def test_bad_input_is_printed_by_global_rank_0_only(monkeypatch, capsys, rank, prints):
    # every rank of a torchrun job fails the same validation at once; two printing ranks
    # interleaved their lines into one, so only global rank 0 (or a plain process) prints
    if rank is None:
        monkeypatch.delenv("RANK", raising=False)
    else:
        monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("WORLD_SIZE", "4")
    status = cli.run("probe.py", argparse.Namespace(), refuse, body=lambda args, info: 0)
    err = capsys.readouterr().err
    assert status == 2  # every rank exits with the same status
    assert err == ("probe.py: error: --batch-size 6 must split into --microbatches 4\n" if prints else "")
