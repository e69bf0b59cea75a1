"""ppbook.cli: the run wrapper's one error line, in-process (no torchrun)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from conftest import assert_one_error_line

from ppbook import cli, launch


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
    waits = []
    # the other ranks wait for rank 0 to print and exit (the launcher stops them then); here the
    # wait ends at once, as if rank 0 never printed, so the waiting rank speaks for itself
    monkeypatch.setattr(cli, "_wait_for_rank_0", waits.append)
    status = cli.run("probe.py", argparse.Namespace(), refuse, body=lambda args, info: 0)
    err = capsys.readouterr().err
    assert status == 2  # every rank exits with the same status
    line = "probe.py: error: --batch-size 6 must split into --microbatches 4"
    if prints:
        assert err == line + "\n" and waits == []
    else:
        assert waits == [cli.REFUSAL_WAIT_S]
        assert err == f"{line} (rank {rank}: rank 0 did not report it within {cli.REFUSAL_WAIT_S:.0f} s)\n"


@pytest.mark.torchrun
@pytest.mark.parametrize("nproc", [2, 4])
def test_a_slow_rank_0_still_reports_the_refusal_under_torchrun(nproc):
    """Rank 0 refuses 2 s after the others (tests/helpers/slow_refusal.py). Had the others exited
    at once, torchrun would have stopped rank 0 before its line was out: the reader would see only
    torchrun's ChildFailedError. Real torchrun, as a reader launches it."""
    helper = Path(__file__).parent / "helpers" / "slow_refusal.py"
    r = launch.torchrun(str(helper), [], nproc=nproc, timeout=120, check=False, json_result=False, fork=False)
    assert not r.forked
    assert_one_error_line(r, "slow_refusal.py", "--batch-size 6 must split into --dp 4 replicas")
    assert "did not report it" not in r.output  # the waiting ranks were stopped, silent


def test_a_raising_body_keeps_the_process_group_until_its_traceback_is_out(monkeypatch):
    # Tearing down in a ``finally`` closed the culprit's connections before Python printed its
    # traceback; a peer then failed with "Connection closed by peer", exited, and the launcher
    # killed the culprit, so the output named only the peer (chapter A3's root cause went missing).
    events = []
    monkeypatch.setattr("ppbook.dist.setup", lambda device, timeout_s: events.append("setup") or "info")
    monkeypatch.setattr("ppbook.dist.teardown", lambda: events.append("teardown"))
    args = argparse.Namespace(device="cpu", timeout=60)

    def fails(args, info):
        raise TypeError("forward() takes 2 positional arguments but 3 were given")

    with pytest.raises(TypeError, match="positional arguments"):
        cli.run("probe.py", args, lambda args, world_size: None, fails)
    assert events == ["setup"]
    events.clear()
    assert cli.run("probe.py", args, lambda args, world_size: None, lambda args, info: 3) == 3
    assert events == ["setup", "teardown"]
